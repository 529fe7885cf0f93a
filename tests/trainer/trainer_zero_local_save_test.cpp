// Trainer 0's part writing a save's dense half to its local disk (save_dense_half through an
// io::ProgressEnv over RemoteHostTier::local_work, table/io/progress_env.hpp): every file operation
// and MiB written is a move, and an operation under way is one for up to a bound, so a slow local
// write moves its part, while one that stopped for longer than the bound still fails the waiters
// (before, only server calls counted). Against a loopback gpubox_server, as
// trainer_zero_work_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "table/io/progress_env.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/slow_io_tier.hpp"
#include "tests/trainer/trainer_zero_work_util.hpp"
#include "trainer/schedule/dense_state.hpp"
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

// A dense state whose values and two moments are `mib` MiB each.
DenseState dense_of_mib(std::size_t mib) {
  DenseState dense;
  dense.values.assign((mib << 20) / sizeof(float), 0.5f);
  dense.moment1 = dense.values;
  dense.moment2 = dense.values;
  return dense;
}

// Every file operation of trainer 0's local write of a dense half, through an io::ProgressEnv
// over its client's local_work(), counts in the client's progress_frames(), the moves trainer 0
// publishes: 4 MiB values and two 4 MiB moments are at least 12 appends of a MiB.
TEST(TrainerZeroLocalSave, EveryLocalFileOperationIsAMoveOfItsClient) {
  FakeHostTier table(table::server::testing::test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto zero = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(zero);
  TempDir dir("trainer0_local_moves");
  table::io::ProgressEnv shown(table::io::FileEnv::posix(), &zero->local_work());
  const uint64_t frames = zero->progress_frames();
  const uint64_t ops = zero->local_work().ops();
  save_dense_half(dir.path().string(), dense_of_mib(4), &shown);
  EXPECT_GE(zero->local_work().ops() - ops, 12u);
  EXPECT_EQ(zero->progress_frames() - frames, zero->local_work().ops() - ops);
  EXPECT_GE(zero->local_work().bytes(), 12u << 20);
}

// Trainer 0's part writes a save's dense half to its local disk through a slow disk (`slow`: every
// file operation, and every MiB written, takes its delay first; a held one waits until released),
// through an io::ProgressEnv counting into trainer 0's client, with `max_local_stall_s` the bound
// of a local operation under way (TrainerZeroWork); another client waits for the part with
// runner.collective_timeout_s 1 s: its error ("" when it returned). The slow disk is released
// `release_after` from the start (when the wait has not returned by then: so that a wait that
// should have failed ends, the part ended, and the test fails rather than hangs).
std::string wait_for_a_local_save(
    table::server::testing::SlowIoTier& slow,
    double max_local_stall_s = TrainerZeroWork::kMaxLocalIoStallS,
    std::chrono::milliseconds release_after = std::chrono::seconds(30)) {
  FakeHostTier table(table::server::testing::test_config());
  auto server = start_server(&table);
  if (!server) return "no server";
  auto zero = connect_client(client_options(server->endpoint()));
  auto other = connect_client(client_options(server->endpoint()));
  if (!zero || !other) return "no client";
  TempDir dir("trainer0_local_save");
  const DenseState dense = dense_of_mib(4);  // 12 steps of 1 MiB
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  std::unique_ptr<table::io::FileEnv> disk = slow.slowed(table::io::FileEnv::posix());
  TrainerZeroPublishes publishes;
  std::thread trainer_zero([&] {
    TrainerZeroWork work(*zero, publishes, part, 0.01, 1.0, /*end_s=*/1.0, nullptr,
                         max_local_stall_s);
    table::io::ProgressEnv shown(disk.get(), &zero->local_work());
    try {
      save_dense_half(dir.path().string(), dense, &shown);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  });
  std::mutex mu;
  std::condition_variable waited_cv;
  bool waited = false;
  std::thread releaser([&] {
    std::unique_lock<std::mutex> lock(mu);
    waited_cv.wait_for(lock, release_after, [&] { return waited; });
    slow.release();
  });
  const std::string error = error_of_wait(
      *other, TrainerZeroWait::of(part, "to write the save S", /*collective_timeout_s=*/1.0, 3.0,
                                  "LOG", [] { return std::string(); }));
  {
    std::lock_guard<std::mutex> lock(mu);
    waited = true;
  }
  waited_cv.notify_all();
  trainer_zero.join();
  releaser.join();
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

// One local operation (the 4th) blocks for 2.5 s, longer than the waiter's 1 s bound: under way,
// it moves the part (published again each interval) for up to kMaxLocalIoStallS, so the waiter
// waits it out. Before, a local operation counted only once it ended: the waiter failed after 1 s
// naming trainer 0.
TEST(TrainerZeroLocalSave, ALocalOperationLongerThanTheWaitersBoundMovesThePart) {
  FakeHostTier inner(table::server::testing::test_config());
  table::server::testing::SlowIoTier slow(inner, std::chrono::milliseconds(1));
  slow.hold_at(3, table::server::testing::SlowIoTier::Hold::kStopped);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_for_a_local_save(slow, TrainerZeroWork::kMaxLocalIoStallS,
                                  std::chrono::milliseconds(2500)),
            "");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2500));
}

// The local write stopped (the disk hangs from its 4th operation on) for longer than the bound of
// a local operation under way (0.3 s here): the waiter still fails naming trainer 0's part, about
// 1 s after that bound.
TEST(TrainerZeroLocalSave, AStoppedLocalWriteStillFailsTheWaiters) {
  FakeHostTier inner(table::server::testing::test_config());
  table::server::testing::SlowIoTier slow(inner, std::chrono::milliseconds(1));
  slow.hold_at(3, table::server::testing::SlowIoTier::Hold::kStopped);
  const std::string error = wait_for_a_local_save(slow, /*max_local_stall_s=*/0.3,
                                                  /*release_after=*/std::chrono::seconds(8));
  EXPECT_NE(error.find("trainer 0 made no progress to write the save S for 1 s"), std::string::npos)
      << error;
  EXPECT_NE(error.find("its part stopped moving"), std::string::npos) << error;
}

}  // namespace
}  // namespace gpubox::trainer
