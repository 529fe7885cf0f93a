// io::FaultInjectingEnv (fault_env.hpp) keeps its promise for every FileEnv method, pushed through
// it over a recording env (tests/table/recording_env.hpp): each mutating method counts one step
// and, from step fail_from on, fails without reaching the inner env; every other method (reads,
// note_progress) is no step and reaches the inner env even then. The methods come from
// kFileEnvMethods, which forwarding_env_test checks against file_env.hpp: a method added to
// FileEnv fails this test until it is classed here, and a mutating one until the env counts it.
#include "table/io/fault_env.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tests/table/recording_env.hpp"

namespace gpubox::table::io {
namespace {

using table::testing::call_file_env_method;
using table::testing::kFileEnvMethods;
using table::testing::RecordingEnv;

// The FileEnv methods that change the disk (fault_env.hpp's create, create_dir, remove, rename,
// exchange, sync_dir), and those that do not.
const std::set<std::string> kMutating = {"new_writable_file", "create_dir", "remove_all", "rename",
                                         "exchange",          "sync_dir"};
const std::set<std::string> kNotMutating = {"read_file", "open_sequential", "exists", "list_dir",
                                            "note_progress"};

bool mutating(const std::string& method) { return kMutating.count(method) == 1; }

TEST(FaultInjectingEnv, EveryFileEnvMethodIsClassedAsMutatingOrNot) {
  for (const std::string& method : kFileEnvMethods) {
    EXPECT_EQ(kMutating.count(method) + kNotMutating.count(method), 1u)
        << method << ": say in fault_env_test whether it changes the disk (a fault step)";
  }
  EXPECT_EQ(kMutating.size() + kNotMutating.size(), kFileEnvMethods.size());
}

TEST(FaultInjectingEnv, EachMutatingMethodIsOneStepAndEveryMethodReachesTheInnerEnv) {
  for (const std::string& method : kFileEnvMethods) {
    SCOPED_TRACE(method);
    RecordingEnv inner;
    FaultInjectingEnv env(&inner);
    call_file_env_method(env, method);
    EXPECT_EQ(env.steps(), mutating(method) ? 1 : 0);
    EXPECT_EQ(inner.methods(), std::vector<std::string>{method});
  }
}

TEST(FaultInjectingEnv, EveryMethodTogetherTakesSixSteps) {
  RecordingEnv inner;
  FaultInjectingEnv env(&inner);
  for (const std::string& method : kFileEnvMethods) call_file_env_method(env, method);
  EXPECT_EQ(env.steps(), 6);
  EXPECT_EQ(inner.methods(), kFileEnvMethods);
  EXPECT_EQ(env.sequential_opens(), 1);
}

TEST(FaultInjectingEnv, FromFailFromOnMutatingMethodsFailBeforeTheInnerEnvAndOthersGoOn) {
  for (const std::string& method : kFileEnvMethods) {
    SCOPED_TRACE(method);
    RecordingEnv inner;
    FaultInjectingEnv env(&inner);
    env.fail_from(0);
    call_file_env_method(env, method);
    EXPECT_EQ(inner.methods(),
              mutating(method) ? std::vector<std::string>{} : std::vector<std::string>{method});
  }
}

// The files it creates count their appends, syncs and closes as steps too.
TEST(FaultInjectingEnv, AWrittenFilesAppendSyncAndCloseAreOneStepEach) {
  RecordingEnv inner;
  FaultInjectingEnv env(&inner);
  auto file = env.new_writable_file("w");
  ASSERT_TRUE(file.ok());
  const char byte = 'x';
  EXPECT_TRUE((*file)->append(&byte, 1).ok());
  EXPECT_TRUE((*file)->sync().ok());
  EXPECT_TRUE((*file)->close().ok());
  EXPECT_EQ(env.steps(), 4);
  env.fail_from(env.steps());
  auto failing = env.new_writable_file("v");
  EXPECT_FALSE(failing.ok());
  EXPECT_EQ(inner.methods(), std::vector<std::string>{"new_writable_file"});
}

}  // namespace
}  // namespace gpubox::table::io
