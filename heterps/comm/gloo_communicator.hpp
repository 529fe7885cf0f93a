// Gloo communicator: the cards of several trainer processes in one group (cpu backend). Every
// local card gets its own Gloo context over every card of the job (global rank = card.rank() =
// trainer_id * cards + local index, size = total cards), connected full mesh over TCP
// (Gloo's tcp transport) through the rendezvous store, so a card's collectives are Gloo's
// (ring all-reduce, all-to-all-v, all-gather, broadcast, barrier) whether a peer is a card of
// this process or of another one. Buffers must be host-addressable (card memory on cpu).
//
// Contract (communicator.hpp): Gloo's collectives block, so every one has completed when it
// returns; synchronize() only reports an abort. The ring all-reduce reduces each chunk once and
// passes the sums on, so the result is bit-identical on every rank (its order of summation is
// the ring's, not rank order: results equal an in-process group's up to rounding).
//
// Failure: a peer process that exits closes its sockets, and every rank in a collective with
// it throws at once; a peer that stalls is caught by the group's timeout (Gloo's per-operation
// timeout). Either way the rank aborts the group (the local ranks' next collective throws at
// once) and the error names this rank, the collective and, when a trainer on this host has
// exited, that trainer and its pid. Each process publishes "trainer/<id>" = "<host> <pid>" in
// the store for that purpose. An abort also closes the Gloo connections of this process's ranks
// that are not inside a collective (a rank inside one closes its own when it leaves it): the
// peers see the sockets close and their collectives with them end at once (Gloo signals a closed
// connection to a waiting peer), instead of at the timeout. A rank that is itself waiting in
// Gloo is not woken by closing its own connections (Gloo's tcp Pair::close signals no waiter,
// and its socket is not reachable through Gloo's installed headers): it returns at its peers'
// closing or at the timeout, and then reports the abort's reason. A lost peer (PeerHeartbeat: a
// partition, which no socket reports) ends the trainer through PeerWatch's forced exit when a
// rank stays blocked (trainer/engine/peer_watch.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace gpubox::comm {

class GlooGroup;

// One rank's handle; used only by that rank's card thread.
class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(GlooGroup& group, std::shared_ptr<gloo::Context> context);
  // Closes this rank's Gloo connections (GlooGroup::abort; never while it runs a collective).
  void close_connections();

  int rank() const override;
  int size() const override;
  // Payload bytes sent to ranks of other trainers: exact for all_to_all_v and exchange_counts
  // (what the counts say), the ring's share for all_reduce_sum (2(R-1)/R of the buffer) and
  // all_gather ((R-1) blocks), each when the ring's next rank is another trainer's; broadcast
  // and barrier are not counted. Read by this rank's thread (or after it joined).
  uint64_t bytes_to_other_processes() const override { return bytes_to_other_processes_; }

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
  // Event::synchronize (it counts before it waits), then the abort unless `on_abort` outlasts
  // it (the cpu backend's work has completed when the wait returns).
  void do_wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                   device::HostWait counted_as) override;

 private:
  // After a wait for `what`: throws the group's abort (a peer failed) as an error.
  void throw_if_aborted(const char* what) const;
  // Throws the abort error when the group was aborted, then synchronizes `stream` (its earlier
  // work feeds the collective), runs `op` (one Gloo collective) and turns a Gloo failure into
  // an abort of the group and a gpubox::Error naming this rank and `collective`.
  template <class Op>
  void run_gloo(const char* collective, const device::Stream& stream, Op&& op);

  // Whether rank `peer` lives in another trainer process.
  bool other_process(int peer) const;
  // The share of a ring collective sent to the next rank, when that rank is another trainer's.
  void count_ring(double bytes);

  GlooGroup* group_;
  std::shared_ptr<gloo::Context> context_;
  uint64_t bytes_to_other_processes_ = 0;
};

// The local cards' ranks of one job-wide group. Thread-safe as CommGroup says.
class GlooGroup final : public CommGroup {
 public:
  // Connects every local card to every card of the job through `store` (keys "gloo/<rank>" and
  // "trainer/<id>"), one thread per local card; `host` is the address peers reach this process
  // at (127.0.0.1 on one machine, POD_IP across machines: refused, naming it, when it does not
  // resolve or is not this machine's). Throws naming the ranks (and their trainers) that did not
  // join within `timeout`, or at once what `peer_failure` (optional) tells of a trainer that
  // failed. The cards and the store must outlive the group.
  GlooGroup(device::CardSet& cards, RendezvousStore& store, std::chrono::milliseconds timeout,
            const std::string& host = "127.0.0.1", const PeerFailure& peer_failure = {});
  ~GlooGroup() override;
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  int size() const override { return static_cast<int>(ranks_.size()); }
  Communicator& at(int local_rank) override;
  void abort(const std::string& reason) override;
  // Around each Gloo collective of local rank `local`: enter throws the abort error when the
  // group was aborted; leave closes the rank's connections when it was aborted meanwhile.
  void enter_collective(int local, const char* collective);
  void leave_collective(int local);
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  int cards_per_trainer() const { return cards_per_trainer_; }
  // "trainer 1 (pid 4242 on this host) has exited; " for every trainer of this host whose
  // process is gone (read from the store), or "" when none is known to be.
  std::string gone_trainers() const;

 private:
  RendezvousStore& store_;
  const std::chrono::milliseconds timeout_;
  const int trainer_id_;
  const int trainers_;
  const int cards_per_trainer_;
  const std::string host_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::vector<std::unique_ptr<GlooCommunicator>> ranks_;
  mutable Mutex mu_;
  std::string reason_ GPUBOX_GUARDED_BY(mu_);
  std::vector<bool> in_collective_ GPUBOX_GUARDED_BY(mu_);  // per local rank
  std::atomic<bool> aborted_{false};
};

}  // namespace gpubox::comm
