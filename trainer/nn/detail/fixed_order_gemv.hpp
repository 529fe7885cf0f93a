// The cpu backend's GEMV (Blas::sgemv, blas_onednn.cpp): y = alpha op(A) x + beta y with every
// output summed in an order fixed by the shapes alone, never by the thread count.
//
// oneDNN's gemv splits a long inner sum over its threads when the output is short (the wide
// part's dense gradient, every bias-like sum over the batch), which made a seeded run's bits
// change with the card's thread count (issue 32). Here the threads only decide who computes
// which fixed piece:
//   A x:   one dot product per output row, over 32 partial sums (column c into partial c mod 32,
//          ascending c), folded in a fixed tree (partial l + 16 into l, then l + 8, l + 4, ...);
//          a row of fewer than 32 columns in one sum, ascending c.
//   A^T x: outputs in blocks of 256 columns; the rows cut into `chunks` consecutive ranges, a
//          count fixed by the shape (so a short output over a long batch still spreads over the
//          threads); within a range each output sums its rows in two interleaved partial sums
//          (even and odd rows of the range, ascending), added at the range's end; the ranges'
//          sums are then added in range order.
// The inner loops are explicit 16-float vectors (GCC vector extensions: lane-wise, so the
// compiler cannot reorder a sum), compiled for AVX-512, AVX2+FMA and the baseline, the best
// picked when the program loads: the bits depend on the shapes and that choice (multiply-adds
// are fused on the first two), never on the threads.
#pragma once

#include <cstdint>

namespace gpubox::trainer::detail {

// Row-major A [rows x cols], row stride lda; `trans`: A^T x (x has rows values, y cols), else
// A x (x has cols values, y rows). beta == 0: y is not read. rows and cols > 0. Runs on the
// calling thread's OpenMP threads when the product is large enough to pay for waking them.
void fixed_order_sgemv(bool trans, int64_t rows, int64_t cols, float alpha, const float* a,
                       int64_t lda, const float* x, float beta, float* y);

// How many consecutive row ranges A^T x sums separately (shape only; exposed for the tests).
int64_t transposed_row_chunks(int64_t rows, int64_t cols);

}  // namespace gpubox::trainer::detail
