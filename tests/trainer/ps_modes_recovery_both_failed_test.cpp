// Issue 32, two trainers failing at once: server 1 restarts after pass 0's save, and each
// trainer's evaluation of epoch 0 then fails on its card with a fault of its own, before any call
// (no restart agreed: each finds it by asking every server). Both reach the recovery unagreed:
// each votes for the pass after (vote_after_evaluation: the marks pass + 2 that
// other_failed_in_pass reads after a pass), both meet after the evaluation, go back to pass 0's
// save together, and name their own fault "after pass 0". The oracle, as
// ps_modes_recovery_jobs_test.cpp's: the same 2-trainer job resumed from that save by new trainers
// on fresh servers (every row's show and click counts equal: each instance counted once).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using ps_test::count;
using ps_test::PsModes;

constexpr const char* kFault = "an injected device fault";
// As ps_modes_recovery_jobs_test.cpp's kAucBound: two runs from one save differ by the order of
// their pushes.
constexpr double kAucBound = 0.01;
// The restart votes' table (ps_trainer_recovery.cpp): per trainer its vote, then its failure.
constexpr const char* kVotesTable = "ps_restart_votes";

struct JobRan {
  std::vector<int64_t> passes[2];  // what each trainer's train() returned
  std::string errors;              // the trainers' errors ("" when both ended well)
  std::string log;
  double test_auc = 0;                                 // trainer 0's, after training
  std::map<uint64_t, std::pair<float, float>> counts;  // every row's show and click, at the end
  std::vector<float> votes;  // the restart votes as each trainer came to go back (faults only)
};

class PsJobBothFailed : public PsModes {
 protected:
  static TrainerConfig job_config(const std::string& saves, int epochs) {
    return ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                           "runner.test_data_dir=" + (root_ / "test").string(),
                           "runner.sync_mode=async", "runner.save_mode=checkpoint",
                           "runner.model_save_path=" + saves,
                           "runner.epochs=" + std::to_string(epochs), "runner.print_interval=20",
                           // As ps_modes_recovery_jobs_test.cpp's: a loaded machine.
                           "runner.collective_timeout_s=20", "runner.server_timeout_s=20"});
  }

  // A job of 2 trainers on 2 fresh servers, `epochs` passes saved under `saves`. `faults`: server
  // 1 restarts after pass 0's save (trainer 0's on_pass), and each trainer's first evaluation
  // fails with kFault once the restart was made.
  static JobRan run_job(const std::string& saves, int epochs, bool faults) {
    const TrainerConfig cfg = job_config(saves, epochs);
    Servers shards(cfg, 2);
    const auto reader = connect_client(shards, cfg);
    std::atomic<bool> restarted{false};
    std::atomic<bool> faulted[2] = {false, false};
    JobRan ran;
    std::vector<float> votes[2];
    std::string errors[2];
    std::unique_ptr<PsTrainer> trainers[2];
    ::testing::internal::CaptureStderr();
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        const PsTrainer::OrderHook hook = [&, w](const std::string& point) {
          if (!faults) return;
          if (point == "evaluate" && !faulted[w].exchange(true)) {
            for (int i = 0; i < 60000 && !restarted.load(); ++i) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            throw Error(kFault);
          }
          // Every vote was cast before its trainer met after the evaluation, which each left
          // before it comes here (and the recovery's start zeroes them after this meeting).
          if (point.rfind("meet ps/recover/", 0) == 0) {
            votes[w].assign(4, -1.0f);
            table::server::DenseCall call;
            call.mutation = false;
            EXPECT_TRUE(
                reader->dense(table::server::DenseAction::kRead, kVotesTable, &votes[w], call)
                    .ok());
          }
        };
        RunHooks hooks;
        if (w == 0 && faults) {
          hooks.on_pass = [&](const PassReport& report) {
            if (report.pass == 0 && !restarted.load()) {
              shards.restart(1);
              restarted = true;
            }
          };
        }
        try {
          TrainerEnv env;
          env.servers = shards.endpoints();
          env.trainer_id = w;
          env.trainers = 2;
          trainers[w] = std::make_unique<PsTrainer>(cfg, env, hook);
          for (const PassReport& report : trainers[w]->train("", hooks)) {
            ran.passes[w].push_back(report.pass);
          }
        } catch (const std::exception& e) {
          errors[w] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (trainers[0] && errors[0].empty()) ran.test_auc = test_auc(*trainers[0]);
    ran.log = ::testing::internal::GetCapturedStderr();
    for (int w = 0; w < 2; ++w) {
      if (!errors[w].empty()) ran.errors += "trainer " + std::to_string(w) + ": " + errors[w];
    }
    EXPECT_EQ(votes[0], votes[1]) << "the trainers read different votes";
    ran.votes = votes[0];
    for (int i = 0; i < 2; ++i) {
      throw_if_error(shards.table(i).for_each_row([&](uint64_t key, const float* row) {
        ran.counts[key] = {row[table::RowLayout::kShow], row[table::RowLayout::kClick]};
      }));
    }
    EXPECT_EQ(restarted.load(), faults);
    return ran;
  }
};

TEST_F(PsJobBothFailed, BothTrainersFailingAfterAPassGoBackToItsSaveTogether) {
  const std::string resumed_saves = (root_ / "both_failed_resumed").string();
  const JobRan first = run_job(resumed_saves, 1, false);
  ASSERT_EQ(first.errors, "") << first.log;
  const JobRan resumed = run_job(resumed_saves, 2, false);
  ASSERT_EQ(resumed.errors, "") << resumed.log;
  EXPECT_EQ(resumed.passes[0], (std::vector<int64_t>{1}));
  const JobRan recovered = run_job((root_ / "both_failed_restarted").string(), 2, true);
  ASSERT_EQ(recovered.errors, "") << recovered.log;
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(recovered.passes[w], (std::vector<int64_t>{0, 1})) << "trainer " << w;
  }
  // Each trainer voted for pass 1 (mark 2, pass 0 + 2), and its failure beside the restart.
  EXPECT_EQ(recovered.votes, (std::vector<float>{2, 2, 2, 2}));
  // Trainer 0 reloads pass 0's save once; both train pass 1 again from it.
  EXPECT_EQ(count(recovered.log, "reloading the last complete save (pass 0, "), 1u)
      << recovered.log;
  EXPECT_EQ(count(recovered.log, "with the job's 2 trainers; training again from pass 1"), 2u)
      << recovered.log;
  // Each names its own fault: trainer 0 as it reloads, trainer 1 as it follows.
  const std::string own = std::string("; this trainer also failed after pass 0: card 0: ") + kFault;
  EXPECT_EQ(count(recovered.log, own + ". Every update of the pass went to the servers: reloading"),
            1u)
      << recovered.log;
  EXPECT_EQ(count(recovered.log, own + ". Reloading "), 1u) << recovered.log;
  EXPECT_EQ(recovered.log.find("also failed in pass"), std::string::npos) << recovered.log;
  EXPECT_EQ(recovered.log.find("a trainer died or is stuck"), std::string::npos) << recovered.log;
  EXPECT_FALSE(resumed.counts.empty());
  EXPECT_EQ(recovered.counts.size(), resumed.counts.size());
  EXPECT_TRUE(recovered.counts == resumed.counts) << "the rows' show and click counts differ";
  EXPECT_LT(std::fabs(recovered.test_auc - resumed.test_auc), kAucBound);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
