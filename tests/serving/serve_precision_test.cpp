// The dense precision of an export (serving_model.hpp) on models trained here (the suite's data,
// serve_test_fixture.hpp):
//  - the export records the precision the save was trained in (what its dense net computed in,
//    as the save's MODEL_MANIFEST records it; a save from before that records only what was
//    asked, which does not prove bf16 ran: fp32, a bf16 ask logged naming the file and the
//    override; a config that differs is logged; a corrupt value is refused naming the file
//    and key); a bf16 model served in it
//    predicts bit for bit what --mode infer (Trainer::evaluate) predicts in bf16, and served with
//    the fp32 override (gpubox_serve --precision fp32) what infer predicts in fp32; the two differ;
//  - requests of 0, 1, n and n+1 instances, n the micro-batch's size, each as infer predicts the
//    same instances as one batch;
//  - an export made before the key loads as fp32; an unknown value is refused naming the MANIFEST
//    and the key;
//  - the networks whose part computes in fp32 (xdeepfm's CIN, deepfefm's FEFM, autoint's and
//    fat_deepffm's attention) train their MLP in bf16 over a bf16 copy of the part's rows (said at
//    start); the save records bf16, resumes, and its export is served in bf16 as infer predicts;
//  - dcn_v2 (DCN-Mix) in bf16, its cross GEMMs bf16 too: resumed from its save as uninterrupted,
//    served in bf16 and fp32 as infer predicts in each;
//  - a network that has no MLP (fm) trains in fp32 when bf16 is asked (DenseModel decides and says
//    so), its export records fp32 and it is served in fp32.
// The tests that need bf16 to run are skipped on a card without bf16 GEMMs (a GPU before sm_80;
// a CPU emulates them here).
// Bit for bit: the server runs the trainer's DenseModel on the same records (a float32 export
// holds the save's bits), the same instances in the same order and batch size, on one host thread
// as the trainer here: every GEMM sees the same operands in the same shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "serving/http_server.hpp"
#include "serving/serving_model.hpp"
#include "table/io/model_manifest.hpp"
#include "tests/serving/http_client.hpp"
#include "tests/serving/serve_test_fixture.hpp"
#include "tests/table/manifest_edit.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/nn/blas.hpp"

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
using trainer::DensePrecision;
using trainer::Trainer;
using trainer::TrainerConfig;
using trainer::TrainerEnv;

// The bf16 data path on every CPU: hardware bf16 GEMMs where the CPU has them (this then changes
// nothing), emulated elsewhere (fp32 GEMMs on bf16 operands). Blas reads it when a DenseModel is
// built, so both sides of a comparison take the same path.
class Bf16Everywhere {
 public:
  Bf16Everywhere() {
    if (const char* was = std::getenv(kName)) was_ = was;
    ::setenv(kName, "1", 1);
  }
  ~Bf16Everywhere() {
    if (was_) {
      ::setenv(kName, was_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }
  Bf16Everywhere(const Bf16Everywhere&) = delete;
  Bf16Everywhere& operator=(const Bf16Everywhere&) = delete;

 private:
  static constexpr const char* kName = "GPUBOX_BF16_EMULATION";
  std::optional<std::string> was_;
};

// Whether card 0 of `env` has bf16 GEMMs (with Bf16Everywhere: always on the cpu backend; not
// on a GPU before sm_80), as DenseModel asks its Blas.
bool card_has_bf16(const TrainerEnv& env) {
  device::CardSet cards = device::CardSet::from_list(env.selected_cards, 0, 1, 1);
  device::Card& card = cards.card(0);
  card.activate();
  return trainer::Blas(card).bf16() != trainer::Bf16Support::kNone;
}

// The MODEL_MANIFEST of the save `save`.
table::io::ModelManifest model_manifest(const fs::path& save) {
  auto manifest = table::io::read_model_manifest(table::io::FileEnv::posix(), save.string());
  throw_if_error(manifest.status());
  return *manifest;
}

TrainerConfig config_with(const std::string& path, const fs::path& root, const char* precision,
                          std::size_t infer_batch, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = config_overrides(root);
  overrides.push_back(std::string("hyper_parameters.dense_precision=") + precision);
  overrides.push_back("runner.infer_batch_size=" + std::to_string(infer_batch));
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto config = trainer::load_trainer_config(path, overrides);
  throw_if_error(config.status());
  return *config;
}

// Trains `config` one pass over `train`, saves into `save` and exports it into `exported`.
void train_save_export(const TrainerConfig& config, const TrainerEnv& env, const fs::path& train,
                       const fs::path& save, const fs::path& exported) {
  fs::remove_all(save);
  fs::remove_all(exported);
  {
    Trainer trainer(config, env);
    trainer.train_pass(trainer::data_files(train.string()));
    trainer.save(save.string());
  }
  throw_if_error(
      export_serving_model(config, save.string(), exported.string(), ExportOptions{}).status());
}

// What --mode infer predicts for `lines` with `config` from `save`: the lines as a data folder of
// their own (`dir`), evaluated in batches of runner.infer_batch_size.
std::vector<float> infer_predictions(const TrainerConfig& config, const TrainerEnv& env,
                                     const fs::path& save, const std::vector<std::string>& lines,
                                     const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "part-00000");
    for (const std::string& line : lines) out << line << '\n';
  }
  Trainer infer(config, env);
  infer.load(save.string());
  return infer.evaluate(trainer::data_files(dir.string()), true).predictions;
}

std::size_t count_differing(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) count += a[i] != b[i];
  return count;
}

// `got` is `want` bit for bit; else the number that differ and the first of them.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  std::string first;
  for (std::size_t i = 0; i < got.size() && first.size() < 200; ++i) {
    if (got[i] != want[i]) {
      first += " [" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " +
               std::to_string(want[i]);
    }
  }
  EXPECT_EQ(count_differing(got, want), 0u) << "of " << got.size() << ":" << first;
}

constexpr std::size_t kBatch = 50;  // infer's batches and the micro-batch's: the suite's 300 lines

// The suite's model trained in bf16, saved and exported once (on the first test that asks).
struct Bf16Model {
  fs::path save;
  fs::path exported;
};
Bf16Model bf16_model(const std::string& config_path, const fs::path& root, const TrainerEnv& env) {
  Bf16Model model{root / "bf16_save", root / "bf16_export"};
  if (!fs::exists(model.exported / "MANIFEST")) {
    train_save_export(config_with(config_path, root, "bf16", kBatch), env, root / "train",
                      model.save, model.exported);
  }
  return model;
}

TEST_F(Serving, Bf16ModelIsServedInBf16AsInferPredictsItAndInFp32WhenAsked) {
  const Bf16Everywhere bf16;
  if (!card_has_bf16(env())) GTEST_SKIP() << "card 0 has no bf16 GEMMs";
  const Bf16Model trained = bf16_model(config_path_, root_, env());
  EXPECT_EQ(model_manifest(trained.save).dense_precision, DensePrecision::kBf16);
  auto model = ServingModel::load(trained.exported.string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->spec().model.precision, DensePrecision::kBf16);

  const std::vector<std::string> lines = test_lines();
  ASSERT_EQ(lines.size() % kBatch, 0u);
  const TrainerConfig bf16_config = config_with(config_path_, root_, "bf16", kBatch);
  const std::vector<float> want_bf16 =
      infer_predictions(bf16_config, env(), trained.save, lines, root_ / "infer_lines");
  ServerOptions o = options();
  o.batcher.max_batch_instances = kBatch;
  {
    PredictionServer server(*model, o);
    ASSERT_TRUE(server.start().ok());
    EXPECT_EQ(server.precision(), DensePrecision::kBf16);
    const HttpReply health = HttpClient(server.port()).send(http::verb::get, "/health");
    EXPECT_NE(health.body.find("\"precision\": \"bf16\""), std::string::npos) << health.body;
  }
  expect_same_bits(served_predictions(*model, o, lines, kBatch), want_bf16);

  // The fp32 override: what infer computes with the config in fp32 from the same save.
  const TrainerConfig fp32_config = config_with(config_path_, root_, "fp32", kBatch);
  const std::vector<float> want_fp32 =
      infer_predictions(fp32_config, env(), trained.save, lines, root_ / "infer_lines");
  o.precision = DensePrecision::kFp32;
  expect_same_bits(served_predictions(*model, o, lines, kBatch), want_fp32);
  // bf16 rounds the activations: most predictions differ, so neither check above passes by
  // computing the other precision.
  EXPECT_GT(static_cast<double>(count_differing(want_bf16, want_fp32)), 0.5 * lines.size());

  // The export records what the save was trained in, whatever the config exporting it says.
  const fs::path by_fp32_config = root_ / "bf16_export_fp32_config";
  fs::remove_all(by_fp32_config);
  ASSERT_TRUE(export_serving_model(fp32_config, trained.save.string(), by_fp32_config.string(),
                                   ExportOptions{})
                  .ok());
  auto reexported = ServingModel::load(by_fp32_config.string());
  ASSERT_TRUE(reexported.ok()) << reexported.status().to_string();
  EXPECT_EQ(reexported->spec().model.precision, DensePrecision::kBf16);
}

// dcn_v2 in bf16, DCN-Mix stacked (its cross GEMMs read bf16 operands: CrossNet): a run resumed
// from its save goes on as the uninterrupted run, bit for bit; its export served in bf16 predicts
// bit for bit what infer predicts in bf16, and in fp32 (--precision fp32) what infer predicts in
// fp32; the two differ.
TEST_F(Serving, DcnV2InBf16ResumesAndIsServedAsInferPredictsIt) {
  const Bf16Everywhere bf16;
  if (!card_has_bf16(env())) GTEST_SKIP() << "card 0 has no bf16 GEMMs";
  const std::vector<std::string> dcn = {
      "hyper_parameters.model=dcn_v2",       "hyper_parameters.cross_layers=2",
      "hyper_parameters.cross_mixture=true", "hyper_parameters.cross_rank=2",
      "hyper_parameters.cross_experts=2",    "runner.save_mode=checkpoint"};
  const TrainerConfig config = config_with(config_path_, root_, "bf16", kBatch, dcn);
  const fs::path save = root_ / "dcn_bf16_save";
  const fs::path exported = root_ / "dcn_bf16_export";
  train_save_export(config, env(), root_ / "train", save, exported);
  EXPECT_EQ(model_manifest(save).dense_precision, DensePrecision::kBf16);
  const std::vector<std::string> train = trainer::data_files((root_ / "train").string());
  std::vector<float> want_resumed;
  {
    Trainer straight(config, env());
    straight.train_pass(train);
    straight.train_pass(train);
    want_resumed = straight.dense_values(0);
  }
  Trainer resumed(config, env());
  resumed.load(save.string());
  resumed.train_pass(train);
  EXPECT_EQ(resumed.dense_values(0), want_resumed);

  auto model = ServingModel::load(exported.string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->spec().model.precision, DensePrecision::kBf16);
  const std::vector<std::string> lines = test_lines();
  const std::vector<float> want_bf16 =
      infer_predictions(config, env(), save, lines, root_ / "infer_lines");
  ServerOptions o = options();
  o.batcher.max_batch_instances = kBatch;
  expect_same_bits(served_predictions(*model, o, lines, kBatch), want_bf16);
  const std::vector<float> want_fp32 =
      infer_predictions(config_with(config_path_, root_, "fp32", kBatch, dcn), env(), save, lines,
                        root_ / "infer_lines");
  o.precision = DensePrecision::kFp32;
  expect_same_bits(served_predictions(*model, o, lines, kBatch), want_fp32);
  EXPECT_GT(static_cast<double>(count_differing(want_bf16, want_fp32)), 0.5 * lines.size());
}

// Requests of 0, 1, n and n+1 instances with micro-batches of n: each request is one batch (the
// n+1 alone: a batch takes a larger request whole), predicted as infer predicts the same
// instances as one batch of that size.
TEST_F(Serving, RequestsOfZeroOneNAndNPlusOneInstancesAreInferredAsOneBatchEach) {
  const Bf16Everywhere bf16;
  if (!card_has_bf16(env())) GTEST_SKIP() << "card 0 has no bf16 GEMMs";
  const Bf16Model trained = bf16_model(config_path_, root_, env());
  auto model = ServingModel::load(trained.exported.string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  constexpr std::size_t kN = 8;
  ServerOptions o = options();
  o.batcher.max_batch_instances = kN;
  PredictionServer server(*model, o);
  ASSERT_TRUE(server.start().ok());
  HttpClient client(server.port());
  // Zero instances: a JSON list of none; an empty body is refused (a POST without Content-Length
  // sends none, its lines then read as a next request).
  const HttpReply none =
      client.send(http::verb::post, "/predict", "{\"instances\": []}", "application/json");
  EXPECT_EQ(none.status, 200) << none.body;
  EXPECT_NE(none.body.find("\"predictions\": []"), std::string::npos) << none.body;
  const HttpReply empty = client.send(http::verb::post, "/predict", "", "text/plain");
  EXPECT_EQ(empty.status, 400) << empty.body;
  EXPECT_NE(empty.body.find("the request holds no instance"), std::string::npos) << empty.body;
  const std::vector<std::string> all = test_lines();
  std::size_t begin = 0;  // each size its own lines
  for (const std::size_t size : {std::size_t{1}, kN, kN + 1}) {
    SCOPED_TRACE(size);
    const std::vector<std::string> lines(all.begin() + begin, all.begin() + begin + size);
    begin += size;
    const std::vector<float> want =
        infer_predictions(config_with(config_path_, root_, "bf16", size), env(), trained.save,
                          lines, root_ / "infer_edge");
    std::string body;
    for (const std::string& line : lines) body += line + "\n";
    const uint64_t batches = server.metrics().batches();
    const HttpReply reply = client.send(http::verb::post, "/predict", body, "text/plain");
    ASSERT_EQ(reply.status, 200) << reply.body;
    expect_same_bits(parse_predictions(reply.body), want);
    EXPECT_EQ(server.metrics().batches(), batches + 1);
  }
}

TEST_F(Serving, AnExportWithoutThePrecisionIsFp32AndAnUnknownOneIsRefusedNamingIt) {
  EXPECT_EQ(model_->spec().model.precision, DensePrecision::kFp32);
  const fs::path old_export = root_ / "export_before_precision";
  fs::remove_all(old_export);
  fs::copy(root_ / "export", old_export);
  const std::string manifest = (old_export / "MANIFEST").string();
  ASSERT_TRUE(gpubox::testing::set_manifest_property(manifest, "dense_precision", "bf16"));
  auto loaded = ServingModel::load(old_export.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->spec().model.precision, DensePrecision::kBf16);
  ASSERT_TRUE(gpubox::testing::erase_manifest_property(manifest, "dense_precision"));
  loaded = ServingModel::load(old_export.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->spec().model.precision, DensePrecision::kFp32);

  ASSERT_FALSE(gpubox::testing::set_manifest_property(manifest, "dense_precision", "fp8"));
  loaded = ServingModel::load(old_export.string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().to_string().find(manifest + ": 'dense_precision': expected one of "
                                                        "fp32|bf16, got 'fp8'"),
            std::string::npos)
      << loaded.status().to_string();
}

// The CIN, the FEFM and the attention compute in fp32 and the MLP reads their rows rounded to bf16:
// bf16 asked, each network trains in it and says so; the save records bf16 and resumes (loaded,
// one more pass, saved: bf16 still), and the export is served in bf16 as infer predicts it.
TEST_F(Serving, ANetWithAnFp32PartTrainsItsMlpInBf16AndIsRecordedResumedAndServedInBf16) {
  const Bf16Everywhere bf16;
  if (!card_has_bf16(env())) GTEST_SKIP() << "card 0 has no bf16 GEMMs";
  const std::vector<std::vector<std::string>> networks = {
      {"hyper_parameters.model=xdeepfm", "hyper_parameters.layer_sizes_cin=[6, 3]"},
      {"hyper_parameters.model=deepfefm", "hyper_parameters.fc_sizes=[8]"},
      {"hyper_parameters.model=autoint", "hyper_parameters.attn_layer_sizes=[4]",
       "hyper_parameters.fc_sizes=[8]", "hyper_parameters.use_cvm=true"},
      {"hyper_parameters.model=fat_deepffm", "hyper_parameters.layer_sizes_dnn=[8]"}};
  const std::vector<std::string> lines = test_lines();
  for (const std::vector<std::string>& network : networks) {
    SCOPED_TRACE(network[0]);
    const TrainerConfig config = config_with(config_path_, root_, "bf16", kBatch, network);
    const fs::path save = root_ / "field_save", exported = root_ / "field_export";
    ::testing::internal::CaptureStderr();
    train_save_export(config, env(), root_ / "train", save, exported);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("computes in fp32; the MLP reads its rows rounded to bf16"),
              std::string::npos)
        << log;
    EXPECT_EQ(model_manifest(save).dense_precision, DensePrecision::kBf16);
    const fs::path resumed = root_ / "field_resumed";
    fs::remove_all(resumed);
    {
      Trainer trainer(config, env());
      trainer.load(save.string());
      trainer.train_pass(trainer::data_files((root_ / "train").string()));
      trainer.save(resumed.string());
    }
    EXPECT_EQ(model_manifest(resumed).dense_precision, DensePrecision::kBf16);
    auto model = ServingModel::load(exported.string());
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_EQ(model->spec().model.precision, DensePrecision::kBf16);  // what it trained in
    ServerOptions o = options();
    o.batcher.max_batch_instances = kBatch;
    {
      PredictionServer server(*model, o);
      EXPECT_EQ(server.precision(), DensePrecision::kBf16);
    }
    expect_same_bits(served_predictions(*model, o, lines, kBatch),
                     infer_predictions(config, env(), save, lines, root_ / "infer_lines"));
  }
}

// fm has no MLP, whose GEMMs are what bf16 changes: bf16 asked, it trains in fp32, says so, and
// its save and export record fp32.
TEST_F(Serving, ANetWithoutAnMlpIsTrainedAndRecordedInFp32WhenBf16IsAsked) {
  const Bf16Everywhere bf16;
  const TrainerConfig config =
      config_with(config_path_, root_, "bf16", kBatch, {"hyper_parameters.model=fm"});
  const fs::path save = root_ / "fm_save";
  ::testing::internal::CaptureStderr();
  train_save_export(config, env(), root_ / "train", save, root_ / "fm_export");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("asked to compute in bf16, but fm has no MLP"), std::string::npos) << log;
  EXPECT_EQ(model_manifest(save).dense_precision, DensePrecision::kFp32);
  auto model = ServingModel::load((root_ / "fm_export").string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->spec().model.precision, DensePrecision::kFp32);
}

// Rewrites the MODEL_MANIFEST of the save `save` after `edit` changed it (its config_hash
// follows the keys).
template <class Edit>
void edit_model_manifest(const fs::path& save, Edit edit) {
  table::io::ModelManifest manifest = model_manifest(save);
  edit(manifest);
  throw_if_error(
      table::io::write_model_manifest(table::io::FileEnv::posix(), save.string(), manifest));
}

constexpr const char* kPrecisionKey = "hyper_parameters.dense_precision";

// The suite's fp32 save copied to `name` under `root`, its MODEL_MANIFEST to edit, and what
// exporting it with a config records and logs.
class EditedSave {
 public:
  struct Exported {
    StatusOr<ExportSummary> summary;
    std::string log;
  };

  EditedSave(const fs::path& root, const std::string& name)
      : root_(root), save_(root / name), manifest_path_((save_ / table::io::kModelManifestName)) {
    fs::remove_all(save_);
    fs::copy(root / "save", save_, fs::copy_options::recursive);
  }
  template <class Edit>
  void edit(Edit edit) const {
    edit_model_manifest(save_, edit);
  }
  Exported exported(const TrainerConfig& config) const {
    const fs::path out = export_dir();
    fs::remove_all(out);
    ::testing::internal::CaptureStderr();
    auto summary = export_serving_model(config, save_.string(), out.string(), ExportOptions{});
    return Exported{std::move(summary), ::testing::internal::GetCapturedStderr()};
  }
  fs::path export_dir() const { return root_ / (save_.filename().string() + "_export"); }
  std::string manifest_path() const { return manifest_path_.string(); }
  // The log line of a config whose key differs from the save's, up to the save's value.
  std::string differs() const {
    return "save " + save_.string() + " was made with " + kPrecisionKey + "=";
  }
  // The log line of a save that does not record what its dense net computed in.
  std::string unproven() const { return manifest_path() + " has no dense_precision"; }

 private:
  fs::path root_, save_, manifest_path_;
};

// The save's entry of what it computed in rules the export; a config whose key differs from the
// save's is logged.
TEST_F(Serving, TheExportRecordsWhatTheSaveComputedIn) {
  const EditedSave save(root_, "save_computed_in");
  ASSERT_EQ(model_manifest(root_ / "save").dense_precision, DensePrecision::kFp32);
  const TrainerConfig bf16_config = config_with(config_path_, root_, "bf16", kBatch);
  save.edit([](auto& m) { m.dense_precision = DensePrecision::kBf16; });
  EditedSave::Exported e = save.exported(*config_);
  ASSERT_TRUE(e.summary.ok()) << e.summary.status().to_string();
  EXPECT_EQ(e.summary->precision, DensePrecision::kBf16);
  EXPECT_EQ(e.log.find(save.differs()), std::string::npos) << e.log;  // the same key: no warning
  e = save.exported(bf16_config);
  ASSERT_TRUE(e.summary.ok()) << e.summary.status().to_string();
  EXPECT_EQ(e.summary->precision, DensePrecision::kBf16);
  EXPECT_NE(
      e.log.find(save.differs() + "fp32, the config " + bf16_config.config_path + " says bf16"),
      std::string::npos)
      << e.log;
  EXPECT_EQ(e.log.find(save.unproven()), std::string::npos) << e.log;
}

// A save from before that entry records only what was asked, which does not prove bf16 ran: it
// exports as fp32 whatever the config says, and a bf16 ask is logged with the override.
TEST_F(Serving, AnOlderSaveExportsAsFp32) {
  const EditedSave save(root_, "save_older");
  const TrainerConfig bf16_config = config_with(config_path_, root_, "bf16", kBatch);
  const TrainerConfig* const configs[] = {config_, &bf16_config};
  const std::string override_named = "gpubox_serve --precision bf16";

  // Made with fp32: the config's bf16 logged as differing but not as an unproven ask.
  save.edit([](auto& m) { m.dense_precision.reset(); });
  EditedSave::Exported e = save.exported(bf16_config);
  ASSERT_TRUE(e.summary.ok()) << e.summary.status().to_string();
  EXPECT_EQ(e.summary->precision, DensePrecision::kFp32);
  EXPECT_NE(e.log.find(save.differs() + "fp32"), std::string::npos) << e.log;
  EXPECT_EQ(e.log.find(save.unproven()), std::string::npos) << e.log;

  // Made with bf16 (as an old save of xdeepfm, or of any net on a card without bf16 GEMMs,
  // records it though it ran fp32): fp32, and the log names the file, why and the override.
  save.edit([&](auto& m) { m.model_keys[kPrecisionKey] = "bf16"; });
  for (const TrainerConfig* config : configs) {
    e = save.exported(*config);
    ASSERT_TRUE(e.summary.ok()) << e.summary.status().to_string();
    EXPECT_EQ(e.summary->precision, DensePrecision::kFp32);
    EXPECT_NE(e.log.find(save.unproven() +
                         " (a save made before saves recorded what the dense net "
                         "computed in): it was made with " +
                         kPrecisionKey + "=bf16"),
              std::string::npos)
        << e.log;
    EXPECT_NE(e.log.find(override_named), std::string::npos) << e.log;
    auto served = ServingModel::load(save.export_dir().string());
    ASSERT_TRUE(served.ok()) << served.status().to_string();
    EXPECT_EQ(served->spec().model.precision, DensePrecision::kFp32);
  }

  // Neither recorded (a save from before both): fp32, whatever the config says; the config's
  // bf16 logged as not proven.
  save.edit([](auto& m) { m.model_keys.erase(kPrecisionKey); });
  for (const TrainerConfig* config : configs) {
    e = save.exported(*config);
    ASSERT_TRUE(e.summary.ok()) << e.summary.status().to_string();
    EXPECT_EQ(e.summary->precision, DensePrecision::kFp32);
    EXPECT_EQ(e.log.find(save.differs()), std::string::npos) << e.log;
    const bool bf16_asked = config == &bf16_config;
    EXPECT_EQ(e.log.find(save.unproven() +
                         " (a save made before saves recorded what the dense net "
                         "computed in): the config says " +
                         kPrecisionKey + "=bf16") != std::string::npos,
              bf16_asked)
        << e.log;
  }
}

// A corrupt key, then a corrupt entry: refused naming the file and the key.
TEST_F(Serving, ACorruptPrecisionInTheSaveIsRefusedNamingIt) {
  const EditedSave save(root_, "save_corrupt");
  const std::string where = save.manifest_path() + ": '";
  const std::string expected = "': expected one of fp32|bf16, got 'fp8'";
  save.edit([](auto& m) { m.model_keys[kPrecisionKey] = "fp8"; });
  EditedSave::Exported e = save.exported(*config_);
  ASSERT_FALSE(e.summary.ok());
  EXPECT_NE(e.summary.status().to_string().find(where + kPrecisionKey + expected),
            std::string::npos)
      << e.summary.status().to_string();
  save.edit([](auto& m) {  // a valid key and no entry, then an entry that is not a precision
    m.model_keys[kPrecisionKey] = "fp32";
    m.dense_precision.reset();
  });
  ASSERT_FALSE(
      gpubox::testing::set_manifest_property(save.manifest_path(), "dense_precision", "fp8"));
  e = save.exported(*config_);
  ASSERT_FALSE(e.summary.ok());
  EXPECT_NE(e.summary.status().to_string().find(where + "dense_precision" + expected),
            std::string::npos)
      << e.summary.status().to_string();
}

}  // namespace
}  // namespace gpubox::serving
