// A PaddleRec user's inputs, unchanged: PaddleRec's own reader commands (run with PaddleRec's
// `<config> <utils>` arguments, their MultiSlot output read in PaddleRec's field order), the
// formats recognised from the first lines (runner.data_format auto), what a wrongly configured
// format's lines look like, slot_dnn's `feasign:slot` data with its label in slot 1, and a
// reader that cannot run. The reader is tests/dataset/data/fake_paddlerec_reader.py: plain
// python3 writing what PaddleRec's dnn queuedataset_reader.py writes, without Paddle.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "dataset/dataset_config.hpp"
#include "dataset/format_detect.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/line_parser.hpp"
#include "dataset/load_report.hpp"
#include "dataset/pipe_command.hpp"
#include "tests/dataset/loaded_instances.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

namespace fs = std::filesystem;
using testing::load;
using testing::Loaded;
using testing::PlainInstance;
using testing::ScratchDir;
using testing::slot_config;
using testing::to_plain;

const std::string kSource = GPUBOX_SOURCE_DIR;
const std::string kSample = kSource + "/configs/data/sample_data/train/sample_train.txt";
const std::string kReader = kSource + "/tests/dataset/data/fake_paddlerec_reader.py";

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::size_t line_count(const std::string& path) {
  const std::string text = read_text(path);
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

// A PaddleRec checkout as PaddleRec's configs expect it: <root>/tools/utils/static_ps (its
// common_ps.py), <root>/models/rank/dnn/config_gpubox.yaml with PaddleRec's keys and its
// sample data, and the reader command PaddleRec's config has (here the stand-in reader).
struct PaddleRecCheckout {
  explicit PaddleRecCheckout(const ScratchDir& dir, const std::string& reader_options = "")
      : root(dir.file("PaddleRec")) {
    fs::create_directories(root + "/tools/utils/static_ps");
    std::ofstream(root + "/tools/utils/static_ps/common_ps.py") << "# PaddleRec's YamlHelper\n";
    const std::string model = root + "/models/rank/dnn";
    fs::create_directories(model + "/data/sample_data/train");
    fs::copy_file(kSample, model + "/data/sample_data/train/sample_train.txt");
    config = model + "/config_gpubox.yaml";
    std::ofstream(config) << "runner:\n"
                             "  train_data_dir: \"data/sample_data/train\"\n"
                             "  train_reader_path: \"criteo_reader\"\n"
                             "  use_gpu: True\n"
                             "  train_batch_size: 32\n"
                             "  thread_num: 2\n"
                             "  reader_type: \"InmemoryDataset\"\n"
                             "  pipe_command: \"python3 "
                          << kReader << reader_options
                          << "\"\n"
                             "  dataset_debug: False\n"
                             "hyper_parameters:\n"
                             "  sparse_inputs_slots: 27\n"
                             "  sparse_feature_number: 1024\n"
                             "  sparse_feature_dim: 9\n"
                             "  dense_input_dim: 13\n";
    data = model + "/data/sample_data/train/sample_train.txt";
  }
  std::string root;
  std::string config;
  std::string data;
};

// The same instances as reading the slot text directly: what PaddleRec's reader writes is read
// in PaddleRec's field order (click, the 26 slots, dense_feature), with PaddleRec's arguments.
TEST(PaddleRecReader, ItsMultiSlotOutputGivesTheInstancesOfTheSlotText) {
  ScratchDir dir;
  const PaddleRecCheckout prec(dir);
  StatusOr<DatasetConfig> c = load_dataset_config(prec.config);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // PaddleRec appends `<config> <utils>`; the utils folder is the checkout's.
  EXPECT_EQ(c->pipe_arguments,
            (std::vector<std::string>{prec.config, prec.root + "/tools/utils/static_ps"}));
  EXPECT_NE(c->pipe_arguments_note.find("PaddleRec checkout " + prec.root), std::string::npos)
      << c->pipe_arguments_note;

  const Loaded piped = load(*c, {prec.data});
  ASSERT_TRUE(piped.status.ok()) << piped.status.to_string();
  DatasetConfig direct_config = *c;
  direct_config.pipe_command.clear();
  const Loaded direct = load(direct_config, {prec.data});
  ASSERT_TRUE(direct.status.ok()) << direct.status.to_string();
  // Every line is an instance, and the same one both ways.
  EXPECT_EQ(piped.stats.instances, line_count(prec.data));
  EXPECT_EQ(piped.stats.skipped_lines(), 0u);
  EXPECT_EQ(piped.instances, direct.instances);
  ASSERT_EQ(piped.stats.formats.size(), 1u);
  EXPECT_EQ(piped.stats.formats[0].format, "MultiSlot (label, sparse slots, dense)");
  EXPECT_TRUE(piped.stats.formats[0].detected);
  EXPECT_EQ(direct.stats.formats[0].format, "slot text (slot:feasign)");
  const LoadMessages m = load_messages(piped.stats);
  ASSERT_FALSE(m.info.empty());
  EXPECT_EQ(m.info[0],
            "data format: MultiSlot (label, sparse slots, dense) (runner.data_format "
            "auto, recognised from the first lines of " +
                prec.data + ")");
}

TEST(PaddleRecReader, MissingSlotsArePaddedWithKeyZeroWhichIsDroppedNotTheInstance) {
  ScratchDir dir;
  const PaddleRecCheckout prec(dir);
  // Lines without slot 2 and without dense values: the reader pads them with 0 (one key 0,
  // thirteen dense zeros), as PaddleRec's does.
  const std::string data = dir.write("gaps.txt", "click:1 1:5 3:7\nclick:0 2:9\n");
  StatusOr<DatasetConfig> c = load_dataset_config(prec.config);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const Loaded piped = load(*c, {data});
  ASSERT_TRUE(piped.status.ok()) << piped.status.to_string();
  ASSERT_EQ(piped.instances.size(), 2u);
  EXPECT_EQ(piped.instances[0].slots[0], std::vector<std::uint64_t>{5});
  EXPECT_TRUE(piped.instances[0].slots[1].empty());
  EXPECT_EQ(piped.instances[0].dense, std::vector<float>(13, 0.0f));
  // 24 padded slots in the first line, 25 in the second.
  EXPECT_EQ(piped.stats.zero_keys_dropped, 49u);
}

// The ways a reader fails, each said with its cause and how to read the data without it.
TEST(PaddleRecReader, AReaderThatCannotRunSaysWhyAndHowToReadTheDataDirectly) {
  ScratchDir dir;
  struct Case {
    std::string pipe_command;
    std::string args;  // runner.pipe_command_args
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"python3 " + kReader + " --fail-import-paddle",
       "auto",
       {"exit status 1", "No module named 'paddle'", "likely cause: the reader imports Paddle"}},
      {"gpubox_no_such_python " + kReader, "auto", {"exit status 127", "command was not found"}},
      {"python3 " + kReader + " --exit 3", "auto", {"exit status 3"}},
      {"python3 " + kReader,
       "none",
       {"IndexError", "likely cause: the reader wants PaddleRec's `<config> <utils>` arguments"}},
  };
  for (const Case& k : cases) {
    const PaddleRecCheckout prec(dir);
    StatusOr<DatasetConfig> c = load_dataset_config(
        prec.config,
        {"runner.pipe_command=" + k.pipe_command, "runner.pipe_command_args=" + k.args});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const Loaded piped = load(*c, {prec.data});
    ASSERT_FALSE(piped.status.ok()) << k.pipe_command;
    const std::string& message = piped.status.message();
    for (const std::string& want : k.expected) {
      EXPECT_NE(message.find(want), std::string::npos) << "want '" << want << "' in:\n" << message;
    }
    EXPECT_NE(message.find(prec.data), std::string::npos) << message;
    EXPECT_NE(message.find("the reader ran as `" + pipe_command_line(*c) + "`"), std::string::npos)
        << message;
    EXPECT_NE(message.find("-o runner.pipe_command=\"\""), std::string::npos) << message;
    fs::remove_all(prec.root);
  }
}

TEST(PipeCommand, PythonScriptsGetPaddleRecsArgumentsOthersDoNot) {
  EXPECT_TRUE(runs_python_script("python models/rank/dnn/queuedataset_reader.py"));
  EXPECT_TRUE(runs_python_script("python3.7 queuedataset_reader.py"));
  EXPECT_TRUE(runs_python_script("/usr/bin/python3 -u reader.py"));
  EXPECT_TRUE(runs_python_script("PYTHONPATH=x python reader.py"));
  EXPECT_TRUE(runs_python_script("./reader.py"));
  EXPECT_FALSE(runs_python_script("gzip -dc"));
  EXPECT_FALSE(runs_python_script("cat"));
  EXPECT_FALSE(runs_python_script("python -c 'print(1)'"));
  EXPECT_FALSE(runs_python_script("pythonista reader.py"));
  EXPECT_FALSE(runs_python_script(""));
}

TEST(PipeCommand, TheUtilsFolderIsThePaddleRecCheckoutsElseTheConfigsFolder) {
  ScratchDir dir;
  const PaddleRecCheckout prec(dir);
  const std::string model = prec.root + "/models/rank/dnn";
  const std::string utils = prec.root + "/tools/utils/static_ps";
  std::string how;
  EXPECT_EQ(find_paddlerec_utils(model, "/", &how), utils);
  // A config outside the checkout, run from inside it (PaddleRec runs from its root).
  fs::create_directories(dir.file("elsewhere"));
  EXPECT_EQ(find_paddlerec_utils(dir.file("elsewhere"), prec.root, &how), utils);
  // Neither: the config's folder, and the note says where it looked and which key to set.
  EXPECT_EQ(find_paddlerec_utils(dir.file("elsewhere"), dir.file("elsewhere"), &how),
            dir.file("elsewhere"));
  EXPECT_NE(how.find("runner.pipe_utils_path"), std::string::npos) << how;
  EXPECT_NE(how.find("tools/utils/static_ps"), std::string::npos) << how;

  DatasetConfig c;
  c.pipe_command = "python reader.py";
  set_pipe_arguments(config::PipeCommandArgs::kAuto, model + "/c.yaml", "", &c);
  EXPECT_EQ(c.pipe_arguments, (std::vector<std::string>{model + "/c.yaml", utils}));
  EXPECT_EQ(pipe_command_line(c), "python reader.py '" + model + "/c.yaml' '" + utils + "'");
  set_pipe_arguments(config::PipeCommandArgs::kAuto, model + "/c.yaml", "/my/utils", &c);
  EXPECT_EQ(c.pipe_arguments, (std::vector<std::string>{model + "/c.yaml", "/my/utils"}));
  set_pipe_arguments(config::PipeCommandArgs::kNone, model + "/c.yaml", "", &c);
  EXPECT_TRUE(c.pipe_arguments.empty());
  c.pipe_command = "zcat";
  set_pipe_arguments(config::PipeCommandArgs::kAuto, model + "/c.yaml", "", &c);
  EXPECT_TRUE(c.pipe_arguments.empty());
  set_pipe_arguments(config::PipeCommandArgs::kConfigAndUtils, model + "/c.yaml", "", &c);
  EXPECT_EQ(c.pipe_arguments.size(), 2u);
  // A config not read from a file has no path to give.
  set_pipe_arguments(config::PipeCommandArgs::kConfigAndUtils, "", "", &c);
  EXPECT_TRUE(c.pipe_arguments.empty());
}

// The first lines of every format in a 3-slot, 2-dense config.
std::vector<std::string> lines_in(const std::string& format) {
  if (format == "slot")
    return {"click:1 dense_feature:0.5 dense_feature:2 1:10 3:30",
            "click:0 dense_feature:1 dense_feature:0 2:7"};
  if (format == "feasign:slot")
    return {"1:click 0.5:dense_feature 2:dense_feature 10:1 30:3",
            "0:click 1:dense_feature 0:dense_feature 7:2"};
  if (format == "multislot") return {"1 1 1 10 0 1 30 2 0.5 2", "1 0 1 0 1 7 1 0 2 1 0"};
  if (format == "multislot_dense_first")
    return {"1 1 2 0.5 2 1 10 0 1 30", "1 0 2 1 0 1 0 1 7 1 0"};
  if (format == "feat_idx")
    return {
        "feat_idx:1 feat_idx:2 feat_idx:10 feat_idx:0 feat_idx:30 feat_value:0.5 feat_value:2 "
        "feat_value:1 feat_value:0 feat_value:1 label:1"};
  if (format == "idx_value") return {"1 1 2 10 0 30 0.5 2 1 0 1", "0 1 2 7 8 9 1 0 1 1 1"};
  return {};
}

TEST(FormatDetect, EachFormatIsRecognisedFromItsFirstLines) {
  DatasetConfig c = slot_config(3, 2);
  c.data_format = DataFormat::kAuto;
  FormatChooser chooser(c);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"slot", "slot text (slot:feasign)"},
      {"feasign:slot", "slot text (feasign:slot)"},
      {"multislot", "MultiSlot (label, sparse slots, dense)"},
      {"multislot_dense_first", "MultiSlot (label, dense, sparse slots)"},
      {"feat_idx", "feat_idx text (PaddleRec's LR/FM samples)"},
      {"idx_value", "idx_value text (PaddleRec's autoint samples)"},
  };
  for (const auto& [format, description] : cases) {
    FormatNote note;
    const std::size_t chosen = chooser.choose("f", lines_in(format), &note);
    EXPECT_EQ(note.format, description) << format;
    EXPECT_EQ(describe_format(chooser.parser(chosen).config()), description);
    EXPECT_TRUE(note.detected);
    EXPECT_EQ(note.sample_parsed, note.sample_lines) << format;
    EXPECT_TRUE(note.hint.empty()) << note.hint;
    EXPECT_TRUE(note.tie.empty()) << format << ": " << note.tie;
  }
  // Criteo is a candidate only for a config of its shape (26 slots, 13 dense).
  DatasetConfig criteo = slot_config(26, 13);
  criteo.data_format = DataFormat::kAuto;
  std::string line = "1";
  for (int i = 0; i < 13; ++i) line += "\t" + std::to_string(i);
  for (int i = 0; i < 26; ++i) line += "\t68fd1e64";
  FormatChooser criteo_chooser(criteo);
  FormatNote note;
  criteo_chooser.choose("f", {line, line}, &note);
  EXPECT_EQ(note.format, "raw Criteo TSV");
  // Nothing fits: the shape of the lines says why.
  chooser.choose("f", {line}, &note);
  EXPECT_EQ(note.sample_parsed, 0u);
  EXPECT_NE(note.hint.find("raw Criteo TSV, which needs hyper_parameters.sparse_inputs_slots: 27"),
            std::string::npos)
      << note.hint;
}

// Lines two formats read alike (MultiSlot of one value a field, integer dense values: label,
// sparse, dense and label, dense, sparse both parse): the first tried is taken and the other is
// warned with its setting, since the wrong one shifts every field.
TEST(FormatDetect, LinesTwoFormatsReadAlikeAreWarned) {
  DatasetConfig c = slot_config(3, 1);
  c.data_format = DataFormat::kAuto;
  FormatChooser chooser(c);
  FormatNote note;
  chooser.choose("f", {"1 1 1 10 1 20 1 30 1 5", "1 0 1 11 1 21 1 31 1 6"}, &note);
  EXPECT_EQ(note.format, "MultiSlot (label, sparse slots, dense)");
  EXPECT_NE(note.tie.find("MultiSlot (label, dense, sparse slots) (runner.data_format: multislot"),
            std::string::npos)
      << note.tie;
  LoadStats stats;
  note.sample_lines = note.sample_parsed = 2;
  stats.formats = {note, note};
  stats.formats[1].file = "g";
  const LoadMessages m = load_messages(stats);
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_NE(m.warnings[0].find("f (and 1 file more): runner.data_format auto read its first 2 "
                               "lines alike as MultiSlot (label, sparse slots, dense) (taken: "
                               "tried first) and as MultiSlot (label, dense, sparse slots)"),
            std::string::npos)
      << m.warnings[0];
}

// An explicitly configured format that rejects an input's first lines gets the hint of what they
// are (raw Criteo under a slot config: PaddleRec's benchmark_gpubox.yaml with Criteo's files).
TEST(FormatDetect, AWrongExplicitFormatSaysWhatTheLinesLookLike) {
  ScratchDir dir;
  std::string text;
  for (int n = 0; n < 5; ++n) {
    text += std::to_string(n % 2);
    for (int i = 0; i < 13; ++i) text += "\t" + std::to_string(n + i);
    for (int i = 0; i < 26; ++i) text += "\t" + std::to_string(1000 + n * i);
    text += "\n";
  }
  const std::string file = dir.write("day_0", text);
  DatasetConfig c = slot_config(26, 13);
  const Loaded slot = load(c, {file});
  ASSERT_TRUE(slot.status.ok());
  EXPECT_EQ(slot.stats.instances, 0u);
  EXPECT_EQ(slot.stats.skipped_lines(), 5u);
  const LoadMessages m = load_messages(slot.stats);
  ASSERT_EQ(m.warnings.size(), 2u + std::min<std::size_t>(5, c.max_reported_errors));
  EXPECT_EQ(m.warnings.front(), "skipped 5 malformed lines of 5");
  EXPECT_EQ(m.warnings.back(),
            file +
                ": its first 5 lines are not slot text (slot:feasign); these look like raw "
                "Criteo TSV: set runner.data_format: criteo (or runner.data_format: auto)");
  // Under auto the same file is read as Criteo, every line.
  c.data_format = DataFormat::kAuto;
  const Loaded detected = load(c, {file});
  EXPECT_EQ(detected.stats.instances, 5u);
  EXPECT_EQ(detected.stats.formats[0].format, "raw Criteo TSV");
  // Token order and MultiSlot order are named too.
  DatasetConfig slot3 = slot_config(3, 2);
  FormatChooser chooser(slot3);
  FormatNote note;
  chooser.choose("f", lines_in("feasign:slot"), &note);
  EXPECT_EQ(note.hint,
            "these look like slot text (feasign:slot): set runner.data_format: slot, "
            "runner.slot_token_order: feasign:slot (or runner.data_format: auto)");
  slot3.data_format = DataFormat::kMultiSlot;
  FormatChooser multislot(slot3);
  multislot.choose("f", lines_in("multislot_dense_first"), &note);
  EXPECT_EQ(note.hint,
            "these look like MultiSlot (label, dense, sparse slots): set runner.data_format: "
            "multislot, runner.multislot_order: [click, dense_feature, 1, 2, 3] (or "
            "runner.data_format: auto)");
}

// A file of numbers that is idx_value text of another field count is told what idx_value needs
// (its fields against the config's), not only to name a MultiSlot order; numbers that also split
// as MultiSlot fields get both readings.
TEST(FormatDetect, IdxValueOfAnotherFieldCountIsToldTheCountItNeeds) {
  DatasetConfig c = slot_config(3, 2);  // 5 fields: 2 dense features and 3 slots
  c.data_format = DataFormat::kAuto;
  FormatChooser chooser(c);
  FormatNote note;
  // 4 fields: the label, 4 indices, 4 values.
  chooser.choose("f", {"1 1 2 10 30 0.5 2 1 1", "0 1 2 7 9 1 0 1 1"}, &note);
  EXPECT_EQ(note.sample_parsed, 0u);
  const std::string four =
      "idx_value text (PaddleRec's autoint samples) with 4 fields (the label, then 4 indices and "
      "4 values), but the config has 3 sparse slots and dense_input_dim 2: idx_value needs 5 "
      "fields, 11 numbers a line, where these have 9";
  EXPECT_EQ(note.hint, "these look like " + four);
  // Configured as idx_value, the same file gets the same hint.
  DatasetConfig idx_value = c;
  idx_value.data_format = DataFormat::kIdxValue;
  FormatChooser explicit_chooser(idx_value);
  explicit_chooser.choose("f", {"1 1 2 10 30 0.5 2 1 1"}, &note);
  EXPECT_EQ(note.sample_parsed, 0u);
  EXPECT_EQ(note.hint, "these look like " + four);
  // Numbers that split as 6 MultiSlot fields ([1 1] [1 10] [1 20] [1 30] [0] [3 4 5 6]) and read
  // as idx_value of 6 fields.
  chooser.choose("f", {"1 1 1 10 1 20 1 30 0 3 4 5 6"}, &note);
  EXPECT_EQ(note.hint,
            "these look like MultiSlot (`n v1 .. vn` per field) in another field order than the "
            "config's: name it in runner.multislot_order (label_name, slot names, dense_name; "
            "other names are skipped fields); or, as idx_value text (PaddleRec's autoint "
            "samples) with 6 fields (the label, then 6 indices and 6 values), but the config has "
            "3 sparse slots and dense_input_dim 2: idx_value needs 5 fields, 11 numbers a line, "
            "where these have 13");
  // An even count of numbers is no idx_value: the MultiSlot hint alone.
  chooser.choose("f", {"1 1 1 10 1 20 1 30 0 3 4 5"}, &note);
  EXPECT_EQ(note.hint.find("idx_value"), std::string::npos) << note.hint;
  EXPECT_NE(note.hint.find("runner.multislot_order"), std::string::npos) << note.hint;
}

// Auto chooses per file, says it once when all agree and per file when they differ; files read
// as several byte ranges are recognised once, from their first lines.
TEST(FormatDetect, EachFileHasItsOwnFormatAndRangesOfAFileShareIt) {
  ScratchDir dir;
  std::string slot_text;
  std::string multi_text;
  std::mt19937_64 rng(3);
  for (int n = 0; n < 400; ++n) {
    const std::uint64_t a = 1 + rng() % 1000;
    const std::uint64_t b = 1 + rng() % 1000;
    const int label = static_cast<int>(rng() % 2);
    slot_text += std::to_string(label) + ":click 0.5:dense_feature 2:dense_feature " +
                 std::to_string(a) + ":1 " + std::to_string(b) + ":3\n";
    multi_text += "1 " + std::to_string(label) + " 1 " + std::to_string(a) + " 0 1 " +
                  std::to_string(b) + " 2 0.5 2\n";
  }
  const std::string f1 = dir.write("a", slot_text);
  const std::string f2 = dir.write("b", multi_text);
  DatasetConfig c = slot_config(3, 2);
  c.data_format = DataFormat::kAuto;
  c.thread_num = 2;
  c.split_bytes = 1000;  // several ranges per file
  const Loaded both = load(c, {f1, f2});
  ASSERT_TRUE(both.status.ok()) << both.status.to_string();
  EXPECT_EQ(both.stats.instances, 800u);
  EXPECT_EQ(both.stats.skipped_lines(), 0u);
  ASSERT_EQ(both.stats.formats.size(), 2u);  // one note per file, not per range
  EXPECT_EQ(both.instances.size(), 800u);
  for (std::size_t i = 0; i < 400; ++i) EXPECT_EQ(both.instances[i], both.instances[400 + i]);
  const LoadMessages m = load_messages(both.stats);
  EXPECT_EQ(m.info, (std::vector<std::string>{
                        "data format (runner.data_format auto) differs between files:",
                        "  " + f1 + ": slot text (feasign:slot)",
                        "  " + f2 + ": MultiSlot (label, sparse slots, dense)",
                        // Both files fill slots 1 and 3 of the config's 3.
                        "sparse slots 2 (1 of the config's 3) hold no key in any of the 800 "
                        "instances read: they train nothing in this load (does the config name "
                        "slots the data does not fill?)"}));
  const Loaded one = load(c, {f1, f1});
  EXPECT_EQ(load_messages(one.stats).info.front(),
            "data format: slot text (feasign:slot) (runner.data_format auto, recognised from the "
            "first lines of 2 files)");
}

// PaddleRec's slot_dnn data (models/rank/slot_dnn/data): `feasign:slot`, the label is slot 1,
// feasign 0 the padding, slots beyond the model's skipped token by token.
TEST(SlotDnnData, ReadsWithLabelNameOneAndSkipsUnknownSlotTokens) {
  ScratchDir dir;
  const std::string file =
      dir.write("demo",
                "0:1 4351255118977467729:3 16543128959394097760:29 0:2 5:500 6:500 "
                "7:502 8:500\n"
                "1:1 11450961880964427561:3 77:3 8917270926625783717:29 9:501\n");
  const std::string cfg = dir.write("config.yaml",
                                    "runner:\n  label_name: \"1\"\n  train_data_dir: .\n"
                                    "hyper_parameters:\n  sparse_inputs_slots: 300\n"
                                    "  dense_input_dim: 0\n");
  StatusOr<DatasetConfig> c = load_dataset_config(cfg);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->slots.front(), "2");
  ASSERT_EQ(c->slots.back(), "300");
  const Loaded got = load(*c, {file});
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  ASSERT_EQ(got.instances.size(), 2u);
  EXPECT_EQ(got.instances[0].label, 0.0f);
  EXPECT_EQ(got.instances[1].label, 1.0f);
  EXPECT_EQ(got.instances[0].slots[1], std::vector<std::uint64_t>{4351255118977467729ull});
  EXPECT_EQ(got.instances[0].slots[27], std::vector<std::uint64_t>{16543128959394097760ull});
  EXPECT_TRUE(got.instances[0].slots[0].empty());  // slot 2's padding key 0
  EXPECT_EQ(got.stats.zero_keys_dropped, 1u);
  EXPECT_EQ(got.stats.unknown_slot_tokens, 5u);
  // Every distinct name of a line, not only its first.
  EXPECT_EQ(got.stats.unknown_slot_names, (std::vector<std::string>{"500", "502", "501"}));
  const LoadMessages m = load_messages(got.stats);
  ASSERT_EQ(m.info.size(), 4u);
  EXPECT_NE(m.info[2].find("5 tokens of slots the config does not have were skipped"),
            std::string::npos);
  // The config's 299 slots, of which the lines fill 2 (3 and 29; slot 2 held only padding).
  EXPECT_NE(m.info[3].find("sparse slots 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, ... (297 of the "
                           "config's 299) hold no key in any of the 2 instances read"),
            std::string::npos)
      << m.info[3];
  EXPECT_TRUE(m.warnings.empty());
  // More tokens skipped than kept (keys written feasign:slot against a slot:feasign config, a
  // few of whose tokens happen to name a slot): a warning, where a note let the job train on
  // almost nothing.
  const std::string swapped = dir.write("swapped", "1:1 3:900 3:901 3:902\n0:1 3:903 5:7 6:7\n");
  const Loaded few = load(*c, {swapped});
  ASSERT_TRUE(few.status.ok()) << few.status.to_string();
  const LoadMessages warned = load_messages(few.stats);
  ASSERT_EQ(warned.warnings.size(), 1u);
  EXPECT_NE(warned.warnings[0].find("4 tokens of slots the config does not have were skipped, "
                                    "more than the 2 keys read in its slots"),
            std::string::npos)
      << warned.warnings[0];
  // Without label_name the lines have no label: the hint names slot_dnn's.
  StatusOr<DatasetConfig> plain = load_dataset_config(
      cfg, {"runner.label_name=click", "hyper_parameters.sparse_inputs_slots=301"});
  ASSERT_TRUE(plain.ok());
  const Loaded unlabelled = load(*plain, {file});
  EXPECT_EQ(unlabelled.stats.instances, 0u);
  ASSERT_FALSE(unlabelled.stats.formats.empty());
  EXPECT_NE(unlabelled.stats.formats[0].hint.find("runner.label_name: \"1\""), std::string::npos)
      << unlabelled.stats.formats[0].hint;
}

// A line holding more distinct unknown slots than are named: the first kMaxUnknownSlotNames of
// them, each once, then "...". The token order the config sets is the one read.
TEST(SlotDnnData, NamesAtMostTheCapOfUnknownSlotsFromOneLine) {
  ScratchDir dir;
  std::string line = "1:1 4351255118977467729:3";
  for (int s = 600; s < 600 + static_cast<int>(kMaxUnknownSlotNames) + 2; ++s) {
    line +=
        " 11450961880964427561:" + std::to_string(s) + " 8917270926625783717:" + std::to_string(s);
  }
  const std::string file = dir.write("demo", line + "\n");
  const std::string cfg = dir.write("config.yaml",
                                    "runner:\n  label_name: \"1\"\n  train_data_dir: .\n"
                                    "  slot_token_order: feasign:slot\n"
                                    "hyper_parameters:\n  sparse_inputs_slots: 4\n"
                                    "  dense_input_dim: 0\n");
  StatusOr<DatasetConfig> c = load_dataset_config(cfg);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const Loaded got = load(*c, {file});
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  EXPECT_EQ(got.stats.unknown_slot_tokens, 2 * (kMaxUnknownSlotNames + 2));
  ASSERT_EQ(got.stats.unknown_slot_names.size(), kMaxUnknownSlotNames);
  for (std::size_t k = 0; k < kMaxUnknownSlotNames; ++k) {
    EXPECT_EQ(got.stats.unknown_slot_names[k], std::to_string(600 + k));
  }
  // runner.slot_token_order set: the auto format reads that order alone (this line parses in
  // both; read slot:feasign it held no key of the config and 21 unknown tokens).
  ASSERT_FALSE(got.stats.formats.empty());
  EXPECT_EQ(got.stats.formats[0].format, "slot text (feasign:slot)");
  const LoadMessages m = load_messages(got.stats);
  bool named = false;
  for (const std::string& info : m.info) {
    named = named || info.find("600, 601, 602, 603, 604, 605, 606, 607, ...") != std::string::npos;
  }
  EXPECT_TRUE(named);
}

TEST(CostHints, ManyReaderThreadsAndTinyBatchesSayWhatTheyCost) {
  DatasetConfig c = slot_config(2, 0);
  c.thread_num = 12;
  c.batch_size = 2;
  std::vector<std::string> hints = cost_hints(c, 1, 2);
  ASSERT_EQ(hints.size(), 2u);
  EXPECT_NE(hints[0].find("runner.thread_num: 12 reader threads on 2 cores"), std::string::npos);
  EXPECT_NE(hints[1].find("runner.train_batch_size: 2 instance(s) per card per step"),
            std::string::npos);
  c.thread_num = 2;
  c.batch_size = 512;
  EXPECT_TRUE(cost_hints(c, 4, 2).empty());
  EXPECT_TRUE(cost_hints(c, 1, 0).empty());  // core count unknown: nothing said
}

}  // namespace
}  // namespace gpubox::dataset
