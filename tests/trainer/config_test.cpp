// gpubox_train's config: the shipped configs load with their documented values, the trainer
// part maps keys onto TrainerConfig, the dataset and table parts arrive through their modules
// (one derivation of mf_dim and of the sparse seed), and struct defaults equal the key table's.
// PaddleRec's model folders (the network they name, batch norm and dlrm's output they choose) are
// config_paddlerec_test.cpp. The document itself (unknown keys, types, ranges, overrides, paths)
// is tested in tests/common/config_document_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config_document.hpp"
#include "table/sparse_config.hpp"
#include "tests/trainer/config_test_util.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/unread_keys.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer {
namespace {
namespace fs = std::filesystem;

using config_test::ConfigTest;

// The path of configs/`name`.
std::string shipped_path(const std::string& name) {
  return (fs::path(GPUBOX_SOURCE_DIR) / "configs" / name).string();
}

// configs/`name` as gpubox_train loads it, with `overrides`.
StatusOr<TrainerConfig> load_shipped(const std::string& name,
                                     const std::vector<std::string>& overrides = {}) {
  return load_trainer_config(shipped_path(name), overrides);
}

// Each override of `refusals` refused by configs/`name`, the refusal naming its second.
void expect_shipped_refuses(const std::string& name,
                            const std::vector<std::pair<std::string, std::string>>& refusals) {
  for (const auto& [bad, named] : refusals) {
    auto refused = load_shipped(name, {bad});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().to_string().find(named), std::string::npos)
        << refused.status().to_string();
  }
}

// config_gpubox.yaml: PaddleRec's dnn on the Criteo sample, its data folder found.
void expect_shipped_dnn() {
  auto dnn = load_shipped("config_gpubox.yaml");
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
}

// config_wide_deep.yaml, and config_deepfm.yaml and config_dcn.yaml over its hidden layers; dcn's
// cross keys overridden and refused.
void expect_shipped_wide_deepfm_and_dcn() {
  auto wide = load_shipped("config_wide_deep.yaml");
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  EXPECT_EQ(wide->hyper.model, ModelKind::kWideDeep);
  auto deepfm = load_shipped("config_deepfm.yaml");
  ASSERT_TRUE(deepfm.ok()) << deepfm.status().to_string();
  EXPECT_EQ(deepfm->hyper.model, ModelKind::kDeepFm);
  EXPECT_EQ(deepfm->hyper.fc_sizes, wide->hyper.fc_sizes);
  // Mean steps per hot key: with summed ones deepfm diverges on skewed keys (issue 29).
  EXPECT_TRUE(deepfm->sparse.show_scale);
  auto dcn = load_shipped("config_dcn.yaml");
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.model, ModelKind::kDcnV2);
  EXPECT_EQ(dcn->hyper.fc_sizes, wide->hyper.fc_sizes);
  EXPECT_EQ(dcn->hyper.cross_layers, 3);
  EXPECT_EQ(dcn->hyper.cross_rank, 0);
  EXPECT_EQ(dcn->hyper.dcn_structure, DcnStructure::kStacked);
  const DenseModelConfig dcn_model = dcn->dense_model_config();
  EXPECT_EQ(dcn_model.cross_layers, 3);
  auto low = load_shipped("config_dcn.yaml", {"hyper_parameters.cross_rank=16",
                                              "hyper_parameters.dcn_structure=parallel",
                                              "hyper_parameters.cross_layers=2"});
  ASSERT_TRUE(low.ok()) << low.status().to_string();
  EXPECT_EQ(low->dense_model_config().cross_rank, 16);
  EXPECT_EQ(low->dense_model_config().cross_layers, 2);
  EXPECT_EQ(low->dense_model_config().dcn_structure, DcnStructure::kParallel);
  expect_shipped_refuses(
      "config_dcn.yaml",
      {{"hyper_parameters.cross_layers=0", "hyper_parameters.cross_layers"},
       {"hyper_parameters.cross_rank=-1", "hyper_parameters.cross_rank"},
       {"hyper_parameters.dcn_structure=mixture", "hyper_parameters.dcn_structure"}});
}

// config_dlrm.yaml and config_xdeepfm.yaml: their own layers; xdeepfm's one field width.
void expect_shipped_dlrm_and_xdeepfm() {
  auto dlrm = load_shipped("config_dlrm.yaml");
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->hyper.model, ModelKind::kDlrm);
  EXPECT_EQ(dlrm->dense_model_config().bot_layer_sizes, (std::vector<int>{512, 256, 64, 16}));
  EXPECT_EQ(dlrm->mf_dim() + 1, 16);  // the bottom output's width
  EXPECT_EQ(dlrm->hyper.fc_sizes, (std::vector<int>{512, 256}));
  auto xdeepfm = load_shipped("config_xdeepfm.yaml");
  ASSERT_TRUE(xdeepfm.ok()) << xdeepfm.status().to_string();
  EXPECT_EQ(xdeepfm->hyper.model, ModelKind::kXdeepfm);
  EXPECT_EQ(xdeepfm->dense_model_config().cin_layer_sizes, (std::vector<int>{128, 32}));
  EXPECT_EQ(xdeepfm->dense_model_config().fc_sizes, (std::vector<int>{512, 256, 128}));
  EXPECT_EQ(xdeepfm->mf_dim(), 8);          // the fields' width
  EXPECT_TRUE(xdeepfm->sparse.show_scale);  // the CIN diverges on summed hot-key steps
  // Its fields share one width: slot_dims refused at load, naming the key (it failed only when
  // the model was built, after --print_model_root and the sweep had accepted it).
  auto xdeepfm_dims = load_shipped("config_xdeepfm.yaml", {"hyper_parameters.slot_dims={1: 4}"});
  ASSERT_FALSE(xdeepfm_dims.ok());
  EXPECT_NE(xdeepfm_dims.status().to_string().find("hyper_parameters.slot_dims"), std::string::npos)
      << xdeepfm_dims.status().to_string();
}

// config_fat_deepffm.yaml and config_ffm.yaml: one row width for the trainer and the table part
// (gpubox_server's loader); ffm's field keys refused.
void expect_shipped_field_aware_rows() {
  // fat_deepffm: ffm's rows, PaddleRec's shapes, 39 fields x (sparse_feature_dim 10 - 1).
  auto fat = load_shipped("config_fat_deepffm.yaml");
  ASSERT_TRUE(fat.ok()) << fat.status().to_string();
  EXPECT_EQ(fat->hyper.model, ModelKind::kFatDeepffm);
  EXPECT_EQ(fat->mf_dim(), (26 + 13) * 9);
  EXPECT_EQ(fat->hyper.fc_sizes, (std::vector<int>{1600, 1600}));
  auto fat_rows = table::load_sparse_config(shipped_path("config_fat_deepffm.yaml"));
  ASSERT_TRUE(fat_rows.ok()) << fat_rows.status().to_string();
  EXPECT_EQ(fat_rows->mf_dim, fat->mf_dim());
  auto ffm = load_shipped("config_ffm.yaml");
  ASSERT_TRUE(ffm.ok()) << ffm.status().to_string();
  EXPECT_EQ(ffm->hyper.model, ModelKind::kFfm);
  EXPECT_EQ(ffm->mf_dim(), (26 + 13) * 8);
  auto ffm_rows = table::load_sparse_config(shipped_path("config_ffm.yaml"));
  ASSERT_TRUE(ffm_rows.ok()) << ffm_rows.status().to_string();
  EXPECT_EQ(ffm_rows->mf_dim, ffm->mf_dim());
  expect_shipped_refuses(
      "config_ffm.yaml",
      {{"hyper_parameters.sparse_feature_dim=40", "hyper_parameters.sparse_feature_dim"},
       {"hyper_parameters.sparse_feature_dim=1", "hyper_parameters.sparse_feature_dim is 1"},
       {"hyper_parameters.slot_dims={1: 4}", "hyper_parameters.slot_dims"}});
  // fm and deepfm without factors trained wide's and wide_deep's networks, unsaid; xdeepfm
  // stopped on a layer of no columns.
  auto fm = load_shipped("config_deepfm.yaml",
                         {"hyper_parameters.model=fm", "hyper_parameters.sparse_feature_dim=1"});
  ASSERT_FALSE(fm.ok());
  EXPECT_NE(fm.status().to_string().find("hyper_parameters.model=wide for what it would"),
            std::string::npos)
      << fm.status().to_string();
  expect_shipped_refuses("config_deepfm.yaml",
                         {{"hyper_parameters.sparse_feature_dim=1",
                           "hyper_parameters.model=wide_deep for what it would"}});
  expect_shipped_refuses("config_xdeepfm.yaml", {{"hyper_parameters.sparse_feature_dim=1",
                                                  "xdeepfm's CIN and DNN take each key's factor"}});
}

// Each helper's first failed ASSERT ends the test, as one body's would.
TEST_F(ConfigTest, ShippedConfigsLoadWithTheirDocumentedValues) {
  ASSERT_NO_FATAL_FAILURE(expect_shipped_dnn());
  ASSERT_NO_FATAL_FAILURE(expect_shipped_wide_deepfm_and_dcn());
  ASSERT_NO_FATAL_FAILURE(expect_shipped_dlrm_and_xdeepfm());
  ASSERT_NO_FATAL_FAILURE(expect_shipped_field_aware_rows());
  auto synthetic = load_shipped("config_synthetic.yaml");
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().to_string();
  EXPECT_EQ(synthetic->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam);
  EXPECT_FALSE(synthetic->runner.shuffle);
}

// A load of a save trained in another dense precision than the config computes in is warned,
// naming both and the -o that computes as it trained; one in the same precision is not.
TEST_F(ConfigTest, ASaveOfAnotherDensePrecisionIsWarnedOfWhenLoaded) {
  auto cfg = load_shipped("config_gpubox.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const std::string key = "hyper_parameters.dense_precision";
  ASSERT_EQ(cfg->model_keys.at(key), "fp32");
  ::testing::internal::CaptureStderr();
  note_saved_precision({{key, "bf16"}}, *cfg, "saves/3");
  note_saved_precision({{key, "fp32"}}, *cfg, "saves/4");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("save saves/3 was trained with hyper_parameters.dense_precision=bf16; this "
                     "run computes its dense net in fp32 (the config's)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("add -o hyper_parameters.dense_precision=bf16"), std::string::npos) << log;
  EXPECT_EQ(log.find("saves/4"), std::string::npos) << log;
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
  // The disk tier's folder and the saves' overlapping: the rerun was refused, the first run not.
  for (const auto& [disk, saves] : std::vector<std::pair<std::string, std::string>>{
           {"same", "same"}, {"saves/disk", "saves"}, {"disk", "disk/saves"}}) {
    bad = load_trainer_config(path, {"runner.rocksdb_path=" + (dir_ / disk).string(),
                                     "runner.model_save_path=" + (dir_ / saves).string()});
    ASSERT_FALSE(bad.ok()) << disk << " " << saves;
    EXPECT_NE(bad.status().message().find("overlap: the disk tier's folder is wiped"),
              std::string::npos)
        << bad.status().message();
  }
  EXPECT_TRUE(load_trainer_config(path, {"runner.rocksdb_path=" + (dir_ / "disk").string(),
                                         "runner.model_save_path=" + (dir_ / "disk2").string()})
                  .ok());
  // The label named as the dense field: every line failed "bad_label: missing label".
  bad = load_trainer_config(path, {"runner.dense_name=click"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("runner.label_name and runner.dense_name are both 'click'"),
            std::string::npos)
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
// No training data at all (PaddleRec's offline-inference configs): refused, naming the keys
// and what evaluates a save instead.
TEST_F(ConfigTest, AConfigWithoutTrainingDataIsRefusedPointingToInfer) {
  write("test1/t", "x\n");
  auto infer_only = load_trainer_config(write("infer.yaml", "runner:\n  test_data_dir: test1\n"));
  ASSERT_TRUE(infer_only.ok()) << infer_only.status().to_string();
  try {
    plan_run(infer_only->runner);
    ADD_FAILURE() << "a config without training data was planned";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("neither runner.train_data_dir nor runner.pass_dirs"), std::string::npos)
        << what;
    EXPECT_NE(what.find("--mode infer"), std::string::npos) << what;
  }
}

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

// runner.shrink_every: never by default (runs as before), pass and epoch read, anything else
// refused naming the key; runner.cold_after_days acts only through a shrink, so with never it is
// refused naming both keys, not left a silent no-op.
TEST(TrainerConfigTest, ShrinkEveryAndColdAfterDays) {
  auto plain = load_shipped("config_gpubox.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->runner.shrink_every, ShrinkEvery::kNever);
  auto pass = load_shipped("config_gpubox.yaml", {"runner.shrink_every=pass"});
  ASSERT_TRUE(pass.ok()) << pass.status().to_string();
  EXPECT_EQ(pass->runner.shrink_every, ShrinkEvery::kPass);
  auto epoch =
      load_shipped("config_gpubox.yaml", {"runner.shrink_every=epoch", "runner.cold_after_days=3"});
  ASSERT_TRUE(epoch.ok()) << epoch.status().to_string();
  EXPECT_EQ(epoch->runner.shrink_every, ShrinkEvery::kEpoch);
  expect_shipped_refuses("config_gpubox.yaml",
                         {{"runner.shrink_every=day", "runner.shrink_every"}});
  for (const char* never : {"runner.shrink_every=never", "runner.epochs=1"}) {
    auto cold = load_shipped("config_gpubox.yaml", {never, "runner.cold_after_days=3"});
    ASSERT_FALSE(cold.ok()) << never;
    EXPECT_NE(cold.status().message().find("runner.cold_after_days"), std::string::npos);
    EXPECT_NE(cold.status().message().find("runner.shrink_every"), std::string::npos);
  }
}

// A key of another runner.sync_mode set off its default is said at start (the shipped configs
// list every key at its default: nothing said for them).
TEST(OtherModeKeys, AKeyOffItsDefaultThatTheModeDoesNotReadIsNamed) {
  const auto note = [](const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load(shipped_path("config_gpubox.yaml"), overrides);
    EXPECT_TRUE(doc.ok()) << doc.status().to_string();
    return doc.ok() ? unread_keys_note(*doc) : std::string();
  };
  EXPECT_EQ(note({}), "");
  EXPECT_EQ(note({"runner.geo_step=100"}), "");  // its default
  const std::string gpubox = note({"runner.geo_step=5", "runner.split_file_list=true"});
  EXPECT_NE(gpubox.find("not read in runner.sync_mode gpubox: runner.geo_step (read in geo "
                        "mode); runner.split_file_list (read in async, sync and geo mode)"),
            std::string::npos)
      << gpubox;
  EXPECT_EQ(note({"runner.sync_mode=geo", "runner.geo_step=5", "runner.split_file_list=true"}), "");
  const std::string async =
      note({"runner.sync_mode=async", "runner.geo_step=5", "runner.dense_sync_steps=7"});
  EXPECT_NE(async.find("runner.sync_mode async: runner.geo_step (read in geo mode)"),
            std::string::npos)
      << async;
  EXPECT_EQ(async.find("dense_sync_steps"), std::string::npos) << async;
  EXPECT_NE(note({"runner.sync_mode=geo", "runner.dense_sync_steps=7"}).find("dense_sync_steps"),
            std::string::npos);
  // The card tier's keys in a PS mode (no card tier there): said.
  const std::string sync = note({"runner.sync_mode=sync", "runner.card_memory_mb=100"});
  EXPECT_NE(sync.find("runner.sync_mode sync: runner.card_memory_mb (read in gpubox mode)"),
            std::string::npos)
      << sync;
  // pass_dirs replace train_data_dir (the shipped config sets one): said.
  EXPECT_NE(note({"runner.pass_dirs=[a, b]"})
                .find("configs/data/sample_data/train) is not read: runner.pass_dirs "
                      "replaces it"),
            std::string::npos)
      << note({"runner.pass_dirs=[a, b]"});
  EXPECT_EQ(note({"runner.pass_dirs=[a, b]", "runner.train_data_dir="}), "");
  // Another network's keys (PaddleRec's cross_num on a dnn or deepfm config) trained without a
  // word: said, naming the networks that read them.
  const std::string dnn = note({"hyper_parameters.cross_layers=5", "hyper_parameters.head_num=4"});
  EXPECT_NE(dnn.find("set, but not read by the network it trains, dnn (hyper_parameters.model): "
                     "hyper_parameters.cross_layers (dcn, dcn_v2); hyper_parameters.head_num "
                     "(autoint)"),
            std::string::npos)
      << dnn;
  EXPECT_EQ(note({"hyper_parameters.model=dcn", "hyper_parameters.cross_layers=5"}), "");
  // Another optimizer class's keys (beta1 under SGD, initial_g2sum under sparse adam): said,
  // naming the classes that read them; the class's own are not.
  const std::string sgd =
      note({"hyper_parameters.optimizer.class=SGD", "hyper_parameters.optimizer.beta1=0.5",
            "hyper_parameters.sparse_optimizer.class=adam",
            "hyper_parameters.sparse_optimizer.initial_g2sum=1",
            "hyper_parameters.sparse_optimizer.beta1_decay_rate=0.5"});
  EXPECT_NE(sgd.find("set, but not read by the optimizers the run steps with (optimizer.class "
                     "SGD, the rows' adam): hyper_parameters.optimizer.beta1 (optimizer.class "
                     "Adam); hyper_parameters.sparse_optimizer.initial_g2sum "
                     "(sparse_optimizer.class adagrad)"),
            std::string::npos)
      << sgd;
  EXPECT_EQ(sgd.find("beta1_decay_rate"), std::string::npos) << sgd;
  EXPECT_EQ(note({"hyper_parameters.optimizer.class=Adagrad",
                  "hyper_parameters.optimizer.initial_accumulator_value=0.1",
                  "hyper_parameters.optimizer.epsilon=1e-6",
                  "hyper_parameters.sparse_optimizer.initial_g2sum=1"}),
            "");
  EXPECT_NE(note({"hyper_parameters.sparse_optimizer.ada_epsilon=1e-6"})
                .find("sparse_optimizer.ada_epsilon (sparse_optimizer.class adam, shared_adam)"),
            std::string::npos);
}

}  // namespace
}  // namespace gpubox::trainer
