#include "heterps/comm/teardown_thread.hpp"

#include <cstdio>
#include <cstdlib>

#include "common/logging.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::comm {

struct TeardownThread::State {
  explicit State(std::size_t items) : items(items) {}

  // Waits until the thread is done or, with `or_last_started`, has begun ending the last item,
  // or until `deadline` passes; returns whether it is (or has).
  bool wait(std::chrono::steady_clock::time_point deadline, bool or_last_started) {
    MutexLock lock(mu);
    for (;;) {
      if (finished || (or_last_started && started >= items)) return true;
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout) {
        return finished || (or_last_started && started >= items);
      }
    }
  }
  bool is_finished() {
    MutexLock lock(mu);
    return finished;
  }
  std::size_t how_many_started() {
    MutexLock lock(mu);
    return started;
  }

  const std::size_t items;
  Mutex mu;
  CondVar changed;
  std::size_t started GPUBOX_GUARDED_BY(mu) = 0;
  bool finished GPUBOX_GUARDED_BY(mu) = false;
};

// Teardowns that outlived their owner's bound: joined once they have ended (at the next keep())
// and, at exit, waited for at most TeardownThread::kExitBound in all. One still running then is
// detached with a line on stderr: what it waits for (CUDA graphs that their owners never
// destroyed) nothing in an exiting process will end, and it ends with the process.
class TeardownThread::Registry {
 public:
  // Never freed: an owner destroyed during static destruction (or a thread blocked on mu_ while
  // drain() runs) still finds it whole.
  static Registry& instance() {
    static Registry* const registry = new Registry();
    return *registry;
  }

  void keep(std::thread thread, std::shared_ptr<State> state) noexcept {
    MutexLock lock(mu_);
    if (closed_) {  // exit has drained the registry: it ends with the process
      thread.detach();
      return;
    }
    if (!drain_registered_) {
      // Registered now, after CUDA and NCCL were set up (a teardown ends their resources): run
      // before their exit handlers. When it cannot be, the threads end with the process.
      drain_registered_ = true;
      if (std::atexit(&drain_at_exit) != 0) {
        std::fprintf(stderr, "gpubox: no exit handler for NCCL teardowns still running\n");
      }
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!it->state->is_finished()) {
        ++it;
        continue;
      }
      it->thread.join();  // it has ended: at once
      it = entries_.erase(it);
    }
    try {
      entries_.reserve(entries_.size() + 1);
    } catch (...) {  // no room to keep it: it ends with the process
      thread.detach();
      return;
    }
    entries_.push_back(Entry{std::move(thread), std::move(state)});  // moves only: no throw
  }

  std::size_t running() {
    MutexLock lock(mu_);
    std::size_t n = 0;
    for (const Entry& entry : entries_) n += entry.state->is_finished() ? 0 : 1;
    return n;
  }

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<State> state;
  };

  Registry() = default;

  static void drain_at_exit() noexcept { instance().drain(); }

  // Closes the registry and waits for its threads without holding mu_ (a keep() meanwhile
  // detaches its thread).
  void drain() noexcept {
    std::vector<Entry> entries;
    {
      MutexLock lock(mu_);
      closed_ = true;
      entries.swap(entries_);
    }
    const auto deadline = std::chrono::steady_clock::now() + TeardownThread::kExitBound;
    for (Entry& entry : entries) {
      if (entry.state->wait(deadline, /*or_last_started=*/false)) {
        entry.thread.join();
        continue;
      }
      // Logging's own statics may be gone at exit: stderr directly.
      std::fprintf(stderr,
                   "gpubox: at exit, a teardown of %zu items still runs (an NCCL group's last "
                   "ncclCommAbort or ncclCommDestroy waits for CUDA graphs never destroyed); left "
                   "to end with the process\n",
                   entry.state->items);
      entry.thread.detach();
    }
  }

  Mutex mu_;
  std::vector<Entry> entries_ GPUBOX_GUARDED_BY(mu_);
  bool closed_ GPUBOX_GUARDED_BY(mu_) = false;
  bool drain_registered_ GPUBOX_GUARDED_BY(mu_) = false;
};

std::shared_ptr<TeardownThread::State> TeardownThread::make_state(std::size_t items) {
  return std::make_shared<State>(items);
}

void TeardownThread::begin_one(State& state) noexcept {
  {
    MutexLock lock(state.mu);
    ++state.started;
  }
  state.changed.notify_all();
}

void TeardownThread::end_all(State& state) noexcept {
  {
    MutexLock lock(state.mu);
    state.finished = true;
  }
  state.changed.notify_all();
}

TeardownThread::~TeardownThread() {
  if (thread_.joinable()) Registry::instance().keep(std::move(thread_), state_);
}

bool TeardownThread::wait_last_started(std::chrono::milliseconds bound) noexcept {
  if (state_ == nullptr) return true;
  return state_->wait(std::chrono::steady_clock::now() + bound, /*or_last_started=*/true);
}

std::size_t TeardownThread::started() const noexcept {
  return state_ == nullptr ? items_ : state_->how_many_started();
}

bool TeardownThread::finish(std::chrono::milliseconds bound, const char* what,
                            const char* why) noexcept {
  if (state_ == nullptr) return true;
  if (!thread_.joinable()) return state_->is_finished();  // handed to the registry before
  if (state_->wait(std::chrono::steady_clock::now() + bound, /*or_last_started=*/false)) {
    if (thread_.joinable()) thread_.join();
    return true;
  }
  try {
    GPUBOX_LOG(WARNING) << what << " has not finished after " << bound.count() << " ms: " << why
                        << "; it goes on on a thread of its own, waited for at exit";
  } catch (...) {  // a log line that cannot be written is dropped
  }
  Registry::instance().keep(std::move(thread_), state_);
  return false;
}

std::size_t TeardownThread::lingering() { return Registry::instance().running(); }

}  // namespace gpubox::comm
