#include "heterps/comm/nccl_teardown.hpp"

#include <cstdio>
#include <utility>

#include "common/logging.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::comm {

// The thread's progress: how many communicators it has begun ending, and whether it is done.
struct NcclTeardown::State {
  explicit State(std::size_t total) : total(total) {}

  // Waits until the thread is done or, with `or_last_started`, has begun ending the last
  // communicator, or until `deadline` passes; returns whether it is (or has).
  bool wait(std::chrono::steady_clock::time_point deadline, bool or_last_started) {
    MutexLock lock(mu);
    for (;;) {
      const bool reached = finished || (or_last_started && started >= total);
      if (reached) return true;
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout) {
        return finished || (or_last_started && started >= total);
      }
    }
  }
  bool is_finished() {
    MutexLock lock(mu);
    return finished;
  }

  const std::size_t total;
  Mutex mu;
  CondVar changed;
  std::size_t started GPUBOX_GUARDED_BY(mu) = 0;
  bool finished GPUBOX_GUARDED_BY(mu) = false;
};

namespace {

using State = NcclTeardown::State;

void end_communicators(const std::vector<ncclComm_t>& comms, EndBy how, State* state) noexcept {
  for (ncclComm_t comm : comms) {
    if (comm == nullptr) continue;
    if (state != nullptr) {
      {
        MutexLock lock(state->mu);
        ++state->started;
      }
      state->changed.notify_all();
    }
    if (how == EndBy::kAbort) {
      ncclCommAbort(comm);  // errors here are moot
      continue;
    }
    const ncclResult_t r = ncclCommDestroy(comm);
    if (r != ncclSuccess) {
      try {
        GPUBOX_LOG(WARNING) << "NCCL: ncclCommDestroy at shutdown: " << ncclGetErrorString(r);
      } catch (...) {  // a log line that cannot be written is dropped
      }
    }
  }
  if (state != nullptr) {
    {
      MutexLock lock(state->mu);
      state->finished = true;
    }
    state->changed.notify_all();
  }
}

// Teardown threads that outlived their group: joined once they end (the next keep() joins the
// ended ones) and, at exit, waited for at most NcclTeardown::kExitBound in all. One still running
// then is detached with a line on stderr: it waits only for CUDA graphs that their owners never
// destroyed, which nothing in an exiting process will, and ends with the process.
class Lingering {
 public:
  static Lingering& instance() {
    static Lingering lingering;  // made on first use, after CUDA and NCCL: destroyed before them
    return lingering;
  }

  void keep(std::thread thread, std::shared_ptr<State> state) noexcept {
    MutexLock lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!it->state->is_finished()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = entries_.erase(it);
    }
    try {
      entries_.push_back(Entry{std::move(thread), std::move(state)});
    } catch (...) {  // no room to keep it: it ends with the process
      thread.detach();
    }
  }

  ~Lingering() {
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + NcclTeardown::kExitBound;
    for (Entry& entry : entries_) {
      if (entry.state->wait(deadline, /*or_last_started=*/false)) {
        entry.thread.join();
        continue;
      }
      // Logging's own statics may be gone at exit: stderr directly.
      std::fprintf(stderr,
                   "NCCL: at exit, ending %zu communicators still waits for CUDA graphs that "
                   "captured their collectives and were never destroyed; left to end with the "
                   "process\n",
                   entry.state->total);
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

NcclTeardown::NcclTeardown(std::vector<ncclComm_t> comms, EndBy how) noexcept {
  std::size_t total = 0;
  for (ncclComm_t comm : comms) total += comm != nullptr ? 1 : 0;
  try {
    state_ = std::make_shared<State>(total);
    // `comms` by copy: intact here when the thread cannot be started.
    thread_ =
        std::thread([comms, how, state = state_] { end_communicators(comms, how, state.get()); });
    return;
  } catch (...) {  // no memory or no thread: end them here
    state_.reset();
  }
  end_communicators(comms, how, nullptr);
}

NcclTeardown::~NcclTeardown() {
  if (thread_.joinable()) Lingering::instance().keep(std::move(thread_), state_);
}

bool NcclTeardown::wait_last_started(std::chrono::milliseconds bound) noexcept {
  if (state_ == nullptr) return true;
  return state_->wait(std::chrono::steady_clock::now() + bound, /*or_last_started=*/true);
}

bool NcclTeardown::finish(std::chrono::milliseconds bound, const std::string& what) noexcept {
  if (state_ == nullptr) return true;
  const bool finished =
      state_->wait(std::chrono::steady_clock::now() + bound, /*or_last_started=*/false);
  if (finished) {
    if (thread_.joinable()) thread_.join();
    return true;
  }
  try {
    GPUBOX_LOG(WARNING) << "NCCL: " << what << " has not finished after " << bound.count()
                        << " ms: a CUDA graph still holds one of the communicators' collectives "
                           "(destroy step graphs before their group), or teardown is slow; it "
                           "goes on on a thread of its own, waited for at exit";
  } catch (...) {  // a log line that cannot be written is dropped
  }
  Lingering::instance().keep(std::move(thread_), state_);
  return false;
}

}  // namespace gpubox::comm
