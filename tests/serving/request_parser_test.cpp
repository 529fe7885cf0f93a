// gpubox_serve's request bodies: JSON and slot text against the dataset's own line parser (the
// oracle for slot text), each error naming what is wrong, and random bodies never crashing.
#include "serving/request_parser.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dataset/line_parser.hpp"

namespace gpubox::serving {
namespace {

ServingSpec spec(int dense_dim = 2) {
  ServingSpec s;
  s.slot_names = {"1", "2", "user"};
  s.model.slots = 3;
  s.model.dense_dim = dense_dim;
  s.label_name = "click";
  s.dense_name = "dense_feature";
  return s;
}

// Instance i's keys of slot s.
std::vector<uint64_t> slot_keys(const dataset::InstanceBlock& block, std::size_t i, int s) {
  const dataset::InstanceRef ref = block.instance(i);
  const uint64_t* key = ref.keys;
  for (int t = 0; t < s; ++t) key += ref.slot_sizes[t];
  return {key, key + ref.slot_sizes[s]};
}

TEST(RequestParser, JsonInstancesGroupKeysBySlotInTheModelsOrder) {
  const RequestParser parser(spec(), 100);
  auto block = parser.parse(
      R"({"instances": [
            {"slots": {"user": [7, "18446744073709551615"], "1": [5, 0, 6]}, "dense": [0.5, -2]},
            {"dense": [1, 2]}]})",
      BodyForm::kAuto);
  ASSERT_TRUE(block.ok()) << block.status().to_string();
  ASSERT_EQ(block->size(), 2u);
  EXPECT_EQ(slot_keys(*block, 0, 0), (std::vector<uint64_t>{5, 6}));  // key 0 is padding
  EXPECT_EQ(slot_keys(*block, 0, 1), (std::vector<uint64_t>{}));
  EXPECT_EQ(slot_keys(*block, 0, 2), (std::vector<uint64_t>{7, 18446744073709551615ull}));
  EXPECT_EQ(block->instance(0).dense[0], 0.5f);
  EXPECT_EQ(block->instance(0).dense[1], -2.0f);
  EXPECT_EQ(block->instance(1).num_keys(), 0u);

  auto single = parser.parse(R"({"slots": {"2": [9]}, "dense": [0, 0]})", BodyForm::kJson);
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  ASSERT_EQ(single->size(), 1u);
  EXPECT_EQ(slot_keys(*single, 0, 1), (std::vector<uint64_t>{9}));
  const auto empty = parser.parse(R"({"instances": []})", BodyForm::kJson);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0u);
}

TEST(RequestParser, JsonErrorsSayWhatIsWrong) {
  const RequestParser parser(spec(), 2);
  auto error = [&](const std::string& body) {
    const auto got = parser.parse(body, BodyForm::kJson);
    EXPECT_FALSE(got.ok()) << body;
    return got.ok() ? std::string() : got.status().message();
  };
  EXPECT_NE(error(R"({"instances": [)").find("invalid JSON"), std::string::npos);
  EXPECT_NE(error("[1, 2]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(error(std::string(100000, '[')).find("nested deeper than 8"), std::string::npos);
  // Found by fuzz_request_parser: a number past a double's range is an error, not a throw.
  EXPECT_NE(
      error(R"({"slots": {"1": [166e84463440937095]}, "dense": [0, 0]})").find("invalid JSON"),
      std::string::npos);
  EXPECT_NE(error(R"({"slots": {"1": [[[[[[[1]]]]]]]}, "dense": [0, 0]})").find("nested deeper"),
            std::string::npos);
  EXPECT_NE(error(R"({"slots": {"17": [1]}, "dense": [0, 0]})").find("unknown slot \"17\""),
            std::string::npos);
  EXPECT_NE(error(R"({"slots": {"1": [-1]}, "dense": [0, 0]})").find("key -1"), std::string::npos);
  EXPECT_NE(error(R"({"slots": {"1": [1.5]}, "dense": [0, 0]})").find("key 1.5"),
            std::string::npos);
  // A whole float is refused too, as a float (it was called "not a whole number").
  const std::string whole_float = error(R"({"slots": {"1": [1e3]}, "dense": [0, 0]})");
  EXPECT_NE(whole_float.find("is a JSON float"), std::string::npos) << whole_float;
  EXPECT_EQ(whole_float.find("not a whole number"), std::string::npos) << whole_float;
  EXPECT_NE(error(R"({"slots": {"1": ["18446744073709551616"]}, "dense": [0, 0]})").find("key"),
            std::string::npos);
  EXPECT_NE(error(R"({"slots": {"1": 5}, "dense": [0, 0]})").find("list of keys"),
            std::string::npos);
  EXPECT_NE(error(R"({"slots": {}, "dense": [0]})").find("list of 2 numbers"), std::string::npos);
  EXPECT_NE(error(R"({"slots": {}, "dense": [0, "x"]})").find("dense value 1 (\"x\")"),
            std::string::npos);
  EXPECT_NE(error(R"({"slots": {}})").find("\"dense\" (2 numbers) is missing"), std::string::npos);
  EXPECT_NE(error(R"({"slots": {}, "dense": [0, 0], "label": 1})").find("unknown field \"label\""),
            std::string::npos);
  EXPECT_NE(error(R"({"instances": [{"dense": [0, 0]}, 3]})").find("instance 1:"),
            std::string::npos);
  const auto too_many =
      parser.parse(R"({"instances": [{"dense": [0, 0]}, {"dense": [0, 0]}, {"dense": [0, 0]}]})",
                   BodyForm::kJson);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), Status::Code::kResourceExhausted);
}

// A dense value past float's range would become inf (and the model answer a constant): refused
// naming the value, at both ends of the range; the largest float itself is accepted.
TEST(RequestParser, DenseValuesBeyondFloatRangeAreRefused) {
  const RequestParser parser(spec(), 2);
  for (const char* value : {"3.5e38", "-3.5e38", "1e300"}) {
    const std::string body = std::string(R"({"slots": {}, "dense": [0, )") + value + "]}";
    const auto got = parser.parse(body, BodyForm::kJson);
    ASSERT_FALSE(got.ok()) << body;
    EXPECT_EQ(got.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(got.status().message().find("dense value 1 ("), std::string::npos)
        << got.status().to_string();
    EXPECT_NE(got.status().message().find("within float range"), std::string::npos);
  }
  const auto max =
      parser.parse(R"({"slots": {}, "dense": [3.4028234e38, -1e-45]})", BodyForm::kJson);
  ASSERT_TRUE(max.ok()) << max.status().to_string();
  EXPECT_TRUE(std::isfinite(max->instance(0).dense[0]));
}

// The JSON parser keeps the last of a repeated key; a request that repeats one is ambiguous and
// refused naming the key, at every level.
TEST(RequestParser, DuplicateJsonKeysAreRefusedNamingTheKey) {
  const RequestParser parser(spec(), 2);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"slots": {}, "dense": [0, 0], "dense": [1, 1]})", "\"dense\" in the top-level"},
      {R"({"slots": {"1": [5], "1": [6]}, "dense": [0, 0]})", "\"1\" in an object under \"slots\""},
      {R"({"instances": [{"dense": [0, 0]}, {"dense": [0, 0], "dense": [1, 2]}]})",
       "\"dense\" in an object under \"instances\""},
      {R"({"instances": [], "instances": []})", "\"instances\""},
  };
  for (const auto& [body, expect] : cases) {
    const auto got = parser.parse(body, BodyForm::kJson);
    ASSERT_FALSE(got.ok()) << body;
    EXPECT_EQ(got.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(got.status().message().find("duplicate JSON key " + expect), std::string::npos)
        << got.status().to_string();
  }
  // The same key in two different objects is fine.
  const auto ok = parser.parse(
      R"({"instances": [{"slots": {"1": [5]}, "dense": [0, 0]}, {"slots": {"1": [6]}, "dense": [0, 0]}]})",
      BodyForm::kJson);
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

// Slot text goes through the dataset's own parser: the same instances as training reads.
TEST(RequestParser, SlotTextIsReadAsTheTrainingParserReadsIt) {
  const ServingSpec s = spec();
  const RequestParser parser(s, 100);
  const std::vector<std::string> lines = {
      "click:1 dense_feature:0.25 dense_feature:3 1:11 user:12 1:13 2:14",
      "click:0 dense_feature:1 dense_feature:2 2:0 user:99",
  };
  dataset::DatasetConfig config;
  config.data_format = dataset::DataFormat::kSlot;
  config.slots = s.slot_names;
  config.dense_dim = 2;
  dataset::LineParser oracle(config);
  dataset::InstanceBlock want(3, 2);
  for (const auto& line : lines) ASSERT_TRUE(oracle.parse(line, &want).ok());
  auto got = parser.parse(lines[0] + "\n" + lines[1] + "\n \n\n", BodyForm::kSlotText);
  ASSERT_TRUE(got.ok()) << got.status().to_string();  // trailing blank lines: the body's end
  // A blank line before another would move every prediction after it off its line: refused.
  const auto blank = parser.parse(lines[0] + "\n  \n" + lines[1] + "\n", BodyForm::kSlotText);
  ASSERT_FALSE(blank.ok());
  EXPECT_NE(blank.status().message().find("line 2 is blank"), std::string::npos)
      << blank.status().message();
  EXPECT_EQ(got->keys, want.keys);
  EXPECT_EQ(got->slot_sizes, want.slot_sizes);
  EXPECT_EQ(got->dense, want.dense);
  // The label may be left out.
  const auto unlabelled = parser.parse("dense_feature:0.25 dense_feature:3 1:11 user:12 1:13 2:14",
                                       BodyForm::kSlotText);
  ASSERT_TRUE(unlabelled.ok()) << unlabelled.status().to_string();
  EXPECT_EQ(unlabelled->keys, std::vector<uint64_t>(want.keys.begin(), want.keys.begin() + 4));

  const auto unknown = parser.parse(
      "click:1 dense_feature:0 dense_feature:0\nclick:0 dense_feature:0 "
      "dense_feature:0 age:3",
      BodyForm::kSlotText);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("line 2: unknown slot in 'age:3'"), std::string::npos)
      << unknown.status().message();
  const auto bad_key =
      parser.parse("click:1 dense_feature:0 dense_feature:0 1:12a", BodyForm::kAuto);
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("line 1: bad_key"), std::string::npos)
      << bad_key.status().message();
  // A byte order mark is no part of the first line, as in training's files; an empty body (a POST
  // without Content-Length: its lines came as the next "request") is refused, not 200 with none.
  const auto marked =
      parser.parse("\xEF\xBB\xBF" + lines[0] + "\n" + lines[1] + "\n", BodyForm::kAuto);
  ASSERT_TRUE(marked.ok()) << marked.status().to_string();
  EXPECT_EQ(marked->keys, want.keys);
  for (const std::string body : {"", " \r\n", "\xEF\xBB\xBF"}) {
    const auto empty = parser.parse(body, BodyForm::kAuto);
    ASSERT_FALSE(empty.ok());
    EXPECT_NE(empty.status().message().find("the request holds no instance"), std::string::npos)
        << empty.status().message();
  }
}

// Random bodies (mutated valid ones and raw bytes) give an instance block or an error, never a
// crash or an exception.
TEST(RequestParser, RandomBodiesNeverThrow) {
  const RequestParser parser(spec(), 50);
  const std::vector<std::string> seeds = {
      R"({"instances": [{"slots": {"1": [5, 6], "user": ["7"]}, "dense": [0.5, 1e3]}]})",
      "click:1 dense_feature:0.25 dense_feature:3 1:11 user:12\n"};
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::string body = seeds[static_cast<std::size_t>(i) % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const std::size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          body.erase(at, 1 + rng() % 4);
          break;
        default:
          body.insert(at, 1, "{}[]\",:0123456789-e."[rng() % 20]);
          break;
      }
    }
    EXPECT_NO_THROW((void)parser.parse(body, BodyForm::kAuto)) << body;
  }
}

}  // namespace
}  // namespace gpubox::serving
