// 16-bit floating point, the one conversion of every layer: IEEE 754 binary16 ("fp16") and
// bfloat16 ("bf16", the upper half of an IEEE float: 8 exponent bits, 7 mantissa bits). Used by
// the sparse rows' 16-bit storage (hyper_parameters.sparse_storage, table/sparse_row/accessor.hpp)
// on host and card, the dense net's bf16 buffers (trainer/nn/bf16.hpp) and the serving export
// (gpubox_train --mode export --export_fp16). Plain bit manipulation (GPUBOX_HD, no device
// headers), so both backends round the same way, and as CUDA's __float2half_rn /
// __float2bfloat16_rn and AVX512-BF16's vcvtneps2bf16 do (NaN payloads aside). Conversions to 16
// bits round to nearest, ties to even; a NaN stays a quiet NaN; values past the largest finite one
// round to infinity. Widening back to float is exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/macros.hpp"

namespace gpubox {

// The nearest binary16 value (ties to even); overflow gives +-infinity, NaN stays NaN (quiet).
GPUBOX_HD inline uint16_t float_to_half(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t exponent = (bits >> 23) & 0xffu;
  uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xffu) {  // infinity or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (mantissa != 0 ? 0x200u : 0u));
  }
  const int32_t half_exponent = static_cast<int32_t>(exponent) - 127 + 15;
  if (half_exponent >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (half_exponent <= 0) {
    // Subnormal half (or zero): shift the mantissa, with its implicit leading one, into place.
    if (half_exponent < -10) return sign;  // below half the smallest subnormal: rounds to zero
    mantissa |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - half_exponent);
    uint32_t half_mantissa = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half_mantissa & 1u) != 0)) ++half_mantissa;
    return static_cast<uint16_t>(sign | half_mantissa);
  }
  uint32_t half = (static_cast<uint32_t>(half_exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
  return static_cast<uint16_t>(sign | half);
}

GPUBOX_HD inline float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    int32_t e = -14;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e + 127) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float out = 0;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// The nearest bfloat16 (ties to even), by the carry of a rounding bias into the upper half.
GPUBOX_HD inline uint16_t float_to_bf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  // NaN stays NaN (quieted); anything else rounds to nearest even. Both are computed and one is
  // selected, without a branch, so that loops converting arrays vectorize.
  const uint16_t quiet_nan = static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  const uint16_t rounded = static_cast<uint16_t>((bits + rounding) >> 16);
  return (bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

GPUBOX_HD inline float bf16_to_float(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float out = 0;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace gpubox
