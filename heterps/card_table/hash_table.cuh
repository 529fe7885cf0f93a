// Device views of a CardHashTable (hash_table.hpp), for functors: find-only for the pull path,
// insert-only for callers that allocate rows themselves. Both forward to the probing engine of
// detail/probe.cuh, written once for host and card.
#pragma once

#include <cstdint>

#include "heterps/card_table/detail/probe.cuh"
#include "heterps/card_table/hash_table.hpp"

namespace gpubox::card_table {

// Find-only device view, for the pull path. Trivially copyable; invalidated by any call that
// may grow or rehash the table (insert, reserve, clear).
class TableFindRef {
 public:
  TableFindRef() = default;
  explicit TableFindRef(detail::FindEngine engine) : engine_(engine) {}
  // The key's row, or kInvalidRow when absent.
  GPUBOX_HD row_index_t find(uint64_t key) const { return engine_.find(key); }
  // Forced inline: g++ takes a function whose only effect is a prefetch for one without effects
  // (ipa-pure-const) and drops calls to it that were not inlined first.
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch(uint64_t key) const { engine_.prefetch(key); }

 private:
  detail::FindEngine engine_{};
};

// Insert-only device view: maps a key to a row the caller already owns (e.g. allocated with
// RowPool::allocate). Same invalidation as TableFindRef. The caller must have reserved room
// (CardHashTable::reserve) and handle kProbeBoundExceeded (the table did not store the key).
class TableInsertRef {
 public:
  TableInsertRef() = default;
  explicit TableInsertRef(detail::InsertEngine engine) : engine_(engine) {}
  // Inserts key -> candidate unless present; returns the key's row and what happened.
  GPUBOX_HD detail::InsertResult insert(uint64_t key, row_index_t candidate) const {
    return engine_.insert(key, candidate);
  }

 private:
  detail::InsertEngine engine_{};
};

}  // namespace gpubox::card_table
