// RowMarks: a set of a card's row indices that listed rows are tested against (the rows a pass
// uses, the rows a write-back keeps dirty). Host memory only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/card_table/sparse_types.hpp"

namespace gpubox::pass {

// A set of row indices to test listed rows against. Pool indices are dense: a byte per index up
// to the largest listed one, one look-up each. Handles that carry a width class in their top
// bits would not be: a sorted list then (a binary search each), so the set never takes more than
// a few bytes per row.
class RowMarks {
 public:
  // `end`: one past the largest index that will be tested; `expected`: about how many will be.
  RowMarks(card_table::row_index_t end, std::size_t expected)
      : dense_(end <= 4 * expected + (std::size_t{1} << 20)) {
    if (dense_) bytes_.assign(end, 0);
  }
  void mark(card_table::row_index_t row) {
    if (row == card_table::kInvalidRow) return;
    if (!dense_) {
      sorted_.push_back(row);
    } else if (row < bytes_.size()) {
      bytes_[row] = 1;
    }
  }
  // After the last mark(), before the first has().
  void seal() {
    std::sort(sorted_.begin(), sorted_.end());
    sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
  }
  bool has(card_table::row_index_t row) const {
    return dense_ ? row < bytes_.size() && bytes_[row] != 0
                  : std::binary_search(sorted_.begin(), sorted_.end(), row);
  }

 private:
  bool dense_;
  std::vector<uint8_t> bytes_;
  std::vector<card_table::row_index_t> sorted_;
};

}  // namespace gpubox::pass
