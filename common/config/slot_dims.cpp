#include "common/config/slot_dims.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <set>

namespace gpubox::config {
namespace {

// `text` as a whole decimal number in [lo, hi]: digits only (a leading '-' for negatives),
// nothing before or after them.
bool whole_number(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return false;
  if (value < lo || value > hi) return false;
  *out = value;
  return true;
}

// The comma-separated items of `text` (none when empty); "a,,b" and "a," hold empty items.
std::vector<std::string> items_of(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    items.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return items;
    at = comma + 1;
  }
}

Status bad_item(const std::string& where, const std::string& item, std::size_t index,
                const std::string& expected) {
  return Status::Corruption(where + ": slot_dims item " + std::to_string(index + 1) + " '" + item +
                            "' is not " + expected);
}

}  // namespace

int32_t slot_id_of(const std::vector<std::string>& slot_names, int64_t sparse_inputs_slots,
                   const std::string& name) {
  int64_t id = 0;
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (slot_names.empty()) {  // numbered slots 1 .. sparse_inputs_slots - 1
    return whole_number(name, 1, sparse_inputs_slots - 1, &id) ? static_cast<int32_t>(id) : -1;
  }
  const auto it = std::find(slot_names.begin(), slot_names.end(), name);
  if (it == slot_names.end()) return -1;
  // A numbered name is its number (negative: a slot id no table takes).
  if (whole_number(name, std::numeric_limits<int32_t>::min(), kIntMax, &id)) {
    return id >= 0 ? static_cast<int32_t>(id) : -1;
  }
  return static_cast<int32_t>(it - slot_names.begin());
}

StatusOr<std::vector<SlotDim>> resolve_slot_dims(const std::map<std::string, int64_t>& dims,
                                                 const std::vector<std::string>& slot_names,
                                                 int64_t sparse_inputs_slots, int64_t default_dim) {
  const std::string key = "hyper_parameters.slot_dims";
  if (dims.size() > static_cast<std::size_t>(kMaxSlotDims)) {
    return Status::InvalidArgument(
        key + ": " + std::to_string(dims.size()) + " slots listed, at most " +
        std::to_string(kMaxSlotDims) +
        " (list only the slots that differ from sparse_feature_dim - 1)");
  }
  std::vector<SlotDim> out;
  std::set<int64_t> widths{default_dim};
  for (const auto& [name, dim] : dims) {
    const int32_t id = slot_id_of(slot_names, sparse_inputs_slots, name);
    if (id < 0) {
      return Status::InvalidArgument(key + ": slot '" + name +
                                     "' is not one of the data's sparse slots "
                                     "(hyper_parameters.slot_names, or 1 .. sparse_inputs_slots "
                                     "- 1)");
    }
    if (dim < 0 || dim > kMaxSlotDim) {
      return Status::InvalidArgument(key + ": slot '" + name + "' has width " +
                                     std::to_string(dim) + ", not in [0, " +
                                     std::to_string(kMaxSlotDim) + "]");
    }
    widths.insert(dim);
    out.push_back({id, static_cast<int32_t>(dim)});
  }
  if (widths.size() > static_cast<std::size_t>(kMaxWidthClasses)) {
    return Status::InvalidArgument(key + ": " + std::to_string(widths.size()) +
                                   " distinct embedx widths with sparse_feature_dim - 1, at most " +
                                   std::to_string(kMaxWidthClasses));
  }
  return out;
}

StatusOr<std::vector<SlotDim>> parse_slot_dims_text(const std::string& text,
                                                    const std::string& where) {
  std::vector<SlotDim> out;
  const std::vector<std::string> items = items_of(text);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    const std::size_t colon = item.find(':');
    int64_t slot = 0, dim = 0;
    if (colon == std::string::npos ||
        !whole_number(item.substr(0, colon), 0, std::numeric_limits<int32_t>::max(), &slot) ||
        !whole_number(item.substr(colon + 1), 0, kMaxSlotDim, &dim)) {
      return bad_item(
          where, item, i,
          "slot:width (a slot id, and a width in [0, " + std::to_string(kMaxSlotDim) + "])");
    }
    if (!out.empty() && slot <= out.back().slot) {
      return bad_item(where, item, i,
                      "after slot " + std::to_string(out.back().slot) + " (slots ascend, once)");
    }
    out.push_back({static_cast<int32_t>(slot), static_cast<int32_t>(dim)});
  }
  return out;
}

StatusOr<std::vector<int32_t>> parse_slot_widths_text(const std::string& text, int32_t max_dim,
                                                      const std::string& where) {
  std::vector<int32_t> out;
  const std::vector<std::string> items = items_of(text);
  for (std::size_t i = 0; i < items.size(); ++i) {
    int64_t dim = 0;
    if (!whole_number(items[i], 0, std::min(max_dim, kMaxSlotDim), &dim)) {
      return bad_item(
          where, items[i], i,
          "a width in [0, " + std::to_string(std::min(max_dim, kMaxSlotDim)) + "] (mf_dim)");
    }
    out.push_back(static_cast<int32_t>(dim));
  }
  return out;
}

}  // namespace gpubox::config
