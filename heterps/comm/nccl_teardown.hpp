// The end of an NCCL group's communicators (cuda backend only): ncclCommAbort or ncclCommDestroy
// on each in turn, on one thread of its own, which the group waits for with bounds of its own.
//
// Why a thread: NCCL frees a process's communicators when the last of them is ended (commReclaim:
// the earlier calls only count), and that last call waits until every CUDA graph that captured
// one of their collectives is destroyed (NCCL 2.26 and later, commDestroySync). The graphs belong
// to objects (HeterComm's padded steps, a trainer's composed step) that the card threads destroy
// as a failure unwinds, after the group's abort() has returned: waited for there, they never
// would be. One thread for every communicator, since only the last call waits.
//
// Why a registry: a thread still waiting when the group is destroyed (its graphs outlive it) is
// not detached silently; it is kept in a process-lifetime registry that joins it once it ends and,
// at exit, waits for it (bounded by kExitBound) before leaving it to end with the process.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace gpubox::comm {

enum class EndBy { kAbort, kDestroy };

class NcclTeardown {
 public:
  // How long exit waits for teardowns that outlived their group (in all).
  static constexpr std::chrono::seconds kExitBound{10};

  // Starts ending every communicator of `comms` that is not null, in order, as `how` says. When
  // no thread can be started they are ended on this thread before the constructor returns (this
  // may wait for graphs: the caller must hold no lock that those graphs' owners need).
  NcclTeardown(std::vector<ncclComm_t> comms, EndBy how) noexcept;
  // A thread still running is kept in the registry (see the file comment), never detached.
  ~NcclTeardown();
  NcclTeardown(const NcclTeardown&) = delete;
  NcclTeardown& operator=(const NcclTeardown&) = delete;

  // Waits at most `bound` until the thread has begun ending the last communicator (each earlier
  // call has returned, every abort flag but the last one's is raised); true when it has.
  bool wait_last_started(std::chrono::milliseconds bound) noexcept;
  // Waits at most `bound` for the end of every communicator and joins the thread; false when it
  // still runs (it is then handed to the registry, described by `what`).
  bool finish(std::chrono::milliseconds bound, const std::string& what) noexcept;

  struct State;  // shared with the thread, which may outlive this object

 private:
  std::shared_ptr<State> state_;  // null when the communicators were ended inline
  std::thread thread_;
};

}  // namespace gpubox::comm
