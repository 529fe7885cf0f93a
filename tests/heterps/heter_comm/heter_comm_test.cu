// HeterComm on simulated cards (CardSet + run_on_cards + the in-process communicator): pulled
// records and final tables against a single-table reference, for 1, 2, 3, 4 and 8 cards.
//
// The reference is one std::unordered_map<key, row> that, per step, merges every card's push
// records per key in float64, then applies one optimizer step per key
// (table::optimizer::apply_push, itself checked against float64 formulas in sparse_optimizer_test).
// The cards merge in float32 in another order (inside a card by position, across cards by rank), so
// results agree up to float rounding: |card - reference| <= kAbsTol + kRelTol * |reference| for
// every float, and show/click (integer sums) agree exactly. Since every card count is held to the
// same reference, the result does not depend on the card count beyond that tolerance.
// Here: the reference over 1-8 cards, a hot key, a missing key, bit-reproducible runs, push_pulled
// without a pull, a steady state that allocates nothing. Create mode: heter_comm_create_test.cu;
// Collective mode's placement: heter_comm_placement_test.cu; planned steps:
// heter_comm_planned_test.cu (the same binary; their helpers: heter_comm_test_util.cuh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Batch;
using cluster_test::BatchMaker;
using cluster_test::Cluster;
using cluster_test::ClusterCase;
using cluster_test::place_on_owner;
using cluster_test::pull_push_step;
using cluster_test::test_config;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

constexpr double kAbsTol = 2e-5;
constexpr double kRelTol = 2e-4;

bool close_enough(double got, double want) {
  return std::fabs(got - want) <= kAbsTol + kRelTol * std::fabs(want);
}
// With 16-bit sparse storage a weight whose fp32 value (summed in another order) lies near a
// rounding boundary may round one 16-bit ulp away: 2 ulps of margin (2^-10 fp16, 2^-7 bf16).
bool close_enough(double got, double want, table::SparseStorage storage) {
  const double ulps = storage == table::SparseStorage::kFp16   ? 2.0 / 1024
                      : storage == table::SparseStorage::kBf16 ? 2.0 / 128
                                                               : 0.0;
  return std::fabs(got - want) <= kAbsTol + (kRelTol + ulps) * std::fabs(want);
}

// The single-table reference.
class ReferenceTable {
 public:
  explicit ReferenceTable(const AccessorConfig& cfg)
      : cfg_(cfg), layout_(RowLayout::make(cfg.optimizer.kind, cfg.mf_dim, cfg.storage)) {}

  std::vector<float>& row(uint64_t key) {
    auto it = rows_.find(key);
    if (it == rows_.end()) {
      it = rows_.emplace(key, std::vector<float>(layout_.stride())).first;
      table::init_row(it->second.data(), layout_, cfg_, key, 0);
    }
    return it->second;
  }
  std::vector<float> pull_record(uint64_t key) {
    std::vector<float> out(layout_.pull_dim());
    table::fill_pull_record(row(key).data(), layout_, out.data());
    return out;
  }
  // One step: merge every occurrence of every card per key (float64), one update per key; under
  // per_table the table's step advances first, once, as every card's does.
  void push(const std::vector<Batch>& batches) {
    const bool per_table = table::optimizer::uses_table_step(cfg_);
    if (per_table) {
      table::optimizer::advance_table_adam(table_step_, cfg_.optimizer.beta1_decay_rate,
                                           cfg_.optimizer.beta2_decay_rate);
    }
    const int dim = layout_.push_dim();
    std::unordered_map<uint64_t, std::vector<double>> merged;
    for (const Batch& b : batches) {
      for (std::size_t i = 0; i < b.keys.size(); ++i) {
        auto& sum = merged[b.keys[i]];
        sum.resize(dim, 0.0);
        for (int d = 0; d < dim; ++d) sum[d] += b.grads[i * dim + d];
      }
    }
    for (const auto& [key, sum] : merged) {
      std::vector<float> record(sum.begin(), sum.end());
      table::optimizer::apply_push(row(key).data(), layout_, cfg_, key, record.data(),
                                   per_table ? &table_step_ : nullptr);
    }
  }
  int64_t table_steps() const { return table_step_.steps; }
  const std::unordered_map<uint64_t, std::vector<float>>& rows() const { return rows_; }
  const RowLayout& layout() const { return layout_; }

 private:
  AccessorConfig cfg_;
  RowLayout layout_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
  table::optimizer::TableAdamStep table_step_;
};

class HeterCommClusterTest : public ::testing::TestWithParam<ClusterCase> {};

// Step `step`'s batches of `cards` cards: sizes 0, 1 and a few hundred; step 3 is empty on every
// card.
std::vector<Batch> step_batches(BatchMaker& maker, std::mt19937_64& sizes, int cards, int step) {
  std::vector<Batch> batches(cards);
  for (int c = 0; c < cards; ++c) {
    std::size_t n = 1 + sizes() % 400;
    if (step == 3 || (c + step) % 3 == 2) n = 0;
    if ((c + step) % 5 == 4) n = 1;
    batches[c] = maker.make(n);
  }
  return batches;
}

// Every card's records pulled in step `step` against the reference's before the step's push;
// `pulled_embedx` counts the pulls of keys that had embedx.
void expect_pulls_match_reference(const std::vector<std::vector<float>>& pulled,
                                  const std::vector<Batch>& batches, ReferenceTable& ref,
                                  table::SparseStorage storage, int step,
                                  std::size_t* pulled_embedx) {
  const int pull_dim = ref.layout().pull_dim();
  for (std::size_t c = 0; c < batches.size(); ++c) {
    ASSERT_EQ(pulled[c].size(), batches[c].keys.size() * pull_dim);
    for (std::size_t i = 0; i < batches[c].keys.size(); ++i) {
      const uint64_t key = batches[c].keys[i];
      const std::vector<float> want = ref.pull_record(key);
      *pulled_embedx += want[3] != 0.0f;
      for (int d = 0; d < pull_dim; ++d) {
        ASSERT_TRUE(close_enough(pulled[c][i * pull_dim + d], want[d], storage))
            << "step " << step << " card " << c << " key " << key << " field " << d << ": got "
            << pulled[c][i * pull_dim + d] << ", want " << want[d];
      }
    }
  }
}

// `bound` as a row of `layout` keeps its embed_w (a clipped weight is its bound so stored).
float stored_embed_w(const RowLayout& layout, float bound) {
  std::vector<float> row(layout.stride());
  table::write_embed_w(row.data(), layout, bound);
  return table::read_embed_w(row.data(), layout);
}

// What the final tables' check counts over the cards: the keys seen, the rows the cards created,
// the reference's weights at a bound.
struct FinalTableTally {
  std::unordered_set<uint64_t> seen;
  std::size_t created = 0;
  std::size_t clipped = 0;
};

// Card c's final table: every row dirty (each was created on the card), each key on its owner
// only and once, one the reference pulled, its row agreeing with the reference's (compared
// unpacked, as they are with fp32 storage).
void expect_card_rows_match_reference(Cluster& cluster, int c, const ReferenceTable& ref,
                                      const AccessorConfig& cfg, FinalTableTally* tally) {
  const RowLayout& layout = ref.layout();
  const RowLayout wide = layout.unpacked();
  std::vector<float> got(wide.stride()), want(wide.stride());
  const float min_bound = stored_embed_w(layout, cfg.optimizer.min_bound);
  const float max_bound = stored_embed_w(layout, cfg.optimizer.max_bound);
  card_table::CardSparseStore& store = cluster.store(c);
  device::Card& card = cluster.cards().card(c);
  auto keys = card.make_buffer<uint64_t>(0);
  auto rows = card.make_buffer<float>(0);
  const std::size_t count = store.collect_all(keys, rows, card.stream());
  const auto dirty_count = [&] {
    auto dk = card.make_buffer<uint64_t>(0);
    auto dr = card.make_buffer<float>(0);
    return store.collect_dirty(dk, dr, card.stream());
  }();
  EXPECT_EQ(dirty_count, count) << "every row was created on the card, so every row is dirty";
  const std::vector<uint64_t> host_keys = device::to_host(keys);
  const std::vector<float> host_rows = device::to_host(rows);
  tally->created +=
      cluster.heter_comm(c).stats().created_on_pull + cluster.heter_comm(c).stats().created_on_push;
  for (std::size_t i = 0; i < count; ++i) {
    const uint64_t key = host_keys[i];
    EXPECT_EQ(owner_card(key, cluster.size()), c) << "key " << key << " stored off its owner";
    EXPECT_TRUE(tally->seen.insert(key).second) << "key " << key << " stored twice";
    auto it = ref.rows().find(key);
    ASSERT_NE(it, ref.rows().end()) << "key " << key << " on card " << c << " never pulled";
    table::convert_row(host_rows.data() + i * layout.stride(), layout, got.data(), wide);
    table::convert_row(it->second.data(), layout, want.data(), wide);
    EXPECT_EQ(got[RowLayout::kShow], want[RowLayout::kShow]) << key;
    EXPECT_EQ(got[RowLayout::kClick], want[RowLayout::kClick]) << key;
    const float w = want[RowLayout::kEmbedW];
    tally->clipped += (w == min_bound || w == max_bound);
    for (int f = 0; f < wide.stride(); ++f) {
      ASSERT_TRUE(close_enough(got[f], want[f], cfg.storage))
          << "card " << c << " key " << key << " field " << f << ": got " << got[f] << ", want "
          << want[f];
    }
  }
}

TEST_P(HeterCommClusterTest, PullAndFinalTablesMatchSingleTableReference) {
  const ClusterCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  AccessorConfig cfg = test_config(param.kind);
  cfg.storage = param.storage;
  if (param.per_table) cfg.optimizer.bias_correction = table::AdamBiasCorrection::kPerTable;
  card_table::HashTableOptions table_options;
  table_options.initial_capacity = 64;  // the stores grow during the run
  Cluster cluster(param.cards, cfg, {}, table_options);
  ReferenceTable ref(cfg);
  BatchMaker maker(/*seed=*/2024, ref.layout().push_dim());
  std::mt19937_64 sizes(7);

  constexpr int kSteps = 8;
  std::size_t pulled_embedx = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<Batch> batches = step_batches(maker, sizes, param.cards, step);
    // Odd steps push with push_pulled (reusing the pull's plan and rows): same results.
    const auto pulled = pull_push_step(cluster, batches, /*reuse_pull=*/step % 2 == 1);
    ASSERT_NO_FATAL_FAILURE(
        expect_pulls_match_reference(pulled, batches, ref, param.storage, step, &pulled_embedx));
    ref.push(batches);
  }
  EXPECT_GT(pulled_embedx, 0u) << "no pulled key had embedx yet: the run misses the creation rule";

  // Final tables: each key on its owner only, the union is the reference's key set, rows agree.
  FinalTableTally tally;
  for (int c = 0; c < param.cards; ++c) {
    ASSERT_NO_FATAL_FAILURE(expect_card_rows_match_reference(cluster, c, ref, cfg, &tally));
  }
  EXPECT_EQ(tally.seen.size(), ref.rows().size());
  EXPECT_EQ(tally.created, ref.rows().size()) << "every key was created on the fly exactly once";
  // per_table: every card counted every step, those it owned no key of (and the empty step 3)
  // included; per_row: no table step.
  EXPECT_EQ(ref.table_steps(), param.per_table ? kSteps : 0);
  for (int c = 0; c < param.cards; ++c) {
    EXPECT_EQ(cluster.heter_comm(c).table_steps(), ref.table_steps()) << "card " << c;
  }
  if (cfg.optimizer.kind != SparseOptimizerKind::kAdagrad) {
    EXPECT_GT(tally.clipped, 0u) << "no bound was hit";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cards, HeterCommClusterTest,
    ::testing::Values(ClusterCase{1, SparseOptimizerKind::kAdagrad, "1card_adagrad"},
                      ClusterCase{2, SparseOptimizerKind::kAdagrad, "2cards_adagrad"},
                      ClusterCase{3, SparseOptimizerKind::kAdagrad, "3cards_adagrad"},
                      ClusterCase{4, SparseOptimizerKind::kAdagrad, "4cards_adagrad"},
                      ClusterCase{8, SparseOptimizerKind::kAdagrad, "8cards_adagrad"},
                      ClusterCase{3, SparseOptimizerKind::kSgd, "3cards_sgd"},
                      ClusterCase{4, SparseOptimizerKind::kAdam, "4cards_adam"},
                      ClusterCase{2, SparseOptimizerKind::kSharedAdam, "2cards_shared_adam"},
                      ClusterCase{8, SparseOptimizerKind::kSharedAdam, "8cards_shared_adam"},
                      ClusterCase{3, SparseOptimizerKind::kAdagrad, "3cards_adagrad_fp16",
                                  table::SparseStorage::kFp16},
                      ClusterCase{4, SparseOptimizerKind::kAdam, "4cards_adam_bf16",
                                  table::SparseStorage::kBf16},
                      ClusterCase{3, SparseOptimizerKind::kAdam, "3cards_adam_per_table",
                                  table::SparseStorage::kFp32, true},
                      ClusterCase{2, SparseOptimizerKind::kSharedAdam, "2cards_shared_per_table",
                                  table::SparseStorage::kFp32, true}),
    [](const ::testing::TestParamInfo<ClusterCase>& info) { return std::string(info.param.name); });

// A Zipf-hot key with 10^4+ occurrences per card: the local merge and the owner merge take the
// chunked path of the segment reduction, and the result still matches the float64 reference. On
// 2 cards, or on the one a 1-GPU machine has (the local merge's chunked path still runs).
TEST(HeterComm, HotKeyWithTensOfThousandsOfOccurrencesMatchesReference) {
  const int cards = device::testing::cards_here(2);
  constexpr int kHotPerCard = 12000;  // the hot key's occurrences in each card's batch
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  Cluster cluster(cards, cfg);
  ReferenceTable ref(cfg);
  const int push_dim = ref.layout().push_dim();
  const int pull_dim = ref.layout().pull_dim();
  std::vector<Batch> batches(static_cast<std::size_t>(cards));
  for (int c = 0; c < cards; ++c) {
    BatchMaker maker(/*seed=*/300 + c, push_dim);
    batches[c] = maker.make(3000);                         // ordinary keys
    Batch hot = BatchMaker(/*seed=*/7, push_dim).make(1);  // one key, the same on every card
    std::mt19937 rng(c);
    for (int i = 0; i < kHotPerCard; ++i) {
      const std::size_t at = rng() % (batches[c].keys.size() + 1);
      batches[c].keys.insert(batches[c].keys.begin() + at, hot.keys[0]);
      batches[c].grads.insert(batches[c].grads.begin() + at * push_dim, hot.grads.begin(),
                              hot.grads.end());
    }
  }
  for (int step = 0; step < 2; ++step) {
    const auto pulled = pull_push_step(cluster, batches, /*reuse_pull=*/step == 1);
    for (int c = 0; c < cards; ++c) {
      for (std::size_t i = 0; i < batches[c].keys.size(); i += 97) {
        const std::vector<float> want = ref.pull_record(batches[c].keys[i]);
        for (int d = 0; d < pull_dim; ++d) {
          ASSERT_TRUE(close_enough(pulled[c][i * pull_dim + d], want[d]))
              << "step " << step << " card " << c << " position " << i << " field " << d;
        }
      }
    }
    ref.push(batches);
  }
  std::size_t hot_rows = 0;
  const float hot_shows = static_cast<float>(2 * kHotPerCard * cards);  // 2 steps
  for (int c = 0; c < cards; ++c) {
    device::Card& card = cluster.cards().card(c);
    auto keys = card.make_buffer<uint64_t>(0);
    auto rows = card.make_buffer<float>(0);
    const std::size_t count = cluster.store(c).collect_all(keys, rows, card.stream());
    const auto host_keys = device::to_host(keys);
    const auto host_rows = device::to_host(rows);
    const int stride = ref.layout().stride();
    for (std::size_t i = 0; i < count; ++i) {
      const auto& want = ref.rows().at(host_keys[i]);
      for (int f = 0; f < stride; ++f) {
        ASSERT_TRUE(close_enough(host_rows[i * stride + f], want[f]))
            << "key " << host_keys[i] << " field " << f;
      }
      hot_rows += want[RowLayout::kShow] >= hot_shows;
    }
  }
  EXPECT_EQ(hot_rows, 1u) << "the hot key's " << hot_shows
                          << " occurrences were not merged into one row";
}

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
