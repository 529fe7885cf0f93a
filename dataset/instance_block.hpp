// Compact in-memory records: one block per loaded file, a handful of flat arrays, no heap object
// per instance. Instance i owns keys[key_begin[i] .. key_begin[i+1]), grouped by slot in config
// order; slot_sizes[i * num_slots + s] says how many of them belong to slot s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpubox::dataset {

// A non-owning view of one instance (valid while its block lives and is not appended to).
struct InstanceRef {
  float label = 0.0f;
  const float* dense = nullptr;               // dense_dim values
  const std::uint64_t* keys = nullptr;        // all keys, slot by slot
  const std::uint32_t* slot_sizes = nullptr;  // num_slots counts
  int num_slots = 0;
  int dense_dim = 0;
  std::size_t num_keys() const;
};

// Not thread-safe; a block is written by one reader thread, then only read.
struct InstanceBlock {
  int num_slots = 0;
  int dense_dim = 0;
  std::vector<float> labels;                // [n]
  std::vector<float> dense;                 // [n * dense_dim]
  std::vector<std::uint64_t> key_begin{0};  // [n + 1]
  std::vector<std::uint64_t> keys;          // [key_begin[n]]
  std::vector<std::uint32_t> slot_sizes;    // [n * num_slots]

  InstanceBlock() = default;
  InstanceBlock(int slots, int dense_dim_) : num_slots(slots), dense_dim(dense_dim_) {}

  std::size_t size() const { return labels.size(); }
  InstanceRef instance(std::size_t i) const;
  // Appends one instance; `slot_sizes_in` has num_slots entries summing to `num_keys`.
  void append(float label, const float* dense_in, const std::uint64_t* keys_in,
              std::size_t num_keys, const std::uint32_t* slot_sizes_in);
  void append(const InstanceRef& ref) {
    append(ref.label, ref.dense, ref.keys, ref.num_keys(), ref.slot_sizes);
  }
  // Bytes held (capacities), for memory reporting.
  std::size_t memory_bytes() const;
  // Returns spare capacity when it is more than a tenth of what is used (shrinking copies).
  void shrink_to_fit();
  // Drops the instances, keeps the capacity.
  void clear();
};

// A loaded block, immutable from then on, shared by whoever holds it: the data set that loaded
// it, the pass data cache that keeps it for later loads of its files, the data sets those loads
// fill (pass_data_cache.hpp), a registered memory source (memory_source.hpp). Read concurrently
// without locks; nothing writes into it (a data set stored in another order holds new blocks).
using SharedInstanceBlock = std::shared_ptr<const InstanceBlock>;

inline std::size_t InstanceRef::num_keys() const {
  std::size_t n = 0;
  for (int s = 0; s < num_slots; ++s) n += slot_sizes[s];
  return n;
}

inline InstanceRef InstanceBlock::instance(std::size_t i) const {
  InstanceRef ref;
  ref.label = labels[i];
  ref.dense = dense.data() + i * static_cast<std::size_t>(dense_dim);
  ref.keys = keys.data() + key_begin[i];
  ref.slot_sizes = slot_sizes.data() + i * static_cast<std::size_t>(num_slots);
  ref.num_slots = num_slots;
  ref.dense_dim = dense_dim;
  return ref;
}

inline void InstanceBlock::append(float label, const float* dense_in, const std::uint64_t* keys_in,
                                  std::size_t num_keys, const std::uint32_t* slot_sizes_in) {
  labels.push_back(label);
  dense.insert(dense.end(), dense_in, dense_in + dense_dim);
  keys.insert(keys.end(), keys_in, keys_in + num_keys);
  key_begin.push_back(keys.size());
  slot_sizes.insert(slot_sizes.end(), slot_sizes_in, slot_sizes_in + num_slots);
}

inline std::size_t InstanceBlock::memory_bytes() const {
  return labels.capacity() * sizeof(float) + dense.capacity() * sizeof(float) +
         key_begin.capacity() * sizeof(std::uint64_t) + keys.capacity() * sizeof(std::uint64_t) +
         slot_sizes.capacity() * sizeof(std::uint32_t);
}

namespace detail {
template <class T>
void shrink_if_wasteful(std::vector<T>& v) {
  if (v.capacity() > v.size() + v.size() / 10) v.shrink_to_fit();
}
}  // namespace detail

inline void InstanceBlock::shrink_to_fit() {
  detail::shrink_if_wasteful(labels);
  detail::shrink_if_wasteful(dense);
  detail::shrink_if_wasteful(key_begin);
  detail::shrink_if_wasteful(keys);
  detail::shrink_if_wasteful(slot_sizes);
}

inline void InstanceBlock::clear() {
  labels.clear();
  dense.clear();
  key_begin.assign(1, 0);
  keys.clear();
  slot_sizes.clear();
}

}  // namespace gpubox::dataset
