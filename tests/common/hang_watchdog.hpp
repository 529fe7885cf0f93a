// HangWatchdog: a test's bound on work that must end, such as a failure path on a GPU, where a
// wait for a stream, an event, a collective peer or NCCL's abort may never return. Armed with
// what is waited for and a limit, disarmed by its destructor. When the limit passes first, it
// prints what was waited for, for how long and in which test, prints every thread's stack when a
// debugger can attach (gdb, else cuda-gdb, also from /usr/local/cuda/bin: the GPU machines have
// only that one; bounded by kStackDumpBound), then aborts the process: the waiting thread cannot
// be stopped, and a binary stopped by its test runner's timeout names nothing.
//
//   const HangWatchdog watchdog("a wrong plan's failing run on 1 card", std::chrono::seconds(20));
//   run(...);  // must throw, not hang
//
// Thread-safety: one owner; the watchdog's own thread only waits and reads under its mutex.
#pragma once

#include <gtest/gtest.h>
#if defined(__linux__)
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "common/thread_annotations.hpp"

namespace gpubox::testing {

// Whether the watchdog prints every thread's stack before it aborts (kNone: a test of the
// watchdog itself, which must not wait for a debugger).
enum class StackDump { kTry, kNone };

class HangWatchdog {
 public:
  // A debugger's attach and backtraces take seconds; past this it is stopped and the process
  // aborts without them (a test runner's own limit must not end the binary first).
  static constexpr int kStackDumpBound = 15;  // seconds

  HangWatchdog(std::string what, std::chrono::seconds limit, StackDump dump = StackDump::kTry)
      : what_(std::move(what)), test_(current_test()), limit_(limit), dump_(dump), thread_([this] {
          watch();
        }) {}
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
  // "Suite.Name" of the running test (read on the owner's thread, where gtest runs it).
  static std::string current_test() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    if (info == nullptr) return "(no test running)";
    return std::string(info->test_suite_name()) + "." + info->name();
  }

  void watch() {
    const auto deadline = std::chrono::steady_clock::now() + limit_;
    MutexLock lock(mu_);
    while (!done_) {
      if (wake_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    }
    if (done_) return;
    std::fprintf(stderr, "HangWatchdog: still waiting after %lld s for %s (test %s)\n",
                 static_cast<long long>(limit_.count()), what_.c_str(), test_.c_str());
    std::fflush(stderr);
    if (dump_ == StackDump::kTry) dump_stacks();
    std::fprintf(stderr, "HangWatchdog: aborting the test %s\n", test_.c_str());
    std::fflush(stderr);
    std::abort();
  }

  // Every thread's stack on stderr, by the first debugger found; nothing when there is none.
  static void dump_stacks() {
#if defined(__linux__)
    // Yama's ptrace_scope 1 lets a debugger attach only to its descendants: this process is its
    // parent, so allow it.
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    // Past the bound the debugger gets SIGINT (it stops its command and detaches as it quits),
    // 2 s later SIGKILL; one killed while attached may leave this process stopped (the attach's
    // SIGSTOP), so it is always continued, or std::abort below would never run. std::system
    // ignores SIGINT and SIGQUIT in this whole (threaded) process while the command runs.
    const std::string bound = std::to_string(kStackDumpBound);
    const std::string pid = std::to_string(getpid());
    const std::string command =
        "for d in gdb cuda-gdb /usr/local/cuda/bin/cuda-gdb; do if command -v $d >/dev/null 2>&1; "
        "then "
        "echo \"HangWatchdog: every thread's stack ($d, at most " +
        bound + " s):\" >&2; timeout -s INT -k 2 " + bound + " $d -batch -nx -p " + pid +
        " -ex 'thread apply all bt' </dev/null >&2; kill -CONT " + pid +
        "; exit 0; fi; done; "
        "echo 'HangWatchdog: no gdb or cuda-gdb here: no stacks' >&2";
    if (std::system(command.c_str()) != 0) {
      std::fprintf(stderr, "HangWatchdog: the stack dump did not run\n");
    }
#endif
  }

  const std::string what_;
  const std::string test_;
  const std::chrono::seconds limit_;
  const StackDump dump_;
  Mutex mu_;
  CondVar wake_;
  bool done_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the members it reads are made
};

}  // namespace gpubox::testing
