#include "heterps/comm/communicator.hpp"

#include <numeric>
#include <vector>

#include "common/error_report.hpp"
#include "heterps/comm/in_process_communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/memory_registry.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include "heterps/comm/nccl_communicator.hpp"
#else
#include "heterps/comm/gloo_communicator.hpp"
#endif

namespace gpubox::comm {

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return sizeof(float);
    case DataType::kFloat64:
      return sizeof(double);
    case DataType::kInt32:
      return sizeof(int32_t);
    case DataType::kInt64:
      return sizeof(int64_t);
    case DataType::kUInt64:
      return sizeof(uint64_t);
    case DataType::kUInt8:
      return sizeof(uint8_t);
  }
  GPUBOX_FAIL("unknown communicator data type ", static_cast<int>(type));
}

const char* name_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUInt64:
      return "uint64";
    case DataType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

// ---- the portable part of every communicator --------------------------------------------

template <class Move>
void Communicator::run(const char* collective, bool blocking, const device::Stream& stream,
                       Move&& move) {
  // A blocking collective waits for the peers and the card: no captured step holds one.
  if (blocking) device::detail::refuse_while_capturing(collective, &stream);
  last_collective_ = collective;
  if (device::CardCounters* counters = stream.counters()) {
    counters->add_collective(collective, blocking);
    if (blocking) counters->add_host_sync();
  }
  // Now (after the stream's deferred work, GPUBOX_DEVICE_CHECK=defer: the group meets on the
  // calling threads), or at every replay of the step graph capturing the stream (cpu backend):
  // `move` holds copies of its operands, and the step context is the one of the step that runs it.
  device::enqueue_in_order(stream, collective, [this, collective, move] {
    last_collective_ = collective;
    in_step_context(move);
  });
}

template <class Move>
void Communicator::in_step_context(const Move& move) {
  if (pass_ < 0) {
    move();
    return;
  }
  try {
    move();
  } catch (const Error& e) {
    throw_with_context(::gpubox::detail::concat("pass ", pass_, ", step ", step_, ": "), e);
  }
}

void Communicator::check_buffer(const char* collective, const char* role, const void* ptr,
                                std::size_t elements, DataType type,
                                const device::Stream& stream) const {
  if (!device::device_check_enabled() || elements == 0) return;
  // An unknown type is the implementation's to report (before any rank copies).
  if (static_cast<int>(type) < 0 || static_cast<int>(type) > static_cast<int>(DataType::kUInt8)) {
    return;
  }
  device::check_card_range(ptr, elements * size_of(type), stream.device(), collective, role);
}

void Communicator::all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                                  const device::Stream& stream) {
  static constexpr const char* kName = "all_reduce_sum";
  check_buffer(kName, "send buffer", send, count, type, stream);
  check_buffer(kName, "recv buffer", recv, count, type, stream);
  run(kName, false, stream, [this, send, recv, count, type, &stream] {
    do_all_reduce_sum(send, recv, count, type, stream);
  });
}

void Communicator::all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                                const std::size_t* recv_counts, DataType type,
                                const device::Stream& stream) {
  static constexpr const char* kName = "all_to_all_v";
  if (send_counts != nullptr && recv_counts != nullptr) {
    const std::size_t n = static_cast<std::size_t>(size());
    check_buffer(kName, "send buffer", send,
                 std::accumulate(send_counts, send_counts + n, std::size_t{0}), type, stream);
    check_buffer(kName, "recv buffer", recv,
                 std::accumulate(recv_counts, recv_counts + n, std::size_t{0}), type, stream);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  if (stream.capturing() != nullptr && send_counts != nullptr && recv_counts != nullptr) {
    // Captured, the counts are the capture's (as NCCL's captured sends and receives keep them):
    // the host arrays may change before a replay.
    const std::size_t n = static_cast<std::size_t>(size());
    std::vector<std::size_t> counts(send_counts, send_counts + n);
    counts.insert(counts.end(), recv_counts, recv_counts + n);
    run(kName, false, stream, [this, send, recv, type, &stream, n, counts = std::move(counts)] {
      do_all_to_all_v(send, counts.data(), recv, counts.data() + n, type, stream);
    });
    return;
  }
#endif
  run(kName, false, stream, [this, send, send_counts, recv, recv_counts, type, &stream] {
    do_all_to_all_v(send, send_counts, recv, recv_counts, type, stream);
  });
}

void Communicator::all_gather(const void* send, void* recv, std::size_t count, DataType type,
                              const device::Stream& stream) {
  static constexpr const char* kName = "all_gather";
  check_buffer(kName, "send buffer", send, count, type, stream);
  check_buffer(kName, "recv buffer", recv, count * static_cast<std::size_t>(size()), type, stream);
  run(kName, false, stream,
      [this, send, recv, count, type, &stream] { do_all_gather(send, recv, count, type, stream); });
}

void Communicator::broadcast(void* buffer, std::size_t count, DataType type, int root,
                             const device::Stream& stream) {
  static constexpr const char* kName = "broadcast";
  check_buffer(kName, "buffer", buffer, count, type, stream);
  run(kName, false, stream, [this, buffer, count, type, root, &stream] {
    do_broadcast(buffer, count, type, root, stream);
  });
}

void Communicator::barrier(const device::Stream& stream) {
  run("barrier", true, stream, [this, &stream] { do_barrier(stream); });
}

void Communicator::exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                                   const device::Stream& stream) {
  run("exchange_counts", true, stream, [this, send_counts, recv_counts, &stream] {
    do_exchange_counts(send_counts, recv_counts, stream);
  });
}

void Communicator::synchronize(const device::Stream& stream, const char* what) {
  device::detail::refuse_while_capturing("Communicator::synchronize (a host wait)", &stream);
  if (device::CardCounters* counters = stream.counters()) counters->add_host_sync();
  in_step_context([&] { do_synchronize(stream, what); });
}

void Communicator::wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                            device::HostWait counted_as) {
  device::detail::refuse_while_capturing("Communicator::wait_for (a host wait)");
  in_step_context([&] { do_wait_for(event, what, on_abort, counted_as); });
}

// ---- groups --------------------------------------------------------------------------------

std::unique_ptr<CommGroup> make_in_process_group(int ranks, std::chrono::milliseconds timeout) {
  return std::make_unique<InProcessGroup>(ranks, timeout);
}

std::unique_ptr<CommGroup> make_group(device::CardSet& cards, std::chrono::milliseconds timeout,
                                      RendezvousStore* store, const std::string& host,
                                      const PeerFailure& peer_failure) {
  const bool one_process = cards.total_cards() == cards.num_local_cards();
#if defined(GPUBOX_BACKEND_CUDA)
  (void)host;  // NCCL finds its own interfaces (NCCL_SOCKET_IFNAME)
  (void)peer_failure;
  return std::make_unique<NcclGroup>(cards, timeout, one_process ? nullptr : store);
#else
  if (one_process) return make_in_process_group(cards.num_local_cards(), timeout);
  GPUBOX_EXPECTS(store != nullptr, "a communicator over ", cards.total_cards(),
                 " cards of several trainers (", cards.num_local_cards(),
                 " here) needs a rendezvous store: set GPUBOX_RENDEZVOUS=file:///shared/dir");
  return std::make_unique<GlooGroup>(cards, *store, timeout, host, peer_failure);
#endif
}

}  // namespace gpubox::comm
