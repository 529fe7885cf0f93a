// Text in a PS job's small dense tables (a failure's reason, trainer 0's settings): 3 bytes a
// float (24 bits: exact in a float), up to its first zero byte.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpubox::trainer::ps_modes {

inline constexpr std::size_t kTextBytesPerFloat = 3;

// `text` added into the floats at `out` (zeros, at least ceil(size / 3) of them), as
// get_table_text reads it back.
inline void put_table_text(const std::string& text, float* out) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<uint32_t>(static_cast<unsigned char>(text[i]));
    const uint32_t shift = 8 * static_cast<uint32_t>(i % kTextBytesPerFloat);
    out[i / kTextBytesPerFloat] += static_cast<float>(byte << shift);
  }
}

// The text of `floats` floats at `in`, up to its first zero byte.
inline std::string get_table_text(const float* in, std::size_t floats) {
  std::string text;
  for (std::size_t f = 0; f < floats; ++f) {
    auto packed = static_cast<uint32_t>(std::lround(in[f]));
    for (std::size_t b = 0; b < kTextBytesPerFloat; ++b, packed >>= 8) {
      const char byte = static_cast<char>(packed & 0xffu);
      if (byte == '\0') return text;
      text += byte;
    }
  }
  return text;
}

}  // namespace gpubox::trainer::ps_modes
