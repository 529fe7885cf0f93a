// The GEMM library of one card, two implementations: oneDNN on the cpu backend (blas_onednn.cpp),
// cuBLAS and cuBLASLt on the cuda backend (blas_cuda.cpp). Blas itself offers plain fp32 GEMM and
// GEMV (the wide part, the benchmarks' sgemm limit) and a bf16-input GEMM (the cross networks in
// bf16); the dense layers' fused GEMMs
// (linear_gemms.hpp) run on the same library state. All matrices are row-major and in the memory
// of the card the Blas was made for; every call is ordered on that card's stream.
//
// Thread-safety: a Blas belongs to one card and is used only by that card's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "heterps/device/card.hpp"
#include "heterps/device/stream.hpp"
#include "trainer/nn/bf16.hpp"

namespace gpubox::trainer {

enum class Transpose { kNo, kYes };

// How this card's GEMMs can take bf16 inputs.
enum class Bf16Support {
  kNone,      // no bf16 GEMMs in hardware: the dense net runs in fp32
  kHardware,  // AVX512-BF16 / AMX through oneDNN, tensor cores through cuBLASLt
  // cpu only, GPUBOX_BF16_EMULATION=1: a numerics check on hardware without bf16. The bf16 data
  // path runs as it would with hardware, and each GEMM computes in fp32 on its bf16 operands
  // (exact products, fp32 accumulation: what bf16 hardware computes, up to summation order).
  // Slower than fp32; never a default.
  kEmulated,
};

class Blas {
 public:
  // Binds to `card`'s stream and makes the library's per-card state: oneDNN's engine and stream
  // (a GEMM runs on the calling card thread's OpenMP threads: Card::activate sets how many);
  // cuBLAS and cuBLASLt handles on the card's device, set to its stream, with their workspace
  // allocated here, up front (no GEMM allocates later). `card` must outlive the Blas.
  explicit Blas(device::Card& card);
  ~Blas();
  Blas(Blas&& other) noexcept;
  Blas& operator=(Blas&& other) noexcept;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C. lda/ldb/ldc are the row strides of
  // A, B, C as stored (so lda >= k for A untransposed, lda >= m for A transposed). Zero m, n or k
  // are fine (k == 0 scales C by beta).
  void sgemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc) const;

  // For t in [0, batch): C_t = alpha * op(A_t) op(B_t) + beta * C_t, as sgemm, where X_t starts
  // at x + t * stride_x: many small GEMMs of one shape in one call (cuBLAS's strided-batched GEMM;
  // on the cpu backend one single-threaded GEMM per OpenMP thread and matrix, so the result does
  // not depend on the thread count). The batch's C_t must not overlap.
  void sgemm_batched(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* a, int64_t lda, int64_t stride_a, const float* b,
                     int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                     int64_t stride_c, int64_t batch) const;

  // sgemm with bf16 A and B (same strides, in elements): the products exact in fp32, summed in
  // fp32 into the fp32 C. Needs bf16() != kNone. cpu: a oneDNN matmul primitive per shape (made
  // at a shape's first call, kept by the Blas); kEmulated: fp32 copies of A and B, then sgemm.
  // cuda: cublasGemmEx (CUDA_R_16BF in, CUDA_R_32F out, CUBLAS_COMPUTE_32F). The cross networks'
  // GEMMs in bf16 (CrossNet); the MLP's layers use LinearGemms.
  void gemm_bf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) const;

  // y = alpha * op(A) x + beta * y, A stored row-major [rows x cols] with row stride lda.
  void sgemv(Transpose trans_a, int64_t rows, int64_t cols, float alpha, const float* a,
             int64_t lda, const float* x, float beta, float* y) const;

  Bf16Support bf16() const;
  // The instruction set the GEMMs run on, as the library names it: oneDNN's effective CPU ISA
  // ("avx2", "avx512_core_bf16", ...) or the GPU's compute capability ("sm_90").
  std::string isa() const;

  device::Card& card() const { return *card_; }
  const device::Stream& stream() const { return card_->stream(); }

  // The library state, defined by each implementation (detail/gemm_backend.hpp); the fused
  // layer GEMMs (linear_gemms_*.cpp) use it.
  struct Backend;
  Backend& backend() const { return *backend_; }

 private:
  device::Card* card_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace gpubox::trainer
