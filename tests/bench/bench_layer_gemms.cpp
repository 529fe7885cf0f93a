// gpubox_bench layer-gemms: each GEMM of the dense net's linear layers (trainer::LinearGemms, the
// path a training step runs: oneDNN on cpu, cuBLASLt on cuda) timed alone, per layer and per
// kind (forward, weight gradient with the bias gradient, input gradient with the ReLU mask), in
// GFLOP/s against a square sgemm of the same run (Blas::sgemm): whether a layout or a kernel
// falls short of the machine's GEMM rate, and the examples/s the layers' GEMMs alone allow.
// --precision bf16 times the layers as dense_precision: bf16 makes them (bf16 X, W, dZ and hidden
// outputs, fp32 accumulation) and adds a square bf16 GEMM (Blas::gemm_bf16) beside the sgemm:
// whether this CPU's bf16 GEMMs outrun its fp32 ones at all (AVX512-BF16 without AMX may not).
//
// The default shapes are the MLP of PaddleRec's dnn, wide_deep and deepfm configs over
// bench_peer_paddle.sh's data (26 slots x 9 floats + 13 dense = 247 inputs, 234 of them pooled
// slots whose input gradient is wanted; 512-256-128-32, then the logit), with DenseModel's row
// strides (a multiple of 8 floats). Each figure: the median of --repeats timings of --calls
// calls each, operands hot in cache (a step reads them cooler).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/bench/bench_command.hpp"
#include "tests/bench/bench_timing.hpp"
#include "trainer/nn/activation_layout.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::bench {
namespace {

using trainer::Blas;
using trainer::LinearGemms;
using trainer::LinearGemmSpec;

// The layers' specs as DenseModel::add_mlp makes them, activations of type `act`.
std::vector<LinearGemmSpec> mlp_specs(int input, int dx_cols, const std::vector<int>& sizes,
                                      trainer::ElementType act) {
  std::vector<LinearGemmSpec> specs;
  int in = input;
  for (std::size_t l = 0; l <= sizes.size(); ++l) {
    const bool last = l == sizes.size();
    LinearGemmSpec s;
    s.name = "fc_" + std::to_string(l);
    s.in = in;
    s.out = last ? 1 : sizes[l];
    s.relu = !last;
    s.input = act;
    s.output = last ? trainer::ElementType::kF32 : act;  // the logit is fp32
    s.dx = l == 0 ? trainer::ElementType::kF32 : act;    // the pooled gradient too
    s.input_is_relu = l > 0;
    s.dx_cols = l == 0 ? dx_cols : in;
    s.x_ld = trainer::activation_ld(in);
    s.y_ld = s.dz_ld = trainer::activation_ld(s.out);
    s.dx_ld = l == 0 ? dx_cols : trainer::activation_ld(in);
    specs.push_back(s);
    in = s.out;
  }
  return specs;
}

// Random floats in [-0.1, 0.1) on the card (at least one, so an empty matrix has an address);
// make(n, kBf16): n of them rounded to bf16, packed two to a float of the buffer.
class RandomBuffers {
 public:
  explicit RandomBuffers(device::Card& card) : card_(&card), rng_(29) {}
  device::device_buffer<float> make(int64_t n,
                                    trainer::ElementType type = trainer::ElementType::kF32) {
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    std::vector<float> v(static_cast<std::size_t>(std::max<int64_t>(n, 1)));
    for (float& value : v) value = u(rng_);
    if (type == trainer::ElementType::kBf16) {
      std::vector<trainer::Bf16> half(v.size());
      std::transform(v.begin(), v.end(), half.begin(), [](float x) { return trainer::to_bf16(x); });
      v.assign((half.size() + 1) / 2, 0.0f);
      std::memcpy(v.data(), half.data(), half.size() * sizeof(trainer::Bf16));
    }
    return device::to_device(v, card_->memory(), card_->stream());
  }

 private:
  device::Card* card_;
  std::mt19937_64 rng_;
};

struct LayerTimings {
  Timing forward, weights, data;  // data: zero when the layer computes no input gradient
};

// `layer`'s three GEMMs on input `x` (the previous layer's output, `producer`'s) into `y`.
LayerTimings time_layer(device::Card& card, RandomBuffers& random, LinearGemms& layer,
                        const LinearGemms* producer, const void* x, void* y, int batch, int calls,
                        int repeats) {
  const LinearGemmSpec& s = layer.spec();
  const auto w = random.make(static_cast<int64_t>(s.in) * s.out, s.input),
             bias = random.make(s.out);
  auto dw = random.make(static_cast<int64_t>(s.in) * s.out), db = random.make(s.out);
  const auto dz = random.make(static_cast<int64_t>(batch) * s.dz_ld, s.input);
  auto dx = random.make(static_cast<int64_t>(batch) * s.dx_ld, s.dx);
  LayerTimings t;
  t.forward = time_calls(card, calls, repeats,
                         [&] { layer.forward(x, w.data(), bias.data(), nullptr, y, batch); });
  t.weights = time_calls(card, calls, repeats, [&] {
    layer.backward_weights(x, dz.data(), dw.data(), db.data(), batch);
  });
  if (s.dx_cols > 0) {
    t.data = time_calls(card, calls, repeats, [&] {
      layer.backward_data(dz.data(), w.data(), x, producer, 1.0f, dx.data(), batch);
    });
  }
  return t;
}

// "median us / GFLOP/s at the median (at the fastest)" of `macs` multiply-adds.
std::string rate(const Timing& t, double macs) {
  if (t.median_us <= 0) return "-";
  char line[96];
  std::snprintf(line, sizeof(line), "%7.1f us %5.1f (%5.1f) GFLOP/s", t.median_us,
                2e-3 * macs / t.median_us, 2e-3 * macs / t.best_us);
  return line;
}

// The square GEMMs of this run: the machine's fp32 GEMM rate on these threads (Blas::sgemm) and,
// with `bf16`, its bf16-input rate (Blas::gemm_bf16, fp32 accumulation) and their ratio.
void print_square_gemms(Blas& blas, RandomBuffers& random, bool bf16, int repeats) {
  const int64_t n = 1024;
  const auto a = random.make(n * n), b = random.make(n * n);
  auto c = random.make(n * n);
  device::Card& card = blas.card();
  const Timing square = time_calls(card, 1, repeats, [&] {
    blas.sgemm(trainer::Transpose::kNo, trainer::Transpose::kNo, n, n, n, 1.0f, a.data(), n,
               b.data(), n, 0.0f, c.data(), n);
  });
  const auto macs = static_cast<double>(n * n * n);
  std::printf("  sgemm %lldx%lldx%lld: %s\n", static_cast<long long>(n), static_cast<long long>(n),
              static_cast<long long>(n), rate(square, macs).c_str());
  if (!bf16) return;
  const auto a16 = random.make(n * n, trainer::ElementType::kBf16);
  const auto b16 = random.make(n * n, trainer::ElementType::kBf16);
  const auto* pa = reinterpret_cast<const trainer::Bf16*>(a16.data());
  const auto* pb = reinterpret_cast<const trainer::Bf16*>(b16.data());
  const Timing half = time_calls(card, 1, repeats, [&] {
    blas.gemm_bf16(trainer::Transpose::kNo, trainer::Transpose::kNo, n, n, n, 1.0f, pa, n, pb, n,
                   0.0f, c.data(), n);
  });
  std::printf("  gemm_bf16 %lldx%lldx%lld: %s; bf16 / fp32 rate %.2f\n", static_cast<long long>(n),
              static_cast<long long>(n), static_cast<long long>(n), rate(half, macs).c_str(),
              square.median_us / half.median_us);
}

int run_layer_gemms(const BenchArgs& args) {
  args.expect_only(
      {"batch", "input", "dx-cols", "sizes", "threads", "calls", "repeats", "precision"});
  const std::string precision = args.get("precision", "fp32");
  GPUBOX_EXPECTS(precision == "fp32" || precision == "bf16", "--precision is fp32 or bf16, got ",
                 precision);
  const bool bf16 = precision == "bf16";
  const trainer::ElementType act = bf16 ? trainer::ElementType::kBf16 : trainer::ElementType::kF32;
  const int batch = static_cast<int>(args.get_int("batch", 512));
  const int input = static_cast<int>(args.get_int("input", 247));
  const int dx_cols = static_cast<int>(args.get_int("dx-cols", 234));
  const int threads = static_cast<int>(args.get_int("threads", 1));
  const int calls = static_cast<int>(args.get_int("calls", 5));
  const int repeats = static_cast<int>(args.get_int("repeats", 25));
  std::vector<int> sizes;
  for (const long long size : args.get_int_list("sizes", "512,256,128,32", 1, 1 << 16))
    sizes.push_back(static_cast<int>(size));
  GPUBOX_EXPECTS(
      batch >= 1 && input >= 1 && dx_cols >= 0 && dx_cols <= input && calls >= 1 && repeats >= 1,
      "--batch, --input, --calls and --repeats must be positive, --dx-cols <= --input");
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  GPUBOX_EXPECTS(!bf16 || blas.bf16() != trainer::Bf16Support::kNone,
                 "--precision bf16 needs bf16 GEMMs, which this CPU lacks (", blas.isa(), ")");
  RandomBuffers random(card);
  std::printf(
      "layer GEMMs on %s, %s, batch %d, %d thread(s), 1-minute load average %.2f; "
      "median (fastest) of %d timings\n",
      blas.isa().c_str(), precision.c_str(), batch, card.threads(), load_average(), repeats);
  print_square_gemms(blas, random, bf16, repeats);
  const std::vector<LinearGemmSpec> specs = mlp_specs(input, dx_cols, sizes, act);
  std::vector<std::unique_ptr<LinearGemms>> layers;
  std::vector<device::device_buffer<float>> outputs;  // layer l's Y, layer l + 1's X
  const auto x0 = random.make(static_cast<int64_t>(batch) * specs[0].x_ld, act);
  double step_us = 0, best_us = 0, step_macs = 0;
  for (const LinearGemmSpec& s : specs) {
    const LinearGemms* producer = layers.empty() ? nullptr : layers.back().get();
    const float* x = outputs.empty() ? x0.data() : outputs.back().data();
    layers.push_back(std::make_unique<LinearGemms>(blas, s));
    layers.back()->prepare(batch);
    outputs.push_back(random.make(static_cast<int64_t>(batch) * s.y_ld, s.output));
    const LayerTimings t = time_layer(card, random, *layers.back(), producer, x,
                                      outputs.back().data(), batch, calls, repeats);
    const double mac = static_cast<double>(batch) * s.out;
    std::printf("  %s %dx%d: forward %s, weight grad %s, input grad (%d cols) %s\n      %s\n",
                s.name.c_str(), s.in, s.out, rate(t.forward, mac * s.in).c_str(),
                rate(t.weights, mac * s.in).c_str(), s.dx_cols,
                rate(t.data, mac * s.dx_cols).c_str(), layers.back()->describe(batch).c_str());
    step_us += t.forward.median_us + t.weights.median_us + t.data.median_us;
    best_us += t.forward.best_us + t.weights.best_us + t.data.best_us;
    step_macs += mac * (2.0 * s.in + s.dx_cols);
  }
  std::printf(
      "  all layers: %.0f (%.0f) us a step of %d, %.1f (%.1f) GFLOP/s; %.0f FLOPs an "
      "example: %.0f (%.0f) examples/s from the GEMMs alone\n",
      step_us, best_us, batch, 2e-3 * step_macs / step_us, 2e-3 * step_macs / best_us,
      2 * step_macs / batch, batch / (step_us * 1e-6), batch / (best_us * 1e-6));
  return 0;
}

GPUBOX_BENCH_COMMAND("layer-gemms",
                     "[--batch B] [--input N] [--dx-cols N] [--sizes 512,256,...] [--threads T] "
                     "[--calls N] [--repeats R] [--precision fp32|bf16]: each linear-layer GEMM "
                     "(LinearGemms) timed alone, "
                     "GFLOP/s against a square sgemm",
                     run_layer_gemms);

}  // namespace
}  // namespace gpubox::bench
