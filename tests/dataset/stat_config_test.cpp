// The dataset part of a config (dataset_config_from: keys, defaults of the key table, errors),
// slot-name checks at scale, and `gpubox_data stat` through its library function and through
// the binary: it loads exactly as training does (same loader, defaults and strictness), its
// JSON is valid UTF-8 whatever the data holds, and empty or odd data folders are reported.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/config/config_document.hpp"
#include "common/json.hpp"
#include "dataset/dataset_config.hpp"
#include "dataset/stat.hpp"
#include "tests/common/json_check.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

// The PaddleRec Criteo sample shipped with the repository (80 lines, 23 positives).
const std::string kSampleDir = std::string(GPUBOX_SOURCE_DIR) + "/configs/data/sample_data/train";
const std::string kSample = kSampleDir + "/sample_train.txt";

TEST(DatasetConfig, ReadsItsKeysWithTheTablesDefaults) {
  ScratchDir dir;
  const std::string cfg = dir.write("config.yaml",
                                    "runner:\n"
                                    "  thread_num: 3\n"
                                    "  train_batch_size: 64\n"
                                    "  pipe_command: \"gzip -dc\"\n");
  StatusOr<DatasetConfig> c = load_dataset_config(cfg);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->thread_num, 3);
  EXPECT_EQ(c->batch_size, 64);
  EXPECT_EQ(c->pipe_command, "gzip -dc");
  // Not set: the key table's defaults, the trainer's too (dense_input_dim 13, 26 slots).
  EXPECT_EQ(c->dense_dim, 13);
  ASSERT_EQ(c->slots.size(), 26u);  // PaddleRec: the count includes the label
  EXPECT_EQ(c->slots.front(), "1");
  EXPECT_EQ(c->slots.back(), "26");
  EXPECT_EQ(c->data_format, DataFormat::kAuto);
  EXPECT_EQ(c->max_line_bytes, std::size_t{1} << 20);
  EXPECT_EQ(c->label_name, "click");
  EXPECT_FALSE(c->strict_parse);
  EXPECT_TRUE(c->ignore_unknown_slots);
  EXPECT_TRUE(c->multislot_order.empty());
  // gzip is no Python reader: nothing is appended (pipe_command_args auto).
  EXPECT_TRUE(c->pipe_arguments.empty());

  c = load_dataset_config(
      cfg,
      {"runner.thread_num=5", "runner.strict_parse=true", "hyper_parameters.sparse_inputs_slots=3",
       "hyper_parameters.slot_names=[u, i]", "runner.data_format=multislot",
       "runner.slot_token_order=feasign:slot", "runner.label_name=label", "runner.dense_name=d",
       "runner.ignore_unknown_slots=false", "runner.max_line_bytes=4096", "runner.criteo_dense=log",
       "runner.multislot_order=[i, label, d, u]", "runner.pipe_command_args=config_and_utils",
       "runner.pipe_utils_path=/opt/PaddleRec/tools/utils/static_ps"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->thread_num, 5);
  EXPECT_TRUE(c->strict_parse);
  EXPECT_EQ(c->slots, (std::vector<std::string>{"u", "i"}));
  EXPECT_EQ(c->data_format, DataFormat::kMultiSlot);
  EXPECT_TRUE(c->feasign_first);
  EXPECT_EQ(c->label_name, "label");
  EXPECT_EQ(c->dense_name, "d");
  EXPECT_FALSE(c->ignore_unknown_slots);
  EXPECT_EQ(c->max_line_bytes, 4096u);
  EXPECT_EQ(c->criteo_dense, CriteoDense::kLog);
  EXPECT_EQ(c->multislot_order, (std::vector<std::string>{"i", "label", "d", "u"}));
  EXPECT_EQ(c->pipe_arguments,
            (std::vector<std::string>{std::filesystem::absolute(cfg).lexically_normal().string(),
                                      "/opt/PaddleRec/tools/utils/static_ps"}));
}

TEST(DatasetConfig, ErrorsNameTheFileAndKey) {
  ScratchDir dir;
  StatusOr<DatasetConfig> c =
      load_dataset_config(dir.write("c.yaml", "runner:\n  thread_num: many\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            dir.file("c.yaml") + ":2: runner.thread_num: expected an integer, got 'many'");
  c = load_dataset_config(dir.file("missing.yaml"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("missing.yaml"), std::string::npos);
  c = load_dataset_config(dir.write("d.yaml", "runner:\n  data_format: parquet\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            dir.file("d.yaml") +
                ":2: runner.data_format: expected one of "
                "auto|slot|multislot|criteo|feat_idx|idx_value|avazu, got 'parquet'");
  // A key only the old dataset reader knew is now refused like any unknown key.
  c = load_dataset_config(dir.write("e.yaml", "runner:\n  feasign_first: true\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("unknown key 'runner.feasign_first'"), std::string::npos);
  c = load_dataset_config(dir.write("f.yaml", "runner: {}\n"), {"no_equals_sign"});
  EXPECT_FALSE(c.ok());
}

// Unique names of the given count: "s0", "s1", ...
std::vector<std::string> names(std::size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back("s" + std::to_string(i));
  return out;
}

TEST(SlotNames, DuplicatesFoundAgainstASetOracle) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    DatasetConfig c;
    c.slots.clear();
    const std::size_t n = rng() % 40;
    for (std::size_t i = 0; i < n; ++i) c.slots.push_back("s" + std::to_string(rng() % 60));
    const bool has_duplicate = std::set<std::string>(c.slots.begin(), c.slots.end()).size() < n;
    const Status st = validate(c);
    EXPECT_EQ(st.ok(), !has_duplicate) << st.to_string();
    if (!st.ok()) {
      EXPECT_NE(st.message().find("is declared twice"), std::string::npos);
    }
  }
}

// A million slots: the duplicate check must not be quadratic (it was: 5e11 comparisons here,
// hours; sorting takes a fraction of a second). The test's limit is ctest's timeout.
TEST(SlotNames, AMillionSlotsAreCheckedInNLogN) {
  DatasetConfig c;
  c.slots = names(1000000);
  EXPECT_TRUE(validate(c).ok());
  c.slots.back() = "s0";
  const Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "slot name 's0' is declared twice");
}

TEST(Stat, ShippedSampleCountsAndJsonKeys) {
  DatasetConfig c;
  c.slots = numbered_slots(27);
  c.dense_dim = 13;
  c.thread_num = 2;
  const StatReport r = run_stat(c, {kSample});
  ASSERT_TRUE(r.load_status.ok()) << r.load_status.to_string();
  EXPECT_EQ(r.stats.lines, 80u);
  EXPECT_EQ(r.stats.instances, 80u);
  EXPECT_EQ(r.stats.positives, 23u);
  EXPECT_EQ(r.stats.skipped_lines(), 0u);
  ASSERT_EQ(r.unique_keys_per_slot.size(), 26u);
  std::size_t max_slot = 0;
  for (std::size_t n : r.unique_keys_per_slot) max_slot = std::max(max_slot, n);
  EXPECT_LE(max_slot, 80u);
  EXPECT_GE(r.unique_keys, max_slot);
  const std::string json = stat_json(r);
  EXPECT_TRUE(gpubox::testing::JsonChecker::valid(json)) << json;
  for (const char* key : {"files", "lines", "instances", "skipped_lines", "unique_keys",
                          "positives", "bytes", "seconds", "errors", "skipped_entries"}) {
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
}

// Files that hold no valid instance (every line malformed, or empty) are what training refuses:
// the text says so, as it does for a folder with no file; one valid line is enough.
TEST(Stat, NoValidInstanceWarnsAsTrainingWouldRefuseIt) {
  ScratchDir dir;
  DatasetConfig c;
  c.slots = {"1"};
  c.dense_dim = 0;
  const std::string warning = "warning: instances: 0 (no line is a valid instance";
  for (const std::string text : {"garbage\nclick:1 1:x\n", ""}) {
    const StatReport r = run_stat(c, {dir.write("bad.txt", text)});
    ASSERT_TRUE(r.load_status.ok());
    EXPECT_NE(stat_text(r).find(warning), std::string::npos) << stat_text(r);
  }
  const StatReport good = run_stat(c, {dir.write("good.txt", "garbage\nclick:1 1:5\n")});
  EXPECT_EQ(stat_text(good).find(warning), std::string::npos) << stat_text(good);
}

// A load that fails (a file that cannot be read) counts no unique keys, and says so rather than
// printing "unique keys: 0" as if the data held none.
TEST(Stat, AFailedLoadPrintsNoUniqueKeyCount) {
  ScratchDir dir;
  DatasetConfig c;
  c.slots = {"1"};
  c.dense_dim = 0;
  const StatReport r = run_stat(c, {dir.write("good.txt", "click:1 1:5\n"), dir.file("gone.txt")});
  ASSERT_FALSE(r.load_status.ok());
  const std::string text = stat_text(r);
  EXPECT_NE(text.find("unique keys: not counted (the load failed: the error below)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("unique keys: 0"), std::string::npos) << text;
  EXPECT_NE(text.find("\nerror: "), std::string::npos) << text;
}

// Seeded random bytes in the data, in a file name and in slot names: the JSON stays valid
// UTF-8 JSON (it copied raw bytes before).
TEST(Stat, JsonIsValidUtf8WhateverTheBytes) {
  ScratchDir dir;
  std::mt19937 rng(3);
  for (int round = 0; round < 50; ++round) {
    std::string text;
    for (int line = 0; line < 20; ++line) {
      text += line % 2 ? "click:1 a:7 " : "click:0 ";
      for (int k = static_cast<int>(rng() % 30); k > 0; --k) {
        char c = static_cast<char>(rng() & 0xFF);
        if (c == '\n') c = ' ';
        text += c;
      }
      text += "\n";
    }
    const std::string name = std::string("d\xff\xc3") + std::to_string(round) + "\xe2\x82.txt";
    const std::string f = dir.write(name, text);
    DatasetConfig c;
    c.slots = {"a", "b\xc0\xaf"};
    c.dense_dim = 0;
    c.max_reported_errors = 100;
    StatReport r = run_stat(c, {f});
    r.skipped_entries.push_back({f + "\x80", SkipReason::kFolder, ""});
    const std::string json = stat_json(r);
    ASSERT_TRUE(gpubox::testing::JsonChecker::valid(json)) << round << ": " << json;
    EXPECT_GT(r.stats.skipped_lines(), 0u);
  }
}

#ifdef GPUBOX_DATA_BIN
struct RunResult {
  int exit_code;
  std::string out;  // stdout, then stderr when asked for
};

// Runs gpubox_data; `with_stderr` appends stderr to the output.
RunResult run(const std::string& args, bool with_stderr = false) {
  const std::string command =
      std::string(GPUBOX_DATA_BIN) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
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
  EXPECT_TRUE(gpubox::testing::JsonChecker::valid(stat.out)) << stat.out;
  EXPECT_NE(stat.out.find("\"files\": 3,"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("\"instances\": 3000,"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("\"skipped_lines\": 0,"), std::string::npos) << stat.out;
  // gen's oracle.json is reported as skipped metadata, not read.
  EXPECT_NE(stat.out.find("oracle.json\", \"reason\": \"metadata\""), std::string::npos)
      << stat.out;
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
  // More files than lines: refused (the files past the lines were written empty, unsaid).
  const RunResult empty_files =
      run("gen --out " + dir.file("gen_few") + " --lines 3 --files 5", true);
  EXPECT_EQ(empty_files.exit_code, 2);
  EXPECT_NE(empty_files.out.find("--files 5 is more than --lines 3"), std::string::npos)
      << empty_files.out;
  // convert through the binary.
  RunResult conv = run("convert --from slot --to multislot --slots 4 --dense 2 " +
                       dir.file("gen/part-00000") + " " + dir.file("p0.multi"));
  EXPECT_EQ(conv.exit_code, 0) << conv.out;
  EXPECT_NE(conv.out.find("converted 1000 instances"), std::string::npos) << conv.out;
  // --slots short of the file's 4: no output unless the others are dropped on purpose.
  conv = run("convert --from slot --to slot --slots 3 --dense 2 " + dir.file("gen/part-00000") +
                 " " + dir.file("p3.slot"),
             true);
  EXPECT_EQ(conv.exit_code, 1) << conv.out;
  EXPECT_NE(conv.out.find("1000 lines hold slots outside the 3 slots converted"), std::string::npos)
      << conv.out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("p3.slot")));
  conv = run("convert --from slot --to slot --slots 3 --dense 2 --drop_unknown_slots " +
             dir.file("gen/part-00000") + " " + dir.file("p3.slot"));
  EXPECT_EQ(conv.exit_code, 0) << conv.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("p3.slot")));
  EXPECT_EQ(run("convert --config " + cfg + " --drop_unknown_slots " + dir.file("gen/part-00000") +
                " " + dir.file("p4.slot"))
                .exit_code,
            2);
  // --slots / --dense beside --config: refused naming the flag (the config's shapes were used,
  // the flags ignored, and a Criteo input converted with exit 0).
  for (const std::string flag : {"--slots 3", "--dense 2"}) {
    conv = run("convert --config " + cfg + " " + flag + " " + dir.file("gen/part-00000") + " " +
                   dir.file("p5.slot"),
               true);
    EXPECT_EQ(conv.exit_code, 2) << flag << ": " << conv.out;
    EXPECT_NE(conv.out.find(flag.substr(0, flag.find(' ')) + ": without --config only"),
              std::string::npos)
        << conv.out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("p5.slot")));
  }
}

// #12 item 11: with a minimal config stat reads like the trainer (dense_input_dim 13 by default:
// every sample line is an instance), and refuses what the trainer refuses, with its messages.
TEST(GpuboxDataBinary, StatLoadsExactlyAsTrainingWould) {
  ScratchDir dir;
  const std::string minimal =
      dir.write("min.yaml", "runner:\n  train_data_dir: " + kSampleDir + "\n");
  RunResult stat = run("stat --config " + minimal + " --json");
  ASSERT_EQ(stat.exit_code, 0) << stat.out;
  EXPECT_NE(stat.out.find("\"instances\": 80,"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("\"skipped_lines\": 0,"), std::string::npos) << stat.out;

  const auto error_of = [&](const std::string& args) {
    RunResult r = run(args, true);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.out;
    return r.out;
  };
  std::string e = error_of("stat --config " + dir.write("empty.yaml", ""));
  EXPECT_NE(e.find("empty.yaml: the config is empty"), std::string::npos) << e;
  e = error_of("stat --config " + dir.write("list.yaml", "- runner\n- hyper_parameters\n"));
  EXPECT_NE(e.find("list.yaml: expected a map of keys at the top level, got a list"),
            std::string::npos)
      << e;
  e = error_of("stat --config " + dir.write("typo.yaml", "runner:\n  strict_prase: true\n"));
  EXPECT_NE(e.find("typo.yaml:2: unknown key 'runner.strict_prase' (did you mean "
                   "'runner.strict_parse'?)"),
            std::string::npos)
      << e;
  e = error_of("stat --config " + minimal + " -o runner.max_line_bytes=1e12");
  EXPECT_NE(e.find("runner.max_line_bytes: 1e12 is out of range [16, 1073741824]"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("bad_alloc"), std::string::npos) << e;
  // A file named twice (a folder listed twice, a FILE of the config's folder): training refuses
  // it; stat counted it twice.
  e = error_of("stat --config " + minimal + " -o 'runner.train_data_dir=[" + kSampleDir + ", " +
               kSampleDir + "]'");
  EXPECT_NE(e.find("is named twice"), std::string::npos) << e;
  e = error_of("stat --config " + minimal + " " + kSampleDir + "/sample_train.txt");
  EXPECT_NE(e.find("sample_train.txt' is named twice"), std::string::npos) << e;
  // Two passes' folders sharing a file: each pass reads it, as training does (warned), where
  // stat refused the config training runs.
  const RunResult days = run("stat --config " + minimal + " -o 'runner.pass_dirs=[" + kSampleDir +
                                 ", " + kSampleDir + "]'",
                             true);
  EXPECT_EQ(days.exit_code, 0) << days.out;
  EXPECT_NE(days.out.find("is in two passes' folders"), std::string::npos) << days.out;
  EXPECT_NE(days.out.find("instances: 160"), std::string::npos) << days.out;
}

// #12 item 12: 100,000 slots load (the duplicate check was quadratic: 21 s); an empty folder
// warns "files: 0"; a link to a listed file is read once; odd entries are reported.
TEST(GpuboxDataBinary, ManySlotsEmptyFoldersAndOddEntries) {
  ScratchDir dir;
  const std::string many = dir.write("many.yaml", "runner:\n  train_data_dir: " + kSampleDir +
                                                      "\nhyper_parameters:\n"
                                                      "  sparse_inputs_slots: 100000\n");
  RunResult stat = run("stat --config " + many + " --json");
  ASSERT_EQ(stat.exit_code, 0) << stat.out.substr(0, 2000);
  EXPECT_NE(stat.out.find("\"instances\": 80,"), std::string::npos) << stat.out.substr(0, 2000);

  fs::create_directories(dir.file("empty"));
  const std::string empty = dir.write("e.yaml", "runner:\n  train_data_dir: empty\n");
  stat = run("stat --config " + empty, true);
  EXPECT_EQ(stat.exit_code, 0) << stat.out;
  EXPECT_NE(stat.out.find("warning: files: 0"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("files: 0,"), std::string::npos) << stat.out;

  const std::string d = dir.file("odd");
  fs::create_directories(d + "/sub");
  fs::copy_file(kSample, d + "/a.txt");
  fs::create_symlink(d + "/a.txt", d + "/b_same");
  fs::create_symlink(d + "/gone", d + "/c_broken");
  ASSERT_EQ(::mkfifo((d + "/d_fifo").c_str(), 0600), 0);
  const std::string odd = dir.write("o.yaml", "runner:\n  train_data_dir: odd\n");
  stat = run("stat --config " + odd + " --json");
  ASSERT_EQ(stat.exit_code, 0) << stat.out;
  EXPECT_TRUE(gpubox::testing::JsonChecker::valid(stat.out)) << stat.out;
  EXPECT_NE(stat.out.find("\"files\": 1,"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("\"instances\": 80,"), std::string::npos) << stat.out;
  for (const std::string& want :
       {"b_same\", \"reason\": \"same file as\", \"same_as\": \"" + d + "/a.txt\"",
        std::string("c_broken\", \"reason\": \"broken link\""),
        std::string("d_fifo\", \"reason\": \"not a regular file\""),
        std::string("sub\", \"reason\": \"folder\"")}) {
    EXPECT_NE(stat.out.find(want), std::string::npos) << want << "\n" << stat.out;
  }
  stat = run("stat --config " + odd);
  EXPECT_NE(stat.out.find("skipped entries: 4"), std::string::npos) << stat.out;
}
#endif

}  // namespace
}  // namespace gpubox::dataset
