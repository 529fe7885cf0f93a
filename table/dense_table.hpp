// DenseTable: named dense parameter blocks (a layer's weights, a bias) with their optimizer
// state (named state blocks: "moment1", "moment2", "g2sum", ...), saved and loaded as a unit.
// Trainers keep their dense parameters on the cards; this is where they are saved, and where a
// trainer that starts late fetches them. Thread-safe: one mutex guards the blocks.
//
// Save folder: `blocks` (binary, little-endian: per block its name, values and state blocks,
// each a uint32 length-prefixed string or a uint64 count-prefixed float array) plus a MANIFEST
// with its size and checksum (table/io/save_dir.hpp), written atomically like sparse saves.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/io/file_env.hpp"

namespace gpubox::table {

struct DenseBlock {
  std::vector<float> values;
  std::map<std::string, std::vector<float>> state;  // optimizer state by name

  bool operator==(const DenseBlock& o) const { return values == o.values && state == o.state; }
};

class DenseTable {
 public:
  // `env` = file system for save/load (nullptr: POSIX); borrowed.
  explicit DenseTable(io::FileEnv* env = nullptr)
      : env_(env != nullptr ? env : io::FileEnv::posix()) {}

  // Adds or replaces block `name`.
  void put(const std::string& name, DenseBlock block);
  std::optional<DenseBlock> get(const std::string& name) const;
  bool erase(const std::string& name);
  std::vector<std::string> names() const;
  std::size_t size() const;

  Status save(const std::string& path) const;
  // Replaces every block with the save's, or leaves the table as it was on error.
  Status load(const std::string& path);

 private:
  io::FileEnv* env_;
  mutable Mutex mu_;
  std::map<std::string, DenseBlock> blocks_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::table
