// What an InMemoryDataset loads, as plain values a test compares (the PaddleRec input and reader
// tests: paddlerec_input_test.cpp, paddlerec_readers_test.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "dataset/dataset_config.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset::testing {

// The load's status, its stats, and every instance loaded, in order.
struct Loaded {
  Status status;
  LoadStats stats;
  std::vector<PlainInstance> instances;
};

// `files` loaded into an InMemoryDataset made from `config`.
inline Loaded load(const DatasetConfig& config, const std::vector<std::string>& files) {
  InMemoryDataset ds(config);
  ds.set_filelist(files);
  Loaded out;
  out.status = ds.load_into_memory();
  out.stats = ds.load_stats();
  for (std::size_t i = 0; i < ds.size(); ++i) out.instances.push_back(to_plain(ds.instance(i)));
  return out;
}

}  // namespace gpubox::dataset::testing
