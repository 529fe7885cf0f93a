// A PS training thread the trainer drops after a server restart (PsWorker::abandon, called by
// PsTrainer::recover before the restarts are accepted and the save reloaded): the calls it still
// had queued are not sent, the call under way is waited for, and its failure (expected) is not
// logged, by abandon() nor by the destructor. And the queue beneath it: CallQueue::cancel, with a
// call under way and on an idle queue.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_table.hpp"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/trainer/ps_pipeline_util.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/call_queue.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

// How long a test lets a wait that must not end early run before it ends it: a wait that ends
// by itself sooner shows the mutation; one that ends only then passes, on any machine.
constexpr auto kGrace = std::chrono::milliseconds(300);

// A gate a call waits at until the test opens it; entered() tells that the call reached it.
class Gate {
 public:
  void pass() {
    MutexLock lock(mu_);
    entered_ = true;
    changed_.notify_all();
    while (!open_) changed_.wait(lock);
  }
  void open() {
    MutexLock lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  // Waits (60 s at most) until a call reached the gate.
  bool wait_entered() {
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!entered_) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return entered_;
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar changed_;
  bool entered_ GPUBOX_GUARDED_BY(mu_) = false;
  bool open_ GPUBOX_GUARDED_BY(mu_) = false;
};

// Opens `gate` once `done` is set or kGrace passed, whichever comes first.
std::thread open_after(Gate& gate, const std::atomic<bool>& done) {
  return std::thread([&gate, &done] {
    const auto until = std::chrono::steady_clock::now() + kGrace;
    while (!done.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gate.open();
  });
}

// Opens the gate when the scope ends, so that a test that ends early (a failed ASSERT) does not
// leave a call at the gate for the queue's destructor to wait for forever.
struct OpenAtExit {
  Gate& gate;
  ~OpenAtExit() { gate.open(); }
};

// The call under way when cancel() comes is waited for; the calls queued behind it are skipped
// (waiting for them returns Aborted), as are calls submitted later; a failure of the call under
// way is what it and the skipped calls return.
TEST(CallQueue, CancelSkipsTheQueuedCallsAndWaitsForTheOneUnderWay) {
  for (const bool under_way_fails : {false, true}) {
    SCOPED_TRACE(under_way_fails ? "the call under way fails" : "the call under way succeeds");
    // What the calls use first: the queue, destroyed before them, waits for its calls.
    Gate gate;
    std::atomic<bool> finished{false};
    std::atomic<int> ran{0};
    CallQueue calls(3);
    const OpenAtExit open_at_exit{gate};
    const uint64_t under_way = calls.submit([&] {
      gate.pass();
      finished = true;
      return under_way_fails ? Status::Unavailable("server gone") : Status::OK();
    });
    const uint64_t queued = calls.submit([&] {
      ++ran;
      return Status::OK();
    });
    ASSERT_TRUE(gate.wait_entered());
    std::atomic<bool> cancelled{false};
    std::thread opener = open_after(gate, cancelled);
    calls.cancel();
    const bool finished_at_return = finished.load();
    cancelled = true;
    opener.join();
    EXPECT_TRUE(finished_at_return) << "cancel() returned with the call under way";
    const uint64_t later = calls.submit([&] {
      ++ran;
      return Status::OK();
    });
    const Status drained = calls.drain();
    EXPECT_EQ(drained.code(), under_way_fails ? Status::Code::kUnavailable : Status::Code::kAborted)
        << drained.to_string();
    EXPECT_EQ(calls.wait(under_way).ok(), !under_way_fails);
    EXPECT_EQ(calls.wait(queued).code(), calls.wait(later).code());
    EXPECT_FALSE(calls.wait(queued).ok());
    EXPECT_EQ(ran.load(), 0) << "a call queued behind the cancel ran";
  }
}

// cancel() with no call under way skips every call not yet run, from the next one submitted on:
// the calls that finished before it keep their status, and a call submitted after it never runs
// (waiting for it returns Aborted). Also on a queue whose thread never started.
TEST(CallQueue, CancelOnAnIdleQueueSkipsEveryCallAfterIt) {
  std::atomic<int> ran{0};
  const auto counted = [&ran] {
    ++ran;
    return Status::OK();
  };
  CallQueue calls(2);
  const uint64_t before = calls.submit(counted);
  ASSERT_TRUE(calls.drain().ok());
  calls.cancel();
  const uint64_t after = calls.submit(counted);
  EXPECT_EQ(calls.wait(after).code(), Status::Code::kAborted) << calls.wait(after).to_string();
  EXPECT_EQ(calls.drain().code(), Status::Code::kAborted) << calls.drain().to_string();
  EXPECT_TRUE(calls.wait(before).ok());
  EXPECT_EQ(ran.load(), 1) << "a call submitted after cancel() ran";

  CallQueue never_started(2);
  never_started.cancel();
  EXPECT_TRUE(never_started.drain().ok());  // nothing submitted
  const uint64_t first = never_started.submit(counted);
  EXPECT_EQ(never_started.wait(first).code(), Status::Code::kAborted)
      << never_started.wait(first).to_string();
  EXPECT_EQ(ran.load(), 1) << "a call submitted after cancel() ran";
}

// Pulls of a key >= kHeldKeys wait at the gate, then fail when `fail` is set.
constexpr uint64_t kHeldKeys = 500000;
class HeldPulls final : public table::testing::ForwardingHostTier {
 public:
  HeldPulls(table::HostTier& table, bool fail) : ForwardingHostTier(table), fail_(fail) {}
  Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* created) override {
    if (n == 0 || keys[0] < kHeldKeys)
      return ForwardingHostTier::pull(keys, slots, n, rows, created);
    gate.pass();
    const Status pulled = fail_ ? Status::Unavailable("the held pull fails, as the test asks")
                                : ForwardingHostTier::pull(keys, slots, n, rows, created);
    finished = true;  // before the server replies
    return pulled;
  }
  Gate gate;
  std::atomic<bool> finished{false};

 private:
  const bool fail_;
};

// One instance of every slot, its keys from `base` on.
dataset::Batch one_instance(const TrainerConfig& cfg, uint64_t base) {
  dataset::Batch batch;
  batch.num_slots = static_cast<int>(cfg.dataset.slots.size());
  batch.dense_dim = cfg.dataset.dense_dim;
  batch.offsets.assign(1, 0);
  for (int s = 0; s < batch.num_slots; ++s) {
    batch.keys.push_back(base + static_cast<uint64_t>(s));
    batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
  }
  batch.labels.push_back(1.0f);
  batch.dense.assign(static_cast<std::size_t>(batch.dense_dim), 0.5f);
  return batch;
}

// An async thread's step 0 leaves batch 1's pull under way (held at the server) and its own push
// queued behind it; then the thread is abandoned, and destroyed. What the server and the log saw.
struct Abandoned {
  bool pull_finished_at_return = false;  // the held pull, when abandon() returned
  uint64_t rows_pushed_at_return = 0;
  uint64_t rows_pushed_at_end = 0;  // once the thread was destroyed too
  std::string log;                  // of abandon() and the destructor
};

Abandoned abandon_with_a_held_pull(bool pull_fails) {
  const TrainerConfig cfg = ps_test_config(
      {"runner.sync_mode=async", "hyper_parameters.sparse_optimizer.embed_threshold=0",
       "hyper_parameters.sparse_optimizer.embedx_threshold=0"});
  auto table = table::SparseTable::open(cfg.sparse, cfg.host_tier.table);
  throw_if_error(table.status());
  HeldPulls held(**table, pull_fails);
  table::server::ServerOptions options;
  options.data_dir = std::filesystem::temp_directory_path().string();
  auto server = table::server::Server::start(&held, options);
  throw_if_error(server.status());
  const std::unique_ptr<RemoteHostTier> servers = connect((*server)->endpoint(), cfg);
  device::Card card(0, 0, 0, 1);
  card.activate();
  auto worker = std::make_unique<PsWorker>(card, *servers, cfg);
  worker->sync_dense(0.0f);
  const dataset::Batch first = one_instance(cfg, 1000);
  const dataset::Batch next = one_instance(cfg, kHeldKeys);
  worker->train_step(first, 0, 0, &next);  // queued: next's pull (held), then this step's push
  Abandoned out;
  EXPECT_TRUE(held.gate.wait_entered()) << "the next batch's pull never reached the server";
  std::atomic<bool> returned{false};
  std::thread opener = open_after(held.gate, returned);
  ::testing::internal::CaptureStderr();
  worker->abandon();
  returned = true;
  out.rows_pushed_at_return = (*server)->counters().rows_pushed;
  out.pull_finished_at_return = held.finished.load();
  opener.join();
  worker.reset();
  out.log = ::testing::internal::GetCapturedStderr();
  out.rows_pushed_at_end = (*server)->counters().rows_pushed;
  return out;
}

TEST(PsWorkerAbandon, TheQueuedPushIsNotSentAndTheCallUnderWayIsWaitedFor) {
  const Abandoned run = abandon_with_a_held_pull(false);
  EXPECT_TRUE(run.pull_finished_at_return) << "abandon() returned with the pull under way";
  EXPECT_EQ(run.rows_pushed_at_return, 0u) << "the push queued behind the held pull was sent";
  EXPECT_EQ(run.rows_pushed_at_end, 0u) << "the destructor sent the abandoned thread's push";
  EXPECT_EQ(run.log.find("training thread of card"), std::string::npos) << run.log;
}

TEST(PsWorkerAbandon, AFailureOfTheCallUnderWayIsNotLogged) {
  const Abandoned run = abandon_with_a_held_pull(true);
  EXPECT_TRUE(run.pull_finished_at_return) << "abandon() returned with the pull under way";
  EXPECT_EQ(run.rows_pushed_at_end, 0u);
  EXPECT_EQ(run.log.find("training thread of card"), std::string::npos) << run.log;
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
