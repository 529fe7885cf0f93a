// Issue 32, sync: a trainer that only hears of a server restart at a step's barrier (another
// trainer's step failed on it: SyncBarriers::hold, FailureTold) is not named as failed, and goes
// back to the last save with the others. The oracle, as ps_modes_recovery_jobs_test.cpp's: the
// same 2-trainer job resumed from that save by new trainers on fresh servers, which a sync job of
// one thread a trainer ends as to the bit (every row, the dense weights, the held-out AUC).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using ps_test::count;
using ps_test::first_row_differing;
using ps_test::PsModes;

// What the trainer that lets the others out of a sync step's barrier logs (SyncBarriers::hold).
constexpr const char* kHeld = "so that the others waiting there go on to the pass's end";

// Trainer w's order hook, at each of its points.
using JobHook = std::function<void(int w, const std::string& point)>;

struct JobEnded {
  std::vector<int64_t> passes[2];  // what each trainer's train() returned
  std::string errors;              // the trainers' errors ("" when both ended well)
  std::string log;
  double test_auc = 0;                          // trainer 0's, after training
  std::vector<float> dense;                     // trainer 0's, after training
  int threads = 1;                              // trainer 0's training threads
  std::map<uint64_t, std::vector<float>> rows;  // every row whole, at the end
  uint64_t waits_given_up = 0;                  // as ps_modes_recovery_jobs_test.cpp's JobRan
};

// Every row's show and click counts.
std::map<uint64_t, std::pair<float, float>> counts_of(const JobEnded& ended) {
  std::map<uint64_t, std::pair<float, float>> counts;
  for (const auto& [key, row] : ended.rows) {
    counts[key] = {row[table::RowLayout::kShow], row[table::RowLayout::kClick]};
  }
  return counts;
}

// Until `done` holds, for 60 s at most (a trainer that never gets there fails the test).
void wait_until(const std::function<bool()>& done, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "not within 60 s: " << what;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Server 1 restarts once trainer 1 pulled step 20's rows of pass 1 and comes to the barrier
// after them, while trainer 0 waits after step 19's barrier: trainer 0's pull of step 20 fails on
// the restart, and it marks the barrier and comes to it (SyncBarriers::hold); trainer 1 makes no
// call to the restarted server before it hears of it there.
class RestartBeforeTrainer0sPull {
 public:
  explicit RestartBeforeTrainer0sPull(Servers& shards) : shards_(shards) {}
  bool restarted() const { return restarted_.load(); }
  void at(int w, const std::string& point) {
    if (w == 0 && point == "arrived pass 1, step 19" && !restarted_.load()) {
      wait_until([&] { return trainer1_at_barrier_.load(); }, "trainer 1 at step 20's pulls");
      shards_.restart(1);  // trainer 1 waits in its hook, trainer 0 here: neither calls it
      restarted_ = true;
    }
    if (w == 1 && point == "arrive pass 1, step 20's pulls" && !trainer1_at_barrier_.load()) {
      trainer1_at_barrier_ = true;
      // Trainer 0's pull failed on the restart, and it marked the barrier and waits there.
      wait_until([&] { return restarted_.load() && shards_.barrier_waiters(0) > 0; },
                 "trainer 0 holding step 20's pulls");
    }
  }

 private:
  Servers& shards_;
  std::atomic<bool> trainer1_at_barrier_{false};
  std::atomic<bool> restarted_{false};
};

class PsJobRecoveryHeard : public PsModes {
 protected:
  // A sync job of 2 trainers, `epochs` passes over the training files, each saved (checkpoint)
  // under `saves`, resuming the newest save there (ps_modes_recovery_jobs_test.cpp's job_config).
  static TrainerConfig job_config(const std::string& saves, int epochs) {
    return ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                           "runner.test_data_dir=", "runner.sync_mode=sync",
                           "runner.save_mode=checkpoint", "runner.model_save_path=" + saves,
                           "runner.epochs=" + std::to_string(epochs), "runner.geo_step=4",
                           "runner.print_interval=20", "runner.collective_timeout_s=20",
                           "runner.server_timeout_s=20"});
  }

  // The job of `cfg` on `shards`, each trainer with `hook`: once both ended, trainer 0 evaluates
  // the test files (as PsModes::run_job's callers do, which creates the test set's missing rows
  // at their initial values), and then every row is read.
  static JobEnded run_job_on(Servers& shards, const TrainerConfig& cfg, const JobHook& hook) {
    JobEnded ended;
    ::testing::internal::CaptureStderr();
    std::vector<std::unique_ptr<PsTrainer>> trainers(2);
    std::string errors[2];
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        try {
          TrainerEnv env;
          env.servers = shards.endpoints();
          env.trainer_id = w;
          env.trainers = 2;
          auto& trainer = trainers[static_cast<std::size_t>(w)];
          trainer = std::make_unique<PsTrainer>(cfg, env, [&hook, w](const std::string& point) {
            if (hook) hook(w, point);
          });
          for (const PassReport& report : trainer->train(""))
            ended.passes[w].push_back(report.pass);
        } catch (const std::exception& e) {
          errors[w] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (trainers[0] != nullptr && errors[0].empty()) {
      ended.threads = trainers[0]->threads();
      ended.test_auc = test_auc(*trainers[0]);
      ended.dense = trainers[0]->dense_values();
    }
    trainers.clear();
    ended.log = ::testing::internal::GetCapturedStderr();
    for (int w = 0; w < 2; ++w) {
      if (!errors[w].empty())
        ended.errors += "trainer " + std::to_string(w) + ": " + errors[w] + "\n";
    }
    for (int i = 0; i < 2; ++i) {
      const auto floats = static_cast<std::size_t>(shards.table(i).layout().stride());
      throw_if_error(shards.table(i).for_each_row(
          [&](uint64_t key, const float* row) { ended.rows[key].assign(row, row + floats); }));
    }
    ended.waits_given_up = shards.barrier_waiters_dropped(0);
    return ended;
  }

  // The oracle: pass 0 saved under `saves` by a 2-trainer job, then a new 2-trainer job on fresh
  // servers resumes from that save for pass 1.
  static JobEnded resumed_from_the_save(const std::string& saves) {
    const TrainerConfig first_cfg = job_config(saves, 1);
    Servers first_shards(first_cfg, 2);
    const JobEnded first = run_job_on(first_shards, first_cfg, nullptr);
    EXPECT_EQ(first.errors, "") << first.log;
    const TrainerConfig cfg = job_config(saves, 2);
    Servers shards(cfg, 2);
    JobEnded resumed = run_job_on(shards, cfg, nullptr);
    EXPECT_EQ(resumed.errors, "") << resumed.log;
    EXPECT_EQ(resumed.passes[0], (std::vector<int64_t>{1}));
    return resumed;
  }

  // Trainer 1 heard of the restart at the barrier, nobody was named as failed, and both went
  // back to pass 0's save with the vote, no barrier waited out.
  static void expect_heard_and_nobody_named(const JobEnded& recovered) {
    const std::string& log = recovered.log;
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ(recovered.passes[w], (std::vector<int64_t>{0, 1})) << "trainer " << w;
    }
    EXPECT_NE(log.find("pass 1: card 0: sync mode, pass 1, step 20's pulls: another trainer's "
                       "step failed on a server restart"),
              std::string::npos)
        << log;
    EXPECT_EQ(count(log, kHeld), 1u) << log;
    EXPECT_EQ(log.find("also failed"), std::string::npos) << log;
    EXPECT_EQ(count(log, "reloading the last complete save (pass 0, "), 1u) << log;
    EXPECT_EQ(count(log, "with the job's 2 trainers; training again from pass 1"), 2u) << log;
    EXPECT_EQ(log.find("a trainer died or is stuck"), std::string::npos) << log;
    EXPECT_EQ(recovered.waits_given_up, 0u) << log;
  }
};

// Trainer 1 is not named as failed, both go back to pass 0's save with the vote, and the job
// ends as the one resumed from that save: nothing accepted before the save lost, nothing of the
// failed pass left.
TEST_F(PsJobRecoveryHeard, SyncTrainerThatOnlyHearsOfARestartAtItsBarrierIsNotBlamed) {
  const JobEnded resumed = resumed_from_the_save((root_ / "job_recovery_heard_resumed").string());
  ASSERT_EQ(resumed.errors, "") << resumed.log;
  const TrainerConfig cfg = job_config((root_ / "job_recovery_heard").string(), 2);
  Servers shards(cfg, 2);
  RestartBeforeTrainer0sPull restart(shards);
  const JobEnded recovered = run_job_on(
      shards, cfg, [&restart](int w, const std::string& point) { restart.at(w, point); });
  ASSERT_EQ(recovered.errors, "") << recovered.log;
  EXPECT_TRUE(restart.restarted());
  expect_heard_and_nobody_named(recovered);
  // Every row's show and click counts (sums of whole instances), the test set's rows that only
  // the evaluation made (0, 0) too.
  EXPECT_FALSE(resumed.rows.empty());
  EXPECT_TRUE(counts_of(recovered) == counts_of(resumed))
      << "the rows' show and click counts differ";
  // One thread a trainer: deterministic (ps_modes_recovery_jobs_test.cpp's
  // job_ends_as_resumed_from_the_save).
  if (recovered.threads == 1) {
    EXPECT_EQ(first_row_differing(recovered.rows, resumed.rows), "");
    EXPECT_EQ(recovered.dense, resumed.dense) << "the dense parameters differ";
    EXPECT_EQ(recovered.test_auc, resumed.test_auc);
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
