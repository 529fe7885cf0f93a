// PassStepSizes: every size of a pass's steps, computed on the host from the pass's data before
// its first step (issue 31, item 1). With them every card and pinned buffer of a step is sized
// once, for the pass's largest batch, at the pass's start: no step allocates, frees or regrows a
// pinned buffer (cudaMallocHost / cudaFreeHost synchronize the device while a peer's collective
// may wait for this card: the pinned-free vs NCCL deadlock).
//
// Per card and batch (the tail policy of dataset::batch_span_of): the key occurrences, the
// distinct keys and, for sharded placement, how many of those each owner card gets
// (owner_card(key, total_cards), what HeterComm's OwnerPlan computes on the card). The
// trainer's cards then agree on the job-wide maxima (agree_step_bounds in trainer.cpp): what
// an owner receives in a step depends on every card's batch.
//
// Cost: one sort of each batch's keys on the host, spread over `threads`; in the pass pipeline
// (runner.prefetch_passes) it runs in the background with the pass's reading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpubox {
namespace dataset {
class InMemoryDataset;
}
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

}  // namespace trainer
}  // namespace gpubox
