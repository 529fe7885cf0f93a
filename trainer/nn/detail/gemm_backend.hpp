// Blas::Backend: the GEMM library state of one card, shared by blas_<backend>.cpp and
// linear_gemms_<backend>.cpp (the only files that include this header), and what both backends
// count and check alike.
//   cpu:  oneDNN 2.x — an engine and a stream (OpenMP runtime: a primitive runs on the calling
//         card thread's OpenMP threads), the bf16 support found, and the user scratchpad every
//         primitive of the card shares (they run one after another on the card's thread).
//   cuda: a cuBLAS handle (plain GEMM/GEMV) and a cuBLASLt handle (the fused layer GEMMs) on the
//         card's device, one workspace for both, allocated when the Blas is made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/stream.hpp"
#include "trainer/nn/blas.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <cublasLt.h>
#include <cublas_v2.h>

#define GPUBOX_CUBLAS_TRY(call)                                               \
  do {                                                                        \
    cublasStatus_t _gpubox_status = (call);                                   \
    if (_gpubox_status != CUBLAS_STATUS_SUCCESS) {                            \
      GPUBOX_FAIL("cuBLAS error ", cublasGetStatusName(_gpubox_status), " (", \
                  cublasGetStatusString(_gpubox_status), ") in ", #call);     \
    }                                                                         \
  } while (0)
#else
#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
#endif

namespace gpubox::trainer {

#if defined(GPUBOX_BACKEND_CUDA)
struct Blas::Backend {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cudaMalloc'd when the Blas is made; used by every GEMM
  std::size_t workspace_bytes = 0;
  int device = 0;
  int compute_capability = 0;  // major * 10 + minor
};
#else
struct Blas::Backend {
  dnnl::engine engine;
  dnnl::stream stream;
  Bf16Support bf16 = Bf16Support::kNone;
  std::string isa;
  // Scratchpad of every oneDNN primitive of this card (scratchpad_mode::user), grown only when
  // a primitive is made (a layer prepares its plans, gemm_bf16 meets a new shape outside a
  // capture), so executing a primitive never allocates.
  device::device_buffer<char> scratchpad;
  // GPUBOX_REPRODUCIBLE_GEMMS=1: every oneDNN GEMM, and every primitive's creation, on one
  // thread. oneDNN partitions a GEMM by its thread count, and the partition changes the bits
  // (a sum split over threads, another kernel path): with one thread they depend on the shapes
  // and the ISA alone, so a seeded run has the same bits whatever the threads per card.
  bool one_thread_gemms = false;
  // Blas::gemm_bf16's matmul primitives (the user scratchpad above; `scratch` is empty for one
  // made in a capture that needed more: library scratchpad), one per shape: sizes, strides,
  // transposes, alpha and beta, as the key lists them. Made at the shape's first call.
  struct Bf16Gemm {
    dnnl::matmul primitive;
    dnnl::memory::desc a, b, c, scratch;
  };
  std::map<std::vector<int64_t>, Bf16Gemm> bf16_gemms;
  // kEmulated: gemm_bf16's fp32 copies of A and B, grown at a call that needs more.
  std::vector<float> emulated_a, emulated_b;
};

// Runs `gemm` (oneDNN calls) on the calling card thread's OpenMP threads, or on one thread
// under Backend::one_thread_gemms; the thread count is restored afterwards, also on a throw.
template <class Gemm>
void run_gemm(const Blas::Backend& backend, Gemm&& gemm) {
  struct Restore {
    int threads;
    ~Restore() { omp_set_num_threads(threads); }
  };
  if (!backend.one_thread_gemms) {
    gemm();
    return;
  }
  const Restore restore{omp_get_max_threads()};
  omp_set_num_threads(1);
  gemm();
}
#endif

// One library call counts one launch on the card (counters.hpp), at the same point on both
// backends: a fused layer GEMM is one launch whatever the library runs inside it.
inline void count_gemm_launch(const device::Stream& stream) {
  if (device::CardCounters* counters = stream.counters()) counters->add_launches();
}

// Blas::sgemm_batched's sizes, checked alike on both backends (a negative size fails), and the
// calls that need no batched GEMM: true when C is empty (m, n or batch 0) or when k == 0, whose
// C_t = beta * C_t this enqueues as sgemm's empty product, matrix by matrix.
inline bool sgemm_batched_trivial(const Blas& blas, Transpose trans_a, Transpose trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                                  int64_t stride_c, int64_t batch) {
  GPUBOX_EXPECTS(m >= 0 && n >= 0 && k >= 0 && batch >= 0, "sgemm_batched with negative size m=", m,
                 " n=", n, " k=", k, " batch=", batch);
  if (m == 0 || n == 0 || batch == 0) return true;
  if (k != 0) return false;
  for (int64_t t = 0; t < batch; ++t) {
    blas.sgemm(trans_a, trans_b, m, n, 0, alpha, a, lda, b, ldb, beta, c + t * stride_c, ldc);
  }
  return true;
}

// Blas::gemm_bf16's sizes and support, checked alike on both backends, and the empty product,
// which reads neither operand: true (sgemm's C = beta * C enqueued) when m, n or k is 0.
inline bool gemm_bf16_trivial(const Blas& blas, Transpose trans_a, Transpose trans_b, int64_t m,
                              int64_t n, int64_t k, float alpha, int64_t lda, int64_t ldb,
                              float beta, float* c, int64_t ldc) {
  GPUBOX_EXPECTS(m >= 0 && n >= 0 && k >= 0, "gemm_bf16 with negative size m=", m, " n=", n,
                 " k=", k);
  GPUBOX_EXPECTS(blas.bf16() != Bf16Support::kNone, "gemm_bf16 on ", blas.isa(),
                 ", which has no bf16 GEMMs");
  if (m != 0 && n != 0 && k != 0) return false;
  blas.sgemm(trans_a, trans_b, m, n, k, alpha, nullptr, lda, nullptr, ldb, beta, c, ldc);
  return true;
}

}  // namespace gpubox::trainer
