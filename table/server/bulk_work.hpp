// Internal to gpubox_server_lib: the server's long table calls (SAVE, LOAD, SHRINK) and how they
// show progress. Such a call runs on the BulkWorker, off the network threads, so that the session
// waiting for it keeps its strand free to send PROGRESS frames (protocol.hpp); a SAVE or LOAD
// reaches the files through an io::ProgressEnv (table/io/progress_env.hpp), which counts every file
// operation it finishes (and every step the table reports between them, FileEnv::note_progress)
// in the worker's io::FileWorkProgress, which knows whether one is under way; a SHRINK counts each
// step the table reports (a shard done, a chunk of rows aged: HostTier::shrink,
// FileWorkProgress::step). A client bounds the call by the time without PROGRESS frames, so they
// are sent only while the worker moves (FileWorkProgress::moved, bounded by --max_io_stall_s): a
// call stuck outside its file operations (a deadlock, a stopped process) sends none and is
// reported by its client within its bound, while one that writes gigabytes, or waits on the disk
// in a long fsync, is never cut. A call queued behind another reports the worker's progress too; a
// SAVE retried on a new connection while the first is queued or running waits for the first's reply
// (BulkWorker::submit), it never runs twice.
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
#include "table/io/progress_env.hpp"
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

// What a PROGRESS frame tells of the worker's calls so far: their file operations and steps
// (the worker's io::FileWorkProgress).
inline ProgressNote progress_note(const io::FileWorkProgress& progress) {
  return ProgressNote{progress.ops(), progress.bytes()};
}

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
  // Where the jobs count their file operations (through an io::ProgressEnv) and steps.
  io::FileWorkProgress& progress() { return progress_; }
  // Jobs queued, run, dropped unrun (abandoned), requests refused busy, and requests that waited
  // for the same request's job, so far.
  uint64_t queued() const { return queued_.load(std::memory_order_relaxed); }
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
  io::FileWorkProgress progress_;
  std::atomic<uint64_t> queued_{0};
  std::atomic<uint64_t> runs_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> attached_{0};
};

}  // namespace gpubox::table::server
