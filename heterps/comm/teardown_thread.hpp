// TeardownThread: ends a group's resources (an NCCL group's communicators) in order, on one
// thread of its own, which the owner waits for with bounds of its own.
//
// Why a thread (NcclGroup): NCCL frees a process's communicators when the last of them is ended
// (commReclaim: the earlier calls only count), and that last call waits until every CUDA graph
// that captured one of their collectives is destroyed (NCCL 2.26 and later, commDestroySync). The
// graphs belong to objects (HeterComm's padded steps, a trainer's composed step) that the card
// threads destroy as a failure unwinds, after the group's abort() has returned: waited for there,
// they never would be.
//
// Why a registry: a thread still running when its owner gives up on it (the graphs outlive the
// group) is not detached silently; it is kept in a registry (made on first use, never freed, so
// owners destroyed during static destruction still find it) that joins it once it has ended (at
// the next hand-over) and, at exit (an std::atexit handler registered at the first hand-over,
// after CUDA and NCCL were set up: it runs before their own exit handlers), waits for it (all of
// them: at most kExitBound) before leaving it to end with the process, saying so on stderr. A
// thread handed over after that is detached at once.
//
// Thread-safety: one owner calls the members; the thread shares only its progress (in .cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace gpubox::comm {

class TeardownThread {
 public:
  // How long exit waits for the teardowns still running then, in all.
  static constexpr std::chrono::seconds kExitBound{10};

  // Starts end(item) for each of `items` in order (`end` must not throw). When no thread can be
  // started they are ended on this thread before the constructor returns (this may wait as long
  // as an end does: the caller must hold no lock that the ends wait for).
  template <class Item, class End>
  TeardownThread(std::vector<Item> items, End end) noexcept : items_(items.size()) {
    try {
      state_ = make_state(items.size());
      // `items` by copy: intact here when the thread cannot be started.
      thread_ = std::thread([items, end, state = state_] {
        for (const Item& item : items) {
          begin_one(*state);
          end(item);
        }
        end_all(*state);
      });
      return;
    } catch (...) {  // no memory or no thread: end them here
      state_.reset();
    }
    for (const Item& item : items) end(item);
  }
  // A thread still running is handed to the registry, never detached.
  ~TeardownThread();
  TeardownThread(const TeardownThread&) = delete;
  TeardownThread& operator=(const TeardownThread&) = delete;

  // Waits at most `bound` until the thread has begun ending the last item (each earlier end has
  // returned); true when it has (or there were none).
  bool wait_last_started(std::chrono::milliseconds bound) noexcept;
  // How many items' ends have begun (every one before the last of them has returned); all of
  // them when they were ended on the owner's thread.
  std::size_t started() const noexcept;
  // Waits at most `bound` until every item is ended and joins the thread: true. False when it
  // still runs: it is then logged as a warning (`what` names the teardown, `why` says what it may
  // wait for) and handed to the registry.
  bool finish(std::chrono::milliseconds bound, const char* what, const char* why) noexcept;

  // How many teardowns handed to the registry are still running (tests).
  static std::size_t lingering();

 private:
  struct State;    // the thread's progress, shared with it (it may outlive this object)
  class Registry;  // the threads that outlived their owners (in .cpp)

  static std::shared_ptr<State> make_state(std::size_t items);
  static void begin_one(State& state) noexcept;
  static void end_all(State& state) noexcept;

  std::shared_ptr<State> state_;  // null when the items were ended on the owner's thread
  std::size_t items_;             // how many there are (started() when state_ is null)
  std::thread thread_;
};

}  // namespace gpubox::comm
