// LineParser against hand-written lines of every format, and every way a line can be wrong.
#include "dataset/line_parser.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dataset/text_number.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::PlainInstance;
using testing::slot_config;
using testing::to_plain;

struct Parsed {
  ParseResult result;
  InstanceBlock block;
};

Parsed parse_one(const DatasetConfig& config, const std::string& line) {
  LineParser parser(config);
  Parsed p{{}, InstanceBlock(static_cast<int>(config.slots.size()), config.dense_dim)};
  p.result = parser.parse(line, &p.block);
  return p;
}

ParseReason reason_of(const DatasetConfig& config, const std::string& line) {
  Parsed p = parse_one(config, line);
  if (!p.result.ok()) {
    EXPECT_EQ(p.block.size(), 0u) << "a rejected line must not leave an instance: " << line;
  }
  return p.result.reason;
}

TEST(SlotFormat, ParsesLabelDenseAndMultiValuedSlots) {
  const DatasetConfig c = slot_config(3, 2);
  Parsed p = parse_one(c, "click:1 dense_feature:0.5 dense_feature:-2e-3 3:30 1:10 3:31 1:11");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  ASSERT_EQ(p.block.size(), 1u);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  EXPECT_EQ(got.dense, (std::vector<float>{0.5f, -2e-3f}));
  // Grouped by slot in config order, order inside a slot kept; slot 2 absent.
  EXPECT_EQ(got.slots, (std::vector<std::vector<std::uint64_t>>{{10, 11}, {}, {30, 31}}));
}

TEST(SlotFormat, ParsesTheShippedSampleLine) {
  const DatasetConfig c = slot_config(26, 13);
  const std::string line =
      "click:0 dense_feature:0.0 dense_feature:0.00497512437811 dense_feature:0.05 "
      "dense_feature:0.08 dense_feature:0.207421875 dense_feature:0.028 dense_feature:0.35 "
      "dense_feature:0.08 dense_feature:0.082 dense_feature:0.0 dense_feature:0.4 "
      "dense_feature:0.0 dense_feature:0.08 1:737395 2:210498 3:903564 4:286224 5:286835 "
      "6:906818 7:906116 8:67180 9:27346 10:51086 11:142177 12:95024 13:157883 14:873363 "
      "15:600281 16:812592 17:228085 18:35900 19:880474 20:984402 21:100885 22:26235 "
      "23:410878 24:798162 25:499868 26:306163";
  Parsed p = parse_one(c, line);
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 0.0f);
  EXPECT_FLOAT_EQ(got.dense[1], 0.00497512437811f);
  EXPECT_EQ(got.slots[0], std::vector<std::uint64_t>{737395});
  EXPECT_EQ(got.slots[25], std::vector<std::uint64_t>{306163});
}

TEST(SlotFormat, FullRangeKeysTabsCrlfAndZeroKeys) {
  const DatasetConfig c = slot_config(2, 0);
  Parsed p = parse_one(c, "click:0\t1:18446744073709551615  2:0 2:7\r");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(p.result.zero_keys, 1u);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.slots, (std::vector<std::vector<std::uint64_t>>{{18446744073709551615ull}, {7}}));
}

TEST(SlotFormat, BlankLinesAreNotInstancesNorErrors) {
  const DatasetConfig c = slot_config(2, 0);
  for (const std::string line : {"", " ", "\t \r", "\r"}) {
    Parsed p = parse_one(c, line);
    EXPECT_TRUE(p.result.ok());
    EXPECT_TRUE(p.result.blank);
    EXPECT_EQ(p.block.size(), 0u);
  }
}

TEST(SlotFormat, FeasignFirstOrder) {
  DatasetConfig c = slot_config(2, 1);
  c.feasign_first = true;
  Parsed p = parse_one(c, "1:click 0.25:dense_feature 99:2 98:1");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  EXPECT_EQ(got.dense, std::vector<float>{0.25f});
  EXPECT_EQ(got.slots, (std::vector<std::vector<std::uint64_t>>{{98}, {99}}));
  // The name-first spelling is now wrong.
  EXPECT_NE(reason_of(c, "click:1 dense_feature:0.25 2:99"), ParseReason::kOk);
}

TEST(SlotFormat, NamedSlotsAndCustomLabelName) {
  DatasetConfig c;
  c.data_format = DataFormat::kSlot;
  c.ignore_unknown_slots = false;
  c.slots = {"user", "item", "007"};
  c.dense_dim = 0;
  c.label_name = "label";
  Parsed p = parse_one(c, "label:1 item:5 user:4 007:3");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{4}, {5}, {3}}));
  // "7" is not "007".
  EXPECT_EQ(reason_of(c, "label:1 7:3"), ParseReason::kUnknownSlot);
  // Numbers past the direct table (65536 and up) are found too.
  c.slots = {"5", "70000", "65536"};
  p = parse_one(c, "label:0 70000:1 5:2 65536:3");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{2}, {1}, {3}}));
}

TEST(SlotFormat, EveryMalformedLineIsRejectedWithItsReason) {
  DatasetConfig c = slot_config(2, 2);
  c.ignore_unknown_slots = false;
  const std::string dense = " dense_feature:1 dense_feature:2";
  struct Case {
    std::string line;
    ParseReason reason;
  };
  const std::vector<Case> cases = {
      {"click:1" + dense + " 1", ParseReason::kBadToken},
      {"click:1" + dense + " :5", ParseReason::kBadToken},
      {"click:1" + dense + " 1:", ParseReason::kBadToken},
      {"click:1" + dense + " 1:2:3", ParseReason::kBadToken},
      {"click:1" + dense + " 3:5", ParseReason::kUnknownSlot},
      {"click:1" + dense + " foo:5", ParseReason::kUnknownSlot},
      {"click:2" + dense + " 1:5", ParseReason::kBadLabel},
      {"click:x" + dense + " 1:5", ParseReason::kBadLabel},
      {"click:0.5" + dense + " 1:5", ParseReason::kBadLabel},
      {"click:1 click:1" + dense + " 1:5", ParseReason::kBadLabel},
      {dense.substr(1) + " 1:5", ParseReason::kBadLabel},
      {"click:1" + dense + " 1:12a", ParseReason::kBadKey},
      {"click:1" + dense + " 1:-5", ParseReason::kBadKey},
      {"click:1" + dense + " 1:18446744073709551616", ParseReason::kBadKey},
      {"click:1 dense_feature:abc dense_feature:2 1:5", ParseReason::kBadDense},
      {"click:1 dense_feature:nan dense_feature:2 1:5", ParseReason::kBadDense},
      {"click:1 dense_feature:inf dense_feature:2 1:5", ParseReason::kBadDense},
      {"click:1 dense_feature:1e99 dense_feature:2 1:5", ParseReason::kBadDense},
      {"click:1" + dense + " dense_feature:3 1:5", ParseReason::kTooManyDense},
      {"click:1 dense_feature:1 1:5", ParseReason::kTooFewDense},
  };
  for (const Case& k : cases) EXPECT_EQ(reason_of(c, k.line), k.reason) << k.line;
}

// A dense value under the smallest float is that float's nearest (0, or a denormal), as Python's
// float() reads it, not a malformed line (the line was skipped as bad_dense); above the largest
// it is still refused.
TEST(SlotFormat, ADenseValueTooSmallForAFloatIsItsNearestNotAMalformedLine) {
  const DatasetConfig c = slot_config(1, 3);
  Parsed p =
      parse_one(c, "click:1 dense_feature:1e-46 dense_feature:-1e-400 dense_feature:1.4e-45 1:5");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const std::vector<float> dense = to_plain(p.block.instance(0)).dense;
  ASSERT_EQ(dense.size(), 3u);
  EXPECT_EQ(dense[0], 0.0f);
  EXPECT_EQ(dense[1], 0.0f);
  EXPECT_TRUE(std::signbit(dense[1]));
  EXPECT_EQ(dense[2], std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(reason_of(c, "click:1 dense_feature:1e39 dense_feature:0 dense_feature:0 1:5"),
            ParseReason::kBadDense);
  EXPECT_EQ(reason_of(c, "click:1 dense_feature:-1e400 dense_feature:0 dense_feature:0 1:5"),
            ParseReason::kBadDense);
  EXPECT_EQ(reason_of(c, "click:1 dense_feature:1e-50x dense_feature:0 dense_feature:0 1:5"),
            ParseReason::kBadDense);
}

TEST(SlotFormat, UnknownSlotTokensAreSkippedAndCountedLikePaddleRecsReaders) {
  DatasetConfig c = slot_config(1, 0);
  ASSERT_TRUE(c.ignore_unknown_slots);  // the default, as PaddleRec's readers skip the token
  const std::string line = "click:0 1:5 9:6 other:7 1:8 9:4";  // unknown_names point into it
  Parsed p = parse_one(c, line);
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots, (std::vector<std::vector<std::uint64_t>>{{5, 8}}));
  EXPECT_EQ(p.result.unknown_tokens, 3u);
  ASSERT_EQ(p.result.unknown_name_count, 2u);  // each distinct name once, in line order
  EXPECT_EQ(p.result.unknown_names[0], "9");
  EXPECT_EQ(p.result.unknown_names[1], "other");
  p = parse_one(c, "click:0 1:5");
  EXPECT_EQ(p.result.unknown_tokens, 0u);
  EXPECT_EQ(p.result.unknown_name_count, 0u);
  c.ignore_unknown_slots = false;
  EXPECT_EQ(reason_of(c, "click:0 1:5 9:6"), ParseReason::kUnknownSlot);
}

// PaddleRec's slot_dnn data: `feasign:slot` tokens, the label in slot "1" (`0:1` is label 0),
// sparse slots numbered from 2, feasigns over the whole uint64 range.
TEST(SlotFormat, SlotDnnLinesWithTheLabelInSlotOne) {
  DatasetConfig c;
  c.data_format = DataFormat::kSlot;
  c.feasign_first = true;
  c.label_name = "1";
  c.slots = numbered_slots(4, c.label_name);
  ASSERT_EQ(c.slots, (std::vector<std::string>{"2", "3", "4"}));
  Parsed p = parse_one(c, "1:1 4351255118977467729:3 0:3 16543128959394097760:4 77:409");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  EXPECT_EQ(got.slots, (std::vector<std::vector<std::uint64_t>>{
                           {}, {4351255118977467729ull}, {16543128959394097760ull}}));
  // Feasign 0 is Paddle's padding: dropped, counted, the instance kept. Slot 409 is not the
  // model's: its token is skipped and counted.
  EXPECT_EQ(p.result.zero_keys, 1u);
  EXPECT_EQ(p.result.unknown_tokens, 1u);
  p = parse_one(c, "0:1 5:2");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).label, 0.0f);
}

TEST(NumberedSlots, CountTheLabelAndSkipItsName) {
  EXPECT_EQ(numbered_slots(4), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(numbered_slots(4, "click"), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(numbered_slots(4, "2"), (std::vector<std::string>{"1", "3", "4"}));
  EXPECT_EQ(numbered_slots(2, "1"), (std::vector<std::string>{"2"}));
  EXPECT_TRUE(numbered_slots(1).empty());
}

TEST(SlotFormat, DescribeNamesTheToken) {
  const DatasetConfig c = slot_config(1, 0);
  Parsed p = parse_one(c, "click:1 1:12a");
  EXPECT_EQ(describe(p.result), "'1:12a'");
  p = parse_one(c, "1:5");
  EXPECT_EQ(describe(p.result), "missing label");
}

DatasetConfig multislot_config(int slots, int dense) {
  DatasetConfig c = slot_config(slots, dense);
  c.data_format = DataFormat::kMultiSlot;
  return c;
}

// The default order is PaddleRec's readers': label (`click`), the sparse slots, dense_feature.
TEST(MultiSlotFormat, ParsesCountsAndValuesInPaddleRecsOrder) {
  const DatasetConfig c = multislot_config(3, 2);
  Parsed p = parse_one(c, "1 1 2 10 11 0 1 30 2 0.5 1.5\r");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  EXPECT_EQ(got.dense, (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ(got.slots, (std::vector<std::vector<std::uint64_t>>{{10, 11}, {}, {30}}));
  // PaddleRec's reader pads an empty slot with one 0 and a missing dense_feature with zeros:
  // the padding key is dropped (as Paddle's DataFeed drops it), the instance kept.
  p = parse_one(c, "1 0 1 0 1 5 1 0 2 0 0");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(p.result.zero_keys, 2u);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{}, {5}, {}}));
  EXPECT_EQ(to_plain(p.block.instance(0)).dense, (std::vector<float>{0.0f, 0.0f}));
}

TEST(MultiSlotFormat, MultislotOrderNamesTheFields) {
  // GPUBox's older writer: label, dense, sparse.
  DatasetConfig c = multislot_config(3, 2);
  c.multislot_order = {"click", "dense_feature", "1", "2", "3"};
  Parsed p = parse_one(c, "1 1 2 0.5 1.5 2 10 11 0 1 30");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{10, 11}, {}, {30}}));
  // slot_dnn's reader: a show field "0" first (read and skipped), the label in field "1", then
  // the slots; here in another order than the config's, and without dense values.
  DatasetConfig dnn = multislot_config(0, 0);
  dnn.label_name = "1";
  dnn.slots = {"2", "3", "4"};
  dnn.multislot_order = {"0", "1", "4", "2", "3"};
  p = parse_one(dnn, "1 1 1 0 1 40 2 20 21 1 0");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).label, 0.0f);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{20, 21}, {}, {40}}));
  EXPECT_EQ(reason_of(dnn, "1 1 1 0 1 40 2 20 21"), ParseReason::kFieldCount);
  // The order must name the label, and the dense field exactly when there are dense values.
  dnn.multislot_order = {"0", "4", "2", "3"};
  EXPECT_FALSE(validate(dnn).ok());
  dnn.multislot_order = {"1", "dense_feature", "2"};
  EXPECT_FALSE(validate(dnn).ok());
  dnn.multislot_order = {"1", "2", "2"};
  EXPECT_FALSE(validate(dnn).ok());
}

// PaddleRec's LR and FM samples (models/rank/logistic_regression, fm): 39 feat_idx, 39
// feat_value, the label last. The first 13 fields are the dense values; each later field is a
// slot keyed by its feat_idx, empty when its value is 0 (it adds nothing to PaddleRec's LR/FM).
TEST(FeatIdxFormat, ParsesPaddleRecsLrSampleLine) {
  DatasetConfig c = slot_config(26, 13);
  c.data_format = DataFormat::kFeatIdx;
  std::string line;
  std::vector<std::uint64_t> idx = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 13};
  std::vector<std::string> value = {
      "0.00017316017316", "1.55232499476e-05", "7.6e-05", "0.0",   "5.9e-05", "9.2e-06",
      "0.00026",          "0.00033",           "0.0062",  "0.021", "0.0086",  "0.0",
      "0.00027"};
  for (int s = 0; s < 26; ++s) {
    idx.push_back(s == 2 ? 0 : 695357 + static_cast<std::uint64_t>(s));
    value.push_back(s == 2 || s == 11 ? "0.0" : "1.0");
  }
  for (std::uint64_t i : idx) line += "feat_idx:" + std::to_string(i) + " ";
  for (const std::string& v : value) line += "feat_value:" + v + " ";
  line += "label:1";
  Parsed p = parse_one(c, line);
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  ASSERT_EQ(got.dense.size(), 13u);
  EXPECT_EQ(got.dense[0], 0.00017316017316f);
  EXPECT_EQ(got.dense[11], 0.0f);
  for (int s = 0; s < 26; ++s) {
    const std::vector<std::uint64_t> want =
        s == 2 || s == 11 ? std::vector<std::uint64_t>{}
                          : std::vector<std::uint64_t>{695357 + static_cast<std::uint64_t>(s)};
    EXPECT_EQ(got.slots[s], want) << "slot " << s;
  }
  EXPECT_EQ(p.result.zero_keys, 1u);  // slot 2's feat_idx 0
  // Counts must pair up and match the config; the label is needed once.
  EXPECT_EQ(reason_of(c, "feat_idx:1 feat_value:1 label:0"), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, line.substr(0, line.size() - 8)), ParseReason::kBadLabel);
  EXPECT_EQ(reason_of(c, "feat_idx:x " + line), ParseReason::kBadKey);
  EXPECT_EQ(reason_of(c, "feat_value:x " + line), ParseReason::kBadDense);
  EXPECT_EQ(reason_of(c, "other:1 " + line), ParseReason::kBadToken);
}

// PaddleRec autoint's sample (models/rank/autoint/data/sample_data/train, its first line): the
// label, 39 indices, 39 values; the first 13 fields are the dense values (indices 1..13, the
// fields' numbers), each later one a slot keyed by its index.
TEST(IdxValueFormat, ParsesPaddleRecsAutointSampleLine) {
  DatasetConfig c = slot_config(26, 13);
  c.data_format = DataFormat::kIdxValue;
  const std::string line =
      "0 1 2 3 4 5 6 7 8 9 10 11 12 13 41 1466 2018 177793 306302 306607 306816 318556 319185 "
      "319189 360699 365579 540646 543583 543880 554870 720072 720201 724686 726703 726714 "
      "899031 899049 899064 955520 955606 2.0000000 0.0000000 1.0000000 6.0000000 44.0000000 "
      "20.0000000 1.0000000 2.0000000 30.0000000 1.0000000 1.0000000 1.0000000 14.0000000 "
      "1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 "
      "1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 1.0000000 "
      "1.0000000 1.0000000 0.0000000 0.0000000 1.0000000 1.0000000 1.0000000 1.0000000 "
      "0.0000000 0.0000000";
  Parsed p = parse_one(c, line);
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 0.0f);
  EXPECT_EQ(got.dense, (std::vector<float>{2, 0, 1, 6, 44, 20, 1, 2, 30, 1, 1, 1, 14}));
  EXPECT_EQ(got.slots[0], std::vector<std::uint64_t>{41});
  EXPECT_EQ(got.slots[13], std::vector<std::uint64_t>{543583});
  // Slots 18, 19, 24 and 25 have the value 0: empty, as in PaddleRec's network, where their
  // embedding is multiplied by 0.
  for (int s : {18, 19, 24, 25}) EXPECT_TRUE(got.slots[s].empty()) << "slot " << s;
  EXPECT_EQ(got.slots[17], std::vector<std::uint64_t>{720201});
  EXPECT_EQ(reason_of(c, line.substr(0, line.rfind(' '))), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, line + " 1.0"), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, "x" + line.substr(1)), ParseReason::kBadLabel);
  EXPECT_EQ(reason_of(c, "0 x" + line.substr(3)), ParseReason::kBadKey);
  // An index missing: told by the count, not by a value read as an index.
  EXPECT_EQ(reason_of(c, "0 " + line.substr(4)), ParseReason::kFieldCount);
}

// PaddleRec flen's Avazu sample (models/rank/flen/data/sample_data/train, its first line): an id
// its net never reads, 22 indices (slots 1..22), the label last; each index is the key index + 1
// of its slot (one key space for every slot: one embedding table; index 0 is a row, key 0 none).
TEST(AvazuFormat, ParsesPaddleRecsFlenSampleLine) {
  DatasetConfig c = slot_config(22, 0);
  c.data_format = DataFormat::kAvazu;
  const std::string line = "9,0,0,0,0,1,2,0,0,0,1,9,6,1,1,7,0,0,3,1,3,2,3,1";
  Parsed p = parse_one(c, line);
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  EXPECT_TRUE(got.dense.empty());
  const std::vector<std::uint64_t> want = {1, 1, 1, 1, 2, 3, 1, 1, 1, 2, 10,
                                           7, 2, 2, 8, 1, 1, 4, 2, 4, 3, 4};
  for (int s = 0; s < 22; ++s) {
    EXPECT_EQ(got.slots[s], std::vector<std::uint64_t>{want[s]}) << "slot " << s;
  }
  EXPECT_EQ(p.result.zero_keys, 0u);
  EXPECT_EQ(reason_of(c, line.substr(0, line.rfind(','))), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, line + ",0"), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, line.substr(0, line.size() - 1) + "x"), ParseReason::kBadLabel);
  EXPECT_EQ(reason_of(c, "9,x" + line.substr(3)), ParseReason::kBadKey);
  EXPECT_EQ(reason_of(c, "9,-1" + line.substr(3)), ParseReason::kBadKey);
  // The id is checked as an integer too (avazu_reader.py's astype('int64') fails on it).
  EXPECT_EQ(reason_of(c, "x" + line.substr(1)), ParseReason::kBadKey);
  // With dense features configured, the format is refused (it has none).
  c.dense_dim = 1;
  EXPECT_FALSE(validate(c).ok());
}

TEST(MultiSlotFormat, MalformedLines) {
  const DatasetConfig c = multislot_config(2, 1);
  struct Case {
    std::string line;
    ParseReason reason;
  };
  const std::vector<Case> cases = {
      {"2 1 1 5 1 6 1 0.5", ParseReason::kFieldCount},  // label field with 2 values
      {"1", ParseReason::kFieldCount},                  // label value missing
      {"1 3 1 5 1 6 1 0.5", ParseReason::kBadLabel},
      {"1 1 1 5 1 6 2 0.5 0.6", ParseReason::kTooManyDense},
      {"1 1 1 5 1 6 0", ParseReason::kTooFewDense},
      {"1 1 1 5 1 6 1 x", ParseReason::kBadDense},
      {"1 1 1 5 1 6", ParseReason::kFieldCount},          // dense field missing
      {"1 1 3 5 6", ParseReason::kFieldCount},            // count larger than the values
      {"1 1 1 5 1 6 1 0.5 7", ParseReason::kFieldCount},  // extra field
      {"1 1 x 5 1 6 1 0.5", ParseReason::kFieldCount},    // bad count
      {"1 1 1 5a 1 6 1 0.5", ParseReason::kBadKey},
  };
  for (const Case& k : cases) EXPECT_EQ(reason_of(c, k.line), k.reason) << k.line;
}

DatasetConfig criteo_config(CriteoDense transform) {
  DatasetConfig c = slot_config(26, 13);
  c.data_format = DataFormat::kCriteo;
  c.criteo_dense = transform;
  return c;
}

std::string criteo_line(const std::string& label, const std::vector<std::string>& ints,
                        const std::vector<std::string>& cats) {
  std::string line = label;
  for (const auto& v : ints) line += "\t" + v;
  for (const auto& v : cats) line += "\t" + v;
  return line;
}

TEST(CriteoFormat, NormalisesIntegersAndHashesCategoricalsPerSlot) {
  std::vector<std::string> ints = {"",  "0",  "5", "4", "13275", "14", "35",
                                   "4", "41", "",  "4", "",      "4"};
  std::vector<std::string> cats(26, "68fd1e64");
  cats[3] = "";  // missing categorical: empty slot
  Parsed p = parse_one(criteo_config(CriteoDense::kMinMax), criteo_line("1", ints, cats));
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  // PaddleRec's min/diff: the shipped sample's first line has these values.
  const std::vector<double> want = {
      0.0, 0.00497512437811, 0.05, 0.08, 0.207421875, 0.028, 0.35, 0.08, 0.082, 0.0, 0.4, 0.0,
      0.08};
  for (int j = 0; j < 13; ++j) EXPECT_NEAR(got.dense[j], want[j], 1e-6) << j;
  EXPECT_TRUE(got.slots[3].empty());
  // Same value, different slots: different keys; each key is the documented hash.
  EXPECT_NE(got.slots[0][0], got.slots[1][0]);
  EXPECT_EQ(got.slots[0][0], LineParser::criteo_key("68fd1e64", 0));
  EXPECT_EQ(got.slots[25][0], LineParser::criteo_key("68fd1e64", 25));
}

TEST(CriteoFormat, LogAndNoneTransforms) {
  std::vector<std::string> ints(13, "");
  ints[0] = "3";
  ints[1] = "-2";
  const std::vector<std::string> cats(26, "a");
  Parsed log = parse_one(criteo_config(CriteoDense::kLog), criteo_line("0", ints, cats));
  ASSERT_TRUE(log.result.ok());
  EXPECT_FLOAT_EQ(log.block.dense[0], static_cast<float>(std::log1p(3.0)));
  EXPECT_FLOAT_EQ(log.block.dense[1], 0.0f);
  Parsed none = parse_one(criteo_config(CriteoDense::kNone), criteo_line("0", ints, cats));
  ASSERT_TRUE(none.result.ok());
  EXPECT_FLOAT_EQ(none.block.dense[0], 3.0f);
  EXPECT_FLOAT_EQ(none.block.dense[1], -2.0f);
}

TEST(CriteoFormat, MalformedLines) {
  const DatasetConfig c = criteo_config(CriteoDense::kMinMax);
  const std::vector<std::string> ints(13, "1");
  const std::vector<std::string> cats(26, "ab");
  std::vector<std::string> short_cats(25, "ab");
  std::vector<std::string> bad_ints = ints;
  bad_ints[4] = "1.5";
  EXPECT_EQ(reason_of(c, criteo_line("1", ints, short_cats)), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, criteo_line("1", ints, cats) + "\textra"), ParseReason::kFieldCount);
  EXPECT_EQ(reason_of(c, criteo_line("2", ints, cats)), ParseReason::kBadLabel);
  EXPECT_EQ(reason_of(c, criteo_line("", ints, cats)), ParseReason::kBadLabel);
  EXPECT_EQ(reason_of(c, criteo_line("1", bad_ints, cats)), ParseReason::kBadDense);
  EXPECT_EQ(reason_of(c, criteo_line("1", ints, cats) + "\r"), ParseReason::kOk);
}

// Spaces at a line's end are not part of its last categorical: the same key as without them,
// and a missing last categorical followed by spaces stays missing (both became other keys).
TEST(CriteoFormat, SpacesAtTheLineEndAreNotPartOfTheLastValue) {
  const DatasetConfig c = criteo_config(CriteoDense::kMinMax);
  const std::vector<std::string> ints(13, "1");
  std::vector<std::string> cats(26, "ab");
  const PlainInstance plain =
      to_plain(parse_one(c, criteo_line("1", ints, cats)).block.instance(0));
  const Parsed spaced = parse_one(c, criteo_line("1", ints, cats) + "  \r");
  ASSERT_TRUE(spaced.result.ok()) << describe(spaced.result);
  EXPECT_EQ(to_plain(spaced.block.instance(0)).slots, plain.slots);
  cats.back() = "";
  const Parsed missing = parse_one(c, criteo_line("1", ints, cats) + "   ");
  ASSERT_TRUE(missing.result.ok()) << describe(missing.result);
  EXPECT_TRUE(to_plain(missing.block.instance(0)).slots[25].empty());
}

// A rejected token's control bytes (a compressed file's ESC, NUL, CR) are written \xNN in the
// detail that terminals and logs show; other bytes as they are; cut to 64 bytes.
TEST(Describe, ControlBytesOfARejectedTokenAreEscaped) {
  const DatasetConfig c = slot_config(2, 0);
  // The result's token views the line: the lines outlive it.
  const std::string binary("click:1 \x1b[2J\x7f\x01\xc3\xa9\x00z 1:5", 22);
  const Parsed p = parse_one(c, binary);
  ASSERT_FALSE(p.result.ok());
  EXPECT_EQ(describe(p.result), "'\\x1b[2J\\x7f\\x01\xc3\xa9\\x00z'");
  const std::string long_token = "click:1 " + std::string(70, 'q') + " 1:5";
  EXPECT_EQ(describe(parse_one(c, long_token).result), "'" + std::string(64, 'q') + "'...");
}

// C1 controls are escaped too, as a lone byte (0x9b: CSI to a Latin-1 terminal) or as UTF-8
// (U+009B), as is every byte that is not well-formed UTF-8 (overlong, surrogate, cut short);
// well-formed UTF-8 of 2, 3 and 4 bytes stays as it is.
TEST(Describe, PrintableEscapesC1AndBytesThatAreNotUtf8) {
  EXPECT_EQ(printable("a\x9b"
                      "2Jb"),
            "a\\x9b2Jb");
  EXPECT_EQ(printable("\xc2\x9b"
                      "2J"),
            "\\xc2\\x9b2J");
  EXPECT_EQ(printable("\xc2\xa0\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
            "\xc2\xa0\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(printable("x\xe2\x82"), "x\\xe2\\x82");         // cut short
  EXPECT_EQ(printable(""), "");
}

TEST(TextNumber, ParseU64EdgesAgainstStrtoull) {
  std::uint64_t v = 0;
  EXPECT_TRUE(parse_u64("18446744073709551615", &v));
  EXPECT_EQ(v, 18446744073709551615ull);
  EXPECT_TRUE(parse_u64("00000000000000000001", &v));
  EXPECT_EQ(v, 1u);
  EXPECT_TRUE(parse_u64("+7", &v));
  EXPECT_EQ(v, 7u);
  for (const char* bad : {"", "+", "-1", "1a", "a1", " 1", "18446744073709551616",
                          "99999999999999999999", "000000000000000000001", "1.0"}) {
    EXPECT_FALSE(parse_u64(bad, &v)) << bad;
  }
  std::mt19937_64 rng(9);
  for (int i = 0; i < 10000; ++i) {
    const std::uint64_t want = rng() >> (rng() % 64);
    ASSERT_TRUE(parse_u64(std::to_string(want), &v));
    EXPECT_EQ(v, want);
  }
}

TEST(Config, ValidateRejectsInconsistentConfigs) {
  DatasetConfig c = slot_config(2, 1);
  EXPECT_TRUE(validate(c).ok());
  c.slots.push_back("1");
  EXPECT_FALSE(validate(c).ok());
  c = slot_config(2, 1);
  c.slots.push_back("click");
  EXPECT_FALSE(validate(c).ok());
  c = slot_config(2, 1);
  c.data_format = DataFormat::kCriteo;
  EXPECT_NE(validate(c).message().find("26"), std::string::npos);
  c = slot_config(2, 1);
  c.thread_num = 0;
  EXPECT_FALSE(validate(c).ok());
  EXPECT_THROW(LineParser{c}, Error);
  EXPECT_EQ(numbered_slots(4), (std::vector<std::string>{"1", "2", "3"}));
}

}  // namespace
}  // namespace gpubox::dataset
