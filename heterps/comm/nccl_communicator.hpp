// NCCL communicator for the GPUs of one trainer (cuda backend only). One ncclComm_t per local
// GPU from ncclCommInitAll; each card's thread drives its own communicator. Collectives are
// enqueued on the caller's stream and return without waiting, except barrier and
// exchange_counts, which wait for the stream (polling, so a wait longer than the group's timeout
// or an abort from another thread ends it with an error instead of a hang).
//
// abort() calls ncclCommAbort on every communicator; later collectives throw. A rank polling
// in a wait cannot touch a communicator while it is being aborted (a shared lock guards the
// poll). Known limit (NCCL's own): aborting while another thread is inside an NCCL enqueue call
// on the same communicator is a race; enqueues are not locked because with a dead peer an
// enqueue may block, and abort must still get through.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "heterps/comm/communicator.hpp"
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

  void all_reduce_sum(const void* send, void* recv, std::size_t count, DataType type,
                      const device::Stream& stream) override;
  void all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                    const std::size_t* recv_counts, DataType type,
                    const device::Stream& stream) override;
  void all_gather(const void* send, void* recv, std::size_t count, DataType type,
                  const device::Stream& stream) override;
  void broadcast(void* buffer, std::size_t count, DataType type, int root,
                 const device::Stream& stream) override;
  void barrier(const device::Stream& stream) override;
  void exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                       const device::Stream& stream) override;

  using Communicator::all_gather;
  using Communicator::all_reduce_sum;
  using Communicator::all_to_all_v;
  using Communicator::broadcast;

 private:
  // Throws when the group was aborted (its communicators are gone).
  void check_alive(const char* collective) const;
  // Waits for `stream`, watching for an abort, an NCCL async error and the group's timeout.
  void wait(const device::Stream& stream, const char* collective);

  NcclGroup* group_;
  int rank_;
  ncclComm_t comm_;
  device::device_buffer<int32_t> barrier_word_;    // 1 element
  device::device_buffer<uint64_t> counts_device_;  // size() x size() count matrix
  device::pinned_buffer<uint64_t> counts_host_;    // its host copy
};

class NcclGroup final : public CommGroup {
 public:
  // The cards must outlive the group. Only a single trainer (all ranks local) is supported.
  NcclGroup(device::CardSet& cards, std::chrono::milliseconds timeout);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const override { return static_cast<int>(comms_.size()); }
  Communicator& at(int local_rank) override;
  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Thread-safe against abort(): false when the group is aborted (`comm` is gone); else sets
  // `error` to comm's asynchronous error (ncclSuccess when none).
  bool poll_async_error(ncclComm_t comm, ncclResult_t* error);

 private:
  const std::chrono::milliseconds timeout_;
  std::vector<ncclComm_t> comms_;
  std::vector<std::unique_ptr<NcclCommunicator>> ranks_;
  mutable std::mutex mu_;
  std::string reason_;          // GUARDED_BY(mu_)
  bool abort_started_ = false;  // GUARDED_BY(mu_)
  std::shared_mutex comms_mu_;  // exclusive while aborting the communicators
  std::atomic<bool> aborted_{false};
};

}  // namespace gpubox::comm
