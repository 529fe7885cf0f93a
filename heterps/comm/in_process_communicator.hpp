// In-process communicator: simulated cards are threads of one process sharing memory, so a
// collective is a rendezvous plus plain copies. Host-only (buffers must be host-addressable:
// card memory on the cpu backend, host memory in any build; on the cuda backend a GPU buffer is
// rejected with an error instead of a crash: use make_group, which gives NCCL there).
//
// Each collective: publish my arguments in my slot, rendezvous, do my own part of the work
// reading the peers' slots (every rank copies in parallel; no lock is held during the copies),
// rendezvous again so no buffer is reused or freed while a peer still reads it. Nothing is
// allocated per call. all_reduce_sum is deterministic and identical on every rank: rank r sums a
// disjoint, cache-line-aligned chunk over all ranks in rank order and writes the sums into every
// rank's recv; only with 3+ ranks above 256 KiB does it write its own recv alone, and after a
// third rendezvous every rank copies the other chunks. Either way dense weights stay
// bit-identical across cards.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "heterps/comm/communicator.hpp"
#include "heterps/comm/detail/rendezvous.hpp"

namespace gpubox::comm {

class InProcessGroup;

namespace detail {
// What a rank publishes for the current collective. Written by its rank before the first
// rendezvous, read by peers between the two. Cache-line aligned: ranks write their own slots
// concurrently.
struct alignas(64) RankSlot {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType type = DataType::kFloat32;
  int root = 0;
  const std::size_t* send_counts = nullptr;
  const std::size_t* recv_counts = nullptr;
  std::vector<std::size_t> send_offsets;  // size()+1 prefix sums of send_counts
  // Scratch of the owning rank only (preallocated, so collectives never allocate).
  std::vector<std::size_t> recv_offsets;  // size()+1 prefix sums of recv_counts
  std::vector<const void*> peer_sends;    // every rank's send, for all_reduce_sum
  std::vector<void*> peer_recvs;          // every rank's recv, for all_reduce_sum
};
}  // namespace detail

// One rank's handle; used only by that rank's thread.
class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessGroup& group, int rank) : group_(&group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override;

 protected:
  void do_all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                         const device::Stream& stream) override;
  // send and recv must not overlap.
  void do_all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                       const std::size_t* recv_counts, DataType type,
                       const device::Stream& stream) override;
  // In place is allowed when send == recv + rank() * count.
  void do_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                     const device::Stream& stream) override;
  void do_broadcast(void* buffer, std::size_t count, DataType type, int root,
                    const device::Stream& stream) override;
  void do_barrier(const device::Stream& stream) override;
  // send_counts and recv_counts must not overlap.
  void do_exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                          const device::Stream& stream) override;
  // The collectives have completed when they return: waits for the stream and reports an abort
  // of the group (a peer failed) as an error, as the NCCL group's wait does.
  void do_synchronize(const device::Stream& stream, const char* what) override;
  // Event::synchronize (it counts before it waits), then the abort unless `on_abort` outlasts
  // it (the cpu backend's work has completed when the wait returns).
  void do_wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                   device::HostWait counted_as) override;

 private:
  // After a wait for `what`: throws the group's abort (a peer failed) as an error.
  void throw_if_aborted(const char* what) const;
  // Bad arguments found before the first rendezvous: abort the group (peers wake at once) and
  // throw here.
  [[noreturn]] void fail_argument(const char* collective, const std::string& message);
  // Inconsistency found between the rendezvous (peers disagree): abort the group; the second
  // rendezvous then throws on every rank once no rank is copying any more.
  void fail_in_data_phase(const char* collective, const std::string& message);
  // Checks `type` and the buffers (null with count > 0), synchronizes `stream` (its earlier
  // work feeds the collective), records the call's arguments in this rank's slot and returns it.
  detail::RankSlot& publish(const char* collective, DataType type, const device::Stream& stream,
                            const void* send, void* recv, std::size_t count, int root);
  // True when every rank passed the same count, type and root; else fails the data phase.
  bool same_shape_everywhere(const char* collective);

  InProcessGroup* group_;
  int rank_;
};

// All ranks of one process. Thread-safe as the CommGroup contract says: at(r) is used by rank
// r's thread only; abort()/aborted() from any thread.
class InProcessGroup final : public CommGroup {
 public:
  InProcessGroup(int ranks, std::chrono::milliseconds timeout);

  int size() const override { return rendezvous_.ranks(); }
  Communicator& at(int local_rank) override;
  void abort(const std::string& reason) override { rendezvous_.abort(reason); }
  bool aborted() const override { return rendezvous_.aborted(); }

 private:
  friend class InProcessCommunicator;

  detail::Rendezvous rendezvous_;
  std::vector<detail::RankSlot> slots_;
  std::vector<std::unique_ptr<InProcessCommunicator>> comms_;
};

}  // namespace gpubox::comm
