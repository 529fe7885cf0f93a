// Test accessor configs with hyper_parameters.slot_dims, without a YAML document.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {

// `cfg` with the listed (slot, embedx width) pairs as its slot_dims.
inline AccessorConfig with_slot_dims(AccessorConfig cfg,
                                     std::initializer_list<std::pair<int32_t, int32_t>> dims) {
  cfg.slot_dims = SlotDims{};
  for (const auto& [slot, width] : dims) {
    cfg.slot_dims.slot[cfg.slot_dims.count] = slot;
    cfg.slot_dims.dim[cfg.slot_dims.count] = width;
    ++cfg.slot_dims.count;
  }
  return cfg;
}

}  // namespace gpubox::table
