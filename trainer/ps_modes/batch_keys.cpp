#include "trainer/ps_modes/batch_keys.hpp"

#include <algorithm>

#include "common/hash.hpp"
#include "heterps/heter_comm/segment_order.hpp"

namespace gpubox::trainer::ps_modes {

std::size_t BatchKeys::find_slot(uint64_t key) const {
  std::size_t slot = fmix64(key) & mask_;
  while (index_[slot] != kEmpty && keys_[index_[slot]] != key) slot = (slot + 1) & mask_;
  return slot;
}

namespace {

// A batch of `occurrences` keys has at most this many hot ones.
std::size_t max_hot_keys(std::size_t occurrences) {
  return occurrences / (heter_comm::kReduceChunk + 1);
}

}  // namespace

std::size_t BatchKeys::index_entries(std::size_t occurrences) {
  std::size_t entries = 16;
  while (entries < 2 * occurrences) entries *= 2;
  return entries;
}

void BatchKeys::reserve(std::size_t occurrences, BufferGrowth& growth) {
  growth.reserve(&index_, index_entries(occurrences));
  growth.reserve(&keys_, occurrences);
  growth.reserve(&slots_, occurrences);
  growth.reserve(&occurrence_index_, occurrences);
  growth.reserve(&cursor_, occurrences);
  growth.reserve(&hot_keys_, max_hot_keys(occurrences));
  growth.reserve(&hot_start_, max_hot_keys(occurrences) + 1);
  growth.reserve(&hot_occurrences_, occurrences);
}

void BatchKeys::gather(const dataset::Batch& batch, const std::vector<int32_t>& slot_ids,
                       BufferGrowth& growth) {
  const std::size_t occurrences = batch.keys.size();
  const std::size_t entries = index_entries(occurrences);
  growth.resize(&index_, entries);
  std::fill(index_.begin(), index_.end(), kEmpty);
  mask_ = entries - 1;
  growth.reserve(&keys_, occurrences);
  growth.reserve(&slots_, occurrences);
  growth.reserve(&cursor_, occurrences);
  growth.resize(&occurrence_index_, occurrences);
  keys_.clear();
  slots_.clear();
  cursor_.clear();
  const std::size_t b = batch.size();
  for (int s = 0; s < batch.num_slots; ++s) {
    const uint32_t first = batch.offsets[static_cast<std::size_t>(s) * b];
    const uint32_t last = batch.offsets[static_cast<std::size_t>(s + 1) * b];
    for (uint32_t j = first; j < last; ++j) {
      const uint64_t key = batch.keys[j];
      const std::size_t slot = find_slot(key);
      if (index_[slot] == kEmpty) {
        index_[slot] = static_cast<uint32_t>(keys_.size());
        keys_.push_back(key);  // within the reserved capacity
        slots_.push_back(slot_ids.at(static_cast<std::size_t>(s)));
        cursor_.push_back(0);
      }
      occurrence_index_[j] = index_[slot];
      ++cursor_[index_[slot]];
    }
  }
  group_hot_keys(growth);
}

void BatchKeys::group_hot_keys(BufferGrowth& growth) {
  const std::size_t occurrences = occurrence_index_.size();
  growth.reserve(&hot_keys_, max_hot_keys(occurrences));
  growth.reserve(&hot_start_, max_hot_keys(occurrences) + 1);
  hot_keys_.clear();
  hot_start_.assign(1, 0u);  // within the reserved capacity
  for (std::size_t u = 0; u < keys_.size(); ++u) {
    const uint32_t count = cursor_[u];
    if (count <= heter_comm::kReduceChunk) {
      cursor_[u] = kEmpty;
      continue;
    }
    cursor_[u] = hot_start_.back();
    hot_keys_.push_back(static_cast<uint32_t>(u));
    hot_start_.push_back(hot_start_.back() + count);
  }
  growth.resize(&hot_occurrences_, hot_start_.back());
  if (hot_keys_.empty()) return;                   // the common case: no second pass
  for (std::size_t j = 0; j < occurrences; ++j) {  // in batch order within each key
    uint32_t& next = cursor_[occurrence_index_[j]];
    if (next != kEmpty) hot_occurrences_[next++] = static_cast<uint32_t>(j);
  }
}

void merge_by_key(const BatchKeys& keys, const float* push, int32_t push_dim, float* merged) {
  const auto dim = static_cast<std::size_t>(push_dim);
  // Every key left to right in batch order from -0 (the additive identity of every bit, as the
  // card's sums start): the card's bits for a key of at most kReduceChunk occurrences.
  std::fill(merged, merged + keys.size() * dim, -0.0f);
  const std::vector<uint32_t>& index = keys.occurrence_index();
  for (std::size_t j = 0; j < index.size(); ++j) {
    float* into = merged + std::size_t{index[j]} * dim;
    const float* from = push + j * dim;
    for (std::size_t f = 0; f < dim; ++f) into[f] += from[f];
  }
  // A hot key's again, in chunks (segment_order.hpp).
  const heter_comm::OrderedRecords<float> records{push, keys.hot_occurrences().data(), push_dim};
  for (std::size_t h = 0; h < keys.hot_keys().size(); ++h) {
    heter_comm::sum_segment_row(records, keys.hot_start()[h], keys.hot_start()[h + 1], push_dim,
                                merged + std::size_t{keys.hot_keys()[h]} * dim);
  }
}

}  // namespace gpubox::trainer::ps_modes
