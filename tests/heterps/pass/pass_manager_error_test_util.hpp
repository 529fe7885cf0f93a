// Shared helpers of the next-pass fault and sizing tests (pass_manager_error_test.cu,
// pass_manager_inserts_test.cu: one binary, pass_manager_error_test): 1-2 simulated cards with
// their stores, the in-process host tier and a pass manager (no steps, no HeterComm), their rows
// read back through a dump of each card's table (it fails when a table's size() differs from the
// keys it holds), seeded passes, and the staging polls the trainer's pipeline gives.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::pass::error_test {

using Phase = NextPassCard::Phase;
using Rows = std::unordered_map<uint64_t, std::vector<float>>;

// Cards, their stores, a host tier and a pass manager; no steps (the rows move between the tiers
// bit for bit, trained or not).
struct Tiers {
  // `trainers`: this process is trainer 0 of that many, each with `cards` cards.
  Tiers(int cards, const PassManagerOptions& options, int trainers = 1)
      : card_set(device::CardSet::from_list(device::testing::card_list(cards), 0, trainers)) {
    table::AccessorConfig cfg;
    cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
    cfg.mf_dim = 4;
    cfg.embedx_threshold = 0.0f;  // every row has its embedx: records differ key by key
    cfg.optimizer.mf_initial_range = 0.01f;
    cfg.seed = 17;
    host = std::move(table::SparseTable::open(cfg, table::HostTableConfig{}).value());
    std::vector<card_table::CardSparseStore*> raw;
    for (int c = 0; c < cards; ++c) {
      stores.push_back(std::make_unique<card_table::CardSparseStore>(card_set.card(c), cfg));
      raw.push_back(stores.back().get());
    }
    manager = std::make_unique<PassManager>(card_set, raw, *host, options);
  }

  // Card c's rows by key, through a dump of its table (GPUBOX_EXPECTS: its count is size()).
  Rows card_rows(int c) {
    device::Card& card = card_set.card(c);
    const device::Stream& stream = card.stream();
    card_table::CardSparseStore& store = *stores[static_cast<std::size_t>(c)];
    const std::size_t room = store.table().capacity() + 2;  // every slot, the side slots
    auto keys = card.make_buffer<uint64_t>(room);
    auto rows = card.make_buffer<card_table::row_index_t>(room);
    const std::size_t n = store.table().dump(keys.data(), rows.data(), stream);
    auto records = card.make_buffer<float>(n * static_cast<std::size_t>(store.record_stride()));
    store.read_rows(keys.data(), n, records.data(), stream);
    const std::vector<uint64_t> host_keys = device::to_host(keys.data(), n, stream);
    const std::vector<float> host_records = device::to_host(records.data(), records.size(), stream);
    Rows out;
    const auto stride = static_cast<std::size_t>(store.record_stride());
    for (std::size_t i = 0; i < n; ++i) {
      out[host_keys[i]].assign(host_records.begin() + i * stride,
                               host_records.begin() + (i + 1) * stride);
    }
    return out;
  }
  Rows card_rows() {
    Rows all;
    for (int c = 0; c < card_set.num_local_cards(); ++c) all.merge(card_rows(c));
    return all;
  }
  Rows host_rows() {
    Rows out;
    const auto stride = static_cast<std::size_t>(host->layout().stride());
    throw_if_error(host->for_each_row(
        [&](uint64_t key, const float* row) { out[key].assign(row, row + stride); }));
    return out;
  }
  // The next pass's work waits between steps through `group`'s bounded wait, as in a card tier.
  void wait_through(comm::CommGroup& group) {
    manager->set_card_wait([&group](int c, const device::Stream& stream, const char* what) {
      group.at(c).synchronize(stream, what);
    });
  }
  // Card 0's next-pass work until it reaches `phase` (or stops), on the calling thread.
  void prepare_until(Phase phase) {
    for (int i = 0; i < 200 && manager->next_pass_phase(0) != phase &&
                    manager->next_pass_phase(0) != Phase::kOff;
         ++i) {
      manager->prepare_next_pass(0);
    }
  }
  // `rounds` chunks of the next pass's work on every card, each on its card's thread.
  void prepare(int rounds) {
    card_set.run_on_cards([&](device::Card& card) {
      for (int i = 0; i < rounds; ++i) manager->prepare_next_pass(card.local_index());
    });
  }

  device::CardSet card_set;
  std::unique_ptr<table::SparseTable> host;
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores;
  std::unique_ptr<PassManager> manager;
};

// The next pass's card work in chunks of `chunk_keys` keys (sized by count, not by time: step
// fraction 0), under `row_budget` rows a card (0: none).
inline PassManagerOptions chunked(std::size_t chunk_keys, std::size_t row_budget = 0) {
  PassManagerOptions options;
  options.card_row_budget = row_budget;
  options.next_pass_chunk_keys = chunk_keys;
  options.next_pass_step_fraction = 0;
  return options;
}

// Two engines given the same passes: `early` does the next pass's card work (`options`),
// `reference` has the same options without it (next_pass_chunk_keys 0): the oracle.
struct TiersPair {
  TiersPair(int cards, const PassManagerOptions& options)
      : early(cards, options), reference(cards, without_work(options)) {}
  static PassManagerOptions without_work(PassManagerOptions options) {
    options.next_pass_chunk_keys = 0;
    return options;
  }
  Tiers early;
  Tiers reference;
};

// `n` distinct seeded keys in [base, base + 4n), mixed.
inline std::vector<uint64_t> pass_keys(std::size_t n, uint64_t base, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<uint64_t> keys;
  while (keys.size() < n) keys.insert((base + rng() % (4 * n)) * 0x9E3779B97F4A7C15ULL | 1);
  return {keys.begin(), keys.end()};
}

inline std::shared_ptr<const std::vector<uint64_t>> sorted(std::vector<uint64_t> keys) {
  std::sort(keys.begin(), keys.end());
  return std::make_shared<const std::vector<uint64_t>>(std::move(keys));
}

// Nothing for the first `polls` calls (every card's together), then `staged`, planned and
// fetched.
inline std::function<StagingProgress()> poll_after(const StagedRows* staged, int polls) {
  return [staged, polls, count = std::make_shared<std::atomic<int>>(0)] {
    if (count->fetch_add(1) < polls) return StagingProgress{};
    return StagingProgress{staged, true};
  };
}

}  // namespace gpubox::pass::error_test
