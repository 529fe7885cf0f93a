// OpenBLAS implementation of trainer/nn/blas.hpp (cpu backend).
//
// Threads: OpenBLAS's thread count is process-wide, and every card of a CardSet has the same
// thread count (hardware threads / cards), so setting it to card.threads() is consistent for all
// cards. With one card it uses every core for a GEMM; with several cards each card's GEMMs run
// single-threaded in its own thread, which is what the cards' parallelism wants anyway (measured
// with `gpubox_bench dense --blas-threads`, see tests/bench/bench_dense.cu).
#include <cblas.h>

#include <utility>

#include "common/error.hpp"
#include "trainer/nn/blas.hpp"

namespace gpubox::trainer {
namespace {
CBLAS_TRANSPOSE to_cblas(Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; }
}  // namespace

Blas::Blas(const device::Card& card) : stream_(&card.stream()) {
  openblas_set_num_threads(card.threads());
}

Blas::~Blas() = default;

Blas::Blas(Blas&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)),
      handle_(std::exchange(other.handle_, nullptr)) {}

Blas& Blas::operator=(Blas&& other) noexcept {
  std::swap(stream_, other.stream_);
  std::swap(handle_, other.handle_);
  return *this;
}

void Blas::sgemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) const {
  GPUBOX_EXPECTS(m >= 0 && n >= 0 && k >= 0, "sgemm with negative size m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  // cblas rejects lda < 1 even when the matrix is empty.
  const auto fix = [](int64_t ld) { return static_cast<blasint>(ld < 1 ? 1 : ld); };
  cblas_sgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, fix(lda), b, fix(ldb),
              beta, c, fix(ldc));
}

void Blas::sgemv(Transpose trans_a, int64_t rows, int64_t cols, float alpha, const float* a,
                 int64_t lda, const float* x, float beta, float* y) const {
  GPUBOX_EXPECTS(rows >= 0 && cols >= 0, "sgemv with negative size rows=", rows, " cols=", cols);
  const int64_t out = trans_a == Transpose::kYes ? cols : rows;
  if (out == 0) return;
  if ((trans_a == Transpose::kYes ? rows : cols) == 0) {
    // Empty product: y = beta * y (cblas may skip the beta scaling for empty inner sizes).
    for (int64_t i = 0; i < out; ++i) y[i] = beta == 0.0f ? 0.0f : beta * y[i];
    return;
  }
  cblas_sgemv(CblasRowMajor, to_cblas(trans_a), static_cast<blasint>(rows),
              static_cast<blasint>(cols), alpha, a, static_cast<blasint>(lda < 1 ? 1 : lda), x, 1,
              beta, y, 1);
}

}  // namespace gpubox::trainer
