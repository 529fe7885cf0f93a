// Config loader: the shipped configs load, unknown keys name the closest valid key, wrong types
// and bad values name the key, -o overrides, relative paths resolve against the config's folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "trainer/config/config_loader.hpp"

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
  // The error message of a load that must fail.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    auto config = load_trainer_config(write("sub/bad.yaml", text), overrides);
    EXPECT_FALSE(config.ok()) << text;
    return config.ok() ? "" : config.status().message();
  }
  fs::path dir_;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(ConfigTest, ShippedConfigsLoadWithTheirDocumentedValues) {
  const fs::path configs = fs::path(GPUBOX_SOURCE_DIR) / "configs";
  auto dnn = load_trainer_config((configs / "config_gpubox.yaml").string());
  ASSERT_TRUE(dnn.ok()) << dnn.status().to_string();
  EXPECT_EQ(dnn->num_sparse_slots(), 26);
  EXPECT_EQ(dnn->hyper.sparse_feature_dim, 9);
  EXPECT_EQ(dnn->mf_dim(), 8);
  EXPECT_EQ(dnn->hyper.sparse_optimizer.mf_dim, 8);
  EXPECT_EQ(dnn->hyper.dense_input_dim, 13);
  EXPECT_EQ(dnn->hyper.fc_sizes, (std::vector<int>{512, 256, 128, 32}));
  EXPECT_EQ(dnn->hyper.model, ModelKind::kDnn);
  EXPECT_EQ(dnn->hyper.optimizer.kind, DenseOptimizerKind::kAdam);
  const fs::path train = dnn->runner.train_data_dir;
  EXPECT_TRUE(train.is_absolute());
  EXPECT_TRUE(fs::exists(train / "sample_train.txt")) << train;
  const DenseModelConfig model = dnn->dense_model_config();
  EXPECT_EQ(model.slots, 26);
  EXPECT_EQ(model.mf_dim, 8);

  auto wide = load_trainer_config((configs / "config_wide_deep.yaml").string());
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  EXPECT_EQ(wide->hyper.model, ModelKind::kWideDeep);
  auto synthetic = load_trainer_config((configs / "config_synthetic.yaml").string());
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().to_string();
}

TEST_F(ConfigTest, ShippedConfigsCommentEveryKeyAndShowEveryValidKey) {
  for (const char* name :
       {"config_gpubox.yaml", "config_wide_deep.yaml", "config_synthetic.yaml"}) {
    const fs::path path = fs::path(GPUBOX_SOURCE_DIR) / "configs" / name;
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::string text, line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      text += line + "\n";
      const auto first = line.find_first_not_of(' ');
      if (first == std::string::npos || line[first] == '#') continue;
      const auto colon = line.find(':');
      ASSERT_NE(colon, std::string::npos) << name << ":" << number;
      const bool top_section =
          first == 0 && line.find_first_not_of(' ', colon + 1) == std::string::npos;
      if (!top_section) {
        EXPECT_NE(line.find('#'), std::string::npos) << name << ":" << number << " has no comment";
      }
    }
    for (const std::string& key : trainer_config_keys()) {
      const std::string leaf = key.substr(key.rfind('.') + 1);
      EXPECT_NE(text.find(leaf + ":"), std::string::npos) << name << " does not show " << key;
    }
  }
}

TEST_F(ConfigTest, UnknownKeyNamesTheClosestValidKey) {
  std::string e = error_of("runner:\n  train_batch_szie: 5\n");
  EXPECT_TRUE(contains(e, "unknown key 'runner.train_batch_szie'")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'runner.train_batch_size'")) << e;
  EXPECT_TRUE(contains(e, "bad.yaml:2: ")) << e;  // file and line of the bad key
  e = error_of("hyper_parameters:\n  optimiser:\n    learning_rate: 0.1\n");
  EXPECT_TRUE(contains(e, "'hyper_parameters.optimiser'")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'hyper_parameters.optimizer'")) << e;
  e = error_of("runer:\n  epochs: 1\n");
  EXPECT_TRUE(contains(e, "unknown key 'runer' (did you mean 'runner'?)")) << e;
  e = error_of("hyper_parameters:\n  sparse_optimizer:\n    mf_learnig_rate: 0.1\n");
  EXPECT_TRUE(contains(e, "did you mean 'hyper_parameters.sparse_optimizer.mf_learning_rate'"))
      << e;
}

TEST_F(ConfigTest, WrongTypesAndValuesNameTheKey) {
  std::string e = error_of("runner:\n  thread_num: 2\n  epochs: abc\n");
  EXPECT_TRUE(contains(e, "bad.yaml:3: runner.epochs: expected an integer, got 'abc'")) << e;
  e = error_of("runner:\n  epochs: 1.5\n");
  EXPECT_TRUE(contains(e, "runner.epochs: expected an integer")) << e;
  e = error_of("hyper_parameters:\n  fc_sizes: 512\n");
  EXPECT_TRUE(contains(e, "hyper_parameters.fc_sizes: expected a list of integers")) << e;
  e = error_of("hyper_parameters:\n  fc_sizes: [512, 0]\n");
  EXPECT_TRUE(contains(e, "hyper_parameters.fc_sizes: 0 is out of range")) << e;
  e = error_of("runner:\n  use_auc: maybe\n");
  EXPECT_TRUE(contains(e, "runner.use_auc: expected true or false")) << e;
  e = error_of("runner:\n  train_batch_size: 0\n");
  EXPECT_TRUE(contains(e, "runner.train_batch_size: 0 is out of range")) << e;
  e = error_of("hyper_parameters:\n  model: deepfm\n");
  EXPECT_TRUE(contains(e, "hyper_parameters.model: 'deepfm' is not one of: dnn, wide_deep, wide"))
      << e;
  e = error_of("runner: 5\n");
  EXPECT_TRUE(contains(e, "runner: expected a map of keys")) << e;
  e = error_of("runner:\n  sync_mode: async\n");
  EXPECT_TRUE(contains(e, "runner.sync_mode")) << e;
  e = error_of("hyper_parameters:\n  sparse_inputs_slots: 4\n  slot_names: [a, b]\n");
  EXPECT_TRUE(contains(e, "slot_names has 2 names")) << e;
  e = error_of("runner:\n  epochs: [1\n");
  EXPECT_TRUE(contains(e, "YAML syntax error")) << e;
  auto missing = load_trainer_config((dir_ / "nope.yaml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "nope.yaml"));
}

TEST_F(ConfigTest, OverridesApplyInOrderWithTypes) {
  const std::string path = write("sub/c.yaml",
                                 "runner:\n  epochs: 2\n  pipe_command: cat\n"
                                 "hyper_parameters:\n  optimizer:\n    class: Adam\n"
                                 "    learning_rate: 0.001\n");
  auto c = load_trainer_config(
      path,
      {"runner.epochs=7", "hyper_parameters.fc_sizes=[64, 32]", "hyper_parameters.model=wide_deep",
       "hyper_parameters.optimizer.class=sgd", "runner.pipe_command=python3 reader.py --sep=: x",
       "runner.use_gpu=False", "runner.epochs=9", "hyper_parameters.sparse_optimizer.class=adam"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->runner.epochs, 9);
  EXPECT_EQ(c->hyper.fc_sizes, (std::vector<int>{64, 32}));
  EXPECT_EQ(c->hyper.model, ModelKind::kWideDeep);
  EXPECT_EQ(c->hyper.optimizer.kind, DenseOptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(c->hyper.optimizer.learning_rate, 0.001f);
  EXPECT_EQ(c->runner.pipe_command, "python3 reader.py --sep=: x");
  EXPECT_FALSE(c->runner.use_gpu);
  EXPECT_EQ(c->hyper.sparse_optimizer.kind, table::SparseOptimizerKind::kAdam);

  auto bad = load_trainer_config(path, {"runner.epoch=3"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "unknown key 'runner.epoch'"));
  EXPECT_TRUE(contains(bad.status().message(), "did you mean 'runner.epochs'"));
  bad = load_trainer_config(path, {"runner.epochs=x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "runner.epochs: expected an integer, got 'x'"))
      << bad.status().message();
  bad = load_trainer_config(path, {"runner.epochs"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "expected key=value"));
}

TEST_F(ConfigTest, RelativePathsResolveAgainstTheConfigFolder) {
  const std::string path = write("sub/c.yaml",
                                 "runner:\n  train_data_dir: data/train\n  test_data_dir: ../test\n"
                                 "  model_save_path: /abs/model\n  pass_dirs: [day1, ./day2]\n"
                                 "  metrics_path: log/m.jsonl\n");
  auto c = load_trainer_config(path);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const fs::path sub = fs::absolute(dir_ / "sub").lexically_normal();
  EXPECT_EQ(c->runner.train_data_dir, (sub / "data/train").string());
  EXPECT_EQ(c->runner.test_data_dir, (fs::absolute(dir_) / "test").lexically_normal().string());
  EXPECT_EQ(c->runner.model_save_path, "/abs/model");
  EXPECT_EQ(c->runner.pass_dirs,
            (std::vector<std::string>{(sub / "day1").string(), (sub / "day2").string()}));
  EXPECT_EQ(c->runner.metrics_path, (sub / "log/m.jsonl").string());
  EXPECT_EQ(c->config_path, path);
  // An unset path keeps its default, relative to the working directory.
  auto d = load_trainer_config(write("sub/d.yaml", "runner:\n  epochs: 1\n"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->runner.metrics_path, "log/metrics.jsonl");
  EXPECT_EQ(d->runner.train_data_dir, "");
  // -o paths are relative to the working directory.
  auto o = load_trainer_config(path, {"runner.train_data_dir=elsewhere"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->runner.train_data_dir,
            (fs::current_path() / "elsewhere").lexically_normal().string());
}

TEST_F(ConfigTest, SparseOptimizerKeysMapOntoTheTableConfig) {
  auto c = load_trainer_config(write("sub/s.yaml",
                                     "hyper_parameters:\n  sparse_feature_dim: 17\n"
                                     "  sparse_optimizer:\n    class: shared_adam\n"
                                     "    learning_rate: 0.2\n    mf_learning_rate: 0.3\n"
                                     "    mf_initial_range: 0.01\n    embedx_threshold: 5\n"
                                     "    beta1_decay_rate: 0.8\n    seed: 99\n"
                                     "    delete_after_unseen_days: 7\n"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const table::SparseOptimizerConfig& so = c->hyper.sparse_optimizer;
  EXPECT_EQ(so.kind, table::SparseOptimizerKind::kSharedAdam);
  EXPECT_FLOAT_EQ(so.learning_rate, 0.2f);
  EXPECT_FLOAT_EQ(so.mf_learning_rate, 0.3f);
  EXPECT_FLOAT_EQ(so.mf_initial_range, 0.01f);
  EXPECT_FLOAT_EQ(so.embedx_threshold, 5.0f);
  EXPECT_FLOAT_EQ(so.beta1_decay_rate, 0.8f);
  EXPECT_FLOAT_EQ(so.delete_after_unseen_days, 7.0f);
  EXPECT_EQ(so.seed, 99u);
  EXPECT_EQ(so.mf_dim, 16);
}

TEST(EditDistance, Basics) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("epoch", "epochs"), 1u);
  const std::vector<std::string> keys = trainer_config_keys();
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_NE(std::find(keys.begin(), keys.end(), "runner.card_memory_mb"), keys.end());
}

}  // namespace
}  // namespace gpubox::trainer
