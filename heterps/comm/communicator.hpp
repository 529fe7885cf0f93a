// The card communicator: one interface (RAFT's comms_iface habit), implemented in-process for
// simulated cards (threads sharing memory) and with NCCL for GPUs. All operations are collective
// (every rank of the group calls them in the same order) and stream-ordered on the caller's card
// stream. Buffers are card memory of the calling rank. Counts are in elements.
//
// Failure: when any rank fails (throws) the group is aborted (CommGroup::abort, which
// CardSet::run_on_cards' on_failure should call); every rank blocked in, or later entering, a
// collective then throws gpubox::Error with the reason. A collective that waits longer than the
// group's timeout also aborts the group.
//
// Implementations: in_process_communicator.hpp (any backend; buffers must be host-addressable,
// i.e. card memory on the cpu backend) and nccl_communicator.hpp (cuda backend). make_group
// picks the one for the build.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "heterps/device/stream.hpp"

namespace gpubox {
namespace device {
class CardSet;
}

namespace comm {

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
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = sum over ranks of send[i], i < count. send may equal recv (in place). The result
  // is bit-identical on every rank (in-process: summed in rank order; integers wrap), so dense
  // weights updated from it stay identical across cards.
  virtual void all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                              const device::Stream& stream) = 0;
  // Rank r sends send_counts[p] elements to each peer p, packed contiguously in `send` in peer
  // order, and receives recv_counts[p] elements from each p, packed in `recv` in peer order.
  // Counts are host arrays of size(); zero counts and empty peers are fine; recv_counts must
  // match what the peers send (exchange_counts gives them).
  virtual void all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                            const std::size_t* recv_counts, DataType type,
                            const device::Stream& stream) = 0;
  // recv (size() * count elements) = the ranks' `send` blocks in rank order.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DataType type,
                          const device::Stream& stream) = 0;
  // buffer on every rank = buffer on `root`.
  virtual void broadcast(void* buffer, std::size_t count, DataType type, int root,
                         const device::Stream& stream) = 0;
  // Returns when every rank has entered the barrier (and the stream's prior work is done).
  virtual void barrier(const device::Stream& stream) = 0;

  // Host-side count exchange for all_to_all_v: recv_counts[p] = what peer p sends to this rank
  // (its send_counts[rank()]). Both host arrays of size(). Synchronizes `stream`.
  virtual void exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                               const device::Stream& stream) = 0;

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
// `timeout` aborts the group.
std::unique_ptr<CommGroup> make_in_process_group(
    int ranks, std::chrono::milliseconds timeout = std::chrono::minutes(5));

// The group for a CardSet: in-process on the cpu backend, NCCL (one communicator per local
// GPU, ncclCommInitAll for a single trainer) on the cuda backend.
std::unique_ptr<CommGroup> make_group(device::CardSet& cards,
                                      std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace comm
}  // namespace gpubox
