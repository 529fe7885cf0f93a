// What PaddleRec's Python readers make of its model zoo's files, made by GPUBox reading the
// files itself (dataset/paddlerec_readers.hpp), against two oracles: the readers' own output,
// run with PaddlePaddle 2.6.2 and kept in tests/dataset/data/paddlerec (README.md there says how),
// and each reader's formula computed here in float64 from the text.
//  - slot_dnn, its configs and sample unchanged: the label slot "1", no dense input, and its
//    reader's MultiSlot output (show field "0" first) read to the same instances as the sample;
//  - dcn_v2's reader.py: log(x + 1) on the dense features; deepfefm's criteo_reader.py: clipped
//    to [0, 1]; runner.dense_transform choosing another; the start notes naming what was or was
//    not applied.
#include "dataset/paddlerec_readers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/config/config_document.hpp"
#include "dataset/dataset_config.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/loaded_instances.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

namespace fs = std::filesystem;
using testing::load;
using testing::Loaded;
using testing::PlainInstance;
using testing::ScratchDir;
using testing::to_plain;

const std::string kSource = GPUBOX_SOURCE_DIR;
const std::string kData = kSource + "/tests/dataset/data/paddlerec";
const std::string kSlotDnn = kData + "/models/rank/slot_dnn";
// PaddleRec's 80-line Criteo sample: dcn_v2's and deepfefm's are this file, byte for byte.
const std::string kSample = kSource + "/configs/data/sample_data/train/sample_train.txt";

DatasetConfig config_of(const std::string& path, const std::vector<std::string>& overrides = {}) {
  StatusOr<DatasetConfig> c = load_dataset_config(path, overrides);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : DatasetConfig{};
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// slot_dnn's sample read by hand (its reader's rules): `feasign:slot`, the label is slot 1,
// slots 2 .. last_slot kept in slot order and token order, feasign 0 dropped (padding).
std::vector<PlainInstance> slot_dnn_oracle(const std::string& path, int last_slot) {
  std::vector<PlainInstance> out;
  for (const std::string& line : lines_of(path)) {
    PlainInstance p;
    p.slots.resize(static_cast<std::size_t>(last_slot - 1));
    std::istringstream tokens(line);
    for (std::string t; tokens >> t;) {
      const std::size_t colon = t.find(':');
      const int slot = std::stoi(t.substr(colon + 1));
      const std::uint64_t key = std::stoull(t.substr(0, colon));
      if (slot == 1) p.label = static_cast<float>(key);
      if (slot >= 2 && slot <= last_slot && key != 0) p.slots[slot - 2].push_back(key);
    }
    out.push_back(p);
  }
  return out;
}

TEST(SlotDnn, ItsConfigsReadItsSampleWithTheLabelInSlotOneAndNoOptions) {
  for (const auto& [name, last_slot] : std::vector<std::pair<std::string, int>>{
           {"config_online.yaml", 301}, {"config_queuedataset.yaml", 409}}) {
    SCOPED_TRACE(name);
    const DatasetConfig c = config_of(kSlotDnn + "/" + name, {"runner.pipe_command="});
    EXPECT_EQ(c.label_name, "1");
    EXPECT_EQ(c.dense_dim, 0);
    ASSERT_EQ(c.slots.size(), static_cast<std::size_t>(last_slot - 1));  // slot_num
    EXPECT_EQ(c.slots.front(), "2");
    EXPECT_EQ(c.slots.back(), std::to_string(last_slot));
    const Loaded got = load(c, {kSlotDnn + "/data/demo_10"});
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    EXPECT_EQ(got.stats.skipped_lines(), 0u);
    const std::vector<PlainInstance> want = slot_dnn_oracle(kSlotDnn + "/data/demo_10", last_slot);
    ASSERT_EQ(got.instances.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got.instances[i] == want[i]) << i;
    EXPECT_EQ(got.instances[4].label, 1.0f);  // demo_10's fifth line starts with 1:1
  }
}

// With Paddle, slot_dnn's configs run queuedataset_reader.py (runner.pipe_command): its MultiSlot
// lines (show "0" = 1, label "1", slots "2" .. "301", an empty slot written as feasign 0) are the
// same instances as GPUBox's own reading of the sample.
TEST(SlotDnn, ItsReadersMultiSlotOutputGivesTheSameInstances) {
  const DatasetConfig files = config_of(kSlotDnn + "/config_online.yaml", {"runner.pipe_command="});
  DatasetConfig piped = files;
  piped.data_format = DataFormat::kMultiSlot;
  ASSERT_EQ(piped.multislot_order.size(), 302u);
  EXPECT_EQ(piped.multislot_order[0], "0");
  EXPECT_EQ(piped.multislot_order[1], "1");
  const Loaded direct = load(files, {kSlotDnn + "/data/demo_10"});
  const Loaded reader = load(piped, {kData + "/slot_dnn_reader_output.txt"});
  ASSERT_TRUE(reader.status.ok()) << reader.status.to_string();
  EXPECT_EQ(reader.stats.skipped_lines(), 0u);
  ASSERT_EQ(reader.instances.size(), 10u);
  EXPECT_TRUE(reader.instances == direct.instances);
  // The show field is read and skipped whatever it holds (0 included); the line stays.
  ScratchDir dir;
  std::string line = lines_of(kData + "/slot_dnn_reader_output.txt")[0];
  ASSERT_EQ(line.compare(0, 4, "1 1 "), 0);
  const std::string shown0 = dir.write("show0", "1 0 " + line.substr(4) + "\n\n");
  const Loaded zero = load(piped, {shown0});
  ASSERT_EQ(zero.instances.size(), 1u);
  EXPECT_TRUE(zero.instances[0] == direct.instances[0]);
  EXPECT_EQ(zero.stats.blank_lines, 1u);
}

TEST(SlotDnn, ALineWithoutTheLabelSlotIsNamedByFileAndLine) {
  ScratchDir dir;
  const std::string file = dir.write("part-0", "1:1 7:2\n\n5:2 9:3\n");
  DatasetConfig c = config_of(kSlotDnn + "/config_online.yaml", {"runner.pipe_command="});
  const Loaded got = load(c, {file});
  EXPECT_EQ(got.instances.size(), 1u);
  EXPECT_EQ(got.stats.blank_lines, 1u);
  ASSERT_EQ(got.stats.errors.size(), 1u);
  EXPECT_EQ(got.stats.errors[0].to_string(), file + ":3: bad_label: missing label");
  c.strict_parse = true;
  const Loaded strict = load(c, {file});
  EXPECT_FALSE(strict.status.ok());
  EXPECT_NE(strict.status.to_string().find(file + ":3"), std::string::npos)
      << strict.status.to_string();
}

TEST(SlotDnn, TheConfigsOwnLabelDenseAndOrderWin) {
  const DatasetConfig c =
      config_of(kSlotDnn + "/config_online.yaml",
                {"runner.label_name=click", "hyper_parameters.dense_input_dim=2",
                 "runner.multislot_order=[click, dense_feature, '2']"});
  EXPECT_EQ(c.label_name, "click");
  EXPECT_EQ(c.dense_dim, 2);
  EXPECT_EQ(c.multislot_order, (std::vector<std::string>{"click", "dense_feature", "2"}));
  EXPECT_EQ(c.slots.front(), "1");  // numbered slots skip only a numbered label
}

// The order taken from slot_dnn's reader has no dense field: a config that asks for dense
// features is told the order is the reader's, which runner.multislot_order replaces, not that
// the key it never set is wrong.
TEST(SlotDnn, AnOrderTakenFromItsReaderIsBlamedAsTheReadersNotTheKey) {
  const StatusOr<DatasetConfig> c =
      load_dataset_config(kSlotDnn + "/config_online.yaml", {"hyper_parameters.dense_input_dim=2"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(
                "the field order of models/rank/slot_dnn's reader output (runner.multislot_order "
                "replaces it) must name the dense field ('dense_feature', runner.dense_name) "
                "exactly when hyper_parameters.dense_input_dim > 0 (it is 2)"),
            std::string::npos)
      << c.status().to_string();
  const StatusOr<DatasetConfig> own =
      load_dataset_config(kSlotDnn + "/config_online.yaml",
                          {"runner.multislot_order=[click, '2']", "runner.label_name=click",
                           "hyper_parameters.dense_input_dim=2"});
  ASSERT_FALSE(own.ok());
  EXPECT_NE(own.status().message().find("runner.multislot_order must name the dense field"),
            std::string::npos)
      << own.status().to_string();
}

// A models/rank/<model> folder holding `config.yaml` that names `reader` as its reader.
std::string zoo_config(const ScratchDir& dir, const std::string& model, const std::string& reader,
                       const std::string& extra = "") {
  const std::string folder = dir.file("PaddleRec/models/rank/" + model);
  fs::create_directories(folder);
  const std::string path = folder + "/config.yaml";
  std::ofstream(path) << "runner:\n  train_data_dir: \".\"\n  train_reader_path: \"" << reader
                      << "\"\n"
                      << extra
                      << "hyper_parameters:\n  sparse_inputs_slots: 27\n  dense_input_dim: 13\n";
  return path;
}

std::vector<std::vector<float>> dense_of(const Loaded& got) {
  std::vector<std::vector<float>> out;
  for (const PlainInstance& p : got.instances) out.push_back(p.dense);
  return out;
}

// The sample's dense_feature values of each line, through `f` in float64, rounded once.
template <class F>
std::vector<std::vector<float>> formula_oracle(F f) {
  std::vector<std::vector<float>> out;
  for (const std::string& line : lines_of(kSample)) {
    std::vector<float> dense;
    std::istringstream tokens(line);
    for (std::string t; tokens >> t;) {
      if (t.rfind("dense_feature:", 0) == 0)
        dense.push_back(static_cast<float>(f(std::stod(t.substr(14)))));
    }
    out.push_back(dense);
  }
  return out;
}

std::vector<std::vector<float>> reader_oracle(const std::string& file) {
  std::vector<std::vector<float>> out;
  for (const std::string& line : lines_of(kData + "/" + file)) {
    std::vector<float> dense;
    std::istringstream values(line);
    for (double v; values >> v;) dense.push_back(static_cast<float>(v));
    out.push_back(dense);
  }
  return out;
}

TEST(ReaderTransforms, Dcnv2ReaderLogOfXPlusOneMatchesTheReaderAndTheFormula) {
  ScratchDir dir;
  const std::string cfg = zoo_config(dir, "dcn_v2", "reader");
  const DatasetConfig c = config_of(cfg);
  EXPECT_EQ(c.dense_transform, config::DenseTransform::kLog1p);
  ASSERT_EQ(c.reader_notes.size(), 1u);
  EXPECT_NE(c.reader_notes[0].find("models/rank/dcn_v2's reader.py (runner.train_reader_path) "
                                   "applies log(x + 1) to the dense features"),
            std::string::npos)
      << c.reader_notes[0];
  const Loaded got = load(c, {kSample});
  ASSERT_EQ(got.instances.size(), 80u);
  const auto want = formula_oracle([](double x) { return std::log(x + 1.0); });
  EXPECT_TRUE(dense_of(got) == want);
  EXPECT_TRUE(dense_of(got) == reader_oracle("dcn_v2_reader_dense.txt"));
  // Without the transform the values are the file's: the oracle tells them apart.
  const Loaded plain = load(config_of(cfg, {"runner.dense_transform=none"}), {kSample});
  EXPECT_FALSE(dense_of(plain) == want);
  EXPECT_TRUE(dense_of(plain) == formula_oracle([](double x) { return x; }));
}

TEST(ReaderTransforms, DeepfefmReaderClipsToZeroOneAsTheReaderDoes) {
  ScratchDir dir;
  const DatasetConfig c = config_of(zoo_config(dir, "deepfefm", "criteo_reader"));
  EXPECT_EQ(c.dense_transform, config::DenseTransform::kClip01);
  const Loaded got = load(c, {kSample});
  ASSERT_EQ(got.instances.size(), 80u);
  EXPECT_TRUE(dense_of(got) ==
              formula_oracle([](double x) { return std::max(0.0, std::min(1.0, x)); }));
  EXPECT_TRUE(dense_of(got) == reader_oracle("deepfefm_reader_dense.txt"));
}

TEST(ReaderTransforms, ReadersThatRunOrChangeNothingOrAreUnknown) {
  ScratchDir dir;
  // The reader runs itself (pipe_command): GPUBox reads its output as written.
  const DatasetConfig piped =
      config_of(zoo_config(dir, "dcn_v2", "reader", "  pipe_command: \"python reader.py\"\n"));
  EXPECT_EQ(piped.dense_transform, config::DenseTransform::kNone);
  EXPECT_TRUE(piped.reader_notes.empty());
  // A transform asked for beside a command that runs the reader: applied, and said that it may
  // be twice.
  const DatasetConfig twice =
      config_of(zoo_config(dir, "dcn_v2", "reader", "  pipe_command: \"python reader.py\"\n"),
                {"runner.dense_transform=log1p"});
  EXPECT_EQ(twice.dense_transform, config::DenseTransform::kLog1p);
  ASSERT_EQ(twice.reader_notes.size(), 1u);
  EXPECT_NE(twice.reader_notes[0].find("it is applied twice"), std::string::npos)
      << twice.reader_notes[0];
  // The Criteo formats never read through the transform: asked for with them, refused by key.
  const StatusOr<DatasetConfig> criteo = load_dataset_config(
      zoo_config(dir, "dcn_v2", "reader"),
      {"runner.data_format=criteo", "runner.dense_transform=clip01",
       "hyper_parameters.sparse_inputs_slots=27", "hyper_parameters.dense_input_dim=13"});
  ASSERT_FALSE(criteo.ok());
  EXPECT_NE(criteo.status().message().find("runner.dense_transform clip01 applies to slot and "
                                           "multislot data, but runner.data_format is criteo"),
            std::string::npos)
      << criteo.status().to_string();
  // A reader that reads the values as written: nothing applied, nothing said.
  const DatasetConfig dnn = config_of(zoo_config(dir, "dnn", "criteo_reader"));
  EXPECT_EQ(dnn.dense_transform, config::DenseTransform::kNone);
  EXPECT_TRUE(dnn.reader_notes.empty());
  // A reader GPUBox does not know: said at start.
  const DatasetConfig other = config_of(zoo_config(dir, "gatenet", "criteo_reader"));
  EXPECT_EQ(other.dense_transform, config::DenseTransform::kNone);
  ASSERT_EQ(other.reader_notes.size(), 1u);
  EXPECT_NE(other.reader_notes[0].find("models/rank/gatenet's criteo_reader.py "
                                       "(runner.train_reader_path) is not a reader GPUBox knows"),
            std::string::npos)
      << other.reader_notes[0];
  // The benchmark readers' min-max is the criteo format's; another criteo_dense is said.
  const std::string bench = zoo_config(dir, "deepfm", "benchmark_reader");
  EXPECT_NE(config_of(bench).reader_notes.at(0).find("GPUBox's criteo format applies the same"),
            std::string::npos);
  EXPECT_NE(config_of(bench, {"runner.criteo_dense=log"})
                .reader_notes.at(0)
                .find("not applied, runner.criteo_dense is log"),
            std::string::npos);
  // Outside a PaddleRec model folder a reader name decides nothing.
  const std::string loose = dir.write("loose.yaml", "runner:\n  train_reader_path: reader\n");
  EXPECT_TRUE(config_of(loose).reader_notes.empty());
  // An explicit transform applies wherever the files are read; against the reader's, it says so.
  const DatasetConfig forced =
      config_of(zoo_config(dir, "dcn_v2", "reader"), {"runner.dense_transform=clip01"});
  EXPECT_EQ(forced.dense_transform, config::DenseTransform::kClip01);
  EXPECT_NE(forced.reader_notes.at(0).find("clip to [0, 1] instead"), std::string::npos);
}

TEST(ReaderTransforms, ValuesTheTransformCannotTakeAreBadDenseByFileAndLine) {
  ScratchDir dir;
  DatasetConfig c =
      config_of(zoo_config(dir, "dcn_v2", "reader"),
                {"hyper_parameters.dense_input_dim=1", "hyper_parameters.sparse_inputs_slots=2"});
  const std::string file =
      dir.write("part-0", "click:1 dense_feature:-1 1:5\nclick:0 dense_feature:-0.5 1:6\n");
  const Loaded got = load(c, {file});
  ASSERT_EQ(got.instances.size(), 1u);
  EXPECT_EQ(got.instances[0].dense, (std::vector<float>{static_cast<float>(std::log(0.5))}));
  ASSERT_EQ(got.stats.errors.size(), 1u);
  EXPECT_EQ(got.stats.errors[0].to_string(), file + ":1: bad_dense: 'dense_feature:-1'");
}

}  // namespace
}  // namespace gpubox::dataset
