// Cards: one execution context each (its own memory, its own stream, one driving host thread).
// A CardSet is built from a card list such as FLAGS_selected_gpus="0,1,2,3". On the cpu backend
// those are simulated cards sharing the machine's cores: each card's thread runs its parallel
// work on hardware_threads / cards OpenMP threads, so 4 cards on 2 cores never run 8 threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "heterps/device/memory.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

class Card {
 public:
  // `local_index`: position in this process's card list; `device`: CUDA ordinal (or the
  // simulated card's number); `rank`: global index among all trainers' cards.
  Card(int local_index, int device, int rank, int threads);
  Card(const Card&) = delete;
  Card& operator=(const Card&) = delete;

  int local_index() const { return local_index_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  // Host threads this card's parallel work may use (cpu backend); 1 on CUDA.
  int threads() const { return threads_; }
  const Stream& stream() const { return stream_; }
  CardMemory& memory() { return memory_; }

  // Binds the calling host thread to this card: cudaSetDevice on CUDA, the OpenMP thread count
  // on cpu. Call once at the top of the card's thread (run_on_cards does it).
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
  CardMemory memory_;
  Stream stream_;
};

class CardSet {
 public:
  // Parses "0,1,2,3" (duplicates, empty entries, non-numbers and, on CUDA, devices that do not
  // exist are errors naming the entry). `trainer_id`/`trainer_count`: this process's place
  // among the trainers; every trainer drives the same number of cards, so global rank =
  // trainer_id * cards + local index. `threads_override` > 0 fixes the threads per card.
  static CardSet from_list(std::string_view card_list, int trainer_id = 0, int trainer_count = 1,
                           int threads_override = 0);

  int num_local_cards() const { return static_cast<int>(cards_.size()); }
  int total_cards() const { return num_local_cards() * trainer_count_; }
  int trainer_id() const { return trainer_id_; }
  Card& card(int local_index) { return *cards_.at(local_index); }
  const Card& card(int local_index) const { return *cards_.at(local_index); }

  // Runs fn(card) on one host thread per local card (activated) and joins them. When a card
  // throws, `on_failure(message)` runs at once on that card's thread (e.g. to abort the
  // communicator so peers blocked in a collective wake up); after the join the first error is
  // rethrown, prefixed with the card.
  void run_on_cards(const std::function<void(Card&)>& fn,
                    const std::function<void(const std::string&)>& on_failure = {});

 private:
  int trainer_id_ = 0;
  int trainer_count_ = 1;
  std::vector<std::unique_ptr<Card>> cards_;
};

// Host threads available to this process (affinity-aware).
int hardware_threads();

// cpu backend: OpenMP threads that spin while waiting (libgomp's default) starve the other
// simulated cards and OpenBLAS on a shared machine (measured: a 2-thread card ran 6-16x slower).
// The wait policy is read once when libgomp loads, so a binary calls this first thing in main:
// when OMP_WAIT_POLICY is unset it sets it to passive and re-executes itself (same argv);
// otherwise, and on the cuda backend, it returns at once. A user's explicit setting wins.
void use_passive_cpu_waits(char** argv);

}  // namespace gpubox::device
