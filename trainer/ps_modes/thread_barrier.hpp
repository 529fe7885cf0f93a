// ThreadBarrier: the training threads of one PS trainer meeting at each sync step. Private to
// trainer/ps_modes.
//
// Thread-safety: every method from any of the `parties` threads.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::trainer::ps_modes {

// The threads of one trainer meeting at each sync step. abort() wakes every waiter with the
// failure of another thread (a FailureTold: that thread's error names it), so no thread
// waits for one that has died.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int parties) : parties_(parties) {}
  void wait() {
    MutexLock lock(mu_);
    if (!aborted_.empty()) throw FailureTold("stopped: " + aborted_);
    const uint64_t generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == generation && aborted_.empty()) cv_.wait(lock);
    if (generation_ == generation) throw FailureTold("stopped: " + aborted_);
  }
  void abort(const std::string& why) {
    MutexLock lock(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "another training thread failed" : why;
    cv_.notify_all();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  const int parties_;
  int arrived_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t generation_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::string aborted_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::trainer::ps_modes
