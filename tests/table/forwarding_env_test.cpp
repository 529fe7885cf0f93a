// io::ForwardingEnv (the base of the decorating envs: FaultInjectingEnv, io::ProgressEnv, the
// tests' counting and slow envs) forwards every FileEnv method to its inner env,
// with its arguments, and hands back the inner env's results (statuses, values, the very files it
// opened). The oracle is a recording env (tests/table/recording_env.hpp) that answers each call
// with values naming it. A method missing from ForwardingEnv would silently take FileEnv's own
// behaviour in every decorator, so the list of methods checked here (kFileEnvMethods, which the
// decorators' own tests push through them too) is itself checked against the virtuals that
// file_env.hpp declares in FileEnv: a method added there fails this test until it is forwarded
// and listed.
#include "table/io/forwarding_env.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/io/file_env.hpp"
#include "tests/table/recording_env.hpp"

namespace gpubox::table::io {
namespace {

using table::testing::call_file_env_method;
using table::testing::kFileEnvMethods;
using table::testing::RecordingEnv;

// Calls every method of `env` once, in kFileEnvMethods' order (exists twice: a present and an
// absent path), checking what comes back against what `inner` answered.
void call_every_method(FileEnv& env, const RecordingEnv& inner) {
  auto writable = env.new_writable_file("w");
  ASSERT_TRUE(writable.ok());
  EXPECT_EQ(writable->get(), inner.last_writable);
  EXPECT_EQ(env.read_file("r", 7).value(), "read_file r 7");
  auto sequential = env.open_sequential("s", 9);
  ASSERT_TRUE(sequential.ok());
  EXPECT_EQ(sequential->get(), inner.last_sequential);
  EXPECT_EQ(env.create_dir("d").message(), "create_dir d");
  EXPECT_EQ(env.remove_all("x").message(), "remove_all x");
  EXPECT_EQ(env.rename("a", "b").message(), "rename a b");
  EXPECT_EQ(env.exchange("c", "e").message(), "exchange c e");
  EXPECT_EQ(env.sync_dir("f").message(), "sync_dir f");
  EXPECT_TRUE(env.exists("present"));
  EXPECT_FALSE(env.exists("absent"));
  EXPECT_EQ(env.list_dir("l").value(), std::vector<std::string>{"list_dir l"});
  env.note_progress();
}

TEST(ForwardingEnv, ForwardsEveryMethodWithItsArgumentsAndResults) {
  RecordingEnv inner;
  ForwardingEnv env(&inner);
  call_every_method(env, inner);
  const std::vector<std::string> want = {
      "new_writable_file w", "read_file r 7", "open_sequential s 9", "create_dir d",
      "remove_all x",        "rename a b",    "exchange c e",        "sync_dir f",
      "exists present",      "exists absent", "list_dir l",          "note_progress"};
  EXPECT_EQ(inner.calls, want);
  // Each record names its method: every method in kFileEnvMethods was reached, in order.
  std::vector<std::string> reached = inner.methods();
  reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
  EXPECT_EQ(reached, kFileEnvMethods);
}

// call_file_env_method, which the decorators' tests push every method through, calls the method
// it is named.
TEST(ForwardingEnv, CallFileEnvMethodReachesTheMethodItNames) {
  for (const std::string& method : kFileEnvMethods) {
    RecordingEnv inner;
    ForwardingEnv env(&inner);
    call_file_env_method(env, method);
    EXPECT_EQ(inner.methods(), std::vector<std::string>{method});
  }
}

TEST(ForwardingEnv, RefusesANullInnerEnv) { EXPECT_THROW(ForwardingEnv(nullptr), Error); }

// The virtuals FileEnv declares in file_env.hpp (every `virtual ... name(` between `class FileEnv
// {` and its closing `};`, the destructor aside).
std::vector<std::string> declared_virtuals() {
  std::ifstream in(std::string(GPUBOX_SOURCE_DIR) + "/table/io/file_env.hpp");
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  const std::size_t begin = all.find("class FileEnv {");
  const std::size_t end = all.find("\n};", begin);
  if (begin == std::string::npos || end == std::string::npos) return {};
  const std::string body = all.substr(begin, end - begin);
  const std::regex decl(R"(virtual\s+[^;{}()]*?([A-Za-z_~]\w*)\s*\()");
  std::vector<std::string> names;
  for (std::sregex_iterator it(body.begin(), body.end(), decl), stop; it != stop; ++it) {
    if ((*it)[1].str() != "~FileEnv") names.push_back((*it)[1].str());
  }
  return names;
}

TEST(ForwardingEnv, ChecksEveryMethodThatFileEnvDeclares) {
  std::vector<std::string> declared = declared_virtuals();
  std::vector<std::string> checked = kFileEnvMethods;
  std::sort(declared.begin(), declared.end());
  std::sort(checked.begin(), checked.end());
  EXPECT_EQ(declared, checked)
      << "a FileEnv method is missing from ForwardingEnv's test: forward "
         "it in table/io/forwarding_env.hpp, list it in kFileEnvMethods and "
         "call it in call_file_env_method (tests/table/recording_env.hpp)";
}

}  // namespace
}  // namespace gpubox::table::io
