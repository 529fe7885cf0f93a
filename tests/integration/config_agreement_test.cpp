// gpubox_train, gpubox_data and gpubox_server read one config the same way (#19 item 1): the
// same config gives the same dataset part and the same sparse rows' settings (seed and mf_dim
// included) through each binary's loader; the same bad config gives the same error text from
// the loaders and from the binaries themselves; and each part reads exactly the keys the key
// table says it reads, so no key is parsed and never read.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/config/config_document.hpp"
#include "dataset/dataset_config.hpp"
#include "table/sparse_config.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox {
namespace {
namespace fs = std::filesystem;

std::string describe(const table::AccessorConfig& c) {
  std::ostringstream out;
  out << name_of(table::kSparseOptimizerKindNames, c.optimizer.kind) << " mf_dim=" << c.mf_dim
      << " storage=" << name_of(table::kSparseStorageNames, c.storage)
      << " lr=" << c.optimizer.learning_rate << " g2=" << c.optimizer.initial_g2sum
      << " range=" << c.optimizer.initial_range << " bounds=" << c.optimizer.min_bound << ","
      << c.optimizer.max_bound << " l2=" << c.optimizer.weight_decay
      << " mf_lr=" << c.optimizer.mf_learning_rate << " mf_g2=" << c.optimizer.mf_initial_g2sum
      << " mf_range=" << c.optimizer.mf_initial_range << " mf_bounds=" << c.optimizer.mf_min_bound
      << "," << c.optimizer.mf_max_bound << " mf_l2=" << c.optimizer.mf_weight_decay
      << " b1=" << c.optimizer.beta1_decay_rate << " b2=" << c.optimizer.beta2_decay_rate
      << " eps=" << c.optimizer.ada_epsilon << " nonclk=" << c.nonclk_coeff
      << " clk=" << c.clk_coeff << " show_scale=" << c.show_scale
      << " embed_threshold=" << c.embed_threshold << " threshold=" << c.embedx_threshold
      << " decay=" << c.show_click_decay_rate << " delete=" << c.delete_threshold
      << " unseen=" << c.delete_after_unseen_days << " seed=" << c.seed;
  return out.str();
}

std::string describe(const dataset::DatasetConfig& c) {
  std::ostringstream out;
  out << name_of(dataset::kDataFormatNames, c.data_format) << " slots=";
  for (const std::string& s : c.slots) out << s << ",";
  out << " dense=" << c.dense_dim << " label=" << c.label_name << " dense_name=" << c.dense_name
      << " feasign_first=" << c.feasign_first << " ignore=" << c.ignore_unknown_slots
      << " pipe=" << c.pipe_command << " threads=" << c.thread_num << " batch=" << c.batch_size
      << " strict=" << c.strict_parse << " max_line=" << c.max_line_bytes
      << " criteo=" << name_of(dataset::kCriteoDenseNames, c.criteo_dense);
  return out.str();
}

class ConfigAgreement : public ::testing::Test {
 protected:
  ConfigAgreement() {
    dir_ = fs::temp_directory_path() / ("gpubox_config_agreement_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  ~ConfigAgreement() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(ConfigAgreement, TheThreeLoadersReadOneConfigTheSameWay) {
  const std::string path = write("c.yaml",
                                 "runner:\n  seed: 7\n  thread_num: 3\n  label_name: lbl\n"
                                 "  slot_token_order: \"feasign:slot\"\n  max_line_bytes: 4096\n"
                                 "hyper_parameters:\n  sparse_inputs_slots: 4\n"
                                 "  dense_input_dim: 2\n  sparse_feature_dim: 5\n"
                                 "  sparse_storage: bf16\n"
                                 "  sparse_optimizer:\n    class: shared_adam\n"
                                 "    initial_range: 0.5\n    embedx_threshold: 2\n"
                                 "    seed: 3\n");
  const std::vector<std::string> overrides = {
      "runner.train_batch_size=32", "hyper_parameters.sparse_optimizer.mf_initial_range=0.2"};
  auto trainer = trainer::load_trainer_config(path, overrides);
  auto data = dataset::load_dataset_config(path, overrides);
  auto server = table::load_sparse_config(path, overrides);
  ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  EXPECT_EQ(describe(trainer->dataset), describe(*data));
  EXPECT_EQ(describe(trainer->sparse), describe(*server));
  // The server derives the row exactly as the trainer: runner.seed mixed in, mf_dim from
  // sparse_feature_dim (it used to ignore runner.seed: rows started different on a server).
  EXPECT_EQ(server->seed, 7u ^ 3u);
  EXPECT_EQ(server->mf_dim, 4);
  EXPECT_EQ(server->storage, table::SparseStorage::kBf16);
  EXPECT_FLOAT_EQ(server->optimizer.mf_initial_range, 0.2f);
  EXPECT_EQ(data->batch_size, 32);
  EXPECT_EQ(data->slots, (std::vector<std::string>{"1", "2", "3"}));

  // Defaults: a config setting one unrelated key gives every part the key table's defaults,
  // which equal the plain structs' for the sparse row.
  const std::string minimal = write("m.yaml", "runner:\n  epochs: 2\n");
  auto t = trainer::load_trainer_config(minimal);
  auto d = dataset::load_dataset_config(minimal);
  auto s = table::load_sparse_config(minimal);
  ASSERT_TRUE(t.ok() && d.ok() && s.ok());
  EXPECT_EQ(describe(t->dataset), describe(*d));
  EXPECT_EQ(describe(t->sparse), describe(*s));
  EXPECT_EQ(describe(*s), describe(table::AccessorConfig{}));
  EXPECT_EQ(d->dense_dim, 13);  // gpubox_data stat used to default to 0
}

// A PaddleRec config names its network by its model folder and slot_dnn's dense features (none)
// by its reader: gpubox_server's loader resolves both as the trainer's does, so ffm's rows (a
// factor per field) are as wide on the server (issue 32).
TEST_F(ConfigAgreement, APaddleRecFolderShapesTheRowsAlikeInEveryLoader) {
  const std::string keys = "hyper_parameters:\n  sparse_inputs_slots: 5\n  sparse_feature_dim: 4\n";
  fs::create_directories(dir_ / "models/rank/ffm");
  const std::string ffm = write("models/rank/ffm/config.yaml", keys + "  dense_input_dim: 2\n");
  auto trainer = trainer::load_trainer_config(ffm);
  auto server = table::load_sparse_config(ffm);
  ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  EXPECT_EQ(trainer->hyper.model, config::ModelKind::kFfm);
  EXPECT_EQ(server->mf_dim, (4 + 2) * 3);
  EXPECT_EQ(describe(trainer->sparse), describe(*server));

  // slot_dnn's folder without dense_input_dim reads no dense features: ffm asked for there has
  // the sparse slots for fields, on the server too.
  fs::create_directories(dir_ / "models/rank/slot_dnn");
  const std::string slot_dnn = write("models/rank/slot_dnn/config.yaml", keys);
  const std::vector<std::string> as_ffm = {"hyper_parameters.model=ffm"};
  trainer = trainer::load_trainer_config(slot_dnn, as_ffm);
  server = table::load_sparse_config(slot_dnn, as_ffm);
  auto data = dataset::load_dataset_config(slot_dnn, as_ffm);
  ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->dense_dim, 0);
  EXPECT_EQ(server->mf_dim, 4 * 3);
  EXPECT_EQ(describe(trainer->sparse), describe(*server));

  // A folder naming a network GPUBox does not build: every loader refuses it alike.
  fs::create_directories(dir_ / "models/rank/difm");
  const std::string difm = write("models/rank/difm/config.yaml", keys);
  const Status t = trainer::load_trainer_config(difm).status();
  EXPECT_NE(t.message().find("names PaddleRec's network 'difm'"), std::string::npos)
      << t.to_string();
  EXPECT_EQ(table::load_sparse_config(difm).status().to_string(), t.to_string());
}

// Bad configs, each as a file (and optionally overrides), with the error every binary gives.
struct BadConfig {
  std::string text;
  std::vector<std::string> overrides;
  std::string error;  // the message after the file name
};

std::vector<BadConfig> bad_configs() {
  return {
      {"runner:\n  epochs: 1\n  strict_prase: true\n",
       {},
       ":3: unknown key 'runner.strict_prase' (did you mean 'runner.strict_parse'?)"},
      {"runner:\n  epochs: abc\n", {}, ":2: runner.epochs: expected an integer, got 'abc'"},
      {"hyper_parameters:\n  sparse_optimizer:\n    class: lamb\n",
       {},
       ":3: hyper_parameters.sparse_optimizer.class: expected one of "
       "sgd|adagrad|adam|shared_adam, got 'lamb'"},
      {"hyper_parameters:\n  model: difm\n",
       {},
       ":2: hyper_parameters.model: expected one of "
       "dnn|wide_deep|wide|deepfm|dcn_v2|fm|dcn|dlrm|xdeepfm|ffm|deepfefm|autoint|flen|fat_deepffm,"
       " "
       "got 'difm'"},
      {"runner:\n  data_format: parquet\n",
       {},
       ":2: runner.data_format: expected one of "
       "auto|slot|multislot|criteo|feat_idx|idx_value|avazu, got "
       "'parquet'"},
      {"runner:\n  epochs: 1\n",
       {"runner.max_line_bytes=1e12"},
       ": -o: runner.max_line_bytes: 1e12 is out of range [16, 1073741824]"},
      {"",
       {},
       ": the config is empty (expected a map of keys such as runner: and hyper_parameters:)"},
      {"- runner\n", {}, ": expected a map of keys at the top level, got a list"},
      {"hyper_parameters:\n  sparse_optimizer:\n    min_bound: 3\n    max_bound: 1\n",
       {},
       ": hyper_parameters.sparse_optimizer.min_bound (3) is greater than "
       "hyper_parameters.sparse_optimizer.max_bound (1)"},
  };
}

TEST_F(ConfigAgreement, TheSameBadConfigGivesTheSameErrorThroughEveryLoader) {
  int n = 0;
  for (const BadConfig& bad : bad_configs()) {
    const std::string path = write("bad" + std::to_string(n++) + ".yaml", bad.text);
    const Status t = trainer::load_trainer_config(path, bad.overrides).status();
    const Status d = dataset::load_dataset_config(path, bad.overrides).status();
    const Status s = table::load_sparse_config(path, bad.overrides).status();
    EXPECT_EQ(t.to_string(), "InvalidArgument: " + path + bad.error);
    EXPECT_EQ(d.to_string(), t.to_string());
    EXPECT_EQ(s.to_string(), t.to_string());
  }
}

// Keys the key table gives a part (Part bits) or any part.
std::set<std::string> keys_of(unsigned part) {
  std::set<std::string> out;
  for (const config::KeySpec& k : config::config_keys()) {
    if (part == 0 ? k.has_effect() : (k.parts & part) != 0) out.insert(k.name);
  }
  return out;
}

TEST_F(ConfigAgreement, EachPartReadsExactlyTheKeysTheTableGivesIt) {
  const config::ConfigDocument for_dataset = config::ConfigDocument::defaults();
  ASSERT_TRUE(dataset::dataset_config_from(for_dataset).ok());
  EXPECT_EQ(for_dataset.keys_read(), keys_of(config::kDataset));

  const config::ConfigDocument for_table = config::ConfigDocument::defaults();
  table::sparse_config_from(for_table);
  table::host_tier_config_from(for_table);
  EXPECT_EQ(for_table.keys_read(), keys_of(config::kTable));

  // gpubox_train reads every part: together, every key that has an effect, and no other.
  const config::ConfigDocument for_trainer = config::ConfigDocument::defaults();
  ASSERT_TRUE(trainer::trainer_config_from(for_trainer).ok());
  EXPECT_EQ(for_trainer.keys_read(), keys_of(0));
  std::set<std::string> own = keys_of(config::kTrainer);
  for (const std::string& k : keys_of(config::kDataset)) own.insert(k);
  for (const std::string& k : keys_of(config::kTable)) own.insert(k);
  EXPECT_EQ(own, keys_of(0));
}

#if defined(GPUBOX_TRAIN_BIN) && defined(GPUBOX_DATA_BIN) && defined(GPUBOX_SERVER_BIN)
// The line a binary printed to stderr after "<name>: ", and its exit code.
std::pair<int, std::string> error_line(const std::string& binary, const std::string& args) {
  const std::string command = binary + " " + args + " 2>&1 >/dev/null";
  std::string out;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  const std::string name = fs::path(binary).filename().string() + ": ";
  std::string line;
  std::istringstream lines(out);
  for (std::string l; std::getline(lines, l);) {
    if (l.compare(0, name.size(), name) == 0) line = l.substr(name.size());
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, line};
}

TEST_F(ConfigAgreement, TheThreeBinariesReportTheSameErrors) {
  int n = 0;
  for (const BadConfig& bad : bad_configs()) {
    const std::string path = write("bin" + std::to_string(n++) + ".yaml", bad.text);
    std::string overrides;
    for (const std::string& o : bad.overrides) overrides += " -o " + o;
    const auto train = error_line(GPUBOX_TRAIN_BIN, "--config " + path + overrides);
    const auto data = error_line(GPUBOX_DATA_BIN, "stat --config " + path + overrides);
    const auto server = error_line(GPUBOX_SERVER_BIN, "--port 0 --config " + path + overrides);
    const std::string want = "InvalidArgument: " + path + bad.error;
    EXPECT_EQ(train.second, want);
    EXPECT_EQ(data.second, want);
    EXPECT_EQ(server.second, want);
    EXPECT_NE(train.first, 0);
    EXPECT_NE(data.first, 0);
    EXPECT_NE(server.first, 0);
  }
}
#endif

}  // namespace
}  // namespace gpubox
