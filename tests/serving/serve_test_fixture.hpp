// The fixture of the serving tests (serve_test.cpp, serve_http_test.cpp: one binary, serve_test):
// a model trained once for the suite on generated data (the in-process host tier, one simulated
// card), saved, evaluated as `--mode infer` does, exported and loaded for serving; and the
// predictions a reply's JSON body holds. One class for both files, so that gtest sees one
// fixture type (and one SetUpTestSuite) for the suite Serving.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "serving/http_server.hpp"
#include "serving/serving_model.hpp"
#include "table/sparse_table.hpp"
#include "tests/serving/http_client.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

#if !defined(GPUBOX_TRAIN_BIN) || !defined(GPUBOX_SERVE_BIN)
#error "GPUBOX_TRAIN_BIN and GPUBOX_SERVE_BIN must name the binaries"
#endif

namespace gpubox::serving::serve_test {

namespace fs = std::filesystem;
using trainer::data_files;
using trainer::load_trainer_config;
using trainer::Trainer;
using trainer::TrainerEnv;

inline std::vector<std::string> config_overrides(const fs::path& root) {
  return {"runner.train_data_dir=" + (root / "train").string(), "runner.train_batch_size=64",
          "runner.infer_batch_size=50", "runner.shuffle=false",
          "runner.metrics_path=", "runner.thread_num=1", "hyper_parameters.sparse_inputs_slots=7",
          "hyper_parameters.sparse_feature_dim=5", "hyper_parameters.dense_input_dim=3",
          "hyper_parameters.fc_sizes=[16, 8]",
          // Keys never trained read as a seeded embed_w, not zeros: the server must match.
          "hyper_parameters.sparse_optimizer.initial_range=0.05",
          "hyper_parameters.sparse_optimizer.learning_rate=0.3",
          "hyper_parameters.sparse_optimizer.mf_learning_rate=0.3"};
}

class Serving : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_serve_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    generate(root_ / "train", 2000, 5, 300);
    generate(root_ / "test", 300, 9, 600);  // a larger vocabulary: keys the model never saw
    config_path_ = (root_ / "config.yaml").string();
    std::ifstream in(std::string(GPUBOX_SOURCE_DIR) + "/configs/config_gpubox.yaml");
    std::ofstream(config_path_) << in.rdbuf();
    auto cfg = load_trainer_config(config_path_, config_overrides(root_));
    throw_if_error(cfg.status());
    config_ = new trainer::TrainerConfig(cfg.value());
    {
      Trainer trainer(*config_, env());
      trainer.train_pass(data_files((root_ / "train").string()));
      trainer.save((root_ / "save").string());
    }
    // What gpubox_train --mode infer computes: a fresh trainer, the save loaded, evaluated.
    Trainer infer(*config_, env());
    infer.load((root_ / "save").string());
    infer_ = new std::vector<float>(infer.evaluate(test_files(), true).predictions);
    auto summary = export_serving_model(*config_, (root_ / "save").string(),
                                        (root_ / "export").string(), ExportOptions{});
    throw_if_error(summary.status());
    auto model = ServingModel::load((root_ / "export").string());
    throw_if_error(model.status());
    model_ = new ServingModel(std::move(model).value());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete infer_;
    delete config_;
    fs::remove_all(root_);
  }
  static void generate(const fs::path& dir, uint64_t lines, uint64_t seed, uint64_t vocab) {
    dataset::GeneratorOptions gen;
    gen.out_dir = dir.string();
    gen.lines = lines;
    gen.files = 1;
    gen.seed = seed;
    gen.slots = 6;
    gen.dense = 3;
    gen.vocab = vocab;
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static TrainerEnv env() {
    TrainerEnv e;
    e.selected_cards = "0";
    e.threads_per_card = 1;
    return e;
  }
  static std::vector<std::string> test_files() { return data_files((root_ / "test").string()); }
  // `cfg` trained one pass on the suite's training data and saved to `save` (removed first, with
  // `exported`, the folder its export is to go to): what --mode infer predicts of the test files
  // from that save.
  static std::vector<float> train_save_and_infer(const trainer::TrainerConfig& cfg,
                                                 const fs::path& save, const fs::path& exported) {
    fs::remove_all(save);
    fs::remove_all(exported);
    {
      Trainer trainer(cfg, env());
      trainer.train_pass(data_files((root_ / "train").string()));
      trainer.save(save.string());
    }
    Trainer infer(cfg, env());
    infer.load(save.string());
    return infer.evaluate(test_files(), true).predictions;
  }
  static std::vector<std::string> test_lines() {
    std::vector<std::string> lines;
    for (const auto& file : test_files()) {
      std::ifstream in(file);
      for (std::string line; std::getline(in, line);) {
        if (!line.empty()) lines.push_back(line);
      }
    }
    return lines;
  }
  static ServerOptions options() {
    ServerOptions o;
    o.threads = 2;
    o.card_threads = 1;
    o.batcher.max_wait = std::chrono::microseconds(200);
    return o;
  }
  // The pull records of the save, read by the host tier's own loader.
  static std::map<uint64_t, std::vector<float>> saved_records() {
    auto table = table::SparseTable::open(config_->sparse, table::HostTableConfig{});
    throw_if_error(table.status());
    throw_if_error((*table)->load((root_ / "save" / "sparse").string()));
    std::map<uint64_t, std::vector<float>> out;
    const table::RowLayout& layout = (*table)->layout();
    throw_if_error((*table)->for_each_row([&](uint64_t key, const float* row) {
      std::vector<float> record(static_cast<std::size_t>(layout.pull_dim()));
      table::fill_pull_record(row, layout, record.data());
      out[key] = record;
    }));
    return out;
  }

  inline static fs::path root_;
  inline static std::string config_path_;
  inline static trainer::TrainerConfig* config_ = nullptr;
  inline static std::vector<float>* infer_ = nullptr;
  inline static ServingModel* model_ = nullptr;
};

inline std::vector<float> parse_predictions(const std::string& body) {
  std::vector<float> out;
  const auto open = body.find('[');
  const auto close = body.find(']');
  if (open == std::string::npos || close == std::string::npos) return out;
  std::istringstream in(body.substr(open + 1, close - open - 1));
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stof(item));
  return out;
}

// Predictions of the served `model` for `lines`, sent as slot text in requests of `per_request`
// lines, one after another on one connection (so each request is one batch of its own when
// `per_request` is at most options.batcher.max_batch_instances, or runs alone when it is more).
inline std::vector<float> served_predictions(const ServingModel& model,
                                             const ServerOptions& options,
                                             const std::vector<std::string>& lines,
                                             std::size_t per_request = 64) {
  PredictionServer server(model, options);
  EXPECT_TRUE(server.start().ok());
  serving::testing::HttpClient client(server.port());
  std::vector<float> got;
  for (std::size_t begin = 0; begin < lines.size(); begin += per_request) {
    std::string body;
    for (std::size_t i = begin; i < std::min(lines.size(), begin + per_request); ++i) {
      body += lines[i] + "\n";
    }
    const serving::testing::HttpReply reply =
        client.send(boost::beast::http::verb::post, "/predict", body, "text/plain");
    EXPECT_EQ(reply.status, 200) << reply.body << reply.error;
    const auto preds = parse_predictions(reply.body);
    got.insert(got.end(), preds.begin(), preds.end());
  }
  return got;
}

}  // namespace gpubox::serving::serve_test
