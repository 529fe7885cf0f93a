// Making room on a card for a pass's rows, by the card store's eviction policy
// (heterps/card_table/eviction_policy.hpp: the store ranks its rows, the policy's order picks the
// victims): begin_pass's side of it. The next pass's card work makes room the same way a chunk at
// a time (next_pass_evictions.cpp).
//
// Every victim must be clean: end_pass wrote every dirty row back but those it kept (its `keep`,
// spared here), and begin_pass runs between passes, so a victim leaves the card without a
// write-back and nothing is lost. Its row goes to the free list, where the rows pulled next take
// it. Card c's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_cards.hpp"
#include "heterps/pass/pass_types.hpp"

namespace gpubox::pass {

// Removes `excess` rows of card `c` whose row index is not in `pass_rows` (the rows of the pass's
// keys on the card), those that leave first under the store's policy, reading only keys, row
// indices and ranks (never a copy of the rows). `kept_dirty`: dirty rows the last end_pass kept
// on the cards; when there are any, every dirty row is spared too. The listing and ranks land in
// card c's kept listing (PassCards::kept: reused, its contents lost). Returns the rows removed.
uint64_t evict_outside(const PassCards& cards, int c,
                       const std::vector<card_table::row_index_t>& pass_rows, uint64_t kept_dirty,
                       std::size_t excess);
// evict_outside when the only rows of card `c` outside the pass are known: keys[at[i]] with row
// indices rows[i] (the previous pass's rows this pass lacks, once the next pass's card work
// removed every row outside both). Reads only their ranks and dirty flags (a dirty one stays), as
// many at a time as card c's kept listing holds (under a budget: all, one wait; PassCards::kept:
// its contents lost), or a kept page if more. Returns the rows removed.
uint64_t evict_among(const PassCards& cards, int c, const std::vector<uint64_t>& keys,
                     const std::vector<uint32_t>& at,
                     const std::vector<card_table::row_index_t>& rows, uint64_t kept_dirty,
                     std::size_t excess);
// Width classes (a pool each): when the `missing` rows would grow the pools' pages past the plan
// (a pool keeps its pages when its rows leave, so a shift in the mix of widths would hold both),
// gives every pool's free pages back (CardSparseStore::compact_pool) first, listing the rows to
// move into card c's kept listing (as evict_outside): nothing allocated but the pools' pages, and
// two host waits a pool that gives pages back, however many rows move. Returns the pages freed.
std::size_t fit_pools(const PassCards& cards, int c, const OwnedKeys& missing);

}  // namespace gpubox::pass
