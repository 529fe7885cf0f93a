// LineParser against hand-written lines of every format, and every way a line can be wrong.
#include "dataset/line_parser.hpp"

#include <gtest/gtest.h>

#include <cmath>
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
  c.slots = {"user", "item", "007"};
  c.dense_dim = 0;
  c.label_name = "label";
  Parsed p = parse_one(c, "label:1 item:5 user:4 007:3");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{4}, {5}, {3}}));
  // "7" is not "007".
  EXPECT_EQ(reason_of(c, "label:1 7:3"), ParseReason::kUnknownSlot);
}

TEST(SlotFormat, EveryMalformedLineIsRejectedWithItsReason) {
  const DatasetConfig c = slot_config(2, 2);
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

TEST(SlotFormat, IgnoreUnknownSlotsOption) {
  DatasetConfig c = slot_config(1, 0);
  c.ignore_unknown_slots = true;
  Parsed p = parse_one(c, "click:0 1:5 9:6 other:7");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots, (std::vector<std::vector<std::uint64_t>>{{5}}));
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

TEST(MultiSlotFormat, ParsesCountsAndValues) {
  const DatasetConfig c = multislot_config(3, 2);
  Parsed p = parse_one(c, "1 1 2 0.5 1.5 2 10 11 0 1 30\r");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  const PlainInstance got = to_plain(p.block.instance(0));
  EXPECT_EQ(got.label, 1.0f);
  EXPECT_EQ(got.dense, (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ(got.slots, (std::vector<std::vector<std::uint64_t>>{{10, 11}, {}, {30}}));
  // Paddle's padding key 0 is dropped.
  p = parse_one(c, "1 0 2 0 0 1 0 1 5 1 0");
  ASSERT_TRUE(p.result.ok()) << describe(p.result);
  EXPECT_EQ(p.result.zero_keys, 2u);
  EXPECT_EQ(to_plain(p.block.instance(0)).slots,
            (std::vector<std::vector<std::uint64_t>>{{}, {5}, {}}));
}

TEST(MultiSlotFormat, MalformedLines) {
  const DatasetConfig c = multislot_config(2, 1);
  struct Case {
    std::string line;
    ParseReason reason;
  };
  const std::vector<Case> cases = {
      {"2 1 1 0.5 1 5 1 6", ParseReason::kFieldCount},  // label slot with 2 values
      {"1", ParseReason::kFieldCount},                  // label value missing
      {"1 3 1 0.5 1 5 1 6", ParseReason::kBadLabel},
      {"1 1 2 0.5 0.6 1 5 1 6", ParseReason::kTooManyDense},
      {"1 1 0 1 5 1 6", ParseReason::kTooFewDense},
      {"1 1 1 x 1 5 1 6", ParseReason::kBadDense},
      {"1 1 1 0.5 1 5", ParseReason::kFieldCount},        // last slot missing
      {"1 1 1 0.5 3 5 6", ParseReason::kFieldCount},      // count larger than the values
      {"1 1 1 0.5 1 5 1 6 7", ParseReason::kFieldCount},  // extra field
      {"1 1 1 0.5 x 5 1 6", ParseReason::kFieldCount},    // bad count
      {"1 1 1 0.5 1 5a 1 6", ParseReason::kBadKey},
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
