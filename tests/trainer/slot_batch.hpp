// A random slot batch for the pooling tests (layers_test, slot_pool_test): pull records
// [show, click, embed_w, embedx_w[mf_dim]] and CSR offsets per (slot, instance) segment.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace gpubox::trainer {

// A random slot batch: per (slot, instance) 0..3 occurrences (empty segments included).
struct HostSlotBatch {
  std::vector<float> records;
  std::vector<uint32_t> offsets;
  std::vector<float> labels;
  int batch;
  int slots;
  int pull_dim;
};

inline HostSlotBatch make_slot_batch(int batch, int slots, int mf_dim, std::mt19937_64& rng) {
  HostSlotBatch h{{}, {0}, {}, batch, slots, 3 + mf_dim};
  std::uniform_int_distribution<int> count(0, 3), shows(0, 6);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int s = 0; s < slots; ++s) {
    for (int i = 0; i < batch; ++i) {
      const int n = count(rng);
      for (int j = 0; j < n; ++j) {
        const int show = shows(rng);
        h.records.push_back(static_cast<float>(show));
        h.records.push_back(static_cast<float>(std::uniform_int_distribution<int>(0, show)(rng)));
        for (int k = 0; k < 1 + mf_dim; ++k) h.records.push_back(value(rng));
      }
      h.offsets.push_back(static_cast<uint32_t>(h.records.size() / h.pull_dim));
    }
  }
  for (int i = 0; i < batch; ++i) h.labels.push_back(static_cast<float>(rng() % 2));
  return h;
}

}  // namespace gpubox::trainer
