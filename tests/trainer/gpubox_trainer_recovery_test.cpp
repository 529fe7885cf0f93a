// Issue 32, the gpubox mode with one trainer (2 simulated cards, 3 passes: one folder of
// runner.pass_dirs each) against 2 in-process gpubox_server shards on loopback: server 1
// restarted (same port, empty) within pass 1 is repaired in the run, as a job of several
// trainers repairs it (gpubox_job_recovery_test): found in the pass's pulls (its begin_pass) or
// in its write-back at the pass's end, the pass is dropped from the cards, pass 0's save reloaded
// into the servers and pass 1 trained again. The oracle (run once): the same trainer stopped after
// pass 0's save, then a new trainer on fresh servers resuming from that save (as a rerun in a new
// process resumes it). The schedule is deterministic (no shuffle, every reduction in a fixed
// order), so every row's show and click counts end equal (every instance of every pass counted
// once, none of the dropped pass's updates left on a server, none of the save lost) and so does
// the held-out AUC. A recovery refused (runner.resume off, no save yet, the recoveries spent)
// stops the trainer naming the server, the pass and why; a restart found in the write-back of a
// pass stopped as asked ends the run stopped. A device fault in the phase that finds the restart
// is named beside it in the error the user sees (a stopped pass then ends with that error).
// Trainer::set_meeting_hook places the restarts (and the faults) in a phase (the stopped pass's: a
// step hook).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/device/card.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using ps_modes::Servers;

constexpr int kPasses = 3;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Ran {
  std::vector<int64_t> passes;  // what train() returned
  std::string error;            // "" when it ended well
  std::string log;
  std::size_t restarts = 0;
  bool left_in_pass = false;  // the card tier in a pass once train() returned or threw
  double test_auc = 0;        // after training
  std::map<uint64_t, std::pair<float, float>> counts;  // every row's show and click, at the end
};

// A server restarted at the start of the phase named `at` (a Trainer::set_meeting_hook `where`,
// "<saves>" standing for TrainerRun::saves).
struct RestartAt {
  std::string at;
  int server = 1;  // -1: none (the fault alone)
  // The phase also fails on this trainer as the server restarts: the hook throws kDeviceFault
  // there (as a card's fault in the phase would throw), before the phase runs.
  bool device_fault = false;
  // The phase also fails on several cards as the server restarts (one message a card, "" for
  // one that did not fail; "<server>" stands for the restarted server, "<told>" first marks it
  // told: CardsFailed::Failure::told): the hook throws what CardSet::run_on_cards throws then.
  std::vector<std::string> card_faults = {};
  // The restart is found at once (every server asked who it is), as a call of this trainer's
  // under way finds it, and the phase fails (device_fault) only when it is found: a server
  // restarted again before anything was sent to its accepted instance is adopted quietly.
  bool found_at_once = false;
};

constexpr const char* kDeviceFault = "card 0: an injected device fault";

// What CardSet::run_on_cards throws when the cards of `faults` failed with them (RestartAt::
// card_faults; the first that failed first), "<server>" standing for `server`.
device::CardsFailed cards_failed(const std::vector<std::string>& faults,
                                 const std::string& server) {
  std::vector<device::CardsFailed::Failure> failures;
  for (std::size_t c = 0; c < faults.size(); ++c) {
    if (faults[c].empty()) continue;
    std::string message = faults[c];
    const bool told = message.rfind("<told>", 0) == 0;  // an abort for another card's failure
    if (told) message.erase(0, 6);
    const auto at = message.find("<server>");
    if (at != std::string::npos) message.replace(at, 8, server);
    failures.push_back({static_cast<int>(c), message, told});
  }
  const Error first("card " + std::to_string(failures.at(0).rank) + ": " + failures[0].message);
  return device::CardsFailed(first, failures);
}

// Server `i`'s "ip:port" in `shards`.
std::string endpoint_of(const ps_modes::Servers& shards, int i) {
  std::string rest = shards.endpoints();
  for (int skip = 0; skip < i; ++skip) rest = rest.substr(rest.find(',') + 1);
  return rest.substr(0, rest.find(','));
}

// One gpubox-mode trainer against 2 fresh servers, saving each pass (checkpoint) under `saves`
// and resuming the newest save there. A server restarts at each of `restart_at` (none: never),
// the first time it comes, or every time with `each_time`.
struct TrainerRun {
  std::string saves = {};
  std::vector<RestartAt> restart_at = {};
  std::vector<std::string> keys = {};  // added to the config
  bool each_time = false;
  int64_t stop_after_pass = -1;  // the run asked to stop once this pass is saved (-1: never)
  bool stop_at_restart = false;  // restarted at step 5 of pass 1, the stop flag set there too
};

class GpuboxTrainerRecovery : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_trainer_recovery_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::OracleSummary oracle;
    gpubox::testing::write_planted_train_test(root_, &oracle);
    // One training file a pass (the planted data's files share most keys, each adds a few).
    const std::vector<std::string> files = data_files((root_ / "train").string());
    ASSERT_GE(files.size(), std::size_t{kPasses});
    pass_dirs_.clear();  // set up again under --gtest_repeat
    for (int p = 0; p < kPasses; ++p) {
      const fs::path day = root_ / ("day" + std::to_string(p));
      fs::create_directories(day);
      const fs::path file = files[static_cast<std::size_t>(p)];
      fs::copy_file(file, day / file.filename());
      pass_dirs_ += (p ? ", " : "") + day.string();
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static TrainerConfig config_of(const TrainerRun& run) {
    std::vector<std::string> keys = {"runner.pass_dirs=[" + pass_dirs_ + "]",
                                     "runner.save_mode=checkpoint",
                                     "runner.model_save_path=" + run.saves,
                                     "runner.print_interval=5",
                                     "runner.server_timeout_s=3",
                                     "hyper_parameters.fc_sizes=[64, 32]"};
    keys.insert(keys.end(), run.keys.begin(), run.keys.end());
    return testing::load_test_config(testing::test_data_overrides(), keys);
  }

  // The hooks of `run`: its stops, and a restart (`restart`) at step 5 of pass 1.
  static RunHooks hooks_of(const TrainerRun& run, const std::function<void()>& restart,
                           std::atomic<bool>* stop) {
    RunHooks hooks;
    if (run.stop_after_pass >= 0) {
      hooks.on_pass = [stop, last = run.stop_after_pass](const PassReport& report) {
        if (report.pass == last) *stop = true;
      };
      hooks.stop_requested = [stop] { return stop->load(); };
    }
    if (run.stop_at_restart) {
      hooks.steps.stop_flag = stop;
      hooks.steps.on_progress = [restart, stop](const StepProgress& progress) {
        if (progress.pass != 1 || progress.step != 5) return;
        restart();
        *stop = true;
      };
    }
    return hooks;
  }

  // One trainer of 2 simulated cards against `shards`.
  static TrainerEnv env_of(const Servers& shards) {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.selected_cards = device::testing::card_list(device::testing::cards_here(2));
    env.threads_per_card = 1;
    return env;
  }

  static Ran run_trainer(const TrainerRun& run) {
    const TrainerConfig cfg = config_of(run);
    Servers shards(cfg, 2);
    Ran ran;
    std::vector<RestartAt> restart_at = run.restart_at;
    for (RestartAt& point : restart_at) {
      const auto saves = point.at.find("<saves>");
      if (saves != std::string::npos) point.at.replace(saves, 7, run.saves);
    }
    restart_at.push_back({});  // the step hook's (stop_at_restart), at no phase
    std::vector<bool> restarted(restart_at.size(), false);
    std::unique_ptr<Trainer> trainer;
    const auto restart_once = [&](std::size_t which) {
      if (restarted[which] && !run.each_time) return;
      restarted[which] = true;
      const RestartAt& point = restart_at[which];
      if (point.server >= 0) {
        ++ran.restarts;
        shards.restart(point.server);
      }
      bool found = true;
      if (point.found_at_once) {
        SaveLineage::find_restarts(trainer->host_tier(), 3.0);
        found = !SaveLineage::describe_restarts(trainer->host_tier()).empty();
      }
      if (point.device_fault && found) throw Error(kDeviceFault);
      if (!point.card_faults.empty()) {
        throw cards_failed(point.card_faults, endpoint_of(shards, std::max(point.server, 0)));
      }
    };
    const std::function<void()> restart = [&] { restart_once(restart_at.size() - 1); };
    std::atomic<bool> stop{false};
    const TrainerEnv env = env_of(shards);
    ::testing::internal::CaptureStderr();
    try {
      trainer = std::make_unique<Trainer>(cfg, env);
      trainer->set_meeting_hook([&](const std::string& where) {
        for (std::size_t i = 0; i + 1 < restart_at.size(); ++i) {
          if (where == restart_at[i].at) restart_once(i);
        }
      });
      for (const PassReport& report : trainer->train("", hooks_of(run, restart, &stop))) {
        ran.passes.push_back(report.pass);
      }
      ran.left_in_pass = trainer->card_tier().in_pass();
      if (run.stop_after_pass < 0 && !run.stop_at_restart) {
        ran.test_auc = trainer->evaluate(data_files((root_ / "test").string()), false).metrics.auc;
      }
    } catch (const std::exception& e) {
      ran.error = e.what();
      ran.left_in_pass = trainer != nullptr && trainer->card_tier().in_pass();
    }
    trainer.reset();
    ran.log = ::testing::internal::GetCapturedStderr();
    for (int i = 0; i < 2; ++i) {
      throw_if_error(shards.table(i).for_each_row([&](uint64_t key, const float* row) {
        ran.counts[key] = {row[table::RowLayout::kShow], row[table::RowLayout::kClick]};
      }));
    }
    return ran;
  }

  // The oracle: pass 0 trained and saved by one trainer, stopped there; then a new trainer on
  // fresh servers resumes from that save for passes 1 and 2.
  static const Ran& resumed_from_the_save() {
    static const Ran resumed = [] {
      const std::string saves = (root_ / "oracle").string();
      TrainerRun first{saves};
      first.stop_after_pass = 0;
      const Ran stopped = run_trainer(first);
      EXPECT_EQ(stopped.error, "") << stopped.log;
      EXPECT_EQ(stopped.passes, (std::vector<int64_t>{0}));
      Ran ran = run_trainer({saves});
      EXPECT_EQ(ran.error, "") << ran.log;
      EXPECT_EQ(ran.passes, (std::vector<int64_t>{1, 2}));
      return ran;
    }();
    return resumed;
  }

  // `run` (its saves set here, with a metrics file) went back to its save of pass 0 (reloaded
  // `reloads` times, once a server restart) and ended as the oracle, each pass recorded once.
  static Ran ends_as_resumed_from_the_save(const std::string& name, TrainerRun run,
                                           std::size_t reloads = 1) {
    const Ran& resumed = resumed_from_the_save();
    run.saves = (root_ / name).string();
    const std::string metrics = (root_ / (name + ".jsonl")).string();
    run.keys.push_back("runner.metrics_path=" + metrics);
    const Ran recovered = run_trainer(run);
    EXPECT_EQ(recovered.error, "") << recovered.log;
    EXPECT_EQ(recovered.restarts, reloads);
    EXPECT_EQ(recovered.passes, (std::vector<int64_t>{0, 1, 2})) << recovered.log;
    EXPECT_EQ(count(recovered.log, "reloading the last complete save (pass 0, " + run.saves),
              reloads)
        << recovered.log;
    EXPECT_FALSE(recovered.left_in_pass);
    std::ifstream in(metrics);
    std::string lines((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int p = 0; p < kPasses; ++p) {
      EXPECT_EQ(count(lines, "{\"pass\": " + std::to_string(p) + ","), 1u) << lines;
    }
    std::printf(
        "gpubox, 1 trainer, server 1 restarted (%s): test auc %.9f, resumed from the "
        "save %.9f\n",
        name.c_str(), recovered.test_auc, resumed.test_auc);
    EXPECT_FALSE(resumed.counts.empty());
    EXPECT_EQ(recovered.counts.size(), resumed.counts.size());
    EXPECT_TRUE(recovered.counts == resumed.counts) << "the rows' show and click counts differ";
    EXPECT_EQ(recovered.test_auc, resumed.test_auc);
    return recovered;
  }

  // A run whose server 1 restarts at the end of pass 1 (`each_time`: of every run of it) with
  // `keys` stops naming the restarted server, the pass, and `why`.
  static Ran refused_recovery_stops(const std::string& name, const std::vector<std::string>& keys,
                                    const std::string& why, bool each_time = false) {
    TrainerRun run{(root_ / name).string(), {{"at the end of pass 1"}}, keys, each_time};
    const Ran ran = run_trainer(run);
    std::printf("%s: %s\n", name.c_str(), ran.error.c_str());
    EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
    EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
    EXPECT_NE(ran.error.find(why), std::string::npos) << ran.error;
    // The pass found open is dropped before the recovery is refused, not left open.
    EXPECT_FALSE(ran.left_in_pass);
    return ran;
  }

  inline static fs::path root_;
  inline static std::string pass_dirs_;
};

// Found by begin_pass's pulls (no rows staged ahead: each is pulled then): the pass had not
// begun, its rows pulled so far are dropped with the cards' contents.
TEST_F(GpuboxTrainerRecovery, ARestartFoundInAPassesPullsIsRepaired) {
  const Ran ran = ends_as_resumed_from_the_save(
      "pulls", {"", {{"at the start of pass 1"}}, {"runner.prefetch_passes=0"}});
  EXPECT_NE(ran.log.find("at the start of pass 1: "), std::string::npos) << ran.log;
  EXPECT_NE(ran.log.find("No pass was open: reloading the last complete save (pass 0, "),
            std::string::npos)
      << ran.log;
}

// Found by the write-back at the pass's end (the steps call no server): the pass trained on the
// cards is dropped, none of its rows written back, and pass 2, read and staged ahead while pass
// 1 trained, is read and staged again after the reload.
TEST_F(GpuboxTrainerRecovery, ARestartFoundInAPassesWriteBackIsRepaired) {
  const Ran ran = ends_as_resumed_from_the_save("write_back", {"", {{"at the end of pass 1"}}});
  EXPECT_NE(ran.log.find("at the end of pass 1: "), std::string::npos) << ran.log;
  EXPECT_NE(ran.log.find("The pass's rows on the cards are dropped: reloading the last "
                         "complete save (pass 0, "),
            std::string::npos)
      << ran.log;
}

// The run is asked to stop within pass 1 as server 1 restarts: the stopped pass's write-back
// finds the restart and the run ends stopped as asked, pass 0 trained and saved (before, it
// ended with the restart's error).
TEST_F(GpuboxTrainerRecovery, ARestartFoundAsThePassStopsEndsStopped) {
  TrainerRun run{(root_ / "stopped").string()};
  run.stop_at_restart = true;
  const Ran ran = run_trainer(run);
  EXPECT_EQ(ran.error, "") << ran.log;
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.passes, (std::vector<int64_t>{0}));
  EXPECT_EQ(count(ran.log, "at the end of pass 1 (stopped): "), 1u) << ran.log;
  EXPECT_EQ(count(ran.log, "; rerun to resume from the last save; the run stops as asked"), 1u)
      << ran.log;
  EXPECT_EQ(ran.log.find("reloading the last complete save"), std::string::npos) << ran.log;
  EXPECT_FALSE(ran.left_in_pass);  // the stopped pass is dropped, not left open
}

// The same stop, and a device fault in the stopped pass's write-back where the restart is found:
// the fault is not what was asked, so the run ends with it beside the restart (before, it was
// logged and the run reported stopped as asked), going back to no save, the pass dropped.
TEST_F(GpuboxTrainerRecovery, ADeviceFaultBesideARestartAsThePassStopsEndsWithBoth) {
  TrainerRun run{(root_ / "stopped_fault").string(),
                 {{"at the end of pass 1 (stopped)", /*server=*/-1, /*device_fault=*/true}}};
  run.stop_at_restart = true;
  const Ran ran = run_trainer(run);
  std::printf("stopped with a device fault: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.error.rfind("at the end of pass 1 (stopped): server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed there: ") + kDeviceFault +
                           "; rerun to resume from the last save"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, "at the end of pass 1 (stopped)"), 1u) << ran.error;
  EXPECT_EQ(ran.log.find("the run stops as asked"), std::string::npos) << ran.log;
  EXPECT_EQ(ran.log.find("reloading the last complete save"), std::string::npos) << ran.log;
  EXPECT_FALSE(ran.left_in_pass);
}

// Server 1 restarts at the end of pass 1, then server 0 as the save of pass 0 is read for the
// reload (found by the reload's LOAD; server 1 restarted again there would be adopted quietly:
// empty as the instance accepted, which nothing was sent to since): the save is reloaded again,
// no pass open then, and the run ends as the oracle.
TEST_F(GpuboxTrainerRecovery, ARestartDuringTheReloadReloadsAgain) {
  const Ran ran = ends_as_resumed_from_the_save(
      "reload", {"", {{"at the end of pass 1"}, {"reading the save <saves>/0", 0}}},
      /*reloads=*/2);
  EXPECT_EQ(count(ran.log, "The pass's rows on the cards are dropped: reloading "), 1u) << ran.log;
  EXPECT_EQ(count(ran.log, "No pass was open: reloading "), 1u) << ran.log;
  // The reload's own error is logged as it is (whatever else failed in it would be lost).
  EXPECT_EQ(count(ran.log, "pass 1, reloading "), 1u) << ran.log;
}

// Found by the evaluation at epoch 0's end (runner.epochs 2), after pass 2's save, while pass 3
// (epoch 1's first) was read and staged ahead as pass 2 trained: the reload of pass 2's save
// lands right before pass 3, the one recovery after which the pipeline still holds the very
// pass the run trains next (any other goes back before a pass read ahead, and take() reads
// that pass again itself). drop_card_work drops it with the cards' work: pass 3 is read and
// staged again from the servers as the save left them, and the run ends as one resumed from
// that save. (The rows staged before the restart equal the save's: the staging excluded every
// key trained before pass 3, and each save waits for the staging under way.)
TEST_F(GpuboxTrainerRecovery, ARestartFoundAtAnEpochsEndDropsTheNextPassStagedBeforeIt) {
  // One pass read ahead: the log's count of passes taken as read ahead depends on it.
  const std::vector<std::string> keys = {"runner.epochs=2", "runner.prefetch_passes=1",
                                         "runner.test_data_dir=" + (root_ / "test").string()};
  TrainerRun first{(root_ / "epoch_end_oracle").string(), {}, keys};
  first.stop_after_pass = 2;
  const Ran stopped = run_trainer(first);
  ASSERT_EQ(stopped.error, "") << stopped.log;
  ASSERT_EQ(stopped.passes, (std::vector<int64_t>{0, 1, 2}));
  const Ran resumed = run_trainer({first.saves, {}, keys});
  ASSERT_EQ(resumed.error, "") << resumed.log;
  ASSERT_EQ(resumed.passes, (std::vector<int64_t>{3, 4, 5}));
  const Ran recovered =
      run_trainer({(root_ / "epoch_end").string(), {{"at the start of an evaluation"}}, keys});
  EXPECT_EQ(recovered.error, "") << recovered.log;
  EXPECT_EQ(recovered.restarts, 1u);
  EXPECT_EQ(recovered.passes, (std::vector<int64_t>{0, 1, 2, 3, 4, 5})) << recovered.log;
  EXPECT_EQ(count(recovered.log, "No pass was open: reloading the last complete save (pass 2, "),
            1u)
      << recovered.log;
  // Passes 1 and 2 were taken as read ahead; pass 3, read ahead too, never is (the run after
  // the reload reads it in place), and passes 4 and 5 are read ahead again.
  EXPECT_EQ(count(recovered.log, " was read ahead ("), 4u) << recovered.log;
  EXPECT_EQ(count(recovered.log, "pass 3 was read ahead ("), 0u) << recovered.log;
  EXPECT_FALSE(resumed.counts.empty());
  EXPECT_TRUE(recovered.counts == resumed.counts) << "the rows' show and click counts differ";
  EXPECT_EQ(recovered.test_auc, resumed.test_auc);
}

// A direct call that does not recover (an evaluation after train(), as gpubox_train --mode infer
// or Python's evaluate make it) fails naming its phase, the restart and what a rerun does.
TEST_F(GpuboxTrainerRecovery, ARestartFoundByADirectEvaluationNamesThePhaseAndTheRerun) {
  TrainerRun run{(root_ / "evaluation").string(), {{"at the start of an evaluation"}}};
  const Ran ran = run_trainer(run);
  std::printf("evaluation: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.passes, (std::vector<int64_t>{0, 1, 2})) << ran.log;
  EXPECT_EQ(ran.error.rfind("at the start of an evaluation: ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find("; rerun to resume from the last save"), std::string::npos) << ran.error;
}

// Reading a save's files calls no server: a save to load that is not there fails as it is,
// without asking every server who it is first. Server 1, restarted (empty) after a pass wrote
// rows to it, is not found there (a later call to it finds it).
TEST_F(GpuboxTrainerRecovery, AMissingSaveToLoadAsksNoServer) {
  const TrainerConfig cfg = config_of({(root_ / "missing").string()});
  Servers shards(cfg, 2);
  Trainer trainer(cfg, env_of(shards));
  trainer.train_pass(data_files((root_ / "day0").string()));  // rows written to every server
  shards.restart(1);
  const std::string missing = (root_ / "no_such_save").string();
  try {
    trainer.load(missing);
    ADD_FAILURE() << "loaded " << missing;
  } catch (const AgreedRestart& e) {
    ADD_FAILURE() << "a restart: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(missing), std::string::npos) << e.message();
  }
  EXPECT_EQ(SaveLineage::describe_restarts(trainer.host_tier()), "");
}

// A device fault in the phase where the restart is found (the restart's error no longer
// replaces it, logged at WARNING only): the user sees both, the server first. A direct call
// that does not recover fails naming the restarted server, the fault and what a rerun does.
TEST_F(GpuboxTrainerRecovery, ADeviceFaultBesideARestartFoundByADirectEvaluationIsNamedWithIt) {
  TrainerRun run{(root_ / "evaluation_fault").string(),
                 {{"at the start of an evaluation", 1, /*device_fault=*/true}}};
  const Ran ran = run_trainer(run);
  std::printf("evaluation with a device fault: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.error.rfind("at the start of an evaluation: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed there: ") + kDeviceFault +
                           "; rerun to resume from the last save"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, "at the start of an evaluation"), 1u) << ran.error;
}

// The same fault beside a restart found at the end of pass 1: the recovery goes back (the fault
// logged) and ends as the oracle; refused (runner.resume off), its error names the restarted
// server, why it stops, and the fault.
TEST_F(GpuboxTrainerRecovery, ADeviceFaultBesideARestartIsRepairedOrNamedWithTheRefusal) {
  const Ran recovered = ends_as_resumed_from_the_save(
      "write_back_fault", {"", {{"at the end of pass 1", 1, /*device_fault=*/true}}});
  EXPECT_NE(recovered.log.find(std::string("this trainer also failed there: ") + kDeviceFault),
            std::string::npos)
      << recovered.log;
  TrainerRun refused{(root_ / "resume_off_fault").string(),
                     {{"at the end of pass 1", 1, /*device_fault=*/true}},
                     {"runner.resume=off"}};
  const Ran ran = run_trainer(refused);
  std::printf("refused with a device fault: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  // The fault after the restart, before why the trainer stops and what a rerun does; once.
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed at the end of pass 1: ") +
                           kDeviceFault + "; the trainer stops: runner.resume is off"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, kDeviceFault), 1u) << ran.error;
  EXPECT_FALSE(ran.left_in_pass);
}

TEST_F(GpuboxTrainerRecovery, ResumeOffStopsNamingIt) {
  refused_recovery_stops("resume_off", {"runner.resume=off"},
                         "; the trainer stops: runner.resume is off: running the command again "
                         "starts from scratch");
}

TEST_F(GpuboxTrainerRecovery, NoSaveYetStopsNamingIt) {
  refused_recovery_stops("no_save", {"runner.model_save_path="},
                         "; the trainer stops: no save was made or loaded yet: running the "
                         "command again starts from scratch");
}

// Faults on several cards beside a restart found at the end of pass 1, card 0's the restart's
// own (its call names the restarted server): refused (runner.resume off), the error names every
// other card's fault, each distinct one once with its cards, one that follows another card's
// left out, the first four then how many cards more (before, the first card's error alone was
// seen: the restart's, and no fault beside it).
TEST_F(GpuboxTrainerRecovery, FaultsOnSeveralCardsBesideARestartAreEachNamedOnce) {
  RestartAt faults{"at the end of pass 1"};
  faults.card_faults = {"writing rows back to <server>: the connection was cut",
                        "fault A",
                        "",
                        "fault B",
                        "fault A",
                        "<told>communicator aborted (rank 5 in all_to_all): card 1: fault A",
                        "fault C",
                        "fault D",
                        "fault E"};
  const Ran ran = run_trainer({(root_ / "cards_faults").string(), {faults}, {"runner.resume=off"}});
  std::printf("refused with faults on several cards: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find("; this trainer also failed at the end of pass 1: cards 1, 4: fault A; "
                           "card 3: fault B; card 6: fault C; card 7: fault D; and 1 more card; "
                           "the trainer stops: runner.resume is off"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, "fault A"), 1u) << ran.error;
  EXPECT_EQ(ran.error.find("the connection was cut"), std::string::npos) << ran.error;
  EXPECT_FALSE(ran.left_in_pass);
}

// A fleet restart found in part: server 1's is known (every server asked) when server 0 restarts
// and cuts the phase's call to it. The failure names a restart once every server is asked again
// (before, it was classified with server 1's alone and named 'also failed').
TEST_F(GpuboxTrainerRecovery, ACallCutOffByAServerOfAFleetRestartIsNotAlsoFailed) {
  RestartAt first{"at the end of pass 1"};
  first.found_at_once = true;
  RestartAt second{"at the end of pass 1", /*server=*/0};
  second.card_faults = {"writing rows back to <server>: the connection was cut"};
  const Ran ran =
      run_trainer({(root_ / "fleet_cut").string(), {first, second}, {"runner.resume=off"}});
  EXPECT_NE(ran.error.find("runner.resume is off"), std::string::npos) << ran.error;
  EXPECT_EQ(ran.error.find("also failed"), std::string::npos) << ran.error;
}

// Server 1 restarts at the end of every run of pass 1, server 0 at every read of the save of
// pass 0 for the reload, found at once with a device fault beside it: the first reload fails and
// the second goes through (server 0 restarted again before anything reached it is adopted
// quietly, and nothing fails); then pass 1 again, its reload failing the same way, is the fourth
// recovery: the refusal names the server, the save it reloaded and the fault (before, the
// reload's fault was only logged).
TEST_F(GpuboxTrainerRecovery, AFaultBesideARestartInTheReloadIsNamedInTheRefusal) {
  RestartAt reading{"reading the save <saves>/0", 0, /*device_fault=*/true};
  reading.found_at_once = true;
  const std::string saves = (root_ / "reload_fault").string();
  const Ran ran = run_trainer({saves, {{"at the end of pass 1"}, reading}, {}, /*each_time=*/true});
  std::printf("refused with a fault in the reload: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 5u) << ran.log;
  EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed reloading ") + saves + "/0: " +
                           kDeviceFault + "; the servers restarted 3 times already in this run"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, kDeviceFault), 1u) << ran.error;
}

// Server 1 restarts at the end of every run of pass 1: the trainer goes back three times, then
// gives up.
TEST_F(GpuboxTrainerRecovery, RestartsPastTheRunsRecoveriesStopNamingIt) {
  const Ran ran = refused_recovery_stops(
      "spent", {},
      "; the servers restarted 3 times already in this run: giving up; running the command "
      "again resumes from the last complete save (pass 0, ",
      /*each_time=*/true);
  EXPECT_EQ(ran.restarts, 4u);
  EXPECT_EQ(count(ran.log, "The pass's rows on the cards are dropped: reloading "), 3u) << ran.log;
}

}  // namespace
}  // namespace gpubox::trainer
