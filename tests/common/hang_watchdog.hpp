// HangWatchdog: a test's bound on work that must end, such as a failure path on a GPU, where a
// wait for a stream, an event, a collective peer or NCCL's abort may never return. Armed with
// what is waited for and a limit, disarmed by its destructor. When the limit passes first, it
// prints what was waited for and for how long, then aborts the process: the waiting thread cannot
// be stopped, and a binary stopped by its test runner's timeout names nothing.
//
//   const HangWatchdog watchdog("a wrong plan's failing run on 1 card", std::chrono::seconds(20));
//   run(...);  // must throw, not hang
//
// Thread-safety: one owner; the watchdog's own thread only waits and reads under its mutex.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "common/thread_annotations.hpp"

namespace gpubox::testing {

class HangWatchdog {
 public:
  HangWatchdog(std::string what, std::chrono::seconds limit)
      : what_(std::move(what)), limit_(limit), thread_([this] { watch(); }) {}
  ~HangWatchdog() {
    {
      MutexLock lock(mu_);
      done_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

 private:
  void watch() {
    const auto deadline = std::chrono::steady_clock::now() + limit_;
    MutexLock lock(mu_);
    while (!done_) {
      if (wake_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    }
    if (done_) return;
    std::fprintf(stderr, "HangWatchdog: still waiting after %lld s for %s: aborting the test\n",
                 static_cast<long long>(limit_.count()), what_.c_str());
    std::fflush(stderr);
    std::abort();
  }

  const std::string what_;
  const std::chrono::seconds limit_;
  Mutex mu_;
  CondVar wake_;
  bool done_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the members it reads are made
};

}  // namespace gpubox::testing
