// ConfigDocument against THE key table: unknown keys name the closest valid key, wrong types,
// ranges and enum names name the file, line and key, empty or non-map configs are errors, -o
// overrides apply in order, relative paths resolve against the config's folder, cross-key
// rules hold, defaults come from the table, and PaddleRec-only keys are reported once.
#include "common/config/config_document.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/config/config_enums.hpp"

namespace gpubox::config {
namespace {
namespace fs = std::filesystem;

class ConfigDocumentTest : public ::testing::Test {
 protected:
  ConfigDocumentTest() {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("gpubox_config_document_test_" + std::to_string(rd()));
    fs::create_directories(dir_ / "sub");
  }
  ~ConfigDocumentTest() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // The message of a load that must fail.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    auto doc = ConfigDocument::load(write("sub/bad.yaml", text), overrides);
    EXPECT_FALSE(doc.ok()) << text;
    return doc.ok() ? "" : doc.status().message();
  }
  std::string bad_path() const { return (dir_ / "sub/bad.yaml").string(); }
  fs::path dir_;
};

TEST_F(ConfigDocumentTest, UnknownKeysNameTheClosestValidKeyAndTheLine) {
  EXPECT_EQ(error_of("runner:\n  train_batch_szie: 5\n"),
            bad_path() +
                ":2: unknown key 'runner.train_batch_szie' (did you mean "
                "'runner.train_batch_size'?)");
  EXPECT_EQ(error_of("runer:\n  epochs: 1\n"),
            bad_path() + ":1: unknown key 'runer' (did you mean 'runner'?)");
  EXPECT_EQ(error_of("hyper_parameters:\n  optimiser:\n    learning_rate: 0.1\n"),
            bad_path() +
                ":2: unknown key 'hyper_parameters.optimiser' (did you mean "
                "'hyper_parameters.optimizer'?)");
  EXPECT_EQ(error_of("runner:\n  strict_prase: true\n"),
            bad_path() +
                ":2: unknown key 'runner.strict_prase' (did you mean "
                "'runner.strict_parse'?)");
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n", {"runner.epoch=3"}),
            bad_path() + ": -o: unknown key 'runner.epoch' (did you mean 'runner.epochs'?)");
  const std::string section = error_of("runner:\n  epochs: 1\n", {"runner=3"});
  EXPECT_NE(section.find("'runner' is a section, not a key"), std::string::npos) << section;
}

TEST_F(ConfigDocumentTest, WrongTypesRangesAndNamesAreErrorsNamingTheKey) {
  const std::string p = bad_path();
  EXPECT_EQ(error_of("runner:\n  thread_num: 2\n  epochs: abc\n"),
            p + ":3: runner.epochs: expected an integer, got 'abc'");
  EXPECT_EQ(error_of("runner:\n  epochs: 1.5\n"),
            p + ":2: runner.epochs: expected an integer, got '1.5'");
  EXPECT_EQ(error_of("runner:\n  epochs: [1]\n"),
            p + ":2: runner.epochs: expected an integer, got a list");
  EXPECT_EQ(error_of("hyper_parameters:\n  fc_sizes: 512\n"),
            p + ":2: hyper_parameters.fc_sizes: expected a list of integers, got '512'");
  EXPECT_EQ(error_of("hyper_parameters:\n  layer_sizes_cin: []\n"),
            p + ":2: hyper_parameters.layer_sizes_cin: needs at least 1 item(s)");
  EXPECT_EQ(error_of("hyper_parameters:\n  fc_sizes: [512, 0]\n"),
            p + ":2: hyper_parameters.fc_sizes: 0 is out of range [1, 2147483647]");
  EXPECT_EQ(error_of("runner:\n  use_auc: maybe\n"),
            p + ":2: runner.use_auc: expected true or false, got 'maybe'");
  EXPECT_EQ(error_of("runner:\n  train_batch_size: 0\n"),
            p + ":2: runner.train_batch_size: 0 is out of range [1, 2147483647]");
  // An integral number written as a float is an integer: too large is a range error.
  EXPECT_EQ(error_of("runner:\n  max_line_bytes: 1e12\n"),
            p + ":2: runner.max_line_bytes: 1e12 is out of range [16, 1073741824]");
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n", {"runner.max_line_bytes=1e12"}),
            p + ": -o: runner.max_line_bytes: 1e12 is out of range [16, 1073741824]");
  EXPECT_EQ(error_of("runner:\n  max_line_bytes: 1e30\n"),
            p + ":2: runner.max_line_bytes: 1e30 is out of range [16, 1073741824]");
  EXPECT_EQ(error_of("hyper_parameters:\n  model: difm\n"),
            p + ":2: hyper_parameters.model: expected one of "
                "dnn|wide_deep|wide|deepfm|dcn_v2|fm|dcn|dlrm|xdeepfm|ffm|deepfefm|autoint|flen|"
                "fat_deepffm, got 'difm'");
  EXPECT_EQ(error_of("runner:\n  sync_mode: heter\n"),
            p + ":2: runner.sync_mode: expected one of gpubox|async|sync|geo, got 'heter'");
  EXPECT_EQ(error_of("hyper_parameters:\n  sparse_optimizer:\n    class: lamb\n"),
            p + ":3: hyper_parameters.sparse_optimizer.class: expected one of "
                "sgd|adagrad|adam|shared_adam, got 'lamb'");
  EXPECT_EQ(error_of("runner:\n  seed: -1\n"),
            p + ":2: runner.seed: expected an integer in [0, 2^64), got '-1'");
  EXPECT_EQ(error_of("hyper_parameters:\n  optimizer:\n    learning_rate: .inf\n"),
            p + ":3: hyper_parameters.optimizer.learning_rate: expected a finite number, got "
                "'.inf'");
  EXPECT_EQ(error_of("hyper_parameters:\n  optimizer:\n    beta1: 1.5\n"),
            p + ":3: hyper_parameters.optimizer.beta1: 1.5 is out of range [0, 0.999999]");
  EXPECT_EQ(error_of("runner: 5\n"), p + ":1: runner: expected a map of keys, got '5'");
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n", {"runner.epochs=x"}),
            p + ": -o: runner.epochs: expected an integer, got 'x'");
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n", {"runner.epochs"}),
            p + ": -o 'runner.epochs': expected key=value");
  const std::string syntax = error_of("runner:\n  epochs: [1\n");
  EXPECT_NE(syntax.find(p + ":"), std::string::npos) << syntax;
  EXPECT_NE(syntax.find("YAML syntax error"), std::string::npos) << syntax;
}

TEST_F(ConfigDocumentTest, EmptyOrNonMapConfigsAreErrors) {
  const std::string empty = bad_path() +
                            ": the config is empty (expected a map of keys such as runner: and "
                            "hyper_parameters:)";
  EXPECT_EQ(error_of(""), empty);
  EXPECT_EQ(error_of("# nothing but a comment\n"), empty);
  EXPECT_EQ(error_of("{}\n"), empty);
  EXPECT_EQ(error_of("- runner\n- epochs\n"),
            bad_path() + ": expected a map of keys at the top level, got a list");
  EXPECT_EQ(error_of("5\n"), bad_path() + ": expected a map of keys at the top level, got '5'");
  auto missing = ConfigDocument::load((dir_ / "nope.yaml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.yaml"), std::string::npos);
  // A folder named as the config (it read as an empty file: "the config is empty").
  auto folder = ConfigDocument::load((dir_ / "sub").string());
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().message(),
            "config file '" + (dir_ / "sub").string() + "' is a folder, not a YAML file");
}

TEST_F(ConfigDocumentTest, AKeySetTwiceIsAnError) {
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n  epochs: 2\n"),
            bad_path() + ":3: runner.epochs: set twice (first on line 2)");
}

// A second YAML document would otherwise be dropped without a word: its keys never apply.
TEST_F(ConfigDocumentTest, ASecondYamlDocumentIsRefusedNamingFileAndLine) {
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n---\nrunner:\n  epochs: 2\n"),
            bad_path() +
                ":4: a second YAML document (after '---'): a config is one document (2 found); "
                "merge them or remove the '---'");
  // One document marked with '---' (as many YAML files start) is one document.
  auto doc = ConfigDocument::load(write("one.yaml", "---\nrunner:\n  epochs: 3\n"));
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("runner.epochs"), 3);
}

// yaml-cpp's LoadAll never returned on these (a fuzzer's find), and its Load read them as an
// empty config: a flow token at a document's start is never consumed.
TEST_F(ConfigDocumentTest, TextTheYamlParserCannotReadPastIsAnError) {
  const std::string why =
      ": YAML syntax error: the parser cannot read past this line (a ',' or other flow token "
      "outside [] or {}?)";
  EXPECT_EQ(error_of(",a\n- b\n"), bad_path() + ":1" + why);
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n---\n, b\n"), bad_path() + ":4" + why);
  EXPECT_EQ(error_of("runner:\n  epochs: [1,\n"),
            bad_path() + ":3: YAML syntax error: end of sequence flow not found");
}

// The reading every binary's flags share with -o (common/cli_args.hpp): ranges and types of
// the key, 1e6-style integers, non-finite numbers refused.
TEST(ParseValueText, ReadsAsAnOverrideDoes) {
  const KeySpec* shards = find_key("runner.host_table_shards");
  ASSERT_NE(shards, nullptr);
  ConfigValue v;
  ASSERT_TRUE(parse_value_text(*shards, "1e3", &v).ok());
  EXPECT_EQ(std::get<int64_t>(v), 1000);
  EXPECT_EQ(parse_value_text(*shards, "1e8", &v).message(),
            "runner.host_table_shards: 1e8 is out of range [1, 65536]");
  EXPECT_FALSE(parse_value_text(*shards, "1.5", &v).ok());
  const KeySpec* timeout = find_key("runner.server_timeout_s");
  for (const char* bad : {"nan", ".nan", "inf", ".inf", "-.inf", "x"}) {
    EXPECT_FALSE(parse_value_text(*timeout, bad, &v).ok()) << bad;
  }
  const KeySpec* form = find_key("runner.save_form");
  ASSERT_TRUE(parse_value_text(*form, "TEXT", &v).ok());
  EXPECT_EQ(std::get<std::string>(v), "text");
}

TEST_F(ConfigDocumentTest, CrossKeyRules) {
  const std::string p = bad_path();
  EXPECT_EQ(
      error_of("hyper_parameters:\n  sparse_optimizer:\n    min_bound: 2\n    max_bound: 1\n"),
      p + ": hyper_parameters.sparse_optimizer.min_bound (2) is greater than "
          "hyper_parameters.sparse_optimizer.max_bound (1)");
  EXPECT_EQ(
      error_of("runner:\n  epochs: 1\n", {"hyper_parameters.sparse_optimizer.mf_min_bound=11"}),
      p + ": hyper_parameters.sparse_optimizer.mf_min_bound (11) is greater than "
          "hyper_parameters.sparse_optimizer.mf_max_bound (10)");
  EXPECT_EQ(
      error_of("hyper_parameters:\n  sparse_inputs_slots: 4\n  slot_names: [a, b]\n"),
      p + ": hyper_parameters.slot_names has 2 names but hyper_parameters.sparse_inputs_slots "
          "= 4 means 3 sparse slots (the label counts as one)");
  // dlrm's two-class output asked for beside PaddleRec's output layer of one logit: refused at
  // the key's line (or -o), naming top_layer_sizes' line (or -o); its 2 and logit are read.
  const std::string top1 = "hyper_parameters:\n  top_layer_sizes: [64, 1]\n";
  const std::string why =
      "hyper_parameters.dlrm_output: softmax2 builds a 2-wide output layer, but "
      "hyper_parameters.top_layer_sizes (";
  EXPECT_EQ(error_of(top1 + "  dlrm_output: softmax2\n"),
            p + ":3: " + why +
                "line 2) ends in 1, one logit; end hyper_parameters.top_layer_sizes in 2 or set "
                "hyper_parameters.dlrm_output logit");
  EXPECT_EQ(error_of(top1, {"hyper_parameters.dlrm_output=softmax2"})
                .rfind(p + ": -o: " + why + "line 2)", 0),
            0u);
  EXPECT_EQ(error_of("runner:\n  epochs: 1\n", {"hyper_parameters.top_layer_sizes=[8, 1]",
                                                "hyper_parameters.dlrm_output=softmax2"})
                .rfind(p + ": -o: " + why + "-o)", 0),
            0u);
  EXPECT_NE(error_of("hyper_parameters:\n  top_layer_sizes: [8]\n")
                .find("top_layer_sizes: expected a list of at least two sizes, the hidden layers' "
                      "then the output layer's (2: PaddleRec's two-class softmax, or 1: one "
                      "logit), e.g. [512, 256, 2], got a list of 1"),
            std::string::npos);
  for (const char* fine : {"  top_layer_sizes: [64, 2]\n  dlrm_output: softmax2\n",
                           "  top_layer_sizes: [64, 1]\n  dlrm_output: logit\n",
                           "  fc_sizes: [64]\n  dlrm_output: softmax2\n"}) {
    EXPECT_TRUE(
        ConfigDocument::load(write("fine.yaml", std::string("hyper_parameters:\n") + fine)).ok())
        << fine;
  }
}

TEST_F(ConfigDocumentTest, OverridesApplyInOrderWithTheKeysTypes) {
  const std::string path = write("sub/c.yaml",
                                 "runner:\n  epochs: 2\n  pipe_command: cat\n"
                                 "hyper_parameters:\n  optimizer:\n    class: Adam\n");
  auto doc = ConfigDocument::load(
      path, {"runner.epochs=7", "hyper_parameters.fc_sizes=[64, 32]",
             "hyper_parameters.model=WIDE_DEEP", "runner.pipe_command=python3 r.py --sep=: x",
             "runner.slot_token_order=feasign:slot", "runner.epochs=9",
             "hyper_parameters.slot_names=[u, i]", "hyper_parameters.sparse_inputs_slots=3",
             "runner.seed=18446744073709551615", "-o", "runner.use_gpu=false"});
  // "-o" is not key=value: the command-line front end takes it out, the loader refuses it.
  ASSERT_FALSE(doc.ok());
  doc = ConfigDocument::load(
      path,
      {"runner.epochs=7", "hyper_parameters.fc_sizes=[64, 32]", "hyper_parameters.model=WIDE_DEEP",
       "runner.pipe_command=python3 r.py --sep=: x", "runner.slot_token_order=feasign:slot",
       "runner.epochs=9", "hyper_parameters.slot_names=[u, i]",
       "hyper_parameters.sparse_inputs_slots=3", "runner.seed=18446744073709551615"});
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("runner.epochs"), 9);
  EXPECT_EQ(doc->get_int_list("hyper_parameters.fc_sizes"), (std::vector<int>{64, 32}));
  EXPECT_EQ(doc->get_enum("hyper_parameters.model", kModelKindNames), ModelKind::kWideDeep);
  EXPECT_EQ(doc->get_string("runner.pipe_command"), "python3 r.py --sep=: x");
  EXPECT_EQ(doc->get_enum("runner.slot_token_order", kSlotTokenOrderNames),
            SlotTokenOrder::kFeasignFirst);
  EXPECT_EQ(doc->get_string_list("hyper_parameters.slot_names"),
            (std::vector<std::string>{"u", "i"}));
  EXPECT_EQ(doc->get_uint64("runner.seed"), 18446744073709551615ull);
  EXPECT_EQ(doc->get_enum("hyper_parameters.optimizer.class", kDenseOptimizerKindNames),
            DenseOptimizerKind::kAdam);
  EXPECT_TRUE(doc->is_set("runner.pipe_command"));
  EXPECT_FALSE(doc->is_set("runner.thread_num"));
}

TEST_F(ConfigDocumentTest, RelativePathsResolveAgainstTheConfigFolder) {
  const std::string path = write("sub/c.yaml",
                                 "runner:\n  train_data_dir: data/train\n  test_data_dir: ../test\n"
                                 "  model_save_path: /abs/model\n  pass_dirs: [day1, ./day2]\n"
                                 "  metrics_path: log/m.jsonl\n  infer_load_path:\n");
  auto doc = ConfigDocument::load(path);
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  const fs::path sub = fs::absolute(dir_ / "sub").lexically_normal();
  EXPECT_EQ(doc->get_string("runner.train_data_dir"), (sub / "data/train").string());
  EXPECT_EQ(doc->get_string("runner.test_data_dir"),
            (fs::absolute(dir_) / "test").lexically_normal().string());
  EXPECT_EQ(doc->get_string("runner.model_save_path"), "/abs/model");
  EXPECT_EQ(doc->get_string_list("runner.pass_dirs"),
            (std::vector<std::string>{(sub / "day1").string(), (sub / "day2").string()}));
  EXPECT_EQ(doc->get_string("runner.metrics_path"), (sub / "log/m.jsonl").string());
  EXPECT_EQ(doc->get_string("runner.infer_load_path"), "");
  EXPECT_EQ(doc->source(), path);
  // An unset path keeps its default, relative to the working directory.
  auto d = ConfigDocument::load(write("sub/d.yaml", "runner:\n  epochs: 1\n"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->get_string("runner.metrics_path"), "log/metrics.jsonl");
  // -o paths are relative to the working directory.
  auto o = ConfigDocument::load(path, {"runner.train_data_dir=elsewhere"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->get_string("runner.train_data_dir"),
            (fs::current_path() / "elsewhere").lexically_normal().string());
  EXPECT_TRUE(o->override_path_notes().empty());  // the config's folder has none either
}

// PaddleRec takes its model paths from the working directory (its data folders from the
// config's): a relative model_save_path, infer_load_path or model_init_path stays relative, in
// the file and in -o alike; absolute ones are kept.
TEST_F(ConfigDocumentTest, ModelPathsAreTakenFromTheWorkingDirectory) {
  const std::string path =
      write("sub/m.yaml",
            "runner:\n  train_data_dir: data/train\n  model_save_path: output_model_dnn\n"
            "  infer_load_path: ./out/../output_model_dnn\n  model_init_path: /abs/init/2\n");
  auto doc = ConfigDocument::load(path);
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_string("runner.train_data_dir"),
            (fs::absolute(dir_ / "sub") / "data/train").lexically_normal().string());
  EXPECT_EQ(doc->get_string("runner.model_save_path"), "output_model_dnn");
  EXPECT_EQ(doc->get_string("runner.infer_load_path"), "output_model_dnn");
  EXPECT_EQ(doc->get_string("runner.model_init_path"), "/abs/init/2");
  auto o = ConfigDocument::load(path, {"runner.model_save_path=models/m"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->get_string("runner.model_save_path"), "models/m");
  EXPECT_EQ(find_key("runner.model_save_path")->type, KeyType::kWorkPath);
}

// An override replaces the file's value before it is checked: a PaddleRec heter-PS config
// (sync_mode: heter) runs with -o runner.sync_mode=gpubox. Other keys are still checked.
TEST_F(ConfigDocumentTest, AnOverriddenValueOfTheFileIsNotChecked) {
  const std::string text = "runner:\n  sync_mode: \"heter\"\n  epochs: 2\n";
  EXPECT_EQ(
      error_of(text),
      bad_path() + ":2: runner.sync_mode: expected one of gpubox|async|sync|geo, got 'heter'");
  auto doc = ConfigDocument::load(write("sub/ps.yaml", text), {"runner.sync_mode=gpubox"});
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("runner.epochs"), 2);
  EXPECT_EQ(error_of("runner:\n  sync_mode: heter\n  epochs: zero\n", {"runner.sync_mode=gpubox"}),
            bad_path() + ":3: runner.epochs: expected an integer, got 'zero'");
  // The override itself is checked.
  EXPECT_NE(error_of(text, {"runner.sync_mode=collective"})
                .find("expected one of gpubox|async|sync|geo, got 'collective'"),
            std::string::npos);
}

TEST_F(ConfigDocumentTest, DefaultsComeFromTheTableAndTheTemplateSetsEachKeyToIt) {
  const ConfigDocument defaults = ConfigDocument::defaults();
  EXPECT_EQ(defaults.get_int("runner.train_batch_size"), 512);
  EXPECT_EQ(defaults.get_int("hyper_parameters.dense_input_dim"), 13);
  EXPECT_EQ(defaults.get_int<std::size_t>("runner.max_line_bytes"), std::size_t{1} << 20);
  EXPECT_DOUBLE_EQ(defaults.get_float("runner.collective_timeout_s"), 300.0);
  EXPECT_EQ(defaults.get_enum("hyper_parameters.sparse_optimizer.class", kSparseOptimizerKindNames),
            SparseOptimizerKind::kAdagrad);
  // The rendered template is a valid config in which every key is set to its default.
  const std::string path = write("template.yaml", render_yaml_template());
  auto doc = ConfigDocument::load(path);
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  for (const KeySpec& key : config_keys()) {
    EXPECT_TRUE(doc->is_set(key.name)) << key.name << " missing from the template";
  }
  EXPECT_TRUE(doc->no_effect_keys().empty());
  EXPECT_EQ(doc->get_int_list("hyper_parameters.fc_sizes"), (std::vector<int>{512, 256, 128, 32}));
}

TEST_F(ConfigDocumentTest, PaddleRecOnlyKeysSetToOtherValuesAreReportedOnce) {
  auto doc = ConfigDocument::load(
      write("sub/p.yaml",
            "workspace: models/rank/dnn\nrunner:\n  use_auc: False\n  train_reader_path: r\n"
            "  infer_reader_path: q\n  infer_end_epoch: 1\n  dataset_debug: false\n"));
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  // workspace has an effect (it names the network without hyper_parameters.model), and so has
  // train_reader_path (it names the reader whose dense transform GPUBox applies).
  EXPECT_EQ(doc->no_effect_keys(),
            (std::vector<std::string>{"runner.use_auc", "runner.infer_reader_path"}));
  EXPECT_EQ(doc->no_effect_note(),
            (dir_ / "sub/p.yaml").string() +
                ": 2 PaddleRec keys have no effect in GPUBox:\n"
                "  runner.use_auc: PaddleRec's AUC switch; GPUBox always computes AUC\n"
                "  runner.infer_reader_path: PaddleRec's Python reader module for inference");
  auto quiet = ConfigDocument::load(write("sub/q.yaml", "runner:\n  use_auc: true\n"));
  ASSERT_TRUE(quiet.ok());
  EXPECT_EQ(quiet->no_effect_note(), "");
}

// The keys PaddleRec's trainers read (tools/*trainer*.py and helpers) load with any value (a
// list, a map, a whole table_parameters section) and are listed once, each with its reason.
TEST_F(ConfigDocumentTest, KeysPaddleRecsTrainersReadAreAcceptedAndListedWithAReason) {
  auto doc = ConfigDocument::load(
      write("sub/prec.yaml",
            "runner:\n  num_workers: 4\n  use_inference: True\n  fs_name: \"afs://x\"\n"
            "  parse_ins_id: False\n  example_count_method: word\n"
            "  save_inference_feed_varnames: [\"2\", \"3\"]\n"
            "  fs_client:\n    uri: afs://x\n    user: u\n  epochs: 2\n"
            "hyper_parameters:\n  adam_d2sum: False\n"),
      {"runner.warmup_model_path=/m"});
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("runner.epochs"), 2);
  const std::vector<std::string> keys = doc->no_effect_keys();
  EXPECT_EQ(keys,
            (std::vector<std::string>{"runner.example_count_method", "runner.fs_client",
                                      "runner.fs_name", "runner.num_workers", "runner.parse_ins_id",
                                      "runner.save_inference_feed_varnames", "runner.use_inference",
                                      "runner.warmup_model_path", "hyper_parameters.adam_d2sum"}));
  const std::string note = doc->no_effect_note();
  EXPECT_NE(note.find(": 9 PaddleRec keys have no effect in GPUBox:\n"), std::string::npos);
  for (const std::string& k : keys) {
    const IgnoredKey* ignored = find_ignored(k);
    ASSERT_NE(ignored, nullptr) << k;
    EXPECT_NE(note.find("\n  " + k + ": " + ignored->reason), std::string::npos) << note;
  }
  // Every ignored key has a reason, none is also a key or a section of the table.
  for (const IgnoredKey& k : ignored_paddlerec_keys()) {
    EXPECT_FALSE(k.reason.empty()) << k.name;
    EXPECT_EQ(find_key(k.name), nullptr) << k.name;
  }
  EXPECT_EQ(find_ignored("runner.fs_client.uri")->name, "runner.fs_client");
  EXPECT_EQ(find_ignored("runner.num_workerz"), nullptr);
}

TEST_F(ConfigDocumentTest, EveryUnknownKeyOfAFileIsReportedInOneError) {
  const std::string p = bad_path();
  // PaddleRec's flen config: its model's own hyper_parameters are not GPUBox's; the runner keys
  // PaddleRec's trainer reads load. A typo next to them is reported in the same error.
  const std::string e = error_of(
      "runner:\n  train_data_dir: data\n  use_gpu: False\n  num_workers: 0\n"
      "  epoch: 3\n  thread_num: x\n"
      "hyper_parameters:\n  optimizer:\n    class: Adam\n  sparse_feature_number: 1086460\n"
      "  tower_units: 3\n  field_num: 2\n");
  EXPECT_EQ(e, p + ": 3 unknown keys (gpubox_train --print_config_keys lists the valid ones):\n  " +
                   p + ":5: unknown key 'runner.epoch' (did you mean 'runner.epochs'?)\n  " + p +
                   ":11: unknown key 'hyper_parameters.tower_units'\n  " + p +
                   ":12: unknown key 'hyper_parameters.field_num' (did you mean "
                   "'hyper_parameters.head_num'?)\n  " +
                   p + ":6: runner.thread_num: expected an integer, got 'x'");
}

TEST_F(ConfigDocumentTest, ManyUnknownKeysAreCountedPastTheFirstTwenty) {
  // 3000 unknown keys (what a fuzzer found): the first 20 are named with their suggestions, the
  // rest counted; answering once took minutes of edit distances.
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "k" + std::to_string(i) + "_xxxxxxxxxxxxxxxxxxxx: 1\n";
  const std::string e = error_of(text);
  const std::string p = bad_path();
  EXPECT_EQ(e.rfind(p + ": 3000 unknown keys (", 0), 0u) << e;
  EXPECT_NE(e.find(p + ":20: unknown key 'k19_"), std::string::npos) << e;
  EXPECT_EQ(e.find("'k20_"), std::string::npos) << e;
  EXPECT_NE(e.find("\n  ... and 2980 more unknown keys"), std::string::npos) << e;
}

TEST_F(ConfigDocumentTest, SuggestionsAreOnlyCloseNames) {
  // A typo or two for the name's length, or the same name in another section.
  EXPECT_EQ(key_suggestions("runner.trian_data_dir").front(), "runner.train_data_dir");
  EXPECT_EQ(key_suggestions("runner.learning_rate"),
            (std::vector<std::string>{"hyper_parameters.optimizer.learning_rate",
                                      "hyper_parameters.sparse_optimizer.learning_rate"}));
  EXPECT_EQ(key_suggestions("hyper_parameters.thread_num"),
            (std::vector<std::string>{"hyper_parameters.head_num", "runner.thread_num"}));
  // Unrelated names get no suggestion (the old "did you mean" named any nearest key).
  EXPECT_TRUE(key_suggestions("runner.num_wk").empty());
  EXPECT_TRUE(key_suggestions("hyper_parameters.tower_units").empty());
  EXPECT_TRUE(key_suggestions("runner.xy").empty());
  EXPECT_EQ(error_of("runner:\n  num_wk: 2\n"), bad_path() + ":2: unknown key 'runner.num_wk'");
  // PaddleRec's names are candidates too.
  EXPECT_EQ(
      error_of("runner:\n  num_worker: 2\n"),
      bad_path() + ":2: unknown key 'runner.num_worker' (did you mean 'runner.num_workers'?)");
}

TEST_F(ConfigDocumentTest, GettersRecordTheKeysRead) {
  const ConfigDocument doc = ConfigDocument::defaults();
  EXPECT_TRUE(doc.keys_read().empty());
  doc.get_int("runner.epochs");
  doc.get_string("runner.pipe_command");
  EXPECT_EQ(doc.keys_read(), (std::set<std::string>{"runner.epochs", "runner.pipe_command"}));
  EXPECT_THROW(doc.get_int("runner.no_such_key"), Error);
  EXPECT_THROW(doc.get_bool("runner.epochs"), Error);  // read as another type
}

TEST_F(ConfigDocumentTest, ValueTextWritesEachTypeAndReadsBackTheSameValue) {
  auto doc = ConfigDocument::load(
      write("sub/v.yaml",
            "runner:\n  shuffle: false\n  epochs: 7\n  seed: 18446744073709551615\n"
            "  model_save_path: out/m\n  resume: OFF\nhyper_parameters:\n"
            "  fc_sizes: [64, 32]\n  slot_names: [a, b]\n  sparse_inputs_slots: 3\n"
            "  sparse_optimizer:\n    learning_rate: 0.1\n    mf_initial_range: 1.0e-4\n"),
      {"hyper_parameters.optimizer.learning_rate=0.3"});
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->value_text("runner.shuffle"), "false");
  EXPECT_EQ(doc->value_text("runner.epochs"), "7");
  EXPECT_EQ(doc->value_text("runner.seed"), "18446744073709551615");
  EXPECT_EQ(doc->value_text("runner.model_save_path"), "out/m");  // from the working directory
  EXPECT_EQ(doc->value_text("runner.resume"), "off");             // the table's spelling
  EXPECT_EQ(doc->value_text("runner.auth_token_file"), "");
  EXPECT_EQ(doc->value_text("hyper_parameters.fc_sizes"), "[64, 32]");
  EXPECT_EQ(doc->value_text("hyper_parameters.slot_names"), "[a, b]");
  EXPECT_EQ(doc->value_text("hyper_parameters.sparse_optimizer.learning_rate"), "0.1");
  EXPECT_EQ(doc->value_text("hyper_parameters.sparse_optimizer.mf_initial_range"), "0.0001");
  EXPECT_EQ(doc->value_text("hyper_parameters.optimizer.learning_rate"), "0.3");
  EXPECT_EQ(doc->value_text("hyper_parameters.optimizer.epsilon"), "1e-08");  // the default
  EXPECT_TRUE(doc->keys_read().empty()) << "describing a config is not reading it";
  // Every number reads back as the value held (the shortest text that round-trips).
  for (const KeySpec& key : config_keys()) {
    const std::string text = doc->value_text(key.name);
    if (key.type == KeyType::kFloat) {
      EXPECT_EQ(std::strtod(text.c_str(), nullptr), doc->get_float(key.name)) << key.name;
    }
  }
  EXPECT_THROW(doc->value_text("runner.no_such_key"), Error);
}

TEST(ConfigKeys, ClosestKeyAndEditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  // The bounded form against the full one on seeded random names, every bound up to past both.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    std::string a(rng() % 12, 'a');
    std::string b(rng() % 12, 'a');
    for (char& c : a) c = static_cast<char>('a' + rng() % 3);
    for (char& c : b) c = static_cast<char>('a' + rng() % 3);
    const std::size_t full = edit_distance(a, b);
    for (std::size_t bound = 0; bound <= 13; ++bound) {
      EXPECT_EQ(edit_distance_within(a, b, bound), std::min(full, bound + 1))
          << a << " " << b << " " << bound;
    }
  }
  EXPECT_EQ(closest_key("runner.epoch"), "runner.epochs");
  EXPECT_EQ(closest_key("hyper_parameter"), "hyper_parameters");
  EXPECT_TRUE(is_section("hyper_parameters.optimizer"));
  EXPECT_FALSE(is_section("hyper_parameters.optimizer.class"));
  ASSERT_NE(find_key("runner.collective_timeout_s"), nullptr);
  EXPECT_EQ(find_key("runner.nothing"), nullptr);
}

TEST_F(ConfigDocumentTest, PaddleRecDcnV2SpellingsSetGpuboxKeys) {
  auto doc = ConfigDocument::load(write("dcn.yaml",
                                        "hyper_parameters:\n  cross_num: 4\n  is_Stacked: False\n"
                                        "  use_low_rank_mixture: false\n"),
                                  {});
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("hyper_parameters.cross_layers"), 4);
  EXPECT_EQ(doc->get_enum("hyper_parameters.dcn_structure", kDcnStructureNames),
            DcnStructure::kParallel);
  auto overridden =
      ConfigDocument::load(write("dcn2.yaml", "hyper_parameters:\n  cross_num: 4\n"),
                           {"hyper_parameters.cross_num=2", "hyper_parameters.is_Stacked=True"});
  ASSERT_TRUE(overridden.ok()) << overridden.status().to_string();
  EXPECT_EQ(overridden->get_int("hyper_parameters.cross_layers"), 2);
  EXPECT_EQ(overridden->get_enum("hyper_parameters.dcn_structure", kDcnStructureNames),
            DcnStructure::kStacked);

  // DCN-Mix: use_low_rank_mixture and num_experts are cross_mixture and cross_experts.
  auto mix = ConfigDocument::load(
      write("mix.yaml", "hyper_parameters:\n  use_low_rank_mixture: True\n  num_experts: 3\n"), {});
  ASSERT_TRUE(mix.ok()) << mix.status().to_string();
  EXPECT_TRUE(mix->get_bool("hyper_parameters.cross_mixture"));
  EXPECT_EQ(mix->get_int("hyper_parameters.cross_experts"), 3);
  EXPECT_NE(error_of("hyper_parameters:\n  num_experts: 0\n").find("out of range"),
            std::string::npos);
  EXPECT_NE(error_of("hyper_parameters:\n  is_Stacked: maybe\n").find("expected true or false"),
            std::string::npos);
  EXPECT_EQ(error_of("hyper_parameters:\n  cross_layers: 2\n  cross_num: 3\n"),
            bad_path() +
                ":3: hyper_parameters.cross_num sets hyper_parameters.cross_layers to 3, set "
                "already on line 2 to 2");
  EXPECT_NE(error_of("hyper_parameters:\n  cross_num: 0\n").find("out of range"),
            std::string::npos);
}

// hyper_parameters.slot_dims: a map of slot names to widths; value_text reads back through -o.
TEST_F(ConfigDocumentTest, SlotDimsIsAMapOfSlotsToWidths) {
  auto doc = ConfigDocument::load(
      write("dims.yaml", "hyper_parameters:\n  slot_dims: {2: 16, 1: 4}\n"), {});
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int_map("hyper_parameters.slot_dims"), (IntMap{{"1", 4}, {"2", 16}}));
  EXPECT_EQ(doc->value_text("hyper_parameters.slot_dims"), "{1: 4, 2: 16}");
  auto again = ConfigDocument::load(write("empty.yaml", "runner: {}\n"),
                                    {"hyper_parameters.slot_dims={1: 4, 2: 16}"});
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->get_int_map("hyper_parameters.slot_dims"), (IntMap{{"1", 4}, {"2", 16}}));
  EXPECT_NE(error_of("hyper_parameters:\n  slot_dims: [4, 8]\n").find("a map of slot names"),
            std::string::npos);
  EXPECT_NE(error_of("hyper_parameters:\n  slot_dims: {1: 2048}\n").find("out of range"),
            std::string::npos);
  // Numbered slots are 1 .. sparse_inputs_slots - 1 (the label counts as one): the last number
  // is one below the count, the count itself names no slot.
  const std::string slots = "  sparse_inputs_slots: 4\n";
  const auto last = ConfigDocument::load(
      write("dims_last.yaml", "hyper_parameters:\n" + slots + "  slot_dims: {3: 4}\n"), {});
  EXPECT_TRUE(last.ok()) << last.status().to_string();
  EXPECT_NE(error_of("hyper_parameters:\n" + slots + "  slot_dims: {4: 4}\n")
                .find("slot '4' is not one of the data's sparse slots"),
            std::string::npos);
  EXPECT_NE(error_of("hyper_parameters:\n" + slots + "  slot_dims: {0: 4}\n")
                .find("slot '0' is not one of"),
            std::string::npos);
  // The table part's rule (config/slot_dims.hpp): a listed name that is a negative number is the
  // slot id the dataset gives it, which no table takes; the check accepted it before.
  EXPECT_NE(error_of("hyper_parameters:\n  sparse_inputs_slots: 3\n  slot_names: [a, \"-5\"]\n"
                     "  slot_dims: {\"-5\": 4}\n")
                .find("slot '-5' is not one of"),
            std::string::npos);
}

}  // namespace
}  // namespace gpubox::config
