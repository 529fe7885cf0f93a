// The fixture of the multi-trainer tests (multi_trainer_test.cpp, multi_trainer_saves_test.cpp:
// one binary, multi_trainer_test): the data made once for the suite (files of one batch, named
// for the 1 x 4 and 2 x 2 layouts), jobs of real gpubox_train processes (simulated cards, Gloo
// over loopback) and gpubox_server processes, and the saves they write read back. One class for
// both files, so that gtest sees one fixture type (and one SetUpTestSuite) for the suite
// MultiTrainer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "table/dense_table.hpp"
#include "table/server/host_tier_factory.hpp"
#include "table/sparse_table.hpp"
#include "tests/integration/child_process.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

#if !defined(GPUBOX_TRAIN_BIN) || !defined(GPUBOX_SERVER_BIN)
#error "GPUBOX_TRAIN_BIN and GPUBOX_SERVER_BIN must name the binaries"
#endif

namespace gpubox::multi_trainer_test {

namespace fs = std::filesystem;
using testing::ChildProcess;

constexpr double kRunSeconds = 120;  // one job, at most (each takes a few seconds)
constexpr int kLinesPerFile = 100;   // one batch
constexpr int kSteps = 10;           // batches per card per pass in the 2 x 2 / 1 x 4 jobs

class MultiTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_multi_trainer_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    for (const auto& [dir, first_line, files] :
         {std::tuple{"train_1x4", 0, 4 * kSteps}, std::tuple{"train2", 0, 2 * kSteps},
          std::tuple{"test", 20000, 2 * kSteps}}) {
      dataset::GeneratorOptions gen;
      gen.out_dir = (root_ / dir).string();
      gen.lines = kLinesPerFile * files;
      gen.first_line = first_line;
      gen.files = files;
      gen.seed = 3;
      gen.slots = 6;
      gen.dense = 3;
      gen.vocab = 2000;
      dataset::OracleSummary oracle;
      throw_if_error(dataset::generate(gen, &oracle));
    }
    // 1 x 4: card g reads sorted file 4b + g at step b. 2 x 2: trainer t reads the sorted files
    // [2 kSteps t, 2 kSteps (t + 1)) and its card c at step b the block's file 2b + c: that file
    // is a copy of 1 x 4's file 4b + 2t + c.
    fs::create_directories(root_ / "train_2x2");
    for (int t = 0; t < 2; ++t) {
      for (int b = 0; b < kSteps; ++b) {
        for (int c = 0; c < 2; ++c) {
          char from[32], to[32];
          std::snprintf(from, sizeof(from), "part-%05d", 4 * b + 2 * t + c);
          std::snprintf(to, sizeof(to), "part-%05d", 2 * kSteps * t + 2 * b + c);
          fs::copy_file(root_ / "train_1x4" / from, root_ / "train_2x2" / to);
        }
      }
    }
    // A batch is a file's lines; no shuffle.
    // Two files of kSteps batches each.
    fs::create_directories(root_ / "train_one_file_each");
    for (int f = 0; f < 2; ++f) {
      std::ofstream out(root_ / "train_one_file_each" / ("part-0000" + std::to_string(f)));
      for (int k = 0; k < kSteps; ++k) {
        char name[32];
        std::snprintf(name, sizeof(name), "part-%05d", f * kSteps + k);
        out << std::ifstream(root_ / "train2" / name).rdbuf();
      }
    }
    std::ofstream(root_ / "config.yaml") << "runner:\n"
                                            "  test_data_dir: test\n"
                                            "  train_batch_size: "
                                         << kLinesPerFile
                                         << "\n"
                                            "  infer_batch_size: 256\n"
                                            "  epochs: 3\n"
                                            "  thread_num: 1\n"
                                            "  shuffle: false\n"
                                            "  seed: 5\n"
                                            "  collective_timeout_s: 10\n"
                                            "hyper_parameters:\n"
                                            "  sparse_inputs_slots: 7\n"
                                            "  dense_input_dim: 3\n"
                                            "  sparse_feature_dim: 5\n"
                                            "  fc_sizes: [16, 8]\n"
                                            "  optimizer:\n"
                                            "    learning_rate: 0.05\n"
                                            "  sparse_optimizer:\n"
                                            "    learning_rate: 0.3\n"
                                            "    mf_learning_rate: 0.3\n";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Trainer `id` of `trainers` on `cards`, training `train_dir` against `servers` ("": the
  // in-process host tier); its metrics file is <name>.jsonl (trainer 0) or
  // <name>.trainer<id>.jsonl.
  static std::unique_ptr<ChildProcess> start_trainer(const std::string& name, int id, int trainers,
                                                     const std::string& cards,
                                                     const std::string& train_dir,
                                                     std::vector<std::string> args = {},
                                                     const std::string& servers = "") {
    args.insert(args.begin(), {"--config", (root_ / "config.yaml").string(), "--threads_per_card",
                               "1", "-o", "runner.train_data_dir=" + train_dir, "-o",
                               "runner.metrics_path=" + (root_ / (name + ".jsonl")).string()});
    const std::vector<std::string> env = {
        "FLAGS_selected_gpus=" + cards,
        "PADDLE_TRAINER_ID=" + std::to_string(id),
        "PADDLE_TRAINERS_NUM=" + std::to_string(trainers),
        "GPUBOX_RENDEZVOUS=file://" + (root_ / ("rendezvous_" + name)).string(),
        "PADDLE_PSERVERS_IP_PORT_LIST=" + servers,
        "GPUBOX_AUTH_TOKEN_FILE="};
    return std::make_unique<ChildProcess>(GPUBOX_TRAIN_BIN, args, env, root_.string());
  }

  // A job of `trainers` processes; returns every trainer's output (trainer 0's first) after
  // every one exited with 0.
  static std::vector<std::string> run_job_outputs(const std::string& name, int trainers,
                                                  const std::string& cards,
                                                  const std::string& train_dir,
                                                  const std::vector<std::string>& args = {},
                                                  const std::string& servers = "") {
    std::vector<std::unique_ptr<ChildProcess>> procs;
    for (int t = 0; t < trainers; ++t)
      procs.push_back(start_trainer(name, t, trainers, cards, train_dir, args, servers));
    std::vector<std::string> outputs;
    for (int t = 0; t < trainers; ++t) {
      const int rc = procs[t]->wait(kRunSeconds);
      EXPECT_EQ(rc, 0) << name << " trainer " << t << ":\n" << procs[t]->output();
      outputs.push_back(procs[t]->output());
    }
    return outputs;
  }
  static std::string run_job(const std::string& name, int trainers, const std::string& cards,
                             const std::string& train_dir) {
    return run_job_outputs(name, trainers, cards, train_dir).front();
  }

  // A fresh gpubox_server on any port, holding saves under `data_dir` (default: the test
  // folder), with the arguments `extra` (-o overrides) too; its endpoint is `*endpoint`.
  static std::unique_ptr<ChildProcess> start_server(std::string* endpoint,
                                                    const fs::path& data_dir = {},
                                                    const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--port",     "0",
                                     "--config",   (root_ / "config.yaml").string(),
                                     "--data_dir", (data_dir.empty() ? root_ : data_dir).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = std::make_unique<ChildProcess>(GPUBOX_SERVER_BIN, args);
    EXPECT_TRUE(server->wait_for(" (shard ", 10)) << server->output();
    const std::string& out = server->output();
    const auto at = out.find("listening on ");
    *endpoint =
        at == std::string::npos ? "" : out.substr(at + 13, out.find(' ', at + 13) - at - 13);
    return server;
  }

  // gpubox_train `args` run by 1 trainer x 4 cards and by 2 trainers x 2 cards, each job
  // against a fresh server; returns trainer 0's output of each.
  static std::pair<std::string, std::string> one_by_four_and_two_by_two(
      const std::string& name, const std::vector<std::string>& args) {
    std::string endpoint;
    std::pair<std::string, std::string> out;
    {
      auto server = start_server(&endpoint);
      out.first = run_job_outputs(name + "_one", 1, "0,1,2,3", "train_1x4", args, endpoint).front();
    }
    {
      auto server = start_server(&endpoint);
      out.second = run_job_outputs(name + "_two", 2, "0,1", "train_2x2", args, endpoint).front();
    }
    return out;
  }

  // What a save holds: every sparse row (read into an in-process table) and the dense block's
  // parameters and optimizer state.
  struct SavedModel {
    std::map<uint64_t, std::vector<float>> rows;
    std::vector<float> dense;  // values, moment1, moment2, steps
  };
  static SavedModel read_save(const fs::path& dir) {
    auto config = trainer::load_trainer_config((root_ / "config.yaml").string());
    throw_if_error(config.status());
    auto host = table::make_host_tier(config->sparse, config->host_tier);
    throw_if_error(host.status());
    throw_if_error((*host)->load((dir / "sparse").string()));
    SavedModel saved;
    const int stride = (*host)->layout().stride();
    auto* table = dynamic_cast<table::SparseTable*>(host->get());
    EXPECT_NE(table, nullptr);
    throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
      saved.rows[key] = std::vector<float>(row, row + stride);
    }));
    table::DenseTable dense;
    throw_if_error(dense.load((dir / "dense").string()));
    const auto block = dense.get("dense");
    EXPECT_TRUE(block.has_value());
    saved.dense = block->values;
    for (const char* name : {"moment1", "moment2", "steps"}) {
      const auto& state = block->state.at(name);
      saved.dense.insert(saved.dense.end(), state.begin(), state.end());
    }
    return saved;
  }

  // Two saves hold the same keys; returns the largest difference between their values
  // (absolute, relative above magnitude 1), sparse rows and dense half alike.
  static double max_difference(const SavedModel& a, const SavedModel& b) {
    double worst = 0;
    auto diff = [&](float x, float y) {
      const double d =
          std::fabs(static_cast<double>(x) - y) / std::max(1.0, std::fabs(static_cast<double>(x)));
      worst = std::max(worst, d);
    };
    EXPECT_EQ(a.rows.size(), b.rows.size());
    for (const auto& [key, row] : a.rows) {
      const auto other = b.rows.find(key);
      if (other == b.rows.end()) {
        ADD_FAILURE() << "key " << key << " saved by one layout only";
        return worst;
      }
      EXPECT_EQ(row.size(), other->second.size());
      for (std::size_t i = 0; i < row.size() && i < other->second.size(); ++i)
        diff(row[i], other->second[i]);
    }
    EXPECT_EQ(a.dense.size(), b.dense.size());
    for (std::size_t i = 0; i < a.dense.size() && i < b.dense.size(); ++i)
      diff(a.dense[i], b.dense[i]);
    return worst;
  }

  // The number after the last `label` in `out` (NaN when absent).
  static double last_value(const std::string& out, const std::string& label) {
    const auto at = out.rfind(label);
    if (at == std::string::npos) return std::nan("");
    return std::stod(out.substr(at + label.size()));
  }

  static std::vector<std::string> lines_of(const fs::path& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  inline static fs::path root_;
};

}  // namespace gpubox::multi_trainer_test
