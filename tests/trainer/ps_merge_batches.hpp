// Batches and pushes for a PS thread's per-key merge (trainer/ps_modes/batch_keys.hpp), shared
// by batch_keys_merge_test and gpubox_bench ps-merge, and the left-to-right merge merge_by_key
// replaced.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "dataset/batch.hpp"
#include "trainer/ps_modes/batch_keys.hpp"

namespace gpubox::trainer::ps_modes::testing {

// `instances` instances of 2 slots: unless `hot` is 0, slot 0 holds key 1 `hot` times in all
// (spread over the instances) and keys 2..5 1090, 100, 33 and 32 times; every slot of every
// instance then one to three Zipf-like keys of a vocabulary of `vocab` (from key 10).
inline dataset::Batch make_batch(std::size_t instances, std::size_t hot, uint64_t vocab,
                                 std::mt19937_64& rng) {
  std::vector<std::pair<uint64_t, std::size_t>> planted = {
      {1, hot}, {2, 1090}, {3, 100}, {4, 33}, {5, 32}};
  if (hot == 0) planted.clear();
  std::vector<std::vector<uint64_t>> slot0(instances);
  for (const auto& [key, count] : planted) {
    for (std::size_t c = 0; c < count; ++c) slot0[rng() % instances].push_back(key);
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  dataset::Batch batch;
  batch.num_slots = 2;
  batch.labels.assign(instances, 0.0f);
  for (int s = 0; s < 2; ++s) {
    for (std::size_t i = 0; i < instances; ++i) {
      if (s == 0) batch.keys.insert(batch.keys.end(), slot0[i].begin(), slot0[i].end());
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        const double u = unit(rng);
        batch.keys.push_back(10 + static_cast<uint64_t>(static_cast<double>(vocab) * u * u));
      }
      batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
    }
  }
  return batch;
}

// Mixed signs and magnitudes: rounding differs visibly between summation orders.
inline std::vector<float> make_push(std::size_t floats, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> push(floats);
  for (float& v : push) v = std::ldexp(mantissa(rng), exponent(rng));
  return push;
}

// The merge merge_by_key replaced: every key's occurrences left to right from +0.
inline void left_to_right(const BatchKeys& keys, const float* push, int32_t push_dim,
                          float* merged) {
  const auto dim = static_cast<std::size_t>(push_dim);
  std::fill(merged, merged + keys.size() * dim, 0.0f);
  const std::vector<uint32_t>& index = keys.occurrence_index();
  for (std::size_t j = 0; j < index.size(); ++j) {
    float* into = merged + std::size_t{index[j]} * dim;
    const float* from = push + j * dim;
    for (std::size_t f = 0; f < dim; ++f) into[f] += from[f];
  }
}

}  // namespace gpubox::trainer::ps_modes::testing
