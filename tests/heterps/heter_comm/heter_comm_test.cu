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
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::heter_comm {
namespace {

using device::testing::card_list;
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

// One card's batch: keys and per-occurrence push records.
struct Batch {
  std::vector<uint64_t> keys;
  std::vector<float> grads;
};

// Zipf-ish keys over a fixed universe (hot keys repeat within and across cards), a few keys at
// the top of the uint64 range (the table's reserved values included). Gradients keep one sign
// per (key, field) so merged sums never cancel to rounding noise (adam divides by sqrt(v)).
class BatchMaker {
 public:
  BatchMaker(uint64_t seed, int push_dim) : rng_(seed), push_dim_(push_dim) {
    for (int i = 0; i < kUniverse; ++i) universe_.push_back(mix64(seed * 7919 + i));
    universe_[0] = ~0ULL;
    universe_[1] = ~0ULL - 1;
    universe_[2] = 0;
    universe_[3] = ~0ULL - 2;
  }

  Batch make(std::size_t n) {
    Batch b;
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (std::size_t i = 0; i < n; ++i) {
      const double u = unit(rng_);
      const uint64_t key = universe_[static_cast<std::size_t>(u * u * u * kUniverse) % kUniverse];
      b.keys.push_back(key);
      const bool click = unit(rng_) < 0.3;
      b.grads.push_back(1.0f);
      b.grads.push_back(click ? 1.0f : 0.0f);
      for (int d = 2; d < push_dim_; ++d) {
        const float sign = (mix64(key + d) & 1) ? 1.0f : -1.0f;
        b.grads.push_back(sign * static_cast<float>(0.05 + 0.5 * unit(rng_)));
      }
    }
    return b;
  }

 private:
  static constexpr int kUniverse = 1500;
  std::mt19937_64 rng_;
  int push_dim_;
  std::vector<uint64_t> universe_;
};

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
  // One step: merge every occurrence of every card per key (float64), one update per key.
  void push(const std::vector<Batch>& batches) {
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
      table::optimizer::apply_push(row(key).data(), layout_, cfg_, key, record.data());
    }
  }
  const std::unordered_map<uint64_t, std::vector<float>>& rows() const { return rows_; }
  const RowLayout& layout() const { return layout_; }

 private:
  AccessorConfig cfg_;
  RowLayout layout_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

AccessorConfig test_config(SparseOptimizerKind kind) {
  AccessorConfig cfg;
  cfg.optimizer.kind = kind;
  cfg.mf_dim = 8;
  cfg.optimizer.learning_rate = 0.1f;
  cfg.optimizer.mf_learning_rate = 0.08f;
  cfg.optimizer.initial_range = 0.01f;
  cfg.optimizer.mf_initial_range = 0.01f;
  cfg.optimizer.min_bound =
      -0.15f;  // hot keys reach the bounds within the run (mean-gradient steps)
  cfg.optimizer.max_bound = 0.15f;
  cfg.embedx_threshold = 1.5f;  // embedx appears mid-run: some keys cross it, cold ones do not
  cfg.seed = 99;
  return cfg;
}

// C simulated cards, each with its store and HeterComm, built on the card's own thread.
class Cluster {
 public:
  Cluster(int cards, const AccessorConfig& cfg, HeterCommOptions options = {},
          card_table::HashTableOptions table_options = {},
          std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : cards_(device::CardSet::from_list(card_list(cards))),
        group_(comm::make_group(cards_, timeout)),
        stores_(cards),
        comms_(cards) {
    run([&](device::Card& card) {
      const int c = card.local_index();
      stores_[c] = std::make_unique<card_table::CardSparseStore>(card, cfg, table_options);
      comms_[c] = std::make_unique<HeterComm>(card, *stores_[c], group_->at(c), options);
    });
  }
  ~Cluster() {
    // Stores and HeterComms free card memory on their card's stream; drop them first.
    comms_.clear();
    stores_.clear();
  }

  // Runs fn on every card's thread; a failing card aborts the group so no peer hangs.
  void run(const std::function<void(device::Card&)>& fn) {
    cards_.run_on_cards(fn, [this](const std::string& why) { group_->abort(why); });
  }

  int size() const { return cards_.num_local_cards(); }
  device::CardSet& cards() { return cards_; }
  card_table::CardSparseStore& store(int c) { return *stores_[c]; }
  HeterComm& heter_comm(int c) { return *comms_[c]; }
  comm::Communicator& comm(int c) { return group_->at(c); }

 private:
  device::CardSet cards_;
  std::unique_ptr<comm::CommGroup> group_;
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores_;
  std::vector<std::unique_ptr<HeterComm>> comms_;
};

// One step on every card: pull the batch (returned per card), then push its records (with
// push_pulled when `reuse_pull`, else with push and the keys again).
std::vector<std::vector<float>> pull_push_step(Cluster& cluster, const std::vector<Batch>& batches,
                                               bool reuse_pull = false) {
  std::vector<std::vector<float>> pulled(cluster.size());
  cluster.run([&](device::Card& card) {
    const int c = card.local_index();
    HeterComm& hc = cluster.heter_comm(c);
    const Batch& b = batches[c];
    auto keys = device::to_device(b.keys, card.memory(), card.stream());
    auto grads = device::to_device(b.grads, card.memory(), card.stream());
    auto out = card.make_buffer<float>(b.keys.size() * hc.pull_dim());
    hc.pull(keys.data(), b.keys.size(), out.data(), card.stream());
    pulled[c] = device::to_host(out);
    if (reuse_pull) {
      hc.push_pulled(grads.data(), card.stream());
    } else {
      hc.push(keys.data(), b.keys.size(), grads.data(), card.stream());
    }
  });
  return pulled;
}

struct ClusterCase {
  int cards;
  SparseOptimizerKind kind;
  const char* name;
  table::SparseStorage storage = table::SparseStorage::kFp32;
};
void PrintTo(const ClusterCase& c, std::ostream* os) { *os << c.name; }

class HeterCommClusterTest : public ::testing::TestWithParam<ClusterCase> {};

TEST_P(HeterCommClusterTest, PullAndFinalTablesMatchSingleTableReference) {
  const ClusterCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  AccessorConfig cfg = test_config(param.kind);
  cfg.storage = param.storage;
  card_table::HashTableOptions table_options;
  table_options.initial_capacity = 64;  // the stores grow during the run
  Cluster cluster(param.cards, cfg, {}, table_options);
  ReferenceTable ref(cfg);
  const int pull_dim = ref.layout().pull_dim();
  BatchMaker maker(/*seed=*/2024, ref.layout().push_dim());
  std::mt19937_64 sizes(7);

  constexpr int kSteps = 8;
  std::size_t pulled_embedx = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Batch> batches(param.cards);
    for (int c = 0; c < param.cards; ++c) {
      // Sizes 0, 1 and a few hundred; step 3 is empty on every card.
      std::size_t n = 1 + sizes() % 400;
      if (step == 3 || (c + step) % 3 == 2) n = 0;
      if ((c + step) % 5 == 4) n = 1;
      batches[c] = maker.make(n);
    }
    // Odd steps push with push_pulled (reusing the pull's plan and rows): same results.
    const auto pulled = pull_push_step(cluster, batches, /*reuse_pull=*/step % 2 == 1);
    for (int c = 0; c < param.cards; ++c) {
      ASSERT_EQ(pulled[c].size(), batches[c].keys.size() * pull_dim);
      for (std::size_t i = 0; i < batches[c].keys.size(); ++i) {
        const uint64_t key = batches[c].keys[i];
        const std::vector<float> want = ref.pull_record(key);
        pulled_embedx += want[3] != 0.0f;
        for (int d = 0; d < pull_dim; ++d) {
          ASSERT_TRUE(close_enough(pulled[c][i * pull_dim + d], want[d], param.storage))
              << "step " << step << " card " << c << " key " << key << " field " << d << ": got "
              << pulled[c][i * pull_dim + d] << ", want " << want[d];
        }
      }
    }
    ref.push(batches);
  }
  EXPECT_GT(pulled_embedx, 0u) << "no pulled key had embedx yet: the run misses the creation rule";

  // Final tables: each key on its owner only, the union is the reference's key set, rows agree.
  std::unordered_set<uint64_t> seen;
  std::size_t created = 0;
  std::size_t clipped = 0;
  const RowLayout& layout = ref.layout();
  // Rows are compared unpacked (the same as they are with fp32 storage); a clipped weight is
  // its bound as the storage keeps it.
  const RowLayout wide = layout.unpacked();
  std::vector<float> got(wide.stride()), want(wide.stride());
  std::vector<float> bounds(layout.stride());
  table::write_embed_w(bounds.data(), layout, cfg.optimizer.min_bound);
  const float min_bound = table::read_embed_w(bounds.data(), layout);
  table::write_embed_w(bounds.data(), layout, cfg.optimizer.max_bound);
  const float max_bound = table::read_embed_w(bounds.data(), layout);
  for (int c = 0; c < param.cards; ++c) {
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
    created += cluster.heter_comm(c).stats().created_on_pull +
               cluster.heter_comm(c).stats().created_on_push;
    for (std::size_t i = 0; i < count; ++i) {
      const uint64_t key = host_keys[i];
      EXPECT_EQ(owner_card(key, param.cards), c) << "key " << key << " stored off its owner";
      EXPECT_TRUE(seen.insert(key).second) << "key " << key << " stored twice";
      auto it = ref.rows().find(key);
      ASSERT_NE(it, ref.rows().end()) << "key " << key << " on card " << c << " never pulled";
      table::convert_row(host_rows.data() + i * layout.stride(), layout, got.data(), wide);
      table::convert_row(it->second.data(), layout, want.data(), wide);
      EXPECT_EQ(got[RowLayout::kShow], want[RowLayout::kShow]) << key;
      EXPECT_EQ(got[RowLayout::kClick], want[RowLayout::kClick]) << key;
      const float w = want[RowLayout::kEmbedW];
      clipped += (w == min_bound || w == max_bound);
      for (int f = 0; f < wide.stride(); ++f) {
        ASSERT_TRUE(close_enough(got[f], want[f], param.storage))
            << "card " << c << " key " << key << " field " << f << ": got " << got[f] << ", want "
            << want[f];
      }
    }
  }
  EXPECT_EQ(seen.size(), ref.rows().size());
  EXPECT_EQ(created, ref.rows().size()) << "every key was created on the fly exactly once";
  if (cfg.optimizer.kind != SparseOptimizerKind::kAdagrad) {
    EXPECT_GT(clipped, 0u) << "no bound was hit";
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
                                  table::SparseStorage::kBf16}),
    [](const ::testing::TestParamInfo<ClusterCase>& info) { return std::string(info.param.name); });

// A Zipf-hot key with 10^4+ occurrences per card: the local merge and the owner merge take the
// chunked path of the segment reduction, and the result still matches the float64 reference.
TEST(HeterComm, HotKeyWithTensOfThousandsOfOccurrencesMatchesReference) {
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  Cluster cluster(2, cfg);
  ReferenceTable ref(cfg);
  const int push_dim = ref.layout().push_dim();
  const int pull_dim = ref.layout().pull_dim();
  std::vector<Batch> batches(2);
  for (int c = 0; c < 2; ++c) {
    BatchMaker maker(/*seed=*/300 + c, push_dim);
    batches[c] = maker.make(3000);                         // ordinary keys
    Batch hot = BatchMaker(/*seed=*/7, push_dim).make(1);  // one key, the same on both cards
    std::mt19937 rng(c);
    for (int i = 0; i < 12000; ++i) {
      const std::size_t at = rng() % (batches[c].keys.size() + 1);
      batches[c].keys.insert(batches[c].keys.begin() + at, hot.keys[0]);
      batches[c].grads.insert(batches[c].grads.begin() + at * push_dim, hot.grads.begin(),
                              hot.grads.end());
    }
  }
  for (int step = 0; step < 2; ++step) {
    const auto pulled = pull_push_step(cluster, batches, /*reuse_pull=*/step == 1);
    for (int c = 0; c < 2; ++c) {
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
  for (int c = 0; c < 2; ++c) {
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
      hot_rows += want[RowLayout::kShow] >= 48000.0f;
    }
  }
  EXPECT_EQ(hot_rows, 1u) << "the hot key's 48000 occurrences were not merged into one row";
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
      const int c = card.local_index();
      std::vector<uint64_t> mine;
      std::vector<float> rows;
      for (uint64_t k : known) {
        if (owner_card(k, kCards) != c) continue;
        mine.push_back(k);
        rows.resize(rows.size() + layout.stride());
        table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
      }
      auto dk = device::to_device(mine, card.memory(), card.stream());
      auto dr = device::to_device(rows, card.memory(), card.stream());
      cluster.store(c).insert_rows(dk.data(), dr.data(), mine.size(), card.stream());
      rows_before[c] = rows;
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
      card_table::CardSparseStore& store = cluster.store(unknown_owner);
      device::Card& card = cluster.cards().card(unknown_owner);
      card.activate();
      auto keys = card.make_buffer<uint64_t>(0);
      auto rows = card.make_buffer<float>(0);
      const std::size_t count = store.collect_all(keys, rows, card.stream());
      EXPECT_EQ(store.size(), count);
      std::vector<float> got = device::to_host(rows);
      std::vector<uint64_t> got_keys = device::to_host(keys);
      std::unordered_map<uint64_t, std::vector<float>> before;
      for (std::size_t i = 0, j = 0; i < known.size(); ++i) {
        if (owner_card(known[i], kCards) != unknown_owner) continue;
        before[known[i]].assign(rows_before[unknown_owner].begin() + j * layout.stride(),
                                rows_before[unknown_owner].begin() + (j + 1) * layout.stride());
        ++j;
      }
      ASSERT_EQ(count, before.size());
      for (std::size_t i = 0; i < count; ++i) {
        std::vector<float> row(got.begin() + i * layout.stride(),
                               got.begin() + (i + 1) * layout.stride());
        EXPECT_EQ(row, before[got_keys[i]]) << "key " << got_keys[i] << " changed by a failed push";
      }
    }
  }
}

// Create mode counts what it creates, on pull and on push (a key pushed without a pull).
TEST(HeterComm, CreateModeCountsCreatedRows) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  Cluster cluster(2, cfg);
  const int push_dim = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim).push_dim();
  std::vector<uint64_t> pull_keys = {10, 11, 12, 10, 10};  // 3 distinct
  std::vector<uint64_t> push_only = {20, 21, 20};          // 2 distinct, never pulled
  cluster.run([&](device::Card& card) {
    const int c = card.local_index();
    HeterComm& hc = cluster.heter_comm(c);
    // Both cards pull the same keys: each is created once, on its owner.
    auto keys = device::to_device(pull_keys, card.memory(), card.stream());
    auto out = card.make_buffer<float>(pull_keys.size() * hc.pull_dim());
    hc.pull(keys.data(), pull_keys.size(), out.data(), card.stream());
    card.stream().synchronize();  // pull returns with records in flight: wait before allocating
    std::vector<uint64_t> mine = c == 0 ? push_only : std::vector<uint64_t>{};
    auto pk = device::to_device(mine, card.memory(), card.stream());
    auto grads = device::to_device(std::vector<float>(mine.size() * push_dim, 0.5f), card.memory(),
                                   card.stream());
    hc.push(pk.data(), mine.size(), grads.data(), card.stream());
  });
  uint64_t on_pull = 0, on_push = 0, lookups = 0;
  for (int c = 0; c < 2; ++c) {
    on_pull += cluster.heter_comm(c).stats().created_on_pull;
    on_push += cluster.heter_comm(c).stats().created_on_push;
    lookups += cluster.heter_comm(c).stats().owner_lookups;
  }
  EXPECT_EQ(on_pull, 3u);
  EXPECT_EQ(on_push, 2u);
  EXPECT_EQ(cluster.store(0).size() + cluster.store(1).size(), 5u);
  // pull: each card sends 3 unique keys (6 lookups); push: 2 merged keys.
  EXPECT_EQ(lookups, 6u + 2u);
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

// Every row of card `c`'s store, by key.
std::map<uint64_t, std::vector<float>> store_rows(Cluster& cluster, int c,
                                                  const RowLayout& layout) {
  device::Card& card = cluster.cards().card(c);
  auto keys = card.make_buffer<uint64_t>(0);
  auto rows = card.make_buffer<float>(0);
  const std::size_t count = cluster.store(c).collect_all(keys, rows, card.stream());
  const std::vector<uint64_t> host_keys = device::to_host(keys);
  const std::vector<float> host_rows = device::to_host(rows);
  std::map<uint64_t, std::vector<float>> table;
  for (std::size_t i = 0; i < count; ++i) {
    table[host_keys[i]].assign(host_rows.begin() + i * layout.stride(),
                               host_rows.begin() + (i + 1) * layout.stride());
  }
  return table;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Create mode with the occurrences' slots: with slot_dims (widths 4, 8, 16) every key created on
// pull, or on push (never pulled), takes its slot's width and records its slot, on its owner
// (sharded) or on every replica, against an oracle of each key's width. Without slots a created
// row takes slot 0's width (the default), as before.
TEST(HeterComm, CreateModeGivesEachCreatedRowItsSlotsWidth) {
  GPUBOX_REQUIRE_CARDS(3);
  AccessorConfig base = test_config(SparseOptimizerKind::kAdagrad);
  base.mf_dim = 4;
  const AccessorConfig cfg = table::with_slot_dims(base, {{1, 8}, {2, 16}});
  const auto slot_of = [](uint64_t key) { return static_cast<int32_t>(key % 3); };
  const auto width_of = [](int32_t slot) { return slot == 1 ? 8 : slot == 2 ? 16 : 4; };
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    for (const int cards : {1, 2, 3}) {
      for (const bool with_slots : {true, false}) {
        SCOPED_TRACE(std::to_string(cards) + " cards, " +
                     (placement == Placement::kSharded ? "sharded" : "replicated") +
                     (with_slots ? "" : ", no slots"));
        HeterCommOptions options;
        options.placement = placement;
        options.missing_keys = MissingKeyPolicy::kCreate;
        Cluster cluster(cards, cfg, options);
        std::mt19937_64 rng(static_cast<uint64_t>(cards));
        std::vector<std::vector<uint64_t>> pull_keys(cards), push_keys(cards);
        std::set<uint64_t> all;
        for (int c = 0; c < cards; ++c) {
          for (int i = 0; i < 200; ++i) pull_keys[c].push_back(rng() % 300);  // shared, repeated
          for (int i = 0; i < 50; ++i) push_keys[c].push_back(1000 + c * 100 + rng() % 60);
          all.insert(pull_keys[c].begin(), pull_keys[c].end());
          all.insert(push_keys[c].begin(), push_keys[c].end());
        }
        const auto slots_of = [&](const std::vector<uint64_t>& keys) {
          std::vector<int32_t> slots;
          for (const uint64_t key : keys) slots.push_back(slot_of(key));
          return slots;
        };
        cluster.run([&](device::Card& card) {
          const int c = card.local_index();
          HeterComm& hc = cluster.heter_comm(c);
          auto keys = device::to_device(pull_keys[c], card.memory(), card.stream());
          auto slots = device::to_device(slots_of(pull_keys[c]), card.memory(), card.stream());
          auto out = card.make_buffer<float>(pull_keys[c].size() * hc.pull_dim());
          hc.pull(keys.data(), pull_keys[c].size(), out.data(), card.stream(),
                  with_slots ? slots.data() : nullptr);
          card.stream().synchronize();
          auto pk = device::to_device(push_keys[c], card.memory(), card.stream());
          auto ps = device::to_device(slots_of(push_keys[c]), card.memory(), card.stream());
          auto grads =
              device::to_device(std::vector<float>(push_keys[c].size() * hc.push_dim(), 0.5f),
                                card.memory(), card.stream());
          hc.push(pk.data(), push_keys[c].size(), grads.data(), card.stream(),
                  with_slots ? ps.data() : nullptr);
        });
        const RowLayout layout = cluster.store(0).layout();
        std::size_t rows = 0;
        for (int c = 0; c < cards; ++c) {
          for (const auto& [key, row] : store_rows(cluster, c, layout)) {
            ++rows;
            ASSERT_TRUE(all.count(key)) << key;
            const int32_t slot = with_slots ? slot_of(key) : 0;
            EXPECT_EQ(row[layout.mf_dim_offset()], static_cast<float>(width_of(slot)))
                << "key " << key << " on card " << c;
            EXPECT_EQ(row[layout.slot()], static_cast<float>(slot)) << "key " << key;
          }
        }
        EXPECT_EQ(rows, placement == Placement::kSharded ? all.size() : all.size() * cards);
      }
    }
  }
}

// Create mode, a key seen in several slots of different widths (in one card's batch and across
// cards): its row is created at the width of the slot it is seen in first — in rank order, then
// batch order, as the host tier creates a pass's key at its first slot in load order — on pull
// and on push, sharded and replicated, against an oracle of each key's first slot. (The owner
// used to take the narrowest of the slots it received.)
TEST(HeterComm, CreateModeGivesARepeatedKeyItsFirstSlotsWidth) {
  GPUBOX_REQUIRE_CARDS(3);
  AccessorConfig base = test_config(SparseOptimizerKind::kAdagrad);
  base.mf_dim = 4;
  const AccessorConfig cfg = table::with_slot_dims(base, {{1, 8}, {2, 16}, {3, 8}});
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    for (const int cards : {1, 2, 3}) {
      SCOPED_TRACE(std::to_string(cards) + " cards, " +
                   (placement == Placement::kSharded ? "sharded" : "replicated"));
      HeterCommOptions options;
      options.placement = placement;
      options.missing_keys = MissingKeyPolicy::kCreate;
      Cluster cluster(cards, cfg, options);
      std::mt19937_64 rng(static_cast<uint64_t>(40 + cards));
      std::vector<std::vector<uint64_t>> pull_keys(cards), push_keys(cards);
      std::vector<std::vector<int32_t>> pull_slots(cards), push_slots(cards);
      std::map<uint64_t, int32_t> first_slot;  // the oracle: rank order, then batch order
      for (int c = 0; c < cards; ++c) {
        for (int i = 0; i < 150; ++i) {
          pull_keys[c].push_back(1 + rng() % 40);  // few keys, each in several slots
          pull_slots[c].push_back(static_cast<int32_t>(rng() % 4));
          first_slot.emplace(pull_keys[c].back(), pull_slots[c].back());
        }
      }
      for (int c = 0; c < cards; ++c) {
        for (int i = 0; i < 60; ++i) {
          push_keys[c].push_back(1000 + rng() % 30);  // never pulled: created on push
          push_slots[c].push_back(static_cast<int32_t>(rng() % 4));
          first_slot.emplace(push_keys[c].back(), push_slots[c].back());
        }
      }
      cluster.run([&](device::Card& card) {
        const int c = card.local_index();
        HeterComm& hc = cluster.heter_comm(c);
        auto keys = device::to_device(pull_keys[c], card.memory(), card.stream());
        auto slots = device::to_device(pull_slots[c], card.memory(), card.stream());
        auto out = card.make_buffer<float>(pull_keys[c].size() * hc.pull_dim());
        hc.pull(keys.data(), pull_keys[c].size(), out.data(), card.stream(), slots.data());
        card.stream().synchronize();
        auto pk = device::to_device(push_keys[c], card.memory(), card.stream());
        auto ps = device::to_device(push_slots[c], card.memory(), card.stream());
        auto grads =
            device::to_device(std::vector<float>(push_keys[c].size() * hc.push_dim(), 0.5f),
                              card.memory(), card.stream());
        hc.push(pk.data(), push_keys[c].size(), grads.data(), card.stream(), ps.data());
      });
      const RowLayout layout = cluster.store(0).layout();
      std::size_t rows = 0;
      for (int c = 0; c < cards; ++c) {
        for (const auto& [key, row] : store_rows(cluster, c, layout)) {
          ++rows;
          ASSERT_TRUE(first_slot.count(key)) << key;
          const int32_t slot = first_slot.at(key);
          EXPECT_EQ(row[layout.slot()], static_cast<float>(slot)) << "key " << key << " card " << c;
          EXPECT_EQ(row[layout.mf_dim_offset()], static_cast<float>(table::slot_mf_dim(cfg, slot)))
              << "key " << key << " on card " << c;
        }
      }
      EXPECT_EQ(rows,
                placement == Placement::kSharded ? first_slot.size() : first_slot.size() * cards);
    }
  }
}

// Create mode: every card of a step passes slots or none does. When some do and some do not,
// every card fails with the same error naming both sides, agreed with the key counts before
// any key moves (without the check the slot exchange of one card met the key exchange of
// another: a hang until the group's timeout, or garbage). Sharded and replicated, on pull and
// push, 2 and 3 cards, either side; the group's timeout (5 s) bounds the test if it regresses.
// (A card that sees the group aborted by a peer's error first reports the peer's message.)
TEST(HeterComm, CreateModeSlotsOnSomeCardsOnlyFailsEveryCard) {
  GPUBOX_REQUIRE_CARDS(3);
  AccessorConfig base = test_config(SparseOptimizerKind::kAdagrad);
  base.mf_dim = 4;
  const AccessorConfig cfg = table::with_slot_dims(base, {{1, 8}});
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    for (const int cards : {2, 3}) {
      for (const int odd_card : {0, cards - 1}) {
        for (const bool on_push : {false, true}) {
          SCOPED_TRACE(std::to_string(cards) + " cards, odd card " + std::to_string(odd_card) +
                       (placement == Placement::kSharded ? ", sharded" : ", replicated") +
                       (on_push ? ", push" : ", pull"));
          HeterCommOptions options;
          options.placement = placement;
          options.missing_keys = MissingKeyPolicy::kCreate;
          Cluster cluster(cards, cfg, options, {}, std::chrono::seconds(5));
          // Only odd_card passes slots (odd_card 0), or all but it (the last card).
          const auto gives_slots = [&](int c) { return (c == odd_card) == (odd_card == 0); };
          std::vector<std::string> errors(cards);
          const auto started = std::chrono::steady_clock::now();
          const auto step = [&] {
            cluster.run([&](device::Card& card) {
              const int c = card.local_index();
              HeterComm& hc = cluster.heter_comm(c);
              std::vector<uint64_t> host_keys;
              for (uint64_t k = 0; k < 40; ++k) host_keys.push_back(1 + k * 7 + c);
              const std::vector<int32_t> host_slots(host_keys.size(), 1);
              auto keys = device::to_device(host_keys, card.memory(), card.stream());
              auto slots = device::to_device(host_slots, card.memory(), card.stream());
              const int32_t* given = gives_slots(c) ? slots.data() : nullptr;
              auto grads = card.make_buffer<float>(host_keys.size() * hc.push_dim());
              auto out = card.make_buffer<float>(host_keys.size() * hc.pull_dim());
              try {
                if (on_push) {
                  hc.push(keys.data(), host_keys.size(), grads.data(), card.stream(), given);
                } else {
                  hc.pull(keys.data(), host_keys.size(), out.data(), card.stream(), given);
                  card.stream().synchronize();
                }
              } catch (const Error& e) {
                errors[c] = e.what();
                throw;
              }
            });
          };
          EXPECT_THROW(step(), Error);
          EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(4))
              << "the cards waited for the group's timeout instead of failing at once";
          std::string with, without;
          for (int c = 0; c < cards; ++c) {
            std::string& side = gives_slots(c) ? with : without;
            side += (side.empty() ? "" : ",") + std::to_string(c);
          }
          for (int c = 0; c < cards; ++c) {
            EXPECT_NE(errors[c].find("cards " + with + " passed the keys' slots and cards " +
                                     without + " did not"),
                      std::string::npos)
                << "card " << c << ": " << errors[c];
          }
        }
      }
    }
  }
}

// Collective mode's placement against gpubox mode's on the same C cards and batches: the merged
// gradient of a key is summed in the same order (by position inside a card, by source rank
// across cards) and gets one optimizer step per batch in both, so every pulled record and every
// replica's row equals the sharded owner's row byte for byte (not only within the float64
// reference's tolerance), and the replicas are byte-identical. Rows are created on first touch
// from the key and the seed, so a card that meets a key only through the exchange creates the
// same row.
class ReplicatedPlacementTest : public ::testing::TestWithParam<ClusterCase> {};

TEST_P(ReplicatedPlacementTest, ReplicasAreIdenticalAndEqualTheShardedOwners) {
  const ClusterCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  const AccessorConfig cfg = test_config(param.kind);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  card_table::HashTableOptions table_options;
  table_options.initial_capacity = 64;  // the stores grow during the run
  HeterCommOptions replicated;
  replicated.placement = Placement::kReplicated;
  Cluster sharded_cluster(param.cards, cfg, {}, table_options);
  Cluster replicated_cluster(param.cards, cfg, replicated, table_options);
  BatchMaker maker(/*seed=*/77, layout.push_dim());
  std::mt19937_64 sizes(5);
  for (int step = 0; step < 8; ++step) {
    std::vector<Batch> batches(param.cards);
    for (int c = 0; c < param.cards; ++c) {
      std::size_t n = 1 + sizes() % 300;  // sizes 0, 1 and a few hundred
      if (step == 2 || (c + step) % 4 == 3) n = 0;
      if ((c + step) % 5 == 4) n = 1;
      batches[c] = maker.make(n);
    }
    const bool reuse_pull = step % 2 == 1;
    const auto want = pull_push_step(sharded_cluster, batches, reuse_pull);
    const auto got = pull_push_step(replicated_cluster, batches, reuse_pull);
    for (int c = 0; c < param.cards; ++c) {
      ASSERT_TRUE(same_bytes(got[c], want[c])) << "step " << step << " card " << c;
    }
  }
  std::map<uint64_t, std::vector<float>> owners;
  for (int c = 0; c < param.cards; ++c) {
    const auto rows = store_rows(sharded_cluster, c, layout);
    owners.insert(rows.begin(), rows.end());
  }
  ASSERT_GT(owners.size(), 100u);
  for (int c = 0; c < param.cards; ++c) {
    const auto replica = store_rows(replicated_cluster, c, layout);
    ASSERT_EQ(replica.size(), owners.size()) << "card " << c << " does not hold the whole table";
    for (const auto& [key, row] : owners) {
      auto it = replica.find(key);
      ASSERT_NE(it, replica.end()) << "card " << c << " lacks key " << key;
      ASSERT_TRUE(same_bytes(it->second, row)) << "card " << c << " key " << key;
    }
    // Every card created every row once (as the only owner does in the sharded placement).
    const HeterCommStats& stats = replicated_cluster.heter_comm(c).stats();
    EXPECT_EQ(stats.created_on_pull + stats.created_on_push, owners.size()) << "card " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cards, ReplicatedPlacementTest,
    ::testing::Values(ClusterCase{1, SparseOptimizerKind::kAdagrad, "1card_adagrad"},
                      ClusterCase{2, SparseOptimizerKind::kAdam, "2cards_adam"},
                      ClusterCase{3, SparseOptimizerKind::kAdagrad, "3cards_adagrad"},
                      ClusterCase{4, SparseOptimizerKind::kSharedAdam, "4cards_shared_adam"}),
    [](const ::testing::TestParamInfo<ClusterCase>& info) { return std::string(info.param.name); });

// What a training step (pull + push_pulled) asks of each card, placement against placement,
// counted on the cards (device counters) and by HeterComm: the same 3 host waits (unplanned: the
// key counts, the owner lookups, the end of push_pulled); 3 collectives
// instead of 4 (no records travel back on the pull); bytes: every card's padded block of unique
// keys and summed records to every card, against keys to the owners, records back and summed
// records to the owners; and, once the buffers have grown, no card allocation in either.
TEST(HeterComm, ReplicatedStepCountsAgainstSharded) {
  GPUBOX_REQUIRE_CARDS(3);
  constexpr int kCards = 3;
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions replicated;
  replicated.placement = Placement::kReplicated;
  BatchMaker maker(13, layout.push_dim());
  const std::vector<Batch> batches = {maker.make(300), maker.make(0), maker.make(120)};
  // Host-side oracle of the step's traffic.
  std::vector<std::set<uint64_t>> unique(kCards);
  for (int c = 0; c < kCards; ++c) unique[c].insert(batches[c].keys.begin(), batches[c].keys.end());
  std::size_t max_unique = 0;
  uint64_t sharded_bytes = 0;
  for (int c = 0; c < kCards; ++c) {
    max_unique = std::max(max_unique, unique[c].size());
    // Keys and summed records leave card c, and each key's pull record comes back (counted on
    // its owner).
    sharded_bytes += unique[c].size() *
                     (sizeof(uint64_t) + (layout.push_dim() + layout.pull_dim()) * sizeof(float));
  }
  const uint64_t replicated_bytes_per_card =
      kCards * max_unique * (sizeof(uint64_t) + layout.push_dim() * sizeof(float));

  struct StepCounts {
    std::vector<device::DeviceCounts> device;  // per card, the last step only
    std::vector<HeterCommStats> stats;         // per card, the last step's pull + push
  };
  auto run = [&](const HeterCommOptions& options) {
    Cluster cluster(kCards, cfg, options);
    StepCounts counts{std::vector<device::DeviceCounts>(kCards),
                      std::vector<HeterCommStats>(kCards)};
    for (int step = 0; step < 4; ++step) {
      cluster.run([&](device::Card& card) {
        const int c = card.local_index();
        HeterComm& hc = cluster.heter_comm(c);
        auto keys = device::to_device(batches[c].keys, card.memory(), card.stream());
        auto grads = device::to_device(batches[c].grads, card.memory(), card.stream());
        auto out = card.make_buffer<float>(batches[c].keys.size() * hc.pull_dim());
        card.stream().synchronize();
        const device::DeviceCounts before = card.counts();
        hc.pull(keys.data(), batches[c].keys.size(), out.data(), card.stream());
        HeterCommStats step_stats = hc.last_step();
        hc.push_pulled(grads.data(), card.stream());
        const device::DeviceCounts after = card.counts();
        step_stats.bytes_sent += hc.last_step().bytes_sent;
        step_stats.merged_updates = hc.last_step().merged_updates;
        counts.device[c].host_syncs = after.host_syncs - before.host_syncs;
        counts.device[c].collectives = after.collectives - before.collectives;
        counts.device[c].allocations = after.allocations - before.allocations;
        counts.stats[c] = step_stats;
      });
    }
    return counts;
  };
  const StepCounts sharded = run({});
  const StepCounts repl = run(replicated);
  uint64_t sharded_total = 0;
  std::size_t sharded_updates = 0;
  std::set<uint64_t> all_keys;
  for (const auto& u : unique) all_keys.insert(u.begin(), u.end());
  for (int c = 0; c < kCards; ++c) {
    EXPECT_EQ(sharded.device[c].host_syncs, 3u) << "card " << c;
    EXPECT_EQ(repl.device[c].host_syncs, 3u) << "card " << c;
    EXPECT_EQ(sharded.device[c].collectives, 4u) << "card " << c;
    EXPECT_EQ(repl.device[c].collectives, 3u) << "card " << c;
    EXPECT_EQ(sharded.device[c].allocations, 0u) << "card " << c;
    EXPECT_EQ(repl.device[c].allocations, 0u) << "card " << c;
    EXPECT_EQ(repl.stats[c].bytes_sent, replicated_bytes_per_card) << "card " << c;
    sharded_total += sharded.stats[c].bytes_sent;
    sharded_updates += sharded.stats[c].merged_updates;
    // Each replica applies one step per distinct key of the job's batch; the owners share them.
    EXPECT_EQ(repl.stats[c].merged_updates, all_keys.size()) << "card " << c;
  }
  EXPECT_EQ(sharded_total, sharded_bytes);
  EXPECT_EQ(sharded_updates, all_keys.size());
}

}  // namespace
}  // namespace gpubox::heter_comm

namespace gpubox::heter_comm {
namespace {

// plan_next_step (issue 31): a pull whose key counts come from the pass's plan gives the same
// records without a host wait (no count exchange, no wait for the owner's lookups: its checks
// are read late, by drain_checks here), and a plan that does not describe the batch fails,
// naming the plan and the step it happened in.
TEST(HeterComm, PlannedCountsSaveTheCountWaitAndAWrongPlanFails) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  constexpr int kCards = 2;
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;  // the card tier's policy
  std::vector<uint64_t> known;
  for (uint64_t k = 1; k <= 40; ++k) known.push_back(mix64(k));
  Cluster cluster(kCards, cfg, options);
  cluster.run([&](device::Card& card) {
    const int c = card.local_index();
    std::vector<uint64_t> mine;
    std::vector<float> rows;
    for (uint64_t k : known) {
      if (owner_card(k, kCards) != c) continue;
      mine.push_back(k);
      rows.resize(rows.size() + layout.stride());
      table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
    }
    auto dk = device::to_device(mine, card.memory(), card.stream());
    auto dr = device::to_device(rows, card.memory(), card.stream());
    cluster.store(c).insert_rows(dk.data(), dr.data(), mine.size(), card.stream());
  });
  // Each card's batch (repeated keys) and the plan: [src][dst] distinct keys.
  std::vector<std::vector<uint64_t>> batches(kCards);
  std::vector<uint64_t> plan(kCards * kCards, 0);
  for (int c = 0; c < kCards; ++c) {
    for (int i = 0; i < 30; ++i) batches[c].push_back(known[(c * 11 + i * 7) % 23]);
    const std::set<uint64_t> distinct(batches[c].begin(), batches[c].end());
    for (uint64_t k : distinct) ++plan[c * kCards + owner_card(k, kCards)];
  }
  ASSERT_GT(plan[0], 0u);
  ASSERT_GT(plan[1], 0u);
  const auto pull_all = [&](const std::vector<uint64_t>* counts, std::vector<uint64_t>* syncs) {
    std::vector<std::vector<float>> out(kCards);
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      HeterComm& hc = cluster.heter_comm(c);
      auto keys = device::to_device(batches[c], card.memory(), card.stream());
      auto records = card.make_buffer<float>(batches[c].size() * hc.pull_dim());
      cluster.comm(c).set_step(7, 3);  // the step context a late check names
      const uint64_t before = card.counts().host_syncs;
      if (counts != nullptr) hc.plan_next_step({counts->data(), kCards});
      hc.pull(keys.data(), batches[c].size(), records.data(), card.stream());
      (*syncs)[c] = card.counts().host_syncs - before;
      cluster.comm(c).set_step(-1, -1);
      hc.drain_checks();
      out[c] = device::to_host(records);
    });
    return out;
  };
  std::vector<uint64_t> exchanged(kCards), planned(kCards);
  const auto want = pull_all(nullptr, &exchanged);
  const auto got = pull_all(&plan, &planned);
  for (int c = 0; c < kCards; ++c) {
    EXPECT_EQ(got[c], want[c]) << "card " << c;
    EXPECT_EQ(exchanged[c], 2u) << "card " << c << ": the count wait and the lookups' wait";
    EXPECT_EQ(planned[c], 0u) << "card " << c << ": a planned pull waits for nothing";
  }
  // Card 1's row says one key more for card 0 and one fewer for card 1 (same total).
  std::vector<uint64_t> wrong = plan;
  ++wrong[1 * kCards + 0];
  --wrong[1 * kCards + 1];
  std::string message;
  try {
    pull_all(&wrong, &planned);
  } catch (const Error& e) {
    message = e.what();
  }
  // Card 1 finds its row wrong at its next wait; card 0, the owner the misrouted key reached,
  // may fail first on that key: either error names the plan.
  ASSERT_FALSE(message.empty()) << "a wrong plan went unnoticed";
  EXPECT_NE(message.find("plan does not describe"), std::string::npos) << message;
  EXPECT_NE(message.find("pass 7, step 3: "), std::string::npos) << message;
}

}  // namespace
}  // namespace gpubox::heter_comm

namespace gpubox::heter_comm {
namespace {

// Issue 31, item 2: a planned pull does not wait for its owner's lookups, so a key missing on its
// owner (missing_keys = fail: impossible when begin_pass placed the pass's keys) is found late:
// the step reads zeros for it and skips its update, and the error names the key, its owner, the
// requesting card and the pass and step of the pull, not of the step that noticed it: 4 steps
// later (the checks' ring) or at drain_checks.
TEST(HeterComm, APlannedPullReportsAMissingKeyLateNamingItsStep) {
  GPUBOX_REQUIRE_CARDS(2);
  constexpr int kCards = 2;
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;
  std::vector<uint64_t> known;
  for (uint64_t k = 1; k <= 40; ++k) known.push_back(mix64(k));
  uint64_t absent = mix64(1000);
  while (owner_card(absent, kCards) != 0) absent = mix64(absent);
  const auto run = [&](bool drain_at_once) {
    Cluster cluster(kCards, cfg, options);
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      std::vector<uint64_t> mine;
      std::vector<float> rows;
      for (uint64_t k : known) {
        if (owner_card(k, kCards) != c) continue;
        mine.push_back(k);
        rows.resize(rows.size() + layout.stride());
        table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
      }
      auto dk = device::to_device(mine, card.memory(), card.stream());
      auto dr = device::to_device(rows, card.memory(), card.stream());
      cluster.store(c).insert_rows(dk.data(), dr.data(), mine.size(), card.stream());
    });
    std::string message;
    std::vector<std::vector<float>> first_records(kCards);
    try {
      for (int step = 0; step < 6; ++step) {
        // Step 0: card 1's batch holds the absent key (owned by card 0).
        std::vector<std::vector<uint64_t>> batches(kCards);
        std::vector<uint64_t> plan(kCards * kCards, 0);
        for (int c = 0; c < kCards; ++c) {
          for (int i = 0; i < 12; ++i) batches[c].push_back(known[(c * 5 + i * 3 + step) % 40]);
          if (step == 0 && c == 1) batches[c].push_back(absent);
          const std::set<uint64_t> distinct(batches[c].begin(), batches[c].end());
          for (uint64_t k : distinct) ++plan[c * kCards + owner_card(k, kCards)];
        }
        cluster.run([&](device::Card& card) {
          const int c = card.local_index();
          HeterComm& hc = cluster.heter_comm(c);
          auto keys = device::to_device(batches[c], card.memory(), card.stream());
          auto records = card.make_buffer<float>(batches[c].size() * hc.pull_dim());
          auto grads =
              device::to_device(std::vector<float>(batches[c].size() * hc.push_dim(), 0.5f),
                                card.memory(), card.stream());
          cluster.comm(c).set_step(3, step);
          hc.plan_next_step({plan.data(), kCards});
          hc.pull(keys.data(), batches[c].size(), records.data(), card.stream());
          hc.push_pulled(grads.data(), card.stream());
          // The next step's buffers are allocated: the collectives' window closes first (device
          // rule 1; a trainer sizes them before the pass instead). The checks stay unread.
          card.stream().synchronize();
          if (step == 0) first_records[c] = device::to_host(records);
          if (drain_at_once) hc.drain_checks();
        });
      }
    } catch (const Error& e) {
      message = e.what();
    }
    // The absent key's pull record (card 1's last occurrence) read zeros.
    if (!first_records[1].empty()) {
      const std::size_t dim = static_cast<std::size_t>(layout.pull_dim());
      const std::vector<float> tail(first_records[1].end() - dim, first_records[1].end());
      EXPECT_EQ(tail, std::vector<float>(dim, 0.0f));
    }
    return message;
  };
  for (const bool drain_at_once : {true, false}) {
    const std::string message = run(drain_at_once);
    ASSERT_FALSE(message.empty()) << "the missing key went unnoticed";
    EXPECT_NE(message.find("pass 3, step 0: HeterComm pull: key " + std::to_string(absent) +
                           " is missing on its owner card 0 (requested by card 1"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace gpubox::heter_comm
