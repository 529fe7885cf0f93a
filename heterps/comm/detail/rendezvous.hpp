// The meeting point of an in-process communicator group: a generation-counted barrier with a
// condition variable, an abort latch and a timeout. Host-only.
//
// Every collective of the in-process group is: publish my arguments, arrive (phase 1), copy my
// part out of or into the peers' buffers (the "data phase"), arrive (phase 2). The rendezvous
// keeps two promises that make failure safe:
//  - abort(reason) wakes every waiting rank and makes every later arrival throw gpubox::Error
//    containing `reason`; the abort is permanent.
//  - a rank never leaves by exception while a peer may still be reading or writing its
//    buffers: an aborted rank first waits for every rank in the data phase to leave it (data
//    phases are plain copies that finish in bounded time), so unwinding cannot free memory a
//    peer is copying.
// A wait longer than `timeout` aborts the group with a message naming the collective and the
// ranks that had not arrived; two ranks arriving with different collectives abort it too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"

namespace gpubox::comm::detail {

class Rendezvous {
 public:
  Rendezvous(int ranks, std::chrono::milliseconds timeout);
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Called by `rank`'s thread only (one call in flight per rank). Returns once all ranks have
  // arrived for `collective` (a string literal naming it). `opens_data_phase`: after returning,
  // the ranks touch each other's buffers until their next arrive_and_wait. Throws gpubox::Error
  // when the group is or becomes aborted, times out, or sees mismatched collectives.
  void arrive_and_wait(int rank, const char* collective, bool opens_data_phase)
      GPUBOX_EXCLUDES(mu_);

  // Thread-safe, any thread. The first reason wins; later calls are no-ops.
  void abort(const std::string& reason) GPUBOX_EXCLUDES(mu_);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // The first abort reason ("" while not aborted). Thread-safe.
  std::string reason() const;

  int ranks() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void abort_locked(const std::string& reason) GPUBOX_REQUIRES(mu_);
  // Waits for the data phase to drain, then throws the abort error for `rank`. `lock` holds mu_.
  [[noreturn]] void fail_locked(MutexLock& lock, int rank, const char* collective)
      GPUBOX_REQUIRES(mu_);
  std::string missing_ranks_locked() const GPUBOX_REQUIRES(mu_);

  const int ranks_;
  const std::chrono::milliseconds timeout_;
  // Spinning briefly before sleeping pays only when every rank has a core of its own.
  const bool spin_;

  mutable Mutex mu_;
  CondVar cv_;
  // Incremented (under mu_, release) when a round completes; read lock-free while spinning.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborted_{false};
  int arrived_ GPUBOX_GUARDED_BY(mu_) = 0;                         // ranks waiting in this round
  std::vector<char> waiting_ GPUBOX_GUARDED_BY(mu_);               // per rank, arrived this round
  const char* round_collective_ GPUBOX_GUARDED_BY(mu_) = nullptr;  // first arrival's collective
  int in_data_phase_ GPUBOX_GUARDED_BY(mu_) = 0;                   // ranks copying between rounds
  std::vector<char> rank_in_data_phase_ GPUBOX_GUARDED_BY(mu_);
  std::string reason_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::comm::detail
