// TeardownThread (heterps/comm/teardown_thread.hpp): it ends its items in order on a thread of
// its own. The owner's waits are bounded: wait_last_started returns once the last end has begun
// (a last end that waits, as NCCL's last ncclCommAbort waits for CUDA graphs, does not hold it),
// finish hands a thread still running to the registry instead of waiting for it, and the
// registry counts it until it ends (a destroyed teardown's thread too: never detached).
#include "heterps/comm/teardown_thread.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "common/thread_annotations.hpp"

namespace gpubox::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// What an end waits for until the test opens it (a graph that its owner destroys later).
class Gate {
 public:
  void open() {
    {
      MutexLock lock(mu_);
      open_ = true;
    }
    opened_.notify_all();
  }
  void pass() {
    MutexLock lock(mu_);
    while (!open_) opened_.wait(lock);
  }

 private:
  Mutex mu_;
  CondVar opened_;
  bool open_ GPUBOX_GUARDED_BY(mu_) = false;
};

// Waits (at most 10 s) until the registry holds at most `count` running teardowns; returns how
// many. Other tests of the binary may hand teardowns to the registry too (a test's own count is a
// lower bound on the registry's, and what it hands over ends: at most what it found).
std::size_t lingering_at_most(std::size_t count) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (TeardownThread::lingering() > count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  return TeardownThread::lingering();
}

TEST(TeardownThread, EndsEveryItemInOrderAndFinishes) {
  for (std::size_t n : {0, 1, 2, 5}) {
    SCOPED_TRACE(::testing::Message() << n << " items");
    std::vector<int> items(n);
    std::iota(items.begin(), items.end(), 0);
    std::vector<int> ended;  // the thread's until finish() joins it
    TeardownThread teardown(items, [&ended](int item) noexcept { ended.push_back(item); });
    EXPECT_TRUE(teardown.wait_last_started(seconds(10)));
    EXPECT_TRUE(teardown.finish(seconds(10), "a test teardown", "(none)"));
    EXPECT_EQ(teardown.started(), n);
    EXPECT_EQ(ended, items);
  }
}

TEST(TeardownThread, ALastEndThatWaitsHoldsNeitherTheStartNorTheOwnerPastItsBound) {
  const std::size_t before = TeardownThread::lingering();
  // Shared with the thread, which outlives the teardown object.
  auto gate = std::make_shared<Gate>();
  auto ended = std::make_shared<std::atomic<int>>(0);
  {
    TeardownThread teardown(std::vector<int>{0, 1, 2}, [gate, ended](int item) noexcept {
      if (item == 2) gate->pass();
      ended->fetch_add(1);
    });
    EXPECT_TRUE(teardown.wait_last_started(seconds(10)));
    EXPECT_EQ(ended->load(), 2) << "the ends before the last have returned";
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(teardown.finish(milliseconds(100), "a test teardown", "its last end waits"));
    EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
    EXPECT_GE(TeardownThread::lingering(), before + 1) << "handed to the registry";
  }
  EXPECT_GE(TeardownThread::lingering(), before + 1) << "still running after its owner is gone";
  gate->open();
  EXPECT_LE(lingering_at_most(before), before) << "ended once its end could";
  EXPECT_EQ(ended->load(), 3);
}

TEST(TeardownThread, AnEarlierEndThatWaitsBoundsTheWaitForTheLastStart) {
  auto gate = std::make_shared<Gate>();
  TeardownThread teardown(std::vector<int>{0, 1}, [gate](int item) noexcept {
    if (item == 0) gate->pass();
  });
  EXPECT_FALSE(teardown.wait_last_started(milliseconds(50)));
  EXPECT_EQ(teardown.started(), 1u) << "the first end waits; the second has not begun";
  gate->open();
  EXPECT_TRUE(teardown.wait_last_started(seconds(10)));
  EXPECT_EQ(teardown.started(), 2u);
  EXPECT_TRUE(teardown.finish(seconds(10), "a test teardown", "(none)"));
}

TEST(TeardownThread, OneDestroyedUnfinishedIsKeptUntilItEnds) {
  const std::size_t before = TeardownThread::lingering();
  auto gate = std::make_shared<Gate>();
  {
    TeardownThread teardown(std::vector<int>{0}, [gate](int) noexcept { gate->pass(); });
  }  // destroyed without finish(): its thread goes to the registry
  EXPECT_GE(TeardownThread::lingering(), before + 1);
  gate->open();
  EXPECT_LE(lingering_at_most(before), before);
}

}  // namespace
}  // namespace gpubox::comm
