// Issue 32: the async mode's sparse calls off the training thread (PsWorker's row pipeline on a
// CallQueue, ps_worker.hpp). The queue runs its calls in order, stops at the first failure and
// bounds what waits; a pipelined thread pulls batch k+1 after its push of batch k-1 and before
// its push of batch k, so batches that share no keys with the one before end where the serial
// steps end (to the last bits); nothing pushed is lost at the end of a pass, also one stopped
// with a batch's pull under way, and a server that dies mid-prefetch fails the next step naming
// it and the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_table.hpp"
#include "tests/trainer/ps_pipeline_util.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/ps_modes/call_queue.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

// ---- CallQueue --------------------------------------------------------------------------------

// Calls run in submit order, whatever the capacity, and each wait sees its own call done.
TEST(CallQueue, RunsEveryCallInSubmitOrder) {
  for (const std::size_t capacity : {1u, 2u, 3u, 64u}) {
    SCOPED_TRACE(capacity);
    CallQueue calls(capacity);
    std::vector<int> ran;  // written by the queue's thread only, read after drain()
    std::vector<uint64_t> tickets;
    for (int i = 0; i < 200; ++i) {
      tickets.push_back(calls.submit([&ran, i] {
        ran.push_back(i);
        return Status::OK();
      }));
      if (i % 37 == 0) {
        ASSERT_TRUE(calls.wait(tickets.back()).ok());
        ASSERT_EQ(ran.size(), static_cast<std::size_t>(i + 1));
      }
    }
    for (std::size_t i = 0; i < tickets.size(); ++i) EXPECT_EQ(tickets[i], i);
    ASSERT_TRUE(calls.drain().ok());
    EXPECT_EQ(calls.pending(), 0u);
    ASSERT_EQ(ran.size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(ran[static_cast<std::size_t>(i)], i);
  }
  CallQueue idle(2);
  EXPECT_TRUE(idle.drain().ok()) << "nothing submitted";
}

// The first failure stops the queue: the calls behind it are not run, waiting for it or any
// later one returns it, the earlier ones stay OK; an exception becomes an Internal status.
TEST(CallQueue, TheFirstFailureSkipsTheCallsBehindItAndIsWhatTheyReturn) {
  CallQueue calls(4);
  std::atomic<int> ran{0};
  const uint64_t fine = calls.submit([&] {
    ++ran;
    return Status::OK();
  });
  const uint64_t failing = calls.submit([&] {
    ++ran;
    return Status::Unavailable("server 127.0.0.1:1 is gone");
  });
  const uint64_t behind = calls.submit([&] {
    ++ran;
    return Status::OK();
  });
  EXPECT_TRUE(calls.wait(fine).ok());
  const Status failed = calls.wait(failing);
  EXPECT_EQ(failed.code(), Status::Code::kUnavailable);
  EXPECT_NE(failed.message().find("127.0.0.1:1"), std::string::npos) << failed.to_string();
  EXPECT_EQ(calls.wait(behind).message(), failed.message());
  EXPECT_EQ(calls.drain().message(), failed.message());
  EXPECT_EQ(ran.load(), 2) << "the call behind the failure ran";
  // Still stopped for calls submitted later.
  const uint64_t later = calls.submit([&] {
    ++ran;
    return Status::OK();
  });
  EXPECT_EQ(calls.wait(later).message(), failed.message());
  EXPECT_EQ(ran.load(), 2);

  CallQueue throwing(1);
  const uint64_t t = throwing.submit([]() -> Status { throw std::runtime_error("bad frame"); });
  const Status thrown = throwing.wait(t);
  EXPECT_EQ(thrown.code(), Status::Code::kInternal);
  EXPECT_NE(thrown.message().find("bad frame"), std::string::npos) << thrown.to_string();
}

// At most `capacity` calls wait or run: the next submit waits for the oldest to finish.
TEST(CallQueue, ASubmitBeyondTheCapacityWaitsForTheOldest) {
  CallQueue calls(2);
  std::atomic<bool> release{false};
  std::atomic<int> started{0};
  const auto blocked = [&] {
    ++started;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return Status::OK();
  };
  calls.submit(blocked);
  calls.submit(blocked);
  std::atomic<bool> third_in{false};
  std::thread submitter([&] {
    calls.submit([] { return Status::OK(); });
    third_in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(third_in.load()) << "a third call queued beside two unfinished ones";
  EXPECT_EQ(calls.pending(), 2u);
  release = true;
  submitter.join();
  EXPECT_TRUE(third_in.load());
  EXPECT_TRUE(calls.drain().ok());
  EXPECT_EQ(started.load(), 2);
}

// The destructor runs what is still queued (a PS thread's last pushes), then ends the thread.
TEST(CallQueue, TheDestructorRunsTheCallsStillQueued) {
  std::atomic<int> ran{0};
  {
    CallQueue calls(3);
    for (int i = 0; i < 3; ++i) {
      calls.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++ran;
        return Status::OK();
      });
    }
  }
  EXPECT_EQ(ran.load(), 3);
}

// ---- PsWorker's row pipeline ------------------------------------------------------------------

// What relative_distance() tells apart (see there).
constexpr double kSameSteps = 1e-6;

// Fresh in-process servers (`shards` of them), a client of them and one card: what a PsWorker
// of these tests trains against. Destroyed after the workers made by worker().
class OneCardOnServers {
 public:
  OneCardOnServers(const TrainerConfig& cfg, int shards, double unreachable_s = -1.0)
      : cfg_(cfg), shards_(cfg, shards), servers_(connect(shards_, cfg, 30.0, unreachable_s)) {
    card_.activate();
  }
  // A PsWorker on the card, its dense net read from the servers (sync_dense(0)).
  std::unique_ptr<PsWorker> worker() {
    auto worker = std::make_unique<PsWorker>(card_, *servers_, cfg_);
    worker->sync_dense(0.0f);
    return worker;
  }
  Servers& shards() { return shards_; }
  RemoteHostTier& servers() { return *servers_; }

 private:
  TrainerConfig cfg_;
  Servers shards_;
  std::unique_ptr<RemoteHostTier> servers_;
  device::Card card_{0, 0, 0, 1};
};

// `instances` instances; slot s's keys are drawn from [base + s * 1000, base + s * 1000 + vocab),
// one or two a slot.
dataset::Batch make_batch(int slots, int dense_dim, std::size_t instances, uint64_t base,
                          uint64_t vocab, std::mt19937_64& rng) {
  dataset::Batch batch;
  batch.num_slots = slots;
  batch.dense_dim = dense_dim;
  batch.offsets.assign(1, 0);
  for (int s = 0; s < slots; ++s) {
    for (std::size_t i = 0; i < instances; ++i) {
      const int keys = 1 + static_cast<int>(rng() % 2);
      for (int k = 0; k < keys; ++k) {
        batch.keys.push_back(base + static_cast<uint64_t>(s) * 1000 + rng() % vocab);
      }
      batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
    }
  }
  for (std::size_t i = 0; i < instances; ++i) {
    batch.labels.push_back(static_cast<float>(rng() % 2));
    for (int d = 0; d < dense_dim; ++d) {
      batch.dense.push_back(0.01f * static_cast<float>(rng() % 100));
    }
  }
  return batch;
}

// What the servers hold after a run: every row of `keys` (PEEK, full rows) and the thread's
// dense net.
struct Outcome {
  std::map<uint64_t, std::vector<float>> rows;
  std::vector<float> dense;
  std::map<uint64_t, std::vector<float>> untrained_rows;  // of `stopped_before` (train())
};

// One async thread trains `batches` in order against fresh servers, each step given the next
// batch (`pipelined`) or not; finish_rows() at the end. `stopped_before`: the last step is
// given it as its next, which is then not trained (a pass stopped between two steps).
Outcome train(const TrainerConfig& cfg, const std::vector<dataset::Batch>& batches, bool pipelined,
              const dataset::Batch* stopped_before = nullptr) {
  OneCardOnServers on(cfg, 2);
  const std::unique_ptr<PsWorker> worker = on.worker();
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const dataset::Batch* next = b + 1 < batches.size() ? &batches[b + 1] : stopped_before;
    if (!pipelined) next = nullptr;
    worker->train_step(batches[b], 0, static_cast<int64_t>(b), next);
  }
  worker->finish_rows();
  Outcome out;
  out.rows = peek_rows(on.servers(), batches);
  if (pipelined && stopped_before != nullptr) {
    out.untrained_rows = peek_rows(on.servers(), {*stopped_before});
  }
  out.dense = worker->model().parameters().values_to_host();
  return out;
}

TrainerConfig pipeline_config() {
  // Rows that learn from the first step (no thresholds), so every push changes them; SGD for
  // the dense net, whose steps do not amplify the last bits as Adam's sign-like ones do.
  return ps_test_config({"runner.sync_mode=async", "hyper_parameters.optimizer.class=SGD",
                         "hyper_parameters.sparse_optimizer.embed_threshold=0",
                         "hyper_parameters.sparse_optimizer.embedx_threshold=0"});
}

// How far two runs ended apart: the larger of ||a - b|| / ||a|| over the rows (every row's
// values in one vector) and over the dense nets. Two runs of the same serial steps differ in
// the last bits (oneDNN's sums are not bitwise reproducible between buffers: 5e-8 at most
// here); a run whose steps saw rows one push behind, by what those steps missed (1e-4 here).
double relative_distance(const Outcome& a, const Outcome& b) {
  const auto distance = [](const std::vector<float>& x, const std::vector<float>& y) {
    EXPECT_EQ(x.size(), y.size());
    double diff = 0.0;
    double norm = 0.0;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      diff += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      norm += static_cast<double>(x[i]) * x[i];
    }
    return std::sqrt(diff / std::max(norm, 1e-30));
  };
  std::vector<float> rows_a;
  std::vector<float> rows_b;
  EXPECT_EQ(a.rows.size(), b.rows.size());
  for (const auto& [key, row] : a.rows) {
    // show, click and the score count; the values learned follow them
    rows_a.insert(rows_a.end(), row.begin() + table::RowLayout::kEmbedW, row.end());
    const std::vector<float>& other = b.rows.at(key);
    rows_b.insert(rows_b.end(), other.begin() + table::RowLayout::kEmbedW, other.end());
  }
  return std::max(distance(rows_a, rows_b), distance(a.dense, b.dense));
}

// Batches that share no key with the batch before them (two key ranges in turn, each batch
// sharing keys with the one two steps back): a pull that lacks only the push of the step before
// sees what a serial step sees, so the pipelined run ends exactly where the serial one does.
// A pull sent before the push of two steps back (a deeper pipeline) would not.
TEST(PsRowPipeline, BatchesSharingNoKeyWithTheOneBeforeTrainExactlyAsSerialSteps) {
  const TrainerConfig cfg = pipeline_config();
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(5);
  std::vector<dataset::Batch> batches;
  for (int b = 0; b < 12; ++b) {
    const uint64_t base = b % 2 == 0 ? 1 : 500000;
    batches.push_back(make_batch(slots, cfg.dataset.dense_dim, 1 + rng() % 40, base, 30, rng));
  }
  const Outcome serial = train(cfg, batches, false);
  const Outcome pipelined = train(cfg, batches, true);
  const double diff = relative_distance(serial, pipelined);
  EXPECT_LT(diff, kSameSteps);
}

// Consecutive batches sharing keys: a pipelined step's rows lack its previous step's update, so
// the values differ from the serial run's, but nothing pushed is lost: every key's show and
// click count every occurrence of every step, and none of the batch whose pull the last step
// started but which was not trained.
TEST(PsRowPipeline, SharedKeysMissOnlyThePreviousStepAndEveryPushArrives) {
  const TrainerConfig cfg = pipeline_config();
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(9);
  std::vector<dataset::Batch> batches;
  for (int b = 0; b < 10; ++b) {
    batches.push_back(make_batch(slots, cfg.dataset.dense_dim, 1 + rng() % 50, 1, 20, rng));
  }
  std::map<uint64_t, double> shows;
  std::map<uint64_t, double> clicks;
  for (const dataset::Batch& batch : batches) {
    const std::size_t n = batch.size();
    for (int s = 0; s < batch.num_slots; ++s) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t at = static_cast<std::size_t>(s) * n + i;
        for (uint32_t j = batch.offsets[at]; j < batch.offsets[at + 1]; ++j) {
          shows[batch.keys[j]] += 1.0;
          clicks[batch.keys[j]] += batch.labels[i];
        }
      }
    }
  }
  const Outcome serial = train(cfg, batches, false);
  // Keys of its own: its pull created their rows (peek_rows finds them), with nothing pushed.
  const dataset::Batch untrained = make_batch(slots, cfg.dataset.dense_dim, 30, 700000, 20, rng);
  const Outcome pipelined = train(cfg, batches, true, &untrained);
  ASSERT_FALSE(pipelined.untrained_rows.empty());
  for (const auto& [key, row] : pipelined.untrained_rows) {
    EXPECT_EQ(row[table::RowLayout::kShow], 0.0f) << "untrained key " << key;
    EXPECT_EQ(row[table::RowLayout::kClick], 0.0f) << "untrained key " << key;
  }
  const double diff = relative_distance(serial, pipelined);
  EXPECT_GT(diff, kSameSteps) << "no step saw a row one push behind: was anything pipelined?";
  for (const auto& [key, row] : pipelined.rows) {
    EXPECT_FLOAT_EQ(row[table::RowLayout::kShow], static_cast<float>(shows.at(key)))
        << "key " << key;
    EXPECT_FLOAT_EQ(row[table::RowLayout::kClick], static_cast<float>(clicks.at(key)))
        << "key " << key;
  }
}

// A pipelined step like one before allocates nothing, whichever row and push slot its batch
// lands in: the first (big) step sizes both.
TEST(PsRowPipeline, TheSteadyPipelinedStepAllocatesNothing) {
  const TrainerConfig cfg = pipeline_config();
  OneCardOnServers on(cfg, 1);
  const std::unique_ptr<PsWorker> worker = on.worker();
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(2);
  const dataset::Batch big = make_batch(slots, cfg.dataset.dense_dim, 64, 1, 400, rng);
  const dataset::Batch small = make_batch(slots, cfg.dataset.dense_dim, 3, 1, 400, rng);
  // Small, small, big in turn: the big batch lands in each row slot and each push slot.
  const auto batch_of = [&](int step) -> const dataset::Batch& {
    return step % 3 == 0 ? big : small;
  };
  worker->train_step(big, 0, 0, &batch_of(1));
  const uint64_t sized = worker->step_allocations();
  for (int step = 1; step < 30; ++step) {
    worker->train_step(batch_of(step), 0, step, step + 1 < 30 ? &batch_of(step + 1) : nullptr);
  }
  worker->finish_rows();
  EXPECT_EQ(worker->step_allocations(), sized);
}

// A step must be given the batch the step before was given as its next (the rows pulled are
// that batch's): one of as many keys but another key, or the same keys in other slots, fails
// the step naming its pass and step; the very batch passes.
TEST(PsRowPipeline, AStepGivenAnotherBatchThanThePrefetchedOneFailsNamingIt) {
  const TrainerConfig cfg = pipeline_config();
  OneCardOnServers on(cfg, 1);
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(6);
  const dataset::Batch first = make_batch(slots, cfg.dataset.dense_dim, 8, 1, 50, rng);
  const dataset::Batch next = make_batch(slots, cfg.dataset.dense_dim, 8, 1, 50, rng);
  dataset::Batch other_key = next;
  other_key.keys.back() += 1;
  dataset::Batch other_slots = next;  // slot 0's last key (of instance 7) moved into slot 1
  ASSERT_EQ(other_slots.offsets.size(), static_cast<std::size_t>(slots) * 8 + 1);
  other_slots.offsets[8] -= 1;
  for (const dataset::Batch* wrong : {&other_key, &other_slots}) {
    const std::unique_ptr<PsWorker> worker = on.worker();
    worker->train_step(first, 2, 0, &next);
    try {
      worker->train_step(*wrong, 2, 1, nullptr);
      ADD_FAILURE() << "a step given another batch than the one prefetched ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pass 2, step 1: a batch of"), std::string::npos)
          << e.what();
    }
  }
  const std::unique_ptr<PsWorker> worker = on.worker();
  worker->train_step(first, 2, 0, &next);
  worker->train_step(next, 2, 1, nullptr);
  worker->finish_rows();
}

// A server that dies while the next batch's rows are being pulled: a later step fails within
// the call deadline, naming the server and the pass and step of the call that failed; the
// calls queued behind it are not sent, and finish_rows() and the destructor report it too.
TEST(PsRowPipeline, ADeadServerMidPrefetchFailsTheNextStepNamingItAndTheCall) {
  const TrainerConfig cfg = pipeline_config();
  // The failed call retries the stopped server's refused connects for 2 s, not its deadline (30 s,
  // which a restarted server would meet): the live shard's calls keep that deadline, which a
  // loaded machine (ctest -j2 on 2 cores) may need. 2 s is well above connect_timeout_s (0.5 s).
  OneCardOnServers on(cfg, 2, /*unreachable_s=*/2.0);
  std::unique_ptr<PsWorker> worker = on.worker();
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(4);
  std::vector<dataset::Batch> batches;
  for (int b = 0; b < 8; ++b) {
    batches.push_back(make_batch(slots, cfg.dataset.dense_dim, 32, 1, 5000, rng));
  }
  worker->train_step(batches[0], 3, 0, &batches[1]);  // batch 1's pull under way
  on.shards().stop(1);
  const std::string endpoints = on.shards().endpoints();
  const std::string dead = endpoints.substr(endpoints.find(',') + 1);
  const auto started = std::chrono::steady_clock::now();
  std::string error;
  std::size_t b = 1;
  for (; b + 1 < batches.size() && error.empty(); ++b) {
    try {
      worker->train_step(batches[b], 3, static_cast<int64_t>(b), &batches[b + 1]);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "every step against a dead server succeeded";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
  EXPECT_NE(error.find(dead), std::string::npos) << error;
  // The stopped server closed the call's connection (Server::wait): the client learned it at once
  // and retried, refused, for unreachable_s (a server restarted meanwhile would have taken the
  // call), rather than waiting on a connection nobody answers: no attempt, nor the call, ended by
  // a deadline (its code's name, as the status writes it).
  EXPECT_EQ(error.find("DeadlineExceeded"), std::string::npos) << error;
  EXPECT_NE(error.find("no attempt reached it for 2 s"), std::string::npos) << error;
  const bool learned = error.find("Connection refused") != std::string::npos ||
                       error.find("server stopped") != std::string::npos;
  EXPECT_TRUE(learned) << error;
  const bool names_call = error.find("pulling the rows of pass 3, step ") != std::string::npos ||
                          error.find("pushing the gradients of pass 3, step ") != std::string::npos;
  EXPECT_TRUE(names_call) << error;
  EXPECT_LE(b, 3u) << "the failure surfaced only at step " << b - 1 << ": " << error;
  // The end of the pass reports it again (the calls behind it were not sent); the destructor,
  // which runs after that report, does not log it a second time.
  try {
    worker->finish_rows();
    ADD_FAILURE() << "finish_rows() after a failed call succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dead), std::string::npos) << e.what();
  }
  ::testing::internal::CaptureStderr();
  worker.reset();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("a call of the sparse rows"), std::string::npos) << log;
}

// A step that throws after it started pulling the next batch's rows (a non-finite gradient) waits
// for that pull before the error leaves: nothing of the worker is still being written, and it
// trains on (the next pass, with other batches) exactly as a fresh worker does. The next batch's
// pull is held kHoldMs; a step that throws sooner (timed: the same step with nothing held) shows
// a throw that left with the pull under way.
TEST(PsRowPipeline, AStepThatThrowsWaitsForTheNextBatchsPullAndTheWorkerTrainsOn) {
  constexpr int kHoldMs = 3000;
  constexpr uint64_t kAbandonedBase = 900000;
  const TrainerConfig cfg = pipeline_config();
  ASSERT_GT(cfg.dataset.dense_dim, 0);
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(21);
  dataset::Batch poisoned = make_batch(slots, cfg.dataset.dense_dim, 8, 700000, 50, rng);
  poisoned.dense[0] = std::numeric_limits<float>::quiet_NaN();
  const dataset::Batch abandoned =
      make_batch(slots, cfg.dataset.dense_dim, 4, kAbandonedBase, 50, rng);
  std::vector<dataset::Batch> batches;
  for (int b = 0; b < 6; ++b) {
    batches.push_back(make_batch(slots, cfg.dataset.dense_dim, 1 + rng() % 60, 1, 30, rng));
  }
  const Outcome fresh = train(cfg, batches, true);

  auto table = table::SparseTable::open(cfg.sparse, cfg.host_tier.table);
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  SlowPulls slow(**table);
  table::server::ServerOptions options;
  options.data_dir = std::filesystem::temp_directory_path().string();
  auto server = table::server::Server::start(&slow, options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const std::unique_ptr<RemoteHostTier> servers = connect((*server)->endpoint(), cfg);
  device::Card card(0, 0, 0, 1);
  card.activate();
  PsWorker worker(card, *servers, cfg);
  worker.sync_dense(0.0f);
  const auto throws_after = [&](const dataset::Batch* next) {
    const auto start = std::chrono::steady_clock::now();
    try {
      worker.train_step(poisoned, 0, 3, next);
      ADD_FAILURE() << "a step with a NaN dense value succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pass 0, batch 3: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("nan"), std::string::npos) << e.what();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double unheld_s = throws_after(nullptr);  // nothing prefetched, nothing held
  slow.hold(kAbandonedBase, kHoldMs);
  const double held_s = throws_after(&abandoned);
  EXPECT_EQ(slow.never_pulled(abandoned), 0u)
      << "the step threw with the next batch's pull under way (it took " << held_s << " s)";
  EXPECT_GE(held_s, kHoldMs / 1000.0) << "the step returned before the held pull ended";
  slow.hold(0, 0);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const dataset::Batch* next = b + 1 < batches.size() ? &batches[b + 1] : nullptr;
    worker.train_step(batches[b], 1, static_cast<int64_t>(b), next);
  }
  worker.finish_rows();
  Outcome after;
  after.rows = peek_rows(*servers, batches);
  after.dense = worker.model().parameters().values_to_host();
  EXPECT_LT(relative_distance(fresh, after), kSameSteps);
  if (unheld_s >= kHoldMs / 1000.0) {
    GTEST_SKIP() << "the failing step took " << unheld_s << " s with nothing held, not under the "
                 << kHoldMs << " ms hold: this run could not show a throw leaving under the pull";
  }
}

// ---- exchange_dense() ----------------------------------------------------------------------

// The async mode's dense exchange runs off the training thread, one window behind: with one
// thread, the servers' only writer, no change of the
// thread may be lost or counted twice, so steps given no next batch (rows pulled behind the
// thread's own pushes) end where the same steps with each window added and adopted in place
// (sync_dense) end, up to the rounding of the servers' sums. SGD: Adam makes a rounding a step
// of about the learning rate where a gradient is near zero.
TEST(PsDenseExchange, TheBackgroundExchangeLosesNoWindow) {
  const TrainerConfig cfg = pipeline_config();
  const int slots = static_cast<int>(cfg.dataset.slots.size());
  std::mt19937_64 rng(12);
  std::vector<dataset::Batch> batches;
  for (int b = 0; b < 14; ++b) {
    batches.push_back(make_batch(slots, cfg.dataset.dense_dim, 1 + rng() % 60, 1, 40, rng));
  }
  for (const std::size_t window : {1u, 3u}) {
    SCOPED_TRACE(window);
    std::vector<float> dense[2];
    for (const bool background : {false, true}) {
      OneCardOnServers on(cfg, 1);
      const std::unique_ptr<PsWorker> worker = on.worker();
      for (std::size_t b = 0; b < batches.size(); ++b) {
        worker->train_step(batches[b], 0, static_cast<int64_t>(b));
        if ((b + 1) % window != 0) continue;
        if (background) {
          worker->exchange_dense();
        } else {
          worker->sync_dense(1.0f);
        }
      }
      worker->sync_dense(1.0f);
      dense[background] = worker->model().parameters().values_to_host();
      std::vector<float> table(dense[background].size(), 0.0f);
      throw_if_error(
          on.servers().dense(table::server::DenseAction::kRead, kDenseTableName, &table));
      EXPECT_EQ(table, dense[background]) << "the thread's net is not the servers' table";
    }
    ASSERT_EQ(dense[0].size(), dense[1].size());
    double most = 0.0;
    for (std::size_t i = 0; i < dense[0].size(); ++i) {
      most = std::max(most, static_cast<double>(std::abs(dense[0][i] - dense[1][i])));
    }
    EXPECT_LT(most, 1e-5);
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
