// PassStepSizes: every size of a pass's steps, computed on the host from the pass's data before
// its first step (issue 31, item 1). With them every card and pinned buffer of a step is sized
// once, for the pass's largest batch, at the pass's start: no step allocates, frees or regrows a
// pinned buffer (cudaMallocHost / cudaFreeHost synchronize the device while a peer's collective
// may wait for this card: the pinned-free vs NCCL deadlock).
//
// Per card and batch (the tail policy of dataset::batch_span_of): the key occurrences, the
// distinct keys and, for sharded placement, how many of those each owner card gets
// (owner_card(key, total_cards), what HeterComm's KeyDedup computes on the card). The
// trainer's cards then agree on the job-wide maxima (agree_step_plan in step_plan.cpp): what
// an owner receives in a step depends on every card's batch.
//
// Cost: one pass over each batch's keys on the host (a hash set of its distinct keys), spread
// over `threads`; in the pass pipeline
// (runner.prefetch_passes) it runs in the background with the pass's reading. A streamed pass
// (QueueDataset) is sized the same way while it is read for its keys (PassStepSizer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/thread_annotations.hpp"

namespace gpubox {
namespace dataset {
class InMemoryDataset;
struct InstanceBlock;
}  // namespace dataset
namespace trainer {

struct PassStepSizes {
  int local_cards = 0;
  int first_rank = 0;   // global rank of local card 0
  int total_cards = 0;  // of the job
  bool per_owner = false;
  std::size_t batch_size = 0;
  std::size_t batches = 0;  // per local card (dataset::batches_per_card)
  // [card * batches + b]: batch b of local card `card`.
  std::vector<uint32_t> occurrences;
  std::vector<uint32_t> unique;
  // [(card * batches + b) * total_cards + owner]: distinct keys of that batch owned by `owner`
  // (global rank); per_owner only.
  std::vector<uint32_t> owner_counts;

  std::size_t index(int card, std::size_t b) const {
    return static_cast<std::size_t>(card) * batches + b;
  }
  // This local card's largest batch: its key occurrences and distinct keys.
  std::size_t max_occurrences(int card) const;
  std::size_t max_unique(int card) const;
};

// The sizes of every batch of `data` (batches of `batch_size` over `local_cards` cards, global
// ranks first_rank.. of `total_cards`); per-owner counts when `per_owner` (sharded placement).
PassStepSizes plan_step_sizes(const dataset::InMemoryDataset& data, std::size_t batch_size,
                              int local_cards, int first_rank, int total_cards, bool per_owner,
                              int threads);

// plan_step_sizes' plans kept to be served again: each epoch's plan of a pass, or of the test
// data, that the pass data cache serves without a shuffle (the very same instances in the same
// order, so the same plan). A plan is served only to a data set holding the same blocks (held
// weakly: a block freed never matches, even at its address reused), read in sequence
// (InMemoryDataset::in_block_order), for the same batch size and cards. A plan is kept only when
// every block is held by something else too (the pass cache, a memory source; a data set's own
// blocks, a load without the cache or a store in the shuffled order, are never seen again), and
// while its blocks live. Thread-safe.
class StepPlanMemo {
 public:
  // plan_step_sizes(data, ...), or the plan kept for the same.
  std::shared_ptr<const PassStepSizes> plan(const dataset::InMemoryDataset& data,
                                            std::size_t batch_size, int local_cards, int first_rank,
                                            int total_cards, bool per_owner, int threads)
      GPUBOX_EXCLUDES(mu_);
  // Plans served kept (not computed).
  std::size_t served() const GPUBOX_EXCLUDES(mu_);
  // Plans kept (those whose blocks were freed are dropped at the next plan kept).
  std::size_t kept() const GPUBOX_EXCLUDES(mu_);

 private:
  struct Kept {
    std::vector<std::weak_ptr<const dataset::InstanceBlock>> blocks;
    std::shared_ptr<const PassStepSizes> sizes;
  };
  // The plan kept for the same, or null.
  std::shared_ptr<const PassStepSizes> find(const dataset::InMemoryDataset& data,
                                            std::size_t batch_size, int local_cards, int first_rank,
                                            int total_cards, bool per_owner) const
      GPUBOX_REQUIRES(mu_);
  mutable Mutex mu_;
  std::vector<Kept> kept_ GPUBOX_GUARDED_BY(mu_);
  std::size_t served_ GPUBOX_GUARDED_BY(mu_) = 0;
};

// The same sizes for instances seen once, in order, in chunks (a QueueDataset's scan): what
// plan_step_sizes gives for the same instances held in memory without a shuffle. Holds one round
// (batch_size x local_cards instances) of keys at a time: a round is sized when it is full (a
// full round splits card by card the same whether or not it is the last), the short last round
// at finish() (batch_span_of's tail policy). Cost: one pass over each batch's keys on the calling
// thread. Not thread-safe.
namespace detail {
// Each distinct key of a batch counted once, by open addressing (load at most 1/2) in tables
// reused from batch to batch: a sort of each batch's keys was most of the plan's cost. A slot
// belongs to the current batch when its stamp is the batch's, so starting a batch clears nothing.
class DistinctKeys {
 public:
  // Starts a batch of at most `n` keys.
  void reset(std::size_t n);
  // True the first time `key` is offered since reset().
  bool insert(uint64_t key);

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> stamps_;
  uint64_t mask_ = 0;
  uint32_t stamp_ = 0;
};
}  // namespace detail

class PassStepSizer {
 public:
  PassStepSizer(std::size_t batch_size, int local_cards, int first_rank, int total_cards,
                bool per_owner);
  // The next instances of the pass, in order.
  void add(const dataset::InstanceBlock& chunk);
  // The sizes of every instance added; the sizer is spent.
  PassStepSizes finish();

 private:
  // Sizes the buffered round (round `rounds_`, its instances the last of `seen_` so far).
  void size_round();

  PassStepSizes sizes_;  // the plan's parameters; the per-batch vectors are filled by finish()
  std::size_t seen_ = 0;
  std::size_t rounds_ = 0;
  std::vector<uint64_t> round_keys_;    // the buffered round's key occurrences, in order
  std::vector<std::size_t> round_end_;  // per buffered instance: its keys' end in round_keys_
  detail::DistinctKeys distinct_;
  // Round-major while reading: [round * local_cards + card] (owner counts: x total_cards).
  std::vector<uint32_t> occurrences_;
  std::vector<uint32_t> unique_;
  std::vector<uint32_t> owner_counts_;
};

}  // namespace trainer
}  // namespace gpubox
