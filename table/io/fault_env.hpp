// A FileEnv that fails on purpose, for tests of interrupted saves. Every mutating operation
// (create, append, sync, close, create_dir, remove, rename, exchange, sync_dir) counts as one
// step; from step `fail_from` on, every mutating step fails with IOError, like a disk that
// filled up or a process that died there. Reads never fail; they and note_progress are forwarded
// (ForwardingEnv).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

#include "table/io/forwarding_env.hpp"

namespace gpubox::table::io {

class FaultInjectingEnv final : public ForwardingEnv {
 public:
  // `base` is borrowed and must outlive this env. With `real_syncs` false, file and folder
  // syncs still count as steps but skip the fsync (tests that take hundreds of saves).
  explicit FaultInjectingEnv(FileEnv* base, bool real_syncs = true)
      : ForwardingEnv(base), real_syncs_(real_syncs) {}
  bool real_syncs() const { return real_syncs_; }

  // Steps 0..fail_from-1 succeed, later ones fail. kNever turns faults off.
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  void fail_from(int64_t step) { fail_from_.store(step); }
  // Mutating steps seen so far (attempted, failed ones included); reset to 0 by reset_steps.
  int64_t steps() const { return steps_.load(); }
  void reset_steps() { steps_.store(0); }

  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) override;
  StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                            uint64_t max_bytes) override {
    sequential_opens_.fetch_add(1);
    return ForwardingEnv::open_sequential(path, max_bytes);
  }
  // Files opened for streamed reading so far (a load's part files, once per read of each).
  int64_t sequential_opens() const { return sequential_opens_.load(); }
  Status create_dir(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status exchange(const std::string& a, const std::string& b) override;
  Status sync_dir(const std::string& path) override;

  // Counts one step; returns the injected failure when this step must fail.
  Status step(const char* what, const std::string& path);

 private:
  const bool real_syncs_;
  std::atomic<int64_t> fail_from_{kNever};
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> sequential_opens_{0};
};

}  // namespace gpubox::table::io
