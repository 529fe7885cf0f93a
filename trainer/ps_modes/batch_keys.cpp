#include "trainer/ps_modes/batch_keys.hpp"

#include <algorithm>

#include "common/hash.hpp"

namespace gpubox::trainer::ps_modes {

std::size_t BatchKeys::find_slot(uint64_t key) const {
  std::size_t slot = fmix64(key) & mask_;
  while (index_[slot] != kEmpty && keys_[index_[slot]] != key) slot = (slot + 1) & mask_;
  return slot;
}

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
  growth.reserve(&key_start_, occurrences + 1);
  growth.reserve(&by_key_, occurrences);
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
  growth.resize(&occurrence_index_, occurrences);
  keys_.clear();
  slots_.clear();
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
      }
      occurrence_index_[j] = index_[slot];
    }
  }
  group_by_key(growth);
}

void BatchKeys::group_by_key(BufferGrowth& growth) {
  const std::size_t occurrences = occurrence_index_.size();
  growth.resize(&key_start_, keys_.size() + 1);
  growth.resize(&by_key_, occurrences);
  std::fill(key_start_.begin(), key_start_.end(), 0u);
  for (const uint32_t u : occurrence_index_) ++key_start_[u + 1];
  for (std::size_t u = 0; u < keys_.size(); ++u) key_start_[u + 1] += key_start_[u];
  for (std::size_t j = 0; j < occurrences; ++j) {  // in batch order within each key
    by_key_[key_start_[occurrence_index_[j]]++] = static_cast<uint32_t>(j);
  }
  // Placing moved each key's start to the next key's: back by one key.
  for (std::size_t u = keys_.size(); u > 0; --u) key_start_[u] = key_start_[u - 1];
  key_start_[0] = 0;
}

}  // namespace gpubox::trainer::ps_modes
