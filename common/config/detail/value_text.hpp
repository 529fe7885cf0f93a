// A config value as a config writes it (ConfigDocument::value_text; the builder's messages).
// Private to common/config.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config/config_keys.hpp"

namespace gpubox::config::detail {

struct ValueText {
  std::string operator()(bool v) const { return v ? "true" : "false"; }
  std::string operator()(int64_t v) const { return std::to_string(v); }
  std::string operator()(uint64_t v) const { return std::to_string(v); }
  std::string operator()(double v) const {
    // The shortest text that reads back as the same double.
    char buf[32];
    for (int digits = 6; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
      if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
  }
  std::string operator()(const std::string& v) const { return v; }
  std::string operator()(const IntMap& items) const {
    std::string out = "{";
    for (const auto& [name, value] : items) {
      out += (out.size() > 1 ? ", " : "") + name + ": " + std::to_string(value);
    }
    return out + "}";
  }
  template <class T>
  std::string operator()(const std::vector<T>& items) const {
    std::string out = "[";
    for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + (*this)(items[i]);
    return out + "]";
  }
};

}  // namespace gpubox::config::detail
