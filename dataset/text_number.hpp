// Number <-> text without allocation or locale: std::from_chars / std::to_chars (libstdc++ 12
// parses floats with the fast_float algorithm, exactly rounded) plus the small rules of our
// formats (a leading '+' is accepted, non-finite floats are not).
#pragma once

#include <locale.h>
#include <stdlib.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace gpubox::dataset {

// Whole-token parses: false unless every character of `text` was used.
// Hand-written for uint64 (the hot path: one call per feasign), with exact overflow detection.
inline bool parse_u64(std::string_view text, std::uint64_t* out) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty() || text.size() > 20) return false;
  std::uint64_t value = 0;
  const std::size_t fast = text.size() < 19 ? text.size() : 19;  // 19 digits cannot overflow
  for (std::size_t i = 0; i < fast; ++i) {
    const unsigned digit = static_cast<unsigned char>(text[i]) - '0';
    if (digit > 9) return false;
    value = value * 10 + digit;
  }
  if (text.size() == 20) {
    const unsigned digit = static_cast<unsigned char>(text[19]) - '0';
    if (digit > 9 || value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *out = value;
  return true;
}

inline bool parse_i64(std::string_view text, std::int64_t* out) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

namespace detail {

// A whole number token that from_chars found out of range: its value when it is too small for T
// (the nearest T, 0 with its sign or a denormal, as strtof/strtod round it in the C locale, as
// Python's float() does), false when it is too large. The slow path of a rare token only.
template <class T>
bool below_range(std::string_view text, T* out) {
  static const locale_t c_locale = ::newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
  if (c_locale == static_cast<locale_t>(nullptr)) return false;
  const std::string copy(text);
  char* end = nullptr;
  T value;
  if constexpr (std::is_same_v<T, float>) {
    value = ::strtof_l(copy.c_str(), &end, c_locale);
  } else {
    value = ::strtod_l(copy.c_str(), &end, c_locale);
  }
  if (end != copy.c_str() + copy.size() || !std::isfinite(value) || std::fabs(value) >= T{1}) {
    return false;
  }
  *out = value;
  return true;
}

}  // namespace detail

// Finite floats only ("nan", "inf" and overflow are rejected; a value under the smallest float,
// 1e-50, is that float's nearest: 0).
inline bool parse_float(std::string_view text, float* out) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size()) {
    return detail::below_range(text, out);
  }
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(*out);
}

// The same in double (a dense value that a transform reads as PaddleRec's readers do: Python's
// float() of the text).
inline bool parse_double(std::string_view text, double* out) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size()) {
    return detail::below_range(text, out);
  }
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(*out);
}

// Appends the shortest text that parses back to exactly `value`.
inline void append_float(std::string* out, float value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, end);
}

inline void append_u64(std::string* out, std::uint64_t value) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, end);
}

}  // namespace gpubox::dataset
