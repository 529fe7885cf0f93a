#include "heterps/comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/group_aborted.hpp"
#include "common/logging.hpp"
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

// The destructor's bound on ending the communicators (the collective timeout, within these).
constexpr std::chrono::milliseconds kTeardownMin{10000};
constexpr std::chrono::milliseconds kTeardownMax{60000};
// abort()'s bound on the wait until every communicator's ncclCommAbort has begun.
constexpr std::chrono::milliseconds kAbortStartBound{2000};

// A TeardownThread's end of one communicator: ncclCommDestroy after a clean finalize, else
// ncclCommAbort.
struct EndCommunicator {
  bool destroy;
  void operator()(ncclComm_t comm) const noexcept {
    if (comm == nullptr) return;  // never made, or already aborted on the aborting thread
    if (!destroy) {
      ncclCommAbort(comm);  // errors here are moot
      return;
    }
    const ncclResult_t r = ncclCommDestroy(comm);
    if (r == ncclSuccess) return;
    try {
      GPUBOX_LOG(WARNING) << "NCCL: ncclCommDestroy at shutdown: " << ncclGetErrorString(r);
    } catch (...) {  // a log line that cannot be written is dropped
    }
  }
};

// How a card thread waits: spin first (a step's waits are tens of microseconds, and a sleep
// would cost more than the wait), then yield the core, and only after a long wait (a slow peer,
// a pass boundary) sleep in short slices so an idle wait does not burn a core.
class Backoff {
 public:
  void pause() {
    const auto waited = std::chrono::steady_clock::now() - start_;
    if (waited < std::chrono::microseconds(20)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else if (waited < std::chrono::milliseconds(10)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

// ---- group ---------------------------------------------------------------------------------

NcclGroup::NcclGroup(device::CardSet& cards, std::chrono::milliseconds timeout,
                     RendezvousStore* store)
    : timeout_(timeout), total_(cards.total_cards()) {
  GPUBOX_EXPECTS(timeout.count() > 0, "communicator timeout must be positive");
  const int n = cards.num_local_cards();
  // The clique's id: made here for one trainer; across trainers made by global rank 0 and
  // read by every other process from the rendezvous store (ncclCommInitRank's out-of-band id).
  ncclUniqueId id;
  if (total_ == n) {
    GPUBOX_NCCL_TRY(ncclGetUniqueId(&id));
  } else {
    GPUBOX_EXPECTS(store != nullptr, "NCCL group of ", total_, " GPUs over several trainers (", n,
                   " here) needs a rendezvous store (GPUBOX_RENDEZVOUS)");
    constexpr const char* kIdKey = "nccl/unique_id";
    if (cards.card(0).rank() == 0) {
      GPUBOX_NCCL_TRY(ncclGetUniqueId(&id));
      store->set(kIdKey, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      const std::vector<char> shared = store->get(kIdKey, timeout_);
      GPUBOX_EXPECTS(shared.size() == sizeof(id.internal), "rendezvous key ", kIdKey, " in ",
                     store->describe(), " holds ", shared.size(), " bytes, not an NCCL unique id (",
                     sizeof(id.internal), ")");
      std::memcpy(id.internal, shared.data(), sizeof(id.internal));
    }
  }
  // NCCL's buffer registration of captured collectives (NVLS) exchanges handles with the peers
  // while capturing: a peer not capturing then would never join. A planned step is one composed
  // graph on every card (an empty batch's too), but whether a card captures it or replays it is
  // decided per card (its own allocations since, its own first step of a batch shape: a short or
  // empty last batch is a new one on that card only), and an unpadded step or GPUBOX_STEP_GRAPHS=0
  // runs its collectives eagerly. Off, unless the user set it.
  setenv("NCCL_GRAPH_REGISTER", "0", /*overwrite=*/0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  comms_.assign(static_cast<std::size_t>(n), nullptr);
  // One group over every local rank (ncclCommInitAll's recipe, with global ranks): each rank's
  // init names its device, which must be current during its call.
  ncclResult_t init = ncclGroupStart();
  for (int i = 0; i < n && (init == ncclSuccess || init == ncclInProgress); ++i) {
    device::DeviceGuard guard(cards.card(i).device());
    init = ncclCommInitRankConfig(&comms_[static_cast<std::size_t>(i)], total_, id,
                                  cards.card(i).rank(), &config);
  }
  const ncclResult_t end = ncclGroupEnd();
  std::string failure;
  if (init != ncclSuccess && init != ncclInProgress) {
    failure = ::gpubox::detail::concat("ncclCommInitRankConfig: ", ncclGetErrorString(init));
  } else if (end != ncclSuccess && end != ncclInProgress) {
    failure = ::gpubox::detail::concat("ncclGroupEnd after init: ", ncclGetErrorString(end));
  }
  // Non-blocking init: each communicator reports ncclInProgress until it is ready.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int i = 0; i < n && failure.empty(); ++i) {
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t polled =
          ncclCommGetAsyncError(comms_[static_cast<std::size_t>(i)], &state);
      if (polled != ncclSuccess) state = polled;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        failure = ::gpubox::detail::concat("initialising rank ", i, " (GPU ",
                                           cards.card(i).device(), "): ", ncclGetErrorString(state),
                                           ": ", ncclGetLastError(nullptr));
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        failure =
            ::gpubox::detail::concat("initialising rank ", i, " (GPU ", cards.card(i).device(),
                                     ") timed out after ", timeout_.count(), " ms");
        break;
      }
      backoff.pause();
    }
  }
  if (!failure.empty()) {
    abort_communicators();
    GPUBOX_FAIL("NCCL group of ", total_, " GPUs (", n, " here): ", failure);
  }
  ranks_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ranks_.push_back(
        std::make_unique<NcclCommunicator>(*this, cards.card(i).rank(), comms_[i], cards.card(i)));
  }
}

NcclGroup::~NcclGroup() {
  ranks_.clear();
  // A destructor cannot throw: what goes wrong is logged (a job that ends here has its results;
  // a communicator left unsettled is aborted so the process can exit).
  if (!teardown_) {  // not aborted (or abort() ended them on its own thread: nulls here)
    const bool destroy = !aborted() && finalize_communicators();
    // Moved in: the argument allocates nothing, and the constructor (noexcept) ends them on this
    // thread when it cannot allocate or start its own.
    teardown_.emplace(std::move(comms_), EndCommunicator{destroy});
  }
  // Bounded apart from the collective timeout: a short timeout says nothing of how long NCCL
  // takes to free a group, and a long one (minutes) should not hold a destructor that long.
  const auto bound = std::clamp<std::chrono::milliseconds>(timeout_, kTeardownMin, kTeardownMax);
  std::string aborted_what;  // empty (no allocation) until the try below fills it
  try {
    if (aborted()) {
      aborted_what = "NCCL: ncclCommAbort of the group's communicators (aborted: " + reason() + ")";
    }
  } catch (...) {  // no memory for the reason: the plain description
  }
  const char* what = !aborted_what.empty() ? aborted_what.c_str()
                     : aborted()           ? "NCCL: ncclCommAbort of the group's communicators"
                                           : "NCCL: ncclCommDestroy of the group's communicators";
  teardown_->finish(bound, what,
                    "a CUDA graph still holds one of the communicators' collectives (destroy step "
                    "graphs before their group), or NCCL's teardown is slow");
}

bool NcclGroup::finalize_communicators() noexcept {
  // Finalize every communicator first (non-blocking: it flushes and reports ncclInProgress until
  // the clique is quiescent); one that does not settle within the timeout is aborted instead of
  // destroyed.
  ncclResult_t first_error = ncclSuccess;
  for (ncclComm_t comm : comms_) {
    if (comm == nullptr) continue;
    const ncclResult_t r = ncclCommFinalize(comm);
    if (r != ncclSuccess && r != ncclInProgress && first_error == ncclSuccess) first_error = r;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  bool settled = first_error == ncclSuccess;
  for (ncclComm_t comm : comms_) {
    if (comm == nullptr) continue;
    Backoff backoff;
    ncclResult_t state = ncclInProgress;
    // Each communicator is asked at least once, also after the deadline passed.
    do {
      const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
      if (query != ncclSuccess) {
        state = query;  // the query's own failure is what to report
        break;
      }
      if (state == ncclInProgress) backoff.pause();
    } while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline);
    if (state != ncclSuccess && first_error == ncclSuccess) first_error = state;
    settled = settled && state == ncclSuccess;
  }
  if (!settled) {
    try {
      GPUBOX_LOG(WARNING) << "NCCL: the communicators did not finalize cleanly at shutdown ("
                          << (first_error == ncclInProgress
                                  ? std::string("still in progress after ") +
                                        std::to_string(timeout_.count()) + " ms"
                                  : std::string(ncclGetErrorString(first_error)))
                          << "): aborting them";
    } catch (...) {  // a log line that cannot be written is dropped
    }
  }
  return settled;
}

void NcclGroup::abort_communicators() noexcept {
  for (ncclComm_t& comm : comms_) {
    if (comm != nullptr) ncclCommAbort(comm);  // errors here are moot
    comm = nullptr;                            // freed: the destructor skips it
  }
}

Communicator& NcclGroup::at(int local_rank) {
  GPUBOX_EXPECTS(local_rank >= 0 && local_rank < size(), "rank ", local_rank,
                 " is not in this group of ", size());
  return *ranks_[static_cast<std::size_t>(local_rank)];
}

void NcclGroup::abort(const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (abort_started_) return;  // the first reason wins; the communicators are aborted once
    abort_started_ = true;
    reason_ = reason.empty() ? std::string("(no reason given)") : reason;
  }
  // New NCCL calls back off from here on; the exclusive lock waits for those in flight (each is
  // non-blocking or a poll loop that watches aborting_), so ncclCommAbort never races a call on
  // the same communicator.
  aborting_.store(true, std::memory_order_release);
  {
    const std::unique_lock<std::shared_mutex> comms_lock(comms_mu_);
    aborted_.store(true, std::memory_order_release);
  }  // released: no NCCL call starts from here on (lock_unless_aborting sees aborted_)
  // Abort every communicator so kernels waiting for a dead peer return, on a thread of its own:
  // the last ncclCommAbort waits for the step graphs that hold the communicators, which the
  // callers destroy only after this returns (see the header).
  try {
    teardown_.emplace(comms_, EndCommunicator{/*destroy=*/false});  // copies comms_: may throw
  } catch (...) {
    // No memory for the copy: aborted here (no lock is held), which may wait for step graphs
    // that the callers destroy later (see the header); unaborted, their syncs would hang.
    abort_communicators();
    return;
  }
  // The callers synchronize their streams next: wait until every communicator's abort has begun.
  if (!teardown_->wait_last_started(kAbortStartBound)) {
    const std::size_t started = teardown_->started();  // < comms_.size() here
    GPUBOX_LOG(WARNING) << "NCCL: the group's abort (" << this->reason()
                        << ") has not begun ncclCommAbort of communicator " << started << " (of "
                        << comms_.size() << ", local index) after " << kAbortStartBound.count()
                        << " ms"
                        << (started > 0 ? " (communicator " + std::to_string(started - 1) +
                                              "'s has not returned)"
                                        : std::string())
                        << "; its callers go on, and the next stream synchronize of local ranks "
                        << started << " and up may hang";
  }
}

std::shared_lock<std::shared_mutex> NcclGroup::lock_for_call(int rank, const char* collective) {
  std::shared_lock<std::shared_mutex> lock = lock_unless_aborting();
  if (!lock.owns_lock()) GPUBOX_GROUP_ABORTED(reason(), aborted_message(rank, collective));
  return lock;
}

std::shared_lock<std::shared_mutex> NcclGroup::lock_unless_aborting() {
  if (aborting()) return {};
  std::shared_lock<std::shared_mutex> lock(comms_mu_);
  if (aborted()) return {};  // raised after the check above: abort() has run
  return lock;
}

std::string NcclGroup::aborted_message(int rank, const char* collective) const {
  return ::gpubox::detail::concat("communicator aborted (rank ", rank, " in ", collective,
                                  "): ", reason());
}

std::string NcclGroup::reason() const {
  MutexLock lock(mu_);
  return reason_;
}

// ---- communicator --------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(NcclGroup& group, int rank, ncclComm_t comm, device::Card& card)
    : group_(&group),
      rank_(rank),
      comm_(comm),
      counters_(card.stream().counters()),
      barrier_word_(card.make_buffer<int32_t>(1)),
      counts_device_(card.make_buffer<uint64_t>(static_cast<std::size_t>(group.total_ranks()) *
                                                group.total_ranks())),
      counts_host_(static_cast<std::size_t>(group.total_ranks()) * group.total_ranks()) {
  device::DeviceGuard guard(card.device());  // built on the main thread
  device::memset_bytes_async(barrier_word_.data(), 0, sizeof(int32_t), card.stream());
  card.stream().synchronize();
}

int NcclCommunicator::size() const { return group_->total_ranks(); }

void NcclCommunicator::fail(const std::string& reason) {
  group_->abort(reason);
  GPUBOX_FAIL(reason);
}

template <class Call>
void NcclCommunicator::enqueue(const char* collective, Call&& call) {
  std::string failure;
  {
    std::shared_lock<std::shared_mutex> lock = group_->lock_for_call(rank_, collective);
    ncclResult_t result = call();
    // Non-blocking communicator: the call may still be enqueueing (e.g. a peer has not joined).
    const auto deadline = std::chrono::steady_clock::now() + group_->timeout();
    Backoff backoff;
    while (result == ncclInProgress) {
      if (group_->aborting()) {
        lock.unlock();
        GPUBOX_GROUP_ABORTED(group_->reason(), group_->aborted_message(rank_, collective));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        failure =
            ::gpubox::detail::concat(collective, " on rank ", rank_, " was not enqueued within ",
                                     group_->timeout().count(), " ms (a peer never called it)");
        break;
      }
      backoff.pause();
      ncclResult_t state = ncclInProgress;
      const ncclResult_t polled = ncclCommGetAsyncError(comm_, &state);
      result = polled != ncclSuccess ? polled : state;
    }
    if (failure.empty() && result != ncclSuccess) {
      failure = ::gpubox::detail::concat(collective, " on rank ", rank_, ": NCCL error ",
                                         ncclGetErrorString(result), ": ", ncclGetLastError(comm_));
    }
  }  // the shared lock is released before the abort, which takes it exclusively
  if (!failure.empty()) fail(failure);
}

template <class Ready>
void NcclCommunicator::poll_until(const char* what, const Ready& ready, OnAbort on_abort) {
  const bool fail_on_abort = on_abort == OnAbort::kFail;
  const auto deadline = std::chrono::steady_clock::now() + group_->timeout();
  Backoff backoff;
  for (unsigned i = 0;; ++i) {
    if (fail_on_abort && group_->aborting()) {
      GPUBOX_GROUP_ABORTED(group_->reason(), group_->aborted_message(rank_, what));
    }
    bool done = false;
    try {
      done = ready();  // cudaStreamQuery or cudaEventQuery: no NCCL call, no lock
    } catch (const Error&) {
      if (fail_on_abort && group_->aborting()) {
        GPUBOX_GROUP_ABORTED(group_->reason(), group_->aborted_message(rank_, what));
      }
      throw;  // a device error: the card runs nothing more
    }
    if (done) return;
    // The communicator's asynchronous error, every few polls.
    if (i % 16 == 0) {
      const std::string error = async_error(what);
      if (!error.empty()) {
        if (fail_on_abort) fail(error);
        group_->abort(error);  // the kernels return; the work queued behind them then runs
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fail(::gpubox::detail::concat(
          "rank ", rank_, " waited ", group_->timeout().count(), " ms for ", what, " after ",
          last_collective(), " (runner.collective_timeout_s): a peer card is stuck or gone"));
    }
    backoff.pause();
  }
}

std::string NcclCommunicator::async_error(const char* what) {
  // Released on return, before a caller's abort, which takes it exclusively.
  const std::shared_lock<std::shared_mutex> lock = group_->lock_unless_aborting();
  if (!lock.owns_lock()) return "";
  ncclResult_t state = ncclSuccess;
  GPUBOX_NCCL_TRY(ncclCommGetAsyncError(comm_, &state));
  if (state == ncclSuccess || state == ncclInProgress) return "";
  return ::gpubox::detail::concat("rank ", rank_, " waiting for ", what, " after ",
                                  last_collective(), ": NCCL error ", ncclGetErrorString(state),
                                  ": ", ncclGetLastError(comm_));
}

void NcclCommunicator::do_synchronize(const device::Stream& stream, const char* what) {
  poll_until(
      what, [&stream] { return stream.ready(); }, OnAbort::kFail);
}

void NcclCommunicator::do_wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                                   device::HostWait counted_as) {
  if (counters_ != nullptr) counters_->add_host_wait(counted_as);
  poll_until(
      what, [&event] { return event.ready(); }, on_abort);
}

void NcclCommunicator::do_all_reduce_sum(const void* send, void* recv, std::size_t count,
                                         DataType type, const device::Stream& stream) {
  enqueue("all_reduce_sum", [&] {
    return ncclAllReduce(send, recv, count, nccl_type(type), ncclSum, comm_, stream.native());
  });
}

void NcclCommunicator::do_all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                                       const std::size_t* recv_counts, DataType type,
                                       const device::Stream& stream) {
  GPUBOX_EXPECTS(send_counts != nullptr && recv_counts != nullptr, "all_to_all_v on rank ", rank_,
                 ": null count array");
  const std::size_t element = size_of(type);
  const ncclDataType_t nccl = nccl_type(type);
  enqueue("all_to_all_v", [&] {
    std::size_t send_offset = 0;
    std::size_t recv_offset = 0;
    // Every call between GroupStart and GroupEnd is checked, and GroupEnd always runs.
    ncclResult_t result = ncclGroupStart();
    for (int p = 0; p < size() && (result == ncclSuccess || result == ncclInProgress); ++p) {
      if (send_counts[p] > 0) {
        result = ncclSend(static_cast<const char*>(send) + send_offset * element, send_counts[p],
                          nccl, p, comm_, stream.native());
      }
      if ((result == ncclSuccess || result == ncclInProgress) && recv_counts[p] > 0) {
        result = ncclRecv(static_cast<char*>(recv) + recv_offset * element, recv_counts[p], nccl, p,
                          comm_, stream.native());
      }
      send_offset += send_counts[p];
      recv_offset += recv_counts[p];
    }
    const ncclResult_t end = ncclGroupEnd();
    return result != ncclSuccess && result != ncclInProgress ? result : end;
  });
}

void NcclCommunicator::do_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                                     const device::Stream& stream) {
  enqueue("all_gather", [&] {
    return ncclAllGather(send, recv, count, nccl_type(type), comm_, stream.native());
  });
}

void NcclCommunicator::do_broadcast(void* buffer, std::size_t count, DataType type, int root,
                                    const device::Stream& stream) {
  GPUBOX_EXPECTS(root >= 0 && root < size(), "broadcast root ", root, " is not in this group of ",
                 size());
  enqueue("broadcast", [&] {
    return ncclBroadcast(buffer, buffer, count, nccl_type(type), root, comm_, stream.native());
  });
}

void NcclCommunicator::do_barrier(const device::Stream& stream) {
  enqueue("barrier", [&] {
    return ncclAllReduce(barrier_word_.data(), barrier_word_.data(), 1, ncclInt32, ncclSum, comm_,
                         stream.native());
  });
  do_synchronize(stream, "barrier");
}

void NcclCommunicator::do_exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                                          const device::Stream& stream) {
  GPUBOX_EXPECTS(send_counts != nullptr && recv_counts != nullptr, "exchange_counts on rank ",
                 rank_, ": null count array");
  const auto n = static_cast<std::size_t>(size());
  // All-gather the count vectors in place: row r of the n x n matrix is rank r's send_counts.
  uint64_t* my_row = counts_device_.data() + static_cast<std::size_t>(rank_) * n;
  for (std::size_t p = 0; p < n; ++p) counts_host_[p] = send_counts[p];
  device::copy_async(my_row, counts_host_.data(), n, stream);
  enqueue("exchange_counts", [&] {
    return ncclAllGather(my_row, counts_device_.data(), n, ncclUint64, comm_, stream.native());
  });
  device::copy_async(counts_host_.data(), counts_device_.data(), n * n, stream);
  do_synchronize(stream, "exchange_counts");
  for (std::size_t p = 0; p < n; ++p) recv_counts[p] = counts_host_[p * n + rank_];
}

}  // namespace gpubox::comm
