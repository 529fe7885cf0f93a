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
// understands). Mutex is BasicLockable: std::condition_variable_any waits on a MutexLock.
#pragma once

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
#define GPUBOX_NO_THREAD_SAFETY_ANALYSIS GPUBOX_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace gpubox {

// std::mutex with the capability attribute.
class GPUBOX_CAPABILITY("mutex") Mutex {
 public:
  void lock() GPUBOX_ACQUIRE() { mu_.lock(); }
  void unlock() GPUBOX_RELEASE() { mu_.unlock(); }
  bool try_lock() GPUBOX_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
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

// Holds a Mutex (or a SharedMutex exclusively) for its scope. BasicLockable, so a
// std::condition_variable_any can wait on it (the analysis sees the mutex held throughout).
template <class M>
class GPUBOX_SCOPED_CAPABILITY BasicMutexLock {
 public:
  explicit BasicMutexLock(M& mu) GPUBOX_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~BasicMutexLock() GPUBOX_RELEASE() { mu_.unlock(); }
  BasicMutexLock(const BasicMutexLock&) = delete;
  BasicMutexLock& operator=(const BasicMutexLock&) = delete;
  // For std::condition_variable_any only.
  void lock() GPUBOX_NO_THREAD_SAFETY_ANALYSIS { mu_.lock(); }
  void unlock() GPUBOX_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }

 private:
  M& mu_;
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

}  // namespace gpubox
