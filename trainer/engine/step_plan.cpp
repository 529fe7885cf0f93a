#include "trainer/engine/step_plan.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/engine/card_worker.hpp"

namespace gpubox::trainer {
namespace {

// Per step, this card's contribution to what every card learns: [instances, then the distinct
// keys it sends each owner (sharded) or its distinct keys (replicated)]. Summed over the job.
std::vector<int64_t> step_words(const PassStepSizes* sizes, const StepPlan& plan, int64_t steps,
                                std::size_t width, std::size_t instances, std::size_t batch,
                                int card, int cards) {
  std::vector<int64_t> words(static_cast<std::size_t>(steps) * width, 0);
  for (std::size_t b = 0; b < plan.local_batches; ++b) {
    int64_t* row = words.data() + b * width;
    row[0] = static_cast<int64_t>(dataset::batch_span_of(instances, batch, card, cards, b).size());
    if (sizes == nullptr) continue;
    const std::size_t at = sizes->index(card, b);
    if (!sizes->per_owner) {
      row[1] = sizes->unique[at];
      continue;
    }
    const auto total = static_cast<std::size_t>(sizes->total_cards);
    for (std::size_t o = 0; o < total; ++o) row[1 + o] = sizes->owner_counts[at * total + o];
  }
  return words;
}

// Every card's per-owner rows of every step (this card's are in `words` after the step's
// instances; `width` words a step), all-gathered into plan->counts as [step][src][dst].
void gather_step_counts(const std::vector<int64_t>& words, std::size_t width, device::Card& card,
                        comm::Communicator& comm, StepPlan* plan) {
  const std::size_t steps = plan->steps();
  const std::size_t row = width - 1;
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  std::vector<uint64_t> mine(steps * row);
  for (std::size_t b = 0; b < steps; ++b) {
    for (std::size_t d = 0; d < row; ++d) {
      mine[b * row + d] = static_cast<uint64_t>(words[b * width + 1 + d]);
    }
  }
  const device::Stream& stream = card.stream();
  auto send = device::to_device(mine, card.memory(), stream);
  auto all = card.make_buffer<uint64_t>(ranks * steps * row);
  comm.all_gather(send.data(), all.data(), steps * row, stream);
  comm.synchronize(stream, "the pass's key counts per step");
  const std::vector<uint64_t> gathered = device::to_host(all);  // [src][step][dst]
  plan->count_row = row;
  plan->counts.assign(steps * ranks * row, 0);
  for (std::size_t src = 0; src < ranks; ++src) {
    for (std::size_t b = 0; b < steps; ++b) {
      std::copy_n(gathered.data() + (src * steps + b) * row, row,
                  plan->counts.data() + (b * ranks + src) * row);
    }
  }
}

}  // namespace

StepPlan agree_step_plan(std::size_t instances, std::size_t batch, int cards, device::Card& card,
                         comm::Communicator& comm, const PassStepSizes* sizes) {
  const device::Stream& stream = card.stream();
  const int c = card.local_index();
  StepPlan plan;
  plan.local_batches = dataset::batches_per_card(instances, batch, cards);
  if (plan.local_batches > 0) {
    plan.last_instances = static_cast<int64_t>(
        dataset::batch_span_of(instances, batch, c, cards, plan.local_batches - 1).size());
  }
  if (sizes != nullptr) {
    GPUBOX_EXPECTS(sizes->batches == plan.local_batches && sizes->local_cards == cards &&
                       sizes->total_cards == comm.size(),
                   "the pass's step sizes were planned for ", sizes->batches, " batches on ",
                   sizes->local_cards, " of ", sizes->total_cards, " cards, not ",
                   plan.local_batches, " on ", cards, " of ", comm.size());
  }
  // Every card's batch count and largest distinct-key count (0 without sizes).
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  auto counts = card.make_buffer<int64_t>(2 * ranks);
  const int64_t my_unique = sizes != nullptr ? static_cast<int64_t>(sizes->max_unique(c)) : 0;
  auto mine =
      device::to_device(std::vector<int64_t>{static_cast<int64_t>(plan.local_batches), my_unique},
                        card.memory(), stream);
  comm.all_gather(mine.data(), counts.data(), 2, stream);
  comm.synchronize(stream, "the pass's batch counts");
  int64_t steps = 0;
  int64_t block = 0;
  const std::vector<int64_t> gathered = device::to_host(counts);
  for (std::size_t r = 0; r < ranks; ++r) {
    steps = std::max(steps, gathered[2 * r]);
    block = std::max(block, gathered[2 * r + 1]);
  }
  // Every card has sizes or none does (the same reader on every trainer, runner.reader_type):
  // the all-reduce's length depends on it.
  const std::size_t width = 1 + (sizes == nullptr ? 0 : sizes->per_owner ? ranks : 1);
  const std::vector<int64_t> local =
      step_words(sizes, plan, steps, width, instances, batch, c, cards);
  auto global = device::to_device(local, card.memory(), stream);
  comm.all_reduce_sum(global.data(), global.data(), global.size(), stream);
  comm.synchronize(stream, "the pass's step sizes");
  const std::vector<int64_t> words = device::to_host(global);
  plan.global_batch.resize(static_cast<std::size_t>(steps));
  const std::size_t received_at = sizes != nullptr && sizes->per_owner ? 1 + comm.rank() : 1;
  for (std::size_t b = 0; b < plan.global_batch.size(); ++b) {
    plan.global_batch[b] = words[b * width];
    if (width > 1) {
      plan.largest.received =
          std::max(plan.largest.received, static_cast<std::size_t>(words[b * width + received_at]));
    }
  }
  if (sizes != nullptr) {
    gather_step_counts(local, width, card, comm, &plan);
    plan.sized = true;
    // The largest count any card sends any one card in a step (sharded: an owner; replicated:
    // every card, its distinct keys), the same on every card: the padded steps' block
    // (HeterComm::plan_next_step).
    for (uint64_t count : plan.counts) {
      plan.largest.pair_block = std::max(plan.largest.pair_block, static_cast<std::size_t>(count));
    }
    plan.largest.occurrences = sizes->max_occurrences(c);
    plan.largest.unique = static_cast<std::size_t>(my_unique);
    plan.largest.block = static_cast<std::size_t>(block);
  }
  return plan;
}

void reserve_steps(CardWorker& worker, const StepPlan& plan, std::size_t batch,
                   const dataset::DatasetConfig& config) {
  if (!plan.sized) return;
  StepReservation largest;
  largest.instances = static_cast<int64_t>(batch);
  largest.slots = static_cast<int>(config.slots.size());
  largest.dense_dim = config.dense_dim;
  largest.keys = plan.largest;
  if (plan.last_instances != largest.instances)
    largest.other_instances.push_back(plan.last_instances);
  if (plan.steps() > plan.local_batches && plan.last_instances != 0) {
    largest.other_instances.push_back(0);  // the steps past this card's batches
  }
  worker.reserve_steps(largest);
}

void fill_step_batch(const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                     const StepPlan& plan, int card, int cards, std::size_t b,
                     const dataset::DatasetConfig& config, dataset::Batch* batch) {
  if (b >= plan.local_batches) {
    dataset::assemble_batch(nullptr, 0, static_cast<int>(config.slots.size()), config.dense_dim,
                            batch);
  } else if (stream != nullptr) {
    GPUBOX_EXPECTS(stream->next_batch(card, batch), "the pass's stream ended at batch ", b, " of ",
                   plan.local_batches);
  } else {
    ds->fill_batch(card, cards, b, batch);
  }
}

}  // namespace gpubox::trainer
