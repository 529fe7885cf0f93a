// YAML config reading (keys, overrides, slot count vs list, data folder) and `gpubox_data stat`
// through its library function and through the binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "dataset/dataset_config_yaml.hpp"
#include "dataset/stat.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::ScratchDir;

// The shipped PaddleRec sample (see /work/shared/data/README.md).
constexpr const char* kSample = "/work/shared/data/criteo_slot_sample/sample_train.txt";

TEST(DatasetConfigYaml, ReadsPaddleRecKeysAndOverrides) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.file("data/train"));
  dir.write("data/train/b.txt", "");
  dir.write("data/train/a.txt", "");
  dir.write("data/train/.hidden", "");
  dir.write("data/train/oracle.json", "{}");
  const std::string cfg = dir.write("config.yaml",
                                    "runner:\n"
                                    "  train_data_dir: \"data/train\"\n"
                                    "  thread_num: 3\n"
                                    "  train_batch_size: 64\n"
                                    "  pipe_command: \"gzip -dc\"\n"
                                    "hyper_parameters:\n"
                                    "  sparse_inputs_slots: 27\n"
                                    "  dense_input_dim: 13\n");
  StatusOr<DatasetYamlConfig> c = load_dataset_config(cfg, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->dataset.thread_num, 3);
  EXPECT_EQ(c->dataset.batch_size, 64);
  EXPECT_EQ(c->dataset.pipe_command, "gzip -dc");
  EXPECT_EQ(c->dataset.dense_dim, 13);
  ASSERT_EQ(c->dataset.slots.size(), 26u);  // PaddleRec: the count includes the label
  EXPECT_EQ(c->dataset.slots.front(), "1");
  EXPECT_EQ(c->dataset.slots.back(), "26");
  EXPECT_EQ(c->dataset.data_format, DataFormat::kSlot);
  // Relative to the config's folder; sorted; hidden files and JSON metadata skipped.
  ASSERT_EQ(c->files.size(), 2u);
  EXPECT_EQ(std::filesystem::path(c->files[0]).filename(), "a.txt");

  c = load_dataset_config(
      cfg, {"runner.thread_num=5", "runner.strict_parse=true",
            "hyper_parameters.sparse_inputs_slots=[u, i]", "runner.data_format=multislot",
            "runner.new_key.deeper=1", "runner.train_data_dir=" + dir.file("data/train")});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->dataset.thread_num, 5);
  EXPECT_TRUE(c->dataset.strict_parse);
  EXPECT_EQ(c->dataset.slots, (std::vector<std::string>{"u", "i"}));
  EXPECT_EQ(c->dataset.data_format, DataFormat::kMultiSlot);
  c = load_dataset_config(cfg, {"runner.feasign_first=true", "runner.label_name=label",
                                "runner.dense_name=d", "runner.ignore_unknown_slots=true",
                                "runner.max_line_bytes=4096", "runner.criteo_dense=log"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->dataset.feasign_first);
  EXPECT_EQ(c->dataset.label_name, "label");
  EXPECT_EQ(c->dataset.dense_name, "d");
  EXPECT_TRUE(c->dataset.ignore_unknown_slots);
  EXPECT_EQ(c->dataset.max_line_bytes, 4096u);
  EXPECT_EQ(c->dataset.criteo_dense, CriteoDense::kLog);
  // A single file as the data "folder".
  c = load_dataset_config(cfg, {"runner.train_data_dir=" + dir.file("data/train/b.txt")});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->files, std::vector<std::string>{dir.file("data/train/b.txt")});
}

TEST(DatasetConfigYaml, ErrorsNameTheKeyOrFile) {
  ScratchDir dir;
  const std::string cfg = dir.write("c.yaml", "runner:\n  thread_num: many\n");
  StatusOr<DatasetYamlConfig> c = load_dataset_config(cfg, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("runner.thread_num"), std::string::npos);
  c = load_dataset_config(dir.file("missing.yaml"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("missing.yaml"), std::string::npos);
  c = load_dataset_config(dir.write("d.yaml", "runner:\n  data_format: parquet\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("parquet"), std::string::npos);
  c = load_dataset_config(dir.write("e.yaml", "runner:\n  train_data_dir: nowhere\n"), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nowhere"), std::string::npos);
  c = load_dataset_config(dir.write("f.yaml", "runner: {}\n"), {"no_equals_sign"});
  EXPECT_FALSE(c.ok());
}

TEST(Stat, ShippedSampleCountsAndJsonKeys) {
  if (!std::filesystem::exists(kSample)) GTEST_SKIP() << kSample << " is not on this machine";
  DatasetConfig c;
  c.slots = numbered_slots(27);
  c.dense_dim = 13;
  c.thread_num = 2;
  const StatReport r = run_stat(c, {kSample});
  ASSERT_TRUE(r.load_status.ok()) << r.load_status.to_string();
  EXPECT_EQ(r.stats.lines, 80u);
  EXPECT_EQ(r.stats.instances, 80u);
  EXPECT_EQ(r.stats.positives, 23u);  // data/README.md: 57 negatives, 23 positives
  EXPECT_EQ(r.stats.skipped_lines(), 0u);
  ASSERT_EQ(r.unique_keys_per_slot.size(), 26u);
  std::size_t max_slot = 0;
  for (std::size_t n : r.unique_keys_per_slot) max_slot = std::max(max_slot, n);
  EXPECT_LE(max_slot, 80u);
  EXPECT_GE(r.unique_keys, max_slot);
  const std::string json = stat_json(r);
  for (const char* key : {"files", "lines", "instances", "skipped_lines", "unique_keys",
                          "positives", "bytes", "seconds", "errors"}) {
    EXPECT_NE(json.find("\"" + std::string(key) + "\": "), std::string::npos) << key;
  }
  EXPECT_NE(json.find("\"instances\": 80,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"errors\": []"), std::string::npos) << json;
}

TEST(Stat, BadLinesAppearInJsonErrors) {
  ScratchDir dir;
  const std::string f =
      dir.write("d.txt", "click:1 1:5\nclick:1 1:x\n\nclick:3 1:5\nclick:0 1:\"q\n");
  DatasetConfig c;
  c.slots = {"1"};
  const StatReport r = run_stat(c, {f});
  ASSERT_TRUE(r.load_status.ok());
  const std::string json = stat_json(r);
  EXPECT_NE(json.find("\"skipped_lines\": 3,"), std::string::npos) << json;
  EXPECT_NE(json.find("{\"file\": " + json_quote(f) + ", \"line\": 2, \"reason\": \"bad_key\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"line\": 4, \"reason\": \"bad_label\""), std::string::npos) << json;
  EXPECT_NE(json.find("'1:\\\"q'"), std::string::npos) << "quotes escaped: " << json;
  EXPECT_EQ(json_quote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

#ifdef GPUBOX_DATA_BIN
struct RunResult {
  int exit_code;
  std::string out;
};

RunResult run(const std::string& args) {
  const std::string command = std::string(GPUBOX_DATA_BIN) + " " + args + " 2>/dev/null";
  RunResult r{-1, ""};
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(GpuboxDataBinary, GenThenStatJsonThenStrictFailure) {
  ScratchDir dir;
  RunResult gen = run("gen --out " + dir.file("gen") +
                      " --lines 3000 --files 3 --seed 5 --slots 4 "
                      "--dense 2 --vocab 100 --threads 2");
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  EXPECT_NE(gen.out.find("oracle: auc"), std::string::npos);
  const std::string cfg = dir.write("c.yaml",
                                    "runner:\n  train_data_dir: gen\n  thread_num: 2\n"
                                    "hyper_parameters:\n  sparse_inputs_slots: 5\n"
                                    "  dense_input_dim: 2\n");
  RunResult stat = run("stat --config " + cfg + " --json");
  ASSERT_EQ(stat.exit_code, 0) << stat.out;
  EXPECT_NE(stat.out.find("\"files\": 3,"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("\"instances\": 3000,"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("\"skipped_lines\": 0,"), std::string::npos) << stat.out;
  // A bad line: lenient exit 0 with the error listed; strict exit 1.
  std::ofstream(dir.file("gen/part-00001"), std::ios::app) << "click:1 oops\n";
  stat = run("stat --config " + cfg + " --json");
  EXPECT_EQ(stat.exit_code, 0);
  EXPECT_NE(stat.out.find("\"line\": 1001, \"reason\": \"bad_token\""), std::string::npos)
      << stat.out;
  stat = run("stat --config " + cfg + " -o runner.strict_parse=true --json");
  EXPECT_EQ(stat.exit_code, 1);
  EXPECT_NE(stat.out.find("strict_parse"), std::string::npos) << stat.out;
  // Unreadable file (pipe_command fails): exit 1.
  stat = run("stat --config " + cfg + " -o runner.pipe_command=false");
  EXPECT_EQ(stat.exit_code, 1);
  // Usage errors: exit 2.
  EXPECT_EQ(run("stat").exit_code, 2);
  EXPECT_EQ(run("frobnicate").exit_code, 2);
  // convert through the binary.
  RunResult conv = run("convert --from slot --to multislot --slots 4 --dense 2 " +
                       dir.file("gen/part-00000") + " " + dir.file("p0.multi"));
  EXPECT_EQ(conv.exit_code, 0) << conv.out;
  EXPECT_NE(conv.out.find("converted 1000 instances"), std::string::npos) << conv.out;
}
#endif

}  // namespace
}  // namespace gpubox::dataset
