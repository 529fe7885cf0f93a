// The annotated locking types (common/thread_annotations.hpp): a MutexLock released early and
// taken again, and CondVar waits (notified, timed out) over guarded state.
#include "common/thread_annotations.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace gpubox {
namespace {

// A one-slot mailbox: the shape of every guarded wait in the tree.
class Mailbox {
 public:
  void put(int value) GPUBOX_EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      value_ = value;
      full_ = true;
    }
    changed_.notify_all();
  }
  int take() GPUBOX_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (!full_) changed_.wait(lock);
    full_ = false;
    return value_;
  }
  // False when nothing came before `deadline`.
  bool take_until(std::chrono::steady_clock::time_point deadline, int* out) GPUBOX_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (!full_) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !full_) return false;
    }
    full_ = false;
    *out = value_;
    return true;
  }

 private:
  Mutex mu_;
  CondVar changed_;
  bool full_ GPUBOX_GUARDED_BY(mu_) = false;
  int value_ GPUBOX_GUARDED_BY(mu_) = 0;
};

TEST(ThreadAnnotations, MutexLockReleasedEarlyIsNotReleasedTwice) {
  Mutex mu;
  {
    MutexLock lock(mu);
    lock.unlock();
    // Another thread can take it now: the scope no longer holds it.
    std::thread other([&] { MutexLock inner(mu); });
    other.join();
    lock.lock();
  }
  // Released early, then held by another thread when the scope ends: a destructor that unlocked
  // again would release the other thread's hold (what a std::mutex does when unlocked by a
  // thread that does not own it), and try_lock below would succeed.
  std::promise<void> held, done;
  std::shared_future<void> finish = done.get_future().share();
  std::thread other;
  {
    MutexLock lock(mu);
    lock.unlock();
    other = std::thread([&mu, &held, finish] {
      MutexLock inner(mu);
      held.set_value();
      finish.wait();
    });
    held.get_future().wait();
  }
  bool taken = false;
  if (mu.try_lock()) {
    taken = true;
    mu.unlock();
  }
  done.set_value();
  other.join();
  EXPECT_FALSE(taken) << "a MutexLock released early unlocked its mutex again at its scope's end";
}

TEST(ThreadAnnotations, CondVarWaitSeesTheValueAndHoldsTheLockAfter) {
  Mailbox box;
  int got = 0;
  std::thread reader([&] { got = box.take(); });
  box.put(42);
  reader.join();
  EXPECT_EQ(got, 42);
  for (int i = 0; i < 100; ++i) {
    std::thread writer([&, i] { box.put(i); });
    EXPECT_EQ(box.take(), i);
    writer.join();
  }
}

TEST(ThreadAnnotations, CondVarWaitUntilTimesOutWithoutNotify) {
  Mailbox box;
  int got = -1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(box.take_until(start + std::chrono::milliseconds(20), &got));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
  box.put(7);
  EXPECT_TRUE(box.take_until(std::chrono::steady_clock::now() + std::chrono::seconds(5), &got));
  EXPECT_EQ(got, 7);
}

}  // namespace
}  // namespace gpubox
