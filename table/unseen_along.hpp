// A load's reader of a part file's unseen days (sparse_table_io.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/io/file_env.hpp"
#include "table/io/save_dir.hpp"
#include "table/row_codec.hpp"

namespace gpubox::table {

// A part file's unseen days, read from its unseen-<shard> (the same rows in the same order) a
// chunk at a time as the part's records come, so that a load writes each row once, its days
// with it: set afterwards, a row the load had sent to disk would be read back and written again.
// Both passes of a load read it along (the first verifies the pairing before the table changes).
// Thread-safety: one owner (the thread loading its part file); not shared.
class UnseenAlong {
 public:
  // `entry`: the unseen file's MANIFEST entry (borrowed); `file`: its path, for messages.
  UnseenAlong(const io::ManifestFile& entry, SaveForm form, std::string file);
  // Opens `<path>/<entry.name>`, to read `chunk_bytes` at a time.
  Status open(io::FileEnv* fs, const std::string& path, std::size_t chunk_bytes);
  // The days of the next keys.size() records, which must hold those keys in that order
  // (Corruption naming the file otherwise, or when it ends first).
  Status take(const std::vector<uint64_t>& keys, std::vector<float>* days);
  // The file's end: its size and checksum, and no record beyond its part file's.
  Status finish();

 private:
  io::ChunkConsumer consumer();

  const io::ManifestFile& entry_;
  const SaveForm form_;
  const std::string file_;
  RecordShape shape_;  // a key and one float
  std::unique_ptr<io::VerifiedChunkReader> reader_;
  RecordChunk at_;
  std::vector<uint64_t> keys_;  // read; from front_ on not yet taken
  std::vector<float> days_;
  std::size_t front_ = 0;
  uint64_t records_ = 0;
};

}  // namespace gpubox::table
