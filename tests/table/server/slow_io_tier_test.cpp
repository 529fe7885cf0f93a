// The slowed env of tests/table/server/slow_io_tier.hpp, which the tests of slow SAVE and LOAD
// calls put between the table and the server's progress env, keeps its promise for every FileEnv
// method, pushed through it over a recording env (tests/table/recording_env.hpp): every file
// operation (all but note_progress) waits its turn, and every method is forwarded. The methods
// come from kFileEnvMethods, which forwarding_env_test checks against file_env.hpp: a method
// added to FileEnv fails this test until the env handles it (the progress env's own test:
// tests/table/progress_env_test.cpp).
#include "tests/table/server/slow_io_tier.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/table/recording_env.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using table::testing::call_file_env_method;
using table::testing::kFileEnvMethods;
using table::testing::RecordingEnv;

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
