// The token file of gpubox_server and of the trainer (table/server/auth_token.hpp): missing,
// empty or not a file is an error naming it; a file other users may read is used with a
// warning naming it and its mode; GPUBOX_AUTH_TOKEN_FILE wins over runner.auth_token_file.
#include "table/server/auth_token.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace gpubox::table::server {
namespace {

namespace fs = std::filesystem;

class AuthTokenFile : public ::testing::Test {
 protected:
  AuthTokenFile() {
    dir_ = fs::temp_directory_path() / ("gpubox_auth_token_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  ~AuthTokenFile() override {
    ::unsetenv(kAuthTokenFileEnv);
    fs::remove_all(dir_);
  }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p.string();
  }
  fs::path dir_;
};

constexpr char kLong[] = "00112233445566778899aabbccddeeff";  // 128 bits as hex

TEST_F(AuthTokenFile, ReadsTheTokenWithoutTrailingWhitespace) {
  ::testing::internal::CaptureStderr();
  auto token =
      read_auth_token_file(write("t", std::string(kLong) + " \n", 0600), "--auth_token_file");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(token.ok()) << token.status().to_string();
  EXPECT_EQ(*token, kLong);
  EXPECT_EQ(log, "") << "a private token file is read quietly";
}

TEST_F(AuthTokenFile, MissingEmptyOrNotAFileIsAnErrorNamingIt) {
  const std::string missing = (dir_ / "nope").string();
  auto st = read_auth_token_file(missing, "GPUBOX_AUTH_TOKEN_FILE").status();
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("GPUBOX_AUTH_TOKEN_FILE '" + missing + "': it does not exist"),
            std::string::npos)
      << st.message();
  const std::string blank = write("blank", " \n\t\n", 0600);
  st = read_auth_token_file(blank, "runner.auth_token_file").status();
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("runner.auth_token_file '" + blank + "' is empty"), std::string::npos)
      << st.message();
  st = read_auth_token_file(dir_.string(), "--auth_token_file").status();
  EXPECT_NE(st.message().find("is not a regular file"), std::string::npos) << st.message();
}

// Shorter than 128 bits as hex digits: guessable, refused (the client reads its file the same).
TEST_F(AuthTokenFile, AShortTokenIsAnErrorNamingTheFile) {
  const std::string short_one = write("short", std::string(kLong).substr(0, 31) + "\n", 0600);
  auto st = read_auth_token_file(short_one, "GPUBOX_AUTH_TOKEN_FILE").status();
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("GPUBOX_AUTH_TOKEN_FILE '" + short_one +
                              "' has 31 characters; at least 32 are needed"),
            std::string::npos)
      << st.message();
}

TEST_F(AuthTokenFile, AFileOthersMayReadIsUsedWithAWarningNamingIt) {
  const std::string open = write("open", kLong, 0644);
  ::testing::internal::CaptureStderr();
  auto token = read_auth_token_file(open, "--auth_token_file");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, kLong);
  EXPECT_NE(log.find("the token file --auth_token_file '" + open +
                     "' is readable by other users (mode 0644)"),
            std::string::npos)
      << log;
}

TEST_F(AuthTokenFile, TheEnvironmentWinsOverTheConfig) {
  ::unsetenv(kAuthTokenFileEnv);
  TokenFileChoice choice = client_token_file("/etc/from_config");
  EXPECT_EQ(choice.path, "/etc/from_config");
  EXPECT_EQ(choice.source, "runner.auth_token_file");
  EXPECT_EQ(client_token_file("").path, "");
  ::setenv(kAuthTokenFileEnv, "/run/from_env", 1);
  choice = client_token_file("/etc/from_config");
  EXPECT_EQ(choice.path, "/run/from_env");
  EXPECT_EQ(choice.source, "GPUBOX_AUTH_TOKEN_FILE");
  ::setenv(kAuthTokenFileEnv, "", 1);  // set but empty: not set
  EXPECT_EQ(client_token_file("/etc/from_config").path, "/etc/from_config");
}

}  // namespace
}  // namespace gpubox::table::server
