// Eviction: which rows leave a card first when a pass needs room. It is a named policy of the
// card store (CardSparseStore's constructor takes it, eviction_policy() says it), as
// HierarchicalKV makes eviction a table policy: the store ranks its rows by the policy on the
// card (CardSparseStore::eviction_ranks), and every caller that makes room (the pass boundary,
// the next pass's card work: heterps/pass) chooses among ranked rows with the order and the
// choosers here, so they choose alike and none of them branches on the policy.
//
// Which rows may leave at all is the caller's contract, not the policy's: only clean rows (a
// dirty row's newest value is only on the card) outside the passes that need them.
//
// Plain host code (no device headers).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/card_table/sparse_types.hpp"

namespace gpubox::card_table {

enum class EvictionPolicy {
  // The lowest table::row_score first (the accessor's show/click score, the one its shrink and
  // embedx creation read), ties by the smaller key: a total order, so a choice is reproducible.
  kLowestScore,
};

// A row that may leave: its rank under the store's policy (CardSparseStore::eviction_ranks;
// lower leaves first), its key, and the row handle it had when ranked (kInvalidRow: not
// recorded), so that whoever erases it later can check the table still holds it there.
struct EvictionCandidate {
  float rank;
  uint64_t key;
  row_index_t row = kInvalidRow;
};

// The order every policy's ranks are read in: true when `a` leaves before `b` ((rank, key)
// ascending).
inline bool leaves_before(const EvictionCandidate& a, const EvictionCandidate& b) {
  return a.rank < b.rank || (!(b.rank < a.rank) && a.key < b.key);
}

// Moves the `count` candidates that leave first to candidates[0, count), in no particular order
// among themselves (count <= candidates.size()). Those `count` form a set fixed by the total
// order, so a selection (linear) rather than a partial sort (n log k: minutes at 10^7 rows a
// card on the cpu backend).
inline void select_victims(std::vector<EvictionCandidate>& candidates, std::size_t count) {
  std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(count),
                   candidates.end(), leaves_before);
}

// The choice made as a listing goes, a chunk at a time: keeps the `count` candidates that leave
// first among those offered so far (a max-heap under leaves_before, heapified once when it first
// fills), so the work per candidate is bounded and the host holds no more candidates than will
// leave.
class VictimHeap {
 public:
  VictimHeap() = default;
  explicit VictimHeap(std::size_t count) : count_(count) {}

  void offer(const EvictionCandidate& candidate) {
    if (heap_.size() < count_) {
      heap_.push_back(candidate);
      if (heap_.size() == count_) std::make_heap(heap_.begin(), heap_.end(), leaves_before);
      return;
    }
    passed_over_ = true;  // this candidate or one kept before it stays on the card
    if (count_ > 0 && leaves_before(candidate, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), leaves_before);
      heap_.back() = candidate;
      std::push_heap(heap_.begin(), heap_.end(), leaves_before);
    }
  }
  // Some candidate offered is not among the victims (false: every one offered leaves).
  bool passed_over() const { return passed_over_; }
  // The victims so far (no particular order): the `count` first to leave, or every candidate
  // offered when fewer were.
  const std::vector<EvictionCandidate>& victims() const { return heap_; }
  // Frees the victims' memory (after they were erased).
  void clear() { heap_ = {}; }

 private:
  std::size_t count_ = 0;
  std::vector<EvictionCandidate> heap_;
  bool passed_over_ = false;
};

}  // namespace gpubox::card_table
