// hyper_parameters.slot_dims read by one set of rules (common/config/slot_dims.hpp): the config's
// map resolved against the data's slots (the config check and the table part agree), a save's
// "slot:dim,..." and a serving model's "dim,...": whole numbers in range, nothing before or
// after them, errors naming where the text came from and the bad item.
#include "common/config/slot_dims.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpubox::config {
namespace {

TEST(SlotDims, SlotIdsFollowTheDatasetsRule) {
  // Numbered slots 1 .. sparse_inputs_slots - 1.
  EXPECT_EQ(slot_id_of({}, 4, "1"), 1);
  EXPECT_EQ(slot_id_of({}, 4, "3"), 3);
  for (const char* bad : {"0", "4", "-1", "+1", " 1", "1 ", "01x", "", "99999999999"}) {
    EXPECT_EQ(slot_id_of({}, 4, bad), -1) << bad;
  }
  // Named slots: a whole-number name is its number, another its position; unlisted: none.
  const std::vector<std::string> names = {"click", "17", "user", "-5"};
  EXPECT_EQ(slot_id_of(names, 5, "click"), 0);
  EXPECT_EQ(slot_id_of(names, 5, "17"), 17);
  EXPECT_EQ(slot_id_of(names, 5, "user"), 2);
  EXPECT_EQ(slot_id_of(names, 5, "-5"), -1);
  EXPECT_EQ(slot_id_of(names, 5, "item"), -1);
}

TEST(SlotDims, ResolvesTheConfigsMapWithinTheTablesBounds) {
  auto dims = resolve_slot_dims({{"1", 4}, {"3", 16}}, {}, 5, 8);
  ASSERT_TRUE(dims.ok()) << dims.status().to_string();
  ASSERT_EQ(dims->size(), 2u);
  EXPECT_EQ((*dims)[0].slot, 1);
  EXPECT_EQ((*dims)[0].dim, 4);
  EXPECT_EQ((*dims)[1].slot, 3);
  EXPECT_EQ((*dims)[1].dim, 16);

  const auto error_of = [](const auto& result) { return result.status().to_string(); };
  const auto unknown = resolve_slot_dims({{"7", 4}}, {}, 5, 8);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(error_of(unknown).find("hyper_parameters.slot_dims: slot '7' is not one of"),
            std::string::npos)
      << error_of(unknown);
  // kMaxSlotDims entries pass, one more is refused.
  std::map<std::string, int64_t> many;
  for (int s = 1; s <= kMaxSlotDims; ++s) many[std::to_string(s)] = 8;
  EXPECT_TRUE(resolve_slot_dims(many, {}, 1000, 8).ok());
  many[std::to_string(kMaxSlotDims + 1)] = 8;
  const auto too_many = resolve_slot_dims(many, {}, 1000, 8);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(error_of(too_many).find("129 slots listed, at most 128"), std::string::npos);
  // kMaxWidthClasses widths with the default pass, one more is refused.
  std::map<std::string, int64_t> widths;
  for (int s = 1; s < kMaxWidthClasses; ++s) widths[std::to_string(s)] = s;
  EXPECT_TRUE(resolve_slot_dims(widths, {}, 100, 100).ok());
  widths["50"] = 50;
  const auto too_wide = resolve_slot_dims(widths, {}, 100, 100);
  ASSERT_FALSE(too_wide.ok());
  EXPECT_NE(error_of(too_wide).find("9 distinct embedx widths"), std::string::npos);
  EXPECT_FALSE(resolve_slot_dims({{"1", kMaxSlotDim + 1}}, {}, 5, 8).ok());
  EXPECT_FALSE(resolve_slot_dims({{"1", -1}}, {}, 5, 8).ok());
}

TEST(SlotDims, ASavesTextIsReadStrictly) {
  auto dims = parse_slot_dims_text("1:4,7:16,300:0", "save/MANIFEST");
  ASSERT_TRUE(dims.ok()) << dims.status().to_string();
  ASSERT_EQ(dims->size(), 3u);
  EXPECT_EQ((*dims)[1].slot, 7);
  EXPECT_EQ((*dims)[1].dim, 16);
  EXPECT_EQ((*dims)[2].slot, 300);
  EXPECT_EQ((*dims)[2].dim, 0);
  auto none = parse_slot_dims_text("", "save/MANIFEST");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // Trailing junk, signs, spaces, an empty item, a slot past int32, a width past the bound, a
  // missing part, slots out of order or repeated: each refused naming the file and the item.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"1:4x", "item 1 '1:4x'"},
      {"1:4,2:8junk", "item 2 '2:8junk'"},
      {"1:+4", "item 1 '1:+4'"},
      {" 1:4", "item 1 ' 1:4'"},
      {"1:4,,2:8", "item 2 ''"},
      {"1:4,", "item 2 ''"},
      {"4294967297:4", "item 1 '4294967297:4'"},
      {"1:1024", "item 1 '1:1024'"},
      {"1", "item 1 '1'"},
      {"1:", "item 1 '1:'"},
      {"-1:4", "item 1 '-1:4'"},
      {"2:4,1:8", "item 2 '1:8' is not after slot 2"},
      {"2:4,2:8", "item 2 '2:8'"}};
  for (const auto& [text, named] : bad) {
    const auto parsed = parse_slot_dims_text(text, "save/MANIFEST");
    ASSERT_FALSE(parsed.ok()) << text;
    const std::string msg = parsed.status().to_string();
    EXPECT_EQ(parsed.status().code(), Status::Code::kCorruption) << msg;
    EXPECT_NE(msg.find("save/MANIFEST: slot_dims " + named), std::string::npos) << msg;
  }
}

TEST(SlotDims, AServingModelsWidthsAreReadStrictly) {
  auto widths = parse_slot_widths_text("8,2,8,0", 8, "model/MANIFEST");
  ASSERT_TRUE(widths.ok()) << widths.status().to_string();
  EXPECT_EQ(*widths, (std::vector<int32_t>{8, 2, 8, 0}));
  for (const std::string text : {"8,2,", "8,,2", "9", "-1", "+8", "8 ", "8x", "1e1"}) {
    const auto parsed = parse_slot_widths_text(text, 8, "model/MANIFEST");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().to_string().find("model/MANIFEST: slot_dims item"), std::string::npos)
        << parsed.status().to_string();
  }
}

}  // namespace
}  // namespace gpubox::config
