// Issue 32: a PS training thread reuses its buffers step after step (PsWorker::step_allocations,
// trainer/ps_modes/step_buffers.hpp): the batch's distinct keys (BatchKeys, against an
// std::unordered_map oracle), its rows and records, the gradients read back, and the dense
// table's copies that the async mode's exchange takes every runner.dense_sync_steps steps
// (PaddleRec fat_deepffm's 71 MB table at batch 1: three fresh copies a step before). The steady
// step allocates nothing, on the host or the card; a pass like the one before reports
// pass_step_allocations 0. A step split in two (the sync mode's compute_step, then apply_step
// after the job's pull barrier) is applied or discarded before the next.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/batch.hpp"
#include "dataset/generator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/heter_comm/segment_order.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/ps_modes/batch_keys.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

// An independent count of what PsWorker::step_allocations counts: the binary's operator new
// counts, on a thread that asks it to, every allocation of at least g_large_bytes.
namespace {
thread_local bool g_watch_thread = false;
std::atomic<std::size_t> g_large_bytes{SIZE_MAX};
std::atomic<uint64_t> g_large_allocations{0};
}  // namespace

// GCC takes the replacement's free() for a mismatch with the replaced new.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t bytes) {
  if (g_watch_thread && bytes >= g_large_bytes.load()) ++g_large_allocations;
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

// `instances` instances of `slots` slots, 0 to `most` keys each out of `vocab`, dense_dim
// dense values each.
dataset::Batch make_batch(int slots, int dense_dim, std::size_t instances, int most, uint64_t vocab,
                          std::mt19937_64& rng) {
  dataset::Batch batch;
  batch.num_slots = slots;
  batch.dense_dim = dense_dim;
  batch.offsets.assign(1, 0);
  for (int s = 0; s < slots; ++s) {
    for (std::size_t i = 0; i < instances; ++i) {
      const auto keys = static_cast<int>(rng() % static_cast<uint64_t>(most + 1));
      for (int k = 0; k < keys; ++k) batch.keys.push_back(1 + rng() % vocab);
      batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
    }
  }
  for (std::size_t i = 0; i < instances; ++i) {
    batch.labels.push_back(static_cast<float>(rng() % 2));
    for (int d = 0; d < dense_dim; ++d)
      batch.dense.push_back(0.01f * static_cast<float>(rng() % 100));
  }
  return batch;
}

// BatchKeys against an unordered_map: distinct keys in order of first occurrence, each with the
// slot it was first seen in, each occurrence's index, and the hot keys (more than kReduceChunk
// occurrences) with their occurrences grouped in batch order (the segments a PS thread merges in
// a card's order, merge_by_key); batches of 0, 1 and many keys, few and many duplicates, all one
// key, one object reused throughout (nothing of a larger batch may leak into a smaller one).
void expect_gathered(const BatchKeys& keys, const dataset::Batch& batch,
                     const std::vector<int32_t>& slot_ids) {
  std::unordered_map<uint64_t, uint32_t> oracle;
  std::vector<uint64_t> want_keys;
  std::vector<int32_t> want_slots;
  std::vector<std::vector<uint32_t>> occurrences;  // per key, in batch order
  const std::size_t instances = batch.size();
  for (int s = 0; s < batch.num_slots; ++s) {
    for (uint32_t j = batch.offsets[s * instances]; j < batch.offsets[(s + 1) * instances]; ++j) {
      const auto [it, fresh] =
          oracle.emplace(batch.keys[j], static_cast<uint32_t>(want_keys.size()));
      if (fresh) {
        want_keys.push_back(batch.keys[j]);
        want_slots.push_back(slot_ids[static_cast<std::size_t>(s)]);
        occurrences.emplace_back();
      }
      occurrences[it->second].push_back(j);
      ASSERT_EQ(keys.occurrence_index()[j], it->second) << "at " << j;
    }
  }
  ASSERT_EQ(keys.keys(), want_keys);
  ASSERT_EQ(keys.slots(), want_slots);
  ASSERT_EQ(keys.occurrence_index().size(), batch.keys.size());
  std::vector<uint32_t> want_hot;
  std::vector<uint32_t> want_hot_occurrences;
  for (std::size_t u = 0; u < occurrences.size(); ++u) {
    if (occurrences[u].size() <= heter_comm::kReduceChunk) continue;
    want_hot.push_back(static_cast<uint32_t>(u));
    want_hot_occurrences.insert(want_hot_occurrences.end(), occurrences[u].begin(),
                                occurrences[u].end());
  }
  ASSERT_EQ(keys.hot_keys(), want_hot);
  ASSERT_EQ(keys.hot_occurrences(), want_hot_occurrences);
  ASSERT_EQ(keys.hot_start().size(), want_hot.size() + 1);
  for (std::size_t h = 0; h < want_hot.size(); ++h) {
    EXPECT_EQ(keys.hot_start()[h + 1] - keys.hot_start()[h], occurrences[want_hot[h]].size());
  }
}

TEST(BatchKeys, MatchesAnUnorderedMapOracleBatchAfterBatch) {
  const std::vector<int32_t> slot_ids = {101, 102, 103, 104};
  std::mt19937_64 rng(11);
  BatchKeys keys;
  BufferGrowth growth;
  std::size_t hot = 0;
  for (int round = 0; round < 62; ++round) {
    SCOPED_TRACE(round);
    // All one key (vocab 1) on the last two rounds: a hot key, then (2 instances) a cold one.
    const std::size_t instances = round == 60       ? 100
                                  : round == 61     ? 2
                                  : round % 10 == 0 ? 0
                                                    : 1 + rng() % 300;
    const uint64_t vocab = round >= 60 ? 1 : round % 3 == 0 ? 5 : 1 + rng() % 100000;
    const dataset::Batch batch = make_batch(4, 0, instances, 1 + round % 4, vocab, rng);
    keys.gather(batch, slot_ids, growth);
    expect_gathered(keys, batch, slot_ids);
    hot += keys.hot_keys().size();
  }
  EXPECT_GT(hot, 10u);
  EXPECT_GT(growth.growths(), 0u);
  // Batches no larger than one before grow nothing.
  const uint64_t grown = growth.growths();
  for (int round = 0; round < 20; ++round) {
    keys.gather(make_batch(4, 0, 1 + rng() % 200, 2, 1000, rng), slot_ids, growth);
  }
  EXPECT_EQ(growth.growths(), grown);
}

// One training thread of `cfg` on card 0 against its own loopback server, the servers' dense
// table adopted.
struct LoopbackThread {
  explicit LoopbackThread(const TrainerConfig& cfg) : shards(cfg, 1) {
    table::server::RemoteHostTierOptions options;
    options.endpoints = shards.endpoints();
    options.config = cfg.sparse;
    auto connected = table::server::RemoteHostTier::connect(std::move(options));
    throw_if_error(connected.status());
    servers = std::move(connected).value();
    card.activate();
    worker = std::make_unique<PsWorker>(card, *servers, cfg);
    worker->sync_dense(0.0f);
  }
  Servers shards;
  std::unique_ptr<table::server::RemoteHostTier> servers;
  device::Card card{0, 0, 0, 1};
  std::unique_ptr<PsWorker> worker;  // destroyed first
};

// One async training thread against a loopback server, its dense table exchanged every step
// (runner.dense_sync_steps 1, as fat_deepffm's config at batch 1): after the first step, steps
// of that batch or a smaller one, with their exchanges, allocate nothing, host or card.
TEST(PsStepAllocations, TheSteadyAsyncStepAndItsDenseExchangeAllocateNothing) {
  const TrainerConfig cfg = ps_test_config({"runner.sync_mode=async", "runner.dense_sync_steps=1"});
  LoopbackThread thread(cfg);
  PsWorker& worker = *thread.worker;
  device::Card& card = thread.card;
  std::mt19937_64 rng(3);
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  const dataset::Batch big = make_batch(slots, cfg.dataset.dense_dim, 8, 3, 500, rng);
  const dataset::Batch small = make_batch(slots, cfg.dataset.dense_dim, 1, 2, 500, rng);
  ASSERT_GT(big.keys.size(), small.keys.size());
  const uint64_t at_start = worker.step_allocations();
  EXPECT_GT(at_start, 0u) << "the dense table's copies are counted when first sized";
  g_large_bytes = worker.model().parameters().size() * sizeof(float);
  g_watch_thread = true;
  worker.train_step(big, 0, 0);
  worker.exchange_dense();
  g_watch_thread = false;
  EXPECT_GE(g_large_allocations.exchange(0), 2u) << "the exchange's snapshot and change, sized";
  const uint64_t sized = worker.step_allocations();
  EXPECT_GT(sized, at_start) << "the first step sizes the batch's buffers";
  const device::DeviceCounts card_before = card.counts();
  // This thread's steps (their exchanges run on the exchanger's thread) allocate nothing of the
  // dense table's size (its rows, records and gradients are smaller).
  g_watch_thread = true;
  for (int step = 1; step <= 30; ++step) {
    worker.train_step(step % 3 == 0 ? big : small, 0, step);
    worker.exchange_dense();
  }
  g_watch_thread = false;
  EXPECT_EQ(g_large_allocations.load(), 0u);
  worker.sync_dense(1.0f);
  EXPECT_EQ(worker.step_allocations(), sized);
  const device::DeviceCounts card_steps = card.counts() - card_before;
  EXPECT_EQ(card_steps.allocations, 0u);
  EXPECT_EQ(card_steps.pinned_allocations, 0u);
  // The batch goes up and the gradients and dense parameters come back through pinned memory:
  // a pageable copy would block the thread on a card (and is staged by the driver).
  EXPECT_EQ(card_steps.pageable_copies, 0u);
  // Eval steps, which do not wait for the card between batches, reuse the same pinned buffers:
  // each waits for the last upload only when its copies are still under way.
  const device::DeviceCounts eval_before = card.counts();
  for (int step = 0; step < 10; ++step) worker.eval_step(step % 2 == 0 ? big : small);
  const device::DeviceCounts eval_steps = card.counts() - eval_before;
  EXPECT_EQ(eval_steps.pageable_copies, 0u);
  EXPECT_EQ(eval_steps.allocations + eval_steps.pinned_allocations, 0u);
  EXPECT_EQ(worker.step_allocations(), sized);
  // Nothing of the exchanges was lost: the thread is the servers' only writer, and after the
  // last sync its parameters are the servers' table.
  std::vector<float> table(worker.model().parameters().size(), 0.0f);
  throw_if_error(thread.servers->dense(table::server::DenseAction::kRead, kDenseTableName, &table));
  EXPECT_EQ(worker.model().parameters().values_to_host(), table);
}

// The sync mode computes a step, meets the job's pull barrier and only then applies it
// (PsWorker::compute_step, apply_step); a barrier that fails between the two discards it. A
// computed step refuses a successor until applied or discarded, and a discarded one leaves the
// dense net as it was; async's read-ahead pull of the next batch is waited for by the discard.
TEST(PsStepAllocations, AComputedStepIsAppliedOrDiscardedBeforeTheNext) {
  for (const char* mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    const TrainerConfig cfg = ps_test_config({std::string("runner.sync_mode=") + mode});
    LoopbackThread thread(cfg);
    PsWorker& worker = *thread.worker;
    std::mt19937_64 rng(5);
    const int slots = static_cast<int>(cfg.dataset.slots.size());
    const dataset::Batch first = make_batch(slots, cfg.dataset.dense_dim, 8, 3, 500, rng);
    const dataset::Batch second = make_batch(slots, cfg.dataset.dense_dim, 8, 3, 500, rng);
    const std::vector<float> initial = worker.model().parameters().values_to_host();
    worker.compute_step(first, 0, 0, &second);  // async: pulls second's rows meanwhile
    try {
      worker.compute_step(second, 0, 1);
      ADD_FAILURE() << "a step computed while another was pending";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "step 0 of pass 0 was computed and neither applied nor discarded"),
                std::string::npos)
          << e.what();
    }
    worker.discard_step();
    EXPECT_EQ(worker.model().parameters().values_to_host(), initial)
        << "a discarded step moved the dense net";
    worker.discard_step();  // nothing pending: nothing
    worker.compute_step(second, 0, 1);
    worker.apply_step();
    // The sync mode's dense step (averages_gradients) is the job's averaged one.
    const bool averaged = averages_gradients(cfg.runner);
    EXPECT_EQ(worker.model().parameters().values_to_host() == initial, averaged)
        << "the dense net after an applied step";
    if (averaged) {
      worker.add_gradients(PsWorker::GradientShare::kOverwrite);
      worker.step_averaged(PsWorker::GradientShare::kOverwrite);
      EXPECT_NE(worker.model().parameters().values_to_host(), initial)
          << "an averaged step left the dense net";
    }
    worker.apply_step();  // a second time: nothing
    worker.compute_step(first, 0, 2);
    worker.apply_step();
    worker.finish_rows();
  }
}

// The pass report's pass_step_allocations: a pass over the same batches as the one before it
// allocates nothing in its steps (async and sync, two threads each; sync with its averaged
// dense step and with a longer dense window).
TEST(PsStepAllocations, ASecondPassOverTheSameBatchesReportsNoStepAllocations) {
  const fs::path root =
      fs::temp_directory_path() / ("gpubox_ps_step_allocations_" + std::to_string(::getpid()));
  fs::remove_all(root);
  dataset::OracleSummary oracle;
  gpubox::testing::write_planted_train_test(root, &oracle);
  const std::vector<std::string> files = {data_files((root / "train").string()).front()};
  for (const auto& [mode, window] :
       {std::make_pair("async", 2), std::make_pair("sync", 2), std::make_pair("sync", 1)}) {
    SCOPED_TRACE(std::string(mode) + ", dense_sync_steps " + std::to_string(window));
    const TrainerConfig cfg = ps_test_config({std::string("runner.sync_mode=") + mode,
                                              "runner.thread_num=2", "runner.split_file_list=false",
                                              "runner.dense_sync_steps=" + std::to_string(window)});
    Servers shards(cfg, 1);
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer trainer(cfg, env);
    const auto allocations = [](const PassReport& report) {
      for (const auto& [name, value] : report.extra) {
        if (name == "pass_step_allocations") return value;
      }
      ADD_FAILURE() << "no pass_step_allocations in the pass report";
      return -1.0;
    };
    const PassReport first = trainer.train_pass(files);
    const PassReport second = trainer.train_pass(files);
    EXPECT_GT(allocations(first), 0.0);
    EXPECT_EQ(allocations(second), 0.0);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
