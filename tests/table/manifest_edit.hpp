// Edits a save's MANIFEST the way a hand or a damaged writer would, but with a valid checksum, so
// that what a test checks is how the property's value is read.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::testing {

// Sets property `key` of the MANIFEST at `path` to `value`; returns whether it had the key.
inline bool set_manifest_property(const std::string& path, const std::string& key,
                                  const std::string& value) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  auto manifest = table::io::Manifest::parse(text.str(), path);
  throw_if_error(manifest.status());
  const bool had = manifest->properties.count(key) > 0;
  manifest->properties[key] = value;
  std::ofstream(path, std::ios::trunc) << manifest->encode();
  return had;
}

}  // namespace gpubox::testing
