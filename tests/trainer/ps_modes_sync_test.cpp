// The sync mode stepping as the gpubox mode on as many cards (issue 32): one step and one pass
// of 1 trainer x 2 threads against 2 cards, rows and dense; 2 trainers x 1 thread averaging the
// job's dense gradients and summing a key's sparse gradients over the trainers; uneven batches
// weighed by their size; empty steps of either trainer.
// The rest of the modes: ps_modes_test.cpp (the same binary and fixture, ps_modes_fixture.hpp).

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/generator.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "table/server/protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "table/sparse_table.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/ps_modes/geo_rows.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using ps_test::PsModes;

// The held rows of `keys` in `tier` (peek: nothing changes).
std::vector<float> peek_rows(table::HostTier& tier, const std::vector<uint64_t>& keys) {
  std::vector<float> rows(keys.size() * static_cast<std::size_t>(tier.layout().stride()));
  throw_if_error(tier.peek(keys.data(), nullptr, keys.size(), rows.data(), nullptr));
  return rows;
}

// The largest difference of the embedding weights (embed_w, and embedx_w where both rows have
// the part) of two tiers' rows of the same keys.
double max_weight_diff(const std::vector<float>& a, const std::vector<float>& b,
                       const table::RowLayout& layout) {
  const auto stride = static_cast<std::size_t>(layout.stride());
  double worst = 0;
  for (std::size_t r = 0; r < a.size() / stride; ++r) {
    const float* x = a.data() + r * stride;
    const float* y = b.data() + r * stride;
    worst = std::max(worst, std::fabs(static_cast<double>(table::read_embed_w(x, layout)) -
                                      table::read_embed_w(y, layout)));
    if (x[layout.mf_size()] == 0.0f || y[layout.mf_size()] == 0.0f) continue;
    for (int32_t i = 0; i < layout.mf_dim; ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(table::read_embedx_w(x, layout, i)) -
                                        table::read_embedx_w(y, layout, i)));
    }
  }
  return worst;
}

// Lines [first, first + count) of `from` into the file `to`.
void write_lines(const std::string& from, int first, int count, const std::filesystem::path& to) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  for (int i = 0; i < first + count && std::getline(in, line); ++i) {
    if (i >= first) out << line << "\n";
  }
}

// The lines of `from`, range after range ({first line, count}), into the file `to` (its folder
// made).
void write_ranges(const std::string& from, std::initializer_list<std::pair<int, int>> ranges,
                  const std::filesystem::path& to) {
  std::ifstream in(from);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::filesystem::create_directories(to.parent_path());
  std::ofstream out(to);
  for (const auto& [first, count] : ranges) {
    const auto end = std::min(lines.size(), static_cast<std::size_t>(first + count));
    for (auto i = static_cast<std::size_t>(first); i < end; ++i) out << lines[i] << "\n";
  }
}

// Every distinct key of `files`, sorted.
std::vector<uint64_t> every_key(const TrainerConfig& cfg, const std::vector<std::string>& files) {
  dataset::InMemoryDataset data(cfg.dataset);
  data.set_filelist(files);
  throw_if_error(data.load_into_memory());
  std::vector<uint64_t> keys;
  dataset::Batch batch;
  for (std::size_t b = 0; b < data.num_batches_per_card(1); ++b) {
    data.fill_batch(0, 1, b, &batch);
    keys.insert(keys.end(), batch.keys.begin(), batch.keys.end());
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// The rows of `keys` the servers at `endpoints` hold for `cfg`'s table, and their layout.
struct ServerRows {
  std::vector<float> rows;
  table::RowLayout layout;
};
ServerRows server_rows(const TrainerConfig& cfg, const std::string& endpoints,
                       const std::vector<uint64_t>& keys) {
  table::server::RemoteHostTierOptions client_options;
  client_options.endpoints = endpoints;
  client_options.config = cfg.sparse;
  auto client = table::server::RemoteHostTier::connect(std::move(client_options));
  throw_if_error(client.status());
  return {peek_rows(**client, keys), (*client)->layout()};
}

// One sync trainer of `cfg` (its runner.thread_num threads) against one in-process server,
// trained a pass over `files`: its steps, its dense weights and the server's rows of `keys`.
struct SyncPass {
  double steps = 0;
  std::vector<float> dense;
  ServerRows rows;
};
SyncPass train_sync_pass(const TrainerConfig& cfg, const std::vector<std::string>& files,
                         const std::vector<uint64_t>& keys) {
  Servers shards(cfg, 1);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer sync(cfg, env);
  SyncPass pass;
  for (const auto& [name, value] : sync.train_pass(files).extra) {
    if (name == "steps") pass.steps = value;
  }
  pass.dense = sync.dense_values();
  pass.rows = server_rows(cfg, shards.endpoints(), keys);
  return pass;
}

// The rows a sync job trained over `sync_files` left on `endpoints` against the gpubox mode's
// on two cards (`gpubox` trains over `gpubox_files`, which hold the same lines): their weights'
// largest difference. `gpubox` is left trained, for its dense weights.
double rows_apart_from_two_cards(const TrainerConfig& sync_cfg, const std::string& endpoints,
                                 const std::vector<std::string>& sync_files, Trainer& gpubox,
                                 const std::vector<std::string>& gpubox_files) {
  const std::vector<uint64_t> keys = every_key(sync_cfg, sync_files);
  const ServerRows sync = server_rows(sync_cfg, endpoints, keys);
  gpubox.train_pass(gpubox_files);
  return max_weight_diff(sync.rows, peek_rows(gpubox.host_tier(), keys), sync.layout);
}

// `cards` cards of one thread each, as the gpubox mode's reference.
TrainerEnv cards_of_one_thread(int cards) {
  TrainerEnv env;
  env.selected_cards = device::testing::card_list(cards);
  env.threads_per_card = 1;
  return env;
}

// Issue 32: a sync step is the gpubox mode's on as many cards as the job has threads. Dense: the
// threads' gradients averaged (through the servers' gradient tables) and one optimizer step with
// the same moments on every thread (PsWorker::add_gradients), not each thread's own step with its
// own moments, averaged. Rows: each key's gradients summed over the trainer's threads and its rule
// applied once (MergedPushes), not once per thread. 1 trainer x 2 threads against 2 cards,
// batches of 64, SGD and Adam: on the cpu backend the dense weights and the rows' weights are
// equal after one step and after a pass (313 steps), since each thread merges a key's
// occurrences in a card's order (merge_by_key; SyncOnOneThreadIsTheGpuboxModeOnOneCardBitForBit).
// Before the merge-order fix (a thread summed a hot key's occurrences left to right, a card in
// chunks), measured: after one step the rows' weights 1.9e-9 apart; after a pass dense 1.5e-8
// (SGD) and 1.4e-6 (Adam), rows 4.8e-7 and 3.0e-7; on four cards a pass 1.5e-8 and 1.0e-3
// (Adam). Before the averaged step: after one step the rows 0.055 apart (the threads' pushes of a
// hot key applied one after the other), after a pass the dense 8.9e-4 with SGD and 0.18 with
// Adam. A 1-GPU machine runs one card and one thread here; on the cuda backend the card's sparse
// rule may round apart from the servers' (nvcc fuses multiply-adds), so there the weights are
// bounded (1e-6 after a step, 1e-5 after a pass) and the pass only on two threads.
TEST_F(PsModes, SyncOnTwoThreadsStepsAsTheGpuboxModeOnTwoCards) {
  const int cards = device::testing::cards_here(2);
  constexpr int kBatch = 64;
  const auto train = data_files((root_ / "train").string());
  const std::filesystem::path one_step_dir = root_ / "one_step";
  std::filesystem::create_directories(one_step_dir);
  write_lines(train.at(0), 0, cards * kBatch, one_step_dir / "part-00000");
  const auto one_step = data_files(one_step_dir.string());
  const std::vector<uint64_t> keys = every_key(config({}), train);
  for (const char* optimizer : {"SGD", "Adam"}) {
    for (const bool whole_pass : {false, true}) {
      SCOPED_TRACE(std::string(optimizer) + (whole_pass ? ", a pass" : ", one step"));
      const std::vector<std::string> base = {
          std::string("hyper_parameters.optimizer.class=") + optimizer,
          "runner.train_batch_size=" + std::to_string(kBatch)};
      const auto files = whole_pass ? train : one_step;
      std::vector<std::string> sync_extra = base;
      sync_extra.push_back("runner.sync_mode=sync");
      sync_extra.push_back("runner.thread_num=" + std::to_string(cards));
      const SyncPass sync = train_sync_pass(config(sync_extra), files, keys);
      const double steps = sync.steps;
      Trainer gpubox(config(base), cards_of_one_thread(cards));
      gpubox.train_pass(files);
      const double dense_diff = max_abs_diff(sync.dense, gpubox.dense_values(0));
      const double rows_diff =
          max_weight_diff(sync.rows.rows, peek_rows(gpubox.host_tier(), keys), sync.rows.layout);
      std::printf(
          "%s, %s (%.0f steps): sync on %d threads against the gpubox mode on %d cards: dense "
          "weights differ by at most %.3g, the rows' weights by %.3g\n",
          optimizer, whole_pass ? "a pass" : "one step", steps, cards, cards, dense_diff,
          rows_diff);
      if (whole_pass) {
        EXPECT_GT(steps, 100.0);
      } else {
        EXPECT_EQ(steps, 1.0);
      }
#if defined(GPUBOX_BACKEND_CUDA)
      if (whole_pass && cards == 1) continue;
      EXPECT_LT(dense_diff, whole_pass ? 1e-5 : 1e-6);
      EXPECT_LT(rows_diff, whole_pass ? 1e-5 : 1e-6);
#else
      EXPECT_EQ(dense_diff, 0.0);
      EXPECT_EQ(rows_diff, 0.0);
#endif
    }
  }
}

// The first field of `keys`' rows where two tiers' rows (peek_rows) differ in their bits, as
// "key K field F: A against B"; empty when every bit agrees. `fields`: the fields of a row
// compared (the whole stride, or its counters alone).
std::string first_row_difference(const std::vector<float>& a, const std::vector<float>& b,
                                 const std::vector<uint64_t>& keys, int32_t stride,
                                 int32_t fields) {
  const auto width = static_cast<std::size_t>(stride);
  for (std::size_t r = 0; r < keys.size(); ++r) {
    for (std::size_t f = 0; f < static_cast<std::size_t>(fields); ++f) {
      const float x = a[r * width + f];
      const float y = b[r * width + f];
      if (std::memcmp(&x, &y, sizeof(float)) == 0) continue;
      char line[160];
      std::snprintf(line, sizeof(line), "key %llu field %zu: %.9g against %.9g",
                    static_cast<unsigned long long>(keys[r]), f, x, y);
      return line;
    }
  }
  return "";
}

// Issue 32: one trainer of one thread in the sync mode is the gpubox mode on one card, bit for
// bit, over a whole pass (625 steps of 64). The thread's per-key merge of a batch's pushes sums
// a key's occurrences in the card's order (left to right, a key of more than 32 occurrences in
// chunks: segment_order.hpp). Before, it summed them all left to right, so the hottest keys'
// merged gradients differed in their last bits from the first step (SGD: rows 7e-10 apart after
// it, 1.8e-7 after 313 steps) until one step (414) magnified the rows' difference 200-fold (one
// instance's gradients moved 2.5% while the other 63's agreed to 4e-8: a discrete change of its
// backward, most likely a ReLU's pre-activation within the rounding of 0); after the pass the
// rows' weights were 6.2e-3 apart and the dense 2e-5 with SGD, 0.033 and 0.13 with Adam (the
// dense net's default here, whose sign-driven steps magnify most; the rows adagrad's).
// On the cuda backend the card's sparse rule may round apart from the servers' (nvcc fuses its
// multiply-adds, the host build does not), so there only the rows' counters (show, click,
// delta_score, unseen days) must agree bit for bit; the weights' differences are printed.
TEST_F(PsModes, SyncOnOneThreadIsTheGpuboxModeOnOneCardBitForBit) {
  const auto train = data_files((root_ / "train").string());
  const std::vector<std::string> base = {"hyper_parameters.optimizer.class=Adam",
                                         "runner.train_batch_size=64"};
  std::vector<std::string> sync_extra = base;
  sync_extra.push_back("runner.sync_mode=sync");
  sync_extra.push_back("runner.thread_num=1");
  const TrainerConfig sync_cfg = config(sync_extra);
  const std::vector<uint64_t> keys = every_key(sync_cfg, train);
  const SyncPass sync = train_sync_pass(sync_cfg, train, keys);
  const double steps = sync.steps;
  EXPECT_EQ(steps, 625.0);  // past step 414

  Trainer gpubox(config(base), cards_of_one_thread(1));
  gpubox.train_pass(train);
  const std::vector<float>& sync_rows = sync.rows.rows;
  const std::vector<float> gpubox_rows = peek_rows(gpubox.host_tier(), keys);
  const std::vector<float>& sync_dense = sync.dense;
  const std::vector<float> gpubox_dense = gpubox.dense_values(0);
  const table::RowLayout& layout = sync.rows.layout;
  const double dense_diff = max_abs_diff(sync_dense, gpubox_dense);
  const double rows_diff = max_weight_diff(sync_rows, gpubox_rows, layout);
  std::printf(
      "a pass (%.0f steps), sync on 1 thread against the gpubox mode on 1 card: dense weights "
      "differ by at most %.3g, the rows' weights by %.3g\n",
      steps, dense_diff, rows_diff);
  ASSERT_EQ(sync_rows.size(), gpubox_rows.size());
  EXPECT_EQ(first_row_difference(sync_rows, gpubox_rows, keys, layout.stride(),
                                 table::RowLayout::kEmbedW),
            "");
#if !defined(GPUBOX_BACKEND_CUDA)
  EXPECT_EQ(first_row_difference(sync_rows, gpubox_rows, keys, layout.stride(), layout.stride()),
            "");
  ASSERT_EQ(sync_dense.size(), gpubox_dense.size());
  EXPECT_EQ(std::memcmp(sync_dense.data(), gpubox_dense.data(), sync_dense.size() * sizeof(float)),
            0)
      << "the dense weights differ by at most " << dense_diff;
#endif
}

// Issue 32: two trainers of one thread each average the job's dense gradients too (the servers'
// gradient tables are the job's), so after one step (each trainer a file of one batch of 64) the
// dense weights are the gpubox mode's on two cards, with Adam; and the servers sum a key's
// gradients over both trainers before one update (table/server/ps_step_sums.hpp), so the rows are
// the cards' too (measured: dense equal, rows 1.9e-9 apart; when each trainer's push was applied
// on its own, a key in both batches took two Adam steps: rows 0.04-0.06 apart).
TEST_F(PsModes, SyncOnTwoTrainersStepsAsTheGpuboxModeOnTwoCards) {
  if (device::testing::cards_here(2) < 2) GTEST_SKIP() << "the reference needs two cards";
  constexpr int kBatch = 64;
  const auto train = data_files((root_ / "train").string());
  const std::filesystem::path dir = root_ / "two_trainers";
  std::filesystem::create_directories(dir);
  write_lines(train.at(0), 0, kBatch, dir / "part-00000");
  write_lines(train.at(0), kBatch, kBatch, dir / "part-00001");
  const auto files = data_files(dir.string());
  const std::vector<std::string> base = {"hyper_parameters.optimizer.class=Adam",
                                         "runner.train_batch_size=" + std::to_string(kBatch)};
  std::vector<std::string> sync_extra = base;
  sync_extra.push_back("runner.sync_mode=sync");
  const TrainerConfig cfg = config(sync_extra);
  Servers shards(cfg, 1);
  const std::vector<float> synced = run_job(
      cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int) { trainer.train_pass(files); },
      [](PsTrainer& trainer) { return trainer.dense_values(); });
  Trainer gpubox(config(base), cards_of_one_thread(2));
  const double rows_diff = rows_apart_from_two_cards(cfg, shards.endpoints(), files, gpubox, files);
  const double dense_diff = max_abs_diff(synced, gpubox.dense_values(0));
  std::printf(
      "one step, sync on 2 trainers x 1 thread against the gpubox mode on 2 cards: dense weights "
      "differ by at most %.3g, the rows' weights by %.3g\n",
      dense_diff, rows_diff);
  EXPECT_LT(dense_diff, 1e-6);
  EXPECT_LT(rows_diff, 1e-6);
}

// The job's dense step weighs each thread's gradients by its batch: two trainers of one thread
// whose batches differ (64 and 64 twice, then 37 and 64) step as the gpubox mode on two cards over
// the same batches, with the rows held still (sparse learning rates 1e-12) and with the rows
// learning (the servers sum both trainers' gradients of a key before one update): dense and rows.
// Averaging the threads' means instead, adding to a gradient table that still holds two steps
// ago, or applying each trainer's push of a key on its own, moves them away.
TEST_F(PsModes, SyncWeighsUnevenBatchesOfTwoTrainersByTheirSize) {
  if (device::testing::cards_here(2) < 2) GTEST_SKIP() << "the reference needs two cards";
  constexpr int kBatch = 64;
  const auto train = data_files((root_ / "train").string());
  const std::filesystem::path dir = root_ / "uneven_trainers";
  std::filesystem::create_directories(dir);
  // Three steps (so that a gradient table is used again): trainer 0's file holds lines [0, 64),
  // [128, 192) and [256, 293); trainer 1's [64, 128), [192, 256) and [293, 357). The gpubox
  // mode's step takes the cards' batches in a row of its files, so its one file is the lines in
  // order, step by step: [0, 357).
  const std::filesystem::path pieces = root_ / "uneven_pieces";
  std::filesystem::create_directories(pieces / "gpubox");
  write_lines(train.at(0), 0, 5 * kBatch + 37, pieces / "gpubox" / "part-00000");
  write_ranges(train.at(0), {{0, kBatch}, {2 * kBatch, kBatch}, {4 * kBatch, 37}},
               dir / "part-00000");
  write_ranges(train.at(0), {{kBatch, kBatch}, {3 * kBatch, kBatch}, {4 * kBatch + 37, kBatch}},
               dir / "part-00001");
  const auto files = data_files(dir.string());
  const auto gpubox_files = data_files((pieces / "gpubox").string());
  for (const bool rows_learn : {false, true}) {
    SCOPED_TRACE(rows_learn ? "rows learning" : "rows held");
    std::vector<std::string> base = {"hyper_parameters.optimizer.class=Adam",
                                     "runner.train_batch_size=" + std::to_string(kBatch)};
    for (const char* rate :
         {"sparse_optimizer.learning_rate", "sparse_optimizer.mf_learning_rate"}) {
      if (!rows_learn) base.push_back(std::string("hyper_parameters.") + rate + "=1e-12");
    }
    std::vector<std::string> sync_extra = base;
    sync_extra.push_back("runner.sync_mode=sync");
    const TrainerConfig cfg = config(sync_extra);
    Servers shards(cfg, 2);
    const std::vector<float> synced = run_job(
        cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int) { trainer.train_pass(files); },
        [](PsTrainer& trainer) { return trainer.dense_values(); });
    Trainer gpubox(config(base), cards_of_one_thread(2));
    const double rows_diff =
        rows_apart_from_two_cards(cfg, shards.endpoints(), files, gpubox, gpubox_files);
    const double dense_diff = max_abs_diff(synced, gpubox.dense_values(0));
    std::printf(
        "three steps of uneven batches (%s), sync on 2 trainers x 1 thread x 2 servers against the "
        "gpubox mode on 2 cards: dense weights differ by at most %.3g, the rows' by %.3g\n",
        rows_learn ? "rows learning" : "rows held", dense_diff, rows_diff);
    EXPECT_LT(dense_diff, rows_learn ? 1e-6 : 1e-7);
    EXPECT_LT(rows_diff, 1e-6);
  }
}

// Steps on which a thread of the job has no batch, in the sync mode's averaged dense step: trainer
// 0 (whose thread 0 overwrites the step's gradient table) with fewer batches than trainer 1, then
// the same job with the two trainers' files swapped. Each step averages the same batches either
// way, so the dense weights after two passes agree up to the rounding of the sums' order (the rows
// held still: sparse learning rates 1e-12). An overwriting thread that wrote nothing on its empty
// step left the sums of two steps ago in the table (the two runs' dense weights then differ by
// 3e-3 to 4e-3).
TEST_F(PsModes, SyncEmptyStepsOfEitherTrainerStepTheSame) {
  constexpr int kBatch = 64;
  const auto train = data_files((root_ / "train").string());
  struct Job {
    const char* name;
    int threads;
    int fewer;  // trainer 0's batches in the first run, trainer 1's in the second
    int more;
  };
  // 2 x 1: trainer 0's thread is empty on the third step. 2 x 2: the batches are dealt to the
  // threads, trainer 0's one each, trainer 1's three each: both of trainer 0's threads are empty
  // on the second and third steps.
  for (const Job& job : {Job{"2x1", 1, 2, 3}, Job{"2x2", 2, 2, 6}}) {
    SCOPED_TRACE(job.name);
    const TrainerConfig cfg =
        config({"hyper_parameters.optimizer.class=Adam",
                "runner.train_batch_size=" + std::to_string(kBatch), "runner.sync_mode=sync",
                "runner.thread_num=" + std::to_string(job.threads),
                "hyper_parameters.sparse_optimizer.learning_rate=1e-12",
                "hyper_parameters.sparse_optimizer.mf_learning_rate=1e-12"});
    const std::pair<int, int> fewer{0, job.fewer * kBatch};
    const std::pair<int, int> more{job.fewer * kBatch, job.more * kBatch};
    std::vector<std::vector<float>> dense;
    for (const bool swapped : {false, true}) {
      const std::filesystem::path dir =
          root_ / (std::string("empty_steps_") + job.name + (swapped ? "_swapped" : ""));
      write_ranges(train.at(0), {swapped ? more : fewer}, dir / "part-00000");
      write_ranges(train.at(0), {swapped ? fewer : more}, dir / "part-00001");
      const auto files = data_files(dir.string());
      Servers shards(cfg, 1);
      dense.push_back(run_job(
          cfg, shards.endpoints(), 2,
          [&](PsTrainer& trainer, int) {
            trainer.train_pass(files);
            trainer.train_pass(files);
          },
          [](PsTrainer& trainer) { return trainer.dense_values(); }));
    }
    const double dense_diff = max_abs_diff(dense[0], dense[1]);
    std::printf(
        "sync %s, trainer 0 with %d batches and trainer 1 with %d, then swapped: dense weights "
        "differ by at most %.3g\n",
        job.name, job.fewer, job.more, dense_diff);
    EXPECT_LT(dense_diff, 1e-6);
  }
}

// Issue 32: a sync job of 2 trainers x 1 thread on 2 servers (each step's rows summed over the
// trainers by the servers, its dense step the job's), stopped after pass 0 and resumed on fresh
// servers from its checkpoint, ends pass 1 where the job run without a stop ends it: dense weights
// and every row's weights, with Adam. (A new job draws a new job id, so no step of the job before
// is taken for one of its own.)
TEST_F(PsModes, AResumedSyncJobOfTwoTrainersEndsWhereTheUninterruptedOneEnds) {
  const auto train = data_files((root_ / "train").string());
  struct Ended {
    int64_t last_pass = -1;
    std::vector<float> dense;
    std::vector<float> rows;
  };
  std::vector<uint64_t> keys;
  const auto run_passes = [&](const std::string& saves, int epochs, bool resume) {
    const TrainerConfig cfg =
        config({"runner.train_data_dir=" + (root_ / "train").string(),
                "runner.test_data_dir=", "runner.sync_mode=sync", "runner.thread_num=1",
                "runner.save_mode=checkpoint", "runner.model_save_path=" + saves,
                "runner.epochs=" + std::to_string(epochs), "hyper_parameters.optimizer.class=Adam",
                std::string("runner.resume=") + (resume ? "auto" : "off")});
    if (keys.empty()) keys = every_key(cfg, train);
    Servers shards(cfg, 2);
    Ended ended;
    ended.dense = run_job(
        cfg, shards.endpoints(), 2,
        [&](PsTrainer& trainer, int id) {
          const std::vector<PassReport> reports = trainer.train();
          if (id == 0 && !reports.empty()) ended.last_pass = reports.back().pass;
        },
        [](PsTrainer& trainer) { return trainer.dense_values(); });
    ended.rows = peek_rows(*connect_client(shards, cfg), keys);
    return ended;
  };
  const std::string stopped = (root_ / "sync_two_trainers_resume").string();
  EXPECT_EQ(run_passes(stopped, 1, false).last_pass, 0);
  const Ended resumed = run_passes(stopped, 2, true);
  const Ended straight = run_passes((root_ / "sync_two_trainers_straight").string(), 2, false);
  EXPECT_EQ(resumed.last_pass, 1);
  EXPECT_EQ(straight.last_pass, 1);
  const double dense_diff = max_abs_diff(resumed.dense, straight.dense);
  ASSERT_EQ(resumed.rows.size(), straight.rows.size());
  const table::AccessorConfig sparse = config({}).sparse;
  const table::RowLayout layout =
      table::RowLayout::make(sparse.optimizer.kind, sparse.mf_dim, sparse.storage);
  const double rows_diff = max_weight_diff(resumed.rows, straight.rows, layout);
  std::printf(
      "sync, 2 trainers x 1 thread: resumed against uninterrupted, dense %.3g apart, "
      "rows %.3g\n",
      dense_diff, rows_diff);
  EXPECT_LT(dense_diff, 1e-6);
  EXPECT_LT(rows_diff, 1e-6);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
