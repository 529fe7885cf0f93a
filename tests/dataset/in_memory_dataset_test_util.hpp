// The text sets InMemoryDataset's tests load (in_memory_dataset_test.cpp and
// in_memory_dataset_order_test.cpp): random slot-format lines with what they should parse to and
// the bad lines they hold.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset::text_sets {

using testing::PlainInstance;
using testing::ScratchDir;
using testing::slot_config;
using testing::to_plain;

constexpr int kSlots = 4;
constexpr int kDense = 2;

// Random slot-format text: what it should parse to, and the bad lines it holds.
struct TextSet {
  std::vector<std::string> files;
  std::vector<PlainInstance> instances;  // in file order
  std::map<ParseReason, std::uint64_t> bad;
  std::vector<std::pair<std::string, std::uint64_t>> bad_lines;  // (file, line)
};

inline std::string line_of(const PlainInstance& p) {
  std::string line = p.label > 0.5f ? "click:1" : "click:0";
  for (float v : p.dense) line += " dense_feature:" + std::to_string(v);
  // Slots written in a scrambled order: the parser groups them.
  for (int s = kSlots - 1; s >= 0; --s) {
    for (std::uint64_t k : p.slots[s])
      line += " " + std::to_string(s + 1) + ":" + std::to_string(k);
  }
  return line;
}

inline TextSet make_text(const ScratchDir& dir, int files, int lines_per_file, double bad_rate,
                         std::uint64_t seed, std::uint64_t key_range = 1000) {
  std::mt19937_64 rng(seed);
  TextSet set;
  for (int f = 0; f < files; ++f) {
    std::string text;
    const std::string path = dir.file("part-" + std::to_string(f));
    for (int i = 0; i < lines_per_file; ++i) {
      const std::uint64_t line_no = static_cast<std::uint64_t>(i) + 1;
      if (std::uniform_real_distribution<>(0, 1)(rng) < bad_rate) {
        const bool bad_key = rng() % 2;
        text += bad_key ? "click:1 dense_feature:1 dense_feature:2 1:x\n" : "click:7 1:5\n";
        ++set.bad[bad_key ? ParseReason::kBadKey : ParseReason::kBadLabel];
        set.bad_lines.emplace_back(path, line_no);
        continue;
      }
      if (rng() % 10 == 0) {
        text += (rng() % 2) ? "\n" : "  \r\n";
        continue;
      }
      PlainInstance p;
      p.label = static_cast<float>(rng() % 2);
      for (int j = 0; j < kDense; ++j)
        p.dense.push_back(std::stof(std::to_string((rng() % 1000) / 7.0f)));
      p.slots.resize(kSlots);
      for (int s = 0; s < kSlots; ++s) {
        const int n = static_cast<int>(rng() % 4);  // 0..3 values, multi-valued slots
        for (int k = 0; k < n; ++k) p.slots[s].push_back(1 + rng() % key_range);
      }
      text += line_of(p) + ((rng() % 5 == 0) ? "\r\n" : "\n");
      set.instances.push_back(p);
    }
    std::ofstream(path, std::ios::binary) << text;
    set.files.push_back(path);
  }
  return set;
}

inline std::vector<PlainInstance> contents(const InMemoryDataset& ds) {
  std::vector<PlainInstance> out;
  for (std::size_t i = 0; i < ds.size(); ++i) out.push_back(to_plain(ds.instance(i)));
  return out;
}

inline DatasetConfig config(int threads = 1) {
  DatasetConfig c = slot_config(kSlots, kDense);
  c.thread_num = threads;
  return c;
}

// Writes n single-key instances whose key is their index + 1.
inline std::vector<std::string> indexed_files(const ScratchDir& dir, std::size_t n) {
  std::string text;
  for (std::size_t i = 0; i < n; ++i) {
    text += "click:" + std::to_string(i % 2) + " dense_feature:" + std::to_string(i) +
            " dense_feature:0 1:" + std::to_string(i + 1) + " 3:" + std::to_string(i + 1) +
            " 3:7\n";
  }
  return {dir.write("idx-" + std::to_string(n), text)};
}

}  // namespace gpubox::dataset::text_sets
