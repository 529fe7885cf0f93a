// BatchKeys: a batch's distinct keys in order of first occurrence, the slot id each was first
// seen in, each occurrence's index among them, and the occurrences of its hot keys (more than
// heter_comm::kReduceChunk) grouped by key in batch order: what a PS step pulls, and how it
// merges the occurrences' gradients per key in the order of a card's merge (merge_by_key;
// heterps/heter_comm/segment_order.hpp). An open-addressing index over arrays reused batch after
// batch (a std::unordered_map allocated a node per distinct key every step); they grow through a
// BufferGrowth, counted.
//
// Thread-safety: one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dataset/batch.hpp"
#include "trainer/ps_modes/step_buffers.hpp"

namespace gpubox::trainer::ps_modes {

class BatchKeys {
 public:
  // Gathers `batch`'s keys; slot s's keys get slot id slot_ids[s] (batch.num_slots of them).
  void gather(const dataset::Batch& batch, const std::vector<int32_t>& slot_ids,
              BufferGrowth& growth);
  // Room for a batch of `occurrences` keys, so that gathering one grows nothing (a PS thread's
  // second set of keys is sized with the first: PsWorker's row slots).
  void reserve(std::size_t occurrences, BufferGrowth& growth);
  // The occurrences the buffers hold room for.
  std::size_t capacity() const { return occurrence_index_.capacity(); }

  std::size_t size() const { return keys_.size(); }
  const std::vector<uint64_t>& keys() const { return keys_; }
  const std::vector<int32_t>& slots() const { return slots_; }
  // occurrence j of batch.keys -> its key's index in keys().
  const std::vector<uint32_t>& occurrence_index() const { return occurrence_index_; }
  // The keys of more than heter_comm::kReduceChunk occurrences (indices in keys(), ascending),
  // whose merge on a card is not left to right. The occurrences of hot_keys()[h] (positions in
  // batch.keys, ascending: the order HeterComm's local merge takes them in) are
  // hot_occurrences()[hot_start()[h], hot_start()[h + 1]).
  const std::vector<uint32_t>& hot_keys() const { return hot_keys_; }
  const std::vector<uint32_t>& hot_start() const { return hot_start_; }
  const std::vector<uint32_t>& hot_occurrences() const { return hot_occurrences_; }

 private:
  // Entries of the index for `occurrences` keys: at most half full, so probes stay short.
  static std::size_t index_entries(std::size_t occurrences);
  // The index's slot of `key` (holding it, or empty: kEmpty).
  std::size_t find_slot(uint64_t key) const;
  // hot_keys_, hot_start_ and hot_occurrences_ from cursor_ (then each key's occurrences).
  void group_hot_keys(BufferGrowth& growth);

  static constexpr uint32_t kEmpty = UINT32_MAX;
  std::vector<uint64_t> keys_;
  std::vector<int32_t> slots_;
  std::vector<uint32_t> occurrence_index_;
  // Per key: its occurrences while gathering; then, for a hot key, the next place of its
  // occurrences in hot_occurrences_ while grouping, kEmpty for the others.
  std::vector<uint32_t> cursor_;
  std::vector<uint32_t> hot_keys_;
  std::vector<uint32_t> hot_start_;        // hot keys + 1
  std::vector<uint32_t> hot_occurrences_;  // the hot keys' occurrences
  std::vector<uint32_t> index_;  // open addressing, linear probing: a power of two of entries
  std::size_t mask_ = 0;
};

// merged[u * push_dim + f] = the sum of field f of `push` (a record of push_dim floats per
// occurrence of the batch `keys` gathered) over key u's occurrences, in the order of a card's
// merge (HeterComm's local merge, segment_order.hpp): left to right in batch order, a hot key's
// in chunks. `merged` holds keys.size() records. So one PS thread's merged gradients are a
// card's, bit for bit.
void merge_by_key(const BatchKeys& keys, const float* push, int32_t push_dim, float* merged);

}  // namespace gpubox::trainer::ps_modes
