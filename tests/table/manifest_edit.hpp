// Edits a save's MANIFEST the way a hand or a damaged writer would, but with a valid checksum, so
// that what a test checks is how the property's value is read.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::testing {

// Rewrites the MANIFEST at `path` after `edit` changed its properties; returns whether it had
// property `key` before.
template <class Edit>
bool edit_manifest_properties(const std::string& path, const std::string& key, Edit edit) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  auto manifest = table::io::Manifest::parse(text.str(), path);
  throw_if_error(manifest.status());
  const bool had = manifest->properties.count(key) > 0;
  edit(manifest->properties);
  std::ofstream(path, std::ios::trunc) << manifest->encode();
  return had;
}

// Sets property `key` of the MANIFEST at `path` to `value`; returns whether it had the key.
inline bool set_manifest_property(const std::string& path, const std::string& key,
                                  const std::string& value) {
  return edit_manifest_properties(path, key, [&](auto& properties) { properties[key] = value; });
}

// Removes property `key` (a MANIFEST written before the key existed); returns whether it had it.
inline bool erase_manifest_property(const std::string& path, const std::string& key) {
  return edit_manifest_properties(path, key, [&](auto& properties) { properties.erase(key); });
}

}  // namespace gpubox::testing
