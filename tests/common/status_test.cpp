#include "common/status.hpp"

#include <gtest/gtest.h>

namespace gpubox {
namespace {

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status::OK().ok());
  Status st = Status::IOError("part-3: short read");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kIOError);
  EXPECT_EQ(st.to_string(), "IOError: part-3: short read");
  EXPECT_EQ(st.with_context("loading model").to_string(),
            "IOError: loading model: part-3: short read");
}

TEST(StatusOr, ValueOrError) {
  StatusOr<int> good = 7;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  StatusOr<int> bad = Status::NotFound("key 9");
  EXPECT_FALSE(bad.ok());
  EXPECT_THROW(bad.value(), Error);
  EXPECT_THROW(StatusOr<int>(Status::OK()), Error);
}

TEST(ErrorMacros, MessageCarriesPartsAndLocation) {
  try {
    GPUBOX_EXPECTS(1 + 1 == 3, "card ", 2, " key ", 99u);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("card 2 key 99"), std::string::npos) << what;
    EXPECT_NE(what.find("status_test.cpp"), std::string::npos) << what;
  }
  EXPECT_THROW(GPUBOX_FAIL("boom"), Error);
}

// What a user is shown (message()) carries no assertion expression and no source location;
// where() has both, and what() (logs, tests) has everything.
TEST(ErrorMacros, TheMessageAloneIsForTheUserWhereForTheLog) {
  try {
    GPUBOX_EXPECTS(1 + 1 == 3, "card ", 2, " is full");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "card 2 is full");
    EXPECT_NE(e.where().find("(expected: 1 + 1 == 3)"), std::string::npos) << e.where();
    EXPECT_NE(e.where().find("[status_test.cpp:"), std::string::npos) << e.where();
    EXPECT_EQ(std::string(e.what()), e.message() + " " + e.where());
  }
  try {
    GPUBOX_FAIL("boom ", 7);
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "boom 7");
    EXPECT_EQ(e.where().find("expected"), std::string::npos) << e.where();
  }
  const Error plain("just text");
  EXPECT_EQ(plain.message(), "just text");
  EXPECT_EQ(plain.where(), "");
  EXPECT_STREQ(plain.what(), "just text");
}

}  // namespace
}  // namespace gpubox
