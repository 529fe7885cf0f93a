#include "trainer/engine/step_sizes.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/instance_block.hpp"
#include "dataset/parallel.hpp"

namespace gpubox::trainer {
namespace {

std::size_t largest(const std::vector<uint32_t>& values, std::size_t first, std::size_t count) {
  uint32_t out = 0;
  for (std::size_t i = first; i < first + count; ++i) out = std::max(out, values[i]);
  return out;
}

// One batch's sizes from its `n` key occurrences, handed over in runs by for_each_run(visit)
// calling visit(keys, count): its occurrences, distinct keys and, when `owners` is not null,
// distinct keys per owner card (`total_cards` counts, added to).
template <class ForEachRun>
void count_batch(std::size_t n, ForEachRun&& for_each_run, detail::DistinctKeys* distinct,
                 uint32_t* occurrences, uint32_t* unique, uint32_t* owners, int total_cards) {
  GPUBOX_EXPECTS(n <= UINT32_MAX, "a batch of ", n, " key occurrences");
  *occurrences = static_cast<uint32_t>(n);
  distinct->reset(n);
  uint32_t count = 0;
  for_each_run([&](const uint64_t* keys, std::size_t run) {
    for (std::size_t i = 0; i < run; ++i) {
      if (!distinct->insert(keys[i])) continue;
      ++count;
      if (owners != nullptr) ++owners[owner_card(keys[i], total_cards)];
    }
  });
  *unique = count;
}

// One batch's sizes into `sizes` at `at`, its keys read where the data set stores them;
// `distinct` is the worker's reused table.
void size_batch(const dataset::InMemoryDataset& data, const dataset::BatchSpan& span,
                std::size_t at, PassStepSizes* sizes, detail::DistinctKeys* distinct) {
  std::size_t n = 0;
  data.visit_key_runs(span.begin, span.end, [&n](const uint64_t*, std::size_t run) { n += run; });
  uint32_t* owners = sizes->per_owner ? sizes->owner_counts.data() +
                                            at * static_cast<std::size_t>(sizes->total_cards)
                                      : nullptr;
  count_batch(
      n, [&](auto&& visit) { data.visit_key_runs(span.begin, span.end, visit); }, distinct,
      &sizes->occurrences[at], &sizes->unique[at], owners, sizes->total_cards);
}

}  // namespace

namespace detail {
void DistinctKeys::reset(std::size_t n) {
  std::size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  if (capacity > keys_.size()) {
    keys_.assign(capacity, 0);
    stamps_.assign(capacity, 0);
    stamp_ = 0;
  }
  mask_ = capacity - 1;
  if (++stamp_ == 0) {  // 2^32 batches on one table: old stamps could read as this batch's
    std::fill(stamps_.begin(), stamps_.end(), 0u);
    stamp_ = 1;
  }
}

bool DistinctKeys::insert(uint64_t key) {
  for (uint64_t slot = mix64(key) & mask_;; slot = (slot + 1) & mask_) {
    if (stamps_[slot] != stamp_) {
      stamps_[slot] = stamp_;
      keys_[slot] = key;
      return true;
    }
    if (keys_[slot] == key) return false;
  }
}
}  // namespace detail

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
    detail::DistinctKeys distinct;
    for (std::size_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) {
      const int card = static_cast<int>(item / sizes.batches);
      const std::size_t b = item % sizes.batches;
      size_batch(data, dataset::batch_span_of(data.size(), batch_size, card, local_cards, b), item,
                 &sizes, &distinct);
    }
  });
  return sizes;
}

namespace {
bool same_blocks(const std::vector<std::weak_ptr<const dataset::InstanceBlock>>& kept,
                 const std::vector<dataset::SharedInstanceBlock>& blocks) {
  if (kept.size() != blocks.size()) return false;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    // The same control block: the same block (a kept weak reference keeps it from reuse).
    if (kept[b].owner_before(blocks[b]) || blocks[b].owner_before(kept[b])) return false;
  }
  return true;
}

bool same_shape(const PassStepSizes& sizes, std::size_t batch_size, int local_cards, int first_rank,
                int total_cards, bool per_owner) {
  return sizes.batch_size == batch_size && sizes.local_cards == local_cards &&
         sizes.first_rank == first_rank && sizes.total_cards == total_cards &&
         sizes.per_owner == per_owner;
}
}  // namespace

std::shared_ptr<const PassStepSizes> StepPlanMemo::find(const dataset::InMemoryDataset& data,
                                                        std::size_t batch_size, int local_cards,
                                                        int first_rank, int total_cards,
                                                        bool per_owner) const {
  for (const Kept& kept : kept_) {
    if (same_blocks(kept.blocks, data.blocks()) &&
        same_shape(*kept.sizes, batch_size, local_cards, first_rank, total_cards, per_owner)) {
      return kept.sizes;
    }
  }
  return nullptr;
}

std::shared_ptr<const PassStepSizes> StepPlanMemo::plan(const dataset::InMemoryDataset& data,
                                                        std::size_t batch_size, int local_cards,
                                                        int first_rank, int total_cards,
                                                        bool per_owner, int threads) {
  // Only a plan whose every block something else holds too (the pass cache, a memory source) can
  // be served again: a data set's private blocks (a load without the cache, a store in the
  // shuffled order) go with it. Checked first: no order scan nor plan kept for those.
  const std::vector<dataset::SharedInstanceBlock>& blocks = data.blocks();
  const bool keepable =
      std::all_of(blocks.begin(), blocks.end(),
                  [](const dataset::SharedInstanceBlock& b) { return b.use_count() > 1; }) &&
      data.in_block_order();
  if (keepable) {
    MutexLock lock(mu_);
    if (auto kept = find(data, batch_size, local_cards, first_rank, total_cards, per_owner)) {
      ++served_;
      return kept;
    }
  }
  auto sizes = std::make_shared<const PassStepSizes>(
      plan_step_sizes(data, batch_size, local_cards, first_rank, total_cards, per_owner, threads));
  if (keepable) {
    Kept kept{{blocks.begin(), blocks.end()}, sizes};
    MutexLock lock(mu_);
    kept_.erase(std::remove_if(kept_.begin(), kept_.end(),
                               [](const Kept& k) {
                                 return std::any_of(k.blocks.begin(), k.blocks.end(),
                                                    [](const auto& b) { return b.expired(); });
                               }),
                kept_.end());
    // Another plan of the same planned meanwhile (concurrent misses): kept once.
    if (find(data, batch_size, local_cards, first_rank, total_cards, per_owner) == nullptr) {
      kept_.push_back(std::move(kept));
    }
  }
  return sizes;
}

std::size_t StepPlanMemo::served() const {
  MutexLock lock(mu_);
  return served_;
}

std::size_t StepPlanMemo::kept() const {
  MutexLock lock(mu_);
  return kept_.size();
}

PassStepSizer::PassStepSizer(std::size_t batch_size, int local_cards, int first_rank,
                             int total_cards, bool per_owner) {
  GPUBOX_EXPECTS(local_cards >= 1 && total_cards >= local_cards && batch_size >= 1,
                 "PassStepSizer: ", local_cards, " local cards of ", total_cards, ", batch ",
                 batch_size);
  sizes_.local_cards = local_cards;
  sizes_.first_rank = first_rank;
  sizes_.total_cards = total_cards;
  sizes_.per_owner = per_owner;
  sizes_.batch_size = batch_size;
}

void PassStepSizer::add(const dataset::InstanceBlock& chunk) {
  const std::size_t round = sizes_.batch_size * static_cast<std::size_t>(sizes_.local_cards);
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    const uint64_t* keys = chunk.keys.data() + chunk.key_begin[i];
    round_keys_.insert(round_keys_.end(), keys, chunk.keys.data() + chunk.key_begin[i + 1]);
    round_end_.push_back(round_keys_.size());
    ++seen_;
    if (round_end_.size() == round) size_round();
  }
}

void PassStepSizer::size_round() {
  const auto cards = static_cast<std::size_t>(sizes_.local_cards);
  const auto total = static_cast<std::size_t>(sizes_.total_cards);
  const std::size_t round_begin = seen_ - round_end_.size();
  occurrences_.resize((rounds_ + 1) * cards, 0);
  unique_.resize((rounds_ + 1) * cards, 0);
  if (sizes_.per_owner) owner_counts_.resize((rounds_ + 1) * cards * total, 0);
  for (std::size_t c = 0; c < cards; ++c) {
    // As if the pass ended with this round: a full round splits the same either way.
    const dataset::BatchSpan span = dataset::batch_span_of(
        seen_, sizes_.batch_size, static_cast<int>(c), sizes_.local_cards, rounds_);
    const std::size_t first = span.begin - round_begin;
    const std::size_t begin = first == 0 ? 0 : round_end_[first - 1];
    const std::size_t end = span.size() == 0 ? begin : round_end_[span.end - round_begin - 1];
    const std::size_t at = rounds_ * cards + c;
    const uint64_t* keys = round_keys_.data() + begin;
    count_batch(
        end - begin, [&](auto&& visit) { visit(keys, end - begin); }, &distinct_, &occurrences_[at],
        &unique_[at], sizes_.per_owner ? owner_counts_.data() + at * total : nullptr,
        sizes_.total_cards);
  }
  ++rounds_;
  round_keys_.clear();
  round_end_.clear();
}

PassStepSizes PassStepSizer::finish() {
  if (!round_end_.empty()) size_round();  // the short last round
  PassStepSizes sizes = std::move(sizes_);
  const auto cards = static_cast<std::size_t>(sizes.local_cards);
  const auto total = static_cast<std::size_t>(sizes.total_cards);
  sizes.batches = rounds_;
  GPUBOX_EXPECTS(rounds_ == dataset::batches_per_card(seen_, sizes.batch_size, sizes.local_cards),
                 "PassStepSizer: ", rounds_, " rounds for ", seen_, " instances");
  // Round-major to PassStepSizes' card-major order.
  sizes.occurrences.assign(cards * rounds_, 0);
  sizes.unique.assign(cards * rounds_, 0);
  if (sizes.per_owner) sizes.owner_counts.assign(cards * rounds_ * total, 0);
  for (std::size_t r = 0; r < rounds_; ++r) {
    for (std::size_t c = 0; c < cards; ++c) {
      const std::size_t from = r * cards + c;
      const std::size_t to = sizes.index(static_cast<int>(c), r);
      sizes.occurrences[to] = occurrences_[from];
      sizes.unique[to] = unique_[from];
      if (sizes.per_owner) {
        std::copy_n(owner_counts_.data() + from * total, total,
                    sizes.owner_counts.data() + to * total);
      }
    }
  }
  return sizes;
}

}  // namespace gpubox::trainer
