// gpubox_train's config: the shipped configs load with their documented values, the trainer
// part maps keys onto TrainerConfig, the dataset and table parts arrive through their modules
// (one derivation of mf_dim and of the sparse seed), and struct defaults equal the key table's.
// The document itself (unknown keys, types, ranges, overrides, paths) is tested in
// tests/common/config_document_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/config/config_document.hpp"
#include "table/sparse_config.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/network_choice.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer {
namespace {
namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  ConfigTest() {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("gpubox_config_test_" + std::to_string(rd()));
    fs::create_directories(dir_ / "sub");
  }
  ~ConfigTest() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // `text` as `folder`/config.yaml under the test's folder, loaded with `overrides`.
  StatusOr<TrainerConfig> load_in(const std::string& folder, const std::string& text,
                                  const std::vector<std::string>& overrides = {}) {
    fs::create_directories(dir_ / folder);
    return load_trainer_config(write(folder + "/config.yaml", text), overrides);
  }
  fs::path dir_;
};

TEST_F(ConfigTest, ShippedConfigsLoadWithTheirDocumentedValues) {
  const fs::path configs = fs::path(GPUBOX_SOURCE_DIR) / "configs";
  auto dnn = load_trainer_config((configs / "config_gpubox.yaml").string());
  ASSERT_TRUE(dnn.ok()) << dnn.status().to_string();
  EXPECT_EQ(dnn->num_sparse_slots(), 26);
  EXPECT_EQ(dnn->mf_dim(), 8);
  EXPECT_EQ(dnn->sparse.mf_dim, 8);
  EXPECT_EQ(dnn->dataset.dense_dim, 13);
  EXPECT_EQ(dnn->dataset.thread_num, 2);
  EXPECT_EQ(dnn->dataset.batch_size, 512);
  EXPECT_EQ(dnn->runner.epochs, 3);
  EXPECT_EQ(dnn->hyper.fc_sizes, (std::vector<int>{512, 256, 128, 32}));
  EXPECT_EQ(dnn->hyper.model, ModelKind::kDnn);
  EXPECT_EQ(dnn->hyper.optimizer.kind, DenseOptimizerKind::kAdam);
  EXPECT_EQ(dnn->sparse.optimizer.kind, table::SparseOptimizerKind::kAdagrad);
  EXPECT_EQ(dnn->runner.save_mode, SaveKind::kBase);
  const fs::path train = dnn->runner.train_data_dir;
  EXPECT_TRUE(train.is_absolute());
  EXPECT_TRUE(fs::exists(train / "sample_train.txt")) << train;
  const DenseModelConfig model = dnn->dense_model_config();
  EXPECT_EQ(model.slots, 26);
  EXPECT_EQ(model.mf_dim, 8);
  EXPECT_EQ(model.dense_dim, 13);

  auto wide = load_trainer_config((configs / "config_wide_deep.yaml").string());
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  EXPECT_EQ(wide->hyper.model, ModelKind::kWideDeep);
  auto deepfm = load_trainer_config((configs / "config_deepfm.yaml").string());
  ASSERT_TRUE(deepfm.ok()) << deepfm.status().to_string();
  EXPECT_EQ(deepfm->hyper.model, ModelKind::kDeepFm);
  EXPECT_EQ(deepfm->hyper.fc_sizes, wide->hyper.fc_sizes);
  // Mean steps per hot key: with summed ones deepfm diverges on skewed keys (issue 29).
  EXPECT_TRUE(deepfm->sparse.show_scale);
  auto dcn = load_trainer_config((configs / "config_dcn.yaml").string());
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.model, ModelKind::kDcnV2);
  EXPECT_EQ(dcn->hyper.fc_sizes, wide->hyper.fc_sizes);
  EXPECT_EQ(dcn->hyper.cross_layers, 3);
  EXPECT_EQ(dcn->hyper.cross_rank, 0);
  EXPECT_EQ(dcn->hyper.dcn_structure, DcnStructure::kStacked);
  const DenseModelConfig dcn_model = dcn->dense_model_config();
  EXPECT_EQ(dcn_model.cross_layers, 3);
  auto low = load_trainer_config(
      (configs / "config_dcn.yaml").string(),
      {"hyper_parameters.cross_rank=16", "hyper_parameters.dcn_structure=parallel",
       "hyper_parameters.cross_layers=2"});
  ASSERT_TRUE(low.ok()) << low.status().to_string();
  EXPECT_EQ(low->dense_model_config().cross_rank, 16);
  EXPECT_EQ(low->dense_model_config().cross_layers, 2);
  EXPECT_EQ(low->dense_model_config().dcn_structure, DcnStructure::kParallel);
  for (const std::string bad : {"hyper_parameters.cross_layers=0", "hyper_parameters.cross_rank=-1",
                                "hyper_parameters.dcn_structure=mixture"}) {
    auto refused = load_trainer_config((configs / "config_dcn.yaml").string(), {bad});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().to_string().find(bad.substr(0, bad.find('='))), std::string::npos)
        << refused.status().to_string();
  }
  auto dlrm = load_trainer_config((configs / "config_dlrm.yaml").string());
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->hyper.model, ModelKind::kDlrm);
  EXPECT_EQ(dlrm->dense_model_config().bot_layer_sizes, (std::vector<int>{512, 256, 64, 16}));
  EXPECT_EQ(dlrm->mf_dim() + 1, 16);  // the bottom output's width
  EXPECT_EQ(dlrm->hyper.fc_sizes, (std::vector<int>{512, 256}));
  auto xdeepfm = load_trainer_config((configs / "config_xdeepfm.yaml").string());
  ASSERT_TRUE(xdeepfm.ok()) << xdeepfm.status().to_string();
  EXPECT_EQ(xdeepfm->hyper.model, ModelKind::kXdeepfm);
  EXPECT_EQ(xdeepfm->dense_model_config().cin_layer_sizes, (std::vector<int>{128, 32}));
  EXPECT_EQ(xdeepfm->dense_model_config().fc_sizes, (std::vector<int>{512, 256, 128}));
  EXPECT_EQ(xdeepfm->mf_dim(), 8);          // the fields' width
  EXPECT_TRUE(xdeepfm->sparse.show_scale);  // the CIN diverges on summed hot-key steps
  // Its fields share one width: slot_dims refused at load, naming the key (it failed only when
  // the model was built, after --print_model_root and the sweep had accepted it).
  auto xdeepfm_dims = load_trainer_config((configs / "config_xdeepfm.yaml").string(),
                                          {"hyper_parameters.slot_dims={1: 4}"});
  ASSERT_FALSE(xdeepfm_dims.ok());
  EXPECT_NE(xdeepfm_dims.status().to_string().find("hyper_parameters.slot_dims"), std::string::npos)
      << xdeepfm_dims.status().to_string();
  // fat_deepffm: ffm's rows, one width for the trainer and the table part (gpubox_server's
  // loader): PaddleRec's shapes, 39 fields x (sparse_feature_dim 10 - 1).
  auto fat = load_trainer_config((configs / "config_fat_deepffm.yaml").string());
  ASSERT_TRUE(fat.ok()) << fat.status().to_string();
  EXPECT_EQ(fat->hyper.model, ModelKind::kFatDeepffm);
  EXPECT_EQ(fat->mf_dim(), (26 + 13) * 9);
  EXPECT_EQ(fat->hyper.fc_sizes, (std::vector<int>{1600, 1600}));
  auto fat_rows = table::load_sparse_config((configs / "config_fat_deepffm.yaml").string());
  ASSERT_TRUE(fat_rows.ok()) << fat_rows.status().to_string();
  EXPECT_EQ(fat_rows->mf_dim, fat->mf_dim());
  // ffm: the trainer and the table part (gpubox_server's loader) give rows one width.
  auto ffm = load_trainer_config((configs / "config_ffm.yaml").string());
  ASSERT_TRUE(ffm.ok()) << ffm.status().to_string();
  EXPECT_EQ(ffm->hyper.model, ModelKind::kFfm);
  EXPECT_EQ(ffm->mf_dim(), (26 + 13) * 8);
  auto ffm_rows = table::load_sparse_config((configs / "config_ffm.yaml").string());
  ASSERT_TRUE(ffm_rows.ok()) << ffm_rows.status().to_string();
  EXPECT_EQ(ffm_rows->mf_dim, ffm->mf_dim());
  for (const auto& [bad, named] : std::vector<std::pair<std::string, std::string>>{
           {"hyper_parameters.sparse_feature_dim=40", "hyper_parameters.sparse_feature_dim"},
           {"hyper_parameters.sparse_feature_dim=1", "hyper_parameters.sparse_feature_dim is 1"},
           {"hyper_parameters.slot_dims={1: 4}", "hyper_parameters.slot_dims"}}) {
    auto refused = load_trainer_config((configs / "config_ffm.yaml").string(), {bad});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().to_string().find(named), std::string::npos)
        << refused.status().to_string();
  }
  auto synthetic = load_trainer_config((configs / "config_synthetic.yaml").string());
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().to_string();
  EXPECT_EQ(synthetic->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam);
  EXPECT_FALSE(synthetic->runner.shuffle);
}

TEST_F(ConfigTest, EveryPartArrivesFromTheOverrides) {
  const std::string path = write("sub/c.yaml",
                                 "runner:\n  epochs: 2\n  pipe_command: cat\n"
                                 "hyper_parameters:\n  optimizer:\n    class: Adam\n"
                                 "    learning_rate: 0.001\n");
  auto c = load_trainer_config(
      path, {"runner.epochs=7", "hyper_parameters.fc_sizes=[64, 32]",
             "hyper_parameters.model=wide_deep", "hyper_parameters.optimizer.class=sgd",
             "runner.pipe_command=python3 reader.py --sep=: x", "runner.infer_batch_size=64",
             "runner.save_mode=checkpoint", "runner.collective_timeout_s=2.5",
             "hyper_parameters.sparse_optimizer.class=adam", "runner.max_line_bytes=4096",
             "runner.slot_token_order=feasign:slot", "runner.label_name=label",
             "runner.criteo_dense=log", "hyper_parameters.sparse_inputs_slots=3",
             "hyper_parameters.slot_names=[u, i]", "hyper_parameters.dense_input_dim=2"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->runner.epochs, 7);
  EXPECT_EQ(c->runner.infer_batch_size, 64);
  EXPECT_EQ(c->runner.save_mode, SaveKind::kCheckpoint);
  EXPECT_DOUBLE_EQ(c->runner.collective_timeout_s, 2.5);
  EXPECT_EQ(c->hyper.fc_sizes, (std::vector<int>{64, 32}));
  EXPECT_EQ(c->hyper.model, ModelKind::kWideDeep);
  EXPECT_EQ(c->hyper.optimizer.kind, DenseOptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(c->hyper.optimizer.learning_rate, 0.001f);
  EXPECT_EQ(c->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam);
  // The dataset part.
  EXPECT_EQ(c->dataset.pipe_command, "python3 reader.py --sep=: x");
  EXPECT_EQ(c->dataset.max_line_bytes, 4096u);
  EXPECT_TRUE(c->dataset.feasign_first);
  EXPECT_EQ(c->dataset.label_name, "label");
  EXPECT_EQ(c->dataset.criteo_dense, dataset::CriteoDense::kLog);
  EXPECT_EQ(c->sparse_slot_names(), (std::vector<std::string>{"u", "i"}));
  EXPECT_EQ(c->dense_model_config().dense_dim, 2);

  auto bad = load_trainer_config(path, {"runner.epochs=x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), path + ": -o: runner.epochs: expected an integer, got 'x'");
  // The dataset part's own checks name the config and the key.
  bad = load_trainer_config(path,
                            {"runner.data_format=criteo", "hyper_parameters.dense_input_dim=2"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path + ": runner.data_format criteo needs 26 sparse "
                                               "slots"),
            std::string::npos)
      << bad.status().message();
  bad = load_trainer_config(
      path, {"hyper_parameters.sparse_inputs_slots=3", "hyper_parameters.slot_names=[click, i]"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("clashes with runner.label_name"), std::string::npos)
      << bad.status().message();
}

TEST_F(ConfigTest, TheTablePartDerivesMfDimAndTheSeedOnce) {
  auto c = load_trainer_config(write("sub/s.yaml",
                                     "runner:\n  seed: 5\n"
                                     "hyper_parameters:\n  sparse_feature_dim: 17\n"
                                     "  sparse_optimizer:\n    class: shared_adam\n"
                                     "    learning_rate: 0.2\n    mf_learning_rate: 0.3\n"
                                     "    mf_initial_range: 0.01\n    embedx_threshold: 5\n"
                                     "    beta1_decay_rate: 0.8\n    seed: 99\n"
                                     "    delete_after_unseen_days: 7\n"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const table::AccessorConfig& so = c->sparse;
  EXPECT_EQ(so.optimizer.kind, table::SparseOptimizerKind::kSharedAdam);
  EXPECT_FLOAT_EQ(so.optimizer.learning_rate, 0.2f);
  EXPECT_FLOAT_EQ(so.optimizer.mf_learning_rate, 0.3f);
  EXPECT_FLOAT_EQ(so.optimizer.mf_initial_range, 0.01f);
  EXPECT_FLOAT_EQ(so.embedx_threshold, 5.0f);
  EXPECT_FLOAT_EQ(so.optimizer.beta1_decay_rate, 0.8f);
  EXPECT_FLOAT_EQ(so.delete_after_unseen_days, 7.0f);
  EXPECT_EQ(so.seed, 5u ^ 99u);
  EXPECT_EQ(so.mf_dim, 16);
  EXPECT_EQ(c->mf_dim(), 16);
  EXPECT_EQ(c->dense_model_config().mf_dim, 16);
  EXPECT_EQ(c->runner.seed, 5u);
}

// PaddleRec's dnn/online.yaml writes `train_data_dir: ["data/sample_data/train/"]`: a list of
// folders is read, in order, as one (each epoch one pass over all their files); one folder or a
// one-item list is the plain folder.
TEST_F(ConfigTest, ADataFolderListIsReadInOrderAsOne) {
  for (const char* d : {"b_day", "a_day", "test1", "test2"}) fs::create_directories(dir_ / d);
  write("b_day/part-1", "x\n");
  write("b_day/part-0", "x\n");
  write("a_day/part-0", "x\n");
  write("test1/t", "x\n");
  write("test2/t", "x\n");
  const std::string cfg = write("online.yaml",
                                "runner:\n  train_data_dir: [\"b_day/\", a_day]\n"
                                "  test_data_dir: [test2, test1]\n");
  auto c = load_trainer_config(cfg);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const std::string root = fs::absolute(dir_).lexically_normal().string();
  EXPECT_EQ(c->runner.train_data_dir, root + "/b_day/");
  EXPECT_EQ(c->runner.train_data_dirs.size(), 2u);
  const RunPlan plan = plan_run(c->runner);
  ASSERT_EQ(plan.pass_files.size(), 1u);
  EXPECT_EQ(plan.pass_files[0],
            (std::vector<std::string>{root + "/b_day/part-0", root + "/b_day/part-1",
                                      root + "/a_day/part-0"}));
  EXPECT_EQ(plan.test_files, (std::vector<std::string>{root + "/test2/t", root + "/test1/t"}));
  // A one-item list is the folder; -o takes a list too; a missing folder is named.
  auto one = load_trainer_config(write("one.yaml", "runner:\n  train_data_dir: [a_day]\n"));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->runner.train_data_dir, root + "/a_day");
  EXPECT_TRUE(one->runner.train_data_dirs.empty());
  auto o =
      load_trainer_config(cfg, {"runner.train_data_dir=[" + root + "/a_day, " + root + "/nope]"});
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->runner.train_data_dirs, (std::vector<std::string>{root + "/a_day", root + "/nope"}));
  try {
    plan_run(o->runner);
    ADD_FAILURE() << "a missing folder of the list was not named";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(root + "/nope"), std::string::npos) << e.what();
  }
  // [] would read as unset: refused naming the key.
  auto none = load_trainer_config(write("none.yaml", "runner:\n  train_data_dir: []\n"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().to_string().find("none.yaml:2: runner.train_data_dir"), std::string::npos)
      << none.status().to_string();
  auto bad = load_trainer_config(write("bad.yaml", "runner:\n  train_data_dir: [[a]]\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("bad.yaml:2: runner.train_data_dir"), std::string::npos)
      << bad.status().to_string();
}

TEST(ConfigDefaults, DenseOptimizerDefaultsAreTheTables) {
  const auto c = trainer_config_from(config::ConfigDocument::defaults());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const DenseOptimizerConfig plain;
  EXPECT_EQ(c->hyper.optimizer.kind, plain.kind);
  EXPECT_EQ(c->hyper.optimizer.learning_rate, plain.learning_rate);
  EXPECT_EQ(c->hyper.optimizer.beta1, plain.beta1);
  EXPECT_EQ(c->hyper.optimizer.beta2, plain.beta2);
  EXPECT_EQ(c->hyper.optimizer.epsilon, plain.epsilon);
  EXPECT_EQ(c->runner.metrics_path, "log/metrics.jsonl");
  EXPECT_EQ(c->runner.epochs, 1);
  EXPECT_EQ(c->num_sparse_slots(), 26);
}

// runner.sync_mode with runner.use_fleet and runner.use_gpu, as PaddleRec's configs combine
// them: every mode by name; use_fleet without sync_mode is Collective (on GPUs; with a sync_mode
// shown but left empty too, as configs/config_collective.yaml shows it); unknown values name the
// key.
TEST_F(ConfigTest, SyncModeAndUseFleetCombinations) {
  const std::string path = write("modes.yaml", "runner:\n  epochs: 1\n");
  const std::pair<const char*, SyncMode> modes[] = {{"gpubox", SyncMode::kGpubox},
                                                    {"async", SyncMode::kAsync},
                                                    {"sync", SyncMode::kSync},
                                                    {"geo", SyncMode::kGeo}};
  for (const auto& [name, mode] : modes) {
    for (const char* fleet : {"true", "false"}) {
      auto c = load_trainer_config(path, {std::string("runner.sync_mode=") + name,
                                          std::string("runner.use_fleet=") + fleet});
      ASSERT_TRUE(c.ok()) << name << " " << fleet << ": " << c.status().to_string();
      EXPECT_EQ(c->runner.sync_mode, mode);
      EXPECT_FALSE(c->runner.collective) << name << " " << fleet;
    }
  }
  auto plain = load_trainer_config(path);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->runner.sync_mode, SyncMode::kGpubox);
  EXPECT_EQ(plain->runner.geo_step, 100);
  EXPECT_EQ(plain->runner.dense_sync_steps, 1);
  EXPECT_FALSE(plain->runner.collective);
  auto collective = load_trainer_config(path, {"runner.use_fleet=true"});
  ASSERT_TRUE(collective.ok()) << collective.status().to_string();
  EXPECT_TRUE(collective->runner.collective);
  EXPECT_EQ(collective->runner.sync_mode, SyncMode::kGpubox);  // the gpubox schedule, replicated
  const std::string empty_mode =
      write("empty_mode.yaml", "runner:\n  use_fleet: true\n  sync_mode:\n  use_gpu: true\n");
  auto shown_empty = load_trainer_config(empty_mode);
  ASSERT_TRUE(shown_empty.ok()) << shown_empty.status().to_string();
  EXPECT_TRUE(shown_empty->runner.collective);
  auto shipped =
      load_trainer_config(std::string(GPUBOX_SOURCE_DIR) + "/configs/config_collective.yaml");
  ASSERT_TRUE(shipped.ok()) << shipped.status().to_string();
  EXPECT_TRUE(shipped->runner.collective);
  auto cpu_fleet = load_trainer_config(path, {"runner.use_fleet=true", "runner.use_gpu=false"});
  ASSERT_FALSE(cpu_fleet.ok());
  EXPECT_NE(cpu_fleet.status().message().find("runner.use_fleet"), std::string::npos);
  EXPECT_NE(cpu_fleet.status().message().find("runner.use_gpu"), std::string::npos);
  auto unknown = load_trainer_config(path, {"runner.sync_mode=heter"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("runner.sync_mode"), std::string::npos);
  auto zero = load_trainer_config(path, {"runner.geo_step=0"});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("runner.geo_step"), std::string::npos);
}

}  // namespace
}  // namespace gpubox::trainer

namespace gpubox::trainer {
namespace {

// A PaddleRec config has no hyper_parameters.model: the network is the one its model folder
// (workspace, else the models/rank/<name>/ folder it sits in) names, or a refusal naming it.
TEST_F(ConfigTest, APaddleRecModelFolderNamesTheNetworkOrIsRefused) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  const auto load = [&](const std::string& folder, const std::string& text,
                        const std::vector<std::string>& overrides = {}) {
    return load_in(folder, text, overrides);
  };
  auto wide_deep = load("PaddleRec/models/rank/wide_deep", yaml);
  ASSERT_TRUE(wide_deep.ok()) << wide_deep.status().to_string();
  EXPECT_EQ(wide_deep->hyper.model, config::ModelKind::kWideDeep);
  EXPECT_NE(wide_deep->hyper.model_source.find("the config's folder"), std::string::npos);
  EXPECT_EQ(wide_deep->model_keys.at("hyper_parameters.model"), "wide_deep");

  auto by_workspace = load("elsewhere", "workspace: \"models/rank/deepfm\"\n" + yaml);
  ASSERT_TRUE(by_workspace.ok()) << by_workspace.status().to_string();
  EXPECT_EQ(by_workspace->hyper.model, config::ModelKind::kDeepFm);
  EXPECT_EQ(by_workspace->hyper.model_source,
            "PaddleRec's model folder (workspace "
            "models/rank/deepfm)");

  auto fm = load("PaddleRec/models/rank/fm", yaml);
  ASSERT_TRUE(fm.ok()) << fm.status().to_string();
  EXPECT_EQ(fm->hyper.model, config::ModelKind::kFm);
  // dlrm's bottom output (bot_layer_sizes, [512, 256, 64, 16] by default) and embeddings meet.
  auto dlrm =
      load("PaddleRec/models/rank/dlrm", yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n");
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->hyper.model, config::ModelKind::kDlrm);

  auto xdeepfm = load("PaddleRec/models/rank/xdeepfm", yaml);
  ASSERT_TRUE(xdeepfm.ok()) << xdeepfm.status().to_string();
  EXPECT_EQ(xdeepfm->dense_model_config().kind, config::ModelKind::kXdeepfm);

  auto dcn = load("PaddleRec/models/rank/dcn", yaml);
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.model, config::ModelKind::kDcn);
  EXPECT_EQ(dcn->dense_model_config().kind, config::ModelKind::kDcn);

  // ffm's folder: rows of one factor (sparse_feature_dim - 1 = 8) per field, 26 slots and 13
  // dense features by default.
  auto ffm = load("PaddleRec/models/rank/ffm", yaml);
  ASSERT_TRUE(ffm.ok()) << ffm.status().to_string();
  EXPECT_EQ(ffm->hyper.model, config::ModelKind::kFfm);
  EXPECT_EQ(ffm->mf_dim(), (26 + 13) * 8);
  EXPECT_EQ(ffm->dense_model_config().mf_dim, (26 + 13) * 8);

  auto deepfefm = load("PaddleRec/models/rank/deepfefm", yaml);
  ASSERT_TRUE(deepfefm.ok()) << deepfefm.status().to_string();
  EXPECT_EQ(deepfefm->dense_model_config().kind, config::ModelKind::kDeepFefm);
  EXPECT_EQ(deepfefm->mf_dim(), 8);  // one embedding per key, as the dnn's
  // What differs from PaddleRec's net is said at start.
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDeepFefm).find("quantised"),
            std::string::npos);
  EXPECT_EQ(differences_from_paddlerec(config::ModelKind::kDnn), "");
  // dcn's shared cross weights and dlrm's batch norm and class-blind Adam (their net.py and
  // static_model.py) are said too.
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDcn).find("share one weight vector"),
            std::string::npos);
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDlrm)
                .find("the 2-wide output layer's too with hyper_parameters.dlrm_output softmax2"),
            std::string::npos);
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDlrm).find("whatever optimizer.class"),
            std::string::npos);
  // dcn_v2's dense values without PaddleRec's Linear, no dropout, its non-lazy Adam.
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDcnV2).find("no dropout"),
            std::string::npos);
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDcnV2).find("no lazy_mode"),
            std::string::npos);
  // deepfm's FM over the slots alone and its embeddings one narrower than PaddleRec's.
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDeepFm).find("slots' embeddings only"),
            std::string::npos);
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kDeepFm).find("sparse_feature_dim - 1"),
            std::string::npos);

  auto autoint = load("PaddleRec/models/rank/autoint", yaml);
  ASSERT_TRUE(autoint.ok()) << autoint.status().to_string();
  EXPECT_EQ(autoint->dense_model_config().kind, config::ModelKind::kAutoint);

  // fat_deepffm's folder: ffm's rows (8 values per field, 26 slots and 13 dense features).
  auto fat = load("PaddleRec/models/rank/fat_deepffm", yaml);
  ASSERT_TRUE(fat.ok()) << fat.status().to_string();
  EXPECT_EQ(fat->dense_model_config().kind, config::ModelKind::kFatDeepffm);
  EXPECT_EQ(fat->mf_dim(), (26 + 13) * 8);
  EXPECT_EQ(fat->dense_model_config().mf_dim, (26 + 13) * 8);
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kFatDeepffm).find("no dropout"),
            std::string::npos);
  // gpubox_server's loader (the table part) makes the same rows from the folder alone, for ffm's
  // folder too; another folder's network reads one factor per key, and the key, set, wins.
  for (const char* folder : {"fat_deepffm", "ffm"}) {
    auto rows = table::load_sparse_config(
        (dir_ / "PaddleRec/models/rank" / folder / "config.yaml").string());
    ASSERT_TRUE(rows.ok()) << rows.status().to_string();
    EXPECT_EQ(rows->mf_dim, (26 + 13) * 8) << folder;
  }
  auto dnn_rows =
      table::load_sparse_config((dir_ / "PaddleRec/models/rank/fat_deepffm/config.yaml").string(),
                                {"hyper_parameters.model=dnn"});
  ASSERT_TRUE(dnn_rows.ok()) << dnn_rows.status().to_string();
  EXPECT_EQ(dnn_rows->mf_dim, 8);

  // flen's folder: its groups must cover the 26 numbered slots of this config.
  auto flen = load("PaddleRec/models/rank/flen", yaml);
  ASSERT_FALSE(flen.ok());
  EXPECT_NE(flen.status().message().find("field_group_sizes group 22 slots, but the data has 26"),
            std::string::npos)
      << flen.status().to_string();
  flen =
      load("PaddleRec/models/rank/flen", yaml, {"hyper_parameters.field_group_sizes=[13, 3, 10]"});
  ASSERT_TRUE(flen.ok()) << flen.status().to_string();
  EXPECT_EQ(flen->dense_model_config().kind, config::ModelKind::kFlen);
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kFlen).find("batch norm"),
            std::string::npos);

  auto difm = load("PaddleRec/models/rank/difm", yaml);
  ASSERT_FALSE(difm.ok());
  const std::string what = difm.status().message();
  EXPECT_NE(
      what.find("names PaddleRec's network 'difm', which GPUBox does not build (it builds "
                "dnn, wide_deep, wide, deepfm, dcn_v2, fm, dcn, dlrm, xdeepfm, ffm, deepfefm, "
                "autoint, flen, fat_deepffm)"),
      std::string::npos)
      << what;
  EXPECT_NE(what.find("-o hyper_parameters.model=dnn"), std::string::npos) << what;
  // Set knowingly, the key wins over the folder.
  auto knowingly = load("PaddleRec/models/rank/difm", yaml, {"hyper_parameters.model=dnn"});
  ASSERT_TRUE(knowingly.ok()) << knowingly.status().to_string();
  EXPECT_EQ(knowingly->hyper.model, config::ModelKind::kDnn);
  EXPECT_EQ(knowingly->hyper.model_source, "hyper_parameters.model");

  auto plain = load("plain", yaml);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->hyper.model, config::ModelKind::kDnn);
  EXPECT_NE(plain->hyper.model_source.find("the default"), std::string::npos);
}

// PaddleRec's dlrm folder turns batch norm on (its MLPLayer always normalises) and says so at
// start; other folders and GPUBox's own configs keep none unless they ask; geo and networks
// without hidden layers refuse it, naming the key.
TEST_F(ConfigTest, BatchNormIsPaddleRecDlrmsDefaultAndOtherwiseAskedFor) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  const auto load = [&](const std::string& folder, const std::string& text,
                        const std::vector<std::string>& overrides = {}) {
    return load_in(folder, text, overrides);
  };
  auto dlrm =
      load("PaddleRec/models/rank/dlrm", yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n");
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  // Its MLPLayer always normalises: batch norm unless the key says otherwise; other folders and
  // GPUBox's configs keep none unless they ask.
  EXPECT_TRUE(dlrm->dense_model_config().batch_norm);
  auto dlrm_plain =
      load("PaddleRec/models/rank/dlrm", yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n",
           {"hyper_parameters.dnn_batch_norm=false"});
  ASSERT_TRUE(dlrm_plain.ok()) << dlrm_plain.status().to_string();
  EXPECT_FALSE(dlrm_plain->dense_model_config().batch_norm);
  auto wide_deep = load("PaddleRec/models/rank/wide_deep", yaml);
  ASSERT_TRUE(wide_deep.ok()) << wide_deep.status().to_string();
  EXPECT_FALSE(wide_deep->dense_model_config().batch_norm);
  auto dlrm_gpubox = load("elsewhere", yaml +
                                           "hyper_parameters:\n  model: dlrm\n  "
                                           "sparse_feature_dim: 16\n");
  ASSERT_TRUE(dlrm_gpubox.ok()) << dlrm_gpubox.status().to_string();
  EXPECT_FALSE(dlrm_gpubox->dense_model_config().batch_norm);
  auto dnn_bn = load("elsewhere", yaml, {"hyper_parameters.dnn_batch_norm=true"});
  ASSERT_TRUE(dnn_bn.ok()) << dnn_bn.status().to_string();
  EXPECT_TRUE(dnn_bn->dense_model_config().batch_norm);
  // geo's summed moves would overshoot the running statistics: refused, naming both keys.
  auto geo = load("PaddleRec/models/rank/dlrm",
                  yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n", {"runner.sync_mode=geo"});
  ASSERT_FALSE(geo.ok());
  EXPECT_NE(geo.status().message().find("dnn_batch_norm is not built for runner.sync_mode geo"),
            std::string::npos)
      << geo.status().to_string();
  EXPECT_NE(geo.status().message().find("PaddleRec's dlrm folder"), std::string::npos);
  // A network without hidden layers refuses it, naming the key; autoint only without a dnn.
  for (const std::vector<std::string>& no_dnn :
       {std::vector<std::string>{"hyper_parameters.model=wide"},
        {"hyper_parameters.model=fm"},
        {"hyper_parameters.model=autoint", "hyper_parameters.fc_sizes=[]"}}) {
    std::vector<std::string> overrides = no_dnn;
    overrides.push_back("hyper_parameters.dnn_batch_norm=true");
    auto refused = load("elsewhere", yaml, overrides);
    ASSERT_FALSE(refused.ok()) << no_dnn[0];
    EXPECT_NE(refused.status().message().find("hyper_parameters.dnn_batch_norm=true normalises "
                                              "after every hidden layer"),
              std::string::npos)
        << refused.status().to_string();
  }
  // gpubox_train's start line says when the folder's default turned it on, and only then.
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    EXPECT_TRUE(doc.ok()) << doc.status().to_string();
    return doc.ok() ? dnn_batch_norm_note(*doc) : std::string();
  };
  EXPECT_NE(note("PaddleRec/models/rank/dlrm", {}).find("PaddleRec's dlrm folder's default"),
            std::string::npos);
  EXPECT_EQ(note("PaddleRec/models/rank/dlrm", {"hyper_parameters.dnn_batch_norm=true"}), "");
  EXPECT_EQ(note("elsewhere", {"hyper_parameters.model=dlrm"}), "");
  auto autoint_dnn = load("elsewhere", yaml,
                          {"hyper_parameters.model=autoint", "hyper_parameters.fc_sizes=[8]",
                           "hyper_parameters.dnn_batch_norm=true"});
  EXPECT_TRUE(autoint_dnn.ok()) << autoint_dnn.status().to_string();
}

// top_layer_sizes' last 2 picks PaddleRec's two-class output in its dlrm folder only (where the
// norm is on); elsewhere it means one logit, as before dlrm_output. The start line says whether
// the output is normalised, and softmax2 without the norm is warned of (both ReLU'd outputs can
// die), whether the folder or the key chose it.
TEST_F(ConfigTest, TopLayerSizesLast2IsTheTwoClassOutputInPaddleRecsDlrmFolderOnly) {
  const std::string yaml =
      "hyper_parameters:\n  optimizer:\n    class: SGD\n  sparse_feature_dim: 16\n"
      "  top_layer_sizes: [64, 2]\n";
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    return doc.ok() ? dlrm_output_note(*doc) : doc.status().to_string();
  };
  const std::string folder = "PaddleRec/models/rank/dlrm";
  auto paddlerec = load_in(folder, yaml);
  ASSERT_TRUE(paddlerec.ok()) << paddlerec.status().to_string();
  EXPECT_EQ(paddlerec->dense_model_config().dlrm_output, DlrmOutput::kSoftmax2);
  EXPECT_EQ(paddlerec->hyper.fc_sizes, std::vector<int>{64});
  EXPECT_EQ(paddlerec->hyper.optimizer.kind, DenseOptimizerKind::kAdam);  // its net's
  EXPECT_NE(note(folder, {}).find("ReLU'd and batch-normalised"), std::string::npos);
  EXPECT_EQ(dlrm_output_warning(*paddlerec), "");
  const std::vector<std::string> no_norm = {"hyper_parameters.dnn_batch_norm=false"};
  auto plain = load_in(folder, yaml, no_norm);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->hyper.dlrm_output, DlrmOutput::kSoftmax2);
  EXPECT_NE(note(folder, no_norm).find("not batch-normalised"), std::string::npos);
  EXPECT_NE(dlrm_output_warning(*plain).find("training stalls for good"), std::string::npos);
  // -o fc_sizes sets the hidden layers only: the file's top_layer_sizes width still chooses.
  auto resized = load_in(folder, yaml, {"hyper_parameters.fc_sizes=[32]"});
  ASSERT_TRUE(resized.ok()) << resized.status().to_string();
  EXPECT_EQ(resized->hyper.fc_sizes, std::vector<int>{32});
  EXPECT_EQ(resized->dense_model_config().dlrm_output, DlrmOutput::kSoftmax2);
  // Elsewhere: GPUBox's dlrm with one logit over the same hidden layers, no line, no warning.
  auto gpubox = load_in("elsewhere", yaml, {"hyper_parameters.model=dlrm"});
  ASSERT_TRUE(gpubox.ok()) << gpubox.status().to_string();
  EXPECT_EQ(gpubox->dense_model_config().dlrm_output, DlrmOutput::kLogit);
  EXPECT_EQ(gpubox->hyper.fc_sizes, std::vector<int>{64});
  EXPECT_EQ(gpubox->hyper.optimizer.kind, DenseOptimizerKind::kSgd);  // as written
  EXPECT_EQ(note("elsewhere", {"hyper_parameters.model=dlrm"}), "");
  EXPECT_EQ(dlrm_output_warning(*gpubox), "");
  // Asked for there, without the norm: built, and warned of.
  auto asked = load_in("elsewhere", yaml,
                       {"hyper_parameters.model=dlrm", "hyper_parameters.dlrm_output=softmax2"});
  ASSERT_TRUE(asked.ok()) << asked.status().to_string();
  EXPECT_EQ(asked->hyper.dlrm_output, DlrmOutput::kSoftmax2);
  EXPECT_NE(dlrm_output_warning(*asked).find("without hyper_parameters.dnn_batch_norm"),
            std::string::npos);
}

}  // namespace
}  // namespace gpubox::trainer
