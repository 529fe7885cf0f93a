// The envs that watch a server's SAVE and LOAD keep their promise for every FileEnv method,
// pushed through each over a recording env (tests/table/recording_env.hpp): ProgressEnv
// (table/server/bulk_work.hpp) counts every one as one step of the call's progress, and the
// slowed env of tests/table/server/slow_io_tier.hpp makes every file operation (all but
// note_progress) wait its turn; both forward every method. The methods come from
// kFileEnvMethods, which forwarding_env_test checks against file_env.hpp: a method added to
// FileEnv fails these tests until each env handles it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "table/server/bulk_work.hpp"
#include "tests/table/recording_env.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/slow_io_tier.hpp"

namespace gpubox::table::server {
namespace {

using table::testing::call_file_env_method;
using table::testing::kFileEnvMethods;
using table::testing::RecordingEnv;

TEST(ProgressEnv, CountsEachFileEnvMethodAsOneStepAndForwardsIt) {
  for (const std::string& method : kFileEnvMethods) {
    SCOPED_TRACE(method);
    RecordingEnv inner;
    WorkProgress progress;
    ProgressEnv env(&inner, &progress);
    call_file_env_method(env, method);
    EXPECT_EQ(progress.note().steps, 1u);
    EXPECT_EQ(inner.methods(), std::vector<std::string>{method});
  }
}

TEST(ProgressEnv, CountsEveryMethodTogetherAndTheBytesItRead) {
  RecordingEnv inner;
  WorkProgress progress;
  ProgressEnv env(&inner, &progress);
  for (const std::string& method : kFileEnvMethods) call_file_env_method(env, method);
  EXPECT_EQ(progress.note().steps, kFileEnvMethods.size());                  // all 11
  EXPECT_EQ(progress.note().io_bytes, std::string("read_file r 7").size());  // read_file's text
  EXPECT_EQ(inner.methods(), kFileEnvMethods);
}

TEST(SlowIoTier, EveryFileOperationOfItsEnvWaitsItsTurnAndIsForwarded) {
  testing::FakeHostTier host(testing::test_config());
  testing::SlowIoTier tier(host, std::chrono::milliseconds(0));
  for (const std::string& method : kFileEnvMethods) {
    SCOPED_TRACE(method);
    RecordingEnv inner;
    const int64_t ops_before = tier.ops();
    call_file_env_method(*tier.slowed(&inner), method);
    EXPECT_EQ(tier.ops() - ops_before, method == "note_progress" ? 0 : 1);
    EXPECT_EQ(inner.methods(), std::vector<std::string>{method});
  }
}

}  // namespace
}  // namespace gpubox::table::server
