// CallQueue: one thread that runs the server calls a PS training thread hands it, in the order
// given, so that the training thread computes while they travel (the async mode's pulls and
// pushes of sparse rows and its dense exchange, ps_worker.hpp). What Paddle's async Communicator
// does with its send queue and threads, bounded the same way: at most `capacity` calls wait or
// run at once, and a submit beyond that waits for the oldest.
//
// The first call that fails (a Status, or an exception, which becomes an Internal status naming
// it) stops the queue: the calls after it are not run, so no update is applied out of order
// behind a lost one, and waiting for any of them returns that first failure. The thread is
// made at the first submit and kept (a thread per call cost a thread start and its shared state
// every step).
//
// Thread-safety: submit(), wait() and drain() from one thread (the owner); cancel() from the
// owner, or from any thread once the owner stopped submitting, never from a queued call (it would
// wait for itself forever); the calls run on the queue's own thread. Whatever a call uses must
// outlive its wait (or the queue).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::trainer::ps_modes {

class CallQueue {
 public:
  // A call: a small callable (a pointer and an index are stored without an allocation).
  using Call = std::function<Status()>;

  // At most `capacity` (>= 1) calls submitted and not yet finished.
  explicit CallQueue(std::size_t capacity);
  // Runs the calls still queued (each, unless an earlier one failed or cancel() came), then ends
  // the thread; the failure, if any, is dropped: an owner that must report it calls drain()
  // first.
  ~CallQueue();
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  // Queues `call` behind the others (waiting for the oldest to finish when `capacity` are
  // queued); returns its ticket, counted from 0 in submit order.
  uint64_t submit(Call call) GPUBOX_EXCLUDES(mu_);
  // Waits until call `ticket` finished or was skipped: OK when it and every call before it
  // succeeded, else the first failure.
  Status wait(uint64_t ticket) GPUBOX_EXCLUDES(mu_);
  // Waits for every call submitted so far; as wait() of the last one (OK when none).
  Status drain() GPUBOX_EXCLUDES(mu_);
  // Skips every call not yet started (as the calls behind a failure are: waiting for one
  // returns Aborted, or the failure before it) and waits for the one under way, if any: once it
  // returns, nothing submitted so far runs any more. A call submitted after it is skipped too.
  void cancel() GPUBOX_EXCLUDES(mu_);
  // Calls submitted and not yet finished (the owner's view, exact between its own calls).
  std::size_t pending() const GPUBOX_EXCLUDES(mu_);

 private:
  void run() GPUBOX_EXCLUDES(mu_);
  // Status of `ticket` once finished (mu_ held).
  Status result_of(uint64_t ticket) const GPUBOX_REQUIRES(mu_);

  const std::size_t capacity_;
  mutable Mutex mu_;
  CondVar changed_;
  std::vector<Call> ring_ GPUBOX_GUARDED_BY(mu_);  // call t at t % capacity_
  uint64_t submitted_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t finished_ GPUBOX_GUARDED_BY(mu_) = 0;  // calls run or skipped, in order
  bool running_ GPUBOX_GUARDED_BY(mu_) = false;   // call finished_ runs (mu_ released)
  bool failed_ GPUBOX_GUARDED_BY(mu_) = false;
  uint64_t failed_ticket_ GPUBOX_GUARDED_BY(mu_) = 0;
  Status failure_ GPUBOX_GUARDED_BY(mu_);
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first submit()
};

}  // namespace gpubox::trainer::ps_modes
