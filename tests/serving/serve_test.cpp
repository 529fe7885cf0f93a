// Export for serving and gpubox_serve end to end, on a model trained here (generated data, the
// in-process host tier, one simulated card):
//  - the export holds every row's pull record and the dense parameters, bit for bit against the
//    save read by the host tier itself; float16 and the show threshold against the same oracle;
//  - a truncated or altered export, a missing MANIFEST and a delta save are refused, naming why;
//  - the server's predictions equal `--mode infer`'s (Trainer::evaluate) on the same model and
//    instances, sent as slot text and as JSON, keys unseen in training included;
//  - so do they for every model kind (wide_deep, deepfm, dcn_v2 stacked and parallel, ...): the
//    export names the model and its settings, and the server builds the same dense net.
// The HTTP server's behaviour and the binaries: serve_http_test.cpp (the same binary and fixture,
// serve_test_fixture.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "common/half.hpp"
#include "dataset/line_parser.hpp"
#include "serving/http_server.hpp"
#include "serving/request_parser.hpp"
#include "serving/serving_model.hpp"
#include "table/dense_table.hpp"
#include "table/sparse_table.hpp"
#include "tests/serving/http_client.hpp"
#include "tests/serving/serve_test_fixture.hpp"
#include "tests/table/manifest_edit.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::serving {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using serve_test::config_overrides;
using serve_test::parse_predictions;
using serve_test::served_predictions;
using serve_test::Serving;
using testing::HttpClient;
using testing::HttpReply;
using trainer::data_files;
using trainer::load_trainer_config;
using trainer::Trainer;

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
    // The counts (show, click) float32: past float16's 65504 they read back inf.
    EXPECT_EQ(got[0], record[0]) << key;
    EXPECT_EQ(got[1], record[1]) << key;
    for (std::size_t f = 2; f < record.size(); ++f) {
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
  EXPECT_EQ(model->spec().float32_counts, 2);
}

// An export made before counts_type held float16 counts: it still loads, but a value that is not
// finite (a popular key's show past 65504: a use_cvm model then served one prediction for every
// input) is refused naming the file and the key.
TEST_F(Serving, AnOlderFloat16ExportLoadsAndItsInfiniteCountsAreRefused) {
  ExportOptions options;
  options.value_type = ValueType::kFloat16;
  const fs::path out = root_ / "export_fp16_old";
  ASSERT_TRUE(
      export_serving_model(*config_, (root_ / "save").string(), out.string(), options).ok());
  const auto want = saved_records();
  const auto rewrite = [&](bool infinite) {
    std::string part;
    bool first = true;
    for (const auto& [key, record] : want) {
      part.append(reinterpret_cast<const char*>(&key), sizeof(key));
      for (std::size_t f = 0; f < record.size(); ++f) {
        const uint16_t half = first && infinite && f == 0 ? 0x7c00 : float_to_half(record[f]);
        part.append(reinterpret_cast<const char*>(&half), sizeof(half));
      }
      first = false;
    }
    const std::string manifest_path = (out / "MANIFEST").string();
    std::stringstream text;
    text << std::ifstream(manifest_path).rdbuf();
    auto manifest = table::io::Manifest::parse(text.str(), manifest_path);
    throw_if_error(manifest.status());
    manifest->properties.erase("counts_type");
    for (table::io::ManifestFile& file : manifest->files) {
      if (file.name != "sparse-00000") continue;
      file.bytes = part.size();
      file.xxh64 = table::io::checksum(part.data(), part.size());
    }
    std::ofstream(out / "sparse-00000", std::ios::trunc | std::ios::binary) << part;
    std::ofstream(manifest_path, std::ios::trunc) << manifest->encode();
  };
  rewrite(false);
  auto model = ServingModel::load(out.string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->spec().float32_counts, 0);
  const auto& [key, record] = *want.begin();
  ASSERT_NE(model->find(key), nullptr);
  EXPECT_EQ(model->find(key)[0], half_to_float(float_to_half(record[0])));
  rewrite(true);
  auto refused = ServingModel::load(out.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("sparse-00000: key " + std::to_string(key) +
                                            "'s value 0 is inf (not finite)"),
            std::string::npos)
      << refused.status().message();
}

// An export whose --out is a pass's model save (or any folder that is not an export) is refused,
// the folder kept, and the message says which it is.
TEST_F(Serving, AnExportOverAModelSaveOrAnotherFolderIsRefusedSayingWhichItIs) {
  const fs::path model_save = root_ / "model_save_as_out";
  fs::create_directories(model_save);
  std::ofstream(model_save / "MODEL_MANIFEST") << "kept";
  auto over_save = export_serving_model(*config_, (root_ / "save").string(), model_save.string(),
                                        ExportOptions{});
  ASSERT_FALSE(over_save.ok());
  EXPECT_NE(over_save.status().message().find("holds a model save (its MODEL_MANIFEST)"),
            std::string::npos)
      << over_save.status().to_string();
  EXPECT_TRUE(fs::exists(model_save / "MODEL_MANIFEST"));
  const fs::path other = root_ / "other_as_out";
  fs::create_directories(other);
  std::ofstream(other / "notes.txt") << "kept";
  auto over_other =
      export_serving_model(*config_, (root_ / "save").string(), other.string(), ExportOptions{});
  ASSERT_FALSE(over_other.ok());
  EXPECT_NE(over_other.status().message().find("exists and is not a gpubox save"),
            std::string::npos)
      << over_other.status().to_string();
  EXPECT_TRUE(fs::exists(other / "notes.txt"));
  // A half of a training save (its own MANIFEST, of another kind) was replaced by the export,
  // exit 0, the save unreadable after.
  for (const char* half : {"dense", "sparse"}) {
    const fs::path in_save = root_ / "save" / half;
    const auto before = fs::last_write_time(in_save / "MANIFEST");
    auto over_half = export_serving_model(*config_, (root_ / "save").string(), in_save.string(),
                                          ExportOptions{});
    ASSERT_FALSE(over_half.ok()) << half;
    EXPECT_NE(over_half.status().message().find(std::string("holds a ") + half + " save"),
              std::string::npos)
        << over_half.status().to_string();
    EXPECT_EQ(fs::last_write_time(in_save / "MANIFEST"), before) << half;
  }
  // Deeper in the save (a folder its MANIFESTs do not list) too.
  const fs::path inside = root_ / "save" / "sparse" / "x";
  auto in_half =
      export_serving_model(*config_, (root_ / "save").string(), inside.string(), ExportOptions{});
  ASSERT_FALSE(in_half.ok());
  EXPECT_NE(in_half.status().message().find("is inside the training save"), std::string::npos)
      << in_half.status().to_string();
  EXPECT_FALSE(fs::exists(inside));
}

// Two exports to one --out at once removed each other's staging folder (one failed: "open folder
// <out>.tmp: No such file or directory"): they take turns, both succeed, the export loads.
TEST_F(Serving, TwoExportsToOneFolderAtOnceBothSucceed) {
  const std::string out = (root_ / "twice_at_once").string();
  for (int round = 0; round < 4; ++round) {
    Status other_status;
    std::thread other([&] {
      other_status =
          export_serving_model(*config_, (root_ / "save").string(), out, ExportOptions{}).status();
    });
    const Status mine =
        export_serving_model(*config_, (root_ / "save").string(), out, ExportOptions{}).status();
    other.join();
    EXPECT_TRUE(mine.ok()) << mine.to_string();
    EXPECT_TRUE(other_status.ok()) << other_status.to_string();
    auto loaded = ServingModel::load(out);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    EXPECT_EQ(loaded->rows(), model_->rows());
  }
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
  // A training save is not an export: said so, with the command that makes one.
  const auto save = ServingModel::load((root_ / "save").string());
  ASSERT_FALSE(save.ok());
  EXPECT_NE(save.status().message().find("it is a training save (MODEL_MANIFEST), not an export: "
                                         "make one with gpubox_train --config <its config> "
                                         "--mode export --load " +
                                         (root_ / "save").string()),
            std::string::npos)
      << save.status().to_string();

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
    // A delta after a shrink records it for its loader to replay (mode delta+shrinks).
    trainer.shrink(2);
    trainer.train_pass(data_files((root_ / "train").string()));
    trainer.save((root_ / "delta_shrinks_save").string());
  }
  std::ifstream shrinks_manifest(root_ / "delta_shrinks_save" / "sparse" / "MANIFEST");
  std::stringstream shrinks_text;
  shrinks_text << shrinks_manifest.rdbuf();
  EXPECT_NE(shrinks_text.str().find("delta+shrinks"), std::string::npos) << shrinks_text.str();
  for (const char* save : {"delta_save", "delta_shrinks_save"}) {
    SCOPED_TRACE(save);
    const auto refused = export_serving_model(delta_config.value(), (root_ / save).string(),
                                              (root_ / "delta_export").string(), ExportOptions{});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("is a delta save"), std::string::npos)
        << refused.status().to_string();
    EXPECT_FALSE(fs::exists(root_ / "delta_export"));
  }

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

// The model kinds and settings served, each as its -o overrides.
std::vector<std::vector<std::string>> every_model_kind() {
  return {{"hyper_parameters.model=wide_deep"},
          // bf16 rows with a random start: an unseen key's row starts rounded, as training's
          // (the export records sparse_storage; it was served unrounded, up to 9e-4 off).
          {"hyper_parameters.model=wide", "hyper_parameters.sparse_storage=bf16",
           "hyper_parameters.sparse_optimizer.initial_range=0.5"},
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
          // PaddleRec dlrm's two-class output (softmax's class 1 served), with its norms and
          // without.
          {"hyper_parameters.model=dlrm", "hyper_parameters.bot_layer_sizes=[8, 5]",
           "hyper_parameters.dnn_batch_norm=true", "hyper_parameters.dlrm_output=softmax2"},
          {"hyper_parameters.model=dlrm", "hyper_parameters.bot_layer_sizes=[5]",
           "hyper_parameters.dlrm_output=softmax2"},
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
          // At p > 0 its undropped bias: the export folds it into the DNN output's bias.
          {"hyper_parameters.model=fat_deepffm", "hyper_parameters.layer_sizes_dnn=[8]",
           "hyper_parameters.dnn_dropout=0.5"},
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
           "hyper_parameters.sparse_num_field=2", "hyper_parameters.use_cvm=true"}};
}

// `cfg`'s save under `save` exported by a config (`overrides` over `config_path`) whose batch norm
// or output layer is the other choice: refused, naming the save's, and nothing written to
// `exported`. The save's batch norm and output layer, not the config's, are the model's.
void expect_export_refuses_other_settings(const trainer::TrainerConfig& cfg,
                                          const std::string& config_path,
                                          const std::vector<std::string>& overrides,
                                          const fs::path& save, const fs::path& exported) {
  for (const auto& [key, saved, other] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"hyper_parameters.dnn_batch_norm", cfg.hyper.dnn_batch_norm ? "true" : "", "false"},
           {"hyper_parameters.dlrm_output",
            cfg.hyper.dlrm_output == trainer::DlrmOutput::kSoftmax2 ? "softmax2" : "", "logit"}}) {
    if (saved.empty()) continue;
    std::vector<std::string> changed = overrides;
    changed.push_back(key + "=" + other);
    auto plain = load_trainer_config(config_path, changed);
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    const auto refused =
        export_serving_model(*plain, save.string(), exported.string(), ExportOptions{});
    ASSERT_FALSE(refused.ok()) << "exported a save with " << key << "=" << saved << " as " << other;
    EXPECT_NE(refused.status().message().find(key + "=" + saved), std::string::npos)
        << refused.status().to_string();
    EXPECT_FALSE(fs::exists(exported));
  }
  // fat_deepffm's undropped bias folds into fat_deepffm's output bias only: ffm (the same rows) is
  // refused, by the network the save names (before its dense block fat_deepffm.bias would be).
  if (cfg.hyper.model != trainer::ModelKind::kFatDeepffm || cfg.hyper.dnn_dropout == 0) return;
  std::vector<std::string> as_ffm = overrides;
  for (const char* key : {"hyper_parameters.model=ffm", "hyper_parameters.layer_sizes_dnn=[]",
                          "hyper_parameters.dnn_dropout=0"}) {
    as_ffm.push_back(key);
  }
  auto ffm = load_trainer_config(config_path, as_ffm);
  ASSERT_TRUE(ffm.ok()) << ffm.status().to_string();
  const auto refused = export_serving_model(*ffm, save.string(), exported.string(), {});
  ASSERT_FALSE(refused.ok()) << "exported fat_deepffm's undropped bias as ffm";
  EXPECT_NE(refused.status().message().find("hyper_parameters.model: saved fat_deepffm, now ffm"),
            std::string::npos)
      << refused.status().to_string();
  EXPECT_FALSE(fs::exists(exported));
}

// The served model's spec names `cfg`'s network and its settings.
void expect_spec_names_the_network(const ServingModel& served, const trainer::TrainerConfig& cfg) {
  EXPECT_EQ(served.spec().model.kind, cfg.hyper.model);
  EXPECT_EQ(served.spec().model.slot_dims, cfg.dense_model_config().slot_dims);
  if (cfg.hyper.model == trainer::ModelKind::kDcnV2 ||
      cfg.hyper.model == trainer::ModelKind::kDcn) {
    EXPECT_EQ(served.spec().model.cross_layers, cfg.hyper.cross_layers);
  }
  if (cfg.hyper.model == trainer::ModelKind::kDcnV2) {
    EXPECT_EQ(served.spec().model.cross_rank, cfg.hyper.cross_rank);
    EXPECT_EQ(served.spec().model.dcn_structure, cfg.hyper.dcn_structure);
    EXPECT_EQ(served.spec().model.cross_experts, cfg.dense_model_config().cross_experts);
  }
  if (cfg.hyper.model == trainer::ModelKind::kDlrm) {
    EXPECT_EQ(served.spec().model.bot_layer_sizes, cfg.hyper.bot_layer_sizes);
    EXPECT_EQ(served.spec().model.dlrm_output, cfg.hyper.dlrm_output);
  }
  if (cfg.hyper.model == trainer::ModelKind::kXdeepfm) {
    EXPECT_EQ(served.spec().model.cin_layer_sizes, cfg.hyper.layer_sizes_cin);
    EXPECT_EQ(served.spec().model.fc_sizes, cfg.hyper.fc_sizes);
  }
  EXPECT_EQ(served.spec().model.mf_dim, cfg.dense_model_config().mf_dim);
  if (cfg.hyper.model == trainer::ModelKind::kAutoint) {
    const trainer::DenseModelConfig& want_model = cfg.dense_model_config();
    EXPECT_EQ(served.spec().model.attn_layer_sizes, want_model.attn_layer_sizes);
    EXPECT_EQ(served.spec().model.attn_heads, want_model.attn_heads);
    EXPECT_EQ(served.spec().model.attn_residual, want_model.attn_residual);
    EXPECT_EQ(served.spec().model.attn_scaling, want_model.attn_scaling);
    EXPECT_EQ(served.spec().model.attn_use_wide, want_model.attn_use_wide);
    EXPECT_EQ(served.spec().model.fc_sizes, want_model.fc_sizes);
  }
}

// Widths read strictly: a trailing comma in the export's slot_dims (an empty item, skipped
// before) is refused naming the file and the item.
void expect_trailing_width_comma_refused(const ServingModel& served,
                                         const trainer::TrainerConfig& cfg,
                                         const fs::path& exported) {
  std::string widths;
  for (const int dim : cfg.dense_model_config().slot_dims) widths += std::to_string(dim) + ",";
  ASSERT_TRUE(gpubox::testing::set_manifest_property((exported / "MANIFEST").string(), "slot_dims",
                                                     widths));
  const auto refused = ServingModel::load(exported.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(
      refused.status().to_string().find("MANIFEST: slot_dims item " +
                                        std::to_string(served.spec().model.slots + 1) + " ''"),
      std::string::npos)
      << refused.status().to_string();
}

// A model trained on transformed dense values (runner.dense_transform, or a PaddleRec folder's
// reader's when auto) is served through the same transform: its export records it, and slot
// text and JSON requests go through it (the server read the values as given: other predictions
// than --mode infer's, status 200).
TEST_F(Serving, TheDenseTransformTrainedIsTheOneServed) {
  std::vector<std::string> overrides = config_overrides(root_);
  overrides.push_back("runner.dense_transform=log1p");
  auto cfg = load_trainer_config(config_path_, overrides);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const fs::path save = root_ / "save_log1p";
  const fs::path exported = root_ / "export_log1p";
  const std::vector<float> want = train_save_and_infer(*cfg, save, exported);
  ASSERT_TRUE(export_serving_model(*cfg, save.string(), exported.string(), ExportOptions{}).ok());
  auto served = ServingModel::load(exported.string());
  ASSERT_TRUE(served.ok()) << served.status().to_string();
  EXPECT_EQ(served->spec().dense_transform, config::DenseTransform::kLog1p);
  const std::vector<float> got = served_predictions(*served, options(), test_lines());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  // JSON's dense values go through it as the slot text's do.
  const RequestParser parser(served->spec(), 16);
  const auto text = parser.parse("click:0 dense_feature:0.5 dense_feature:0 dense_feature:3 1:7\n",
                                 BodyForm::kSlotText);
  const auto json = parser.parse(R"({"instances": [{"slots": {"1": [7]}, "dense": [0.5, 0, 3]}]})",
                                 BodyForm::kJson);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  ASSERT_EQ(json->dense.size(), 3u);
  EXPECT_EQ(json->dense, text->dense);
  EXPECT_FLOAT_EQ(json->dense[0], static_cast<float>(std::log1p(0.5)));
  EXPECT_FLOAT_EQ(json->dense[2], static_cast<float>(std::log1p(3.0)));
  // A value the transform does not take (log1p of -2) is refused naming it.
  const auto bad = parser.parse(R"({"instances": [{"slots": {"1": [7]}, "dense": [-2, 0, 3]}]})",
                                BodyForm::kJson);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("the model's dense transform (log1p)"), std::string::npos)
      << bad.status().to_string();
}

TEST_F(Serving, EveryModelKindServesWhatInferPredicts) {
  for (const std::vector<std::string>& model : every_model_kind()) {
    SCOPED_TRACE(model.back());
    std::vector<std::string> overrides = config_overrides(root_);
    overrides.insert(overrides.end(), model.begin(), model.end());
    auto cfg = load_trainer_config(config_path_, overrides);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    const fs::path save = root_ / "save_kind";
    const fs::path exported = root_ / "export_kind";
    const std::vector<float> want = train_save_and_infer(*cfg, save, exported);
    ASSERT_NO_FATAL_FAILURE(
        expect_export_refuses_other_settings(*cfg, config_path_, overrides, save, exported));
    ASSERT_TRUE(export_serving_model(*cfg, save.string(), exported.string(), ExportOptions{}).ok());
    auto served = ServingModel::load(exported.string());
    ASSERT_TRUE(served.ok()) << served.status().to_string();
    expect_spec_names_the_network(*served, *cfg);
    const std::vector<float> got = served_predictions(*served, options(), test_lines());
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_LT(worst, 1e-6) << "largest difference from --mode infer";
    if (!cfg->dense_model_config().slot_dims.empty()) {
      ASSERT_NO_FATAL_FAILURE(expect_trailing_width_comma_refused(*served, *cfg, exported));
    }
  }
}

}  // namespace
}  // namespace gpubox::serving
