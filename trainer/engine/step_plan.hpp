// StepPlan: the steps of a pass as every card of the job agrees on them, with the largest step
// each card runs (from the pass's PassStepSizes), and the helpers the trainer's step loops share.
// Private to trainer/engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dataset/batch.hpp"
#include "dataset/dataset_types.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "trainer/engine/step_sizes.hpp"

namespace gpubox {
namespace comm {
class Communicator;
}
namespace dataset {
class InMemoryDataset;
class QueueDataset;
}  // namespace dataset
namespace device {
class Card;
}
namespace trainer {

class CardWorker;

// The steps of a pass, agreed by every card of every trainer (collective over `comm`): as many
// as the trainer with the most batches has (a card past its own batches trains empty ones,
// still joining every collective), each step's instances over every card of the job (the
// dense gradients' scale), and, from the pass's step sizes when the data gave them, the largest
// step this card runs: what it receives as an owner depends on every card's batch.
struct StepPlan {
  std::size_t local_batches = 0;      // this trainer's batches per card
  std::vector<int64_t> global_batch;  // per step: instances over every card of the job
  bool sized = false;                 // `largest` holds the pass's largest step
  heter_comm::StepBounds largest;
  int64_t last_instances = 0;  // this card's last batch (0: it has none)
  // When sized: every card's distinct keys per owner (replicated: per card) in each step,
  // [step][src][dst] with `count_row` dst entries (HeterComm::plan_next_step's matrix).
  std::vector<uint64_t> counts;
  std::size_t count_row = 0;
  std::size_t steps() const { return global_batch.size(); }
  // Step `b`'s count matrix and its row width, or no counts when the pass has no step sizes.
  heter_comm::PlannedCounts counts_of(std::size_t b) const {
    if (counts.empty()) return {};
    return {counts.data() + b * counts.size() / steps(), count_row};
  }
};

// `sizes`: the pass's (null: none, e.g. a stream); every card of the job passes them or none does
// (the same reader on every trainer): the agreement's all-reduce length depends on it.
StepPlan agree_step_plan(std::size_t instances, std::size_t batch, int cards, device::Card& card,
                         comm::Communicator& comm, const PassStepSizes* sizes = nullptr);

// Sizes `worker`'s step buffers for the largest step of `plan` (nothing when the pass has no
// step sizes): before the pass's first step, so no step allocates.
void reserve_steps(CardWorker& worker, const StepPlan& plan, std::size_t batch,
                   const dataset::DatasetConfig& config);

// Batch `b` of this card: the dataset's (held, or the stream's next) while it has one, else an
// empty batch.
void fill_step_batch(const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                     const StepPlan& plan, int card, int cards, std::size_t b,
                     const dataset::DatasetConfig& config, dataset::Batch* batch);

}  // namespace trainer
}  // namespace gpubox
