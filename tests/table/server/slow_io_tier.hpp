// A host tier whose SAVE and LOAD are slow or stuck on purpose (issue 32's tests of saves and
// loads longer than the client's bound). Every file operation of its saves and loads waits in
// the tier first: `delay` (one operation at a time, so a call of n operations takes at least n
// times it), and from operation `hold_at` on (when set) either until release() (a call that
// stops moving, as a server stuck outside its file operations, or stopped) or, kept moving,
// checking a path through the env every 50 ms until release() (a call that moves for as long
// as the test wants). The waits come before the operation reaches the env the server passed (its
// progress-counting env), as a slow table's own work would.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "table/io/forwarding_env.hpp"
#include "tests/table/forwarding_host_tier.hpp"

namespace gpubox::table::server::testing {

class SlowIoTier final : public table::testing::ForwardingHostTier {
 public:
  enum class Hold { kStopped, kMoving };

  SlowIoTier(HostTier& inner, std::chrono::milliseconds delay)
      : ForwardingHostTier(inner), delay_(delay) {}
  ~SlowIoTier() override { release(); }

  // Operations from the `at`-th (counted from 0 over the tier's life) on are held, `how`.
  void hold_at(int64_t at, Hold how) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_at_ = at;
    hold_ = how;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    released_cv_.notify_all();
  }
  // After a release(): the next operation on is held again, `how`.
  void hold_again(Hold how) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_at_ = ops_;
    hold_ = how;
    released_ = false;
  }
  // File operations of saves and loads so far; whether one is held now.
  int64_t ops() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_;
  }
  bool holding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return holding_;
  }

  // The env a save or load goes through over `server_env` (for the test of its waits).
  std::unique_ptr<io::FileEnv> slowed(io::FileEnv* server_env) {
    return std::make_unique<SlowEnv>(server_env, this);
  }

  using HostTier::load;
  using HostTier::save;
  Status save(const std::string& path, SaveKind mode, io::FileEnv* env) override {
    SlowEnv slow(env != nullptr ? env : io::FileEnv::posix(), this);
    return inner().save(path, mode, &slow);
  }
  Status load(const std::string& path, io::FileEnv* env) override {
    SlowEnv slow(env != nullptr ? env : io::FileEnv::posix(), this);
    return inner().load(path, &slow);
  }

 private:
  // Before each file operation through `env` (on `path`).
  void wait_turn(io::FileEnv* env, const std::string& path) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t op = ops_++;
    std::this_thread::sleep_for(delay_);  // under the lock: the operations take turns
    if (hold_at_ < 0 || op < hold_at_ || released_) return;
    holding_ = true;
    while (!released_) {
      if (hold_ == Hold::kStopped) {
        released_cv_.wait(lock);
        continue;
      }
      lock.unlock();
      (void)env->exists(path);  // a finished operation: the server sees the call move
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      lock.lock();
    }
    holding_ = false;
  }

  class SlowFile;
  class SlowReader;
  // Each file operation waits its turn in `tier`, then goes on to the env the server passed (the
  // inner env, borrowed; a held operation checks a path through it, so that the server sees the
  // call move); note_progress goes on at once (ForwardingEnv).
  class SlowEnv final : public io::ForwardingEnv {
   public:
    SlowEnv(io::FileEnv* server_env, SlowIoTier* tier)
        : io::ForwardingEnv(server_env), tier_(tier) {}
    StatusOr<std::unique_ptr<io::WritableFile>> new_writable_file(
        const std::string& path) override {
      take_turn(path);
      auto file = ForwardingEnv::new_writable_file(path);
      if (!file.ok()) return file.status();
      return std::unique_ptr<io::WritableFile>(
          std::make_unique<SlowFile>(std::move(*file), ForwardingEnv::inner(), tier_, path));
    }
    StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override {
      take_turn(path);
      return ForwardingEnv::read_file(path, max_bytes);
    }
    StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                  uint64_t max_bytes) override {
      take_turn(path);
      auto file = ForwardingEnv::open_sequential(path, max_bytes);
      if (!file.ok()) return file.status();
      return std::unique_ptr<io::SequentialFile>(
          std::make_unique<SlowReader>(std::move(*file), ForwardingEnv::inner(), tier_, path));
    }
    Status create_dir(const std::string& path) override {
      take_turn(path);
      return ForwardingEnv::create_dir(path);
    }
    Status remove_all(const std::string& path) override {
      take_turn(path);
      return ForwardingEnv::remove_all(path);
    }
    Status rename(const std::string& from, const std::string& to) override {
      take_turn(from);
      return ForwardingEnv::rename(from, to);
    }
    Status exchange(const std::string& a, const std::string& b) override {
      take_turn(a);
      return ForwardingEnv::exchange(a, b);
    }
    Status sync_dir(const std::string& path) override {
      take_turn(path);
      return ForwardingEnv::sync_dir(path);
    }
    bool exists(const std::string& path) override {
      take_turn(path);
      return ForwardingEnv::exists(path);
    }
    StatusOr<std::vector<std::string>> list_dir(const std::string& path) override {
      take_turn(path);
      return ForwardingEnv::list_dir(path);
    }

   private:
    void take_turn(const std::string& path) { tier_->wait_turn(ForwardingEnv::inner(), path); }

    SlowIoTier* tier_;
  };

  // A file being written whose appends and syncs wait their turn too.
  class SlowFile final : public io::WritableFile {
   public:
    SlowFile(std::unique_ptr<io::WritableFile> base, io::FileEnv* env, SlowIoTier* tier,
             std::string path)
        : base_(std::move(base)), env_(env), tier_(tier), path_(std::move(path)) {}
    Status append(const void* data, std::size_t size) override {
      tier_->wait_turn(env_, path_);
      return base_->append(data, size);
    }
    Status sync() override {
      tier_->wait_turn(env_, path_);
      return base_->sync();
    }
    Status close() override { return base_->close(); }

   private:
    std::unique_ptr<io::WritableFile> base_;
    io::FileEnv* env_;
    SlowIoTier* tier_;
    std::string path_;
  };

  // A file being read whose reads wait their turn too.
  class SlowReader final : public io::SequentialFile {
   public:
    SlowReader(std::unique_ptr<io::SequentialFile> base, io::FileEnv* env, SlowIoTier* tier,
               std::string path)
        : base_(std::move(base)), env_(env), tier_(tier), path_(std::move(path)) {}
    StatusOr<std::size_t> read(void* buf, std::size_t n) override {
      tier_->wait_turn(env_, path_);
      return base_->read(buf, n);
    }
    uint64_t size() const override { return base_->size(); }

   private:
    std::unique_ptr<io::SequentialFile> base_;
    io::FileEnv* env_;
    SlowIoTier* tier_;
    std::string path_;
  };

  const std::chrono::milliseconds delay_;
  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  int64_t ops_ = 0;
  int64_t hold_at_ = -1;
  Hold hold_ = Hold::kStopped;
  bool released_ = false;
  bool holding_ = false;
};

}  // namespace gpubox::table::server::testing
