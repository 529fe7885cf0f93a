// The shrink rule over an std::unordered_map of rows, the oracle SparseTable::shrink is held to:
// show and click decay, unseen days grow by one, and a row scoring under delete_threshold or
// unseen longer than delete_after_unseen_days is deleted.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "table/sparse_row/accessor.hpp"

namespace gpubox::table::testing {

// Ages `rows` one day by the rule; returns the number deleted.
inline uint64_t shrink_rows(std::unordered_map<uint64_t, std::vector<float>>* rows,
                            const AccessorConfig& cfg) {
  uint64_t deleted = 0;
  for (auto it = rows->begin(); it != rows->end();) {
    float* row = it->second.data();
    row[RowLayout::kShow] *= cfg.show_click_decay_rate;
    row[RowLayout::kClick] *= cfg.show_click_decay_rate;
    row[RowLayout::kUnseenDays] += 1.0f;
    if (row_score(row, cfg) < cfg.delete_threshold ||
        row[RowLayout::kUnseenDays] > cfg.delete_after_unseen_days) {
      it = rows->erase(it);
      ++deleted;
    } else {
      ++it;
    }
  }
  return deleted;
}

}  // namespace gpubox::table::testing
