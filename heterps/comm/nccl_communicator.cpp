#include "heterps/comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>

#include <thread>

#include "common/error.hpp"
#include "heterps/comm/nccl_check.hpp"
#include "heterps/device/cuda_check.hpp"

namespace gpubox::comm {
namespace {

static_assert(sizeof(std::size_t) == sizeof(uint64_t), "counts travel as ncclUint64");

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt64:
      return ncclUint64;
    case DataType::kUInt8:
      return ncclUint8;
  }
  GPUBOX_FAIL("unknown communicator data type ", static_cast<int>(type));
}

}  // namespace

// ---- group ---------------------------------------------------------------------------------

NcclGroup::NcclGroup(device::CardSet& cards, std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  GPUBOX_EXPECTS(cards.total_cards() == cards.num_local_cards(),
                 "NCCL across trainers (ncclCommInitRank with an out-of-band unique id) is not "
                 "supported yet: ",
                 cards.total_cards(), " cards in all, ", cards.num_local_cards(), " local");
  GPUBOX_EXPECTS(timeout.count() > 0, "communicator timeout must be positive");
  const int n = cards.num_local_cards();
  std::vector<int> devices(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices[i] = cards.card(i).device();
  comms_.assign(static_cast<std::size_t>(n), nullptr);
  GPUBOX_NCCL_TRY(ncclCommInitAll(comms_.data(), n, devices.data()));
  ranks_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ranks_.push_back(std::make_unique<NcclCommunicator>(*this, i, comms_[i], cards.card(i)));
  }
}

NcclGroup::~NcclGroup() {
  ranks_.clear();
  if (aborted()) return;  // ncclCommAbort already freed them
  for (ncclComm_t comm : comms_) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
}

Communicator& NcclGroup::at(int local_rank) {
  GPUBOX_EXPECTS(local_rank >= 0 && local_rank < size(), "rank ", local_rank,
                 " is not in this group of ", size());
  return *ranks_[static_cast<std::size_t>(local_rank)];
}

void NcclGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_started_) return;  // the first reason wins; the communicators are aborted once
    abort_started_ = true;
    reason_ = reason.empty() ? std::string("(no reason given)") : reason;
  }
  std::unique_lock<std::shared_mutex> comms_lock(comms_mu_);
  aborted_.store(true, std::memory_order_release);
  // Abort every communicator so kernels waiting for a dead peer return; errors here are moot.
  for (ncclComm_t comm : comms_) {
    if (comm != nullptr) ncclCommAbort(comm);
  }
}

bool NcclGroup::poll_async_error(ncclComm_t comm, ncclResult_t* error) {
  std::shared_lock<std::shared_mutex> lock(comms_mu_);
  if (aborted()) return false;
  GPUBOX_NCCL_TRY(ncclCommGetAsyncError(comm, error));
  return true;
}

std::string NcclGroup::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

// ---- communicator --------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(NcclGroup& group, int rank, ncclComm_t comm, device::Card& card)
    : group_(&group),
      rank_(rank),
      comm_(comm),
      barrier_word_(card.make_buffer<int32_t>(1)),
      counts_device_(
          card.make_buffer<uint64_t>(static_cast<std::size_t>(group.size()) * group.size())),
      counts_host_(static_cast<std::size_t>(group.size()) * group.size()) {
  device::memset_bytes_async(barrier_word_.data(), 0, sizeof(int32_t), card.stream());
  card.stream().synchronize();
}

int NcclCommunicator::size() const { return group_->size(); }

void NcclCommunicator::check_alive(const char* collective) const {
  if (group_->aborted()) {
    GPUBOX_FAIL("communicator aborted (rank ", rank_, " in ", collective, "): ", group_->reason());
  }
}

void NcclCommunicator::wait(const device::Stream& stream, const char* collective) {
  const auto deadline = std::chrono::steady_clock::now() + group_->timeout();
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream.native());
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) GPUBOX_CUDA_TRY(state);
    ncclResult_t async_error = ncclSuccess;
    if (!group_->poll_async_error(comm_, &async_error)) check_alive(collective);  // throws
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
      const std::string reason = ::gpubox::detail::concat(
          collective, " on rank ", rank_, ": NCCL error ", ncclGetErrorString(async_error));
      group_->abort(reason);
      GPUBOX_FAIL(reason);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string reason =
          ::gpubox::detail::concat(collective, " timed out: rank ", rank_, " waited ",
                                   group_->timeout().count(), " ms for its peers");
      group_->abort(reason);
      GPUBOX_FAIL(reason);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::all_reduce_sum(const void* send, void* recv, std::size_t count,
                                      DataType type, const device::Stream& stream) {
  check_alive("all_reduce_sum");
  GPUBOX_NCCL_TRY(
      ncclAllReduce(send, recv, count, nccl_type(type), ncclSum, comm_, stream.native()));
}

void NcclCommunicator::all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                                    const std::size_t* recv_counts, DataType type,
                                    const device::Stream& stream) {
  check_alive("all_to_all_v");
  const std::size_t element = size_of(type);
  const ncclDataType_t nccl = nccl_type(type);
  std::size_t send_offset = 0;
  std::size_t recv_offset = 0;
  // Every call between GroupStart and GroupEnd is checked, and GroupEnd always runs.
  ncclResult_t result = ncclGroupStart();
  for (int p = 0; p < size() && result == ncclSuccess; ++p) {
    if (send_counts[p] > 0) {
      result = ncclSend(static_cast<const char*>(send) + send_offset * element, send_counts[p],
                        nccl, p, comm_, stream.native());
    }
    if (result == ncclSuccess && recv_counts[p] > 0) {
      result = ncclRecv(static_cast<char*>(recv) + recv_offset * element, recv_counts[p], nccl, p,
                        comm_, stream.native());
    }
    send_offset += send_counts[p];
    recv_offset += recv_counts[p];
  }
  const ncclResult_t end = ncclGroupEnd();
  GPUBOX_NCCL_TRY(result);
  GPUBOX_NCCL_TRY(end);
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, DataType type,
                                  const device::Stream& stream) {
  check_alive("all_gather");
  GPUBOX_NCCL_TRY(ncclAllGather(send, recv, count, nccl_type(type), comm_, stream.native()));
}

void NcclCommunicator::broadcast(void* buffer, std::size_t count, DataType type, int root,
                                 const device::Stream& stream) {
  check_alive("broadcast");
  GPUBOX_EXPECTS(root >= 0 && root < size(), "broadcast root ", root, " is not in this group of ",
                 size());
  GPUBOX_NCCL_TRY(
      ncclBroadcast(buffer, buffer, count, nccl_type(type), root, comm_, stream.native()));
}

void NcclCommunicator::barrier(const device::Stream& stream) {
  check_alive("barrier");
  GPUBOX_NCCL_TRY(ncclAllReduce(barrier_word_.data(), barrier_word_.data(), 1, ncclInt32, ncclSum,
                                comm_, stream.native()));
  wait(stream, "barrier");
}

void NcclCommunicator::exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                                       const device::Stream& stream) {
  check_alive("exchange_counts");
  const auto n = static_cast<std::size_t>(size());
  // All-gather the count vectors in place: row r of the n x n matrix is rank r's send_counts.
  uint64_t* my_row = counts_device_.data() + static_cast<std::size_t>(rank_) * n;
  for (std::size_t p = 0; p < n; ++p) counts_host_[p] = send_counts[p];
  device::copy_async(my_row, counts_host_.data(), n, stream);
  GPUBOX_NCCL_TRY(
      ncclAllGather(my_row, counts_device_.data(), n, ncclUint64, comm_, stream.native()));
  device::copy_async(counts_host_.data(), counts_device_.data(), n * n, stream);
  wait(stream, "exchange_counts");
  for (std::size_t p = 0; p < n; ++p) recv_counts[p] = counts_host_[p * n + rank_];
}

}  // namespace gpubox::comm
