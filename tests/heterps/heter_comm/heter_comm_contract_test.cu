// HeterComm's contracts on simulated cards beyond the single-table reference (heter_comm_test.cu,
// the same binary): a missing key fails naming the key and the cards, runs are bit-reproducible,
// a vetoed step takes no table step, push_pulled without a pull fails, a steady state allocates
// nothing, reserve_steps keeps the scratch headroom. Helpers: heter_comm_test_util.cuh.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Batch;
using cluster_test::BatchMaker;
using cluster_test::Cluster;
using cluster_test::place_on_owner;
using cluster_test::pull_push_step;
using cluster_test::test_config;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

// Card `owner`'s rows are still those it was given (`rows_before`: its keys of `known`, in
// order, placed by place_on_owner).
void expect_owner_rows_untouched(Cluster& cluster, int owner, const std::vector<uint64_t>& known,
                                 const std::vector<float>& rows_before, const RowLayout& layout) {
  card_table::CardSparseStore& store = cluster.store(owner);
  device::Card& card = cluster.cards().card(owner);
  card.activate();
  auto keys = card.make_buffer<uint64_t>(0);
  auto rows = card.make_buffer<float>(0);
  const std::size_t count = store.collect_all(keys, rows, card.stream());
  EXPECT_EQ(store.size(), count);
  std::vector<float> got = device::to_host(rows);
  std::vector<uint64_t> got_keys = device::to_host(keys);
  std::unordered_map<uint64_t, std::vector<float>> before;
  for (std::size_t i = 0, j = 0; i < known.size(); ++i) {
    if (owner_card(known[i], cluster.size()) != owner) continue;
    before[known[i]].assign(rows_before.begin() + j * layout.stride(),
                            rows_before.begin() + (j + 1) * layout.stride());
    ++j;
  }
  ASSERT_EQ(count, before.size());
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<float> row(got.begin() + i * layout.stride(),
                           got.begin() + (i + 1) * layout.stride());
    EXPECT_EQ(row, before[got_keys[i]]) << "key " << got_keys[i] << " changed by a failed push";
  }
}

// With missing_keys = fail, a key its owner does not hold fails the step with an error naming
// the key and the owner card; the other cards wake up (the group is aborted) instead of hanging,
// and the owner's rows are untouched by the failed push.
TEST(HeterComm, MissingKeyFailsNamingKeyAndCard) {
  GPUBOX_REQUIRE_CARDS(3);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  constexpr int kCards = 3;
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;

  // Known keys live on their owners; one unknown key, owned by some card.
  std::vector<uint64_t> known;
  for (uint64_t k = 1; k <= 60; ++k) known.push_back(mix64(k));
  const uint64_t unknown = mix64(1000);
  const int unknown_owner = owner_card(unknown, kCards);

  for (const bool on_push : {false, true}) {
    Cluster cluster(kCards, cfg, options);
    std::vector<std::vector<float>> rows_before(kCards);
    cluster.run([&](device::Card& card) {
      rows_before[card.local_index()] = place_on_owner(cluster, card, known, cfg, layout);
    });
    // Known keys work in fail mode.
    std::vector<Batch> ok(kCards);
    BatchMaker maker(5, layout.push_dim());
    for (int c = 0; c < kCards; ++c) {
      for (int i = 0; i < 20; ++i) {
        ok[c].keys.push_back(known[(c * 7 + i * 3) % known.size()]);
        for (int d = 0; d < layout.push_dim(); ++d) ok[c].grads.push_back(0.0f);
      }
    }
    if (!on_push) {
      ASSERT_NO_THROW(pull_push_step(cluster, ok));
    }

    std::vector<Batch> bad = ok;
    bad[0].keys[5] = unknown;  // card 0 asks for the unknown key among known ones
    std::string message;
    try {
      cluster.run([&](device::Card& card) {
        const int c = card.local_index();
        HeterComm& hc = cluster.heter_comm(c);
        auto keys = device::to_device(bad[c].keys, card.memory(), card.stream());
        auto grads = device::to_device(bad[c].grads, card.memory(), card.stream());
        if (on_push) {
          hc.push(keys.data(), bad[c].keys.size(), grads.data(), card.stream());
        } else {
          auto out = card.make_buffer<float>(bad[c].keys.size() * hc.pull_dim());
          hc.pull(keys.data(), bad[c].keys.size(), out.data(), card.stream());
        }
      });
    } catch (const Error& e) {
      message = e.what();
    }
    ASSERT_FALSE(message.empty()) << "missing key " << unknown << " did not fail";
    EXPECT_NE(message.find("key " + std::to_string(unknown)), std::string::npos) << message;
    EXPECT_NE(message.find("owner card " + std::to_string(unknown_owner)), std::string::npos)
        << message;
    EXPECT_NE(message.find("requested by card 0"), std::string::npos) << message;
    EXPECT_NE(message.find(on_push ? "push" : "pull"), std::string::npos) << message;

    if (on_push) {
      // The failing owner applied nothing: its rows are still the inserted ones.
      ASSERT_NO_FATAL_FAILURE(expect_owner_rows_untouched(cluster, unknown_owner, known,
                                                          rows_before[unknown_owner], layout));
    }
  }
}

// Sums are taken in a fixed order, so the same batches give bit-identical tables run after run
// (thread scheduling and arrival order do not leak into the results).
TEST(HeterComm, RunsAreBitReproducible) {
  GPUBOX_REQUIRE_CARDS(4);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdam);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  auto run_once = [&] {
    Cluster cluster(4, cfg);
    BatchMaker maker(31, layout.push_dim());
    for (int step = 0; step < 4; ++step) {
      std::vector<Batch> batches;
      for (int c = 0; c < 4; ++c) batches.push_back(maker.make(c == 2 ? 0 : 250));
      pull_push_step(cluster, batches, /*reuse_pull=*/step % 2 == 0);
    }
    std::unordered_map<uint64_t, std::vector<float>> table;
    for (int c = 0; c < 4; ++c) {
      device::Card& card = cluster.cards().card(c);
      auto keys = card.make_buffer<uint64_t>(0);
      auto rows = card.make_buffer<float>(0);
      const std::size_t count = cluster.store(c).collect_all(keys, rows, card.stream());
      const std::vector<uint64_t> host_keys = device::to_host(keys);
      const std::vector<float> host_rows = device::to_host(rows);
      for (std::size_t i = 0; i < count; ++i) {
        table[host_keys[i]].assign(host_rows.begin() + i * layout.stride(),
                                   host_rows.begin() + (i + 1) * layout.stride());
      }
    }
    return table;
  };
  const auto first = run_once();
  const auto second = run_once();
  ASSERT_GT(first.size(), 100u);
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [key, row] : first) {
    auto it = second.find(key);
    ASSERT_NE(it, second.end()) << "key " << key;
    EXPECT_EQ(0, std::memcmp(row.data(), it->second.data(), row.size() * sizeof(float)))
        << "key " << key << " differs between two identical runs";
  }
}

// adam_bias_correction per_table: a vetoed step (a non-finite dense gradient on the cards)
// applies nothing and takes no table step; set_table_steps (a load) sets what table_steps reads.
TEST(HeterComm, TableStepSkipsVetoedStepsAndIsSet) {
  GPUBOX_REQUIRE_CARDS(2);
  AccessorConfig cfg = test_config(SparseOptimizerKind::kAdam);
  cfg.optimizer.bias_correction = table::AdamBiasCorrection::kPerTable;
  Cluster cluster(2, cfg);
  BatchMaker maker(5, RowLayout::make(cfg.optimizer.kind, cfg.mf_dim).push_dim());
  const std::vector<Batch> batches = {maker.make(20), maker.make(0)};
  const auto step_with = [&](uint32_t verdict) {
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      HeterComm& hc = cluster.heter_comm(c);
      auto keys = device::to_device(batches[c].keys, card.memory(), card.stream());
      auto grads = device::to_device(batches[c].grads, card.memory(), card.stream());
      auto veto = device::to_device(std::vector<uint32_t>{verdict}, card.memory(), card.stream());
      auto out = card.make_buffer<float>(batches[c].keys.size() * hc.pull_dim());
      hc.pull(keys.data(), batches[c].keys.size(), out.data(), card.stream());
      hc.push_pulled(grads.data(), card.stream(), veto.data());
      card.stream().synchronize();
    });
  };
  step_with(kNoVeto);
  const auto rows_after_one = cluster_test::store_rows(cluster, 0, cluster.heter_comm(0).layout());
  step_with(0);  // vetoed
  for (int c = 0; c < 2; ++c) EXPECT_EQ(cluster.heter_comm(c).table_steps(), 1) << "card " << c;
  const auto rows_after_veto = cluster_test::store_rows(cluster, 0, cluster.heter_comm(0).layout());
  ASSERT_EQ(rows_after_veto.size(), rows_after_one.size());
  for (const auto& [key, row] : rows_after_one) {
    EXPECT_TRUE(cluster_test::same_bytes(rows_after_veto.at(key), row)) << "key " << key;
  }
  cluster.run(
      [&](device::Card& card) { cluster.heter_comm(card.local_index()).set_table_steps(41); });
  step_with(kNoVeto);
  for (int c = 0; c < 2; ++c) EXPECT_EQ(cluster.heter_comm(c).table_steps(), 42) << "card " << c;
}

// push_pulled needs a pull since the last push: otherwise it fails clearly on every card (the
// check runs before any collective, so nothing hangs).
TEST(HeterComm, PushPulledWithoutPullFails) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  Cluster cluster(2, cfg);
  BatchMaker maker(3, RowLayout::make(cfg.optimizer.kind, cfg.mf_dim).push_dim());
  std::vector<Batch> batches = {maker.make(10), maker.make(4)};
  auto push_pulled_only = [&] {
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      auto grads = device::to_device(batches[c].grads, card.memory(), card.stream());
      cluster.heter_comm(c).push_pulled(grads.data(), card.stream());
    });
  };
  try {
    push_pulled_only();
    FAIL() << "push_pulled without a pull did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without a pull"), std::string::npos) << e.what();
  }
  // After pull + push, the pulled keys are gone as well.
  Cluster fresh(2, cfg);
  std::vector<std::vector<float>> ignored = pull_push_step(fresh, batches);
  try {
    fresh.run([&](device::Card& card) {
      const int c = card.local_index();
      auto grads = device::to_device(batches[c].grads, card.memory(), card.stream());
      fresh.heter_comm(c).push_pulled(grads.data(), card.stream());
    });
    FAIL() << "push_pulled after a push did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without a pull"), std::string::npos) << e.what();
  }
}

// Same batch sizes step after step, keys already on the cards: no card memory is allocated
// after the first steps (buffers are reused).
TEST(HeterComm, SteadyStateAllocatesNothing) {
  GPUBOX_REQUIRE_CARDS(3);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  Cluster cluster(3, cfg);
  BatchMaker maker(11, RowLayout::make(cfg.optimizer.kind, cfg.mf_dim).push_dim());
  std::vector<Batch> batches = {maker.make(300), maker.make(0), maker.make(120)};
  std::vector<std::size_t> in_use(3);
  std::vector<uint64_t> scratch_at_2(3);
  for (int step = 0; step < 6; ++step) {
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      HeterComm& hc = cluster.heter_comm(c);
      auto keys = device::to_device(batches[c].keys, card.memory(), card.stream());
      auto grads = device::to_device(batches[c].grads, card.memory(), card.stream());
      auto out = card.make_buffer<float>(batches[c].keys.size() * hc.pull_dim());
      if (step == 2) {
        in_use[c] = card.memory().peak_bytes();
        scratch_at_2[c] = hc.stats().scratch_allocations;
      }
      hc.pull(keys.data(), batches[c].keys.size(), out.data(), card.stream());
      hc.push(keys.data(), batches[c].keys.size(), grads.data(), card.stream());
    });
  }
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(cluster.cards().card(c).memory().peak_bytes(), in_use[c]) << "card " << c;
    // Thrust's temporaries come from the scratch arena once it has grown (first steps only).
    EXPECT_EQ(cluster.heter_comm(c).stats().scratch_allocations, scratch_at_2[c]) << "card " << c;
  }
}

// reserve_steps keeps the card's scratch arena at kScratchHeadroom: HeterComm's sort and scan
// own their temporaries, so without it the arena stays empty and the card's other Thrust calls
// (the trainer's reductions) grow it inside a step.
TEST(HeterComm, ReserveStepsKeepsTheCardsScratchHeadroom) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  Cluster cluster(2, cfg);
  cluster.run([&](device::Card& card) {
    cluster.heter_comm(card.local_index()).reserve_steps(StepBounds{100, 60, 80, 0});
    EXPECT_GE(card.scratch().bytes(), HeterComm::kScratchHeadroom) << "card " << card.local_index();
  });
}

}  // namespace
}  // namespace gpubox::heter_comm
