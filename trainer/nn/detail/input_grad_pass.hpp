// The pass after an input-gradient GEMM on the cpu backend (linear_gemms_onednn.cpp): alpha where
// the GEMM ran without it, the ReLU mask by X, and the rounding into bf16 dX rows where the GEMM
// wrote fp32 ones for that (bf16 rows with alpha != 1), over dX's rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"

namespace gpubox::trainer::detail {

// Item (i, j), j < cols: dx[i, j] times alpha (fp32 dX rows: the input gradient's alpha when its
// GEMM ran unscaled; bf16 rows come with 1), then 0 where the ReLU output x[i, j] is not above 0
// (no x: no mask), then, with `round_to`, rounded into round_to[i, j] (the same row stride): the
// values of oneDNN's scaled epilogue into bf16 (its fp32 sum times alpha, rounded once). TX and
// TD: float or Bf16 (a bf16 zero is +0; to_float(Bf16) is exact, so the test is the same).
template <class TX, class TD>
struct ReluMask {
  const TX* x;
  int64_t x_ld;
  TD* dx;
  int64_t dx_ld;
  int cols;
  float alpha;
  Bf16* round_to;  // fp32 dX only; may be null
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, cols, [&](int64_t i, int64_t j0, int64_t j1) {
      TD* __restrict out = dx + i * dx_ld;
      if constexpr (std::is_same_v<TD, float>) {
        if (alpha != 1.0f) {
          for (int64_t j = j0; j < j1; ++j) out[j] *= alpha;
        }
      }
      if (x != nullptr) {
        const TX* __restrict in = x + i * x_ld;
        for (int64_t j = j0; j < j1; ++j) out[j] = to_float(in[j]) > 0.0f ? out[j] : TD{};
      }
      if constexpr (std::is_same_v<TD, float>) {
        if (round_to != nullptr) {
          Bf16* __restrict rounded = round_to + i * dx_ld;
          for (int64_t j = j0; j < j1; ++j) rounded[j] = to_bf16(out[j]);
        }
      }
    });
  }
};

// ReluMask over rows [0, n), split over the card thread's OpenMP threads as its GEMM is (each
// entry is masked alone: the same bits whatever the split).
template <class TX, class TD>
void mask_rows(const ReluMask<TX, TD>& mask, int64_t n) {
  const auto cols = static_cast<std::size_t>(mask.cols);
#pragma omp parallel for schedule(static) if (n * mask.cols >= 16384)
  for (int64_t i = 0; i < n; ++i) {
    mask.run_range(static_cast<std::size_t>(i) * cols, static_cast<std::size_t>(i + 1) * cols);
  }
}

// The pass after one backward_data call's GEMM, over X and dX in the types the GEMM read and wrote
// (bf16 only over hardware bf16 rows; fp32 copies under emulation): alpha (fp32 dX), the mask (x
// non-null) and the rounding into `round_to` (fp32 dX, non-null).
struct MaskPass {
  const void* x;
  int64_t x_ld;
  void* dx;
  int64_t dx_ld;
  int cols;
  bool x_bf16, dx_bf16;
  float alpha;
  Bf16* round_to;
  template <class TX, class TD>
  void run(int64_t n) const {
    mask_rows(ReluMask<TX, TD>{static_cast<const TX*>(x), x_ld, static_cast<TD*>(dx), dx_ld, cols,
                               alpha, round_to},
              n);
  }
  void operator()(int64_t n) const {
    if (x_bf16) {
      dx_bf16 ? run<Bf16, Bf16>(n) : run<Bf16, float>(n);
    } else {
      dx_bf16 ? run<float, Bf16>(n) : run<float, float>(n);
    }
  }
};

}  // namespace gpubox::trainer::detail
