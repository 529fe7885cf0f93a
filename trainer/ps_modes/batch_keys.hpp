// BatchKeys: a batch's distinct keys in order of first occurrence, the slot id each was first
// seen in, each occurrence's index among them, and the occurrences grouped by key in batch order
// (what a PS step pulls, and how it merges the occurrences' gradients per key: in the order of a
// card's merge, heterps/heter_comm/segment_order.hpp). An open-addressing index over arrays reused
// batch after batch (a std::unordered_map allocated a node per distinct key every step); they grow
// through a BufferGrowth, counted.
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
  // The occurrences of key u (positions in batch.keys, ascending) are
  // by_key()[key_start()[u], key_start()[u + 1]): the segments of a card's merge of the batch's
  // pushes (HeterComm's local merge takes a key's occurrences in that order).
  const std::vector<uint32_t>& key_start() const { return key_start_; }
  const std::vector<uint32_t>& by_key() const { return by_key_; }

 private:
  // Entries of the index for `occurrences` keys: at most half full, so probes stay short.
  static std::size_t index_entries(std::size_t occurrences);
  // The index's slot of `key` (holding it, or empty: kEmpty).
  std::size_t find_slot(uint64_t key) const;
  // key_start_ and by_key_ from occurrence_index_ (a counting sort, stable).
  void group_by_key(BufferGrowth& growth);

  static constexpr uint32_t kEmpty = UINT32_MAX;
  std::vector<uint64_t> keys_;
  std::vector<int32_t> slots_;
  std::vector<uint32_t> occurrence_index_;
  std::vector<uint32_t> key_start_;  // distinct keys + 1
  std::vector<uint32_t> by_key_;     // occurrences
  std::vector<uint32_t> index_;      // open addressing, linear probing: a power of two of entries
  std::size_t mask_ = 0;
};

}  // namespace gpubox::trainer::ps_modes
