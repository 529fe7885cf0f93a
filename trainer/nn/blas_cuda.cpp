// cuBLAS implementation of trainer/nn/blas.hpp (cuda backend), and the per-card library state the
// fused layer GEMMs (linear_gemms_cublaslt.cpp) share. No test executes this file (no GPU on the
// development machines), so it is kept minimal: every cublasStatus_t is checked, and the
// row-major to column-major mapping is the single identity below.
//
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: call cuBLAS with the operands
// swapped and m/n swapped; the leading dimensions stay the row strides.
#include <cuda_runtime_api.h>

#include <new>
#include <string>
#include <utility>

#include "common/error.hpp"
#include "heterps/device/cuda_check.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/detail/gemm_backend.hpp"

namespace gpubox::trainer {
namespace {
cublasOperation_t to_cublas(Transpose t) {
  return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
}
int to_int(int64_t v, const char* what) {
  GPUBOX_EXPECTS(v >= 0 && v <= INT32_MAX, "cuBLAS ", what, " out of int range: ", v);
  return static_cast<int>(v);
}
}  // namespace

// The workspace of both handles (NVIDIA's recommendation for Hopper: 32 MiB), allocated when the
// Blas is made, so a GEMM inside a step never makes cuBLAS allocate one (device rule 1). cuBLAS
// and cuBLASLt calls of one card run in order on its one stream, so they can share it.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

Blas::Blas(device::Card& card) : card_(&card), backend_(std::make_unique<Backend>()) {
  Backend& b = *backend_;
  b.device = card.device();
  device::DeviceGuard guard(card.device());  // the handles belong to the card's device
  int major = 0;
  int minor = 0;
  GPUBOX_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, b.device));
  GPUBOX_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, b.device));
  b.compute_capability = major * 10 + minor;
  GPUBOX_CUBLAS_TRY(cublasCreate(&b.handle));
  GPUBOX_CUBLAS_TRY(cublasSetStream(b.handle, card.stream().native()));
  GPUBOX_CUBLAS_TRY(cublasSetPointerMode(b.handle, CUBLAS_POINTER_MODE_HOST));
  GPUBOX_CUDA_TRY(cudaMalloc(&b.workspace, kWorkspaceBytes));
  b.workspace_bytes = kWorkspaceBytes;
  GPUBOX_CUBLAS_TRY(cublasSetWorkspace(b.handle, b.workspace, kWorkspaceBytes));
  GPUBOX_CUBLAS_TRY(cublasLtCreate(&b.lt));
}

Blas::~Blas() {
  if (!backend_) return;  // moved from
  Backend& b = *backend_;
  // A destructor cannot throw; teardown frees on the owning device whatever is current.
  device::DeviceGuard guard(b.device, std::nothrow);
  if (b.lt != nullptr) cublasLtDestroy(b.lt);
  if (b.handle != nullptr) cublasDestroy(b.handle);
  if (b.workspace != nullptr) cudaFree(b.workspace);
}

Blas::Blas(Blas&& other) noexcept = default;

Blas& Blas::operator=(Blas&& other) noexcept {
  std::swap(card_, other.card_);
  std::swap(backend_, other.backend_);
  return *this;
}

// bf16 tensor cores from Ampere (sm_80) on.
Bf16Support Blas::bf16() const {
  return backend_->compute_capability >= 80 ? Bf16Support::kHardware : Bf16Support::kNone;
}

std::string Blas::isa() const { return "sm_" + std::to_string(backend_->compute_capability); }

void Blas::sgemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) const {
  GPUBOX_EXPECTS(m >= 0 && n >= 0 && k >= 0, "sgemm with negative size m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  count_gemm_launch(stream());
  const auto ld = [](int64_t v) { return to_int(v < 1 ? 1 : v, "leading dimension"); };
  if (k == 0) {
    // Empty product: C = beta * C, as the cpu backend does; cuBLAS's quick return on k == 0 is
    // not a documented contract (an empty batch's weight gradient must come out 0, not stale).
    if (beta == 0.0f) {
      GPUBOX_CUDA_TRY(cudaMemset2DAsync(c, static_cast<std::size_t>(ldc) * sizeof(float), 0,
                                        static_cast<std::size_t>(n) * sizeof(float),
                                        static_cast<std::size_t>(m), stream().native()));
    } else if (beta != 1.0f) {
      // In place (C = beta * C + 0 * C): geam allows C to alias A with the same leading dim.
      const float zero = 0.0f;
      GPUBOX_CUBLAS_TRY(cublasSgeam(backend_->handle, CUBLAS_OP_N, CUBLAS_OP_N, to_int(n, "n"),
                                    to_int(m, "m"), &beta, c, ld(ldc), &zero, c, ld(ldc), c,
                                    ld(ldc)));
    }
    return;
  }
  GPUBOX_CUBLAS_TRY(cublasSgemm(backend_->handle, to_cublas(trans_b), to_cublas(trans_a),
                                to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha, b, ld(ldb),
                                a, ld(lda), &beta, c, ld(ldc)));
}

void Blas::sgemm_batched(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const float* a, int64_t lda, int64_t stride_a, const float* b,
                         int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                         int64_t stride_c, int64_t batch) const {
  if (sgemm_batched_trivial(*this, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                            stride_c, batch)) {
    return;
  }
  count_gemm_launch(stream());
  const auto ld = [](int64_t v) { return to_int(v < 1 ? 1 : v, "leading dimension"); };
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: operands swapped, as sgemm.
  GPUBOX_CUBLAS_TRY(cublasSgemmStridedBatched(
      backend_->handle, to_cublas(trans_b), to_cublas(trans_a), to_int(n, "n"), to_int(m, "m"),
      to_int(k, "k"), &alpha, b, ld(ldb), stride_b, a, ld(lda), stride_a, &beta, c, ld(ldc),
      stride_c, to_int(batch, "batch")));
}

void Blas::gemm_bf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb,
                     float beta, float* c, int64_t ldc) const {
  if (gemm_bf16_trivial(*this, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, c, ldc)) return;
  count_gemm_launch(stream());
  const auto ld = [](int64_t v) { return to_int(v < 1 ? 1 : v, "leading dimension"); };
  // Operands swapped as sgemm's; bf16 products summed in fp32 (tensor cores from sm_80).
  GPUBOX_CUBLAS_TRY(cublasGemmEx(backend_->handle, to_cublas(trans_b), to_cublas(trans_a),
                                 to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha, b,
                                 CUDA_R_16BF, ld(ldb), a, CUDA_R_16BF, ld(lda), &beta, c,
                                 CUDA_R_32F, ld(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Blas::sgemv(Transpose trans_a, int64_t rows, int64_t cols, float alpha, const float* a,
                 int64_t lda, const float* x, float beta, float* y) const {
  GPUBOX_EXPECTS(rows >= 0 && cols >= 0, "sgemv with negative size rows=", rows, " cols=", cols);
  const int64_t out = trans_a == Transpose::kYes ? cols : rows;
  if (out == 0) return;
  count_gemm_launch(stream());
  if ((trans_a == Transpose::kYes ? rows : cols) == 0) {
    // Empty product: y = beta * y (cuBLAS returns early on empty sizes without touching y).
    if (beta == 0.0f) {
      GPUBOX_CUDA_TRY(
          cudaMemsetAsync(y, 0, static_cast<std::size_t>(out) * sizeof(float), stream().native()));
    } else {
      GPUBOX_CUBLAS_TRY(cublasSscal(backend_->handle, to_int(out, "out"), &beta, y, 1));
    }
    return;
  }
  // Row-major A[rows x cols] is column-major A^T[cols x rows]: flip the transpose flag.
  const cublasOperation_t op = trans_a == Transpose::kYes ? CUBLAS_OP_N : CUBLAS_OP_T;
  GPUBOX_CUBLAS_TRY(cublasSgemv(backend_->handle, op, to_int(cols, "cols"), to_int(rows, "rows"),
                                &alpha, a, to_int(lda < 1 ? 1 : lda, "lda"), x, 1, &beta, y, 1));
}

}  // namespace gpubox::trainer
