// Shared helpers of HeterComm's tests on simulated cards (heter_comm_test.cu,
// heter_comm_create_test.cu, heter_comm_placement_test.cu, heter_comm_planned_test.cu: one binary,
// heter_comm_test): seeded Zipf-ish batches, the accessor they train, C cards each with its store
// and HeterComm (a Cluster), one pull + push step on every card, and a card's rows by key.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::heter_comm::cluster_test {

using device::testing::card_list;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

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

inline AccessorConfig test_config(SparseOptimizerKind kind) {
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
inline std::vector<std::vector<float>> pull_push_step(Cluster& cluster,
                                                      const std::vector<Batch>& batches,
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
  bool per_table = false;  // adam_bias_correction per_table (the table's step)
};
inline void PrintTo(const ClusterCase& c, std::ostream* os) { *os << c.name; }

// Places each key of `known` that `card` owns there with its initial row (day 1), as begin_pass
// would; on the card's thread (inside Cluster::run). The rows placed, in the order of `known`.
inline std::vector<float> place_on_owner(Cluster& cluster, device::Card& card,
                                         const std::vector<uint64_t>& known,
                                         const AccessorConfig& cfg, const RowLayout& layout) {
  const int c = card.local_index();
  std::vector<uint64_t> mine;
  std::vector<float> rows;
  for (uint64_t k : known) {
    if (owner_card(k, cluster.size()) != c) continue;
    mine.push_back(k);
    rows.resize(rows.size() + layout.stride());
    table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
  }
  auto dk = device::to_device(mine, card.memory(), card.stream());
  auto dr = device::to_device(rows, card.memory(), card.stream());
  cluster.store(c).insert_rows(dk.data(), dr.data(), mine.size(), card.stream());
  return rows;
}

// Every row of card `c`'s store, by key.
inline std::map<uint64_t, std::vector<float>> store_rows(Cluster& cluster, int c,
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

inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace gpubox::heter_comm::cluster_test
