// The disk tier: cold rows of every shard in one RocksDB database, keyed by (shard, key) in
// big-endian so that one shard's rows form one contiguous range. The value is the row's
// modification epoch (uint32) followed by the row's floats (its own width's, at most `stride`),
// bit-exact. Thread-safe as
// RocksDB is; the table calls it for shard s only under shard s's lock. A key in memory may keep
// a copy here (SparseShard): the memory row is the current one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.hpp"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace gpubox::table {

class DiskTier {
 public:
  // RocksDB's memory (memtables and block cache) when the caller plans none.
  static constexpr std::size_t kDefaultMemoryBytes = std::size_t{64} << 20;
  // Opens a fresh database at `path`, wiping what an earlier process left there. RocksDB's
  // memtables and block cache take about `memory_bytes` (0: kDefaultMemoryBytes); its Bloom
  // filters and block indexes (~1.5 bytes a row on disk) come on top.
  static StatusOr<std::unique_ptr<DiskTier>> open(const std::string& path, int32_t stride,
                                                  std::size_t memory_bytes = 0);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  int32_t stride() const { return stride_; }
  const std::string& path() const { return path_; }

  // For i < n: found[i] = 1 and rows[i*stride..], epochs[i] filled when (shard, keys[i]) is on
  // disk, else found[i] = 0. One MultiGet; ascending keys are read without a sort.
  Status multi_get(uint32_t shard, const uint64_t* keys, std::size_t n, float* rows,
                   uint32_t* epochs, uint8_t* found);

  // What write() has applied since open: rows put, keys deleted, and the bytes of the puts'
  // keys and values (before RocksDB's own flushes and compactions).
  struct Traffic {
    uint64_t puts = 0;
    uint64_t deletes = 0;
    uint64_t put_bytes = 0;
  };
  Traffic traffic() const { return {puts_.load(), deletes_.load(), put_bytes_.load()}; }

  // A set of puts and deletes applied atomically by write().
  class Batch {
   public:
    Batch();
    ~Batch();
    // Stores `stride` floats of `row` (the row's own width's).
    void put(uint32_t shard, uint64_t key, const float* row, uint32_t epoch, int32_t stride);
    void erase(uint32_t shard, uint64_t key);
    std::size_t count() const;
    void clear();

   private:
    friend class DiskTier;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
    Traffic traffic_;
  };
  Status write(Batch& batch);
  // Fault injection for tests: once `ok_writes` more non-empty write()s have succeeded, every
  // later one fails (IOError, nothing applied) until this is called again; -1 (the default):
  // never.
  void fail_writes_after(int64_t ok_writes) { writes_before_fault_.store(ok_writes); }

  // fn(key, row, epoch) for every row of `shard`, in key order. `row` is valid during the call.
  Status scan(uint32_t shard, const std::function<void(uint64_t, const float*, uint32_t)>& fn);
  // Deletes every row of `shard`.
  Status clear_shard(uint32_t shard);

 private:
  // A value (epoch, then a row of at most stride() floats: rows of a narrower width class are
  // stored at their own width) and its copy into `stride()` floats, zero-padded.
  bool row_fits(std::size_t value_bytes) const;
  void copy_row(const char* value, std::size_t value_bytes, float* row) const;

  DiskTier(std::string path, int32_t stride, rocksdb::DB* db)
      : path_(std::move(path)), stride_(stride), db_(db) {}
  std::string path_;
  int32_t stride_;
  rocksdb::DB* db_;  // owned
  std::atomic<uint64_t> puts_{0};
  std::atomic<uint64_t> deletes_{0};
  std::atomic<uint64_t> put_bytes_{0};
  std::atomic<int64_t> writes_before_fault_{-1};
};

}  // namespace gpubox::table
