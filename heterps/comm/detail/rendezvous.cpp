#include "heterps/comm/detail/rendezvous.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "common/group_aborted.hpp"
#include "heterps/device/card.hpp"

namespace gpubox::comm::detail {
namespace {

// How long a rank spins on the generation counter before sleeping on the condition variable:
// about what a futex wake-up costs, so spinning never loses more than a sleep would (and a peer
// needing this core on a busy machine is not kept off it for long).
constexpr auto kSpinFor = std::chrono::microseconds(10);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

Rendezvous::Rendezvous(int ranks, std::chrono::milliseconds timeout)
    : ranks_(ranks),
      timeout_(timeout),
      spin_(ranks > 1 && ranks <= device::hardware_threads()),
      waiting_(static_cast<std::size_t>(ranks > 0 ? ranks : 0), 0),
      rank_in_data_phase_(static_cast<std::size_t>(ranks > 0 ? ranks : 0), 0) {
  GPUBOX_EXPECTS(ranks >= 1, "a communicator group needs at least one rank, got ", ranks);
  GPUBOX_EXPECTS(timeout.count() > 0, "communicator timeout must be positive, got ",
                 timeout.count(), " ms");
}

void Rendezvous::arrive_and_wait(int rank, const char* collective, bool opens_data_phase) {
  MutexLock lock(mu_);
  if (rank_in_data_phase_[rank]) {
    rank_in_data_phase_[rank] = 0;
    if (--in_data_phase_ == 0 && aborted_.load(std::memory_order_relaxed)) cv_.notify_all();
  }
  if (aborted_.load(std::memory_order_relaxed)) fail_locked(lock, rank, collective);

  if (round_collective_ == nullptr) {
    round_collective_ = collective;
  } else if (std::strcmp(round_collective_, collective) != 0) {
    abort_locked(::gpubox::detail::concat("collective mismatch: rank ", rank, " called ",
                                          collective, " while other ranks are in ",
                                          round_collective_));
    fail_locked(lock, rank, collective);
  }

  if (++arrived_ == ranks_) {
    arrived_ = 0;
    round_collective_ = nullptr;
    std::fill(waiting_.begin(), waiting_.end(), 0);
    if (opens_data_phase) {
      std::fill(rank_in_data_phase_.begin(), rank_in_data_phase_.end(), 1);
      in_data_phase_ = ranks_;
    }
    generation_.fetch_add(1, std::memory_order_release);
    lock.unlock();
    cv_.notify_all();
    return;
  }

  waiting_[rank] = 1;
  const uint64_t my_generation = generation_.load(std::memory_order_relaxed);
  if (spin_) {
    lock.unlock();
    const auto spin_until = std::chrono::steady_clock::now() + kSpinFor;
    for (unsigned i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != my_generation) return;
      if (aborted_.load(std::memory_order_acquire)) break;
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
    }
    lock.lock();
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (generation_.load(std::memory_order_relaxed) == my_generation &&
         !aborted_.load(std::memory_order_relaxed)) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        generation_.load(std::memory_order_relaxed) == my_generation &&
        !aborted_.load(std::memory_order_relaxed)) {
      abort_locked(::gpubox::detail::concat(
          collective, " timed out: rank ", rank, " waited ", timeout_.count(), " ms; rank(s) ",
          missing_ranks_locked(), " of ", ranks_, " had not arrived"));
    }
  }
  // A completed round wins over a later abort: the data phase must run so that every rank
  // reaches the next arrival, where the abort is reported after the drain.
  if (generation_.load(std::memory_order_relaxed) != my_generation) return;
  fail_locked(lock, rank, collective);
}

void Rendezvous::abort(const std::string& reason) {
  {
    MutexLock lock(mu_);
    abort_locked(reason);
  }
  cv_.notify_all();
}

std::string Rendezvous::reason() const {
  MutexLock lock(mu_);
  return reason_;
}

void Rendezvous::abort_locked(const std::string& reason) {
  if (aborted_.load(std::memory_order_relaxed)) return;
  reason_ = reason.empty() ? std::string("(no reason given)") : reason;
  aborted_.store(true, std::memory_order_release);
  cv_.notify_all();
}

void Rendezvous::fail_locked(MutexLock& lock, int rank, const char* collective) {
  // A rank still in the data phase is copying (never blocked), so this wait is bounded.
  if (rank_in_data_phase_[rank]) {
    rank_in_data_phase_[rank] = 0;
    if (--in_data_phase_ == 0) cv_.notify_all();
  }
  while (in_data_phase_ != 0) cv_.wait(lock);
  GPUBOX_GROUP_ABORTED(reason_, "communicator aborted (rank ", rank, " in ", collective,
                       "): ", reason_);
}

std::string Rendezvous::missing_ranks_locked() const {
  std::string out;
  for (int r = 0; r < ranks_; ++r) {
    if (waiting_[r]) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
  }
  return out;
}

}  // namespace gpubox::comm::detail
