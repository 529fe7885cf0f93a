// Export for serving and gpubox_serve end to end, on a model trained here (generated data, the
// in-process host tier, one simulated card):
//  - the export holds every row's pull record and the dense parameters, bit for bit against the
//    save read by the host tier itself; float16 and the show threshold against the same oracle;
//  - a truncated or altered export, a missing MANIFEST and a delta save are refused, naming why;
//  - the server's predictions equal `--mode infer`'s (Trainer::evaluate) on the same model and
//    instances, sent as slot text and as JSON, keys unseen in training included;
//  - so do they for every model kind (wide_deep, deepfm, dcn_v2 stacked and parallel, ...): the
//  export names the model and
//    its settings, and the server builds the same dense net;
//  - concurrent requests are micro-batched and each gets its own predictions;
//  - /health, /metrics counters, every 4xx, connections past the limit, and a graceful stop;
//  - the binaries: gpubox_train --mode export, then gpubox_serve stopped by SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/half.hpp"
#include "dataset/generator.hpp"
#include "dataset/line_parser.hpp"
#include "serving/http_server.hpp"
#include "serving/serving_model.hpp"
#include "table/dense_table.hpp"
#include "table/sparse_table.hpp"
#include "tests/serving/http_client.hpp"
#include "tests/table/manifest_edit.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

#if !defined(GPUBOX_TRAIN_BIN) || !defined(GPUBOX_SERVE_BIN)
#error "GPUBOX_TRAIN_BIN and GPUBOX_SERVE_BIN must name the binaries"
#endif

namespace gpubox::serving {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using testing::HttpClient;
using testing::HttpReply;
using trainer::data_files;
using trainer::load_trainer_config;
using trainer::Trainer;
using trainer::TrainerEnv;

std::vector<std::string> config_overrides(const fs::path& root) {
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

  static fs::path root_;
  static std::string config_path_;
  static trainer::TrainerConfig* config_;
  static std::vector<float>* infer_;
  static ServingModel* model_;
};
fs::path Serving::root_;
std::string Serving::config_path_;
trainer::TrainerConfig* Serving::config_ = nullptr;
std::vector<float>* Serving::infer_ = nullptr;
ServingModel* Serving::model_ = nullptr;

std::vector<float> parse_predictions(const std::string& body) {
  std::vector<float> out;
  const auto open = body.find('[');
  const auto close = body.find(']');
  if (open == std::string::npos || close == std::string::npos) return out;
  std::istringstream in(body.substr(open + 1, close - open - 1));
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stof(item));
  return out;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(Serving, ExportHoldsEveryRowsPullRecordAndTheDenseParameters) {
  const auto want = saved_records();
  ASSERT_GT(want.size(), 100u);
  EXPECT_EQ(model_->rows(), want.size());
  for (const auto& [key, record] : want) {
    const float* got = model_->find(key);
    ASSERT_NE(got, nullptr) << key;
    EXPECT_EQ(std::vector<float>(got, got + record.size()), record) << key;
  }
  table::DenseTable dense;
  throw_if_error(dense.load((root_ / "save" / "dense").string()));
  EXPECT_EQ(model_->dense_values(), dense.get("dense")->values);
  // No optimizer state: the files hold keys, pull records and the dense values only.
  const ServingSpec& spec = model_->spec();
  EXPECT_EQ(spec.pull_dim(), 3 + config_->mf_dim());
  EXPECT_EQ(fs::file_size(root_ / "export" / "sparse-00000"),
            want.size() * (8 + 4 * static_cast<std::size_t>(spec.pull_dim())));
  EXPECT_EQ(fs::file_size(root_ / "export" / "dense"), model_->dense_values().size() * 4);
  EXPECT_EQ(spec.slot_names, config_->sparse_slot_names());
  EXPECT_EQ(spec.model.fc_sizes, (std::vector<int>{16, 8}));
  // A key the export does not hold reads as the accessor's initial record: seeded embed_w.
  std::vector<float> initial(static_cast<std::size_t>(spec.pull_dim()));
  model_->initial_record(123456789, initial.data());
  EXPECT_NE(initial[2], 0.0f);
  EXPECT_LE(std::fabs(initial[2]), 0.05f);
  EXPECT_EQ(initial[0], 0.0f);
  EXPECT_EQ(initial[3], 0.0f);
}

TEST_F(Serving, Float16AndTheShowThresholdKeepWhatTheySay) {
  const auto want = saved_records();
  std::vector<float> shows;
  for (const auto& [key, record] : want) shows.push_back(record[0]);
  std::sort(shows.begin(), shows.end());
  const double threshold = shows[shows.size() / 2];
  ExportOptions options;
  options.value_type = ValueType::kFloat16;
  options.show_threshold = threshold;
  options.rows_per_part = 50;  // several part files
  const fs::path out = root_ / "export_fp16";
  auto summary = export_serving_model(*config_, (root_ / "save").string(), out.string(), options);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  auto model = ServingModel::load(out.string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::size_t kept = 0;
  for (const auto& [key, record] : want) {
    const float* got = model->find(key);
    if (record[0] < threshold) {
      EXPECT_EQ(got, nullptr) << key;
      continue;
    }
    ++kept;
    ASSERT_NE(got, nullptr) << key;
    for (std::size_t f = 0; f < record.size(); ++f) {
      EXPECT_EQ(got[f], half_to_float(float_to_half(record[f]))) << key << " field " << f;
    }
  }
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, want.size());
  EXPECT_EQ(model->rows(), kept);
  EXPECT_EQ(summary->rows_exported, kept);
  EXPECT_EQ(summary->rows_in_save, want.size());
  EXPECT_EQ(summary->parts, (kept + 49) / 50);
  EXPECT_EQ(model->spec().value_type, ValueType::kFloat16);
}

TEST_F(Serving, CorruptExportsAndDeltaSavesAreRefusedNamingWhy) {
  auto copy = [&](const std::string& name) {
    const fs::path dir = root_ / name;
    fs::remove_all(dir);
    fs::copy(root_ / "export", dir);
    return dir;
  };
  const fs::path truncated = copy("truncated");
  fs::resize_file(truncated / "sparse-00000", fs::file_size(truncated / "sparse-00000") - 3);
  auto got = ServingModel::load(truncated.string());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("sparse-00000"), std::string::npos)
      << got.status().to_string();

  const fs::path altered = copy("altered");
  {
    std::fstream f(altered / "dense", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  got = ServingModel::load(altered.string());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("dense"), std::string::npos) << got.status().to_string();

  const fs::path no_manifest = copy("no_manifest");
  fs::remove(no_manifest / "MANIFEST");
  EXPECT_FALSE(ServingModel::load(no_manifest.string()).ok());
  EXPECT_FALSE(ServingModel::load((root_ / "save").string()).ok());  // a save is not an export

  // A delta save holds only the rows changed since the previous save: not a whole model.
  auto delta_config = load_trainer_config(config_path_, [&] {
    auto o = config_overrides(root_);
    o.push_back("runner.save_mode=delta");
    return o;
  }());
  ASSERT_TRUE(delta_config.ok());
  {
    Trainer trainer(delta_config.value(), env());
    // The first save of a run is a base: the second is the delta.
    trainer.train_pass(data_files((root_ / "train").string()));
    trainer.save((root_ / "delta_base").string());
    trainer.train_pass(data_files((root_ / "train").string()));
    trainer.save((root_ / "delta_save").string());
  }
  const auto refused = export_serving_model(delta_config.value(), (root_ / "delta_save").string(),
                                            (root_ / "delta_export").string(), ExportOptions{});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("delta"), std::string::npos);
  EXPECT_FALSE(fs::exists(root_ / "delta_export"));

  // Only a complete save: without its model manifest (a save cut short) it is refused by name.
  const fs::path cut_short = root_ / "cut_short_save";
  fs::copy(root_ / "save", cut_short, fs::copy_options::recursive);
  fs::remove(cut_short / "MODEL_MANIFEST");
  const auto incomplete =
      export_serving_model(delta_config.value(), cut_short.string(),
                           (root_ / "cut_short_export").string(), ExportOptions{});
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.status().message().find("MODEL_MANIFEST"), std::string::npos)
      << incomplete.status().to_string();
  EXPECT_FALSE(fs::exists(root_ / "cut_short_export"));
}

// Predictions of the served `model` for `lines`, sent as slot text in requests of 64 lines.
std::vector<float> served_predictions(const ServingModel& model, const ServerOptions& options,
                                      const std::vector<std::string>& lines) {
  PredictionServer server(model, options);
  EXPECT_TRUE(server.start().ok());
  HttpClient client(server.port());
  std::vector<float> got;
  for (std::size_t begin = 0; begin < lines.size(); begin += 64) {
    std::string body;
    for (std::size_t i = begin; i < std::min(lines.size(), begin + 64); ++i)
      body += lines[i] + "\n";
    const HttpReply reply = client.send(http::verb::post, "/predict", body, "text/plain");
    EXPECT_EQ(reply.status, 200) << reply.body << reply.error;
    const auto preds = parse_predictions(reply.body);
    got.insert(got.end(), preds.begin(), preds.end());
  }
  return got;
}

// The server's predictions are --mode infer's, for slot text and JSON bodies alike.
TEST_F(Serving, PredictionsEqualInferOnTheSameModelAndInstances) {
  const std::vector<std::string> lines = test_lines();
  ASSERT_EQ(lines.size(), infer_->size());
  const std::vector<float> got = served_predictions(*model_, options(), lines);
  ASSERT_EQ(got.size(), infer_->size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - (*infer_)[i]));
  }
  // Printed at %.9g, the server's floats are exact; the GEMMs' summation order may differ with
  // the batch composition, by float rounding.
  EXPECT_LT(worst, 1e-6) << "largest difference from --mode infer";
  char worst_text[32];
  std::snprintf(worst_text, sizeof(worst_text), "%.3g", worst);
  RecordProperty("max_abs_difference_from_infer", worst_text);

  // JSON of the same instances (the dataset's parse of the lines, written out as keys).
  dataset::DatasetConfig text;
  text.data_format = dataset::DataFormat::kSlot;
  text.slots = config_->sparse_slot_names();
  text.dense_dim = 3;
  dataset::LineParser parser(text);
  dataset::InstanceBlock block(static_cast<int>(text.slots.size()), 3);
  for (std::size_t i = 0; i < 40; ++i) ASSERT_TRUE(parser.parse(lines[i], &block).ok());
  std::string json = "{\"instances\": [";
  for (std::size_t i = 0; i < block.size(); ++i) {
    const dataset::InstanceRef ref = block.instance(i);
    json += i ? ", {\"slots\": {" : "{\"slots\": {";
    const uint64_t* key = ref.keys;
    for (int s = 0; s < ref.num_slots; ++s) {
      json += (s ? ", \"" : "\"") + text.slots[static_cast<std::size_t>(s)] + "\": [";
      for (uint32_t k = 0; k < ref.slot_sizes[s]; ++k) {
        json += (k ? ", \"" : "\"") + std::to_string(*key++) + "\"";
      }
      json += "]";
    }
    json += "}, \"dense\": [";
    for (int d = 0; d < 3; ++d) json += (d ? ", " : "") + std::to_string(ref.dense[d]);
    json += "]}";
  }
  json += "]}";
  PredictionServer server(*model_, options());
  ASSERT_TRUE(server.start().ok());
  HttpClient client(server.port());
  const HttpReply reply = client.send(http::verb::post, "/predict", json, "application/json");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const auto preds = parse_predictions(reply.body);
  ASSERT_EQ(preds.size(), 40u);
  // std::to_string prints 6 decimals of the dense values: compare with that rounding's effect.
  for (std::size_t i = 0; i < preds.size(); ++i) EXPECT_NEAR(preds[i], (*infer_)[i], 1e-4) << i;
}

TEST_F(Serving, EveryModelKindServesWhatInferPredicts) {
  for (const std::vector<std::string>& model : std::vector<std::vector<std::string>>{
           {"hyper_parameters.model=wide_deep"},
           {"hyper_parameters.model=deepfm"},
           {"hyper_parameters.model=fm"},
           // SGD (PaddleRec dlrm's optimizer): a save with no dense optimizer moments.
           {"hyper_parameters.model=dlrm", "hyper_parameters.optimizer.class=SGD",
            "hyper_parameters.bot_layer_sizes=[8, 5]"},
           {"hyper_parameters.model=dlrm", "hyper_parameters.bot_layer_sizes=[5]",
            "hyper_parameters.use_cvm=true"},
           // Batch norm: export, load and serve its running statistics (the manifest names it).
           {"hyper_parameters.model=dlrm", "hyper_parameters.bot_layer_sizes=[8, 5]",
            "hyper_parameters.dnn_batch_norm=true"},
           {"hyper_parameters.model=dnn", "hyper_parameters.dnn_batch_norm=true"},
           {"hyper_parameters.model=wide_deep", "hyper_parameters.slot_dims={1: 8, 2: 2}"},
           {"hyper_parameters.model=dcn_v2", "hyper_parameters.cross_layers=2"},
           {"hyper_parameters.model=dcn_v2", "hyper_parameters.cross_rank=3",
            "hyper_parameters.dcn_structure=parallel"},
           {"hyper_parameters.model=dcn_v2", "hyper_parameters.cross_rank=2",
            "hyper_parameters.cross_mixture=true", "hyper_parameters.cross_experts=3"},
           {"hyper_parameters.model=dcn", "hyper_parameters.cross_layers=2"},
           {"hyper_parameters.model=xdeepfm", "hyper_parameters.layer_sizes_cin=[6, 3]"},
           {"hyper_parameters.model=xdeepfm", "hyper_parameters.layer_sizes_dnn=[8]",
            "hyper_parameters.use_cvm=true"},
           // ffm: rows of one factor per field (the slots and the dense features).
           {"hyper_parameters.model=ffm", "hyper_parameters.sparse_feature_dim=4"},
           {"hyper_parameters.model=ffm", "hyper_parameters.use_cvm=true"},
           {"hyper_parameters.model=deepfefm", "hyper_parameters.fc_sizes=[8]"},
           {"hyper_parameters.model=deepfefm", "hyper_parameters.use_cvm=true"},
           // fat_deepffm: ffm's rows, CEN and the DNN (layer_sizes_dnn) over the pairs.
           {"hyper_parameters.model=fat_deepffm", "hyper_parameters.layer_sizes_dnn=[8]"},
           {"hyper_parameters.model=fat_deepffm", "hyper_parameters.use_cvm=true"},
           // autoint: without a DNN (PaddleRec's config.yaml), and with one, cvm and no wide part.
           {"hyper_parameters.model=autoint", "hyper_parameters.attn_layer_sizes=[4, 6]",
            "hyper_parameters.fc_sizes=[]"},
           {"hyper_parameters.model=autoint", "hyper_parameters.attn_layer_sizes=[4]",
            "hyper_parameters.head_num=1", "hyper_parameters.use_residual=false",
            "hyper_parameters.scaling=false", "hyper_parameters.use_wide=false",
            "hyper_parameters.fc_sizes=[8]", "hyper_parameters.use_cvm=true"},
           // flen: its groups' bi-interaction beside the dnn, with and without cvm.
           {"hyper_parameters.model=flen", "hyper_parameters.field_group_sizes=[2, 1, 3]",
            "hyper_parameters.fc_sizes=[8, 4]"},
           {"hyper_parameters.model=flen", "hyper_parameters.field_group_sizes=[3, 3]",
            "hyper_parameters.sparse_num_field=2", "hyper_parameters.use_cvm=true"}}) {
    SCOPED_TRACE(model.back());
    std::vector<std::string> overrides = config_overrides(root_);
    overrides.insert(overrides.end(), model.begin(), model.end());
    auto cfg = load_trainer_config(config_path_, overrides);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    const fs::path save = root_ / "save_kind";
    const fs::path exported = root_ / "export_kind";
    fs::remove_all(save);
    fs::remove_all(exported);
    {
      Trainer trainer(*cfg, env());
      trainer.train_pass(data_files((root_ / "train").string()));
      trainer.save(save.string());
    }
    Trainer infer(*cfg, env());
    infer.load(save.string());
    const std::vector<float> want = infer.evaluate(test_files(), true).predictions;
    if (cfg->hyper.dnn_batch_norm) {  // the save's setting, not the config's, is the model's
      overrides.push_back("hyper_parameters.dnn_batch_norm=false");
      auto plain = load_trainer_config(config_path_, overrides);
      ASSERT_TRUE(plain.ok()) << plain.status().to_string();
      const auto refused =
          export_serving_model(*plain, save.string(), exported.string(), ExportOptions{});
      ASSERT_FALSE(refused.ok()) << "exported a batch-norm save as a model without it";
      EXPECT_NE(refused.status().message().find("hyper_parameters.dnn_batch_norm=true"),
                std::string::npos)
          << refused.status().to_string();
      EXPECT_FALSE(fs::exists(exported));
    }
    ASSERT_TRUE(export_serving_model(*cfg, save.string(), exported.string(), ExportOptions{}).ok());
    auto served = ServingModel::load(exported.string());
    ASSERT_TRUE(served.ok()) << served.status().to_string();
    EXPECT_EQ(served->spec().model.kind, cfg->hyper.model);
    EXPECT_EQ(served->spec().model.slot_dims, cfg->dense_model_config().slot_dims);
    if (cfg->hyper.model == trainer::ModelKind::kDcnV2 ||
        cfg->hyper.model == trainer::ModelKind::kDcn) {
      EXPECT_EQ(served->spec().model.cross_layers, cfg->hyper.cross_layers);
    }
    if (cfg->hyper.model == trainer::ModelKind::kDcnV2) {
      EXPECT_EQ(served->spec().model.cross_rank, cfg->hyper.cross_rank);
      EXPECT_EQ(served->spec().model.dcn_structure, cfg->hyper.dcn_structure);
      EXPECT_EQ(served->spec().model.cross_experts, cfg->dense_model_config().cross_experts);
    }
    if (cfg->hyper.model == trainer::ModelKind::kDlrm) {
      EXPECT_EQ(served->spec().model.bot_layer_sizes, cfg->hyper.bot_layer_sizes);
    }
    if (cfg->hyper.model == trainer::ModelKind::kXdeepfm) {
      EXPECT_EQ(served->spec().model.cin_layer_sizes, cfg->hyper.layer_sizes_cin);
      EXPECT_EQ(served->spec().model.fc_sizes, cfg->hyper.fc_sizes);
    }
    EXPECT_EQ(served->spec().model.mf_dim, cfg->dense_model_config().mf_dim);
    if (cfg->hyper.model == trainer::ModelKind::kAutoint) {
      const trainer::DenseModelConfig& want_model = cfg->dense_model_config();
      EXPECT_EQ(served->spec().model.attn_layer_sizes, want_model.attn_layer_sizes);
      EXPECT_EQ(served->spec().model.attn_heads, want_model.attn_heads);
      EXPECT_EQ(served->spec().model.attn_residual, want_model.attn_residual);
      EXPECT_EQ(served->spec().model.attn_scaling, want_model.attn_scaling);
      EXPECT_EQ(served->spec().model.attn_use_wide, want_model.attn_use_wide);
      EXPECT_EQ(served->spec().model.fc_sizes, want_model.fc_sizes);
    }
    const std::vector<float> got = served_predictions(*served, options(), test_lines());
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_LT(worst, 1e-6) << "largest difference from --mode infer";
    if (!cfg->dense_model_config().slot_dims.empty()) {
      // Widths read strictly: a trailing comma (an empty item, skipped before) is refused
      // naming the file and the item.
      std::string widths;
      for (const int dim : cfg->dense_model_config().slot_dims) widths += std::to_string(dim) + ",";
      ASSERT_TRUE(gpubox::testing::set_manifest_property((exported / "MANIFEST").string(),
                                                         "slot_dims", widths));
      const auto refused = ServingModel::load(exported.string());
      ASSERT_FALSE(refused.ok());
      EXPECT_NE(
          refused.status().to_string().find("MANIFEST: slot_dims item " +
                                            std::to_string(served->spec().model.slots + 1) + " ''"),
          std::string::npos)
          << refused.status().to_string();
    }
  }
}

TEST_F(Serving, ConcurrentRequestsAreMicroBatched) {
  ServerOptions o = options();
  o.batcher.max_wait = std::chrono::milliseconds(300);
  o.batcher.max_batch_instances = 64;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  const std::vector<std::string> lines = test_lines();
  constexpr int kClients = 8;
  std::vector<std::vector<float>> got(kClients);
  std::atomic<int> ready{0};  // every client connected before any sends
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      HttpClient client(server.port());
      client.connect();
      ready.fetch_add(1);
      while (ready.load() < kClients) std::this_thread::yield();
      const std::string body = lines[static_cast<std::size_t>(c) * 2] + "\n" +
                               lines[static_cast<std::size_t>(c) * 2 + 1] + "\n";
      const HttpReply reply = client.send(http::verb::post, "/predict", body, "text/plain");
      if (reply.status == 200) got[static_cast<std::size_t>(c)] = parse_predictions(reply.body);
    });
  }
  for (auto& t : clients) t.join();
  for (int c = 0; c < kClients; ++c) {
    ASSERT_EQ(got[static_cast<std::size_t>(c)].size(), 2u) << c;
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(got[static_cast<std::size_t>(c)][i],
                  (*infer_)[static_cast<std::size_t>(c) * 2 + i], 1e-6);
    }
  }
  // 8 requests inside one 300 ms window: fewer batches than requests.
  EXPECT_LT(server.metrics().batches(), static_cast<uint64_t>(kClients));
  const std::string metrics = server.metrics().render_prometheus();
  EXPECT_NE(metrics.find("gpubox_serve_batched_requests_total 8\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpubox_serve_instances_total 16\n"), std::string::npos) << metrics;
}

TEST_F(Serving, HealthMetricsAndClearErrors) {
  ServerOptions o = options();
  o.max_body_bytes = 4096;
  o.max_instances = 3;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  HttpClient client(server.port());
  HttpReply r = client.send(http::verb::get, "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"status\": \"ok\""), std::string::npos);
  EXPECT_NE(r.body.find("\"rows\": " + std::to_string(model_->rows())), std::string::npos);

  const std::string line = test_lines()[0];
  r = client.send(http::verb::post, "/predict", line, "text/plain");
  EXPECT_EQ(r.status, 200) << r.body;
  r = client.send(http::verb::post, "/predict", "{\"instances\": [", "application/json");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("invalid JSON"), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict", R"({"slots": {"42": [1]}, "dense": [0, 0, 0]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown slot \\\"42\\\""), std::string::npos) << r.body;
  // A dense value past float's range, and a repeated key: 400 naming them, not a prediction.
  r = client.send(http::verb::post, "/predict", R"({"slots": {}, "dense": [0, 3.5e38, 0]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("dense value 1 (3.5e+38)"), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict",
                  R"({"slots": {}, "dense": [0, 0, 0], "dense": [1, 1, 1]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("duplicate JSON key \\\"dense\\\""), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict", "click:1 7:5", "text/plain");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("line 1: unknown slot in '7:5'"), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict",
                  line + "\n" + line + "\n" + line + "\n" + line + "\n", "text/plain");
  EXPECT_EQ(r.status, 413) << r.body;
  r = client.send(http::verb::get, "/predict");
  EXPECT_EQ(r.status, 405);
  r = client.send(http::verb::get, "/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(r.keep_alive);  // a clean 4xx keeps the connection
  r = client.send(http::verb::post, "/predict", std::string(5000, ' '), "text/plain");
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("over --max_body_kb"), std::string::npos) << r.body;
  HttpClient raw(server.port());
  r = raw.send_raw("GARBAGE / HTTP/9\r\n\r\n");
  EXPECT_EQ(r.status, 400) << r.error;

  HttpClient scraper(server.port());
  r = scraper.send(http::verb::get, "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.content_type.find("text/plain; version=0.0.4"), std::string::npos);
  for (const char* line_want :
       {"gpubox_serve_requests_total{path=\"/predict\",code=\"200\"} 1\n",
        "gpubox_serve_requests_total{path=\"/predict\",code=\"400\"} 5\n",
        "gpubox_serve_requests_total{path=\"/predict\",code=\"413\"} 2\n",
        "gpubox_serve_requests_total{path=\"/predict\",code=\"405\"} 1\n",
        "gpubox_serve_requests_total{path=\"other\",code=\"404\"} 1\n",
        "gpubox_serve_requests_total{path=\"other\",code=\"400\"} 1\n",
        "gpubox_serve_requests_total{path=\"/health\",code=\"200\"} 1\n",
        "gpubox_serve_errors_total 10\n", "gpubox_serve_predict_seconds_count 9\n",
        "gpubox_serve_predict_seconds_bucket{le=\"+Inf\"} 9\n", "gpubox_serve_instances_total 1\n",
        "gpubox_serve_model_rows "}) {
    EXPECT_NE(r.body.find(line_want), std::string::npos) << line_want << " in\n" << r.body;
  }
}

TEST_F(Serving, ConnectionsPastTheLimitAreRefused) {
  ServerOptions o = options();
  o.max_connections = 2;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  HttpClient a(server.port()), b(server.port()), c(server.port());
  EXPECT_EQ(a.send(http::verb::get, "/health").status, 200);
  EXPECT_EQ(b.send(http::verb::get, "/health").status, 200);
  const HttpReply refused = c.send(http::verb::get, "/health");
  EXPECT_EQ(refused.status, 503) << refused.error;
  EXPECT_NE(refused.body.find("too many connections"), std::string::npos);
  EXPECT_NE(server.metrics().render_prometheus().find("gpubox_serve_connections_refused_total 1\n"),
            std::string::npos);
  // A connection that closes frees its place.
  a.socket().close();
  for (int i = 0; i < 100 && server.metrics().connections_open() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  HttpClient d(server.port());
  EXPECT_EQ(d.send(http::verb::get, "/health").status, 200);
}

// request_stop() (what SIGTERM does): the request in flight is answered, then nothing listens.
TEST_F(Serving, StopAnswersTheRequestInFlightThenStopsListening) {
  ServerOptions o = options();
  o.batcher.max_wait = std::chrono::milliseconds(400);
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  const uint16_t port = server.port();
  HttpClient idle(port);
  ASSERT_EQ(idle.send(http::verb::get, "/health").status, 200);  // an idle keep-alive connection
  HttpReply in_flight;
  std::thread client([&] {
    HttpClient c(port);
    in_flight = c.send(http::verb::post, "/predict", test_lines()[0], "text/plain");
  });
  for (int i = 0; i < 200 && server.metrics().connections_open() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the request is in the batcher
  server.request_stop();
  server.wait();
  client.join();
  EXPECT_EQ(in_flight.status, 200) << in_flight.error;
  EXPECT_FALSE(in_flight.keep_alive);
  EXPECT_NEAR(parse_predictions(in_flight.body).at(0), (*infer_)[0], 1e-6);
  EXPECT_EQ(idle.send(http::verb::get, "/health").status, 0);  // closed
  HttpClient late(port);
  EXPECT_FALSE(late.connect());
}

// A child process; its stdout is read through a pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out >= 0) ::close(out);
  }
  // Reads stdout until `marker` appears (true) or `seconds` pass / the child exits (false).
  bool read_until(const std::string& marker, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (text.find(marker) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[512];
      const ssize_t k = ::read(out, buf, sizeof(buf));
      if (k <= 0) return text.find(marker) != std::string::npos;
      text.append(buf, static_cast<std::size_t>(k));
    }
    return true;
  }
};

Child spawn(const std::vector<std::string>& args, const fs::path& log) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  Child child;
  child.pid = ::fork();
  if (child.pid == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    ::close(pipe_fds[0]);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  child.out = pipe_fds[0];
  return child;
}

TEST_F(Serving, BinariesExportThenServeUntilSigterm) {
  const fs::path out = root_ / "export_by_binary";
  std::vector<std::string> train = {
      GPUBOX_TRAIN_BIN,          "--config", config_path_, "--mode", "export", "--load",
      (root_ / "save").string(), "--out",    out.string()};
  for (const auto& o : config_overrides(root_)) {
    train.push_back("-o");
    train.push_back(o);
  }
  {
    Child exporter = spawn(train, root_ / "export.log");
    ASSERT_TRUE(exporter.read_until("export: ", 60)) << read_text(root_ / "export.log");
    int status = 0;
    ASSERT_EQ(::waitpid(exporter.pid, &status, 0), exporter.pid);
    exporter.pid = -1;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_text(root_ / "export.log");
  }
  Child serve =
      spawn({GPUBOX_SERVE_BIN, "--model", out.string(), "--port", "0", "--card_threads", "1"},
            root_ / "serve.log");
  ASSERT_TRUE(serve.read_until("\n", 60)) << read_text(root_ / "serve.log");
  const auto at = serve.text.find("listening on 127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << serve.text << read_text(root_ / "serve.log");
  const uint16_t port = static_cast<uint16_t>(std::stoi(serve.text.substr(at + 23)));
  HttpClient client(port);
  EXPECT_EQ(client.send(http::verb::get, "/health").status, 200);
  const HttpReply reply = client.send(http::verb::post, "/predict", test_lines()[3], "text/plain");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NEAR(parse_predictions(reply.body).at(0), (*infer_)[3], 1e-6);
  ASSERT_EQ(::kill(serve.pid, SIGTERM), 0);
  EXPECT_TRUE(serve.read_until("gpubox_serve: stopped", 20)) << serve.text;
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = ::waitpid(serve.pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(done, serve.pid) << "gpubox_serve did not exit within 10 s of SIGTERM";
  serve.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace gpubox::serving
