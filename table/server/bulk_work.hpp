// Internal to gpubox_server_lib: the server's long table calls (SAVE, LOAD, SHRINK) and how they
// show progress. Such a call runs on the BulkWorker, off the network threads, so that the session
// waiting for it keeps its strand free to send PROGRESS frames (protocol.hpp); a SAVE or LOAD
// reaches the files through a ProgressEnv, which counts every file operation it finishes (and every
// step the table reports between them, FileEnv::note_progress) and knows whether one is under way;
// a SHRINK counts each step the table reports (a shard done, a chunk of rows aged:
// HostTier::shrink, WorkProgress::step). A client bounds the call by the time without PROGRESS
// frames, so they are sent only while the worker moves (WorkProgress::moved): a call stuck outside
// its file operations (a deadlock, a stopped process) sends none and is reported by its client
// within its bound, while one that writes gigabytes, or waits on the disk in a long fsync, is never
// cut. A call queued behind another reports the worker's progress too; a SAVE retried on a new
// connection while the first is queued or running waits for the first's reply (BulkWorker::submit),
// it never runs twice.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.hpp"
#include "table/io/forwarding_env.hpp"
#include "table/server/protocol.hpp"

namespace gpubox::table::server {

// A reply on its way: the whole frame, and what to do once it is written.
struct Reply {
  std::vector<uint8_t> frame;
  Status::Code status = Status::Code::kOk;
  std::string error;  // an error reply's message (error_reply), for the server's own log
  bool close_after = false;
  bool stop_server_after = false;
};

// What the worker's calls did so far. Thread-safe (the calls' threads count, sessions read).
class WorkProgress {
 public:
  using Clock = std::chrono::steady_clock;

  // A file operation of the call (`what` on `path`) runs from begin_io() to end_io(bytes it
  // moved).
  void begin_io(const char* what, const std::string& path) {
    {
      MutexLock lock(mu_);
      current_op_ = std::string(what) + " " + path;
    }
    changed();
    in_io_.fetch_add(1, std::memory_order_relaxed);
  }
  void end_io(uint64_t bytes) {
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    ops_.fetch_add(1, std::memory_order_release);
    in_io_.fetch_sub(1, std::memory_order_relaxed);
    changed();
  }
  // A step between file operations (FileEnv::note_progress: rows encoded, read from disk), or of
  // a SHRINK (a shard done, a chunk of rows aged).
  void step() {
    ops_.fetch_add(1, std::memory_order_release);
    changed();
  }
  ProgressNote note() const {
    return ProgressNote{ops_.load(std::memory_order_acquire),
                        bytes_.load(std::memory_order_relaxed)};
  }
  // Whether the worker moved since the caller last looked (*seen_ops: the count it saw then,
  // updated): a file operation or a step finished since, or a file operation is under way (the
  // kernel works on it) and began, or the last one finished, less than `max_stall` before
  // `now`: a file operation hung for longer (a dead mount) is no progress. The first time one
  // is found hung for longer, *stalled (when given) names it (for the log: once per stall).
  bool moved(uint64_t* seen_ops, Clock::time_point now, Clock::duration max_stall,
             std::string* stalled = nullptr) {
    const uint64_t ops = ops_.load(std::memory_order_acquire);
    bool any = ops != *seen_ops;
    *seen_ops = ops;
    if (any || in_io_.load(std::memory_order_relaxed) <= 0) return any;
    const Clock::time_point last(Clock::duration(last_change_.load(std::memory_order_relaxed)));
    if (now - last < max_stall) return true;
    if (stalled != nullptr && !stall_told_.exchange(true, std::memory_order_relaxed)) {
      MutexLock lock(mu_);
      *stalled = current_op_;
    }
    return false;
  }

 private:
  void changed() {
    last_change_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    stall_told_.store(false, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> in_io_{0};
  std::atomic<Clock::rep> last_change_{0};  // steady-clock ticks of the last begin, end or step
  std::atomic<bool> stall_told_{false};
  Mutex mu_;
  std::string current_op_ GPUBOX_GUARDED_BY(mu_);  // the last file operation begun
};

// `base` with every operation counted in `progress` (both borrowed; they must outlive the env and
// the files it opened). Thread-safe as `base` is.
class ProgressEnv final : public io::ForwardingEnv {
 public:
  ProgressEnv(io::FileEnv* base, WorkProgress* progress)
      : io::ForwardingEnv(base), progress_(progress) {}

  StatusOr<std::unique_ptr<io::WritableFile>> new_writable_file(const std::string& path) override;
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override;
  StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                uint64_t max_bytes) override;
  Status create_dir(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status exchange(const std::string& a, const std::string& b) override;
  Status sync_dir(const std::string& path) override;
  bool exists(const std::string& path) override;
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override;
  void note_progress() override {
    progress_->step();
    ForwardingEnv::note_progress();
  }

 private:
  WorkProgress* progress_;
};

// Who waits for a SAVE, LOAD or SHRINK on the BulkWorker: the session that sent it, and any that
// sent the same request again (a retry on a new connection) while it was queued or running.
struct BulkWaiter {
  // Set when the session closed: it no longer wants the reply (a job none still wants, not
  // started yet, is dropped: a retry then runs as a new call).
  std::shared_ptr<std::atomic<bool>> abandoned;
  // Hands the reply to the session (posts it to its strand). Called on the worker thread.
  std::function<void(const Reply&)> deliver;
};

// One thread that runs the server's long table calls, one after the other in arrival order
// (the table serializes its saves and loads anyway; a SHRINK waits for them, and they for it).
// Bounded: at most kMaxJobs queued or running, and one per client id (a client's calls take turns
// in its own trainer); a request over that is refused "busy" (the client retries it). A request
// that is already queued or running (same client id, request id and op) is not queued again: its
// session waits for the same reply. Thread-safe.
class BulkWorker {
 public:
  static constexpr std::size_t kMaxJobs = 16;
  struct Key {
    uint64_t client_id = 0;
    uint64_t request_id = 0;
    Op op = Op::kSave;
    bool operator==(const Key& o) const {
      return client_id == o.client_id && request_id == o.request_id && op == o.op;
    }
  };
  enum class Admit { kQueued, kAttached, kBusy };

  BulkWorker() = default;
  ~BulkWorker() { stop(); }
  BulkWorker(const BulkWorker&) = delete;
  BulkWorker& operator=(const BulkWorker&) = delete;

  // Starts the worker thread (Server::start). Once. A thread that cannot be started (the
  // process or the machine out of threads: std::thread throws std::system_error) is an Internal
  // status naming the worker; the worker then refuses every call (submit: kBusy). `fault` (tests)
  // runs first, where the thread would start, and may throw std::system_error as std::thread
  // does.
  Status start(const std::function<void()>& fault = nullptr);
  // Queues `work` (its reply goes to `waiter`), attaches `waiter` to the same request already
  // queued or running, or refuses (kBusy: the caps above, or stopped). `work` must not throw
  // (the session's catches what the table throws).
  Admit submit(const Key& key, std::function<Reply()> work, BulkWaiter waiter);
  // A waiter's session closed (its `abandoned` set): queued jobs no waiter wants are dropped,
  // so that their slots are free at once.
  void abandoned();
  // Lets the job under way finish, drops (destroys) those queued, joins. Idempotent.
  void stop();
  // Where the jobs count their file operations (through a ProgressEnv).
  WorkProgress& progress() { return progress_; }
  // Jobs run, dropped unrun (abandoned), requests refused busy, and requests that waited for the
  // same request's job, so far.
  uint64_t runs() const { return runs_.load(std::memory_order_relaxed); }
  uint64_t skipped() const { return skipped_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint64_t attached() const { return attached_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    Key key;
    std::function<Reply()> work;
    std::vector<BulkWaiter> waiters;
    bool wanted() const;  // some waiter has not abandoned it
  };
  void run();

  Mutex mu_;
  CondVar wake_;
  std::deque<std::shared_ptr<Job>> jobs_ GPUBOX_GUARDED_BY(mu_);
  std::shared_ptr<Job> running_ GPUBOX_GUARDED_BY(mu_);
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_ GPUBOX_GUARDED_BY(mu_);  // started by start()
  WorkProgress progress_;
  std::atomic<uint64_t> runs_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> attached_{0};
};

}  // namespace gpubox::table::server
