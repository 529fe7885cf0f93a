// Issue 32, the gpubox mode: a server of a job of 2 gpubox-mode trainers (threads of this
// process, one simulated card each, meeting through Gloo over loopback) restarted (same port,
// empty) between passes, within a pass (found at its end_pass) or before an evaluation is
// repaired in the run: the trainers meet after every phase that calls the servers, hear there
// whether one of them found a restart, and all go back to the save trainer 0 chooses together.
// The oracle: the same 2-trainer job resumed from that save by new trainers on fresh servers (as
// a rerun in new processes resumes it). The schedule is deterministic (no shuffle, every
// reduction in a fixed order), so every row's show and click counts end equal: every instance of
// every pass counted once, none of the failed pass's updates left on a server and none of the
// save lost; the held-out AUC is compared within a bound. A recovery trainer 0 refuses
// (runner.resume off, no save yet) stops both trainers at once, naming why. No trainer waits out
// a collective's timeout (its error would say so).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "table/sparse_row/accessor.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using ps_modes::Servers;

// The recovered job and the one resumed from the same save train the same instances in the
// same order; the bound guards the model as a whole, the rows' counts are compared exactly.
constexpr double kAucBound = 0.01;

// Where server 1 of 2 restarts (trainer 0's hooks).
enum class RestartAt {
  kNever,
  kBetweenPasses,  // after pass 0's save, no evaluation: found before pass 1
  kWithinPass,     // at step 20 of pass 1: found at its end_pass
  kAtEvaluation,   // after pass 0's save: found by epoch 0's evaluation
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct JobRan {
  std::vector<int64_t> passes[2];  // what each trainer's train() returned
  std::string errors[2];           // each trainer's error ("" when it ended well)
  std::string log;
  double test_auc = 0;                                 // the job's, after training
  std::map<uint64_t, std::pair<float, float>> counts;  // every row's show and click, at the end
  int epoch0_evaluations[2] = {0, 0};                  // each trainer's on_epoch(0, ..., test)
};

class GpuboxJobRecovery : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_job_recovery_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::OracleSummary oracle;
    gpubox::testing::write_planted_train_test(root_, &oracle);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Trainer w's hooks: trainer 0 restarts server 1 of `shards` at `at`, once.
  static RunHooks hooks_of(int w, RestartAt at, const std::function<void()>& restart_once,
                           JobRan* ran) {
    RunHooks hooks;
    hooks.on_epoch = [ran, w](int64_t epoch, const MetricValues&, const MetricValues* test) {
      if (epoch == 0 && test != nullptr) ++ran->epoch0_evaluations[w];
    };
    if (w != 0) return hooks;
    if (at == RestartAt::kBetweenPasses || at == RestartAt::kAtEvaluation) {
      hooks.on_pass = [restart_once](const PassReport& report) {
        if (report.pass == 0) restart_once();
      };
    }
    if (at == RestartAt::kWithinPass) {
      hooks.steps.on_progress = [restart_once](const StepProgress& progress) {
        if (progress.pass == 1 && progress.step == 20) restart_once();
      };
    }
    return hooks;
  }

  // A job of 2 gpubox-mode trainers against 2 fresh servers, `epochs` passes over the training
  // files, each saved (checkpoint) under `saves`, resuming the newest save there; server 1
  // restarted at `at`; `keys` added to the config, then `trainer1_keys` to trainer 1's. The
  // job's held-out AUC after training.
  static JobRan run_job(const std::string& name, const std::string& saves, int epochs, RestartAt at,
                        const std::vector<std::string>& keys = {},
                        const std::vector<std::string>& trainer1_keys = {}) {
    std::vector<std::string> all = {
        "runner.train_data_dir=" + (root_ / "train").string(),
        "runner.test_data_dir=" +
            (at == RestartAt::kAtEvaluation ? (root_ / "test").string() : std::string()),
        "runner.save_mode=checkpoint",
        "runner.model_save_path=" + saves,
        "runner.epochs=" + std::to_string(epochs),
        "runner.print_interval=20",
        "runner.server_timeout_s=3",
        "runner.collective_timeout_s=20",
        "hyper_parameters.fc_sizes=[64, 32]"};
    all.insert(all.end(), keys.begin(), keys.end());
    const TrainerConfig cfg = testing::load_test_config(testing::test_data_overrides(), all);
    all.insert(all.end(), trainer1_keys.begin(), trainer1_keys.end());
    const TrainerConfig cfg1 = testing::load_test_config(testing::test_data_overrides(), all);
    Servers shards(cfg, 2);
    std::atomic<bool> restarted{false};
    const std::function<void()> restart_once = [&] {
      if (!restarted.exchange(true)) shards.restart(1);
    };
    JobRan ran;
    ::testing::internal::CaptureStderr();
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        TrainerEnv env;
        env.servers = shards.endpoints();
        env.trainer_id = w;
        env.trainers = 2;
        env.threads_per_card = 1;
        env.rendezvous = "file://" + (root_ / ("rendezvous_" + name)).string();
        std::unique_ptr<Trainer> trainer;
        // Caught before the trainer goes: it then tells the other one that it ended.
        try {
          trainer = std::make_unique<Trainer>(w == 0 ? cfg : cfg1, env);
          for (const PassReport& report : trainer->train("", hooks_of(w, at, restart_once, &ran)))
            ran.passes[w].push_back(report.pass);
          const EvalResult test = trainer->evaluate(data_files((root_ / "test").string()), false);
          if (w == 0) ran.test_auc = test.metrics.auc;
        } catch (const std::exception& e) {
          ran.errors[w] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    ran.log = ::testing::internal::GetCapturedStderr();
    for (int i = 0; i < 2; ++i) {
      throw_if_error(shards.table(i).for_each_row([&](uint64_t key, const float* row) {
        ran.counts[key] = {row[table::RowLayout::kShow], row[table::RowLayout::kClick]};
      }));
    }
    EXPECT_EQ(restarted.load(), at != RestartAt::kNever);
    // A trainer that missed the others would have waited out runner.collective_timeout_s.
    EXPECT_EQ(ran.log.find("stalled past the"), std::string::npos) << ran.log;
    EXPECT_EQ(ran.log.find("communicator aborted"), std::string::npos) << ran.log;
    return ran;
  }

  // The oracle (pass 0 saved by a 2-trainer job, then a new 2-trainer job on fresh servers
  // resumes from that save for pass 1) against the same job with server 1 restarted at `at`.
  static JobRan job_ends_as_resumed_from_the_save(const std::string& name, RestartAt at) {
    const std::string resumed_saves = (root_ / (name + "_resumed")).string();
    const JobRan first = run_job(name + "_first", resumed_saves, 1, RestartAt::kNever);
    EXPECT_EQ(first.errors[0] + first.errors[1], "") << first.log;
    const JobRan resumed = run_job(name + "_resumed", resumed_saves, 2, RestartAt::kNever);
    EXPECT_EQ(resumed.errors[0] + resumed.errors[1], "") << resumed.log;
    EXPECT_EQ(resumed.passes[0], (std::vector<int64_t>{1}));
    const JobRan recovered = run_job(name, (root_ / (name + "_restarted")).string(), 2, at);
    EXPECT_EQ(recovered.errors[0] + recovered.errors[1], "") << recovered.log;
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ(recovered.passes[w], (std::vector<int64_t>{0, 1})) << "trainer " << w;
    }
    // Trainer 0 chose its last save; trainer 1 went back to the same one with it.
    EXPECT_EQ(count(recovered.log, "reloading the last complete save (pass 0, "), 1u)
        << recovered.log;
    EXPECT_EQ(count(recovered.log, "/" + name + "_restarted/0 with every trainer of the job"), 1u)
        << recovered.log;
    EXPECT_EQ(count(recovered.log, "with the job's 2 trainers; training again from pass 1"), 2u)
        << recovered.log;
    // Where each trainer heard of the restart.
    const std::string heard = "going back to the last save with every trainer";
    for (auto at = recovered.log.find(heard); at != std::string::npos;
         at = recovered.log.find(heard, at + 1)) {
      const auto begin = recovered.log.rfind('\n', at) + 1;
      std::printf("%s\n", recovered.log.substr(begin, at - begin).c_str());
    }
    std::printf(
        "gpubox, 2 trainers, server 1 restarted (%s): test auc %.6f, resumed from the "
        "save %.6f\n",
        name.c_str(), recovered.test_auc, resumed.test_auc);
    EXPECT_FALSE(resumed.counts.empty());
    EXPECT_EQ(recovered.counts.size(), resumed.counts.size());
    EXPECT_TRUE(recovered.counts == resumed.counts) << "the rows' show and click counts differ";
    EXPECT_LT(std::fabs(recovered.test_auc - resumed.test_auc), kAucBound);
    return recovered;
  }

  // A job whose server restarts at `at` with `keys`: trainer 0 refuses to go back, and both
  // trainers stop at once, trainer 1 naming `reason`.
  static void refused_recovery_stops_both(const std::string& name, RestartAt at,
                                          const std::vector<std::string>& keys,
                                          const std::string& reason) {
    const JobRan ran = run_job(name, (root_ / name).string(), 2, at, keys);
    for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
    EXPECT_NE(ran.errors[0].find("server "), std::string::npos) << ran.log;
    EXPECT_NE(ran.errors[1].find("trainer 0 cannot go back to a save (" + reason + ")"),
              std::string::npos)
        << ran.errors[1];
  }

  inline static fs::path root_;
};

TEST_F(GpuboxJobRecovery, ServerRestartedBetweenPassesIsRepairedByBothTrainers) {
  const JobRan ran = job_ends_as_resumed_from_the_save("between", RestartAt::kBetweenPasses);
  EXPECT_NE(ran.log.find("before pass 1: "), std::string::npos) << ran.log;
}

// Found at the pass's end_pass (the steps call no server): the pass's rows on the cards are
// dropped and the pass trained again from the last save.
TEST_F(GpuboxJobRecovery, ServerRestartedWithinAPassIsRepairedAtItsEnd) {
  const JobRan ran = job_ends_as_resumed_from_the_save("within", RestartAt::kWithinPass);
  EXPECT_NE(ran.log.find("at the end of pass 1: "), std::string::npos) << ran.log;
  EXPECT_NE(ran.log.find("The pass's rows on the cards are dropped: reloading the last "
                         "complete save (pass 0, "),
            std::string::npos)
      << ran.log;
}

// Found by epoch 0's evaluation: both go back to pass 0's save and evaluate epoch 0 again;
// each trainer publishes that evaluation once.
TEST_F(GpuboxJobRecovery, ServerRestartedBeforeAnEvaluationIsRepairedAndEvaluatedAgain) {
  const JobRan ran = job_ends_as_resumed_from_the_save("evaluation", RestartAt::kAtEvaluation);
  EXPECT_NE(ran.log.find("at the start of an evaluation"), std::string::npos) << ran.log;
  EXPECT_EQ(ran.epoch0_evaluations[0], 1);
  EXPECT_EQ(ran.epoch0_evaluations[1], 1);
}

// Trainer 1 does not see the save folder trainer 0 writes (its model_save_path is another,
// empty one): it cannot read the save trainer 0 goes back to, and trainer 0 hears why at the
// meeting (before, it waited at the next collective until trainer 1's end closed it, or for
// runner.collective_timeout_s, and failed with the communicator's error).
TEST_F(GpuboxJobRecovery, ATrainerThatCannotReadTheSaveStopsTheOtherAtOnce) {
  const std::string unshared = (root_ / "unshared").string();
  const JobRan ran = run_job("unshared_save", (root_ / "unshared_save").string(), 2,
                             RestartAt::kBetweenPasses, {}, {"runner.model_save_path=" + unshared});
  for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
  EXPECT_NE(ran.errors[1].find(unshared + "/0"), std::string::npos) << ran.log;
  EXPECT_NE(ran.errors[0].find("trainer 1 failed reading the save "), std::string::npos) << ran.log;
}

TEST_F(GpuboxJobRecovery, ResumeOffStopsBothTrainersNamingIt) {
  refused_recovery_stops_both("resume_off", RestartAt::kBetweenPasses, {"runner.resume=off"},
                              "runner.resume is off");
}

// No save to go back to (a restart before the first pass wrote anything back lost nothing and
// is adopted quietly by the client: the restart comes after pass 0's write-back).
TEST_F(GpuboxJobRecovery, NoSaveYetStopsBothTrainersNamingIt) {
  refused_recovery_stops_both("no_save", RestartAt::kBetweenPasses, {"runner.model_save_path="},
                              "this run made or loaded no save yet");
}

}  // namespace
}  // namespace gpubox::trainer
