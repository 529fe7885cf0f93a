// Issue 32, the gpubox mode: a server of a job of 2 gpubox-mode trainers (threads of this
// process, one simulated card each, meeting through Gloo over loopback) restarted (same port,
// empty) between passes, within a pass (found at its end_pass), before an evaluation or as
// trainer 0 saves is repaired in the run: the trainers meet after every phase that calls the
// servers, hear there whether one of them found a restart, and all go back to the save trainer 0
// chooses together, again when a server restarts during the reload. The oracle (run once): the
// same 2-trainer job resumed from that save by new trainers on fresh servers (as a rerun in new
// processes resumes it). The schedule is deterministic (no shuffle, every reduction in a fixed
// order), so every row's show and click counts end equal: every instance of every pass counted
// once, none of the failed pass's updates left on a server and none of the save lost; the
// held-out AUC is compared within a bound. A recovery trainer 0 refuses (runner.resume off, no
// save yet, the recoveries spent), a trainer that cannot read the save, or one that failed
// otherwise where the other found a restart, stops both trainers at once, naming why. No
// trainer waits out a collective's timeout (its error would say so). Trainer::set_meeting_hook
// places a restart or a failure inside a phase.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "table/sparse_row/accessor.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/schedule/checkpoint.hpp"
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
  kBetweenPasses,       // after pass 0's save, no evaluation: found before pass 1
  kWithinPass,          // at step 20 of pass 1: found at its end_pass
  kWithinPassEachTime,  // at step 20 of every run of pass 1: the job goes back until it gives up
  kAtEvaluation,        // after pass 0's save: found by epoch 0's evaluation
  kAtSave,              // as trainer 0 writes pass 1's save: found by its SAVE
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

// A job of 2 gpubox-mode trainers against 2 fresh servers: `epochs` passes over the training
// files, each saved (checkpoint) under `saves`, resuming the newest save there.
struct Job {
  Job(std::string name_, std::string saves_, int epochs_ = 2, RestartAt at_ = RestartAt::kNever,
      std::vector<std::string> keys_ = {}, std::vector<std::string> trainer1_keys_ = {})
      : name(std::move(name_)),
        saves(std::move(saves_)),
        epochs(epochs_),
        at(at_),
        keys(std::move(keys_)),
        trainer1_keys(std::move(trainer1_keys_)) {}

  std::string name;
  std::string saves;
  int epochs;
  RestartAt at;                            // where server 1 restarts
  std::vector<std::string> keys;           // added to the config
  std::vector<std::string> trainer1_keys;  // then to trainer 1's
  // Runs on trainer 0's thread right before server 1 restarts (once).
  std::function<void()> before_restart;
  // Trainer 0 asks the run to stop (StepHooks::stop_flag) as server 1 restarts; the job is not
  // evaluated after train() then.
  bool stop_at_restart = false;
  // Trainer w's meeting hook (Trainer::set_meeting_hook), given its trainer and the servers.
  std::function<void(int w, Trainer& trainer, Servers& shards, const std::string& where)>
      at_meeting;
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
  void SetUp() override { GPUBOX_REQUIRE_CARDS(2); }  // a card a trainer

  // Trainer w's hooks: trainer 0 restarts server 1 at `at` (`restart`).
  static RunHooks hooks_of(int w, RestartAt at, const std::function<void()>& restart, JobRan* ran) {
    RunHooks hooks;
    hooks.on_epoch = [ran, w](int64_t epoch, const MetricValues&, const MetricValues* test) {
      if (epoch == 0 && test != nullptr) ++ran->epoch0_evaluations[w];
    };
    if (w != 0) return hooks;
    if (at == RestartAt::kBetweenPasses || at == RestartAt::kAtEvaluation) {
      hooks.on_pass = [restart](const PassReport& report) {
        if (report.pass == 0) restart();
      };
    }
    if (at == RestartAt::kWithinPass || at == RestartAt::kWithinPassEachTime) {
      hooks.steps.on_progress = [restart](const StepProgress& progress) {
        if (progress.pass == 1 && progress.step == 20) restart();
      };
    }
    return hooks;
  }

  // Runs `job`; the job's held-out AUC after training.
  static JobRan run_job(const Job& job) {
    std::vector<std::string> all = {
        "runner.train_data_dir=" + (root_ / "train").string(),
        "runner.test_data_dir=" +
            (job.at == RestartAt::kAtEvaluation ? (root_ / "test").string() : std::string()),
        "runner.save_mode=checkpoint",
        "runner.model_save_path=" + job.saves,
        "runner.epochs=" + std::to_string(job.epochs),
        "runner.print_interval=20",
        "runner.server_timeout_s=3",
        "runner.collective_timeout_s=20",
        "hyper_parameters.fc_sizes=[64, 32]"};
    all.insert(all.end(), job.keys.begin(), job.keys.end());
    const TrainerConfig cfg = testing::load_test_config(testing::test_data_overrides(), all);
    all.insert(all.end(), job.trainer1_keys.begin(), job.trainer1_keys.end());
    const TrainerConfig cfg1 = testing::load_test_config(testing::test_data_overrides(), all);
    Servers shards(cfg, 2);
    std::atomic<int> restarts{0};
    std::atomic<bool> stop{false};
    const std::function<void()> restart = [&] {
      if (job.at != RestartAt::kWithinPassEachTime && restarts.load() > 0) return;
      if (job.before_restart && restarts.load() == 0) job.before_restart();
      ++restarts;
      shards.restart(1);
      if (job.stop_at_restart) stop = true;
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
        env.selected_cards = device::testing::trainer_card(w);
        env.rendezvous = "file://" + (root_ / ("rendezvous_" + job.name)).string();
        std::unique_ptr<Trainer> trainer;
        // Caught before the trainer goes: it then tells the other one that it ended.
        try {
          trainer = std::make_unique<Trainer>(w == 0 ? cfg : cfg1, env);
          Trainer* self = trainer.get();
          trainer->set_meeting_hook([&, w, self](const std::string& where) {
            if (w == 0 && job.at == RestartAt::kAtSave &&
                where.rfind("writing the save ", 0) == 0 && where.size() > 2 &&
                where.substr(where.size() - 2) == "/1") {
              restart();
            }
            if (job.at_meeting) job.at_meeting(w, *self, shards, where);
          });
          RunHooks hooks = hooks_of(w, job.at, restart, &ran);
          if (w == 0 && job.stop_at_restart) hooks.steps.stop_flag = &stop;
          for (const PassReport& report : trainer->train("", hooks))
            ran.passes[w].push_back(report.pass);
          if (job.stop_at_restart) return;
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
    EXPECT_EQ(restarts.load() > 0, job.at != RestartAt::kNever);
    // A trainer that missed the others would have waited out runner.collective_timeout_s.
    EXPECT_EQ(ran.log.find("stalled past the"), std::string::npos) << ran.log;
    EXPECT_EQ(ran.log.find("communicator aborted"), std::string::npos) << ran.log;
    return ran;
  }

  // The oracle, run once for the suite's tests that need it: pass 0 saved by a 2-trainer job,
  // then a new 2-trainer job on fresh servers resumes from that save for pass 1.
  static const JobRan& resumed_from_the_save() {
    static const JobRan resumed = [] {
      const std::string saves = (root_ / "oracle").string();
      const JobRan first = run_job({"oracle_first", saves, 1});
      EXPECT_EQ(first.errors[0] + first.errors[1], "") << first.log;
      JobRan ran = run_job({"oracle_resumed", saves, 2});
      EXPECT_EQ(ran.errors[0] + ran.errors[1], "") << ran.log;
      EXPECT_EQ(ran.passes[0], (std::vector<int64_t>{1}));
      return ran;
    }();
    return resumed;
  }

  // The oracle against `job` (its name and saves set here): both trainers went back to trainer
  // 0's save of pass 0 `reloads` times and ended as the oracle.
  static JobRan job_ends_as_resumed_from_the_save(Job job, std::size_t reloads = 1) {
    const JobRan& resumed = resumed_from_the_save();
    job.saves = (root_ / (job.name + "_restarted")).string();
    const JobRan recovered = run_job(job);
    EXPECT_EQ(recovered.errors[0] + recovered.errors[1], "") << recovered.log;
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ(recovered.passes[w], (std::vector<int64_t>{0, 1})) << "trainer " << w;
    }
    // Trainer 0 chose its last save; trainer 1 went back to the same one with it.
    EXPECT_EQ(count(recovered.log, "reloading the last complete save (pass 0, "), reloads)
        << recovered.log;
    EXPECT_EQ(count(recovered.log, "/" + job.name + "_restarted/0 with every trainer of the job"),
              reloads)
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
        job.name.c_str(), recovered.test_auc, resumed.test_auc);
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
    const JobRan ran = run_job({name, (root_ / name).string(), 2, at, keys});
    for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
    EXPECT_NE(ran.errors[0].find("server "), std::string::npos) << ran.log;
    EXPECT_NE(ran.errors[1].find("trainer 0 cannot go back to a save (" + reason + ")"),
              std::string::npos)
        << ran.errors[1];
  }

  inline static fs::path root_;
};

TEST_F(GpuboxJobRecovery, ServerRestartedBetweenPassesIsRepairedByBothTrainers) {
  const JobRan ran =
      job_ends_as_resumed_from_the_save({"between", "", 2, RestartAt::kBetweenPasses});
  EXPECT_NE(ran.log.find("before pass 1: "), std::string::npos) << ran.log;
}

// Found at the pass's end_pass (the steps call no server): the pass's rows on the cards are
// dropped and the pass trained again from the last save.
TEST_F(GpuboxJobRecovery, ServerRestartedWithinAPassIsRepairedAtItsEnd) {
  const JobRan ran = job_ends_as_resumed_from_the_save({"within", "", 2, RestartAt::kWithinPass});
  EXPECT_NE(ran.log.find("at the end of pass 1: "), std::string::npos) << ran.log;
  EXPECT_NE(ran.log.find("The pass's rows on the cards are dropped: reloading the last "
                         "complete save (pass 0, "),
            std::string::npos)
      << ran.log;
}

// Found by epoch 0's evaluation: both go back to pass 0's save and evaluate epoch 0 again;
// each trainer publishes that evaluation once.
TEST_F(GpuboxJobRecovery, ServerRestartedBeforeAnEvaluationIsRepairedAndEvaluatedAgain) {
  const JobRan ran =
      job_ends_as_resumed_from_the_save({"evaluation", "", 2, RestartAt::kAtEvaluation});
  EXPECT_NE(ran.log.find("at the start of an evaluation"), std::string::npos) << ran.log;
  EXPECT_EQ(ran.epoch0_evaluations[0], 1);
  EXPECT_EQ(ran.epoch0_evaluations[1], 1);
}

// Found by trainer 0's SAVE of pass 1 (the save path): pass 1's save is not made, both go back
// to pass 0's and train pass 1 again.
TEST_F(GpuboxJobRecovery, ServerRestartedAsTrainerZeroSavesIsRepaired) {
  const JobRan ran = job_ends_as_resumed_from_the_save({"save", "", 2, RestartAt::kAtSave});
  EXPECT_NE(ran.log.find("writing the save "), std::string::npos) << ran.log;
}

// Server 0 (which holds trainer0_work) restarts as trainer 0 writes pass 1's save, under a
// runner.collective_timeout_s well below runner.server_timeout_s: trainer 0 does not go on
// writing its part's end to the restarted server (which refuses it until the restart is
// accepted, after the part) for runner.server_timeout_s, so it reaches the meeting within
// trainer 1's bound, and the job goes back to pass 0's save (before, trainer 1's meeting timed
// out and the job failed).
TEST_F(GpuboxJobRecovery, FirstServerRestartedAsTrainerZeroSavesIsRepairedWithinTheMeetingsBound) {
  Job job{"save0",
          "",
          2,
          RestartAt::kNever,
          {"runner.server_timeout_s=12", "runner.collective_timeout_s=4"}};
  std::atomic<bool> restarted{false};
  job.at_meeting = [&restarted](int w, Trainer&, Servers& shards, const std::string& where) {
    if (w == 0 && where.rfind("writing the save ", 0) == 0 && where.size() > 2 &&
        where.substr(where.size() - 2) == "/1" && !restarted.exchange(true)) {
      shards.restart(0);
    }
  };
  const JobRan ran = job_ends_as_resumed_from_the_save(job);
  EXPECT_TRUE(restarted.load());
  EXPECT_NE(ran.log.find("writing the save "), std::string::npos) << ran.log;
}

// Server 0 restarts too, as trainer 0 has the servers load the save it goes back to: the load
// finds it, the job agrees on it and goes back again (a second round), then ends as the oracle.
TEST_F(GpuboxJobRecovery, ServerRestartedDuringTheReloadIsRepairedInASecondRound) {
  Job job{"reload", "", 2, RestartAt::kWithinPass};
  std::atomic<bool> again{false};
  job.at_meeting = [&again](int w, Trainer&, Servers& shards, const std::string& where) {
    if (w == 0 && where.rfind("loading the sparse half of ", 0) == 0 && !again.exchange(true)) {
      shards.restart(0);
    }
  };
  const JobRan ran = job_ends_as_resumed_from_the_save(job, 2);
  EXPECT_TRUE(again.load());
  EXPECT_NE(ran.log.find("loading the sparse half of "), std::string::npos) << ran.log;
}

// Trainer 1's phase throws something that is not an Error (std::bad_alloc) at the meeting where
// the job agrees on a restart: it goes back with trainer 0 all the same (before, the bad_alloc
// left its epoch loop, which catches Error, and trainer 0 waited for it to choose the save).
TEST_F(GpuboxJobRecovery, AnyExceptionAtAnAgreedRestartGoesBackWithTheOthers) {
  Job job{"bad_alloc", "", 2, RestartAt::kWithinPass};
  std::atomic<bool> thrown{false};
  job.at_meeting = [&thrown](int w, Trainer&, Servers&, const std::string& where) {
    if (w == 1 && where == "at the end of pass 1" && !thrown.exchange(true)) throw std::bad_alloc();
  };
  const JobRan ran = job_ends_as_resumed_from_the_save(job);
  EXPECT_NE(ran.log.find("at the end of pass 1: std::bad_alloc"), std::string::npos) << ran.log;
}

// Trainer 1 fails otherwise (it adopted the restart first, so that it sees none) where trainer 0
// finds the restart: no trainer goes back, both stop, trainer 0 naming trainer 1's failure and
// the restart it found.
TEST_F(GpuboxJobRecovery, AnotherTrainerFailingOtherwiseStopsTheJobOverARestart) {
  Job job{"failing", (root_ / "failing").string(), 2, RestartAt::kWithinPass};
  job.at_meeting = [](int w, Trainer& trainer, Servers&, const std::string& where) {
    if (w != 1 || where != "at the end of pass 1") return;
    SaveLineage::find_restarts(trainer.host_tier(), 1.0);
    SaveLineage::accept_restarts(trainer.host_tier());
    GPUBOX_FAIL("trainer 1's own failure");
  };
  const JobRan ran = run_job(job);
  for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
  EXPECT_NE(ran.errors[1].find("trainer 1's own failure"), std::string::npos) << ran.log;
  EXPECT_NE(ran.errors[0].find("trainer 1 failed at the end of pass 1 (its log, "),
            std::string::npos)
      << ran.log;
  EXPECT_NE(ran.errors[0].find("; this trainer found a server restart there: server "),
            std::string::npos)
      << ran.log;
  EXPECT_EQ(ran.log.find("going back to the last save"), std::string::npos) << ran.log;
}

// Trainer 1's card faults at the end of pass 1, where trainer 0's write-back finds the server
// restart (trainer 1 finds it too, asking every server after its failure): the fault names no
// restarted server, so it stays beside the restart in trainer 1's AgreedRestart
// (throw_agreed_restart), the job goes back and ends as the oracle. With runner.resume off,
// trainer 0 refuses, and trainer 1's error names the fault after the restarts and before why the
// job stops (agree_on_save), once.
TEST_F(GpuboxJobRecovery, ADeviceFaultBesideAnAgreedRestartIsLoggedOrNamedWithTheRefusal) {
  constexpr const char* kFault = "card 0: an injected device fault";
  const auto fault_on_trainer_1 = [kFault](std::atomic<bool>* thrown) {
    return [kFault, thrown](int w, Trainer&, Servers&, const std::string& where) {
      if (w == 1 && where == "at the end of pass 1" && !thrown->exchange(true)) GPUBOX_FAIL(kFault);
    };
  };
  std::atomic<bool> thrown{false};
  Job job{"device_fault", "", 2, RestartAt::kWithinPass};
  job.at_meeting = fault_on_trainer_1(&thrown);
  const JobRan recovered = job_ends_as_resumed_from_the_save(job);
  EXPECT_TRUE(thrown.load());
  EXPECT_NE(recovered.log.find(std::string("at the end of pass 1: server ")), std::string::npos)
      << recovered.log;
  EXPECT_NE(recovered.log.find(std::string("; this trainer also failed there: ") + kFault +
                               "; going back to the last save with every trainer of the job"),
            std::string::npos)
      << recovered.log;

  std::atomic<bool> thrown_again{false};
  Job refused{"device_fault_refused",
              (root_ / "device_fault_refused").string(),
              2,
              RestartAt::kWithinPass,
              {"runner.resume=off"}};
  refused.at_meeting = fault_on_trainer_1(&thrown_again);
  const JobRan ran = run_job(refused);
  for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
  const std::string& error = ran.errors[1];
  const auto fault =
      error.find(std::string("; this trainer also failed at the end of pass 1: ") + kFault +
                 "; trainer 0 cannot go back to a save (runner.resume is "
                 "off), so the job stops; ");
  EXPECT_EQ(error.rfind("pass 1: server ", 0), 0u) << error;
  EXPECT_NE(fault, std::string::npos) << error;
  EXPECT_EQ(count(error, kFault), 1u) << error;
  EXPECT_EQ(ran.errors[0].find(kFault), std::string::npos) << ran.errors[0];
}

// The run is asked to stop within pass 1 as server 1 restarts: the stopped pass's write-back
// finds the restart, and both trainers end stopped as asked, pass 0 trained and saved (before,
// that write-back met no other trainer: each ended with the restart's error).
TEST_F(GpuboxJobRecovery, ARestartFoundAsThePassStopsEndsBothStopped) {
  Job job{"stopped", (root_ / "stopped").string(), 2, RestartAt::kWithinPass};
  job.stop_at_restart = true;
  const JobRan ran = run_job(job);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(ran.errors[w], "") << "trainer " << w << ": " << ran.log;
    EXPECT_EQ(ran.passes[w], (std::vector<int64_t>{0})) << "trainer " << w;
  }
  EXPECT_EQ(count(ran.log, "at the end of pass 1 (stopped): server "), 2u) << ran.log;
  EXPECT_EQ(count(ran.log, "; the run stops as asked"), 2u) << ran.log;
}

// The same stop, and trainer 1's card faults in the stopped pass's write-back, where the restart
// is found (trainer 1 finds it too, asking every server after its failure): not what was asked,
// so every trainer's run ends with an error, trainer 1's naming its fault, trainer 0's naming
// trainer 1 (before, only trainer 1 failed; trainer 0 ended stopped as asked, exit status 0).
TEST_F(GpuboxJobRecovery, ADeviceFaultAsThePassStopsEndsEveryTrainerWithAnError) {
  constexpr const char* kFault = "card 0: an injected device fault";
  std::atomic<bool> thrown{false};
  Job job{"stopped_fault", (root_ / "stopped_fault").string(), 2, RestartAt::kWithinPass};
  job.stop_at_restart = true;
  job.at_meeting = [&thrown, kFault](int w, Trainer&, Servers&, const std::string& where) {
    if (w == 1 && where == "at the end of pass 1 (stopped)" && !thrown.exchange(true)) {
      GPUBOX_FAIL(kFault);
    }
  };
  const JobRan ran = run_job(job);
  for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
  EXPECT_TRUE(thrown.load());
  EXPECT_NE(ran.errors[1].find(std::string("; this trainer also failed there: ") + kFault +
                               "; rerun to resume from the last save"),
            std::string::npos)
      << ran.log;
  EXPECT_EQ(ran.errors[1].rfind("at the end of pass 1 (stopped): server ", 0), 0u) << ran.errors[1];
  EXPECT_EQ(ran.errors[0].rfind("at the end of pass 1 (stopped): server ", 0), 0u) << ran.log;
  EXPECT_NE(ran.errors[0].find("; trainer 1 also failed there (its log, log/worker.1.log under "
                               "scripts/run_gpubox.sh, names why); rerun to resume from the last "
                               "save"),
            std::string::npos)
      << ran.errors[0];
  EXPECT_EQ(ran.log.find("the run stops as asked"), std::string::npos) << ran.log;
  EXPECT_EQ(ran.log.find("going back to the last save"), std::string::npos) << ran.log;
}

// Trainer 1 does not see the save folder trainer 0 writes (its model_save_path is another,
// empty one): it cannot read the save trainer 0 goes back to, and trainer 0 hears why at the
// meeting (before, it waited at the next collective until trainer 1's end closed it, or for
// runner.collective_timeout_s, and failed with the communicator's error).
TEST_F(GpuboxJobRecovery, ATrainerThatCannotReadTheSaveStopsTheOtherAtOnce) {
  const std::string unshared = (root_ / "unshared").string();
  const JobRan ran = run_job({"unshared_save",
                              (root_ / "unshared_save").string(),
                              2,
                              RestartAt::kBetweenPasses,
                              {},
                              {"runner.model_save_path=" + unshared}});
  for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
  EXPECT_NE(ran.errors[1].find(unshared + "/0"), std::string::npos) << ran.log;
  EXPECT_NE(ran.errors[0].find("trainer 1 failed reading the save "), std::string::npos) << ran.log;
}

// Trainer 1's copy of the save is whole but for its dense half, whose data is corrupt (a flipped
// byte: its size still matches the manifest): it fails reading it, in the same meeting, and
// both stop at once (before, it read the dense half after the job's last meeting of the load,
// and trainer 0 waited for it at the next pass's).
TEST_F(GpuboxJobRecovery, ATrainerThatCannotReadTheDenseHalfStopsTheOtherAtOnce) {
  const fs::path saves = root_ / "dense_save";
  const fs::path copy = root_ / "dense_copy";
  Job job{"dense_save", saves.string(), 2, RestartAt::kBetweenPasses};
  job.trainer1_keys = {"runner.model_save_path=" + copy.string()};
  job.before_restart = [&] {
    fs::create_directories(copy);
    fs::copy(saves / "0", copy / "0", fs::copy_options::recursive);
    for (const auto& entry : fs::directory_iterator(copy / "0" / "dense")) {
      if (entry.path().filename() == "MANIFEST") continue;
      std::fstream data(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
      data.seekg(8);
      const char byte = static_cast<char>(data.get() ^ 0x5a);
      data.seekp(8);
      data.put(byte);
    }
  };
  const JobRan ran = run_job(job);
  for (int w = 0; w < 2; ++w) std::printf("trainer %d: %s\n", w, ran.errors[w].c_str());
  EXPECT_NE(ran.errors[1].find("loading the dense parameters from " + (copy / "0").string()),
            std::string::npos)
      << ran.log;
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

// Server 1 restarts within every run of pass 1: the job goes back three times, then trainer 0
// gives up and both stop.
TEST_F(GpuboxJobRecovery, RestartsPastTheRunsRecoveriesStopBothTrainersNamingIt) {
  refused_recovery_stops_both("spent", RestartAt::kWithinPassEachTime, {},
                              "the servers restarted too often in this run");
}

}  // namespace
}  // namespace gpubox::trainer
