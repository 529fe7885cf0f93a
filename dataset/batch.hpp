// One training batch for one card: plain vectors of PODs so the trainer can copy each array to a
// card as is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpubox::dataset {

// CSR per slot, slot-major. For B = size() instances and S = num_slots slots:
//   slot s of instance i holds keys[offsets[s * B + i] .. offsets[s * B + i + 1]),
//   offsets has S * B + 1 entries, offsets[0] = 0 and offsets[S * B] = keys.size();
//   so slot s as a whole spans keys[offsets[s * B] .. offsets[(s + 1) * B]).
//   dense is row-major B x dense_dim; labels has B entries (0 or 1).
// Key 0 never appears (the parsers drop it: it means "no feature"). A batch may be empty
// (B = 0): see InMemoryDataset's tail policy.
struct Batch {
  int num_slots = 0;
  int dense_dim = 0;
  std::vector<std::uint64_t> keys;
  std::vector<std::uint32_t> offsets{0};
  std::vector<float> dense;
  std::vector<float> labels;

  std::size_t size() const { return labels.size(); }
  bool empty() const { return labels.empty(); }
  // Keys of slot s of instance i, as [first, last).
  const std::uint64_t* slot_begin(int s, std::size_t i) const {
    return keys.data() + offsets[static_cast<std::size_t>(s) * size() + i];
  }
  const std::uint64_t* slot_end(int s, std::size_t i) const {
    return keys.data() + offsets[static_cast<std::size_t>(s) * size() + i + 1];
  }
};

}  // namespace gpubox::dataset
