// A random slot batch for the pooling tests (layers_test, slot_pool_test): pull records
// [show, click, embed_w, embedx_w[mf_dim]] and CSR offsets per (slot, instance) segment.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "heterps/device/card.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/layers.hpp"

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

// The first layer's input rows that `pool` writes for `h` and `dense` (dense_dim features an
// instance) at row stride `ld`, into rows that start as 7 (the padding a test sees kept): in fp32
// and in bf16.
struct PooledRows {
  std::vector<float> f32;
  std::vector<Bf16> bf16;
};
inline PooledRows pool_into_rows(device::Card& card, const SlotSumPool& pool,
                                 const HostSlotBatch& h, const std::vector<float>& dense,
                                 int dense_dim, int64_t ld) {
  auto up = [&](const auto& host) { return device::to_device(host, card.memory(), card.stream()); };
  auto records = up(h.records);
  auto offsets = up(h.offsets);
  auto d_dense = up(dense);
  const SlotBatchView view{records.data(), offsets.data(), h.batch, h.slots};
  const std::size_t size = static_cast<std::size_t>(h.batch) * static_cast<std::size_t>(ld);
  auto f32 = up(std::vector<float>(size, 7.0f));
  pool.forward(card.stream(), view, d_dense.data(), dense_dim,
               InputRows{f32.data(), ld, ElementType::kF32});
  auto b16 = up(std::vector<Bf16>(size, to_bf16(7.0f)));
  pool.forward(card.stream(), view, d_dense.data(), dense_dim,
               InputRows{b16.data(), ld, ElementType::kBf16});
  return PooledRows{device::to_host(f32), device::to_host(b16)};
}

}  // namespace gpubox::trainer
