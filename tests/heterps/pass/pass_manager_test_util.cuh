// Shared helpers of the PassManager tests (pass_manager_*_test.cu, one binary: pass_manager_test):
// an engine of 1-3 simulated cards with the in-process host tier (table::SparseTable) or any
// other, seeded passes over a sliding window of keys, the staging polls the trainer's pipeline
// gives, and the next-pass tests' pair of engines (one doing the next pass's card work between
// its steps, one not: their oracle).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_table.hpp"

namespace gpubox::pass::pass_test {

// Adagrad, mf_dim 4, an embedx threshold some rows pass during the passes, seed 11.
table::AccessorConfig test_config();

// One engine: cards, their stores and HeterComms, a host tier, a pass manager.
struct Engine {
  // `external_host` (optional) replaces the engine's own in-process host tier; `table_options`
  // sizes every card's store (its hash table and row pages); `cfg` is the stores' and the own
  // host tier's (test_config() by default).
  Engine(int cards, const PassManagerOptions& options, table::HostTier* external_host = nullptr,
         const card_table::HashTableOptions& table_options = {},
         const table::AccessorConfig& cfg = test_config());

  // Per card, per step: a batch of keys from the pass and seeded gradients; pull then push.
  // `between(card)` (optional) runs on the card's thread after each step.
  void train(const std::vector<uint64_t>& pass_keys, uint64_t seed, int steps,
             const std::function<void(int)>& between = nullptr);

  // Every card row as key -> row (host copies); checks each key's card (sharded) or that every
  // replica is the whole table, byte for byte (replicated).
  std::map<uint64_t, std::vector<float>> card_rows();
  // Every host-tier row (of `inspect` when set), as a record: the row at its own width, zeros
  // after it (as card_rows gives them).
  std::map<uint64_t, std::vector<float>> host_rows();
  // Empties every card's store through PassManager::clear_cards (the uncached reference forgets
  // its cards at each end_pass).
  void forget_cards();

  device::CardSet card_set;
  PassManagerOptions options;  // the pass manager's
  heter_comm::Placement placement;
  std::unique_ptr<table::SparseTable> owned_host;
  table::HostTier* host = nullptr;
  table::SparseTable* inspect = nullptr;  // the table behind a remote host tier
  std::unique_ptr<comm::CommGroup> group;
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores;
  std::vector<std::unique_ptr<heter_comm::HeterComm>> comms;
  std::unique_ptr<PassManager> manager;
};

bool rows_equal(const std::vector<float>& a, const std::vector<float>& b);
// How `got` differs from `want`, for a failure message: their sizes, and the first few floats
// that differ (index, both values, their bits).
std::string row_diff(const std::vector<float>& got, const std::vector<float>& want);

// Passes over a sliding window of a key universe: consecutive passes overlap by about half.
std::vector<std::vector<uint64_t>> make_passes(int passes, std::size_t keys_per_pass,
                                               uint64_t seed);

// A pass's keys sorted and unique, shared, as the trainer hands expect_next_pass its data set's.
std::shared_ptr<const std::vector<uint64_t>> sorted_keys(const std::vector<uint64_t>& keys);

// A poll that reports `staged` planned, and fetched when `rows_ready`.
std::function<StagingProgress()> poll_of(const StagedRows* staged, bool rows_ready = true);

// `engine` trains `older` (seed 7, 3 steps), ends it and begins `pass`: under a row budget the
// rows of `older` outside `pass` that begin_pass leaves stay on the cards, clean.
void train_older_then_begin(Engine& engine, const std::vector<uint64_t>& older,
                            const std::vector<uint64_t>& pass);

// Two engines over the same passes: `early` does the next pass's card work between its steps
// (the options' next_pass_chunk_keys), `reference` has the same options without that work. The
// next-pass tests' oracle: both place the same rows of the next pass.
struct NextPassPair {
  NextPassPair(int cards, const PassManagerOptions& options);

  // Both begin `pass`.
  void begin(const std::vector<uint64_t>& pass);
  // Both run train_older_then_begin (`early` first).
  void begin_after(const std::vector<uint64_t>& older, const std::vector<uint64_t>& pass);
  // `early` expects the pass after `pass` (sorted_keys(pass), `poll`); both train `pass`, `early`
  // with its prepare_next_pass after each step.
  void train_expecting(const std::vector<uint64_t>& pass, uint64_t seed, int steps,
                       const std::function<StagingProgress()>& poll);
  void end_pass();
  // Both begin `next`, `early` with `staged`: (early's stats, reference's).
  std::pair<PassStats, PassStats> begin_next(const std::vector<uint64_t>& next,
                                             const StagedRows* staged = nullptr);
  // Every key of `keys` is on early's cards, its row bit-identical to reference's.
  void expect_same_card_rows(const std::vector<uint64_t>& keys);
  // Both train the pass begun (`keys`) and end it; the host tiers are then equal.
  void train_and_compare_hosts(const std::vector<uint64_t>& keys, uint64_t seed, int steps);

  Engine early;
  Engine reference;
};

}  // namespace gpubox::pass::pass_test
