// The shared helpers of the PassManager tests: pass_manager_test_util.cuh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/device/memory.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"

namespace gpubox::pass::pass_test {
namespace {

using device::testing::card_list;

PassManagerOptions without_next_pass_work(PassManagerOptions options) {
  options.next_pass_chunk_keys = 0;
  return options;
}

}  // namespace

table::AccessorConfig test_config() {
  table::AccessorConfig cfg;
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  cfg.embedx_threshold = 1.0f;  // some rows grow embedx during the passes
  cfg.optimizer.mf_initial_range = 0.01f;
  cfg.seed = 11;
  return cfg;
}

Engine::Engine(int cards, const PassManagerOptions& options, table::HostTier* external_host,
               const card_table::HashTableOptions& table_options, const table::AccessorConfig& cfg)
    : card_set(device::CardSet::from_list(card_list(cards))),
      options(options),
      placement(options.placement) {
  if (external_host == nullptr) {
    auto opened = table::SparseTable::open(cfg, table::HostTableConfig{});
    owned_host = std::move(opened.value());
    host = owned_host.get();
  } else {
    host = external_host;
  }
  group = comm::make_group(card_set);
  for (int c = 0; c < cards; ++c) {
    stores.push_back(
        std::make_unique<card_table::CardSparseStore>(card_set.card(c), cfg, table_options));
  }
  for (int c = 0; c < cards; ++c) {
    heter_comm::HeterCommOptions hc;
    hc.missing_keys = heter_comm::MissingKeyPolicy::kFail;  // begin_pass must have placed every key
    hc.placement = options.placement;
    comms.push_back(
        std::make_unique<heter_comm::HeterComm>(card_set.card(c), *stores[c], group->at(c), hc));
  }
  std::vector<card_table::CardSparseStore*> raw;
  for (auto& s : stores) raw.push_back(s.get());
  manager = std::make_unique<PassManager>(card_set, raw, *host, options);
}

void Engine::train(const std::vector<uint64_t>& pass_keys, uint64_t seed, int steps,
                   const std::function<void(int)>& between) {
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

std::map<uint64_t, std::vector<float>> Engine::card_rows() {
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

std::map<uint64_t, std::vector<float>> Engine::host_rows() {
  std::map<uint64_t, std::vector<float>> out;
  auto* table = inspect != nullptr ? inspect : dynamic_cast<table::SparseTable*>(host);
  EXPECT_NE(table, nullptr);
  const table::RowLayout& record = host->layout();
  throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
    std::vector<float> padded(row, row + record.of_row(row).stride());
    padded.resize(static_cast<std::size_t>(record.stride()), 0.0f);
    out[key] = std::move(padded);
  }));
  return out;
}

void Engine::forget_cards() {
  // The manager's own reset: the stores emptied and its count of the dirty rows they kept
  // (which make_room spares) with them, as a trainer clears its cards.
  manager->clear_cards();
}

bool rows_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string row_diff(const std::vector<float>& got, const std::vector<float>& want) {
  std::ostringstream out;
  out << got.size() << " floats, want " << want.size();
  int shown = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()) && shown < 6; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
    uint32_t got_bits = 0;
    uint32_t want_bits = 0;
    std::memcpy(&got_bits, &got[i], sizeof(float));
    std::memcpy(&want_bits, &want[i], sizeof(float));
    out << "; [" << i << "] " << got[i] << " (0x" << std::hex << got_bits << "), want " << want[i]
        << " (0x" << want_bits << std::dec << ")";
    ++shown;
  }
  return out.str();
}

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

std::shared_ptr<const std::vector<uint64_t>> sorted_keys(const std::vector<uint64_t>& keys) {
  auto sorted = std::make_shared<std::vector<uint64_t>>(keys);
  std::sort(sorted->begin(), sorted->end());
  sorted->erase(std::unique(sorted->begin(), sorted->end()), sorted->end());
  return sorted;
}

std::function<StagingProgress()> poll_of(const StagedRows* staged, bool rows_ready) {
  return [staged, rows_ready] { return StagingProgress{staged, rows_ready}; };
}

void train_older_then_begin(Engine& engine, const std::vector<uint64_t>& older,
                            const std::vector<uint64_t>& pass) {
  engine.manager->begin_pass(older);
  engine.train(older, 7, 3);
  engine.manager->end_pass();
  engine.manager->begin_pass(pass);
}

NextPassPair::NextPassPair(int cards, const PassManagerOptions& options)
    : early(cards, options), reference(cards, without_next_pass_work(options)) {}

void NextPassPair::begin(const std::vector<uint64_t>& pass) {
  early.manager->begin_pass(pass);
  reference.manager->begin_pass(pass);
}

void NextPassPair::begin_after(const std::vector<uint64_t>& older,
                               const std::vector<uint64_t>& pass) {
  for (Engine* engine : {&early, &reference}) train_older_then_begin(*engine, older, pass);
}

void NextPassPair::train_expecting(const std::vector<uint64_t>& pass, uint64_t seed, int steps,
                                   const std::function<StagingProgress()>& poll) {
  early.manager->expect_next_pass(sorted_keys(pass), poll);
  early.train(pass, seed, steps, [&](int c) { early.manager->prepare_next_pass(c); });
  reference.train(pass, seed, steps);
}

void NextPassPair::end_pass() {
  early.manager->end_pass();
  reference.manager->end_pass();
}

std::pair<PassStats, PassStats> NextPassPair::begin_next(const std::vector<uint64_t>& next,
                                                         const StagedRows* staged) {
  const PassStats got = early.manager->begin_pass(next, {}, staged);
  const PassStats want = reference.manager->begin_pass(next);
  return {got, want};
}

void NextPassPair::expect_same_card_rows(const std::vector<uint64_t>& keys) {
  const auto got_cards = early.card_rows();
  const auto want_cards = reference.card_rows();
  for (uint64_t k : keys) {
    ASSERT_TRUE(got_cards.count(k)) << "key " << k << " not on its card";
    ASSERT_TRUE(rows_equal(got_cards.at(k), want_cards.at(k)))
        << "key " << k << ": " << row_diff(got_cards.at(k), want_cards.at(k));
  }
}

void NextPassPair::train_and_compare_hosts(const std::vector<uint64_t>& keys, uint64_t seed,
                                           int steps) {
  early.train(keys, seed, steps);
  reference.train(keys, seed, steps);
  end_pass();
  EXPECT_EQ(early.host_rows(), reference.host_rows());
}

}  // namespace gpubox::pass::pass_test
