// Data sets held in memory instead of files (the Python package's DataFrames and arrays):
// instances built by the caller, registered under a name "memory:<id>" that stands where a
// data folder or file name goes (runner.train_data_dir, test_data_dir, a file list).
// InMemoryDataset::load_into_memory takes a registered block as a file read whole, so training
// and evaluation see the same instances in the same order as from the equivalent text file.
//
// Thread-safety: every function may be called from any thread (one registry lock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataset/instance_block.hpp"

namespace gpubox::dataset {

struct MemorySource {
  std::shared_ptr<const InstanceBlock> block;
  uint64_t digest = 0;  // of its labels, dense values, keys and slot sizes (the job identity's)
  // The slots its keys are in, in order: the config's it was built under (a config whose slots
  // differ reads it as another data set: read_memory_sources refuses it).
  std::vector<std::string> slot_names;
};

// True when `name` is a memory source's name (registered or not).
bool is_memory_source(const std::string& name);
// Registers `block`, its keys in the slots `slot_names` (one per block slot), and returns its new
// name ("memory:<n>").
std::string register_memory_source(InstanceBlock block, std::vector<std::string> slot_names);
// Drops the name (a data set already loaded keeps the block: it shares it, immutable); while a
// run holds it (MemorySourcePins), when the last such run ends.
void unregister_memory_source(const std::string& name);

// Holds the in-memory data sets among `names` (a share: its whole set) registered while it
// lives: a run that reads them pass after pass is not cut short by a release meanwhile (a
// Python Dataset released during training failed the run at its next pass's read).
class MemorySourcePins {
 public:
  explicit MemorySourcePins(const std::vector<std::string>& names);
  ~MemorySourcePins();
  MemorySourcePins(const MemorySourcePins&) = delete;
  MemorySourcePins& operator=(const MemorySourcePins&) = delete;

 private:
  std::vector<std::string> pinned_;
};
// The source `name` names; throws gpubox::Error naming it when none is registered. A share's
// name (memory_source_share) gives that share's rows, with their own digest.
MemorySource find_memory_source(const std::string& name);
// The name of trainer `trainer_id`'s share (of `trainers`) of the source `name`: its rows split
// as trainer_file_share splits a file list (contiguous blocks in order, the first
// rows % trainers trainers one row more), so that each trainer of a job given the same data set
// trains its own part of it, as with files. Throws naming an id outside [0, trainers).
std::string memory_source_share(const std::string& name, int trainer_id, int trainers);

}  // namespace gpubox::dataset
