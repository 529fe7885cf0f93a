// Numbers as the config and every binary's flags read them (common/config/parse_value.cpp):
//  - an integer with a leading 0 is refused naming the key and its decimal spelling (yaml-cpp,
//    as PyYAML, read 0100 as octal 64 and 010 as 8, while 08 fell back to decimal: the value
//    depended on the digits, with nothing said); 0 and hex spelt 0x are untouched (0o.. is no
//    number to these readers);
//  - an integer past int64 is out of range, whatever the key's range;
//  - a float under a double's range (1e-400) is refused (it read as 0, a value that means
//    something else for a rate or a range), 0 written as 0 or 0e5 is 0.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "common/config/config_document.hpp"

namespace gpubox::config {
namespace {

// Past int64 where the key's range ends at int64's largest: out of range (it was clamped there
// and taken as given: host_memory_row_budget 1e30, gpubox_data gen --first_line 1e20); int64's
// largest itself is a value.
TEST(ConfigNumbers, PastInt64IsOutOfRangeWhereTheRangeEndsThere) {
  const KeySpec* budget = find_key("runner.host_memory_row_budget");
  ASSERT_NE(budget, nullptr);
  ConfigValue v;
  for (const char* past : {"1e30", "99999999999999999999", "9223372036854775808"}) {
    EXPECT_EQ(parse_value_text(*budget, past, &v).message(),
              std::string("runner.host_memory_row_budget: ") + past +
                  " is out of range [0, 9223372036854775807]");
  }
  ASSERT_TRUE(parse_value_text(*budget, "9223372036854775807", &v).ok());
  EXPECT_EQ(std::get<int64_t>(v), std::numeric_limits<int64_t>::max());
}

TEST(ConfigNumbers, ALeadingZeroIsRefusedNamingTheDecimalValue) {
  const KeySpec* batch = find_key("runner.train_batch_size");
  const KeySpec* seed = find_key("runner.seed");  // unsigned 64-bit
  const KeySpec* sizes = find_key("hyper_parameters.fc_sizes");
  ASSERT_NE(batch, nullptr);
  ASSERT_NE(seed, nullptr);
  ASSERT_NE(sizes, nullptr);
  ConfigValue v;
  const Status octal = parse_value_text(*batch, "0100", &v);
  EXPECT_EQ(octal.message(),
            "runner.train_batch_size: '0100' has a leading 0, which YAML 1.1 readers take as octal "
            "and others as decimal: write 100 for the decimal value, or 0x.. for hex (no reader "
            "takes 0o.. for octal)");
  // The advice holds: 0x.. is read, 0o.. (which it once advised) is not a number here.
  EXPECT_FALSE(parse_value_text(*batch, "0o144", &v).ok());
  EXPECT_NE(parse_value_text(*batch, "08", &v).message().find("write 8 for"), std::string::npos);
  EXPECT_NE(parse_value_text(*batch, "+010", &v).message().find("write +10 for"),
            std::string::npos);
  EXPECT_NE(parse_value_text(*seed, "010", &v).message().find("runner.seed: '010' has a leading 0"),
            std::string::npos);
  EXPECT_NE(parse_value_text(*sizes, "[64, 032]", &v).message().find("'032' has a leading 0"),
            std::string::npos);
  EXPECT_NE(parse_value_text(*seed, "00", &v).message().find("write 0 for"), std::string::npos);
  // Not a leading zero: read as before.
  ASSERT_TRUE(parse_value_text(*batch, "100", &v).ok());
  EXPECT_EQ(std::get<int64_t>(v), 100);
  ASSERT_TRUE(parse_value_text(*seed, "0", &v).ok());
  EXPECT_EQ(std::get<uint64_t>(v), 0u);
  ASSERT_TRUE(parse_value_text(*batch, "0x10", &v).ok());
  EXPECT_EQ(std::get<int64_t>(v), 16);
  ASSERT_TRUE(parse_value_text(*batch, "1e2", &v).ok());
  EXPECT_EQ(std::get<int64_t>(v), 100);
}

TEST(ConfigNumbers, AFloatUnderADoublesRangeIsRefused) {
  const KeySpec* rate = find_key("hyper_parameters.sparse_optimizer.learning_rate");
  ASSERT_NE(rate, nullptr);
  ConfigValue v;
  for (const char* tiny : {"1e-400", "5E-999", "-1e-330"}) {
    const Status refused = parse_value_text(*rate, tiny, &v);
    EXPECT_NE(refused.message().find("under about 4.9e-324 it reads as 0"), std::string::npos)
        << tiny << ": " << refused.message();
  }
  for (const char* zero : {"0", "0.0", "0e5", "-0"}) {
    ASSERT_TRUE(parse_value_text(*rate, zero, &v).ok()) << zero;
    EXPECT_EQ(std::get<double>(v), 0.0) << zero;
  }
  ASSERT_TRUE(parse_value_text(*rate, "1e-300", &v).ok());
  EXPECT_GT(std::get<double>(v), 0.0);
}

}  // namespace
}  // namespace gpubox::config
