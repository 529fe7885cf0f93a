// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) and
// an annotated mutex, so that "this member is guarded by that mutex" is written next to the
// member and checked by the compiler instead of stated in a comment. Under g++ (the build
// compiler) the macros expand to nothing; scripts/check_thread_safety.sh compiles the host
// sources with clang -Wthread-safety -Werror=thread-safety (CI: .ci/run).
//
//   class Counter {
//    public:
//     void add(int n) GPUBOX_EXCLUDES(mu_) { MutexLock lock(mu_); total_ += n; }
//    private:
//     mutable Mutex mu_;
//     int total_ GPUBOX_GUARDED_BY(mu_) = 0;
//   };
//
// std::mutex carries no annotation in libstdc++, so guarded state uses gpubox::Mutex (a
// std::mutex with the capability attribute) and gpubox::MutexLock (a scoped lock the analysis
// understands, which may be released and taken again in its scope). A thread waits for guarded
// state with gpubox::CondVar (a std::condition_variable over a MutexLock) in a loop the analysis
// can read, as Abseil does:  while (!ready_) ready_cv_.wait(lock);
// (A predicate lambda would be analyzed as a function of its own that holds no lock.)
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define GPUBOX_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GPUBOX_THREAD_ANNOTATION(x)
#endif

#define GPUBOX_CAPABILITY(x) GPUBOX_THREAD_ANNOTATION(capability(x))
#define GPUBOX_SCOPED_CAPABILITY GPUBOX_THREAD_ANNOTATION(scoped_lockable)
#define GPUBOX_GUARDED_BY(x) GPUBOX_THREAD_ANNOTATION(guarded_by(x))
#define GPUBOX_PT_GUARDED_BY(x) GPUBOX_THREAD_ANNOTATION(pt_guarded_by(x))
#define GPUBOX_REQUIRES(...) GPUBOX_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define GPUBOX_REQUIRES_SHARED(...) \
  GPUBOX_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define GPUBOX_ACQUIRE(...) GPUBOX_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define GPUBOX_ACQUIRE_SHARED(...) GPUBOX_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define GPUBOX_RELEASE(...) GPUBOX_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define GPUBOX_RELEASE_SHARED(...) GPUBOX_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define GPUBOX_RELEASE_GENERIC(...) \
  GPUBOX_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define GPUBOX_TRY_ACQUIRE(...) GPUBOX_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define GPUBOX_EXCLUDES(...) GPUBOX_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define GPUBOX_ASSERT_CAPABILITY(x) GPUBOX_THREAD_ANNOTATION(assert_capability(x))
#define GPUBOX_NO_THREAD_SAFETY_ANALYSIS GPUBOX_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace gpubox {

class CondVar;

// std::mutex with the capability attribute.
class GPUBOX_CAPABILITY("mutex") Mutex {
 public:
  void lock() GPUBOX_ACQUIRE() { mu_.lock(); }
  void unlock() GPUBOX_RELEASE() { mu_.unlock(); }
  bool try_lock() GPUBOX_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds this mutex; checks nothing at run time. For a
  // callback that runs inside its caller's locked section (a lambda is analyzed as a function of
  // its own, which holds no lock): the first statement of its body.
  void assert_held() const GPUBOX_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// std::shared_mutex with the capability attribute (readers take it shared).
class GPUBOX_CAPABILITY("mutex") SharedMutex {
 public:
  void lock() GPUBOX_ACQUIRE() { mu_.lock(); }
  void unlock() GPUBOX_RELEASE() { mu_.unlock(); }
  void lock_shared() GPUBOX_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() GPUBOX_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex (or a SharedMutex exclusively) for its scope. unlock() lets it go early (for
// work that needs no guarded state) and lock() takes it again; the analysis follows both, and
// the destructor releases it only if held.
template <class M>
class GPUBOX_SCOPED_CAPABILITY BasicMutexLock {
 public:
  explicit BasicMutexLock(M& mu) GPUBOX_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~BasicMutexLock() GPUBOX_RELEASE() {
    if (held_) mu_.unlock();
  }
  BasicMutexLock(const BasicMutexLock&) = delete;
  BasicMutexLock& operator=(const BasicMutexLock&) = delete;
  void lock() GPUBOX_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }
  void unlock() GPUBOX_RELEASE() {
    mu_.unlock();
    held_ = false;
  }

 private:
  friend class CondVar;
  M& mu_;
  bool held_ = true;
};
using MutexLock = BasicMutexLock<Mutex>;
using WriterLock = BasicMutexLock<SharedMutex>;

// Holds a SharedMutex shared for its scope.
class GPUBOX_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) GPUBOX_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ~ReaderLock() GPUBOX_RELEASE() { mu_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

// A std::condition_variable whose waits take a held MutexLock: the wait releases the mutex and
// holds it again before returning, so to the analysis the lock is held throughout. Wait in a
// loop over the guarded condition (wake-ups may be spurious).
class CondVar {
 public:
  // Waits for a notify (or a spurious wake-up). `lock` must be held.
  void wait(MutexLock& lock) {
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    cv_.wait(native);
    native.release();  // the MutexLock still owns the (again held) mutex
  }
  // As wait(), until `deadline` at the latest: std::cv_status::timeout when it passed.
  template <class Clock, class Duration>
  std::cv_status wait_until(MutexLock& lock,
                            const std::chrono::time_point<Clock, Duration>& deadline) {
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    const std::cv_status status = cv_.wait_until(native, deadline);
    native.release();
    return status;
  }
  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace gpubox
