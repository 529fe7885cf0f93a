// How long file work shows that it moves, for whoever waits on it by its progress rather than its
// total time: gpubox_server's SAVE and LOAD (its BulkWorker; the client bounds a call by the time
// without PROGRESS frames, table/server/bulk_work.hpp) and trainer 0's own writes of a save (the
// dense half and the model manifest on its local disk; the other trainers bound its part by the
// time without a move, trainer/schedule/trainer_zero_work.hpp). A ProgressEnv passes every file
// operation to a ProgressSink as it begins and ends (and every step the caller reports between
// them, FileEnv::note_progress); FileWorkProgress is the sink that counts them and tells whether
// the work moved: an operation finished, or one is under way (the kernel works on it: a long
// fsync, a slow append) and has not been for longer than a bound (a hung mount is no progress).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"
#include "table/io/forwarding_env.hpp"

namespace gpubox::table::io {

// Where a ProgressEnv reports. Implementations are thread-safe (several shards save at once).
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // A file operation (`what` on `path`, e.g. "fsync of" "/data/s/dense/x") runs from begin_io()
  // to end_io(the bytes it moved); operations may overlap (several threads).
  virtual void begin_io(const char* what, const std::string& path) = 0;
  virtual void end_io(uint64_t bytes) = 0;
  // A step between file operations (FileEnv::note_progress: rows encoded, read from disk), or of
  // other work the sink's owner counts (a SHRINK's shard done).
  virtual void step() = 0;
};

// The sink that counts: operations and steps finished, bytes moved, operations under way, and
// when any of them last began or ended. Thread-safe: the counts are written with release and read
// with acquire, so a reader that sees a count also sees what the work wrote before it.
class FileWorkProgress final : public ProgressSink {
 public:
  using Clock = std::chrono::steady_clock;

  void begin_io(const char* what, const std::string& path) override;
  void end_io(uint64_t bytes) override;
  void step() override;

  // File operations and steps finished so far; bytes the operations moved.
  uint64_t ops() const { return ops_.load(std::memory_order_acquire); }
  uint64_t bytes() const { return bytes_.load(std::memory_order_acquire); }

  // Whether the work moved since the caller last looked (*seen_ops: the ops() it saw then,
  // updated): an operation or a step finished since, or an operation is under way and one began
  // or ended less than `max_stall` before `now`. An operation under way for longer with nothing
  // else moving (a dead mount) is no progress: the first time one is found so, *stalled (when
  // given) names it ("fsync of PATH"; once per stall, for the log: a later move starts a new one).
  bool moved(uint64_t* seen_ops, Clock::time_point now, Clock::duration max_stall,
             std::string* stalled = nullptr);

 private:
  void changed();

  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> in_io_{0};
  std::atomic<Clock::rep> last_change_{0};  // steady-clock ticks of the last begin, end or step
  std::atomic<bool> stall_told_{false};
  Mutex mu_;
  std::string current_op_ GPUBOX_GUARDED_BY(mu_);  // the last file operation begun
};

// `base` with every file operation reported to `sink` as it begins and ends (both borrowed; they
// must outlive the env and the files it opened). An append longer than kChunkBytes is passed on
// in chunks of that size, each an operation, so that a long write shows moves as it goes.
// Thread-safe as `base` is.
class ProgressEnv final : public ForwardingEnv {
 public:
  static constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

  ProgressEnv(FileEnv* base, ProgressSink* sink);

  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) override;
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override;
  StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                            uint64_t max_bytes) override;
  Status create_dir(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status exchange(const std::string& a, const std::string& b) override;
  Status sync_dir(const std::string& path) override;
  bool exists(const std::string& path) override;
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override;
  void note_progress() override;

 private:
  ProgressSink* const sink_;
};

}  // namespace gpubox::table::io
