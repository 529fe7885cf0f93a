// NCCL communicator for the GPUs of a job (cuda backend only): one clique over every card of
// every trainer (global rank = trainer_id * cards + local index). One non-blocking ncclComm_t
// per local GPU (ncclCommInitRankConfig with config.blocking = 0 inside one group, which is what
// ncclCommInitAll does, minus the blocking); each card's thread drives its own communicator.
// Across trainers the clique's ncclUniqueId is made by global rank 0 and shared through the
// rendezvous store (rendezvous_store.hpp); every process then inits its own ranks.
//
// Non-blocking: an NCCL call may return ncclInProgress instead of blocking (e.g. while a peer
// has not joined yet); the rank then polls ncclCommGetAsyncError until the call is enqueued,
// bounded by the group's timeout and by abort. Collectives return once enqueued; barrier,
// exchange_counts and synchronize wait for the stream, spinning on cudaStreamQuery with a short
// backoff (no fixed sleep) and polling the communicator's asynchronous error, so a wait longer
// than the timeout, an NCCL error or an abort from another thread ends it with an error naming
// the rank, the step, the wait and the last collective (the group is aborted so peers wake).
//
// Abort is race-free: every NCCL call on a communicator (enqueue, poll) runs under the group's
// shared lock; abort() first raises a flag that makes new callers back off without taking the
// lock, then takes it exclusively (in-flight calls are non-blocking, so this is bounded), marks
// the group aborted (a caller that gets the shared lock after that backs off too) and releases
// it; then ncclCommAbort starts on every communicator. No ncclCommAbort ever runs while another
// thread is inside NCCL on that communicator, and none runs under the lock.
//
// abort() does not wait for ncclCommAbort to finish: the communicators are ended by one thread of
// their own (teardown_thread.hpp), since NCCL's last ncclCommAbort of a process frees them and
// (NCCL 2.26 and later) first waits until every CUDA graph that captured one of their collectives
// has been destroyed. A card's step graphs belong to objects (HeterComm, a trainer's composed
// step) that the failing card threads destroy only after abort() returns: waited for inside
// abort(), they never would be, and a failure in a run with step graphs hung instead of failing.
// abort() returns once that thread has begun the last communicator's ncclCommAbort (every earlier
// one has returned, its abort flags raised; bounded by 2 s), since callers synchronize their
// streams next. This relies on only the process's last ncclCommAbort blocking: NCCL's
// commReclaim frees a process's communicators together, when the last of them is ended, and the
// earlier calls only count (NCCL 2.26 and later, as read there; built against 2.28 here, not
// checked on older NCCL). With an NCCL where an earlier one blocks, abort() warns after 2 s,
// naming the communicator not yet aborted, whose rank's next stream synchronize may hang. Only
// when no thread (or no copy of the communicators) can be made does abort() run ncclCommAbort
// itself (after releasing its locks), and then it may wait for those graphs.
//
// The destructor ends the communicators the same way: after an abort it waits for that thread;
// otherwise it finalizes them (bounded by the collective timeout) and destroys them
// (ncclCommDestroy, or ncclCommAbort when they did not settle) on such a thread. The wait for the
// thread is bounded by the collective timeout clamped to [10 s, 60 s], so the destructor takes at
// most the timeout (finalize) plus that clamp: a graph that outlives its group (or a slow
// teardown) is named in a warning and its thread is kept to be waited for at exit, not waited for
// forever.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/comm/teardown_thread.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::comm {

class NcclGroup;

// One rank's handle; used only by that rank's (activated) card thread.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclGroup& group, int rank, ncclComm_t comm, device::Card& card);

  int rank() const override { return rank_; }
  int size() const override;

 protected:
  void do_all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                         const device::Stream& stream) override;
  void do_all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                       const std::size_t* recv_counts, DataType type,
                       const device::Stream& stream) override;
  void do_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                     const device::Stream& stream) override;
  void do_broadcast(void* buffer, std::size_t count, DataType type, int root,
                    const device::Stream& stream) override;
  void do_barrier(const device::Stream& stream) override;
  void do_exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                          const device::Stream& stream) override;
  void do_synchronize(const device::Stream& stream, const char* what) override;
  // Counts the host wait on this rank's card (the event's), then polls the event.
  void do_wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                   device::HostWait counted_as) override;

 private:
  // The bounded wait for `what`: polls ready() (cudaStreamQuery / cudaEventQuery) and the
  // communicator's asynchronous error until it is done, its timeout passes, or (kFail) the group
  // aborts. With kOutlast an abort does not end it, and an asynchronous error aborts the group
  // (its kernels return) instead of ending it; the shared lock is held only for each error poll,
  // never across the wait, so abort() takes the exclusive lock while this rank waits.
  template <class Ready>
  void poll_until(const char* what, const Ready& ready, OnAbort on_abort);
  // The communicator's asynchronous error while `what` is waited for: "" when there is none, or
  // when the group is aborting (the communicator is being or has been freed: not asked).
  std::string async_error(const char* what);
  // Runs `call` (one NCCL enqueue, or a ncclGroupStart..End block, returning its result) under
  // the group's shared lock; waits out ncclInProgress; on an error aborts the group and throws.
  template <class Call>
  void enqueue(const char* collective, Call&& call);
  // Aborts the group with `reason` (after every lock is released) and throws it.
  [[noreturn]] void fail(const std::string& reason);

  NcclGroup* group_;
  int rank_;
  ncclComm_t comm_;
  device::CardCounters* counters_;                 // the card's: wait_for's host waits
  device::device_buffer<int32_t> barrier_word_;    // 1 element
  device::device_buffer<uint64_t> counts_device_;  // size() x size() count matrix
  device::pinned_buffer<uint64_t> counts_host_;    // its host copy
};

class NcclGroup final : public CommGroup {
 public:
  // The cards (and the store) must outlive the group. `store` is needed when the cards span
  // several trainers (cards.total_cards() > local cards): rank 0 publishes the unique id there
  // under "nccl/unique_id" and the others wait for it (bounded by `timeout`). Peer access
  // between the local GPUs was granted when the CardSet was made (card.hpp).
  NcclGroup(device::CardSet& cards, std::chrono::milliseconds timeout,
            RendezvousStore* store = nullptr);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // Local ranks (at() takes 0 .. size()-1); total_ranks(): every card of the job.
  int size() const override { return static_cast<int>(comms_.size()); }
  int total_ranks() const { return total_; }
  Communicator& at(int local_rank) override;
  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

  // The shared lock every NCCL call on a communicator of this group runs under (see the file
  // comment). Throws the abort error (naming `rank` and `collective`) instead when the group is
  // aborted or being aborted.
  std::shared_lock<std::shared_mutex> lock_for_call(int rank, const char* collective);
  // The same lock, or none (owns_lock() false) when the group is aborted or being aborted.
  std::shared_lock<std::shared_mutex> lock_unless_aborting();
  // True while abort() waits for the exclusive lock or has finished: a caller holding the shared
  // lock in a poll loop must let go.
  bool aborting() const { return aborting_.load(std::memory_order_acquire); }
  // "communicator aborted (rank R in C): reason", the message of its GroupAborted error.
  std::string aborted_message(int rank, const char* collective) const;

 private:
  // ncclCommAbort on every communicator created so far, on this thread (constructor failure:
  // no graph holds them yet).
  void abort_communicators() noexcept;
  // The destructor's ncclCommFinalize of every communicator, bounded by the timeout: true when
  // all settled (they may be destroyed), false when they are to be aborted.
  bool finalize_communicators() noexcept;

  const std::chrono::milliseconds timeout_;
  const int total_;
  std::vector<ncclComm_t> comms_;
  std::vector<std::unique_ptr<NcclCommunicator>> ranks_;
  mutable Mutex mu_;
  std::string reason_ GPUBOX_GUARDED_BY(mu_);
  bool abort_started_ GPUBOX_GUARDED_BY(mu_) = false;
  // Shared: an NCCL call on a communicator; exclusive: aborting. It orders calls against
  // ncclCommAbort and guards no member the analysis could check, and its shared holds are
  // returned by lock_for_call, which a scoped capability cannot express: a plain
  // std::shared_mutex (this file is CUDA-only, outside the clang pass).
  std::shared_mutex comms_mu_;
  std::atomic<bool> aborting_{false};
  std::atomic<bool> aborted_{false};
  // The end of the communicators: started by the first abort() (the abort_started_ flag makes it
  // the only writer, after comms_mu_ is released) or by the destructor, and finished by the
  // destructor.
  std::optional<TeardownThread> teardown_;
};

}  // namespace gpubox::comm
