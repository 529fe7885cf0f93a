#include "table/disk_tier.hpp"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace gpubox::table {
namespace {

constexpr std::size_t kKeyBytes = 12;
// RocksDB's own floor for a memtable; the block cache gets at least as much.
constexpr std::size_t kMinMemtableBytes = 64 << 10;

void encode_key(uint32_t shard, uint64_t key, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(shard >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<char>(key >> (56 - 8 * i));
}

uint64_t decode_key(const char* in) {
  uint64_t key = 0;
  for (int i = 0; i < 8; ++i) key = (key << 8) | static_cast<unsigned char>(in[4 + i]);
  return key;
}

Status to_status(const rocksdb::Status& st, const std::string& what) {
  if (st.ok()) return Status::OK();
  return Status::IOError("rocksdb " + what + ": " + st.ToString());
}

// A name RocksDB gives a file of its database folder (db/filename.cc's kinds).
bool rocksdb_file_name(const std::string& name) {
  const auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  const auto ends = [&](const char* e) {
    const std::size_t n = std::strlen(e);
    return name.size() >= n && name.compare(name.size() - n, n, e) == 0;
  };
  return name == "CURRENT" || name == "IDENTITY" || name == "LOCK" || starts("LOG") ||
         starts("MANIFEST-") || starts("OPTIONS-") || ends(".sst") || ends(".log") ||
         ends(".blob") || ends(".dbtmp");
}

// "shard-<i>": a sharded server's disk tier folder under the config's rocksdb_path.
bool shard_folder_name(const std::string& name) {
  return name.size() > 6 && name.compare(0, 6, "shard-") == 0 &&
         name.find_first_not_of("0123456789", 6) == std::string::npos;
}

// The folder `path` is wiped at open (DestroyDB removes the files of RocksDB's names in it): an
// existing folder holding anything else, or whose CURRENT names no manifest, is not an earlier
// disk tier, and is refused untouched (a runner.rocksdb_path naming a user's or the data's folder
// lost its files of those names, and the rest was read as training data).
Status check_disk_tier_folder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::OK();
  if (!fs::is_directory(path, ec)) {
    return Status::InvalidArgument("disk tier folder '" + path + "' is not a folder");
  }
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    // Folders the wipe leaves alone: the disk tiers of a sharded server run's shards (their
    // <rocksdb_path>/shard-i, server_main.cpp), and a mount point's lost+found.
    if (entry.is_directory(ec) && (shard_folder_name(name) || name == "lost+found")) continue;
    bool ours = entry.is_regular_file(ec) && rocksdb_file_name(name);
    if (ours && name == "CURRENT") {
      std::ifstream in(entry.path());
      std::string line;
      std::getline(in, line);
      ours = line.rfind("MANIFEST-", 0) == 0;
    }
    if (!ours) {
      return Status::InvalidArgument(
          "disk tier folder '" + path + "' holds '" + name +
          "', which no disk tier writes: the folder is wiped when the tier opens, so it must be "
          "new, empty or an earlier disk tier's; name another folder");
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<DiskTier>> DiskTier::open(const std::string& path, int32_t stride,
                                                   std::size_t memory_bytes) {
  if (memory_bytes == 0) memory_bytes = kDefaultMemoryBytes;
  rocksdb::Options options;
  options.create_if_missing = true;
  options.compression = rocksdb::kNoCompression;  // float rows barely compress; save the CPU
  options.IncreaseParallelism(2);
  // A cache tier is written as fast as it is read (every row read back is deleted, every row
  // evicted is written), so RocksDB's memory goes to the write path: two memtables of 3/8 of
  // `memory_bytes` each (fewer, larger flushes: fewer files for a MultiGet to probe and less
  // compaction), the other 1/4 to the block cache. A memtable Bloom filter answers a lookup of
  // a key not in the memtable (most of a pass's new keys) without a skiplist search.
  options.write_buffer_size = std::max<std::size_t>(memory_bytes * 3 / 8, kMinMemtableBytes);
  options.max_write_buffer_number = 2;
  options.memtable_prefix_bloom_size_ratio = 0.05;
  options.memtable_whole_key_filtering = true;
  // L0 files may pile up a little further before writes slow down: eviction and read-back come in
  // bursts at pass boundaries, and a stall there is training time lost, while compaction catches
  // up during the next pass.
  options.level0_slowdown_writes_trigger = 32;
  options.level0_stop_writes_trigger = 48;
  options.target_file_size_base = std::max<uint64_t>(options.write_buffer_size, 8 << 20);
  options.max_bytes_for_level_base = 4 * options.target_file_size_base;
  options.level_compaction_dynamic_level_bytes = true;
  // A pass's new keys are looked up on disk before they are created: a Bloom filter (10 bits a
  // key, ~1% false positives) answers most of those misses without reading a data block.
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(std::max(memory_bytes / 4, kMinMemtableBytes));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Working storage only (the folder is wiped on open), so a fresh database each time.
  GPUBOX_RETURN_IF_ERROR(check_disk_tier_folder(path));
  // RocksDB makes the folder, not its parents (<rocksdb_path>/shard-i of a server of several
  // failed "No such file or directory" until <rocksdb_path> was made by hand).
  if (const std::filesystem::path parent = std::filesystem::path(path).parent_path();
      !parent.empty()) {
    std::error_code made;
    std::filesystem::create_directories(parent, made);  // a failure: RocksDB's open names it
  }
  rocksdb::Status destroyed = rocksdb::DestroyDB(path, options);
  if (!destroyed.ok() && !destroyed.IsNotFound() && !destroyed.IsIOError()) {
    return to_status(destroyed, "wipe " + path);
  }
  rocksdb::DB* db = nullptr;
  GPUBOX_RETURN_IF_ERROR(to_status(rocksdb::DB::Open(options, path, &db), "open " + path));
  return std::unique_ptr<DiskTier>(new DiskTier(path, stride, db));
}

DiskTier::~DiskTier() { delete db_; }

Status DiskTier::multi_get(uint32_t shard, const uint64_t* keys, std::size_t n, float* rows,
                           uint32_t* epochs, uint8_t* found) {
  if (n == 0) return Status::OK();
  std::vector<char> key_bytes(n * kKeyBytes);
  std::vector<rocksdb::Slice> slices(n);
  for (std::size_t i = 0; i < n; ++i) {
    encode_key(shard, keys[i], &key_bytes[i * kKeyBytes]);
    slices[i] = rocksdb::Slice(&key_bytes[i * kKeyBytes], kKeyBytes);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  // Keys in order (the table's misses are) spare MultiGet its own sort; the encoding is
  // big-endian, so key order is byte order.
  const bool sorted = std::is_sorted(keys, keys + n);
  rocksdb::ReadOptions read;
  read.verify_checksums = false;  // working storage of this process: no media to distrust
  db_->MultiGet(read, db_->DefaultColumnFamily(), n, slices.data(), values.data(), statuses.data(),
                sorted);
  const std::size_t row_bytes = sizeof(float) * stride_;
  for (std::size_t i = 0; i < n; ++i) {
    found[i] = 0;
    if (statuses[i].IsNotFound()) continue;
    GPUBOX_RETURN_IF_ERROR(to_status(statuses[i], "multi_get in " + path_));
    if (!row_fits(values[i].size())) {
      return Status::Corruption("rocksdb " + path_ + ": key " + std::to_string(keys[i]) + " has " +
                                std::to_string(values[i].size()) + " bytes, expected " +
                                std::to_string(sizeof(uint32_t) + row_bytes) + " at most");
    }
    std::memcpy(&epochs[i], values[i].data(), sizeof(uint32_t));
    copy_row(values[i].data(), values[i].size(), rows + i * stride_);
    found[i] = 1;
  }
  return Status::OK();
}

bool DiskTier::row_fits(std::size_t value_bytes) const {
  return value_bytes > sizeof(uint32_t) && (value_bytes - sizeof(uint32_t)) % sizeof(float) == 0 &&
         value_bytes <= sizeof(uint32_t) + sizeof(float) * static_cast<std::size_t>(stride_);
}

void DiskTier::copy_row(const char* value, std::size_t value_bytes, float* row) const {
  const std::size_t floats = (value_bytes - sizeof(uint32_t)) / sizeof(float);
  std::memcpy(row, value + sizeof(uint32_t), sizeof(float) * floats);
  std::fill(row + floats, row + stride_, 0.0f);
}

DiskTier::Batch::Batch() : batch_(new rocksdb::WriteBatch()) {}
DiskTier::Batch::~Batch() = default;

void DiskTier::Batch::put(uint32_t shard, uint64_t key, const float* row, uint32_t epoch,
                          int32_t stride) {
  char key_bytes[kKeyBytes];
  encode_key(shard, key, key_bytes);
  std::string value(sizeof(uint32_t) + sizeof(float) * stride, '\0');
  std::memcpy(value.data(), &epoch, sizeof(uint32_t));
  std::memcpy(value.data() + sizeof(uint32_t), row, sizeof(float) * stride);
  batch_->Put(rocksdb::Slice(key_bytes, kKeyBytes), value);
  ++traffic_.puts;
  traffic_.put_bytes += kKeyBytes + value.size();
}

void DiskTier::Batch::erase(uint32_t shard, uint64_t key) {
  char key_bytes[kKeyBytes];
  encode_key(shard, key, key_bytes);
  batch_->Delete(rocksdb::Slice(key_bytes, kKeyBytes));
  ++traffic_.deletes;
}

std::size_t DiskTier::Batch::count() const { return batch_->Count(); }
void DiskTier::Batch::clear() {
  batch_->Clear();
  traffic_ = Traffic{};
}

Status DiskTier::write(Batch& batch) {
  if (batch.count() == 0) return Status::OK();
  // Off (-1) stays off; else each write takes one of the allowed ones, atomically (shards write
  // at once), and the write that finds none left fails.
  int64_t before_fault = writes_before_fault_.load();
  while (before_fault > 0 &&
         !writes_before_fault_.compare_exchange_weak(before_fault, before_fault - 1)) {
  }
  if (before_fault == 0) {
    return Status::IOError("write to " + path_ + ": fault injected (fail_writes_after)");
  }
  rocksdb::WriteOptions options;
  // No write-ahead log: this folder is a cache wiped at every open, never recovered; the durable
  // copy of a model is its save (runner.model_save_path), which covers rows on disk too.
  options.disableWAL = true;
  GPUBOX_RETURN_IF_ERROR(to_status(db_->Write(options, batch.batch_.get()), "write to " + path_));
  puts_ += batch.traffic_.puts;
  deletes_ += batch.traffic_.deletes;
  put_bytes_ += batch.traffic_.put_bytes;
  return Status::OK();
}

Status DiskTier::scan(uint32_t shard,
                      const std::function<void(uint64_t, const float*, uint32_t)>& fn) {
  char lower[kKeyBytes], upper[kKeyBytes];
  encode_key(shard, 0, lower);
  encode_key(shard + 1, 0, upper);
  rocksdb::Slice upper_slice(upper, kKeyBytes);
  rocksdb::ReadOptions options;
  options.iterate_upper_bound = &upper_slice;
  options.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options));
  std::vector<float> row(stride_);
  for (it->Seek(rocksdb::Slice(lower, kKeyBytes)); it->Valid(); it->Next()) {
    const rocksdb::Slice value = it->value();
    const uint64_t key = decode_key(it->key().data());
    if (it->key().size() != kKeyBytes || !row_fits(value.size())) {
      return Status::Corruption("rocksdb " + path_ + ": malformed entry for key " +
                                std::to_string(key));
    }
    uint32_t epoch;
    std::memcpy(&epoch, value.data(), sizeof(uint32_t));
    copy_row(value.data(), value.size(), row.data());
    fn(key, row.data(), epoch);
  }
  return to_status(it->status(), "scan of " + path_);
}

Status DiskTier::clear_shard(uint32_t shard) {
  char lower[kKeyBytes], upper[kKeyBytes];
  encode_key(shard, 0, lower);
  encode_key(shard + 1, 0, upper);
  rocksdb::WriteOptions options;
  options.disableWAL = true;
  return to_status(
      db_->DeleteRange(options, db_->DefaultColumnFamily(), rocksdb::Slice(lower, kKeyBytes),
                       rocksdb::Slice(upper, kKeyBytes)),
      "clear shard " + std::to_string(shard) + " of " + path_);
}

}  // namespace gpubox::table
