// bfloat16 storage for the dense net's GEMM inputs (hyper_parameters.dense_precision: bf16): the
// upper half of an IEEE float (8 exponent bits, 7 mantissa bits), so its range is fp32's and a
// conversion back to float is exact. Only storage: arithmetic is done in float, as the GEMMs do
// (bf16 products are exact in fp32; oneDNN and cuBLASLt accumulate in fp32).
//
// The same spelling on host and device (GPUBOX_HD), and the same bits as oneDNN's bf16 and CUDA's
// __nv_bfloat16, so a buffer of Bf16 is handed to either library as it is.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/half.hpp"
#include "common/macros.hpp"

namespace gpubox::device {
class Stream;
}

namespace gpubox::trainer {

struct Bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(Bf16) == 2, "Bf16 is handed to the GEMM libraries as 16-bit elements");

// Round to nearest even, as the hardware converts (AVX512-BF16 vcvtneps2bf16, CUDA
// __float2bfloat16_rn): a NaN stays a (quiet) NaN, values past the largest bf16 round to
// infinity. The conversion is common/half.hpp's, the one the sparse rows' bf16 storage uses.
GPUBOX_HD GPUBOX_FORCEINLINE Bf16 to_bf16(float x) { return Bf16{float_to_bf16(x)}; }

GPUBOX_HD GPUBOX_FORCEINLINE float to_float(Bf16 b) { return bf16_to_float(b.bits); }
GPUBOX_HD GPUBOX_FORCEINLINE float to_float(float x) { return x; }

// Stores a float as the element type of an activation buffer (float, or Bf16 rounded).
GPUBOX_HD GPUBOX_FORCEINLINE void store_as(float* out, float x) { *out = x; }
GPUBOX_HD GPUBOX_FORCEINLINE void store_as(Bf16* out, float x) { *out = to_bf16(x); }

// out[i] = to_bf16(in[i]) for i in [0, n), enqueued on `stream` (one launch; elementwise.cu).
void to_bf16_async(const device::Stream& stream, const float* in, std::size_t n, Bf16* out);

// Row-major [rows x ld] rows with `cols` <= ld columns written: out's columns [0, cols) are
// to_bf16 of in's, its padding columns [cols, ld) zero; in's padding is never read (nobody need
// have written it). Enqueued on `stream` (one launch; elementwise.cu).
void to_bf16_rows_async(const device::Stream& stream, const float* in, int64_t rows, int cols,
                        int64_t ld, Bf16* out);

}  // namespace gpubox::trainer
