#include "heterps/comm/teardown_thread.hpp"

#include <cstdio>

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

  const std::size_t items;
  Mutex mu;
  CondVar changed;
  std::size_t started GPUBOX_GUARDED_BY(mu) = 0;
  bool finished GPUBOX_GUARDED_BY(mu) = false;
};

namespace {

using State = TeardownThread::State;

// Teardowns that outlived their owner's bound: joined once they have ended (at the next keep())
// and, at exit, waited for at most TeardownThread::kExitBound in all. One still running then is
// detached with a line on stderr: what it waits for (CUDA graphs that their owners never
// destroyed) nothing in an exiting process will end, and it ends with the process.
class Lingering {
 public:
  static Lingering& instance() {
    // Made on first use, after the libraries whose resources the teardowns end (CUDA, NCCL) were
    // set up: destroyed, and so waited for, before theirs are.
    static Lingering lingering;
    return lingering;
  }

  void keep(std::thread thread, std::shared_ptr<State> state) noexcept {
    MutexLock lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!it->state->is_finished()) {
        ++it;
        continue;
      }
      it->thread.join();  // it has ended: at once
      it = entries_.erase(it);
    }
    try {
      entries_.push_back(Entry{std::move(thread), std::move(state)});
    } catch (...) {  // no room to keep it: it ends with the process
      thread.detach();
    }
  }

  std::size_t running() {
    MutexLock lock(mu_);
    std::size_t n = 0;
    for (const Entry& entry : entries_) n += entry.state->is_finished() ? 0 : 1;
    return n;
  }

  ~Lingering() {
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + TeardownThread::kExitBound;
    for (Entry& entry : entries_) {
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

 private:
  Lingering() = default;

  struct Entry {
    std::thread thread;
    std::shared_ptr<State> state;
  };
  Mutex mu_;
  std::vector<Entry> entries_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<State> TeardownThread::make_state(std::size_t items) {
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
  if (thread_.joinable()) Lingering::instance().keep(std::move(thread_), state_);
}

bool TeardownThread::wait_last_started(std::chrono::milliseconds bound) noexcept {
  if (state_ == nullptr) return true;
  return state_->wait(std::chrono::steady_clock::now() + bound, /*or_last_started=*/true);
}

bool TeardownThread::finish(std::chrono::milliseconds bound, const std::string& what,
                            const std::string& why) noexcept {
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
  Lingering::instance().keep(std::move(thread_), state_);
  return false;
}

std::size_t TeardownThread::lingering() { return Lingering::instance().running(); }

}  // namespace gpubox::comm
