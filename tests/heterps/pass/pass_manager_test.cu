// PassManager over a sequence of passes with overlapping seeded key sets, on 1-3 simulated cards
// with the in-process host tier (table::SparseTable).
//
// Oracle: the same passes and the same training steps run through a second, identical engine
// whose cards forget everything at every end_pass (no cache: every pass pulls all of its keys
// and nothing is ever evicted). Rows move between tiers bit-exactly, so with or without the
// cache, and with or without eviction, host contents after end_pass must be bit-identical, and
// so must the card rows of the pass's keys. Counters are checked against what the key sets
// imply (hits = pass keys already resident, pulled = the rest, created = never seen before).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::pass {
namespace {

using table::AccessorConfig;

std::string card_list(int cards) {
  std::string list;
  for (int c = 0; c < cards; ++c) list += (c ? "," : "") + std::to_string(c);
  return list;
}

AccessorConfig test_config() {
  AccessorConfig cfg;
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  cfg.embedx_threshold = 1.0f;  // some rows grow embedx during the passes
  cfg.optimizer.mf_initial_range = 0.01f;
  cfg.seed = 11;
  return cfg;
}

// One engine: cards, their stores and HeterComms, a host tier, a pass manager.
struct Engine {
  Engine(int cards, const PassManagerOptions& options, table::HostTier* external_host = nullptr)
      : card_set(device::CardSet::from_list(card_list(cards))), placement(options.placement) {
    const AccessorConfig cfg = test_config();
    if (external_host == nullptr) {
      auto opened = table::SparseTable::open(cfg, table::HostTableConfig{});
      owned_host = std::move(opened.value());
      host = owned_host.get();
    } else {
      host = external_host;
    }
    group = comm::make_group(card_set);
    for (int c = 0; c < cards; ++c) {
      stores.push_back(std::make_unique<card_table::CardSparseStore>(card_set.card(c), cfg));
    }
    for (int c = 0; c < cards; ++c) {
      heter_comm::HeterCommOptions hc;
      hc.missing_keys =
          heter_comm::MissingKeyPolicy::kFail;  // begin_pass must have placed every key
      hc.placement = options.placement;
      comms.push_back(
          std::make_unique<heter_comm::HeterComm>(card_set.card(c), *stores[c], group->at(c), hc));
    }
    std::vector<card_table::CardSparseStore*> raw;
    for (auto& s : stores) raw.push_back(s.get());
    manager = std::make_unique<PassManager>(card_set, raw, *host, options);
  }

  // Per card, per step: a batch of keys from the pass and seeded gradients; pull then push.
  // `between(card)` (optional) runs on the card's thread after each step.
  void train(const std::vector<uint64_t>& pass_keys, uint64_t seed, int steps,
             const std::function<void(int)>& between = nullptr) {
    const int push_dim = host->layout().push_dim();
    card_set.run_on_cards(
        [&](device::Card& card) {
          std::mt19937_64 rng(seed * 131 + card.local_index());
          for (int step = 0; step < steps; ++step) {
            // Card 0 of a multi-card set sometimes has an empty batch (the collectives must not
            // hang).
            const std::size_t n =
                pass_keys.empty() || (card.local_index() == 0 && step == 1) ? 0 : 50;
            std::vector<uint64_t> keys(n);
            std::vector<float> grads(n * push_dim);
            for (std::size_t i = 0; i < n; ++i) {
              keys[i] = pass_keys[rng() % pass_keys.size()];
              grads[i * push_dim + 0] = 1.0f;
              grads[i * push_dim + 1] = (rng() % 4 == 0) ? 1.0f : 0.0f;
              for (int d = 2; d < push_dim; ++d)
                grads[i * push_dim + d] = ((rng() % 2001) / 1000.0f - 1.0f) * 0.1f;
            }
            auto d_keys = device::to_device(keys, card.memory(), card.stream());
            auto d_grads = device::to_device(grads, card.memory(), card.stream());
            auto d_pull = card.make_buffer<float>(n * host->layout().pull_dim());
            comms[card.local_index()]->pull(d_keys.data(), n, d_pull.data(), card.stream());
            comms[card.local_index()]->push(d_keys.data(), n, d_grads.data(), card.stream());
            if (between) between(card.local_index());
          }
        },
        [&](const std::string& why) { group->abort(why); });
  }

  // Every card row as key -> row (host copies).
  std::map<uint64_t, std::vector<float>> card_rows() {
    std::map<uint64_t, std::vector<float>> out;
    const int stride = host->layout().stride();
    for (int c = 0; c < card_set.num_local_cards(); ++c) {
      device::Card& card = card_set.card(c);
      device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
      device::device_buffer<float> rows(0, card.memory(), card.stream());
      const std::size_t n = stores[c]->collect_all(keys, rows, card.stream());
      auto hk = device::to_host(keys.data(), n, card.stream());
      auto hr = device::to_host(rows.data(), n * stride, card.stream());
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<float> row(hr.begin() + i * stride, hr.begin() + (i + 1) * stride);
        if (placement == heter_comm::Placement::kReplicated) {
          // Every card holds every row, byte for byte the same (card 0's come first).
          if (c > 0) {
            EXPECT_TRUE(out.count(hk[i]) && out[hk[i]] == row) << "replica " << c;
            continue;
          }
        } else {
          EXPECT_EQ(owner_card(hk[i], card_set.num_local_cards()), c) << "key on the wrong card";
        }
        out[hk[i]] = std::move(row);
      }
      if (placement == heter_comm::Placement::kReplicated) {
        EXPECT_EQ(n, out.size()) << "replica " << c << " is not the whole table";
      }
    }
    return out;
  }

  std::map<uint64_t, std::vector<float>> host_rows() {
    std::map<uint64_t, std::vector<float>> out;
    auto* table = inspect != nullptr ? inspect : dynamic_cast<table::SparseTable*>(host);
    EXPECT_NE(table, nullptr);
    throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
      out[key] = std::vector<float>(row, row + host->layout().stride());
    }));
    return out;
  }

  void forget_cards() {
    for (int c = 0; c < card_set.num_local_cards(); ++c) {
      stores[c]->clear(card_set.card(c).stream());
    }
  }

  device::CardSet card_set;
  heter_comm::Placement placement;
  std::unique_ptr<table::SparseTable> owned_host;
  table::HostTier* host = nullptr;
  table::SparseTable* inspect = nullptr;  // the table behind a remote host tier
  std::unique_ptr<comm::CommGroup> group;
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores;
  std::vector<std::unique_ptr<heter_comm::HeterComm>> comms;
  std::unique_ptr<PassManager> manager;
};

bool rows_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Passes over a sliding window of a key universe: consecutive passes overlap by about half.
std::vector<std::vector<uint64_t>> make_passes(int passes, std::size_t keys_per_pass,
                                               uint64_t seed) {
  std::vector<std::vector<uint64_t>> out;
  std::mt19937_64 rng(seed);
  for (int p = 0; p < passes; ++p) {
    std::set<uint64_t> keys;
    const uint64_t base = static_cast<uint64_t>(p) * keys_per_pass / 2;
    while (keys.size() < keys_per_pass)
      keys.insert(mix64(base + rng() % (keys_per_pass * 3 / 2)) | 1);
    out.emplace_back(keys.begin(), keys.end());
  }
  return out;
}

// A pass's keys sorted and unique, shared, as the trainer hands expect_next_pass its data set's.
std::shared_ptr<const std::vector<uint64_t>> sorted_keys(const std::vector<uint64_t>& keys) {
  auto sorted = std::make_shared<std::vector<uint64_t>>(keys);
  std::sort(sorted->begin(), sorted->end());
  sorted->erase(std::unique(sorted->begin(), sorted->end()), sorted->end());
  return sorted;
}

// A poll that reports `staged` planned, and fetched when `rows_ready`.
std::function<StagingProgress()> poll_of(const StagedRows* staged, bool rows_ready = true) {
  return [staged, rows_ready] { return StagingProgress{staged, rows_ready}; };
}

struct Case {
  int cards;
  std::size_t row_budget;  // per card; 0 = none
};

class PassManagerTest : public ::testing::TestWithParam<Case> {};

TEST_P(PassManagerTest, CachedPassesMatchUncachedReferenceAndCountersMatchKeySets) {
  const Case tc = GetParam();
  GPUBOX_REQUIRE_CARDS(tc.cards);
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.host_batch_keys = 37;  // many small host requests, several in flight
  Engine cached(tc.cards, options);
  Engine reference(tc.cards, PassManagerOptions{});

  const auto passes = make_passes(5, 240, 77);
  std::set<uint64_t> resident, ever_seen;
  bool evicted_any = false;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    std::vector<uint64_t> with_noise = keys;  // duplicates and key 0 are dropped by begin_pass
    with_noise.push_back(keys[0]);
    with_noise.push_back(0);

    const PassStats begin = cached.manager->begin_pass(with_noise);
    reference.manager->begin_pass(keys);
    EXPECT_EQ(begin.keys_in_pass, keys.size());
    std::size_t expect_hits = 0, expect_created = 0;
    for (uint64_t k : keys) {
      expect_hits += resident.count(k);
      expect_created += ever_seen.count(k) == 0;
    }
    if (tc.row_budget == 0) {
      EXPECT_EQ(begin.hits, expect_hits) << "pass " << p;
      EXPECT_EQ(begin.pulled, keys.size() - expect_hits) << "pass " << p;
    } else {
      EXPECT_LE(begin.hits, expect_hits);
      EXPECT_EQ(begin.hits + begin.pulled, keys.size());
      EXPECT_LE(begin.rows_on_cards, tc.row_budget * tc.cards);
      evicted_any |= begin.evicted > 0;
    }
    EXPECT_EQ(begin.created, expect_created) << "pass " << p;

    cached.train(keys, 1000 + p, 4);
    reference.train(keys, 1000 + p, 4);

    // The pass's keys on the cards are identical in both engines.
    auto cached_cards = cached.card_rows();
    auto reference_cards = reference.card_rows();
    for (uint64_t k : keys) {
      ASSERT_TRUE(cached_cards.count(k)) << "key " << k << " not on a card in pass " << p;
      ASSERT_TRUE(rows_equal(cached_cards[k], reference_cards.at(k)))
          << "key " << k << " pass " << p;
    }

    const PassStats end = cached.manager->end_pass();
    const PassStats ref_end = reference.manager->end_pass();
    // Every trained key is dirty once: the cache changes nothing about what is written back.
    EXPECT_EQ(end.written_back, ref_end.written_back) << "pass " << p;
    EXPECT_GT(end.written_back, 0u);
    reference.forget_cards();

    // After end_pass the host tier equals the reference's, row for row, bit for bit, and holds
    // what the cards hold.
    auto cached_host = cached.host_rows();
    auto reference_host = reference.host_rows();
    ASSERT_EQ(cached_host.size(), reference_host.size()) << "pass " << p;
    for (const auto& [k, row] : reference_host) {
      ASSERT_TRUE(rows_equal(cached_host.at(k), row)) << "key " << k << " pass " << p;
    }
    for (const auto& [k, row] : cached.card_rows()) {
      ASSERT_TRUE(rows_equal(cached_host.at(k), row)) << "card row " << k << " differs from host";
    }

    for (uint64_t k : keys) ever_seen.insert(k);
    if (tc.row_budget == 0) {
      resident.insert(keys.begin(), keys.end());
    } else {
      resident.clear();
      for (const auto& [k, row] : cached.card_rows()) resident.insert(k);
    }
  }
  if (tc.row_budget > 0) {
    EXPECT_TRUE(evicted_any) << "the budget never forced an eviction";
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PassManagerTest,
                         ::testing::Values(Case{1, 0}, Case{2, 0}, Case{3, 0}, Case{1, 300},
                                           Case{2, 170}, Case{3, 120}),
                         [](const auto& info) {
                           return std::to_string(info.param.cards) + "cards_budget" +
                                  std::to_string(info.param.row_budget);
                         });

// The rows of pass p + depth staged while pass p trains (another thread, concurrent with the
// steps), excluding the keys of passes p .. p + depth - 1, then handed to its begin_pass: the
// cards and the host tier stay bit-identical to the same passes without staging, and the
// counters add up to the unstaged ones. With a budget and depth 2, rows of pass p are evicted at
// pass p + 1 and needed again at p + 2: staged without the exclusion they would be stale.
struct StagingCase {
  int cards;
  std::size_t row_budget;  // per card; 0 = none
  int depth;
  // Also exclude the keys on the cards when the staging starts (the trainer's PassPipeline):
  // nothing staged is then a hit at its begin_pass, with depth 1 every staged row is used.
  bool exclude_resident = false;
};

class PassManagerStagingTest : public ::testing::TestWithParam<StagingCase> {};

TEST_P(PassManagerStagingTest, StagedPassesMatchUnstagedBitForBit) {
  const StagingCase tc = GetParam();
  GPUBOX_REQUIRE_CARDS(tc.cards);
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.host_batch_keys = 37;
  Engine staged(tc.cards, options);
  Engine reference(tc.cards, options);

  const auto passes = make_passes(7, 240, 78);
  const std::size_t stride = static_cast<std::size_t>(staged.host->layout().stride());
  std::map<std::size_t, StagedRows> ahead;  // pass -> its staged rows
  uint64_t prefetched = 0, evicted = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    const StagedRows* mine = ahead.count(p) ? &ahead.at(p) : nullptr;
    const PassStats got = staged.manager->begin_pass(keys, {}, mine);
    const PassStats want = reference.manager->begin_pass(keys);
    EXPECT_EQ(got.hits, want.hits) << "pass " << p;
    EXPECT_EQ(got.pulled + got.prefetched, want.pulled) << "pass " << p;
    EXPECT_EQ(got.created, want.created) << "pass " << p;
    EXPECT_EQ(got.evicted, want.evicted) << "pass " << p;
    if (mine != nullptr && (tc.depth == 1 || tc.row_budget == 0)) {
      EXPECT_EQ(got.pulled, 0u) << "pass " << p << ": a missing row was not staged";
    }
    if (mine != nullptr && tc.exclude_resident && tc.depth == 1) {
      EXPECT_EQ(got.prefetched, mine->keys.size()) << "pass " << p << ": a staged row was a hit";
    }
    prefetched += got.prefetched;
    evicted += got.evicted;

    // This pass's own rows fetched now would be stale after its end_pass: why each staging
    // excludes the keys of the passes training before it.
    const StagedRows unexcluded = staged.manager->stage_rows(keys, {}, {});
    // Stage pass p + depth while this one trains.
    const std::size_t target = p + static_cast<std::size_t>(tc.depth);
    if (target < passes.size()) {
      std::set<uint64_t> before;
      for (std::size_t q = p; q < target; ++q) before.insert(passes[q].begin(), passes[q].end());
      if (tc.exclude_resident) {
        const std::vector<uint64_t> resident = staged.manager->resident_keys();
        EXPECT_EQ(resident.size(), staged.card_rows().size()) << "pass " << p;
        before.insert(resident.begin(), resident.end());
      }
      const std::vector<uint64_t> exclude(before.begin(), before.end());
      auto staging = std::async(std::launch::async, [&] {
        return staged.manager->stage_rows(passes[target], {}, exclude);
      });
      staged.train(keys, 2000 + p, 4);
      ahead[target] = staging.get();
      EXPECT_FALSE(ahead[target].keys.empty());
      for (uint64_t k : ahead[target].keys) ASSERT_EQ(before.count(k), 0u) << "excluded key staged";
    } else {
      staged.train(keys, 2000 + p, 4);
    }
    reference.train(keys, 2000 + p, 4);
    staged.manager->end_pass();
    reference.manager->end_pass();
    ahead.erase(p);

    // The host tiers agree on every row; the staged side also holds rows the staging created
    // for coming passes, untouched since.
    const auto got_host = staged.host_rows();
    const auto want_host = reference.host_rows();
    for (const auto& [k, row] : want_host) {
      ASSERT_TRUE(got_host.count(k)) << "key " << k << " pass " << p;
      ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "key " << k << " pass " << p;
    }
    std::size_t created_early = 0, created_staging = 0;
    for (const auto& [q, rows] : ahead) created_staging += rows.created;
    for (const auto& [k, row] : got_host) {
      if (want_host.count(k)) continue;
      bool found = false;
      for (const auto& [q, rows] : ahead) {
        const auto at = std::find(rows.keys.begin(), rows.keys.end(), k);  // sorted per card
        if (at == rows.keys.end()) continue;
        const auto i = static_cast<std::size_t>(at - rows.keys.begin());
        ASSERT_TRUE(rows_equal(row, std::vector<float>(rows.rows.begin() + i * stride,
                                                       rows.rows.begin() + (i + 1) * stride)));
        found = true;
      }
      ASSERT_TRUE(found) << "host row " << k << " neither trained nor staged";
      ++created_early;
    }
    EXPECT_EQ(created_early, created_staging) << "pass " << p;
    const auto got_cards = staged.card_rows();
    const auto want_cards = reference.card_rows();
    ASSERT_EQ(got_cards.size(), want_cards.size()) << "pass " << p;
    for (const auto& [k, row] : want_cards) {
      ASSERT_TRUE(rows_equal(got_cards.at(k), row)) << "card key " << k << " pass " << p;
    }
    std::size_t stale = 0;
    for (std::size_t i = 0; i < unexcluded.keys.size(); ++i) {
      const std::vector<float> row(unexcluded.rows.begin() + i * stride,
                                   unexcluded.rows.begin() + (i + 1) * stride);
      stale += !rows_equal(row, got_host.at(unexcluded.keys[i]));
    }
    EXPECT_GT(stale, 0u) << "pass " << p << ": training changed no row it staged";
  }
  EXPECT_GT(prefetched, 0u);
  if (tc.row_budget > 0) {
    EXPECT_GT(evicted, 0u) << "the budget never forced an eviction";
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PassManagerStagingTest,
                         ::testing::Values(StagingCase{1, 0, 1}, StagingCase{2, 0, 1},
                                           StagingCase{3, 0, 2}, StagingCase{1, 300, 1},
                                           StagingCase{1, 300, 2}, StagingCase{2, 170, 2},
                                           StagingCase{1, 0, 1, true}, StagingCase{2, 170, 1, true},
                                           StagingCase{1, 300, 2, true},
                                           StagingCase{3, 120, 2, true}),
                         [](const auto& info) {
                           return std::to_string(info.param.cards) + "cards_budget" +
                                  std::to_string(info.param.row_budget) + "_depth" +
                                  std::to_string(info.param.depth) +
                                  (info.param.exclude_resident ? "_resident" : "");
                         });

// The next pass's card work between the current pass's steps (prepare_next_pass): the next
// pass's staging is planned (its keys known) and its rows fetched on another thread while this
// one trains, as the pipeline does: the poll reports the keys first, in every third pass only
// after some steps (the read takes time), and the rows once fetched, in every other pass only
// during the steps (the cards look up and evict before they can insert). Each card does a chunk
// after each step, and begin_pass does the rest. Against an engine that
// neither stages nor prepares: the pass's card rows after begin_pass and after training, and the
// host tier after every end_pass, are bit-identical; every card row equals its host row after
// end_pass (the rows inserted early are exact copies); the counters add up. Passes overlap, one
// repeats the previous (every key on the card), one is empty, one is disjoint, and an
// evaluation pass between two passes makes begin_pass discard what was done (still exact).
// Few steps or small chunks leave the work unfinished in every phase.
struct NextPassCase {
  int cards;
  std::size_t row_budget;  // per card; 0 = none
  std::size_t chunk;       // next_pass_chunk_keys
  int steps;               // per pass
  // The work reaches its insertions (and evictions, with a budget) in some pass: enough steps
  // for the chunks; otherwise it stays partial (begin_pass finishes it).
  bool reaches_inserts;
  // next_pass_step_fraction: > 0 sizes the chunks by their measured time (ChunkPacer), as the
  // GPU build does; the chunk above is then their largest size.
  double step_fraction = 0;
};

class NextPassWorkTest : public ::testing::TestWithParam<NextPassCase> {};

TEST_P(NextPassWorkTest, MatchesBeginPassAloneBitForBit) {
  const NextPassCase tc = GetParam();
  GPUBOX_REQUIRE_CARDS(tc.cards);
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.host_batch_keys = 37;
  Engine reference(tc.cards, options);
  options.next_pass_chunk_keys = tc.chunk;
  options.next_pass_step_fraction = tc.step_fraction;
  Engine early(tc.cards, options);

  auto passes = make_passes(5, 240, 79);
  passes.insert(passes.begin() + 2, passes[1]);  // every key on the card already
  passes.insert(passes.begin() + 4, std::vector<uint64_t>{});
  passes.push_back(make_passes(1, 240, 80).front());  // disjoint from the last
  const std::size_t evaluate_before = 6;              // an evaluation pass runs between 5 and 6
  // A coming pass's staging: planned, then fetched on another thread.
  struct Staging {
    std::shared_ptr<StagedRows> plan;
    std::shared_future<void> fetched;
  };
  std::map<std::size_t, Staging> ahead;
  uint64_t early_inserted = 0, early_evicted = 0, early_chunks = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const auto& keys = passes[p];
    const StagedRows* staged = nullptr;
    if (ahead.count(p)) {
      ahead.at(p).fetched.get();
      staged = ahead.at(p).plan.get();
    }
    const PassStats got = early.manager->begin_pass(keys, {}, staged);
    const PassStats want = reference.manager->begin_pass(keys);
    EXPECT_EQ(got.keys_in_pass, want.keys_in_pass);
    EXPECT_EQ(got.hits + got.pulled + got.prefetched, got.keys_in_pass);
    EXPECT_EQ(got.created, want.created);
    EXPECT_LE(got.early_inserted, got.prefetched);
    EXPECT_LE(got.early_evicted, got.evicted);
    if (tc.row_budget > 0) {
      EXPECT_LE(got.rows_on_cards, tc.row_budget * tc.cards);
    }
    early_inserted += got.early_inserted;
    early_evicted += got.early_evicted;
    early_chunks += got.early_chunks;
    const auto check_pass_rows = [&](const char* when) {
      const auto got_cards = early.card_rows();
      const auto want_cards = reference.card_rows();
      for (uint64_t k : keys) {
        ASSERT_TRUE(got_cards.count(k)) << when << ": key " << k << " not on its card";
        ASSERT_TRUE(rows_equal(got_cards.at(k), want_cards.at(k))) << when << ": key " << k;
      }
    };
    check_pass_rows("after begin_pass");

    std::function<void(int)> between;
    if (p + 1 < passes.size()) {
      // Stage the next pass as the trainer's pipeline does (excluding this pass's keys and the
      // keys on the cards), on another thread, and let the cards work on it between steps.
      std::set<uint64_t> before(keys.begin(), keys.end());
      const std::vector<uint64_t> resident = early.manager->resident_keys();
      before.insert(resident.begin(), resident.end());
      const std::vector<uint64_t> exclude(before.begin(), before.end());
      Staging& next = ahead[p + 1];
      next.plan =
          std::make_shared<StagedRows>(early.manager->plan_staging(passes[p + 1], {}, exclude));
      next.fetched = std::async(std::launch::async, [&early, plan = next.plan] {
                       early.manager->fetch_staged(plan.get());
                     }).share();
      const int keys_after = p % 3 == 2 ? tc.steps / 3 * tc.cards : 0;  // polls, all cards
      early.manager->expect_next_pass(
          sorted_keys(keys), [plan = next.plan, fetched = next.fetched, keys_after,
                              polls = std::make_shared<std::atomic<int>>(0)] {
            StagingProgress progress;
            if (polls->fetch_add(1) < keys_after) return progress;
            progress.staged = plan.get();
            progress.rows_ready =
                fetched.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
            return progress;
          });
      between = [&](int c) { early.manager->prepare_next_pass(c); };
      // Every other pass trains only once the rows are fetched (the cards can insert from the
      // first step); the others start at once (the first steps find the keys but no rows).
      if (p % 2 == 0) next.fetched.wait();
    }
    early.train(keys, 3000 + p, tc.steps, between);
    reference.train(keys, 3000 + p, tc.steps);
    check_pass_rows("after training");
    early.manager->end_pass();
    reference.manager->end_pass();
    ahead.erase(p);
    if (ahead.count(p + 1)) ahead.at(p + 1).fetched.wait();  // the host rows it creates

    const auto got_host = early.host_rows();
    const auto want_host = reference.host_rows();
    for (const auto& [k, row] : want_host) {
      ASSERT_TRUE(got_host.count(k)) << "key " << k;
      ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "key " << k;
    }
    for (const auto& [k, row] : got_host) {
      if (want_host.count(k)) continue;
      ASSERT_TRUE(ahead.count(p + 1)) << "host row " << k << " neither trained nor staged";
      const StagedRows& next = *ahead.at(p + 1).plan;
      ASSERT_NE(std::find(next.keys.begin(), next.keys.end(), k), next.keys.end())
          << "host row " << k << " neither trained nor staged";
    }
    for (const auto& [k, row] : early.card_rows()) {
      ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "card row " << k << " differs from host";
    }
    if (p + 1 == evaluate_before) {
      // Both engines evaluate: the cards' keys change, so what was prepared is stale.
      const auto& eval_keys = passes[0];
      early.manager->begin_pass(eval_keys, {}, nullptr, PassAccess::kEvaluate);
      reference.manager->begin_pass(eval_keys, {}, nullptr, PassAccess::kEvaluate);
      EXPECT_FALSE(early.manager->prepare_next_pass(0)) << "stale work went on";
      early.manager->end_pass();
      reference.manager->end_pass();
    }
  }
  EXPECT_GT(early_chunks, 0u);
  if (tc.reaches_inserts) {
    EXPECT_GT(early_inserted, 0u) << "no staged row was inserted between steps";
    if (tc.row_budget > 0) {
      EXPECT_GT(early_evicted, 0u) << "no row was evicted between steps";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cards, NextPassWorkTest,
    ::testing::Values(NextPassCase{1, 0, 1000, 12, true}, NextPassCase{2, 0, 7, 12, false},
                      NextPassCase{1, 300, 1000, 12, true}, NextPassCase{1, 300, 1000, 4, false},
                      NextPassCase{2, 170, 1000, 12, true}, NextPassCase{2, 170, 7, 30, false},
                      NextPassCase{3, 120, 16, 40, true}, NextPassCase{3, 120, 1, 6, false},
                      // Paced chunks (their sizes vary with the measured times).
                      NextPassCase{1, 300, 1000, 40, false, 0.25},
                      NextPassCase{2, 0, 1000, 40, false, 0.01}),
    [](const auto& info) {
      return std::to_string(info.param.cards) + "cards_budget" +
             std::to_string(info.param.row_budget) + "_chunk" + std::to_string(info.param.chunk) +
             "_steps" + std::to_string(info.param.steps) +
             (info.param.step_fraction > 0 ? "_paced" : "");
    });

// ChunkPacer against hand-computed sizes: unpaced, every chunk is the largest; paced, it starts
// at kStartKeys, aims at step_fraction of the step at the measured rate, at most doubles or
// halves a chunk at a time, stays within [kMinKeys, max], and ignores measures that are not
// positive.
TEST(ChunkPacer, AimsAtAFractionOfTheStepWithinItsBounds) {
  const ChunkPacer unpaced(100000, 0);
  EXPECT_FALSE(unpaced.paced());
  EXPECT_EQ(unpaced.keys(), 100000u);
  ChunkPacer same = unpaced;
  same.observe(100000, 1.0, 0.001);
  EXPECT_EQ(same.keys(), 100000u);

  ChunkPacer pacer(100000, 0.25);
  EXPECT_EQ(pacer.keys(), ChunkPacer::kStartKeys);
  // 4096 keys took as long as the step (1 ms): 1024 keys would take a quarter; halved first.
  pacer.observe(4096, 1e-3, 1e-3);
  EXPECT_EQ(pacer.keys(), 2048u);
  pacer.observe(2048, 0.5e-3, 1e-3);  // the same rate
  EXPECT_EQ(pacer.keys(), 1024u);
  pacer.observe(1024, 0.25e-3, 1e-3);  // on target: stays
  EXPECT_EQ(pacer.keys(), 1024u);
  // 16x faster than that: 16384 wanted, doubled at most.
  pacer.observe(1024, 0.25e-3 / 16, 1e-3);
  EXPECT_EQ(pacer.keys(), 2048u);
  pacer.observe(2048, 0, 1e-3);  // no measure
  pacer.observe(2048, 1e-3, -1);
  EXPECT_EQ(pacer.keys(), 2048u);
  for (int i = 0; i < 20; ++i) pacer.observe(pacer.keys(), 1.0, 1e-3);  // very slow
  EXPECT_EQ(pacer.keys(), ChunkPacer::kMinKeys);
  for (int i = 0; i < 20; ++i) pacer.observe(pacer.keys(), 1e-9, 1e-3);  // very fast
  EXPECT_EQ(pacer.keys(), 100000u);
  // A largest size under the start and the floor.
  EXPECT_EQ(ChunkPacer(100, 0.25).keys(), 100u);
  ChunkPacer small(100, 0.25);
  small.observe(100, 1.0, 1e-3);
  EXPECT_EQ(small.keys(), 100u);
}

// ChunkChain against a simulated card whose stream runs `lag` polls behind the host: each poll
// the host enqueues one step (step_seconds of card time) and, when the chain lets it, a chunk
// (seconds_per_key a key) after it; a chunk's end has passed `lag` polls after it started. The
// card's clock gives every begin and end event its time, kept by event index as NextPassWork
// keeps its events, so the chain's own bookkeeping (which event ended the chunk before) is what
// the measures rest on.
struct SimulatedChain {
  SimulatedChain(std::size_t chain_depth, int card_lag) : depth(chain_depth), lag(card_lag) {}
  std::size_t depth;
  int lag;
  double step_seconds = 1e-3;
  double seconds_per_key = 1e-7;
  std::size_t started = 0;  // chunks
  std::vector<std::size_t> sizes;

  ChunkChain run(ChunkPacer pacer, int polls) {
    ChunkChain chain(pacer, depth);
    std::vector<double> begins(chain.depth() + 1, -1), ends(chain.depth() + 1, -1);
    std::vector<int> started_at(chain.depth() + 1, 0);
    double clock = 0;
    for (int p = 0; p < polls; ++p) {
      clock += step_seconds;  // the step before this poll
      chain.poll();
      while (chain.in_flight() > 0 && started_at[chain.oldest().event] + lag <= p) {
        const ChunkChain::Chunk& oldest = chain.oldest();
        std::optional<ChunkChain::Times> times;
        if (oldest.steps_before > 0) {
          times = ChunkChain::Times{ends[oldest.event] - begins[oldest.event],
                                    begins[oldest.event] - ends[chain.previous_event(oldest)]};
        }
        chain.retire(times);
      }
      if (const auto chunk = chain.start(1u << 30)) {
        begins[chunk->event] = clock;
        clock += static_cast<double>(chunk->keys) * seconds_per_key;
        ends[chunk->event] = clock;
        started_at[chunk->event] = p;
        ++started;
        sizes.push_back(chunk->keys);
      }
    }
    return chain;
  }
};

// Issue 31, item 4 (review): with one chunk in flight and a host running steps ahead of the
// card, the next pass's look-ups advanced once every `lag` steps. The chain keeps kDepth in
// flight: a chunk starts at every step for a lag up to kDepth; one in flight (what it replaced)
// starts one every `lag` polls.
TEST(ChunkChain, StartsAChunkEveryStepWhileTheCardLags) {
  for (int lag = 1; lag <= static_cast<int>(ChunkChain::kDepth); ++lag) {
    SimulatedChain chain{ChunkChain::kDepth, lag};
    chain.run(ChunkPacer(1000, 0), 100);
    EXPECT_EQ(chain.started, 100u) << "lag " << lag;
  }
  SimulatedChain one{1, 5};
  one.run(ChunkPacer(1000, 0), 100);
  EXPECT_EQ(one.started, 20u);
  SimulatedChain behind{ChunkChain::kDepth, 2 * static_cast<int>(ChunkChain::kDepth)};
  behind.run(ChunkPacer(1000, 0), 100);  // further behind than the chain is deep: no deadlock
  EXPECT_EQ(behind.started, 50u);
}

// The pacer's measures come from the chain's event times: at 0.1 us a key and a 1 ms step, a
// quarter of the step is 2500 keys. The chain reaches it from kStartKeys (halved at most once a
// chunk) whatever the lag, including when polls find the chain full and start nothing (the gap
// before the next chunk then spans several steps and is shared among them; before, such an idle
// poll restarted the measures and a lagging card was never paced).
TEST(ChunkChain, PacesFromTheGapsBetweenChunksAcrossIdlePolls) {
  for (const auto& [depth, lag] : std::vector<std::pair<std::size_t, int>>{
           {1, 1}, {1, 4}, {2, 5}, {ChunkChain::kDepth, 3}, {ChunkChain::kDepth, 9}}) {
    SimulatedChain sim{depth, lag};
    const ChunkChain chain = sim.run(ChunkPacer(100000, 0.25), 60);
    EXPECT_EQ(chain.pacer().keys(), 2500u) << "depth " << depth << ", lag " << lag;
    ASSERT_FALSE(sim.sizes.empty());
    EXPECT_EQ(sim.sizes.front(), ChunkPacer::kStartKeys);
    EXPECT_EQ(sim.sizes.back(), 2500u) << "depth " << depth << ", lag " << lag;
  }
  // The first chunk has no step measured before it: one chunk alone does not move the pacer.
  SimulatedChain first{ChunkChain::kDepth, 1};
  EXPECT_EQ(first.run(ChunkPacer(100000, 0.25), 2).pacer().keys(), ChunkPacer::kStartKeys);
  EXPECT_EQ(first.started, 2u);
}

// A chunk that found no work (a mark window without this card's keys, nothing left to erase or
// insert) takes ~0 s of card time: measured as a chunk of the pacer's size, it would double the
// next chunk (review of h68). Its size set to 0 measures nothing; one that did part of its size
// is measured at what it did.
TEST(ChunkChain, AChunkThatDidNoWorkMeasuresNothing) {
  const auto run = [](std::size_t second_keys) {
    ChunkChain chain(ChunkPacer(100000, 0.25), 2);
    chain.start(1u << 30);  // the first: nothing before it to measure against
    chain.retire(std::nullopt);
    chain.poll();
    chain.start(1u << 30);
    chain.set_newest_keys(second_keys);
    chain.retire(ChunkChain::Times{1e-9, 1e-3});  // ~0 s of card work after a 1 ms step
    return chain.pacer().keys();
  };
  EXPECT_EQ(run(0), ChunkPacer::kStartKeys);
  EXPECT_EQ(run(ChunkPacer::kStartKeys), 2 * ChunkPacer::kStartKeys);
}

// Edge cases of the next pass's card work on one card: no room until begin_pass (the card is
// full of the training pass's rows), a failed staging (its keys known, so the cards looked them
// up and made room, but its rows never came: its begin_pass gets none and places the same rows),
// a next pass larger than the budget (nothing done; its begin_pass fails as without the work),
// and steps that never reach the work (begin_pass does it all).
TEST(PassManager, NextPassWorkEdgeCases) {
  PassManagerOptions options;
  options.card_row_budget = 240;
  options.next_pass_chunk_keys = 1000;
  Engine early(1, options);
  options.next_pass_chunk_keys = 0;
  Engine reference(1, options);
  const auto a = make_passes(1, 240, 91).front();
  const auto b = make_passes(4, 240, 92).back();  // disjoint from a (a window further on)
  early.manager->begin_pass(a);
  reference.manager->begin_pass(a);
  StagedRows staged = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&staged));
  early.train(a, 1, 8, [&](int c) { early.manager->prepare_next_pass(c); });
  reference.train(a, 1, 8);
  early.manager->end_pass();
  reference.manager->end_pass();
  // The card is full of a's rows: nothing could be evicted or inserted during a.
  const PassStats got = early.manager->begin_pass(b, {}, &staged);
  const PassStats want = reference.manager->begin_pass(b);
  EXPECT_EQ(got.early_inserted, 0u);
  EXPECT_EQ(got.early_evicted, 0u);
  EXPECT_GT(got.early_chunks, 0u);
  EXPECT_EQ(got.evicted, want.evicted);
  EXPECT_EQ(got.prefetched, b.size());
  EXPECT_EQ(early.card_rows(), reference.card_rows());
  early.train(b, 2, 3);
  reference.train(b, 2, 3);
  early.manager->end_pass();
  reference.manager->end_pass();
  EXPECT_EQ(early.host_rows(), reference.host_rows());

  {
    // A failed staging: half of b trains (the card still holds all of b), then a pass of 120
    // new keys whose rows never arrive. The other half of b is evicted during the steps; no row
    // is inserted; its begin_pass, given no staged rows as the trainer does, pulls them all.
    SCOPED_TRACE("failed staging");
    const std::vector<uint64_t> half(b.begin(), b.begin() + 120);
    const auto fresh = make_passes(16, 120, 94).back();  // disjoint from a and b
    early.manager->begin_pass(half);
    reference.manager->begin_pass(half);
    const StagedRows planned = early.manager->plan_staging(fresh, {}, half);
    EXPECT_FALSE(planned.fetched);
    EXPECT_TRUE(planned.rows.empty());
    early.manager->expect_next_pass(sorted_keys(half), poll_of(&planned, /*rows_ready=*/false));
    early.train(half, 3, 8, [&](int c) { early.manager->prepare_next_pass(c); });
    reference.train(half, 3, 8);
    EXPECT_FALSE(early.manager->prepare_next_pass(0)) << "the work did not wait for the rows";
    early.manager->end_pass();
    reference.manager->end_pass();
    EXPECT_THROW(early.manager->begin_pass(fresh, {}, &planned), Error) << "rows never fetched";
    const PassStats got_fresh = early.manager->begin_pass(fresh);
    const PassStats want_fresh = reference.manager->begin_pass(fresh);
    EXPECT_EQ(got_fresh.early_evicted, 120u);
    EXPECT_EQ(got_fresh.early_inserted, 0u);
    EXPECT_EQ(got_fresh.evicted, want_fresh.evicted);
    EXPECT_EQ(got_fresh.pulled, fresh.size());
    // The cards chose other victims (the reference among all of b, the work outside `half`);
    // the pass's rows are the same.
    const auto got_cards = early.card_rows();
    const auto want_cards = reference.card_rows();
    for (uint64_t k : fresh) {
      ASSERT_TRUE(got_cards.count(k)) << "key " << k << " not on the card";
      EXPECT_EQ(got_cards.at(k), want_cards.at(k)) << "key " << k;
    }
    early.train(fresh, 4, 3);
    reference.train(fresh, 4, 3);
    early.manager->end_pass();
    reference.manager->end_pass();
    EXPECT_EQ(early.host_rows(), reference.host_rows());
  }
  {
    // A next pass over the budget: the cards do nothing; it fails at its begin_pass with its
    // numbers.
    SCOPED_TRACE("next pass over the budget");
    const auto big = make_passes(1, 300, 93).front();
    early.manager->begin_pass(a);
    StagedRows next = early.manager->stage_rows(big, {}, a);
    early.manager->expect_next_pass(sorted_keys(a), poll_of(&next));
    EXPECT_FALSE(early.manager->prepare_next_pass(0));
    EXPECT_FALSE(early.manager->prepare_next_pass(0));
    early.manager->end_pass();
    try {
      early.manager->begin_pass(big, {}, &next);
      ADD_FAILURE() << "a pass over the budget began";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
    }
  }
  // Staged but no step ran after it: begin_pass does all of the work.
  early.manager->begin_pass(a);
  StagedRows late = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&late));
  early.manager->end_pass();
  const PassStats all = early.manager->begin_pass(b, {}, &late);
  EXPECT_EQ(all.early_chunks, 0u);
  EXPECT_EQ(all.hits + all.pulled + all.prefetched, b.size());
  early.manager->end_pass();
}

// Issue 31, item 4: the next pass's look-ups between steps wait for nothing. A look-up chunk
// neither waits for the step's collectives before it (its scratch is sized when the work is
// expected) nor for its own readback (its rows are read a chunk later, once its event has
// passed): over a pass whose next pass's rows never arrive (look-ups only), the work's chunks
// wait for the card 0 times and allocate nothing; before, each waited 3 times (before the chunk,
// in the table's look-up, and for its rows). What begin_pass then places equals an engine without
// the work.
TEST(PassManager, NextPassLookupsWaitForNothing) {
  PassManagerOptions options;
  options.next_pass_chunk_keys = 50;  // 240 keys: 5 chunks, each read by the next
  Engine early(1, options);
  options.next_pass_chunk_keys = 0;
  Engine reference(1, options);
  const auto a = make_passes(1, 240, 95).front();
  const auto b = make_passes(3, 240, 95).back();  // overlaps a
  early.manager->begin_pass(a);
  reference.manager->begin_pass(a);
  const StagedRows planned = early.manager->plan_staging(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&planned, /*rows_ready=*/false));
  early.train(a, 1, 12, [&](int c) { early.manager->prepare_next_pass(c); });
  reference.train(a, 1, 12);
  early.manager->end_pass();
  reference.manager->end_pass();
  const PassStats got = early.manager->begin_pass(b);
  const PassStats want = reference.manager->begin_pass(b);
  EXPECT_GE(got.early_chunks, 6u);  // 5 enqueued, the last one read by a sixth
  EXPECT_EQ(got.early_host_syncs, 0u);
  EXPECT_EQ(got.early_allocations, 0u);
  EXPECT_EQ(got.hits, want.hits);
  EXPECT_EQ(got.pulled, want.pulled);
  EXPECT_EQ(early.card_rows(), reference.card_rows());
  early.manager->end_pass();
  reference.manager->end_pass();
}

// Issue 31, item 4: the next pass's marks between steps wait for nothing either, nor does the
// listing after them. Under a row budget that forces room to be made, a card's chunks go: 5
// look-ups (240 keys, 50 a chunk), the sixth poll reads the last and plans the marks, 5 mark
// chunks (the table's find, rows read back late), the twelfth poll reads the last and fixes the
// victims; the thirteenth lists the table (every slot, read back late). So 12 or 13 steps of
// work wait for the card 0 times and allocate nothing (before, each mark chunk waited 3 times,
// and the listing waited); and begin_pass then places what an engine without the work places.
TEST(PassManager, NextPassMarksWaitForNothing) {
  GPUBOX_REQUIRE_CARDS(1);
  const auto a = make_passes(1, 240, 91).front();
  const auto b = make_passes(4, 240, 92).back();  // disjoint from a: 240 rows over the budget
  for (const int steps : {12, 13}) {
    SCOPED_TRACE(std::to_string(steps) + " steps");
    PassManagerOptions options;
    options.card_row_budget = 300;
    options.next_pass_chunk_keys = 50;
    Engine early(1, options);
    options.next_pass_chunk_keys = 0;
    Engine reference(1, options);
    early.manager->begin_pass(a);
    reference.manager->begin_pass(a);
    const StagedRows planned = early.manager->plan_staging(b, {}, a);
    early.manager->expect_next_pass(sorted_keys(a), poll_of(&planned, /*rows_ready=*/false));
    early.train(a, 1, steps, [&](int c) { early.manager->prepare_next_pass(c); });
    reference.train(a, 1, steps);
    early.manager->end_pass();
    reference.manager->end_pass();
    const PassStats got = early.manager->begin_pass(b);
    const PassStats want = reference.manager->begin_pass(b);
    EXPECT_EQ(got.early_chunks, static_cast<uint64_t>(steps));
    EXPECT_EQ(got.early_host_syncs, 0u);
    EXPECT_EQ(got.early_allocations, 0u);
    EXPECT_EQ(got.evicted, want.evicted);
    EXPECT_EQ(got.hits + got.pulled + got.prefetched, want.hits + want.pulled + want.prefetched);
    EXPECT_EQ(early.card_rows(), reference.card_rows());
    early.manager->end_pass();
    reference.manager->end_pass();
  }
}

// Issue 31, item 4: the whole of making room between steps waits for nothing. The card holds
// rows outside both passes (60 of an older pass z, clean), so the work lists the table (every
// slot read back late, two list chunks in flight) and erases them (victims known present: no
// count read back; a late check that each was there) before it would insert. With the next
// pass's rows never fetched it stops there: 40 steps of look-ups, marks, listing and erasing wait
// for the card 0 times and allocate nothing. begin_pass then evicts as many rows as an engine
// without the work (the rest among the training pass's rows) and places the same rows of the
// next pass.
TEST(PassManager, NextPassRoomIsMadeWithoutWaiting) {
  GPUBOX_REQUIRE_CARDS(1);
  const auto z = make_passes(8, 240, 93).back();   // keys from 840 up
  const auto a = make_passes(1, 240, 91).front();  // below 360
  const auto b = make_passes(5, 240, 92).back();   // from 480 to 840: disjoint from both
  PassManagerOptions options;
  options.card_row_budget = 300;
  options.next_pass_chunk_keys = 50;
  Engine early(1, options);
  options.next_pass_chunk_keys = 0;
  Engine reference(1, options);
  for (Engine* engine : {&early, &reference}) {
    engine->manager->begin_pass(z);
    engine->train(z, 7, 3);
    engine->manager->end_pass();
    engine->manager->begin_pass(a);  // 180 of z's rows leave: 60 stay
  }
  const StagedRows planned = early.manager->plan_staging(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&planned, /*rows_ready=*/false));
  early.train(a, 1, 40, [&](int c) { early.manager->prepare_next_pass(c); });
  reference.train(a, 1, 40);
  early.manager->end_pass();
  reference.manager->end_pass();
  const PassStats got = early.manager->begin_pass(b);
  const PassStats want = reference.manager->begin_pass(b);
  // Look-ups, marks, the listing and the erases took fewer chunks than the steps; the work then
  // waits for the rows (polls that count no chunk).
  EXPECT_LT(got.early_chunks, 40u);
  EXPECT_EQ(got.early_host_syncs, 0u);
  EXPECT_EQ(got.early_allocations, 0u);
  EXPECT_EQ(got.early_evicted, 60u) << "z's rows were not erased between steps";
  EXPECT_EQ(got.evicted, want.evicted);
  EXPECT_EQ(got.rows_on_cards, want.rows_on_cards);
  const auto got_cards = early.card_rows();
  const auto want_cards = reference.card_rows();
  for (uint64_t k : b) {
    ASSERT_TRUE(got_cards.count(k)) << "key " << k;
    ASSERT_TRUE(rows_equal(got_cards.at(k), want_cards.at(k))) << "key " << k;
  }
  early.manager->end_pass();
  reference.manager->end_pass();
}

// A poll that reports nothing for its first `polls` calls (every card's together), then
// `staged` planned and fetched.
std::function<StagingProgress()> poll_after(const StagedRows* staged, int polls) {
  return [staged, polls, count = std::make_shared<std::atomic<int>>(0)] {
    if (count->fetch_add(1) < polls) return StagingProgress{};
    return StagingProgress{staged, true};
  };
}

// Issue 31, items 1 and 4: the next pass's inserts between steps wait for nothing either. The
// next pass has 1600 new keys, more than the cards' tables hold without growing. With its keys
// planned when the work is expected, each card's table and pool are sized then (between
// passes) for its staged keys; with its rows fetched, a card's chunks go: its look-ups (100 keys
// a chunk), then inserts of its staged keys, 100 a chunk, each read back a chunk later. Every
// staged row goes in between the steps with 0 waits for the card and 0 allocations (before:
// 1 + 4-5 waits a page of rows, and the table's growth). With its keys planned only later (as
// the trainer's pipeline reads the pass after expect_next_pass), the first insert chunk of each
// card waits once and grows its table (the wait, the rehash's readback; the new slot array and
// the rehash's two temporaries), the others wait for nothing. Either way begin_pass then places
// the rows an engine without the work places, and after the pass trains both host tiers agree
// bit for bit.
TEST(PassManager, NextPassInsertsWaitForNothing) {
  for (const int cards : {1, 2}) {
    for (const bool planned_at_expect : {true, false}) {
      GPUBOX_REQUIRE_CARDS(cards);
      SCOPED_TRACE(std::to_string(cards) + " cards, keys planned " +
                   (planned_at_expect ? "when expected" : "later"));
      PassManagerOptions options;
      options.next_pass_chunk_keys = 100;
      Engine early(cards, options);
      options.next_pass_chunk_keys = 0;
      Engine reference(cards, options);
      const auto a = make_passes(1, 240, 95).front();
      const auto b = make_passes(3, 1600, 96).back();  // disjoint from a
      early.manager->begin_pass(a);
      reference.manager->begin_pass(a);
      StagedRows staged = early.manager->stage_rows(b, {}, a);  // the cards hold a: b less a
      ASSERT_EQ(staged.keys.size(), b.size());
      early.manager->expect_next_pass(sorted_keys(a),
                                      poll_after(&staged, planned_at_expect ? 0 : 2 * cards));
      early.train(a, 1, 40, [&](int c) { early.manager->prepare_next_pass(c); });
      reference.train(a, 1, 40);
      EXPECT_EQ(early.manager->next_pass_phase(0), NextPassCard::Phase::kDone);
      early.manager->end_pass();
      reference.manager->end_pass();
      const PassStats got = early.manager->begin_pass(b, {}, &staged);
      const PassStats want = reference.manager->begin_pass(b);
      EXPECT_EQ(got.early_inserted, staged.keys.size()) << "a staged row was left to begin_pass";
      const uint64_t grows = planned_at_expect ? 0 : static_cast<uint64_t>(cards);
      EXPECT_EQ(got.early_host_syncs, 2 * grows);
      EXPECT_EQ(got.early_allocations, 3 * grows);
      EXPECT_EQ(got.pulled, 0u);
      EXPECT_EQ(got.hits, want.hits);
      EXPECT_EQ(got.prefetched, want.pulled);
      EXPECT_EQ(early.card_rows(), reference.card_rows());
      early.train(b, 2, 4);
      reference.train(b, 2, 4);
      early.manager->end_pass();
      reference.manager->end_pass();
      EXPECT_EQ(early.host_rows(), reference.host_rows());
    }
  }
}

// The same under a row budget that makes the work erase rows outside both passes first (60 of an
// older pass z): the inserts fill the room the erases made, between the steps, waiting for
// nothing (the victims' erased slots stay within the table's load bound: it was sized for the
// budget). The rows placed are an engine's without the work.
TEST(PassManager, NextPassInsertsAfterErasesWaitForNothing) {
  GPUBOX_REQUIRE_CARDS(1);
  const auto z = make_passes(8, 240, 93).back();
  const auto a = make_passes(1, 240, 91).front();
  const auto b = make_passes(5, 240, 92).back();  // disjoint from both
  PassManagerOptions options;
  options.card_row_budget = 300;
  options.next_pass_chunk_keys = 50;
  Engine early(1, options);
  options.next_pass_chunk_keys = 0;
  Engine reference(1, options);
  for (Engine* engine : {&early, &reference}) {
    engine->manager->begin_pass(z);
    engine->train(z, 7, 3);
    engine->manager->end_pass();
    engine->manager->begin_pass(a);  // 180 of z's rows leave: 60 stay
  }
  StagedRows staged = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&staged));
  early.train(a, 1, 40, [&](int c) { early.manager->prepare_next_pass(c); });
  reference.train(a, 1, 40);
  early.manager->end_pass();
  reference.manager->end_pass();
  const PassStats got = early.manager->begin_pass(b, {}, &staged);
  const PassStats want = reference.manager->begin_pass(b);
  EXPECT_EQ(got.early_evicted, 60u);
  EXPECT_EQ(got.early_inserted, 60u) << "the room the erases made was not filled";
  EXPECT_EQ(got.early_host_syncs, 0u);
  EXPECT_EQ(got.early_allocations, 0u);
  EXPECT_EQ(got.evicted, want.evicted);
  const auto got_cards = early.card_rows();
  const auto want_cards = reference.card_rows();
  for (uint64_t k : b) {
    ASSERT_TRUE(got_cards.count(k)) << "key " << k;
    ASSERT_TRUE(rows_equal(got_cards.at(k), want_cards.at(k))) << "key " << k;
  }
  early.train(b, 2, 3);
  reference.train(b, 2, 3);
  early.manager->end_pass();
  reference.manager->end_pass();
  EXPECT_EQ(early.host_rows(), reference.host_rows());
}

enum class VictimPlant { kNone, kMissing, kMoved };

// The rows card 0 of `engine` holds `keys` at.
std::vector<card_table::row_index_t> card0_rows(Engine& engine, const std::vector<uint64_t>& keys) {
  device::Card& card = engine.card_set.card(0);
  auto d_keys = device::to_device(keys, card.memory(), card.stream());
  auto d_rows = card.make_buffer<card_table::row_index_t>(keys.size());
  engine.stores[0]->table().find(d_keys.data(), keys.size(), d_rows.data(), card.stream());
  return device::to_host(d_rows);
}

// Changes card 0's table under its next pass's work: victims[0] erased (kMissing), or victims[0]
// and victims[1] erased and inserted again in the other order, so each takes the other's row
// with its own record (kMoved).
void plant_victim_change(Engine& engine, VictimPlant plant, const std::vector<uint64_t>& victims) {
  device::Card& card = engine.card_set.card(0);
  const device::Stream& stream = card.stream();
  card_table::CardSparseStore& store = *engine.stores[0];
  if (plant == VictimPlant::kMissing) {
    auto d_key = device::to_device(std::vector<uint64_t>{victims[0]}, card.memory(), stream);
    ASSERT_EQ(store.erase(d_key.data(), 1, stream), 1u);
  } else if (plant == VictimPlant::kMoved) {
    const std::vector<uint64_t> two = {victims[0], victims[1]};
    const auto before = card0_rows(engine, two);
    auto d_two = device::to_device(two, card.memory(), stream);
    auto records = card.make_buffer<float>(2 * store.record_stride());
    store.read_rows(d_two.data(), 2, records.data(), stream);
    std::vector<float> swapped_records = device::to_host(records);
    std::rotate(swapped_records.begin(), swapped_records.begin() + store.record_stride(),
                swapped_records.end());
    ASSERT_EQ(store.erase(d_two.data(), 2, stream), 2u);
    auto d_swapped =
        device::to_device(std::vector<uint64_t>{victims[1], victims[0]}, card.memory(), stream);
    auto d_records = device::to_device(swapped_records, card.memory(), stream);
    ASSERT_EQ(store.insert_rows(d_swapped.data(), d_records.data(), 2, stream), 2u);
    const auto after = card0_rows(engine, two);
    ASSERT_EQ(after[0], before[1]) << "the plant did not move the rows";
    ASSERT_EQ(after[1], before[0]) << "the plant did not move the rows";
  }
}

// Issue 31: the next pass's erases check that each victim is still on the card at the row its
// listing gave it. The card holds 60 rows of an older pass z outside both passes (the victims:
// all leave, in one erase chunk); the work runs a chunk at a time until they are chosen (kErase),
// then the test changes the table under it: one victim erased (missing), or two victims' rows
// swapped (moved). The job stops with an error naming the card and the key, whether the erase is
// read by the work's next chunk or, still in flight when the pass ends, by end_pass before its
// write-back lists the table (NextPassWork::settle). Untouched, the same work goes on and
// begin_pass uses it.
TEST(PassManager, NextPassErasesCheckEachVictimsRow) {
  GPUBOX_REQUIRE_CARDS(1);
  const auto z = make_passes(8, 240, 93).back();
  const auto a = make_passes(1, 240, 91).front();
  const auto b = make_passes(5, 240, 92).back();
  std::set<uint64_t> passes_keys(a.begin(), a.end());
  passes_keys.insert(b.begin(), b.end());
  for (const VictimPlant plant : {VictimPlant::kNone, VictimPlant::kMissing, VictimPlant::kMoved}) {
    for (const bool at_pass_end : {false, true}) {
      SCOPED_TRACE(std::string(plant == VictimPlant::kNone      ? "untouched"
                               : plant == VictimPlant::kMissing ? "missing"
                                                                : "moved") +
                   (at_pass_end ? ", read at the pass's end" : ", read by the work"));
      PassManagerOptions options;
      options.card_row_budget = 300;
      options.next_pass_chunk_keys = 100;
      Engine early(1, options);
      early.manager->begin_pass(z);
      early.train(z, 7, 3);
      early.manager->end_pass();
      early.manager->begin_pass(a);
      const StagedRows planned = early.manager->plan_staging(b, {}, a);
      early.manager->expect_next_pass(sorted_keys(a), poll_of(&planned, /*rows_ready=*/false));
      for (int i = 0; i < 100 && early.manager->next_pass_phase(0) != NextPassCard::Phase::kErase;
           ++i) {
        early.manager->prepare_next_pass(0);
      }
      ASSERT_EQ(early.manager->next_pass_phase(0), NextPassCard::Phase::kErase);
      std::vector<uint64_t> victims;
      for (uint64_t k : early.manager->resident_keys()) {
        if (passes_keys.count(k) == 0) victims.push_back(k);
      }
      ASSERT_EQ(victims.size(), 60u);
      std::sort(victims.begin(), victims.end());
      plant_victim_change(early, plant, victims);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      try {
        if (at_pass_end) {
          early.manager->prepare_next_pass(0);  // the erase enqueued, its check not read
          early.manager->end_pass();
          EXPECT_EQ(early.manager->begin_pass(b).early_evicted, 60u);
        } else {
          for (int i = 0; i < 5; ++i) early.manager->prepare_next_pass(0);
          EXPECT_EQ(early.manager->next_pass_phase(0), NextPassCard::Phase::kInsert);
        }
        EXPECT_TRUE(plant == VictimPlant::kNone)
            << "a victim changed under the work went unnoticed";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_TRUE(plant != VictimPlant::kNone) << what;
        EXPECT_NE(what.find("card 0"), std::string::npos) << what;
        const bool named = what.find("key " + std::to_string(victims[0])) != std::string::npos ||
                           (plant == VictimPlant::kMoved &&
                            what.find("key " + std::to_string(victims[1])) != std::string::npos);
        EXPECT_TRUE(named) << what;
      }
    }
  }
}

// Eviction removes exactly the `excess` rows outside the pass with the lowest (score, key): an
// oracle from the card rows' scores before each begin_pass (many rows share a score, so the key
// decides among them), over passes that overlap, are all on the card, or are empty.
TEST(PassManager, EvictionRemovesTheLowestScoredRowsOutsideThePass) {
  GPUBOX_REQUIRE_CARDS(1);
  PassManagerOptions options;
  options.card_row_budget = 300;
  options.host_batch_keys = 37;
  Engine engine(1, options);
  const AccessorConfig cfg = test_config();
  auto passes = make_passes(6, 240, 79);
  passes.insert(passes.begin() + 3,
                std::vector<uint64_t>(passes[2].begin(), passes[2].begin() + 90));
  passes.insert(passes.begin() + 4, std::vector<uint64_t>{});
  uint64_t evicted = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    const auto before = engine.card_rows();
    std::vector<std::pair<float, uint64_t>> outside;  // (score, key) of rows the pass lacks
    std::size_t missing = 0;
    for (uint64_t k : keys) missing += before.count(k) == 0;
    for (const auto& [k, row] : before) {
      if (!std::binary_search(keys.begin(), keys.end(), k))
        outside.emplace_back(table::row_score(row.data(), cfg), k);
    }
    const std::size_t excess = before.size() + missing > options.card_row_budget
                                   ? before.size() + missing - options.card_row_budget
                                   : 0;
    ASSERT_LE(excess, outside.size());
    std::sort(outside.begin(), outside.end());
    std::set<uint64_t> want(keys.begin(), keys.end());
    for (std::size_t i = excess; i < outside.size(); ++i) want.insert(outside[i].second);

    const PassStats stats = engine.manager->begin_pass(keys);
    EXPECT_EQ(stats.evicted, excess) << "pass " << p;
    std::set<uint64_t> got;
    for (const auto& [k, row] : engine.card_rows()) got.insert(k);
    EXPECT_EQ(got, want) << "pass " << p;
    evicted += stats.evicted;
    if (!keys.empty()) engine.train(keys, 3000 + p, 4);
    engine.manager->end_pass();
  }
  EXPECT_GT(evicted, 0u);
}

// end_pass(keep): the rows of the next pass's keys stay on the cards, dirty, and the host tier
// holds their older value until a later end_pass or sync() writes them; the cards (eviction
// included) and, after the last pass, the host tier equal a run that writes everything back
// each pass. A keep that is not the next pass's keys cannot make eviction drop a dirty row: it
// fails, naming the kept rows.
TEST(PassManager, KeptRowsStayDirtyUntilALaterEndPassOrSync) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 170;
  options.host_batch_keys = 37;
  Engine kept(2, options);
  Engine reference(2, options);
  const auto passes = make_passes(6, 240, 81);
  uint64_t kept_total = 0, evicted = 0, written = 0, written_reference = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    const PassStats got_begin = kept.manager->begin_pass(keys);
    const PassStats want_begin = reference.manager->begin_pass(keys);
    EXPECT_EQ(got_begin.hits, want_begin.hits) << "pass " << p;
    EXPECT_EQ(got_begin.evicted, want_begin.evicted) << "pass " << p;
    evicted += got_begin.evicted;
    kept.train(keys, 4000 + p, 4);
    reference.train(keys, 4000 + p, 4);
    const bool last = p + 1 == passes.size();
    const PassStats got = kept.manager->end_pass(last ? std::vector<uint64_t>{} : passes[p + 1]);
    const PassStats want = reference.manager->end_pass();
    // A kept row not trained again stays dirty: a later end_pass writes it (once).
    written += got.written_back;
    written_reference += want.written_back;
    kept_total += got.kept_dirty;
    const auto got_cards = kept.card_rows();
    const auto want_cards = reference.card_rows();
    ASSERT_EQ(got_cards.size(), want_cards.size()) << "pass " << p;
    for (const auto& [k, row] : want_cards) {
      ASSERT_TRUE(got_cards.count(k) && rows_equal(got_cards.at(k), row)) << k << " pass " << p;
    }
    // The host tier: every row equal but the kept ones, which hold an older value.
    const auto got_host = kept.host_rows();
    const auto want_host = reference.host_rows();
    ASSERT_EQ(got_host.size(), want_host.size()) << "pass " << p;
    std::size_t stale = 0;
    for (const auto& [k, row] : want_host) {
      if (rows_equal(got_host.at(k), row)) continue;
      ASSERT_TRUE(!last && std::binary_search(passes[p + 1].begin(), passes[p + 1].end(), k))
          << "host row " << k << " differs but was not kept, pass " << p;
      ++stale;
    }
    EXPECT_EQ(stale, got.kept_dirty) << "pass " << p;
    if (p == 2) {
      // A save's sync() writes the kept rows too.
      EXPECT_EQ(kept.manager->sync(), got.kept_dirty);
      for (const auto& [k, row] : kept.host_rows()) {
        ASSERT_TRUE(rows_equal(row, want_host.at(k))) << "after sync, key " << k;
      }
    }
  }
  EXPECT_GT(kept_total, 0u);
  EXPECT_LT(written, written_reference) << "keeping rows saved no write-back";
  EXPECT_GT(evicted, 0u) << "the budget never forced an eviction";

  // Misuse: keeping this pass's own keys, not the next pass's. Eviction spares the dirty rows
  // (the host tier ends equal to the reference's); when too few clean rows are left it fails.
  PassManagerOptions one_card;
  one_card.card_row_budget = 300;
  Engine misused(1, one_card);
  Engine plain(1, one_card);
  for (std::size_t p = 0; p < 2; ++p) {
    misused.manager->begin_pass(passes[p]);
    plain.manager->begin_pass(passes[p]);
    misused.train(passes[p], 5000 + p, 4);
    plain.train(passes[p], 5000 + p, 4);
    misused.manager->end_pass(passes[p]);
    plain.manager->end_pass();
  }
  misused.manager->sync();
  const auto want_host = plain.host_rows();
  for (const auto& [k, row] : misused.host_rows()) {
    ASSERT_TRUE(rows_equal(row, want_host.at(k))) << "key " << k << " lost its update";
  }
  misused.manager->begin_pass(passes[2]);
  misused.train(passes[2], 5002, 4);
  misused.manager->end_pass(passes[2]);
  std::vector<uint64_t> disjoint;  // none of pass 2's keys: every dirty row is outside it
  for (uint64_t k : passes[2]) disjoint.push_back(k + 2);
  std::sort(disjoint.begin(), disjoint.end());
  try {
    misused.manager->begin_pass(disjoint);
    FAIL() << "evicted a dirty row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kept"), std::string::npos) << e.what();
  }
}

// The next pass's card work with a `keep` wider than the next pass's keys (each end_pass keeps
// its own pass's rows too): rows outside both passes may then be dirty, their newest value only
// on the card. The work and begin_pass's remainder spare them; the host tier ends equal to an
// engine that keeps nothing and does no early work.
TEST(PassManager, NextPassWorkSparesRowsAWiderKeepLeftDirty) {
  PassManagerOptions options;
  options.card_row_budget = 600;
  Engine plain(1, options);
  options.next_pass_chunk_keys = 16;
  Engine early(1, options);
  const auto passes = make_passes(6, 240, 83);
  std::shared_future<StagedRows> ahead;
  uint64_t early_evicted = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const StagedRows* staged = ahead.valid() ? &ahead.get() : nullptr;
    early_evicted += early.manager->begin_pass(passes[p], {}, staged).early_evicted;
    plain.manager->begin_pass(passes[p]);
    std::function<void(int)> between;
    std::shared_future<StagedRows> next;
    if (p + 1 < passes.size()) {
      std::set<uint64_t> exclude(passes[p].begin(), passes[p].end());
      const std::vector<uint64_t> resident = early.manager->resident_keys();
      exclude.insert(resident.begin(), resident.end());
      next = std::async(std::launch::async, [&early, &passes, p,
                                             excluded = std::vector<uint64_t>(exclude.begin(),
                                                                              exclude.end())] {
               return early.manager->stage_rows(passes[p + 1], {}, excluded);
             }).share();
      next.wait();
      early.manager->expect_next_pass(sorted_keys(passes[p]), poll_of(&next.get()));
      between = [&](int c) { early.manager->prepare_next_pass(c); };
    }
    early.train(passes[p], 7000 + p, 60, between);
    plain.train(passes[p], 7000 + p, 60);
    std::set<uint64_t> keep(passes[p].begin(), passes[p].end());
    if (p + 1 < passes.size()) keep.insert(passes[p + 1].begin(), passes[p + 1].end());
    early.manager->end_pass(std::vector<uint64_t>(keep.begin(), keep.end()));
    plain.manager->end_pass();
    ahead = next;
  }
  early.manager->sync();
  EXPECT_GT(early_evicted, 0u) << "the work never evicted between steps";
  const auto want_host = plain.host_rows();
  const auto got_host = early.host_rows();
  for (const auto& [k, row] : want_host) {
    ASSERT_TRUE(got_host.count(k)) << "key " << k;
    ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "key " << k << " lost its update";
  }
}

// stage_rows drops key 0, duplicates (the first slot wins) and the excluded keys, creates new
// rows with their slots, and returns rows in key order equal to a pull's; nothing for no keys.
TEST(PassManager, StageRowsSortsDedupsExcludesAndCreates) {
  Engine engine(1, PassManagerOptions{});
  EXPECT_TRUE(engine.manager->stage_rows({}, {}, {}).keys.empty());
  const std::vector<uint64_t> keys = {mix64(9) | 1, 0, mix64(3) | 1, mix64(9) | 1, mix64(5) | 1};
  const std::vector<int32_t> slots = {4, 1, 2, 7, 3};
  std::vector<uint64_t> exclude = {mix64(5) | 1};
  const StagedRows staged = engine.manager->stage_rows(keys, slots, exclude);
  ASSERT_EQ(staged.owned.size(), 1u);
  EXPECT_EQ(staged.owned[0].keys.size(), 3u) << "the pass's keys, the excluded one too";
  EXPECT_EQ(staged.card_end, std::vector<std::size_t>{2});
  std::vector<uint64_t> want = {mix64(9) | 1, mix64(3) | 1};
  std::sort(want.begin(), want.end());
  ASSERT_EQ(staged.keys, want);
  EXPECT_EQ(staged.created, 2u);
  const int stride = engine.host->layout().stride();
  ASSERT_EQ(staged.rows.size(), 2u * stride);
  EXPECT_EQ(staged.bytes(), 2 * sizeof(uint64_t) + 2 * stride * sizeof(float) +
                                3 * (sizeof(uint64_t) + sizeof(int32_t)));
  const auto host = engine.host_rows();
  EXPECT_EQ(host.size(), 2u) << "the excluded key was pulled";
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::vector<float> row(staged.rows.begin() + i * stride,
                                 staged.rows.begin() + (i + 1) * stride);
    EXPECT_TRUE(rows_equal(row, host.at(want[i])));
    EXPECT_EQ(row[engine.host->layout().slot()], want[i] == (mix64(9) | 1) ? 4.0f : 2.0f);
  }
  EXPECT_THROW(engine.manager->stage_rows(keys, {1}, {}), Error);
  EXPECT_THROW(engine.manager->stage_rows(keys, {}, {5, 2}), Error);
}

TEST(PassManager, PassLargerThanBudgetFailsBeforeTrainingWithNumbers) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 10;
  Engine engine(2, options);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 100; ++k) keys.push_back(mix64(k));
  try {
    engine.manager->begin_pass(keys);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not fit on card"), std::string::npos) << what;
    EXPECT_NE(what.find("budget is 10 rows"), std::string::npos) << what;
    EXPECT_NE(what.find("more cards"), std::string::npos) << what;
  }
  EXPECT_FALSE(engine.manager->in_pass());
  EXPECT_EQ(engine.host_rows().size(), 0u) << "nothing pulled for a pass that cannot fit";
}

// Collective mode's placement: every card holds every key of every pass, the replicas stay
// identical, the host tier gets one replica's dirty rows (the same count as the sharded owners
// write) and ends bit-identical to the sharded run's (same merges in the same order:
// heter_comm.hpp).
TEST(PassManager, ReplicatedPassesMatchShardedAndWriteBackOneReplica) {
  GPUBOX_REQUIRE_CARDS(3);
  PassManagerOptions sharded_options;
  PassManagerOptions replicated_options;
  replicated_options.placement = heter_comm::Placement::kReplicated;
  Engine sharded(3, sharded_options);
  Engine replicated(3, replicated_options);
  const auto passes = make_passes(4, 120, /*seed=*/8);
  std::set<uint64_t> seen;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const PassStats want_begin = sharded.manager->begin_pass(passes[p]);
    const PassStats got_begin = replicated.manager->begin_pass(passes[p]);
    seen.insert(passes[p].begin(), passes[p].end());
    EXPECT_EQ(got_begin.keys_in_pass, 3 * passes[p].size()) << "pass " << p;
    EXPECT_EQ(got_begin.rows_on_cards, 3 * seen.size()) << "pass " << p << ": nothing evicted";
    EXPECT_EQ(got_begin.created, want_begin.created) << "pass " << p << ": each new row once";
    sharded.train(passes[p], p + 1, 3);
    replicated.train(passes[p], p + 1, 3);
    const PassStats want_end = sharded.manager->end_pass();
    const PassStats got_end = replicated.manager->end_pass();
    EXPECT_EQ(got_end.written_back, want_end.written_back) << "pass " << p;
    const auto want_rows = sharded.host_rows();
    const auto got_rows = replicated.host_rows();
    ASSERT_EQ(got_rows.size(), want_rows.size()) << "pass " << p;
    for (const auto& [key, row] : want_rows) {
      ASSERT_TRUE(rows_equal(got_rows.at(key), row)) << "pass " << p << " key " << key;
    }
    const auto cards = replicated.card_rows();  // checks the replicas against each other
    EXPECT_EQ(cards.size(), seen.size());
    for (const auto& [key, row] : cards) EXPECT_TRUE(rows_equal(row, want_rows.at(key))) << key;
  }
}

// A replica is the whole table: when the table outgrows the card budget, begin_pass fails with
// the table's size in rows and bytes (nothing is evicted), before it pulls anything.
TEST(PassManager, ReplicatedTableOverBudgetFailsWithItsSize) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 150;
  options.placement = heter_comm::Placement::kReplicated;
  Engine engine(2, options);
  std::vector<uint64_t> first;
  std::vector<uint64_t> second;
  for (uint64_t k = 1; k <= 100; ++k) first.push_back(mix64(k));
  for (uint64_t k = 101; k <= 200; ++k) second.push_back(mix64(k));
  engine.manager->begin_pass(first);  // 100 rows per card: fits
  engine.manager->end_pass();
  try {
    engine.manager->begin_pass(second);  // 200 rows per card: over the budget
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string bytes = std::to_string(engine.manager->plan_for(200).total_bytes());
    EXPECT_NE(what.find("whole embedding table on every card"), std::string::npos) << what;
    EXPECT_NE(what.find("grown to 200 rows (" + bytes + " bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("budget holds 150 rows"), std::string::npos) << what;
    EXPECT_NE(what.find("runner.card_memory_mb"), std::string::npos) << what;
  }
  EXPECT_EQ(engine.host_rows().size(), 100u) << "nothing pulled for a table that cannot fit";
}

TEST(PassManager, MemoryBudgetPlansFromRealCapacities) {
  PassManagerOptions options;
  Engine probe(1, options);
  const CardTierPlan plan = probe.manager->plan_for(1000);
  const card_table::CardSparseStore& store = *probe.stores[0];
  // Slots at their real power of two (1000 / 0.6 -> 2048), rows in whole pages.
  EXPECT_EQ(plan.table_bytes, 2048u * 16);
  EXPECT_EQ(plan.row_page_bytes, store.page_bytes());
  EXPECT_EQ(plan.row_bytes, store.bytes_per_row());
  EXPECT_GT(plan.bytes_per_key(), store.bytes_per_row() + 27.0);
  EXPECT_NE(plan.to_string().find("1000 rows"), std::string::npos) << plan.to_string();
  // Without a budget the line says so and gives the per-key cost at the worst table fill.
  EXPECT_NE(probe.manager->plan().to_string().find("no budget"), std::string::npos);
  EXPECT_GE(probe.manager->plan().table_bytes, 53u);
  // A byte budget becomes the most rows whose footprint fits.
  options.card_memory_bytes = plan.total_bytes();
  Engine engine(1, options);
  EXPECT_EQ(engine.manager->row_budget(), 1000u);
  EXPECT_EQ(engine.manager->plan().total_bytes(), plan.total_bytes());
  // The store was sized for the budget up front: its table already has the planned slots.
  EXPECT_EQ(engine.stores[0]->table().capacity(), 2048u);
  options.card_memory_bytes = 100;
  EXPECT_THROW(Engine(1, options), Error);
}

// Marks the listed keys' rows changed (click + 1, dirty), as a training step would.
struct TouchRows {
  card_table::CardStoreRef store;
  const uint64_t* keys;
  GPUBOX_HD void operator()(std::size_t i) const {
    const card_table::row_index_t r = store.find(keys[i]);
    if (r == card_table::kInvalidRow) return;
    store.row(r)[table::RowLayout::kClick] += 1.0f;
    store.mark_dirty(r);
  }
};

// One card, its store and its own host tier, for the peak-memory test.
struct BudgetSide {
  explicit BudgetSide(const AccessorConfig& cfg, const card_table::HashTableOptions& table_options)
      : cards(device::CardSet::from_list("0")),
        host(std::move(table::SparseTable::open(cfg, table::HostTableConfig{}).value())),
        store(cards.card(0), cfg, table_options),
        touch(cards.card(0).make_buffer<uint64_t>(kTouched)) {}
  static constexpr std::size_t kTouched = 400;
  device::CardSet cards;
  std::unique_ptr<table::SparseTable> host;
  card_table::CardSparseStore store;
  device::device_buffer<uint64_t> touch;  // the test's own card buffer
};

// Growth, eviction and reinsertion under a byte budget, with small pages so the store spans many:
// CardMemory's peak (everything the card ever held at once) stays under the plan, and the host
// tier ends bit-identical to an unbudgeted run of the same passes.
TEST(PassManager, PeakCardMemoryStaysUnderThePlan) {
  const AccessorConfig cfg = test_config();
  card_table::HashTableOptions table_options;
  table_options.initial_capacity = 16;
  table_options.page_rows = 64;
  BudgetSide budgeted(cfg, table_options);
  BudgetSide unbudgeted(cfg, table_options);
  PassManagerOptions options;
  options.host_batch_keys = 150;
  const std::size_t budget_rows = 700;
  options.card_memory_bytes =
      PassManager(budgeted.cards, {&budgeted.store}, *budgeted.host, options)
          .plan_for(budget_rows)
          .total_bytes();
  PassManager manager(budgeted.cards, {&budgeted.store}, *budgeted.host, options);
  PassManager reference(unbudgeted.cards, {&unbudgeted.store}, *unbudgeted.host, {});
  ASSERT_EQ(manager.row_budget(), budget_rows);

  const auto passes = make_passes(8, 600, 91);
  uint64_t evicted = 0;
  std::mt19937_64 rng(4);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    evicted += manager.begin_pass(passes[p]).evicted;
    reference.begin_pass(passes[p]);
    std::vector<uint64_t> touched(BudgetSide::kTouched);
    for (auto& k : touched) k = passes[p][rng() % passes[p].size()];
    for (BudgetSide* side : {&budgeted, &unbudgeted}) {
      device::Card& card = side->cards.card(0);
      device::copy_async(side->touch.data(), touched.data(), touched.size(), card.stream());
      device::parallel_for(card.stream(), touched.size(),
                           TouchRows{side->store.ref(), side->touch.data()});
      card.stream().synchronize();
    }
    EXPECT_GT(manager.end_pass().written_back, 0u);
    reference.end_pass();
  }
  EXPECT_GT(evicted, 0u) << "the budget never forced an eviction";
  EXPECT_GT(budgeted.store.table().pool().pages(), 8u);

  const CardTierPlan& plan = manager.plan();
  const std::size_t peak = budgeted.cards.card(0).memory().peak_bytes();
  // Rows in whole pages (at most one page beyond the budget's rows), the table at its planned
  // power of two, the index, and the largest pass-boundary working set: never a second copy of
  // the rows. Thrust's temporaries come from the card's scratch arena (device rule 4), whose
  // size is the algorithms' own: n-sized on the cpu backend's OpenMP system, small with CUB.
  const std::size_t scratch = budgeted.cards.card(0).scratch().peak();
  EXPECT_LE(peak, plan.total_bytes() + budgeted.touch.bytes() + scratch) << plan.to_string();
  EXPECT_GE(peak, budgeted.store.table().pool().pages() * budgeted.store.page_bytes());
  EXPECT_LE(plan.row_page_bytes, budget_rows * plan.row_bytes + budgeted.store.page_bytes());

  std::map<uint64_t, std::vector<float>> got, want;
  const int stride = budgeted.host->layout().stride();
  throw_if_error(budgeted.host->for_each_row(
      [&](uint64_t key, const float* row) { got[key] = std::vector<float>(row, row + stride); }));
  throw_if_error(unbudgeted.host->for_each_row(
      [&](uint64_t key, const float* row) { want[key] = std::vector<float>(row, row + stride); }));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, row] : want) ASSERT_TRUE(rows_equal(got.at(k), row)) << k;
}

// Width classes (slot_dims: slot 1 at width 16, slot 2 at 2, the rest 4) under a byte budget: each
// width's rows in its own pool at its own stride. A pass of width-16 keys fills the budget, then
// passes that shift the mix to the narrow widths: the pools hold at most the plan's pages (the
// width-16 pool gives its free pages back), the card's peak stays under the plan, each pool holds
// exactly its width's resident rows, and the host tier ends bit-identical to an unbudgeted run.
TEST(PassManager, WidthClassesUnderACardBudget) {
  const AccessorConfig cfg = table::with_slot_dims(test_config(), {{1, 16}, {2, 2}});
  card_table::HashTableOptions table_options;
  table_options.initial_capacity = 16;
  table_options.page_rows = 64;
  BudgetSide budgeted(cfg, table_options);
  BudgetSide unbudgeted(cfg, table_options);
  ASSERT_EQ(budgeted.store.pool_count(), 3);
  PassManagerOptions options;
  options.host_batch_keys = 150;
  const std::size_t budget_rows = 700;
  options.card_memory_bytes =
      PassManager(budgeted.cards, {&budgeted.store}, *budgeted.host, options)
          .plan_for(budget_rows)
          .total_bytes();
  PassManager manager(budgeted.cards, {&budgeted.store}, *budgeted.host, options);
  PassManager reference(unbudgeted.cards, {&unbudgeted.store}, *unbudgeted.host, {});
  ASSERT_EQ(manager.row_budget(), budget_rows);
  const CardTierPlan& plan = manager.plan();
  ASSERT_EQ(plan.class_row_bytes.size(), 3u);
  EXPECT_NE(plan.to_string().find("row bytes 2: 48 4: 56 16: 104"), std::string::npos)
      << plan.to_string();

  // A key's slot (so its width) is fixed: slot = key % 3.
  const auto keys_of_slot = [](int32_t slot, std::size_t n, uint64_t from) {
    std::vector<uint64_t> keys;
    for (uint64_t k = from; keys.size() < n; ++k) {
      if (static_cast<int32_t>(mix64(k) % 3) == slot) keys.push_back(mix64(k));
    }
    return keys;
  };
  const std::vector<uint64_t> wide = keys_of_slot(1, 650, 0);
  std::vector<std::vector<uint64_t>> passes = {wide};
  std::vector<uint64_t> shifted(wide.begin(), wide.begin() + 300);
  for (const uint64_t k : keys_of_slot(2, 350, 100000)) shifted.push_back(k);
  passes.push_back(shifted);
  passes.push_back(keys_of_slot(0, 500, 200000));
  for (const auto& pass : make_passes(3, 600, 7)) passes.push_back(pass);
  std::mt19937_64 rng(9);
  std::size_t widest_pages_before = 0;
  bool gave_pages_back = false;
  uint64_t evicted = 0;
  for (auto& pass : passes) {
    std::sort(pass.begin(), pass.end());
    std::vector<int32_t> slots(pass.size());
    for (std::size_t i = 0; i < pass.size(); ++i) slots[i] = static_cast<int32_t>(pass[i] % 3);
    widest_pages_before = budgeted.store.pool(2).pages();
    evicted += manager.begin_pass(pass, slots).evicted;
    reference.begin_pass(pass, slots);
    gave_pages_back |= budgeted.store.pool(2).pages() < widest_pages_before;
    std::size_t page_bytes = 0;
    for (int32_t p = 0; p < 3; ++p) {
      page_bytes += budgeted.store.pool(p).pages() * budgeted.store.page_bytes(p);
    }
    EXPECT_LE(page_bytes, plan.row_page_bytes) << plan.to_string();
    // Each pool holds its width's rows: every resident key's handle names the pool of the width
    // its host-tier row records (listing keys and handles only: the pass boundary's working set).
    std::vector<std::size_t> per_pool(3, 0);
    {
      device::Card& card = budgeted.cards.card(0);
      device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
      device::device_buffer<card_table::row_index_t> handles(0, card.memory(), card.stream());
      const std::size_t n = budgeted.store.list_entries(false, keys, handles, card.stream());
      const auto host_keys = device::to_host(keys);
      const auto host_handles = device::to_host(handles);
      const table::RowLayout record = budgeted.store.layout();
      std::map<uint64_t, int32_t> width;
      throw_if_error(budgeted.host->for_each_row(
          [&](uint64_t key, const float* row) { width[key] = record.of_row(row).mf_dim; }));
      for (std::size_t i = 0; i < n; ++i) {
        const int32_t pool = budgeted.store.table().codec().pool_of(host_handles[i]);
        EXPECT_EQ(budgeted.store.classes().dims[pool], width.at(host_keys[i]));
        ++per_pool[static_cast<std::size_t>(pool)];
      }
    }
    for (int32_t p = 0; p < 3; ++p) {
      EXPECT_EQ(budgeted.store.pool(p).in_use(), per_pool[static_cast<std::size_t>(p)]);
    }
    std::vector<uint64_t> touched(BudgetSide::kTouched);
    for (auto& k : touched) k = pass[rng() % pass.size()];
    for (BudgetSide* side : {&budgeted, &unbudgeted}) {
      device::Card& card = side->cards.card(0);
      device::copy_async(side->touch.data(), touched.data(), touched.size(), card.stream());
      device::parallel_for(card.stream(), touched.size(),
                           TouchRows{side->store.ref(), side->touch.data()});
      card.stream().synchronize();
    }
    manager.end_pass();
    reference.end_pass();
  }
  EXPECT_GT(evicted, 0u) << "the budget never forced an eviction";
  EXPECT_TRUE(gave_pages_back) << "the width-16 pool never gave pages back";
  const std::size_t peak = budgeted.cards.card(0).memory().peak_bytes();
  const std::size_t scratch = budgeted.cards.card(0).scratch().peak();
  EXPECT_LE(peak, plan.total_bytes() + budgeted.touch.bytes() + scratch) << plan.to_string();

  // Host-tier rows at their own widths.
  std::map<uint64_t, std::vector<float>> got, want;
  const table::RowLayout record = budgeted.host->layout();
  throw_if_error(budgeted.host->for_each_row([&](uint64_t key, const float* row) {
    got[key] = std::vector<float>(row, row + record.of_row(row).stride());
  }));
  throw_if_error(unbudgeted.host->for_each_row([&](uint64_t key, const float* row) {
    want[key] = std::vector<float>(row, row + record.of_row(row).stride());
  }));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, row] : want) ASSERT_TRUE(rows_equal(got.at(k), row)) << k;
}

// An evaluation pass (PassAccess::kEvaluate) over keys about half of which the model never saw:
// during it the cards hold every key, the known ones as the host tier has them and the new ones
// as init_row with their slot; the host tier is never changed (nothing created, nothing written
// back), and end_pass leaves the cards as they were: with no budget the same keys and rows, with
// a budget that made it evict, a subset of them (clean rows, still in the host tier).
TEST(PassManager, EvaluationPassReadsWithoutCreatingAndGivesTheRowsBack) {
  GPUBOX_REQUIRE_CARDS(2);
  for (const std::size_t budget : {std::size_t{0}, std::size_t{130}}) {
    SCOPED_TRACE("row budget " + std::to_string(budget));
    PassManagerOptions options;
    options.card_row_budget = budget;
    Engine engine(2, options);
    const auto passes = make_passes(2, 200, 21);  // pass 1 shares about half of pass 0's keys
    engine.manager->begin_pass(passes[0]);
    engine.train(passes[0], 3, 3);
    engine.manager->end_pass();
    const auto host_before = engine.host_rows();
    const auto cards_before = engine.card_rows();
    const std::vector<int32_t> slots(passes[1].size(), 4);
    const PassStats begin =
        engine.manager->begin_pass(passes[1], slots, nullptr, PassAccess::kEvaluate);
    EXPECT_EQ(begin.created, 0u);
    if (budget > 0) {
      EXPECT_GT(begin.evicted, 0u) << "the budget case must evict";
    }
    const auto during = engine.card_rows();
    const table::RowLayout& layout = engine.host->layout();
    std::size_t unknown = 0;
    for (const uint64_t key : passes[1]) {
      const auto it = during.find(key);
      ASSERT_NE(it, during.end()) << "key " << key << " not placed";
      const auto held = host_before.find(key);
      std::vector<float> want(layout.stride());
      if (held != host_before.end()) {
        want = held->second;
      } else {
        table::init_row(want.data(), layout, test_config(), key, 4);
        ++unknown;
      }
      EXPECT_TRUE(rows_equal(it->second, want)) << "key " << key;
    }
    EXPECT_GT(unknown, 50u);
    const PassStats end = engine.manager->end_pass();
    EXPECT_EQ(end.written_back, 0u);
    EXPECT_EQ(engine.host_rows(), host_before);
    const auto after = engine.card_rows();
    if (budget == 0) {
      EXPECT_EQ(after, cards_before);
    } else {
      EXPECT_LT(after.size(), cards_before.size());
      for (const auto& [key, row] : after) {
        const auto it = cards_before.find(key);
        ASSERT_NE(it, cards_before.end()) << "key " << key << " stayed on the cards";
        EXPECT_TRUE(rows_equal(row, it->second)) << "key " << key;
      }
    }
    // A training pass afterwards creates the new keys as usual.
    EXPECT_EQ(engine.manager->begin_pass(passes[1], slots).created, unknown);
    engine.manager->end_pass();
  }
}

TEST(PassManager, EmptyPassAndMisuse) {
  GPUBOX_REQUIRE_CARDS(2);
  Engine engine(2, PassManagerOptions{});
  const PassStats begin = engine.manager->begin_pass({});
  EXPECT_EQ(begin.keys_in_pass, 0u);
  EXPECT_THROW(engine.manager->begin_pass({1}), Error);  // twice without end_pass
  const PassStats end = engine.manager->end_pass();
  EXPECT_EQ(end.written_back, 0u);
  EXPECT_THROW(engine.manager->end_pass(), Error);
}

// A host tier that fails pushes after a number of rows: end_pass fails with a clear error, the
// rows stay dirty on the cards, and a retried end_pass completes the write-back.
class FlakyHost : public table::HostTier {
 public:
  explicit FlakyHost(table::HostTier& inner) : inner_(inner) {}
  const table::RowLayout& layout() const override { return inner_.layout(); }
  const AccessorConfig& config() const override { return inner_.config(); }
  Status pull(const uint64_t* k, const int32_t* s, std::size_t n, float* r,
              std::size_t* c) override {
    pulled_keys += n;
    return inner_.pull(k, s, n, r, c);
  }
  Status peek(const uint64_t* k, const int32_t* s, std::size_t n, float* r,
              std::size_t* u) override {
    return inner_.peek(k, s, n, r, u);
  }
  Status push(const uint64_t* k, std::size_t n, const float* r) override {
    if (fail_pushes) return Status::Unavailable("server 127.0.0.1:1 gone (injected)");
    pushed_keys += n;
    return inner_.push(k, n, r);
  }
  Status erase(const uint64_t* k, std::size_t n) override { return inner_.erase(k, n); }
  StatusOr<table::HostTierStats> stats() override { return inner_.stats(); }
  StatusOr<uint64_t> shrink() override { return inner_.shrink(); }
  using HostTier::load;
  using HostTier::save;
  Status save(const std::string& p, table::SaveKind m, table::io::FileEnv* env) override {
    return inner_.save(p, m, env);
  }
  Status load(const std::string& p, table::io::FileEnv* env) override {
    return inner_.load(p, env);
  }
  bool fail_pushes = false;
  std::atomic<uint64_t> pulled_keys{0};  // keys asked of the inner tier by pull
  std::atomic<uint64_t> pushed_keys{0};

 private:
  table::HostTier& inner_;
};

// Replicated placement over 3 cards: each row crosses the host-tier boundary once per pass, not
// once per card (card 0 pulls or stages it and the others insert its copy; card 0 writes back).
TEST(PassManager, ReplicatedPassesReadAndWriteEachRowOnce) {
  GPUBOX_REQUIRE_CARDS(3);
  auto opened = table::SparseTable::open(test_config(), table::HostTableConfig{});
  auto inner = std::move(opened.value());
  FlakyHost counting(*inner);
  PassManagerOptions options;
  options.placement = heter_comm::Placement::kReplicated;
  Engine engine(3, options, &counting);
  engine.inspect = inner.get();
  const auto passes = make_passes(2, 150, 21);
  const PassStats first = engine.manager->begin_pass(passes[0]);
  EXPECT_EQ(counting.pulled_keys.load(), passes[0].size());
  EXPECT_EQ(first.created, passes[0].size());
  engine.train(passes[0], 1, 3);
  const PassStats first_end = engine.manager->end_pass();
  EXPECT_EQ(counting.pushed_keys.load(), first_end.written_back);
  // The second pass staged ahead: only its new keys are read, once.
  const std::vector<uint64_t> exclude;
  const StagedRows staged = engine.manager->stage_rows(passes[1], {}, exclude);
  EXPECT_EQ(staged.keys.size(), passes[1].size());
  engine.manager->begin_pass(passes[1], {}, &staged);
  std::set<uint64_t> both(passes[0].begin(), passes[0].end());
  both.insert(passes[1].begin(), passes[1].end());
  EXPECT_EQ(counting.pulled_keys.load(), passes[0].size() + passes[1].size());
  engine.train(passes[1], 2, 3);
  engine.manager->end_pass();
  EXPECT_EQ(engine.card_rows().size(), both.size());  // identical replicas of the whole table
  EXPECT_EQ(engine.host_rows().size(), both.size());
}

TEST(PassManager, FailedWriteBackIsRetriedWithoutLoss) {
  GPUBOX_REQUIRE_CARDS(2);
  auto opened = table::SparseTable::open(test_config(), table::HostTableConfig{});
  auto inner = std::move(opened.value());
  FlakyHost flaky(*inner);
  Engine engine(2, PassManagerOptions{}, &flaky);
  Engine reference(2, PassManagerOptions{});
  const auto keys = make_passes(1, 200, 5)[0];
  engine.manager->begin_pass(keys);
  reference.manager->begin_pass(keys);
  engine.train(keys, 9, 3);
  reference.train(keys, 9, 3);
  flaky.fail_pushes = true;
  try {
    engine.manager->end_pass();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine.manager->in_pass());
  flaky.fail_pushes = false;
  const PassStats end = engine.manager->end_pass();
  EXPECT_GT(end.written_back, 0u);
  reference.manager->end_pass();
  std::map<uint64_t, std::vector<float>> got;
  throw_if_error(inner->for_each_row([&](uint64_t key, const float* row) {
    got[key] = std::vector<float>(row, row + inner->layout().stride());
  }));
  auto want = reference.host_rows();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, row] : want) ASSERT_TRUE(rows_equal(got.at(k), row)) << k;
}

// The same passes with the host tier behind a gpubox_server on loopback, restarted between
// passes from the checkpoint it saved: nothing is lost, and the host rows still equal the
// uncached in-process reference bit for bit.
TEST(PassManager, ServerHostTierWithRestartFromCheckpointMatchesReference) {
  GPUBOX_REQUIRE_CARDS(2);
  namespace srv = table::server;
  const std::string save_dir =
      ::testing::TempDir() + "gpubox_pass_server_" + std::to_string(::getpid());
  auto open_table = [] {
    auto opened = table::SparseTable::open(test_config(), table::HostTableConfig{});
    return std::move(opened.value());
  };
  std::unique_ptr<table::SparseTable> backing = open_table();
  srv::ServerOptions server_options;
  server_options.data_dir = ::testing::TempDir();  // SAVE paths must lie inside it
  auto started = srv::Server::start(backing.get(), server_options);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<srv::Server> server = std::move(started.value());
  server_options.port = server->port();

  srv::RemoteHostTierOptions client_options;
  client_options.endpoints = server->endpoint();
  client_options.config = test_config();
  client_options.deadline_s = 10.0;
  auto connected = srv::RemoteHostTier::connect(client_options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  std::unique_ptr<srv::RemoteHostTier> remote = std::move(connected.value());

  PassManagerOptions options;
  options.host_batch_keys = 53;
  Engine cached(2, options, remote.get());
  cached.inspect = backing.get();
  Engine reference(2, PassManagerOptions{});

  const auto passes = make_passes(4, 200, 31);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    cached.manager->begin_pass(passes[p]);
    reference.manager->begin_pass(passes[p]);
    cached.train(passes[p], 500 + p, 3);
    reference.train(passes[p], 500 + p, 3);
    cached.manager->end_pass();
    reference.manager->end_pass();
    reference.forget_cards();

    auto got = cached.host_rows();
    auto want = reference.host_rows();
    ASSERT_EQ(got.size(), want.size()) << "pass " << p;
    for (const auto& [k, row] : want)
      ASSERT_TRUE(rows_equal(got.at(k), row)) << "key " << k << " pass " << p;

    if (p == 1) {
      // Checkpoint on the server, stop it, lose its memory, restart it from the checkpoint on
      // the same port. The trainer's client reconnects on its own.
      throw_if_error(remote->save(save_dir, table::SaveKind::kCheckpoint));
      server->stop();
      server->wait();
      server.reset();
      backing = open_table();
      throw_if_error(backing->load(save_dir));
      server_options.loaded_model = save_dir;  // as --load: the client sees its save came back
      auto restarted = srv::Server::start(backing.get(), server_options);
      ASSERT_TRUE(restarted.ok()) << restarted.status().to_string();
      server = std::move(restarted.value());
      cached.inspect = backing.get();
    }
  }
  std::filesystem::remove_all(save_dir);
}

}  // namespace
}  // namespace gpubox::pass
