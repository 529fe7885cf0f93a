// The ReLU mask folded into a linear layer's input-gradient GEMM (LinearGemmSpec::input_is_relu),
// against exact and float64 oracles: dZ W^T where the producer's activation is positive, exactly 0
// where it is 0. What such a layer refuses: layers_relu_mask_contract_test.cu (the same binary and
// fixture, layers_test_fixture.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/trainer/layers_test_fixture.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using device::to_host;
using testing::LayersTest;
using testing::random_vector;

// The ReLU mask folded into the input-gradient GEMM: exactly dZ W^T where the activation is
// positive and exactly 0 where it is 0, for activations and gradients far apart in size. The
// activations are written by A's forward, as the layer API asks (`producer` is the layer whose
// forward wrote X for the batch): cuBLASLt's DRELU reads the ReLU mask that forward recorded, not
// X (oneDNN reads X). Rows x = 1 and x = 0 of A (in 1): relu(W_A + b_A) and relu(b_A), so its
// zeros come from negative pre-activations, its positives range from 1e-15 to 3e30.
TEST_F(LayersTest, FoldedReluMaskIsExactForTinyAndHugeValues) {
  const int batch = 2, hidden = 4;
  DenseParameters params(card_);
  LinearGemmSpec a;  // the producer of the activations
  a.name = "a";
  a.in = 1;
  a.out = hidden;
  a.relu = true;
  a.x_ld = 1;
  a.y_ld = a.dz_ld = hidden;
  LinearGemmSpec b;
  b.name = "b";
  b.in = hidden;
  b.out = 1;
  b.input_is_relu = true;
  b.dx_cols = hidden;
  b.x_ld = b.dx_ld = hidden;
  b.y_ld = b.dz_ld = 1;
  Linear layer_a(params, blas_, a);
  Linear layer_b(params, blas_, b);
  params.finalize(1);
  layer_a.prepare(batch);
  layer_b.prepare(batch);
  std::vector<float> w = params.values_to_host();
  const auto block = [&](std::size_t index) { return params.blocks()[index].offset; };
  const std::vector<float> wa_values = {-1.0f, 3e30f, -1.0f, 1e-12f};
  const std::vector<float> ba_values = {1e-10f, -1.0f, 2.0f, 1e-15f};
  const std::vector<float> wb_values = {1.0f, -1e-3f, 3e5f, 0.5f};
  for (int k = 0; k < hidden; ++k) {
    w[block(layer_a.weight_block()) + k] = wa_values[k];
    w[block(layer_a.bias_block()) + k] = ba_values[k];
    w[block(layer_b.weight_block()) + k] = wb_values[k];
  }
  params.set_values(w);
  auto d_x = up(std::vector<float>{1.0f, 0.0f});
  auto d_act = card_.make_buffer<float>(batch * hidden);
  layer_a.forward(params, d_x.data(), d_act.data(), batch);
  const std::vector<float> act = to_host(d_act);
  // {0, 3e30, 1, 1.001e-12 | 1e-10, 0, 2, 1e-15}: the two zeros where the sum is negative.
  for (int k = 0; k < batch * hidden; ++k) {
    EXPECT_EQ(act[k] > 0.0f, k != 0 && k != 5) << "activation " << k << " = " << act[k];
  }
  EXPECT_EQ(act[1], 3e30f);
  EXPECT_EQ(act[7], 1e-15f);
  const std::vector<float> dz = {2.0f, -1e-3f};
  auto d_dz = up(dz);
  auto dx = card_.make_buffer<float>(batch * hidden);
  layer_b.backward_data(params, d_dz.data(), d_act.data(), &layer_a, 1.0f, dx.data(), batch);
  const std::vector<float> got = to_host(dx);
  for (int i = 0; i < batch; ++i) {
    for (int k = 0; k < hidden; ++k) {
      const float want = act[i * hidden + k] > 0.0f ? dz[i] * wb_values[k] : 0.0f;
      EXPECT_EQ(got[i * hidden + k], want) << i << " " << k;
    }
  }
}

struct MaskShape {
  int batch, in, out, dx_cols, dx_ld;
};

// The producer A: row i of its one-hot input X_A picks row i of W_A (the activations wanted).
LinearGemmSpec mask_producer_spec(const MaskShape& s, ElementType type) {
  LinearGemmSpec a;
  a.name = "a";
  a.in = std::max(s.batch, 1);
  a.out = s.in;
  a.input = a.output = type;
  a.relu = true;
  a.x_ld = a.in;
  a.y_ld = a.dz_ld = s.in;
  return a;
}

// The consumer B: its input is A's ReLU output; dX for its first dx_cols columns, rows dx_ld apart.
LinearGemmSpec mask_consumer_spec(const MaskShape& s, ElementType type) {
  LinearGemmSpec b;
  b.name = "b";
  b.in = s.in;
  b.out = s.out;
  b.input = b.dx = type;
  b.input_is_relu = true;
  b.dx_cols = s.dx_cols;
  b.x_ld = s.in;
  b.dx_ld = s.dx_ld;
  b.y_ld = b.dz_ld = s.out;
  return b;
}

// Which kernels mask: CUDA, the mask A's forward recorded (DRELU after RELU_AUX_BIAS) or X's where
// either GEMM fell back to the plain one (linear_gemms_cublaslt.cpp, backward_data), the trace
// saying which; oneDNN, fp32 rows mask after on every kernel seen (the runtime output scale keeps
// them off brgemm), and no plan runs ref:any. Returns the trace saying which mask ran (CUDA).
std::string expect_mask_kernels(const Linear& a, const Linear& b, int64_t batch, bool bf16,
                                bool emulated) {
  const std::string kernels = b.describe(batch);
#if defined(GPUBOX_BACKEND_CUDA)
  (void)bf16;
  (void)emulated;
  const std::string producer = a.describe(batch);
  const bool drelu = kernels.find("input grad DRELU") != std::string::npos;
  const bool relu_aux = producer.find("forward RELU_AUX_BIAS") != std::string::npos;
  EXPECT_TRUE(drelu || kernels.find("input grad plain GEMM") != std::string::npos) << kernels;
  EXPECT_TRUE(relu_aux || producer.find("forward plain GEMM") != std::string::npos) << producer;
  return drelu && relu_aux ? "the mask A's forward recorded (DRELU)"
                           : "the mask by X (a plain GEMM fallback): " + producer;
#else
  (void)a;
  if (!bf16 || emulated || b.spec().x_ld != b.spec().dx_ld) {
    EXPECT_NE(kernels.find("relu mask after"), std::string::npos) << kernels;
  }
  EXPECT_EQ(kernels.find("ref:"), std::string::npos) << kernels;
  return "";
#endif
}

// Value k of card bytes holding bf16 (`bf16`) or fp32 values.
float value_at(const std::vector<char>& bytes, bool bf16, std::size_t k) {
  return bf16 ? to_float(reinterpret_cast<const Bf16*>(bytes.data())[k])
              : reinterpret_cast<const float*>(bytes.data())[k];
}
// Every value of such bytes.
std::vector<float> values_of(const std::vector<char>& bytes, bool bf16) {
  std::vector<float> v(bytes.size() / (bf16 ? sizeof(Bf16) : sizeof(float)));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = value_at(bytes, bf16, k);
  return v;
}
// `v` as the card holds it: bf16 or fp32 bytes.
std::vector<char> bytes_of(const std::vector<float>& v, bool bf16) {
  std::vector<char> bytes(v.size() * (bf16 ? sizeof(Bf16) : sizeof(float)));
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (bf16) {
      reinterpret_cast<Bf16*>(bytes.data())[k] = to_bf16(v[k]);
    } else {
      reinterpret_cast<float*>(bytes.data())[k] = v[k];
    }
  }
  return bytes;
}
// `v` as a GEMM reads it: bf16 rounds each value to 8 significant bits.
std::vector<float> as_read(std::vector<float> v, bool bf16) {
  if (bf16) {
    for (float& x : v) x = to_float(to_bf16(x));
  }
  return v;
}

// dX (as the card wrote it, fp32 or bf16 bytes) against 0.5 dZ W_B^T in float64 where the
// activation is positive, exactly 0 where it is not, and `sentinel` in the columns past dx_cols.
void expect_masked_dx(const std::vector<char>& bytes, bool bf16, const MaskShape& s,
                      const std::vector<float>& act, const std::vector<float>& dz,
                      const std::vector<float>& w, std::size_t wb, float sentinel) {
  for (int i = 0; i < s.batch; ++i) {
    for (int k = 0; k < s.dx_ld; ++k) {
      const std::size_t at = static_cast<std::size_t>(i) * s.dx_ld + k;
      const float g = value_at(bytes, bf16, at);
      if (k >= s.dx_cols) {
        EXPECT_EQ(g, sentinel) << i << " " << k;
        continue;
      }
      if (!(act[static_cast<std::size_t>(i) * s.in + k] > 0.0f)) {
        EXPECT_EQ(g, 0.0f) << i << " " << k;
        continue;
      }
      double want = 0.0;
      for (int o = 0; o < s.out; ++o) {
        want += 0.5 * static_cast<double>(dz[static_cast<std::size_t>(i) * s.out + o]) *
                w[wb + static_cast<std::size_t>(k) * s.out + o];
      }
      // bf16: the fp32 sum rounded once more, to 8 significant bits.
      EXPECT_NEAR(g, want, (bf16 ? std::ldexp(std::fabs(want), -8) : 0.0) + 1e-5) << i << " " << k;
    }
  }
}

// The input gradient GEMM without the chain and the mask after it (the chain would land in
// gemm:jit's separate post-op pass; linear_gemms_onednn.cpp), over fp32 rows: fp32, and bf16
// emulated in fp32 on a CPU without bf16 GEMMs; on one with them, bf16 keeps the chain but where
// oneDNN would run it on its reference kernel (X's rows strided unlike dX's: x_ld 40, dx_ld 48),
// which masks after as well, over bf16 rows; no plan runs ref:any. dX against a float64 dZ W^T of
// the operands as the GEMM reads them where the activation is positive, exactly 0 where it is 0
// (a third of them), and the columns past dx_cols untouched; batches 0, 1, 64 and 65 of the
// strided shape, and a row's items split across threads (70 x 33). The activations are written
// by A's forward, as the layer API asks (cuBLASLt's DRELU reads the mask that forward recorded):
// A's input is one-hot rows, its weights the pre-activations wanted, its bias 0, so Y_A is their
// ReLU.
TEST_F(LayersTest, ReluMaskAfterTheGemmMatchesAScalarOracle) {
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  Blas bf16_blas(card_);  // the CPU's bf16 GEMMs, else emulated
  unsetenv("GPUBOX_BF16_EMULATION");
  ASSERT_NE(bf16_blas.bf16(), Bf16Support::kNone);
  struct Mode {
    const char* name;
    Blas* blas;
    ElementType type;
  };
  const bool emulated = bf16_blas.bf16() == Bf16Support::kEmulated;
  for (const Mode& mode :
       {Mode{"fp32", &blas_, ElementType::kF32},
        Mode{emulated ? "bf16 emulated" : "bf16", &bf16_blas, ElementType::kBf16}}) {
    const bool bf16 = mode.type == ElementType::kBf16;
    std::mt19937_64 rng(41);
    const auto upload = [&](const std::vector<float>& v) { return up(bytes_of(v, bf16)); };
    for (const MaskShape s : {MaskShape{1, 1, 1, 1, 1}, MaskShape{70, 33, 5, 33, 33},
                              MaskShape{0, 40, 3, 40, 48}, MaskShape{1, 40, 3, 40, 48},
                              MaskShape{64, 40, 3, 40, 48}, MaskShape{65, 40, 3, 40, 48}}) {
      SCOPED_TRACE(std::string(mode.name) + ": " + std::to_string(s.batch) + " x " +
                   std::to_string(s.in));
      DenseParameters params(card_);
      const LinearGemmSpec a = mask_producer_spec(s, mode.type);
      Linear layer_a(params, *mode.blas, a);
      Linear layer_b(params, *mode.blas, mask_consumer_spec(s, mode.type));
      if (bf16) params.keep_bf16_copy();
      params.finalize(1);
      layer_a.prepare(s.batch);
      layer_b.prepare(s.batch);
      SCOPED_TRACE(expect_mask_kernels(layer_a, layer_b, s.batch, bf16, emulated));
      // A's pre-activations: a third negative, none exactly 0 (at 0 the ReLU's derivative is
      // a convention: cuBLASLt's RELU_AUX mask let the gradient through there on the H200, where
      // the x > 0 mask stops it); the activations are their ReLU.
      const std::vector<float> pre =
          as_read(random_vector(static_cast<std::size_t>(s.batch) * s.in, rng, -0.5f), bf16);
      std::vector<float> act = pre;
      for (float& v : act) v = std::max(v, 0.0f);
      {  // W_A = the pre-activations, b_A = 0
        std::vector<float> values = params.values_to_host();
        std::copy(pre.begin(), pre.end(),
                  values.begin() + params.blocks()[layer_a.weight_block()].offset);
        const std::size_t ba = params.blocks()[layer_a.bias_block()].offset;
        std::fill_n(values.begin() + ba, s.in, 0.0f);
        params.set_values(values);
      }
      const std::vector<float> w = as_read(params.values_to_host(), bf16);
      const std::vector<float> dz =
          as_read(random_vector(static_cast<std::size_t>(s.batch) * s.out, rng), bf16);
      const float sentinel = 7.0f;  // the padding columns keep it
      std::vector<float> one_hot(static_cast<std::size_t>(s.batch) * a.in, 0.0f);
      for (int i = 0; i < s.batch; ++i) one_hot[static_cast<std::size_t>(i) * a.in + i] = 1.0f;
      auto d_x = upload(one_hot);
      auto d_act = upload(std::vector<float>(act.size(), -1.0f));
      layer_a.forward(params, d_x.data(), d_act.data(), s.batch);
      // Compared as values: a ReLU may write -0 for a negative input.
      ASSERT_EQ(values_of(to_host(d_act), bf16), act)
          << "A's forward did not write the activations";
      auto d_dz = upload(dz);
      auto dx = upload(std::vector<float>(static_cast<std::size_t>(s.batch) * s.dx_ld, sentinel));
      layer_b.backward_data(params, d_dz.data(), d_act.data(), &layer_a, 0.5f, dx.data(), s.batch);
      expect_masked_dx(to_host(dx), bf16, s, act, dz, w,
                       params.blocks()[layer_b.weight_block()].offset, sentinel);
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer
