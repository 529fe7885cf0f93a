// PaddleRec's dcn and dcn_v2 configs (issue 32, item 1): both load unchanged from their model
// folders and build their networks; DCN-Mix without a rank is refused; low_rank without the
// mixture has no effect and is listed (PaddleRec builds full-rank cross layers then); the keys
// their networks read and ignore (dnn_use_bn, clip_by_norm) accepted on or off and listed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "table/sparse_config.hpp"
#include "tests/integration/paddlerec_keys_test_util.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/network_choice.hpp"

namespace gpubox::trainer {
namespace {

using paddlerec_test::contains;
using paddlerec_test::error_of;
using paddlerec_test::parse;

// PaddleRec's models/rank/dcn/config.yaml and models/rank/dcn_v2/config.yaml, unchanged (the
// runner part is dcn's; dcn_v2's differs in its epochs and output names only).
constexpr const char* kDcnRunner = R"(runner:
  train_data_dir: "./data/sample_data"
  train_reader_path: "reader" # importlib format
  use_gpu: False
  use_auc: True
  train_batch_size: 8
  epochs: 10
  print_interval: 1
  #model_init_path: "output_model/0" # init model
  model_save_path: "output_model_deepCross"
  test_data_dir: "./data/sample_data"
  infer_reader_path: "reader" # importlib format
  infer_batch_size: 8
  infer_load_path: "output_model_deepCross"
  infer_start_epoch: 0
  infer_end_epoch: 10


# hyper parameters of user-defined network
)";
constexpr const char* kDcnHyper = R"(hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.0001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1000001
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128] #, 32]
  distributed_embedding: 0

# sparse_inputs_slots + dense_input_dim

  cross_num: 2
  l2_reg_cross: 0.00005
  dnn_use_bn: False
  clip_by_norm: 100.0
  is_sparse: False
  # cat_feat_num: "{workspace}/data/sample_data/cat_feature_num.txt"
)";
constexpr const char* kDcnV2Hyper = R"(hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001 # 0.0001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1100001
  sparse_feature_dim: 40 # 10  40
  dense_input_dim: 13
  is_Stacked: True
  use_low_rank_mixture: True # False  True
  low_rank:  256 #32
  num_experts: 4
  fc_sizes: [768, 768] # [768, 768]  [500, 500, 500]
  distributed_embedding: 0

# sparse_inputs_slots + dense_input_dim

  cross_num: 2 #3 4
  l2_reg_cross: 0.00003
  dnn_use_bn: False
  clip_by_norm: 10.0
)";

// A config at <tmp>/PaddleRec/models/rank/<folder>/config.yaml: the folder names the network.
std::string write_in_folder(const std::string& folder, const std::string& text) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "paddlerec_keys" / "models/rank" / folder;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.yaml") << text;
  return (dir / "config.yaml").string();
}

StatusOr<TrainerConfig> load_in_folder(const std::string& folder, const std::string& text,
                                       const std::vector<std::string>& overrides = {}) {
  return load_trainer_config(write_in_folder(folder, text), overrides);
}

// The start line of the rows of the config at `path` (table::paddlerec_rows_rule_note).
std::string rows_note(const std::string& path, const std::vector<std::string>& overrides = {}) {
  auto doc = config::ConfigDocument::load(path, overrides);
  if (!doc.ok()) return doc.status().to_string();
  StatusOr<table::AccessorConfig> rows = table::sparse_config_from(*doc);
  return rows.ok() ? table::paddlerec_rows_rule_note(*doc, *rows) : rows.status().to_string();
}

TEST(PaddleRecKeys, DcnAndDcnV2ConfigsLoadUnchangedAndBuildTheirNetworks) {
  const StatusOr<TrainerConfig> dcn = load_in_folder("dcn", std::string(kDcnRunner) + kDcnHyper);
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.model, ModelKind::kDcn);
  const DenseModelConfig v1 = dcn->dense_model_config();
  EXPECT_EQ(v1.cross_layers, 2);
  EXPECT_FLOAT_EQ(v1.cross_l2, 0.00005f);
  EXPECT_EQ(v1.cross_experts, 0);
  EXPECT_EQ(v1.fc_sizes, (std::vector<int>{512, 256, 128}));
  // clip_by_norm and is_sparse change nothing in PaddleRec's dcn either: listed with why.
  auto doc =
      config::ConfigDocument::parse(std::string(kDcnRunner) + kDcnHyper, "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  const std::string note = doc->no_effect_note();
  EXPECT_TRUE(contains(note,
                       "hyper_parameters.clip_by_norm: PaddleRec's dcn hands it to its network, "
                       "which keeps it unused, and dcn_v2 reads it unused"))
      << note;
  EXPECT_TRUE(contains(note, "hyper_parameters.is_sparse: ")) << note;
  // A key without effect typed on the command line is warned of by its -o (the INFO note alone
  // let -o runner.batch_size=64 train at train_batch_size unsaid); the file's are not.
  EXPECT_EQ(doc->no_effect_overrides({"runner.train_batch_size=64"}), "");
  const std::vector<std::string> typed = {"runner.batch_size=64", "runner.epochs=2"};
  auto with_typed =
      config::ConfigDocument::parse(std::string(kDcnRunner) + kDcnHyper, "/base", typed, "p.yaml");
  ASSERT_TRUE(with_typed.ok()) << with_typed.status().to_string();
  const std::string warned = with_typed->no_effect_overrides(typed);
  EXPECT_TRUE(
      contains(warned, "-o runner.batch_size=64: runner.batch_size has no effect in GPUBox"))
      << warned;
  EXPECT_FALSE(contains(warned, "epochs")) << warned;
  EXPECT_FALSE(contains(warned, "clip_by_norm")) << warned;

  const StatusOr<TrainerConfig> v2 =
      load_in_folder("dcn_v2", std::string(kDcnRunner) + kDcnV2Hyper);
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  EXPECT_EQ(v2->hyper.model, ModelKind::kDcnV2);
  const DenseModelConfig mix = v2->dense_model_config();
  EXPECT_EQ(mix.cross_experts, 4);
  EXPECT_EQ(mix.cross_rank, 256);
  EXPECT_EQ(mix.cross_layers, 2);
  EXPECT_EQ(mix.dcn_structure, DcnStructure::kStacked);
  EXPECT_FLOAT_EQ(mix.cross_l2, 0.00003f);
  // use_low_rank_mixture: False trains plain cross layers, whatever num_experts says.
  const StatusOr<TrainerConfig> plain =
      parse("hyper_parameters:\n  model: dcn_v2\n  use_low_rank_mixture: 0\n  num_experts: 4\n");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->dense_model_config().cross_experts, 0);
}

// PaddleRec's dcn_v2 starts its embedding (every value of a key's row) at a normal of std
// 0.1 / sqrt(sparse_feature_dim) truncated at 2 std: its folder's rows, under its Adam, start
// uniform with that standard deviation, in gpubox_train and in gpubox_server alike, and say so
// at start; a range the config sets is kept, and dcn's folder and a dcn_v2 trained outside the
// folder keep GPUBox's ranges (embed_w 0, embedx U(+-1e-4)).
TEST(PaddleRecKeys, DcnV2RowsStartAtItsInitialisersStandardDeviation) {
  // std 0.1 / sqrt(40) * 0.87963 (the truncation), times sqrt(3) for the uniform's half-width.
  const float range = 0.0240895f;
  const std::string yaml = std::string(kDcnRunner) + kDcnV2Hyper;
  const StatusOr<TrainerConfig> v2 = load_in_folder("dcn_v2", yaml);
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  EXPECT_NEAR(v2->sparse.optimizer.initial_range, range, 1e-6);
  EXPECT_NEAR(v2->sparse.optimizer.mf_initial_range, range, 1e-6);
  const StatusOr<table::AccessorConfig> server =
      table::load_sparse_config(write_in_folder("dcn_v2", yaml));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  EXPECT_EQ(server->optimizer.initial_range, v2->sparse.optimizer.initial_range);
  EXPECT_EQ(server->optimizer.mf_initial_range, v2->sparse.optimizer.mf_initial_range);
  EXPECT_TRUE(contains(rows_note(write_in_folder("dcn_v2", yaml)),
                       "they start at embed_w U(+-0.02409) (derived, as hyper_parameters."
                       "sparse_optimizer.initial_range is unset), embedx U(+-0.02409) (derived, "
                       "as hyper_parameters.sparse_optimizer.mf_initial_range is unset;"))
      << rows_note(write_in_folder("dcn_v2", yaml));
  // dcn_v2's folder has only dygraph_model.py, whose Adam is not lazy.
  EXPECT_TRUE(contains(rows_note(write_in_folder("dcn_v2", yaml)),
                       "per_table: the table's step "
                       "count, as Paddle's Adam (one beta1_pow / beta2_pow a table)"));
  EXPECT_FALSE(contains(rows_note(write_in_folder("dcn_v2", yaml)), "lazy"));

  const StatusOr<TrainerConfig> set =
      load_in_folder("dcn_v2", yaml, {"hyper_parameters.sparse_optimizer.mf_initial_range=0.001"});
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_NEAR(set->sparse.optimizer.initial_range, range, 1e-6);
  EXPECT_FLOAT_EQ(set->sparse.optimizer.mf_initial_range, 0.001f);

  const StatusOr<TrainerConfig> dcn = load_in_folder("dcn", std::string(kDcnRunner) + kDcnHyper);
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->sparse.optimizer.initial_range, 0.0f);
  EXPECT_FLOAT_EQ(dcn->sparse.optimizer.mf_initial_range, 0.0001f);
  const StatusOr<TrainerConfig> outside =
      parse(std::string("hyper_parameters:\n  model: dcn_v2\n  optimizer:\n    class: Adam\n"));
  ASSERT_TRUE(outside.ok()) << outside.status().to_string();
  EXPECT_EQ(outside->sparse.optimizer.initial_range, 0.0f);
  EXPECT_FLOAT_EQ(outside->sparse.optimizer.mf_initial_range, 0.0001f);
  // In dcn_v2's folder with another network, the rows are that network's: GPUBox's ranges.
  const StatusOr<TrainerConfig> dnn =
      load_in_folder("dcn_v2", yaml, {"hyper_parameters.model=dnn"});
  ASSERT_TRUE(dnn.ok()) << dnn.status().to_string();
  EXPECT_FLOAT_EQ(dnn->sparse.optimizer.mf_initial_range, 0.0001f);
}

// A range the config sets is kept and the line says so; under any rule but the folder's Adam
// (SGD, a sparse rule's key set) the rows start at GPUBox's ranges and the line says where the
// net's would be; a config outside the folder whose workspace names it derives the range too.
TEST(PaddleRecKeys, DcnV2StartRangesOnlyUnderTheFoldersAdamAndSaidWhereTheyCameFrom) {
  const std::string yaml = std::string(kDcnRunner) + kDcnV2Hyper;
  const std::string path = write_in_folder("dcn_v2", yaml);
  const std::string so = "hyper_parameters.sparse_optimizer.";
  const std::vector<std::string> set = {so + "initial_range=0.01"};
  const StatusOr<TrainerConfig> kept = load_in_folder("dcn_v2", yaml, set);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_FLOAT_EQ(kept->sparse.optimizer.initial_range, 0.01f);
  EXPECT_NEAR(kept->sparse.optimizer.mf_initial_range, 0.0240895f, 1e-6);
  EXPECT_TRUE(contains(rows_note(path, set), "embed_w U(+-0.01) (set by " + so + "initial_range)"))
      << rows_note(path, set);

  for (const std::vector<std::string>& other :
       {std::vector<std::string>{"hyper_parameters.optimizer.class=SGD"},
        std::vector<std::string>{so + "learning_rate=0.05"}}) {
    const StatusOr<TrainerConfig> c = load_in_folder("dcn_v2", yaml, other);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->sparse.optimizer.initial_range, 0.0f) << other[0];
    EXPECT_FLOAT_EQ(c->sparse.optimizer.mf_initial_range, 0.0001f) << other[0];
    const std::string note = rows_note(path, other);
    EXPECT_TRUE(contains(note, "embed_w U(+-0) (GPUBox's " + so + "initial_range)")) << note;
    EXPECT_TRUE(contains(note, "GPUBox applies only where the rows take the folder's Adam"))
        << note;
    EXPECT_TRUE(contains(note, "set the two ranges to 0.02409 for it")) << note;
  }

  const StatusOr<TrainerConfig> by_workspace =
      parse(std::string("workspace: \"models/rank/dcn_v2\"\n") + yaml);
  ASSERT_TRUE(by_workspace.ok()) << by_workspace.status().to_string();
  EXPECT_NEAR(by_workspace->sparse.optimizer.initial_range, 0.0240895f, 1e-6);
  EXPECT_NEAR(by_workspace->sparse.optimizer.mf_initial_range, 0.0240895f, 1e-6);
}

// A save records the start ranges used, not the config's text (GPUBox's defaults when unset),
// and a resume of a save made at GPUBox's ranges (before the derivation) is refused naming the
// key, the save's value and the -o that resumes it there; a range the config sets is recorded as
// before and not checked.
TEST(PaddleRecKeys, ASaveRecordsTheDerivedStartRangesAndAnOlderSaveIsNotResumedAtThem) {
  const std::string yaml = std::string(kDcnRunner) + kDcnV2Hyper;
  const std::string so = "hyper_parameters.sparse_optimizer.";
  const StatusOr<TrainerConfig> v2 = load_in_folder("dcn_v2", yaml);
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  EXPECT_EQ(v2->model_keys.at(so + "initial_range"), "0.024089541");
  EXPECT_EQ(v2->model_keys.at(so + "mf_initial_range"), "0.024089541");
  EXPECT_EQ(std::stof(v2->model_keys.at(so + "initial_range")), v2->sparse.optimizer.initial_range);

  std::map<std::string, std::string> old_save = v2->model_keys;
  old_save[so + "initial_range"] = "0";
  old_save[so + "mf_initial_range"] = "0.0001";
  const Status refused = check_saved_derived_keys(old_save, v2.value(), "/saves/3");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(contains(refused.message(), "save /saves/3 was made with " + so + "initial_range=0"))
      << refused.message();
  EXPECT_TRUE(contains(refused.message(), "add -o " + so + "initial_range=0 to resume this save"))
      << refused.message();
  EXPECT_TRUE(check_saved_derived_keys(v2->model_keys, v2.value(), "/saves/3").ok());

  const StatusOr<TrainerConfig> set =
      load_in_folder("dcn_v2", yaml, {so + "initial_range=0", so + "mf_initial_range=0.0001"});
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->model_keys.at(so + "initial_range"), "0");
  EXPECT_EQ(set->model_keys.at(so + "mf_initial_range"), "0.0001");
  // (The folder's dropout rate stays derived: record_dnn_dropout.)
  EXPECT_EQ(set->derived_model_keys.count(so + "initial_range"), 0u);
  EXPECT_EQ(set->derived_model_keys.count(so + "mf_initial_range"), 0u);
  EXPECT_TRUE(check_saved_derived_keys(old_save, set.value(), "/saves/3").ok());
  // dcn's folder records its config's text as before.
  const StatusOr<TrainerConfig> dcn = load_in_folder("dcn", std::string(kDcnRunner) + kDcnHyper);
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->model_keys.at(so + "mf_initial_range"), "0.0001");
  EXPECT_TRUE(dcn->derived_model_keys.empty());
}

// A save is read (infer, export, --load) only under the network and input it was made for: the
// keys that shape them are compared, those that only train are not.
TEST(PaddleRecKeys, ASaveIsReadOnlyUnderItsNetworkAndInput) {
  const StatusOr<TrainerConfig> v2 =
      load_in_folder("dcn_v2", std::string(kDcnRunner) + kDcnV2Hyper);
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  const std::map<std::string, std::string>& keys = v2->model_keys;
  std::map<std::string, std::string> job = v2->job_keys;
  ASSERT_EQ(job.count("runner.dense_transform"), 1u);
  EXPECT_TRUE(check_saved_network(keys, job, v2.value(), "/saves/3").ok());
  // Training-only keys differ: read.
  std::map<std::string, std::string> trained = keys;
  for (const char* key : {"hyper_parameters.optimizer.learning_rate",
                          "hyper_parameters.sparse_optimizer.learning_rate",
                          "hyper_parameters.dense_precision", "hyper_parameters.dnn_dropout",
                          "hyper_parameters.cross_l2", "hyper_parameters.sparse_storage"}) {
    trained[key] = "other";
  }
  const Status read = check_saved_network(trained, job, v2.value(), "/saves/3");
  EXPECT_TRUE(read.ok()) << read.message();
  // A save from before jobs were recorded, or before the transform was recorded as applied (its
  // text, `auto`): the transform is not compared.
  EXPECT_TRUE(check_saved_network(keys, {}, v2.value(), "/saves/3").ok());
  std::map<std::string, std::string> texts = job;
  texts["runner.dense_transform"] = "auto";
  EXPECT_TRUE(check_saved_network(keys, texts, v2.value(), "/saves/3").ok());
  // Criteo's integer scaling is compared where either side reads Criteo files.
  std::map<std::string, std::string> scaled = job;
  scaled["runner.criteo_dense"] = "log";
  EXPECT_TRUE(check_saved_network(keys, scaled, v2.value(), "/saves/3").ok());
  scaled["runner.data_format"] = "criteo";
  const Status criteo = check_saved_network(keys, scaled, v2.value(), "/saves/3");
  EXPECT_TRUE(contains(criteo.message(), "runner.criteo_dense: saved log, now minmax"))
      << criteo.message();
  // The network or its input differs: refused naming each key.
  std::map<std::string, std::string> other = keys;
  other["hyper_parameters.cross_layers"] = "7";
  job["runner.dense_transform"] = "none";
  const Status refused = check_saved_network(other, job, v2.value(), "/saves/3");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(contains(refused.message(), "save /saves/3 was made for another network or input"))
      << refused.message();
  EXPECT_TRUE(contains(refused.message(), "hyper_parameters.cross_layers: saved 7, now " +
                                              keys.at("hyper_parameters.cross_layers")))
      << refused.message();
  EXPECT_TRUE(contains(refused.message(), "runner.dense_transform: saved none, now " +
                                              v2->job_keys.at("runner.dense_transform")))
      << refused.message();
}

TEST(PaddleRecKeys, DcnMixWithoutARankIsRefused) {
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  model: dcn_v2\n  use_low_rank_mixture: "
                                "True\n"),
                       "p.yaml: hyper_parameters.cross_mixture (PaddleRec's use_low_rank_mixture) "
                       "is true, but the experts' rank hyper_parameters.cross_rank (PaddleRec's "
                       "low_rank) is 0"));
  // dcn's vector layers have no rank nor mixture: set for it, they are refused, not dropped.
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  model: dcn\n  cross_rank: 8\n"),
                       "p.yaml: hyper_parameters.model is dcn (DCN v1: vector cross layers), "
                       "but hyper_parameters.cross_rank (PaddleRec's low_rank) is 8"));
  EXPECT_TRUE(
      contains(error_of("hyper_parameters:\n  model: dcn\n  cross_mixture: true\n"),
               "hyper_parameters.cross_mixture (PaddleRec's use_low_rank_mixture) is true"));
  // dcn is parallel whatever dcn_structure (dcn_v2's) says.
  const StatusOr<TrainerConfig> dcn =
      parse("hyper_parameters:\n  model: dcn\n  dcn_structure: stacked\n");
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
}

// PaddleRec dcn_v2 builds full-rank cross layers (CrossNetV2) unless use_low_rank_mixture is
// true, whatever low_rank says: trained low-rank, its config would have been another network.
TEST(PaddleRecKeys, LowRankWithoutTheMixtureHasNoEffectAndIsListed) {
  const std::string yaml =
      "hyper_parameters:\n  model: dcn_v2\n  use_low_rank_mixture: False\n  low_rank: 32\n";
  auto doc = config::ConfigDocument::parse(yaml, "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("hyper_parameters.cross_rank"), 0);
  EXPECT_TRUE(contains(doc->no_effect_note(),
                       "hyper_parameters.low_rank: PaddleRec dcn_v2's rank of the DCN-Mix experts "
                       "(its plain cross layers are full rank); it applies with "
                       "hyper_parameters.cross_mixture true only"))
      << doc->no_effect_note();
  // An override turning the mixture on makes the file's low_rank apply; one of low_rank itself
  // applies with the mixture only, and replaces the file's.
  auto on = config::ConfigDocument::parse(yaml, "/base", {"hyper_parameters.cross_mixture=true"},
                                          "p.yaml");
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  EXPECT_EQ(on->get_int("hyper_parameters.cross_rank"), 32);
  EXPECT_EQ(on->no_effect_note(), "");
  auto both = config::ConfigDocument::parse(
      yaml, "/base", {"hyper_parameters.use_low_rank_mixture=1", "hyper_parameters.low_rank=8"},
      "p.yaml");
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_EQ(both->get_int("hyper_parameters.cross_rank"), 8);
  auto off =
      config::ConfigDocument::parse(yaml, "/base", {"hyper_parameters.low_rank=8"}, "p.yaml");
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  EXPECT_EQ(off->get_int("hyper_parameters.cross_rank"), 0);
  // Overrides apply in order, the last one of cross_rank winning however it is named.
  for (const char* mixture :
       {"hyper_parameters.cross_mixture=true", "hyper_parameters.cross_mixture=false"}) {
    auto later = config::ConfigDocument::parse(
        yaml, "/base", {mixture, "hyper_parameters.low_rank=8", "hyper_parameters.cross_rank=4"},
        "p.yaml");
    ASSERT_TRUE(later.ok()) << later.status().to_string();
    EXPECT_EQ(later->get_int("hyper_parameters.cross_rank"), 4) << mixture;
  }
  auto last_alias = config::ConfigDocument::parse(
      yaml, "/base",
      {"hyper_parameters.cross_mixture=true", "hyper_parameters.cross_rank=4",
       "hyper_parameters.low_rank=8"},
      "p.yaml");
  ASSERT_TRUE(last_alias.ok()) << last_alias.status().to_string();
  EXPECT_EQ(last_alias->get_int("hyper_parameters.cross_rank"), 8);
  // Set beside cross_rank, the mixture's low_rank is still the one key set twice.
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  cross_rank: 4\n  low_rank: 8\n"
                                "  use_low_rank_mixture: 1\n"),
                       "p.yaml:3: hyper_parameters.low_rank sets hyper_parameters.cross_rank to "
                       "8, set already on line 2"));
}

// PaddleRec's dcn and dcn_v2 read dnn_use_bn and clip_by_norm and use neither (their net.py,
// static_model.py, dygraph_model.py): on or off, accepted and listed with why.
TEST(PaddleRecKeys, KeysPaddleRecsNetworksIgnoreAreAcceptedOnOrOff) {
  auto doc = config::ConfigDocument::parse(
      "hyper_parameters:\n  dnn_use_bn: True\n  clip_by_norm: 10.0\n", "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  const std::string note = doc->no_effect_note();
  EXPECT_TRUE(contains(note, "hyper_parameters.dnn_use_bn: PaddleRec's dcn and dcn_v2 read it"))
      << note;
  EXPECT_TRUE(contains(note,
                       "hyper_parameters.clip_by_norm: PaddleRec's dcn hands it to its "
                       "network, which keeps it unused"))
      << note;
  EXPECT_TRUE(parse("runner:\n  epochs: 1\n", {"hyper_parameters.dnn_use_bn=1"}).ok());
}

// What PaddleRec's dcn_v2 does that GPUBox's does not is listed at start with why it is not built
// (issue 32): the dense Linear (the held-out AUC met Paddle's without it and dropout) and the
// non-lazy Adam (the card tier steps the batch's rows); the clip is built, but not in the
// parameter-server modes.
TEST(PaddleRecKeys, DcnV2StartLineSaysWhyEachDifferenceIsNotBuilt) {
  const std::string line = differences_from_paddlerec(ModelKind::kDcnV2, 0.5);
  for (const char* part : {"neither is built: without them, and before dropout was built, the",
                           "its dropout (hyper_parameters.dnn_dropout, the folder's 0.5",
                           "GPUBox's card tier, as Paddle's PSGPU, steps the batch's rows only",
                           "(hyper_parameters.optimizer.clip_by_norm, the folder's 10 as "
                           "PaddleRec's trainer) is built in gpubox and Collective mode only"}) {
    EXPECT_TRUE(contains(line, part)) << part << "\n" << line;
  }
}

}  // namespace
}  // namespace gpubox::trainer
