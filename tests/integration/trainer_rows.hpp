// A trainer's sparse rows by key, for tests that compare two runs bit for bit: the host tier's
// (a SparseTable) and one card's; and the environment of such a test's trainer: its simulated
// cards and its generated data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/device/memory.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer::testing {

using Rows = std::map<uint64_t, std::vector<float>>;

// `cards` simulated cards ("0,1,.."), one host thread each.
inline TrainerEnv cards_env(int cards) {
  TrainerEnv env;
  env.selected_cards = device::testing::card_list(cards);
  env.threads_per_card = 1;
  return env;
}

// `lines` seeded lines of `gpubox_data gen`'s default model shape (26 slots, 13 dense) in one file
// of `dir`: `vocab` keys a slot, `keys_per_slot` ("MIN:MAX"; "": one) in each slot of a line,
// drawn at Zipf `zipf` (the generator's default when not given).
inline void generate_lines(const std::string& dir, uint64_t lines, uint64_t seed, uint64_t vocab,
                           const std::string& keys_per_slot = "",
                           double zipf = dataset::GeneratorOptions{}.zipf) {
  dataset::GeneratorOptions gen;
  gen.out_dir = dir;
  gen.lines = lines;
  gen.files = 1;
  gen.seed = seed;
  gen.vocab = vocab;
  gen.zipf = zipf;
  if (!keys_per_slot.empty()) throw_if_error(dataset::parse_keys_per_slot(keys_per_slot, &gen));
  dataset::OracleSummary oracle;
  throw_if_error(dataset::generate(gen, &oracle));
}

// The host tier's rows (a failed expectation when it is not an in-memory SparseTable).
inline Rows host_rows(Trainer& trainer) {
  auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
  EXPECT_NE(table, nullptr);
  Rows out;
  if (table == nullptr) return out;
  const int stride = trainer.host_tier().layout().stride();
  throw_if_error(table->for_each_row(
      [&](uint64_t key, const float* row) { out[key] = std::vector<float>(row, row + stride); }));
  return out;
}

// Card `c`'s rows.
inline Rows card_rows(Trainer& trainer, int c) {
  card_table::CardSparseStore& store = trainer.card_tier().store(c);
  device::Card& card = store.card();
  card.activate();
  device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
  device::device_buffer<float> rows(0, card.memory(), card.stream());
  const std::size_t n = store.collect_all(keys, rows, card.stream());
  const auto host_keys = device::to_host(keys);
  const auto host_values = device::to_host(rows);
  const std::size_t stride = static_cast<std::size_t>(store.layout().stride());
  Rows out;
  for (std::size_t i = 0; i < n; ++i) {
    out[host_keys[i]] = std::vector<float>(host_values.begin() + i * stride,
                                           host_values.begin() + (i + 1) * stride);
  }
  return out;
}

// The same keys with the same bits.
inline bool same_rows(const Rows& a, const Rows& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, row] : a) {
    const auto it = b.find(key);
    if (it == b.end() || it->second.size() != row.size() ||
        std::memcmp(row.data(), it->second.data(), row.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace gpubox::trainer::testing
