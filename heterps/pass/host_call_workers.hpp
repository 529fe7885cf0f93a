// HostCallWorkers: the threads that run the pass boundary's host-tier calls (the pulls of
// begin_pass and of a staging, the pushes of a write-back), made once by their owner (PassCards)
// and kept for its life: a thread per call, and the OpenMP team its call builds in the host table
// (table/parallel.cpp), was a thread made per host_batch_keys keys. CallWindow bounds one caller's
// calls in flight; pipelined_chunks runs a pull in chunks through one.
//
// Host-only (g++ on both backends).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::pass {

// Runs the calls submitted to it, in submission order, on `threads` (>= 1) threads made by the
// constructor, each of which first adds `nice` to the nice value it inherited from the
// constructing thread (common/thread_priority.hpp: the threads of a caller that lowered itself
// later do not inherit that; a refusal is logged). The destructor runs every call submitted before
// it and joins the threads. Each thread keeps the OpenMP team its calls build (the host table's,
// table/parallel.cpp) until it is joined. Thread-safety: submit from any thread, never after the
// destructor started.
class HostCallWorkers {
 public:
  explicit HostCallWorkers(std::size_t threads, int nice = 0);
  ~HostCallWorkers();
  HostCallWorkers(const HostCallWorkers&) = delete;
  HostCallWorkers& operator=(const HostCallWorkers&) = delete;

  // Queues `call`; its future holds its Status (or what it threw).
  std::future<Status> submit(std::function<Status()> call) GPUBOX_EXCLUDES(mu_);
  std::size_t threads() const { return threads_.size(); }
  // Threads made by every HostCallWorkers of this process so far (tests pin that a pass makes
  // none).
  static std::uint64_t threads_started();

 private:
  void work(int nice) GPUBOX_EXCLUDES(mu_);
  void close_and_join() GPUBOX_EXCLUDES(mu_);

  Mutex mu_;
  CondVar ready_;
  std::deque<std::packaged_task<Status()>> calls_ GPUBOX_GUARDED_BY(mu_);
  bool closed_ GPUBOX_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// One caller's calls on shared workers, at most `limit` in flight, retired oldest first. Its
// destructor waits for the calls still in flight, so a caller that unwinds (an error, a throw)
// leaves no call reading or writing its buffers. Not thread-safe: one caller's.
class CallWindow {
 public:
  CallWindow(HostCallWorkers& workers, std::size_t limit);
  ~CallWindow();
  CallWindow(const CallWindow&) = delete;
  CallWindow& operator=(const CallWindow&) = delete;

  bool full() const { return calls_.size() >= limit_; }
  bool empty() const { return calls_.empty(); }
  void submit(std::function<Status()> call) { calls_.push_back(workers_.submit(std::move(call))); }
  // Waits for the oldest call and returns its Status (rethrows what it threw).
  Status retire();

 private:
  HostCallWorkers& workers_;
  std::size_t limit_;
  std::deque<std::future<Status>> calls_;
};

// Runs `work(begin, end)` over [0, n) in chunks of `chunk` on `workers`, up to `in_flight` chunks
// at once, and `finish(begin, end)` for each chunk in order on the calling thread as it
// completes. Stops at the first chunk that fails (none submitted after it; the chunks already in
// the window run to their end, none of them finished) and returns its Status, or what it threw
// (std::bad_alloc as ResourceExhausted, as table/parallel.cpp; anything else as Internal), naming
// the chunk: "keys [b, e) of n: ...". Returns once no chunk runs, also when `finish` throws.
template <class Work, class Finish>
Status pipelined_chunks(HostCallWorkers& workers, std::size_t n, std::size_t chunk, int in_flight,
                        Work work, Finish finish) {
  chunk = std::max<std::size_t>(chunk, 1);
  const std::size_t chunks = (n + chunk - 1) / chunk;
  CallWindow window(workers, static_cast<std::size_t>(std::max(1, in_flight)));
  std::size_t started = 0;
  for (std::size_t i = 0; i < chunks; ++i) {
    for (; started < chunks && !window.full(); ++started) {
      const std::size_t b = started * chunk;
      const std::size_t e = std::min(n, b + chunk);
      window.submit([&work, b, e] { return work(b, e); });
    }
    const std::size_t b = i * chunk;
    const std::size_t e = std::min(n, b + chunk);
    Status st;
    try {
      st = window.retire();
    } catch (const std::bad_alloc&) {
      st = Status::ResourceExhausted("out of memory");
    } catch (const std::exception& error) {
      st = Status::Internal(error.what());
    }
    if (!st.ok()) {
      return st.with_context("keys [" + std::to_string(b) + ", " + std::to_string(e) + ") of " +
                             std::to_string(n));
    }
    finish(b, e);
  }
  return Status::OK();
}

}  // namespace gpubox::pass
