#include "trainer/engine/step_sizes.hpp"

#include <algorithm>
#include <atomic>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/parallel.hpp"

namespace gpubox::trainer {
namespace {

std::size_t largest(const std::vector<uint32_t>& values, std::size_t first, std::size_t count) {
  uint32_t out = 0;
  for (std::size_t i = first; i < first + count; ++i) out = std::max(out, values[i]);
  return out;
}

// One batch's sizes into `sizes` at `at`; `keys` is the worker's reused buffer.
void size_batch(const dataset::InMemoryDataset& data, const dataset::BatchSpan& span,
                std::size_t at, PassStepSizes* sizes, std::vector<uint64_t>* keys) {
  keys->clear();
  for (std::size_t i = span.begin; i < span.end; ++i) {
    const dataset::InstanceRef ref = data.instance(i);
    keys->insert(keys->end(), ref.keys, ref.keys + ref.num_keys());
  }
  GPUBOX_EXPECTS(keys->size() <= UINT32_MAX, "a batch of ", keys->size(), " key occurrences");
  sizes->occurrences[at] = static_cast<uint32_t>(keys->size());
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
  sizes->unique[at] = static_cast<uint32_t>(keys->size());
  if (!sizes->per_owner) return;
  uint32_t* owners = sizes->owner_counts.data() + at * static_cast<std::size_t>(sizes->total_cards);
  for (uint64_t key : *keys) ++owners[owner_card(key, sizes->total_cards)];
}

}  // namespace

std::size_t PassStepSizes::max_occurrences(int card) const {
  return largest(occurrences, index(card, 0), batches);
}

std::size_t PassStepSizes::max_unique(int card) const {
  return largest(unique, index(card, 0), batches);
}

PassStepSizes plan_step_sizes(const dataset::InMemoryDataset& data, std::size_t batch_size,
                              int local_cards, int first_rank, int total_cards, bool per_owner,
                              int threads) {
  GPUBOX_EXPECTS(local_cards >= 1 && total_cards >= local_cards && batch_size >= 1,
                 "plan_step_sizes: ", local_cards, " local cards of ", total_cards, ", batch ",
                 batch_size);
  PassStepSizes sizes;
  sizes.local_cards = local_cards;
  sizes.first_rank = first_rank;
  sizes.total_cards = total_cards;
  sizes.per_owner = per_owner;
  sizes.batch_size = batch_size;
  sizes.batches = dataset::batches_per_card(data.size(), batch_size, local_cards);
  const std::size_t items = static_cast<std::size_t>(local_cards) * sizes.batches;
  sizes.occurrences.assign(items, 0);
  sizes.unique.assign(items, 0);
  if (per_owner) sizes.owner_counts.assign(items * static_cast<std::size_t>(total_cards), 0);
  // Batches handed out in order to the workers as they free up; each writes only its own
  // entries.
  std::atomic<std::size_t> next{0};
  const int workers = static_cast<int>(
      std::clamp<std::size_t>(items, 1, static_cast<std::size_t>(std::max(1, threads))));
  dataset::run_workers(workers, [&](int) {
    std::vector<uint64_t> keys;
    for (std::size_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) {
      const int card = static_cast<int>(item / sizes.batches);
      const std::size_t b = item % sizes.batches;
      size_batch(data, dataset::batch_span_of(data.size(), batch_size, card, local_cards, b), item,
                 &sizes, &keys);
    }
  });
  return sizes;
}

}  // namespace gpubox::trainer
