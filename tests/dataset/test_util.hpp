// Helpers for the dataset tests: a scratch folder removed at the end, small files, configs.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"

namespace gpubox::dataset::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/gpubox_dataset_test_XXXXXX";
    path_ = ::mkdtemp(pattern.data()) ? pattern : std::string();
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Writes `text` as is (no newline added) and returns the path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = file(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::string path_;
};

// Slot-format config with slots "1".."slots" and `dense` dense values.
inline DatasetConfig slot_config(int slots, int dense) {
  DatasetConfig c;
  c.data_format = DataFormat::kSlot;
  c.dense_dim = dense;
  for (int s = 1; s <= slots; ++s) c.slots.push_back(std::to_string(s));
  return c;
}

// An instance as plain values, comparable and sortable (the test oracle's record).
struct PlainInstance {
  float label = 0;
  std::vector<float> dense;
  std::vector<std::vector<std::uint64_t>> slots;
  bool operator<(const PlainInstance& o) const {
    return std::tie(label, dense, slots) < std::tie(o.label, o.dense, o.slots);
  }
  bool operator==(const PlainInstance& o) const {
    return label == o.label && dense == o.dense && slots == o.slots;
  }
};

inline PlainInstance to_plain(const InstanceRef& r) {
  PlainInstance p;
  p.label = r.label;
  p.dense.assign(r.dense, r.dense + r.dense_dim);
  const std::uint64_t* key = r.keys;
  for (int s = 0; s < r.num_slots; ++s) {
    p.slots.emplace_back(key, key + r.slot_sizes[s]);
    key += r.slot_sizes[s];
  }
  return p;
}

}  // namespace gpubox::dataset::testing
