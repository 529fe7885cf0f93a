#include "common/status.hpp"

#include <gtest/gtest.h>

#include "common/error_report.hpp"

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

// An error raised again one level up (a collective naming its pass and step, a card naming
// itself) keeps the location out of the user's line, and a top level prints the message alone.
TEST(ErrorReport, ContextIsAddedOnceAndTheLocationStaysInTheLog) {
  try {
    const int two = std::stoi("2");
    GPUBOX_EXPECTS(two == 3, "key ", 42, " missing");
    FAIL() << "GPUBOX_EXPECTS did not throw";
  } catch (const Error& e) {
    const Error outer = with_context("pass 3, step 7: ", with_context("card 1: ", e));
    EXPECT_EQ(outer.message(), "pass 3, step 7: card 1: key 42 missing");
    EXPECT_EQ(outer.where(), e.where());
    EXPECT_EQ(user_message(outer), outer.message());
    testing::internal::CaptureStderr();
    report_top_level("gpubox_tool", outer);
    const std::string printed = testing::internal::GetCapturedStderr();
    const std::size_t user_line = printed.find("gpubox_tool: ");
    ASSERT_NE(user_line, std::string::npos) << printed;
    EXPECT_EQ(printed.substr(user_line), "gpubox_tool: pass 3, step 7: card 1: key 42 missing\n");
    EXPECT_NE(printed.substr(0, user_line).find("status_test.cpp:"), std::string::npos)
        << "the location goes to the log line before it: " << printed;
  }
  EXPECT_EQ(user_message(std::runtime_error("plain")), "plain");
  EXPECT_EQ(with_context("x: ", Error("y")).what(), std::string("x: y"));
}

}  // namespace
}  // namespace gpubox
