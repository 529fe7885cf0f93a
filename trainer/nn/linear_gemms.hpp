// The three GEMMs of one fully connected layer on one card, with the layer's element-wise work
// folded into them so that no separate pass reads or writes the activations:
//
//   forward           Y  = X W + b, then ReLU for a hidden layer     (bias and ReLU in the
//   epilogue) backward_weights  dW = X^T dZ and db = 1^T dZ                    (the bias gradient
//   with it) backward_data     dX = alpha * dZ W^T, times 1(X > 0) when X is a ReLU output
//                                                                    (the ReLU backward folded in)
//
// Two implementations, the libraries made for this (linear_gemms_onednn.cpp,
// linear_gemms_cublaslt.cpp):
//   cpu:  oneDNN matmul primitives with post-ops (bias, eltwise ReLU; the mask as a chain of
//         binary post-ops reading X) and a matmul of a ones row for db.
//   cuda: cuBLASLt epilogues RELU_AUX_BIAS / BIAS (forward; the ReLU bit mask recorded on the
//         side), BGRADA (db from the weight-gradient GEMM; BGRADA rather than BGRADB because the
//         row-major operands reach cuBLASLt swapped) and DRELU (the producer's recorded mask).
//
// Row-major throughout; every matrix is given by a pointer (card memory) and a row stride. W is
// [in x out] (the layer's block of the parameter buffer, or its bf16 copy), b [out], dW [in x out]
// and db [out] are fp32. X, W and dZ are of the layer's `input` type; Y of `output` (fp32 for the
// logit layer); dX of `dx`. fp32 accumulation in every case; gradients into fp32.
//
// Plans (oneDNN primitives; cuBLASLt descriptors and the algorithm chosen for them) are made
// per batch size by prepare(), which also sizes every card buffer they need (oneDNN scratchpad,
// the ReLU mask): call it before the step's first collective (device rule 1). Executing a plan
// allocates nothing. Each call counts one launch on the card.
//
// Thread-safety: one card's thread only. Ownership: plans and the ReLU mask; not the operands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/nn/bf16.hpp"
#include "trainer/nn/blas.hpp"

namespace gpubox::trainer {

enum class ElementType { kF32, kBf16 };
const char* element_type_name(ElementType type);
std::size_t element_bytes(ElementType type);

struct LinearGemmSpec {
  std::string name;  // the layer ("fc_0"): errors and the kernel report name it
  int in = 0;
  int out = 0;
  ElementType input = ElementType::kF32;   // X, W, dZ
  ElementType output = ElementType::kF32;  // Y
  ElementType dx = ElementType::kF32;      // dX
  bool relu = false;                       // Y = relu(X W + b)
  bool input_is_relu = false;  // X is the previous layer's ReLU output: backward_data masks dX
  // Y is rewritten in place after the forward (dropout zeroes some of its units): the forward
  // records no ReLU mask (cuda: RELU_BIAS, no aux bit mask; oneDNN records none either way).
  bool output_rewritten = false;
  // X is such a rewritten output (its producer's output_rewritten): backward_data masks dX by the
  // stored X > 0 (cuda: the input-gradient GEMM, then the mask kernel, not DRELU's fused epilogue,
  // whose recorded mask would let dropped units through; oneDNN always reads X).
  bool input_rewritten = false;
  int dx_cols = 0;   // backward_data computes dX's first dx_cols columns (<= in)
  int64_t x_ld = 0;  // row strides, in elements
  int64_t y_ld = 0;
  int64_t dz_ld = 0;
  int64_t dx_ld = 0;
};

// The dX columns a layer whose input gradient is wanted for its first `wanted` columns (of `in`)
// computes fastest, >= wanted and <= in. oneDNN's fp32 and bf16 GEMMs run dX's last partial
// block of 16 columns slowly: 234 columns of a 512-wide layer's dX took 13% longer than 240 did
// (`gpubox_bench layer-gemms --dx-cols`; 10-15% at 256, 768 and 1024 wide, bf16 10%), so on
// the cpu backend this rounds up to 16 where `in` has the columns; cuBLASLt: `wanted`. The
// extra columns' gradients are computed and not read: the caller's dX rows must hold them.
int fast_dx_cols(int wanted, int in);

class LinearGemms {
 public:
  // `blas` must outlive this object; plans are made on its card.
  LinearGemms(Blas& blas, const LinearGemmSpec& spec);
  ~LinearGemms();
  LinearGemms(LinearGemms&& other) noexcept;
  LinearGemms& operator=(LinearGemms&& other) noexcept;
  LinearGemms(const LinearGemms&) = delete;
  LinearGemms& operator=(const LinearGemms&) = delete;

  const LinearGemmSpec& spec() const { return spec_; }

  // Makes the plans for `batch` rows (kept for the last few batch sizes) and sizes the buffers
  // they use. No-op when they exist.
  void prepare(int64_t batch);

  // Y = act(X W + b). With ReLU on cuda, also records this batch's ReLU mask (read by the next
  // layer's backward_data). `bias_bf16` (may be null): the bf16 rounding of the bias, which
  // cuBLASLt's bias epilogue reads when Y is bf16 (its bias has Y's type); oneDNN reads `bias`.
  void forward(const void* x, const void* w, const float* bias, const Bf16* bias_bf16, void* y,
               int64_t batch);
  // dW = X^T dZ, db = 1^T dZ (overwritten; zero for an empty batch).
  void backward_weights(const void* x, const void* dz, float* dw, float* db, int64_t batch);
  // dX[:, :dx_cols] = alpha * dZ W[:dx_cols, :]^T, masked by 1(X > 0) when input_is_relu; then
  // `producer` is the layer whose forward wrote X for this batch (cuda reads its recorded mask,
  // oneDNN reads X itself).
  void backward_data(const void* dz, const void* w, const void* x, const LinearGemms* producer,
                     float alpha, void* dx, int64_t batch);

  // One line: which kernel each GEMM runs for `batch` rows (after prepare), with ISA and
  // precision, e.g. "forward gemm:jit + bias + relu, ... (oneDNN, avx2, fp32)".
  std::string describe(int64_t batch) const;

  struct Plans;  // per backend

 private:
  Blas* blas_;
  LinearGemmSpec spec_;
  std::unique_ptr<Plans> plans_;
};

}  // namespace gpubox::trainer
