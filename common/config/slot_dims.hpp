// hyper_parameters.slot_dims (each slot's embedx width) in every form it is read in, by one set
// of rules: the config's map of slot names to widths (resolved against the data's slots), a
// save's MANIFEST "slot:dim,..." and a serving model's MANIFEST "dim,..." (one width per slot).
// Numbers are whole decimal tokens in range, nothing before or after them; errors name where
// the text came from (file or key) and the bad token.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::config {

// Bounds of slot_dims: the slots it may list, the distinct widths a table holds (with the default
// sparse_feature_dim - 1), and a width's largest value. The table's SlotDims and WidthClasses are
// sized by the first two (table/sparse_row/accessor.hpp; table/sparse_config.cpp asserts they
// agree).
inline constexpr int32_t kMaxSlotDims = 128;
inline constexpr int32_t kMaxWidthClasses = 8;
inline constexpr int32_t kMaxSlotDim = 1023;

struct SlotDim {
  int32_t slot = 0;
  int32_t dim = 0;
};

// The slot id of the data's slot named `name`: the dataset's rule (dataset::slot_id), the name
// when it is a whole number, else its position in `slot_names`; with no slot_names the numbered
// slots 1 .. sparse_inputs_slots - 1 (the label counts as one). -1 when the data has no such slot
// (or its number is negative).
int32_t slot_id_of(const std::vector<std::string>& slot_names, int64_t sparse_inputs_slots,
                   const std::string& name);

// hyper_parameters.slot_dims (names to widths, as the config holds it) resolved to slot ids, in
// the map's order, every entry kept: a name that is no slot of the data, more than kMaxSlotDims
// entries, or more than kMaxWidthClasses distinct widths with `default_dim` is an
// InvalidArgument error naming the key and the entry.
StatusOr<std::vector<SlotDim>> resolve_slot_dims(const std::map<std::string, int64_t>& dims,
                                                 const std::vector<std::string>& slot_names,
                                                 int64_t sparse_inputs_slots, int64_t default_dim);

// A save MANIFEST's slot_dims: "slot:dim" items, comma-separated, slots ascending (empty: none).
// A token that is not a whole number in range (slot in [0, 2^31), dim in [0, kMaxSlotDim]), a
// missing ':' or item, or a slot not after the one before it is a Corruption error naming
// `where` and the item.
StatusOr<std::vector<SlotDim>> parse_slot_dims_text(const std::string& text,
                                                    const std::string& where);

// A serving MANIFEST's slot_dims: one width per slot, comma-separated, each in [0, max_dim].
// Errors as parse_slot_dims_text's.
StatusOr<std::vector<int32_t>> parse_slot_widths_text(const std::string& text, int32_t max_dim,
                                                      const std::string& where);

}  // namespace gpubox::config
