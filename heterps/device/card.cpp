#include "heterps/device/card.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <new>
#include <set>
#include <system_error>
#include <thread>

#include "common/error_report.hpp"
#include "common/group_aborted.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "heterps/device/card_setup.hpp"
#include "heterps/device/cuda_check.hpp"

namespace gpubox::device {

int hardware_threads() { return std::max(1, omp_get_num_procs()); }

int visible_gpus() {
#if defined(GPUBOX_BACKEND_CUDA)
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;  // no driver or no GPU
  }
  return count;
#else
  return -1;
#endif
}

void use_passive_cpu_waits(char** argv) {
  prefer_eager_module_loading();  // before CUDA initialises (card_setup.hpp)
#if !defined(GPUBOX_BACKEND_CUDA)
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  // The binary's own path, not /proc/self/exe: the kernel names a process after the file it
  // executes, and ps, top and pgrep gpubox_train would see "exe".
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    ::execv(self, argv);
  }
  // exec failed (no /proc, or the binary was replaced): carry on with the default policy.
#else
  (void)argv;
#endif
}

#if defined(GPUBOX_BACKEND_CUDA)
namespace {

cudaMemPool_t default_pool(int device) {
  cudaMemPool_t pool = nullptr;
  GPUBOX_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, device));
  return pool;
}

// Peer access (card.hpp): pool memory (cudaMallocAsync) is opened to a peer only by
// cudaMemPoolSetAccess; cudaDeviceEnablePeerAccess covers the peer's other allocations (NCCL's
// own buffers). Returns [from * n + to] = whether `from` may access `to`'s memory.
std::vector<char> grant_peer_access(const std::vector<int>& devices) {
  const std::size_t n = devices.size();
  std::vector<char> access(n * n, 0);
  for (std::size_t from = 0; from < n; ++from) {
    for (std::size_t to = 0; to < n; ++to) {
      if (from == to) {
        access[from * n + to] = 1;
        continue;
      }
      int can = 0;
      GPUBOX_CUDA_TRY(cudaDeviceCanAccessPeer(&can, devices[from], devices[to]));
      if (!can) {
        GPUBOX_LOG(WARNING) << "GPU " << devices[from] << " cannot access GPU " << devices[to]
                            << " directly (no P2P between them): NCCL will route their traffic"
                               " through host memory";
        continue;
      }
      {
        DeviceGuard guard(devices[from]);
        const cudaError_t enabled = cudaDeviceEnablePeerAccess(devices[to], 0);
        if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();  // clear the (non-sticky) "already enabled" status
        } else {
          GPUBOX_CUDA_TRY(enabled);
        }
      }
      cudaMemAccessDesc desc{};
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = devices[from];
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      GPUBOX_CUDA_TRY(cudaMemPoolSetAccess(default_pool(devices[to]), &desc, 1));
      access[from * n + to] = 1;
    }
  }
  return access;
}

}  // namespace
#endif

Card::Card(int local_index, int device, int rank, int threads)
    : local_index_(local_index),
      device_(device),
      rank_(rank),
      threads_(std::max(1, threads)),
      memory_(device, &counters_),
      stream_(device, &counters_),
      copy_stream_(device, &counters_, StreamRole::kCopy),
      scratch_(memory_, stream_) {
  stream_.bind_scratch(&scratch_);
#if defined(GPUBOX_BACKEND_CUDA)
  // Rule 3: the pool keeps what it once held, so a freed-and-reallocated buffer never goes back
  // to the driver (the default threshold 0 returns memory at every synchronization).
  uint64_t keep_everything = UINT64_MAX;
  GPUBOX_CUDA_TRY(cudaMemPoolSetAttribute(default_pool(device), cudaMemPoolAttrReleaseThreshold,
                                          &keep_everything));
#endif
}

Card::~Card() {
  // The thread that destroys a card forgets it (card threads have ended: run_on_cards joins).
  if (thread_pinned_counters() == &counters_) set_thread_pinned_counters(nullptr);
}

void Card::activate() const {
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaSetDevice(device_));
#endif
  omp_set_num_threads(threads_);
  set_thread_pinned_counters(&counters_);
}

void Card::prewarm_pool(std::size_t bytes) {
#if defined(GPUBOX_BACKEND_CUDA)
  DeviceGuard guard(device_);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  GPUBOX_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  bytes = std::min(bytes, free_bytes / 10 * 9);  // leave room for NCCL, cuBLAS and the context
  if (bytes == 0) return;
  void* block = nullptr;
  const cudaError_t err = cudaMallocAsync(&block, bytes, stream_.native());
  if (err != cudaSuccess) {
    GPUBOX_FAIL("card ", device_, ": cannot pre-warm its memory pool with ", bytes, " bytes (",
                cudaGetErrorString(err), ")");
  }
  GPUBOX_CUDA_TRY(cudaFreeAsync(block, stream_.native()));
  detail::synchronize_uncounted(stream_);
#else
  (void)bytes;
#endif
}

bool CardSet::peer_access(int from, int to) const {
  const int n = num_local_cards();
  GPUBOX_EXPECTS(from >= 0 && from < n && to >= 0 && to < n, "peer_access(", from, ", ", to,
                 ") outside this set of ", n, " cards");
  return peer_access_[static_cast<std::size_t>(from * n + to)] != 0;
}

CardSet CardSet::from_list(std::string_view card_list, int trainer_id, int trainer_count,
                           int threads_override, std::string_view source) {
  prefer_eager_module_loading();  // no effect once CUDA is up; main's call came first
  GPUBOX_EXPECTS(trainer_count >= 1 && trainer_id >= 0 && trainer_id < trainer_count, "trainer id ",
                 trainer_id, " is not in [0, ", trainer_count, ")");
  std::vector<int> devices;
  std::set<int> seen;
  std::size_t start = 0;
  while (start <= card_list.size()) {
    std::size_t end = card_list.find(',', start);
    if (end == std::string_view::npos) end = card_list.size();
    std::string entry(card_list.substr(start, end - start));
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    GPUBOX_EXPECTS(!entry.empty(), "card list (", source, ") '", card_list, "' has an empty entry");
    std::size_t used = 0;
    int device = -1;
    try {
      device = std::stoi(entry, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    GPUBOX_EXPECTS(used == entry.size() && device >= 0, "card list (", source, ") '", card_list,
                   "': '", entry, "' is not a card number");
    GPUBOX_EXPECTS(seen.insert(device).second, "card list (", source, ") '", card_list,
                   "' names card ", device, " twice");
    devices.push_back(device);
    start = end + 1;
  }
#if defined(GPUBOX_BACKEND_CUDA)
  int available = 0;
  GPUBOX_CUDA_TRY(cudaGetDeviceCount(&available));
  for (int device : devices) {
    GPUBOX_EXPECTS(device < available, "card list (", source, ") '", card_list, "' names GPU ",
                   device, " but this machine has ", available);
  }
  const int threads = 1;
#else
  const int threads = threads_override > 0
                          ? threads_override
                          : std::max(1, hardware_threads() / static_cast<int>(devices.size()));
#endif
  CardSet set;
  set.trainer_id_ = trainer_id;
  set.trainer_count_ = trainer_count;
  const int local = static_cast<int>(devices.size());
  for (int i = 0; i < local; ++i) {
    set.cards_.push_back(std::make_unique<Card>(i, devices[i], trainer_id * local + i, threads));
  }
#if defined(GPUBOX_BACKEND_CUDA)
  set.peer_access_ = grant_peer_access(devices);  // before any collective can run
#else
  set.peer_access_.assign(devices.size() * devices.size(), 1);
#endif
  return set;
}

namespace {

// A card's failure in run_on_cards, from what its thread threw (a std::exception: the thread
// catches nothing else). `reasons`: what each card (by local index) told on_failure as it failed
// ("" when it told nothing); an abort of the communicator group whose reason is another card's
// (the group aborted because that card failed) is told, whatever its words.
CardsFailed::Failure failure_of(int rank, std::size_t local, const std::exception_ptr& failed,
                                const std::vector<std::string>& reasons) {
  try {
    std::rethrow_exception(failed);
  } catch (const GroupAborted& e) {
    bool told = false;
    for (std::size_t c = 0; c < reasons.size(); ++c) {
      told = told || (c != local && !reasons[c].empty() && reasons[c] == e.reason());
    }
    return {rank, user_message(e), told};
  } catch (const FailureTold& e) {
    return {rank, user_message(e), /*told=*/true};
  } catch (const std::exception& e) {
    return {rank, user_message(e), /*told=*/false};
  }
}

// Tells on_failure, from a card's thread, that the card failed: peers blocked in a collective
// wait for it. What it told is left in `told` (the card's own slot). Building the message (and
// on_failure's copies of it) allocates, and can fail, most likely when the card threw bad_alloc;
// then a short literal that fits a std::string without allocating is told instead, so on_failure
// still runs and no bad_alloc escapes the thread (an exception escaping a std::thread is
// std::terminate).
void tell_failure(const std::function<void(const std::string&)>& on_failure, int rank,
                  const std::exception& e, std::string& told) {
  static const char* const kOutOfMemory = "out of memory";
  try {
    told = "card " + std::to_string(rank) + ": " + user_message(e);
  } catch (...) {
    told = kOutOfMemory;
  }
  try {
    on_failure(told);
  } catch (const std::bad_alloc&) {
    told = kOutOfMemory;
    on_failure(told);
  }
}

}  // namespace

void CardSet::run_on_cards(const std::function<void(Card&)>& fn,
                           const std::function<void(const std::string&)>& on_failure) {
  Mutex mu;
  std::exception_ptr first_error;
  int first_card = -1;
  // Each card's error, by local index (null when it did not fail); written by that card's
  // thread, read after the join. Kept as it was thrown (copying the pointer allocates nothing):
  // the messages are made after the join; on_failure's is made by tell_failure, which falls
  // back to a literal when it cannot allocate, so nothing escapes the thread.
  std::vector<std::exception_ptr> failed(cards_.size());
  // What each card told on_failure as it failed (its own slot, as `failed`): the reason of the
  // group's abort when it was the first to fail.
  std::vector<std::string> told(cards_.size());
  auto body = [&](Card& card) {
    try {
      card.activate();
      fn(card);
    } catch (const std::exception& e) {
      failed[static_cast<std::size_t>(card.local_index())] = std::current_exception();
      {
        MutexLock lock(mu);
        if (!first_error) {
          first_error = std::current_exception();
          first_card = card.local_index();
        }
      }
      if (on_failure) {
        tell_failure(on_failure, card.rank(), e,
                     told[static_cast<std::size_t>(card.local_index())]);
      }
    }
  };
  if (cards_.size() == 1) {
    body(*cards_[0]);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(cards_.size());
    try {
      for (auto& card : cards_) {
        if (thread_start_fault_) thread_start_fault_(card->local_index());
        threads.emplace_back(body, std::ref(*card));
      }
    } catch (const std::system_error& e) {
      // The next card's thread did not start: that is the card's failure. The started cards
      // may wait for it in a collective, so on_failure wakes them before the join; the cards
      // after it never run.
      const std::size_t c = threads.size();
      failed[c] = std::current_exception();
      {
        MutexLock lock(mu);
        if (!first_error) {
          first_error = failed[c];
          first_card = static_cast<int>(c);
        }
      }
      if (on_failure) tell_failure(on_failure, cards_[c]->rank(), e, told[c]);
    }
    for (auto& t : threads) t.join();
  }
  if (!first_error) return;
  std::vector<CardsFailed::Failure> failures;
  for (std::size_t c = 0; c < cards_.size(); ++c) {
    if (failed[c]) failures.push_back(failure_of(cards_[c]->rank(), c, failed[c], told));
  }
  const std::string card = "card " + std::to_string(cards_[first_card]->rank()) + ": ";
  try {
    std::rethrow_exception(first_error);
  } catch (const Error& e) {
    throw CardsFailed(with_context(card, e), std::move(failures));
  } catch (const std::bad_alloc&) {
    throw;  // as it is: the binaries name what the config asked for (OutOfMemory names the card)
  } catch (const std::exception& e) {
    throw CardsFailed(Error(card + e.what()), std::move(failures));
  }
}

}  // namespace gpubox::device
