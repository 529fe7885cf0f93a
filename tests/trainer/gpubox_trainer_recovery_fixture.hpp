// The fixture of gpubox_trainer_recovery_test (the repairs: _test.cpp; a device fault beside a
// restart, and the refusals: _faults_test.cpp): one gpubox-mode trainer against 2 in-process
// servers, a server restarted in a phase it names, and the oracle (a run resumed from pass 0's
// save). One class for both files, so that gtest sees one fixture type and the oracle runs once.
#pragma once

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

namespace gpubox::trainer::recovery_test {

namespace fs = std::filesystem;
using ps_modes::Servers;

inline constexpr int kPasses = 3;

inline std::size_t count(const std::string& text, const std::string& what) {
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

inline constexpr const char* kDeviceFault = "card 0: an injected device fault";

// What CardSet::run_on_cards throws when the cards of `faults` failed with them (RestartAt::
// card_faults; the first that failed first), "<server>" standing for `server`.
inline device::CardsFailed cards_failed(const std::vector<std::string>& faults,
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
inline std::string endpoint_of(const ps_modes::Servers& shards, int i) {
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

}  // namespace gpubox::trainer::recovery_test
