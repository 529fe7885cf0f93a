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
// Here: the reference over 1-8 cards, and a hot key. A missing key, bit-reproducible runs, a
// vetoed step, push_pulled without a pull, a steady state that allocates nothing:
// heter_comm_contract_test.cu; create mode: heter_comm_create_test.cu; Collective mode's
// placement: heter_comm_placement_test.cu; planned steps: heter_comm_planned_test.cu (the same
// binary; their helpers: heter_comm_test_util.cuh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

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

}  // namespace
}  // namespace gpubox::heter_comm
