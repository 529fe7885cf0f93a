// Cards: one execution context each (its own memory, its own stream, one driving host thread).
// A CardSet is built from a card list such as FLAGS_selected_gpus="0,1,2,3". On the cpu backend
// those are simulated cards sharing the machine's cores: each card's thread runs its parallel
// work on hardware_threads / cards OpenMP threads, so 4 cards on 2 cores never run 8 threads.
//
// Device rules. Several cards driven by threads of one process, with NCCL kernels that wait for
// peer cards, deadlock or crawl when host code breaks these; the device layer counts each
// (counters.hpp, per card, the same on both backends) and the tests pin the counts:
//  1. No card allocation between a collective's enqueue and the card's next synchronization.
//     Size every buffer a step needs before its first collective (device_buffer::reserve,
//     ScratchArena::reserve). Why: an allocation that falls through the pool to the driver can
//     take a lock or synchronize the device while a peer's kernel waits for this card. Counted
//     as DeviceCounts::window_allocations; fatal under GPUBOX_DEVICE_CHECK=1.
//  2. Every per-step readback lands in a pinned_buffer and every per-step upload leaves from
//     one, never a std::vector (to_host/to_device are for setup and tests): a pageable copy is
//     staged through a driver buffer under a lock that a peer's allocation may wait for, and it
//     blocks the calling thread. Counted as pageable_copies (0 per training step).
//  3. Each card's memory pool keeps what it once held (cudaMemPoolAttrReleaseThreshold =
//     UINT64_MAX, set when the Card is made) and is pre-warmed (Card::prewarm_pool), so a
//     steady-state cudaMallocAsync never reaches the driver; in steady state a step allocates
//     nothing at all (allocations per step: 0).
//  4. Every Thrust call runs on the card's scratch arena (device::exec_policy): no per-call
//     cudaMalloc/cudaFree, which synchronize the device.
//  5. Device selection is explicit and scoped: a card's thread is bound once (Card::activate);
//     library code switches devices only under a DeviceGuard, and destructors free on the
//     owning device, whatever thread runs them.
//  6. A wait that follows a collective is bounded and abort-aware: Communicator::synchronize
//     (the group's timeout), never a bare Stream::synchronize in the step flow.
// Peer access: when a CardSet of several GPUs is made, every pair that cudaDeviceCanAccessPeer
// allows gets peer access to the other's pool memory (cudaMemPoolSetAccess; pool memory is not
// opened by cudaDeviceEnablePeerAccess alone), so NCCL's direct P2P paths work on
// cudaMallocAsync buffers; the pairs that cannot are logged (NCCL then takes its host path).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/scratch_arena.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

class Card {
 public:
  // `local_index`: position in this process's card list; `device`: CUDA ordinal (or the
  // simulated card's number); `rank`: global index among all trainers' cards. CUDA: sets the
  // device's pool release threshold to the maximum (rule 3).
  Card(int local_index, int device, int rank, int threads);
  ~Card();
  Card(const Card&) = delete;
  Card& operator=(const Card&) = delete;

  int local_index() const { return local_index_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  // Host threads this card's parallel work may use (cpu backend); 1 on CUDA.
  int threads() const { return threads_; }
  const Stream& stream() const { return stream_; }
  // The card's copy stream: host<->card copies that overlap the compute stream's work (the next
  // batch's upload while a step runs). Ordered against stream() by events only (Stream::wait):
  // the compute stream waits for a copy's event before reading what it wrote, and the copy
  // stream waits for the compute stream's event before overwriting what a step still reads.
  const Stream& copy_stream() const { return copy_stream_; }
  CardMemory& memory() { return memory_; }
  // Thrust temporaries of every call on this card's stream (bound to it).
  ScratchArena& scratch() { return scratch_; }
  // What host code has asked of this card so far (counters.hpp).
  const CardCounters& counters() const { return counters_; }
  DeviceCounts counts() const { return counters_.snapshot(); }

  // Rule 3: has the card's memory pool take `bytes` (at most 90% of the card's free memory)
  // from the driver now and keep them, so the first steps' allocations are served from the
  // pool. Synchronizes the card (setup only; not counted). No-op on cpu.
  void prewarm_pool(std::size_t bytes);
  // Binds the calling host thread to this card: cudaSetDevice on CUDA, the OpenMP thread count
  // on cpu; the thread's pinned allocations count on this card from now on
  // (set_thread_pinned_counters). Call once at the top of the card's thread (run_on_cards does
  // it).
  void activate() const;

  template <class T>
  device_buffer<T> make_buffer(std::size_t count) {
    return device_buffer<T>(count, memory_, stream_);
  }

 private:
  int local_index_;
  int device_;
  int rank_;
  int threads_;
  // First: memory and stream count into it. Mutable: activate() (const) hands it to the thread
  // for its pinned allocations; counting is not part of the card's state.
  mutable CardCounters counters_;
  CardMemory memory_;
  Stream stream_;
  Stream copy_stream_;
  ScratchArena scratch_;  // after memory_ and stream_, which it uses
};

// What CardSet::run_on_cards throws when cards failed: the first card's error (its message
// prefixed with the card, its location kept) with every card that failed, in card order, so
// that a caller naming more than one cause (the trainer, beside a server restart) sees a fault
// on another card too. A card failed because of another (a FailureTold; a GroupAborted for
// another card's failure) is listed marked so (told): the caller decides what to leave out.
class CardsFailed : public Error {
 public:
  struct Failure {
    int rank = 0;         // the card's global rank
    std::string message;  // its error's user message, without the card
    bool told = false;    // failed because of another failure (run_on_cards says which)
  };
  CardsFailed(const Error& first, std::vector<Failure> failures)
      : Error(first), failures_(std::move(failures)) {}
  const std::vector<Failure>& failures() const { return failures_; }

 private:
  std::vector<Failure> failures_;
};

class CardSet {
 public:
  // Parses "0,1,2,3" (duplicates, empty entries, non-numbers and, on CUDA, devices that do not
  // exist are errors naming the entry). `trainer_id`/`trainer_count`: this process's place
  // among the trainers; every trainer drives the same number of cards, so global rank =
  // trainer_id * cards + local index. `threads_override` > 0 fixes the threads per card.
  // `source`: the variable the list came from, which its errors name.
  static CardSet from_list(std::string_view card_list, int trainer_id = 0, int trainer_count = 1,
                           int threads_override = 0,
                           std::string_view source = "FLAGS_selected_gpus");

  int num_local_cards() const { return static_cast<int>(cards_.size()); }
  int total_cards() const { return num_local_cards() * trainer_count_; }
  int trainer_id() const { return trainer_id_; }
  Card& card(int local_index) { return *cards_.at(local_index); }
  const Card& card(int local_index) const { return *cards_.at(local_index); }
  // Whether local card `from` may read and write local card `to`'s memory directly (peer
  // access granted to its pool when the set was made). Always true on cpu (one host memory).
  bool peer_access(int from, int to) const;

  // Runs fn(card) on one host thread per local card (activated) and joins them. When a card
  // throws, `on_failure(message)` runs at once on that card's thread (e.g. to abort the
  // communicator so peers blocked in a collective wake up); after the join the first error is
  // thrown as a CardsFailed (every failed card listed), prefixed with the card; a
  // std::bad_alloc as it is. A card whose thread cannot start fails so (the cards after it do
  // not run; on_failure wakes those started).
  void run_on_cards(const std::function<void(Card&)>& fn,
                    const std::function<void(const std::string&)>& on_failure = {});
  // For tests: called (with the card's local index) before each card's thread of run_on_cards
  // starts; what it throws (a std::system_error) stands for a thread that cannot start.
  void set_thread_start_fault(std::function<void(int)> fault) {
    thread_start_fault_ = std::move(fault);
  }

 private:
  std::function<void(int)> thread_start_fault_;
  int trainer_id_ = 0;
  int trainer_count_ = 1;
  std::vector<std::unique_ptr<Card>> cards_;
  std::vector<char> peer_access_;  // [from * cards + to]
};

// Host threads available to this process (affinity-aware).
int hardware_threads();

// GPUs this process can use (cudaGetDeviceCount) on the cuda backend; -1 on cpu, where any
// number of simulated cards can be made.
int visible_gpus();

// cpu backend: OpenMP threads that spin while waiting (libgomp's default) starve the other
// simulated cards and OpenBLAS on a shared machine (measured: a 2-thread card ran 6-16x slower).
// The wait policy is read once when libgomp loads, so a binary calls this first thing in main:
// when OMP_WAIT_POLICY is unset it sets it to passive and re-executes itself (same argv);
// otherwise, and on the cuda backend, it returns at once. A user's explicit setting wins. On
// both it first sets CUDA_MODULE_LOADING=EAGER when unset (card_setup.hpp: why).
void use_passive_cpu_waits(char** argv);

}  // namespace gpubox::device
