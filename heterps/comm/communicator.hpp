// The card communicator: one interface (RAFT's comms_iface habit), implemented in-process for
// simulated cards (threads sharing memory) and with NCCL for GPUs. All operations are collective
// (every rank of the group calls them in the same order) and stream-ordered on the caller's card
// stream. Buffers are card memory of the calling rank. Counts are in elements.
//
// Completion: all_reduce_sum, all_to_all_v, all_gather and broadcast are enqueued on the stream
// (NCCL returns before the data moves; the in-process group happens to finish them at once);
// their results are ready after Communicator::synchronize, the bounded wait every caller uses
// after collectives. barrier and exchange_counts block.
//
// Failure: when any rank fails (throws) the group is aborted (CommGroup::abort, which
// CardSet::run_on_cards' on_failure should call); every rank blocked in, or later entering, a
// collective or a synchronize then throws gpubox::Error with the reason. A wait longer than the
// group's timeout also aborts the group; the error names the rank, the step context, the wait
// and the last collective.
//
// Ranks: rank() is the card's global rank among every card of the job (trainer_id * cards +
// local index) and size() the job's card count; CommGroup::at takes the local index.
//
// Implementations: in_process_communicator.hpp (one process, any backend; buffers must be
// host-addressable, i.e. card memory on the cpu backend), gloo_communicator.hpp (several trainer
// processes, cpu backend) and nccl_communicator.hpp (cuda backend, one or several trainers).
// make_group picks the one for the build and the job.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "heterps/device/late_readback_types.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox {
namespace device {
class CardSet;
}

namespace comm {

class RendezvousStore;

// What a bounded wait (Communicator::wait_for) does when the group is aborted while it waits.
enum class OnAbort {
  kFail,  // throws the abort error at once: the caller's results are lost with the job
  // Keeps waiting, within the group's timeout: a failure's cleanup that must see the card's work
  // done before it hands out memory that work writes (LateReadback::discard). An aborted NCCL
  // communicator's kernels return, so the work queued behind them runs and the event passes.
  kOutlast,
};

enum class DataType { kFloat32, kFloat64, kInt32, kInt64, kUInt64, kUInt8 };

// The DataType of element type T (a compile error for any other type).
template <class T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DataType::kFloat32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DataType::kFloat64;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return DataType::kInt32;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return DataType::kInt64;
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return DataType::kUInt64;
  } else {
    static_assert(std::is_same_v<T, uint8_t>, "no communicator DataType for this element type");
    return DataType::kUInt8;
  }
}
std::size_t size_of(DataType type);
// "float32", "int64", ... for messages.
const char* name_of(DataType type);

// One rank's handle. Used only by that rank's card thread.
//
// The public methods are the portable part every implementation shares: they count the
// collective (and, for a blocking one, the host synchronization) on the stream's card
// (heterps/device/counters.hpp), check the buffers under GPUBOX_DEVICE_CHECK=1 (card memory of
// the stream's card, the whole range inside one allocation), remember the collective for error
// messages, and prefix errors with the step context. The do_* hooks move the data.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = sum over ranks of send[i], i < count. send may equal recv (in place). The result
  // is bit-identical on every rank (in-process: summed in rank order; integers wrap), so dense
  // weights updated from it stay identical across cards. Enqueued: see synchronize().
  void all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                      const device::Stream& stream);
  // Rank r sends send_counts[p] elements to each peer p, packed contiguously in `send` in peer
  // order, and receives recv_counts[p] elements from each p, packed in `recv` in peer order.
  // Counts are host arrays of size(); zero counts and empty peers are fine; recv_counts must
  // match what the peers send (exchange_counts gives them). Enqueued.
  void all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                    const std::size_t* recv_counts, DataType type, const device::Stream& stream);
  // recv (size() * count elements) = the ranks' `send` blocks in rank order. In place is
  // allowed when send == recv + rank() * count. Enqueued.
  void all_gather(const void* send, void* recv, std::size_t count, DataType type,
                  const device::Stream& stream);
  // buffer on every rank = buffer on `root`. Enqueued.
  void broadcast(void* buffer, std::size_t count, DataType type, int root,
                 const device::Stream& stream);
  // Returns when every rank has entered the barrier (and the stream's prior work is done).
  // Blocking: counts one host synchronization.
  void barrier(const device::Stream& stream);
  // Host-side count exchange for all_to_all_v: recv_counts[p] = what peer p sends to this rank
  // (its send_counts[rank()]). Both host arrays of size(). Blocking: synchronizes `stream` and
  // counts one host synchronization (the NCCL group also moves the counts through pinned card
  // memory: 2 pinned copies more there). The training step does not use it: it all-gathers
  // counts computed on the card and reads them back with its other results, one wait for both.
  void exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                       const device::Stream& stream);

  // The bounded wait after collectives (device rule 6): returns once all work enqueued on
  // `stream` so far has finished. Throws gpubox::Error, and aborts the group so the peers wake,
  // when the group's timeout passes first, the group was aborted, or the transport reports an
  // error; the message names this rank, the step context, `what` the wait was for and the last
  // collective enqueued. Counts one host synchronization.
  void synchronize(const device::Stream& stream, const char* what);
  // The same bounded wait for the work before `event`'s last record only (a late readback's
  // slot, device/late_readback.hpp: the host reads a step's results while later steps run).
  // With OnAbort::kOutlast an abort of the group does not end the wait (see OnAbort). Counts
  // one host wait before it waits, as synchronize does (a wait that fails counted it too): a
  // host synchronization, or as `counted_as` says (a late readback's full ring: a pipeline wait).
  void wait_for(const device::Event& event, const char* what, OnAbort on_abort = OnAbort::kFail,
                device::HostWait counted_as = device::HostWait::kSync);

  // Bytes this rank has sent to ranks of other processes so far (0 for a group within one
  // process; the Gloo group's count: gloo_communicator.hpp). For reports, not for control.
  virtual uint64_t bytes_to_other_processes() const { return 0; }

  // The step context errors name ("pass 3, step 17"), set by the card's worker before each
  // step; pass < 0 clears it.
  void set_step(int64_t pass, int64_t step) {
    pass_ = pass;
    step_ = step;
  }
  // The step context set_step gave (-1: none).
  int64_t pass() const { return pass_; }
  int64_t step() const { return step_; }

  // Typed forms.
  template <class T>
  void all_reduce_sum(const T* send, T* recv, std::size_t count, const device::Stream& stream) {
    all_reduce_sum(send, recv, count, data_type_of<T>(), stream);
  }
  template <class T>
  void all_to_all_v(const T* send, const std::size_t* send_counts, T* recv,
                    const std::size_t* recv_counts, const device::Stream& stream) {
    all_to_all_v(send, send_counts, recv, recv_counts, data_type_of<T>(), stream);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count, const device::Stream& stream) {
    all_gather(send, recv, count, data_type_of<T>(), stream);
  }
  template <class T>
  void broadcast(T* buffer, std::size_t count, int root, const device::Stream& stream) {
    broadcast(buffer, count, data_type_of<T>(), root, stream);
  }

 protected:
  virtual void do_all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                                 const device::Stream& stream) = 0;
  virtual void do_all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                               const std::size_t* recv_counts, DataType type,
                               const device::Stream& stream) = 0;
  virtual void do_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                             const device::Stream& stream) = 0;
  virtual void do_broadcast(void* buffer, std::size_t count, DataType type, int root,
                            const device::Stream& stream) = 0;
  virtual void do_barrier(const device::Stream& stream) = 0;
  virtual void do_exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                                  const device::Stream& stream) = 0;
  virtual void do_synchronize(const device::Stream& stream, const char* what) = 0;
  // Counts one host wait (`counted_as`) on the event's card before it waits (wait_for's
  // contract).
  virtual void do_wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                           device::HostWait counted_as) = 0;

  // The last collective this rank enqueued ("none" before the first), for wait messages.
  const char* last_collective() const { return last_collective_; }

 private:
  // Counts and names the collective, runs `move` and prefixes any error with the step context.
  template <class Move>
  void run(const char* collective, bool blocking, const device::Stream& stream, Move&& move);
  // Runs `move`, prefixing any error with the step context.
  template <class Move>
  void in_step_context(const Move& move);
  // GPUBOX_DEVICE_CHECK: [ptr, ptr + elements * size_of(type)) is card memory of the stream's
  // card. Null with 0 elements passes.
  void check_buffer(const char* collective, const char* role, const void* ptr, std::size_t elements,
                    DataType type, const device::Stream& stream) const;

  const char* last_collective_ = "none";
  int64_t pass_ = -1;
  int64_t step_ = -1;
};

// The communicators of all local ranks. Thread-safe: abort() may be called from any thread.
class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int size() const = 0;
  virtual Communicator& at(int local_rank) = 0;
  // Wakes every rank blocked in a collective (and fails every later one) with `reason`.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;
};

// Simulated cards: `ranks` threads of this process. A collective that waits longer than
// `timeout` aborts the group. Host-addressable buffers only (card memory on the cpu backend).
std::unique_ptr<CommGroup> make_in_process_group(
    int ranks, std::chrono::milliseconds timeout = std::chrono::minutes(5));

// A late readback's wait for a slot (device::LateReadback::SlotWait) through `comm`'s bounded
// wait (Communicator::wait_for; a discard's wait outlasts an abort; a full ring's is counted as a
// pipeline wait), naming the slot's step: "<noun> of pass P, step S" from the tag's pass and step
// (just `noun` when the tag's pass is < 0). `comm` must outlive the wait.
template <class Tag>
std::function<void(const device::Event&, const Tag&, device::SlotWaitReason)> bounded_slot_wait(
    Communicator& comm, const char* noun) {
  return [&comm, noun](const device::Event& event, const Tag& tag, device::SlotWaitReason reason) {
    const std::string what = tag.pass < 0
                                 ? std::string(noun)
                                 : std::string(noun) + " of pass " + std::to_string(tag.pass) +
                                       ", step " + std::to_string(tag.step);
    comm.wait_for(event, what.c_str(),
                  reason == device::SlotWaitReason::kDiscard ? OnAbort::kOutlast : OnAbort::kFail,
                  device::counted_as(reason));
  };
}

// The group for a CardSet. One trainer: in-process on the cpu backend, NCCL on the cuda
// backend. Cards over several trainers (cards.total_cards() > local cards) meet through `store`
// (required then; it must outlive the group): Gloo over TCP on the cpu backend, reached at
// `host` (this process's address for its peers: 127.0.0.1 on one machine, POD_IP across
// machines), NCCL with ncclCommInitRank on the cuda backend. `timeout` bounds every wait
// (runner.collective_timeout_s in gpubox_train). `peer_failure` (optional) says why another
// trainer failed ("" while none told one): Gloo's connect, waiting for its peers' addresses,
// ends with it at once rather than at `timeout`.
using PeerFailure = std::function<std::string()>;
std::unique_ptr<CommGroup> make_group(device::CardSet& cards,
                                      std::chrono::milliseconds timeout = std::chrono::minutes(5),
                                      RendezvousStore* store = nullptr,
                                      const std::string& host = "127.0.0.1",
                                      const PeerFailure& peer_failure = {});

}  // namespace comm
}  // namespace gpubox
