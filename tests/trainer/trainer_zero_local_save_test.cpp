// Trainer 0's part writing a save's dense half to its local disk (save_dense_half through
// PartProgressEnv, trainer/schedule/part_progress_env.hpp): every file operation and MiB written
// is a move, so a slow local write moves its part while one that stopped still fails the waiters
// (before, only server calls counted). Against a loopback gpubox_server, as
// trainer_zero_work_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "tests/table/recording_env.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/slow_io_tier.hpp"
#include "tests/trainer/trainer_zero_work_util.hpp"
#include "trainer/schedule/dense_state.hpp"
#include "trainer/schedule/part_progress_env.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox::trainer {
namespace {

using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;
using table::server::testing::TempDir;
using zero_test::error_of_wait;
using zero_test::kJob;
using zero_test::part_of;

// Every FileEnv method reaches the inner env, once, and is one move; an append of 2.5 MiB is
// three (one a MiB at most), a file's sync and close one each.
TEST(PartProgressEnv, EveryFileOperationAndMiBWrittenIsAMove) {
  table::testing::RecordingEnv inner;
  int moves = 0;
  PartProgressEnv env(&inner, [&] { ++moves; });
  for (const std::string& method : table::testing::kFileEnvMethods) {
    const int before = moves;
    const std::size_t calls = inner.calls.size();
    table::testing::call_file_env_method(env, method);
    ASSERT_EQ(inner.calls.size(), calls + 1) << method;
    EXPECT_EQ(inner.methods().back(), method);
    EXPECT_EQ(moves, before + 1) << method;
  }
  auto file = env.new_writable_file("w");
  ASSERT_TRUE(file.ok());
  const int before = moves;
  const std::vector<char> bytes(PartProgressEnv::kChunkBytes * 5 / 2);
  EXPECT_TRUE((*file)->append(bytes.data(), bytes.size()).ok());
  EXPECT_EQ(moves, before + 3);
  EXPECT_TRUE((*file)->sync().ok());
  EXPECT_TRUE((*file)->close().ok());
  EXPECT_EQ(moves, before + 5);
}

// Trainer 0's part writes a save's dense half to its local disk through a slow disk (`slow`: every
// file operation, and every MiB written, takes its delay first), through PartProgressEnv counting
// into trainer 0's client; another client waits for the part with runner.collective_timeout_s 1 s:
// its error ("" when it returned).
std::string wait_for_a_local_save(table::server::testing::SlowIoTier& slow) {
  FakeHostTier table(table::server::testing::test_config());
  auto server = start_server(&table);
  if (!server) return "no server";
  auto zero = connect_client(client_options(server->endpoint()));
  auto other = connect_client(client_options(server->endpoint()));
  if (!zero || !other) return "no client";
  TempDir dir("trainer0_local_save");
  DenseState dense;
  dense.values.assign(std::size_t{1} << 20, 0.5f);  // 4 MiB each: 12 steps of 1 MiB
  dense.moment1 = dense.values;
  dense.moment2 = dense.values;
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  std::unique_ptr<table::io::FileEnv> disk = slow.slowed(table::io::FileEnv::posix());
  TrainerZeroPublishes publishes;
  std::thread trainer_zero([&] {
    TrainerZeroWork work(*zero, publishes, part, 0.01, 1.0, /*end_s=*/1.0, nullptr);
    PartProgressEnv shown(disk.get(), [&] { zero->note_progress(); });
    try {
      save_dense_half(dir.path().string(), dense, &shown);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  });
  const std::string error = error_of_wait(
      *other, TrainerZeroWait::of(part, "to write the save S", /*collective_timeout_s=*/1.0, 3.0,
                                  "LOG", [] { return std::string(); }));
  slow.release();
  trainer_zero.join();
  return error;
}

// Over 1.2 s of file work (12 MiB written, each MiB and every other file operation 0.1 s),
// each step a move: the waiter waits it out. Before, only server calls counted: it failed after
// 1 s naming trainer 0.
TEST(TrainerZeroLocalSave, ASlowLocalWriteMovesThePart) {
  FakeHostTier inner(table::server::testing::test_config());
  table::server::testing::SlowIoTier slow(inner, std::chrono::milliseconds(100));
  EXPECT_EQ(wait_for_a_local_save(slow), "");
  EXPECT_GE(slow.ops(), 12);  // the write took over the waiter's 1 s
}

// The local write stopped (the disk hangs from its 4th operation on): the waiter still fails
// naming trainer 0's part.
TEST(TrainerZeroLocalSave, AStoppedLocalWriteStillFailsTheWaiters) {
  FakeHostTier inner(table::server::testing::test_config());
  table::server::testing::SlowIoTier slow(inner, std::chrono::milliseconds(1));
  slow.hold_at(3, table::server::testing::SlowIoTier::Hold::kStopped);
  const std::string error = wait_for_a_local_save(slow);
  EXPECT_NE(error.find("trainer 0 made no progress to write the save S for 1 s"), std::string::npos)
      << error;
  EXPECT_NE(error.find("its part stopped moving"), std::string::npos) << error;
}

}  // namespace
}  // namespace gpubox::trainer
