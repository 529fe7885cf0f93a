#include "heterps/comm/in_process_communicator.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/error.hpp"
#include "common/group_aborted.hpp"
#include "heterps/comm/detail/data_types.hpp"
#include "heterps/device/memory_registry.hpp"

namespace gpubox::comm {
namespace {

using detail::SumType;
using detail::visit_type;

// All-reduces up to this size write the sums straight into every rank's recv (one data phase);
// larger ones write only the own recv, then every rank copies the other chunks with memcpy (two
// data phases): fewer write streams per rank, measured about 25% faster at 8 ranks on 2 cores.
// Two ranks always take one phase: each writes its chunk to both recvs, no more lines than the
// two phases write, without their copy's second read and rendezvous (1.2 MB: 0.157 -> 0.142 ms
// a call at load 9.6-10.2 on 2 cores).
constexpr std::size_t kScatterMaxBytes = std::size_t{256} << 10;
constexpr int kScatterAlwaysRanks = 2;

// Sums block [block, block + n) over all ranks in rank order into `acc`, then writes it into
// the `writes` buffers of `recvs`. In place (recv == send) is safe: the block is read in full
// before any of it is written, and no other rank touches it. `Count` is std::size_t, or for a
// whole block std::integral_constant<std::size_t, kBlock>: its loops then have a fixed length
// and the compiler calls no memcpy (`acc` still lives on the stack), where a run-time length
// made it copy into and out of `acc` with memcpy calls (two passes more over the data, each
// all-reduce).
template <class T, std::size_t kBlock, class Count>
void reduce_block(const void* const* sends, void* const* recvs, int ranks, int writes,
                  std::size_t block, Count n) {
  using Acc = SumType<T>;
  Acc acc[kBlock];
  const T* first = static_cast<const T*>(sends[0]) + block;
  for (std::size_t j = 0; j < n; ++j) acc[j] = static_cast<Acc>(first[j]);
  for (int k = 1; k < ranks; ++k) {
    const T* src = static_cast<const T*>(sends[k]) + block;
    for (std::size_t j = 0; j < n; ++j)
      acc[j] = static_cast<Acc>(acc[j] + static_cast<Acc>(src[j]));
  }
  for (int k = 0; k < writes; ++k) {
    T* dst = static_cast<T*>(recvs[k]) + block;
    for (std::size_t j = 0; j < n; ++j) dst[j] = static_cast<T>(acc[j]);
  }
}

// Elements [begin, end) summed over the ranks' sends, written to recvs[0 .. writes). Each
// element is summed in rank order, so the result does not depend on who computes it.
template <class T>
void reduce_range(const void* const* sends, void* const* recvs, int ranks, int writes,
                  std::size_t begin, std::size_t end) {
  constexpr std::size_t kBlock = 512;
  std::size_t block = begin;
  for (; end - block >= kBlock; block += kBlock) {
    reduce_block<T, kBlock>(sends, recvs, ranks, writes, block,
                            std::integral_constant<std::size_t, kBlock>{});
  }
  if (block < end) reduce_block<T, kBlock>(sends, recvs, ranks, writes, block, end - block);
}

// One thread per rank: the ranks already copy in parallel. Splitting a rank's copy over its
// card's OpenMP threads was tried and dropped: on a busy machine every team wake-up waited a
// scheduler slice (a 16 MB one-rank all-reduce took 24-28 ms instead of 1 ms at load 12 on
// 2 cores), and with passive waiting it was no faster than one memcpy there (memory-bound).
void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

}  // namespace

// ---- group ---------------------------------------------------------------------------------

InProcessGroup::InProcessGroup(int ranks, std::chrono::milliseconds timeout)
    : rendezvous_(ranks, timeout), slots_(static_cast<std::size_t>(ranks)) {
  const auto n = static_cast<std::size_t>(ranks);
  for (auto& slot : slots_) {
    slot.send_offsets.assign(n + 1, 0);
    slot.recv_offsets.assign(n + 1, 0);
    slot.peer_sends.assign(n, nullptr);
    slot.peer_recvs.assign(n, nullptr);
  }
  comms_.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    comms_.push_back(std::make_unique<InProcessCommunicator>(*this, r));
}

Communicator& InProcessGroup::at(int local_rank) {
  GPUBOX_EXPECTS(local_rank >= 0 && local_rank < size(), "rank ", local_rank,
                 " is not in this group of ", size());
  return *comms_[static_cast<std::size_t>(local_rank)];
}

// ---- communicator --------------------------------------------------------------------------

int InProcessCommunicator::size() const { return group_->size(); }

void InProcessCommunicator::fail_argument(const char* collective, const std::string& message) {
  std::string full = ::gpubox::detail::concat(collective, " on rank ", rank_, ": ", message);
  group_->abort(full);
  throw Error(full);
}

void InProcessCommunicator::fail_in_data_phase(const char* collective, const std::string& message) {
  group_->abort(::gpubox::detail::concat(collective, " on rank ", rank_, ": ", message));
}

detail::RankSlot& InProcessCommunicator::publish(const char* collective, DataType type,
                                                 const device::Stream& stream, const void* send,
                                                 void* recv, std::size_t count, int root) {
  // The data phase must not throw (a rank leaving it by exception would leave peers draining
  // forever), so whatever can fail is checked here, before the first rendezvous.
  if (static_cast<int>(type) < 0 || static_cast<int>(type) > static_cast<int>(DataType::kUInt8)) {
    fail_argument(collective,
                  ::gpubox::detail::concat("unknown data type ", static_cast<int>(type)));
  }
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    fail_argument(collective, ::gpubox::detail::concat("null buffer for ", count, " elements"));
  }
#if defined(GPUBOX_BACKEND_CUDA)
  for (const void* buffer : {send, static_cast<const void*>(recv)}) {
    if (count > 0 && device::find_memory(buffer).kind == device::MemoryKind::kCard) {
      fail_argument(collective,
                    "the in-process communicator cannot read GPU memory (a card buffer was "
                    "given): use comm::make_group, which makes the NCCL group on the cuda backend");
    }
  }
#endif
  // Stream order: the caller's earlier work on `stream` must be done before peers read it.
  // Not counted: the Communicator's public method counts the collective.
  device::detail::synchronize_uncounted(stream);
  detail::RankSlot& mine = group_->slots_[static_cast<std::size_t>(rank_)];
  mine.send = send;
  mine.recv = recv;
  mine.count = count;
  mine.type = type;
  mine.root = root;
  return mine;
}

bool InProcessCommunicator::same_shape_everywhere(const char* collective) {
  const auto& mine = group_->slots_[static_cast<std::size_t>(rank_)];
  for (int p = 0; p < size(); ++p) {
    const auto& peer = group_->slots_[static_cast<std::size_t>(p)];
    if (peer.count != mine.count || peer.type != mine.type || peer.root != mine.root) {
      fail_in_data_phase(
          collective, ::gpubox::detail::concat("rank ", p, " passed count ", peer.count, ", type ",
                                               name_of(peer.type), ", root ", peer.root,
                                               " but this rank count ", mine.count, ", type ",
                                               name_of(mine.type), ", root ", mine.root));
      return false;
    }
  }
  return true;
}

void InProcessCommunicator::do_all_reduce_sum(const void* send, void* recv, std::size_t count,
                                              DataType type, const device::Stream& stream) {
  static constexpr const char* kName = "all_reduce_sum";
  auto& mine = publish(kName, type, stream, send, recv, count, /*root=*/0);
  auto& rendezvous = group_->rendezvous_;
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/true);
  if (same_shape_everywhere(kName) && count > 0) {
    const int ranks = size();
    auto& sends = mine.peer_sends;
    auto& recvs = mine.peer_recvs;
    // This rank's own recv first: the two-phase path writes only recvs[0].
    for (int i = 0; i < ranks; ++i) {
      const auto& peer = group_->slots_[static_cast<std::size_t>((rank_ + i) % ranks)];
      recvs[i] = peer.recv;
    }
    for (int p = 0; p < ranks; ++p) sends[p] = group_->slots_[static_cast<std::size_t>(p)].send;
    visit_type(type, [&](auto tag) {
      using T = decltype(tag);
      if (ranks == 1) {
        copy_bytes(recv, send, count * sizeof(T));
        return;
      }
      // Chunks are whole cache lines so no two ranks write the same line of a recv buffer.
      constexpr std::size_t kLine = 64 / sizeof(T);
      const std::size_t per_rank = (count + ranks - 1) / ranks;
      const std::size_t chunk = (per_rank + kLine - 1) / kLine * kLine;
      auto chunk_of = [&](int r) {
        const std::size_t begin = std::min(count, chunk * static_cast<std::size_t>(r));
        return std::make_pair(begin, std::min(count, begin + chunk));
      };
      const auto [begin, end] = chunk_of(rank_);
      if (ranks <= kScatterAlwaysRanks || count * sizeof(T) <= kScatterMaxBytes) {
        reduce_range<T>(sends.data(), recvs.data(), ranks, ranks, begin, end);
        return;
      }
      reduce_range<T>(sends.data(), recvs.data(), ranks, 1, begin, end);
      // Every chunk is final once all ranks pass; then copy the others' chunks from their recv.
      group_->rendezvous_.arrive_and_wait(rank_, kName, /*opens_data_phase=*/true);
      for (int i = 1; i < ranks; ++i) {
        const auto [peer_begin, peer_end] = chunk_of((rank_ + i) % ranks);
        copy_bytes(static_cast<T*>(recv) + peer_begin, static_cast<const T*>(recvs[i]) + peer_begin,
                   (peer_end - peer_begin) * sizeof(T));
      }
    });
  }
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/false);
}

void InProcessCommunicator::do_all_to_all_v(const void* send, const std::size_t* send_counts,
                                            void* recv, const std::size_t* recv_counts,
                                            DataType type, const device::Stream& stream) {
  static constexpr const char* kName = "all_to_all_v";
  if (send_counts == nullptr || recv_counts == nullptr) {
    fail_argument(kName, "null count array");
  }
  const int ranks = size();
  // count 0: the per-peer counts below say what moves (and the null-buffer check is theirs).
  auto& mine = publish(kName, type, stream, send, recv, /*count=*/0, /*root=*/0);
  auto& recv_offsets = mine.recv_offsets;
  mine.send_offsets[0] = 0;
  recv_offsets[0] = 0;
  for (int p = 0; p < ranks; ++p) {
    mine.send_offsets[p + 1] = mine.send_offsets[p] + send_counts[p];
    recv_offsets[p + 1] = recv_offsets[p] + recv_counts[p];
  }
  if ((send == nullptr && mine.send_offsets[ranks] > 0) ||
      (recv == nullptr && recv_offsets[ranks] > 0)) {
    fail_argument(kName,
                  ::gpubox::detail::concat("null buffer for ", mine.send_offsets[ranks],
                                           " elements sent / ", recv_offsets[ranks], " received"));
  }
  mine.send_counts = send_counts;
  mine.recv_counts = recv_counts;
  auto& rendezvous = group_->rendezvous_;
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/true);
  if (same_shape_everywhere(kName)) {
    const std::size_t element = size_of(type);
    // Start with a different peer on every rank so the ranks do not all read one buffer.
    for (int i = 0; i < ranks; ++i) {
      const int p = (rank_ + i) % ranks;
      const auto& peer = group_->slots_[static_cast<std::size_t>(p)];
      const std::size_t n = recv_counts[p];
      if (peer.send_counts[rank_] != n) {
        fail_in_data_phase(kName,
                           ::gpubox::detail::concat("expects ", n, " elements from rank ", p,
                                                    ", which sends ", peer.send_counts[rank_]));
        break;
      }
      copy_bytes(static_cast<char*>(recv) + recv_offsets[p] * element,
                 static_cast<const char*>(peer.send) + peer.send_offsets[rank_] * element,
                 n * element);
    }
  }
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/false);
}

void InProcessCommunicator::do_all_gather(const void* send, void* recv, std::size_t count,
                                          DataType type, const device::Stream& stream) {
  static constexpr const char* kName = "all_gather";
  publish(kName, type, stream, send, recv, count, /*root=*/0);
  auto& rendezvous = group_->rendezvous_;
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/true);
  if (same_shape_everywhere(kName) && count > 0) {
    const std::size_t bytes = count * size_of(type);
    const int ranks = size();
    for (int i = 0; i < ranks; ++i) {
      const int p = (rank_ + i) % ranks;
      copy_bytes(static_cast<char*>(recv) + static_cast<std::size_t>(p) * bytes,
                 group_->slots_[static_cast<std::size_t>(p)].send, bytes);
    }
  }
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/false);
}

void InProcessCommunicator::do_broadcast(void* buffer, std::size_t count, DataType type, int root,
                                         const device::Stream& stream) {
  static constexpr const char* kName = "broadcast";
  if (root < 0 || root >= size()) {
    fail_argument(kName,
                  ::gpubox::detail::concat("root ", root, " is not in this group of ", size()));
  }
  publish(kName, type, stream, buffer, buffer, count, root);
  auto& rendezvous = group_->rendezvous_;
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/true);
  if (same_shape_everywhere(kName) && rank_ != root) {
    copy_bytes(buffer, group_->slots_[static_cast<std::size_t>(root)].send, count * size_of(type));
  }
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/false);
}

void InProcessCommunicator::do_barrier(const device::Stream& stream) {
  device::detail::synchronize_uncounted(stream);
  group_->rendezvous_.arrive_and_wait(rank_, "barrier", /*opens_data_phase=*/false);
}

void InProcessCommunicator::do_exchange_counts(const std::size_t* send_counts,
                                               std::size_t* recv_counts,
                                               const device::Stream& stream) {
  static constexpr const char* kName = "exchange_counts";
  if (send_counts == nullptr || recv_counts == nullptr) {
    fail_argument(kName, "null count array");
  }
  auto& mine = publish(kName, DataType::kUInt64, stream, nullptr, nullptr, /*count=*/0, /*root=*/0);
  mine.send_counts = send_counts;
  auto& rendezvous = group_->rendezvous_;
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/true);
  for (int p = 0; p < size(); ++p) {
    recv_counts[p] = group_->slots_[static_cast<std::size_t>(p)].send_counts[rank_];
  }
  rendezvous.arrive_and_wait(rank_, kName, /*opens_data_phase=*/false);
}

void InProcessCommunicator::do_synchronize(const device::Stream& stream, const char* what) {
  device::detail::synchronize_uncounted(stream);
  throw_if_aborted(what);
}

void InProcessCommunicator::do_wait_for(const device::Event& event, const char* what,
                                        OnAbort on_abort, device::HostWait counted_as) {
  event.synchronize(counted_as);
  if (on_abort == OnAbort::kFail) throw_if_aborted(what);
}

void InProcessCommunicator::throw_if_aborted(const char* what) const {
  if (group_->aborted()) {
    const std::string reason = group_->rendezvous_.reason();
    GPUBOX_GROUP_ABORTED(reason, "communicator aborted (rank ", rank_, " waiting for ", what,
                         " after ", last_collective(), "): ", reason);
  }
}

}  // namespace gpubox::comm
