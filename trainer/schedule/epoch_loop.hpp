// The one epoch loop of gpubox_train, over any Schedule (schedule.hpp): every mode's runs
// share it.
//
// A run: the pass list (runner.pass_dirs, one pass per folder, or runner.train_data_dir, one
// pass per epoch) times runner.epochs; its start (runner.resume: the newest complete save of
// this run under model_save_path, with the pass after it; else --load; else
// runner.model_init_path; else from scratch); per pass the schedule's training, a save under
// model_save_path/<pass> (runner.save_mode), then its pass line (printed where the schedule
// prints; a warning after it, or an error that ends the job instead of the save, when the
// pass's training logloss ends above the constant predictor's: divergence.hpp) and one JSON line
// in runner.metrics_path (this trainer's: trainer_metrics_path): once per completed pass, so a
// pass trained again after a failed save (a server restart found during it) is recorded once,
// and a pass whose shrink or save failed has its line logged at WARNING ("(its shrink or save
// failed: not recorded)"): a failure not repaired ends the job, which then still names the pass's
// figures; per epoch PaddleRec's two lines over the epoch's passes (their metrics merged exactly),
// then the evaluation of runner.test_data_dir with its line and JSON line.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/config/trainer_config.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer {

// What a caller of the loop (the Python package, python/) hears of a run and how it stops one.
// Every hook runs on the loop's (the caller's) thread; an exception from one ends the run as an
// engine error would.
struct RunHooks {
  // After each pass's line, JSON line and save (the save is complete when it is called).
  std::function<void(const PassReport&)> on_pass;
  // After each epoch's lines and test evaluation: the epoch's training metrics (its passes
  // merged) and the test metrics (nullptr without runner.test_data_dir).
  std::function<void(int64_t epoch, const MetricValues& train, const MetricValues* test)> on_epoch;
  // Asked before every pass after the first: true stops the run there, between two passes,
  // leaving the saves as the last pass left them (its save complete, no later one begun). With
  // several trainers a stop takes effect through the stop flag only (below): a hook answering
  // true sets it too.
  std::function<bool()> stop_requested;
  // Within a pass: its progress, and a stop between two steps (schedule.hpp). A pass stopped
  // so is neither reported nor saved: the saves end with the pass before it. The stop flag is
  // also read where stop_requested is asked: one trainer alone stops there; with several, the
  // flag set between passes is voted in the next pass's first step (the next pass is read and
  // begun, then stopped, unsaved, on every trainer), so that every trainer ends after the same
  // pass.
  StepHooks steps;
};

// The passes the config schedules (data folders listed now: a folder without data throws
// naming it).
RunPlan plan_run(const RunnerConfig& runner);

// Throws naming both when the save a run starts from (`start_from`: --load, model_init_path), or
// a save its delta chain applies onto, is one its passes [first, total) save over,
// <model_save_path>/<pass> (links resolved): the run replaced the save it started from, and each
// rerun of the same command started from the model the last one left there, exit 0; or it
// replaced the delta's base, and neither loaded after.
void check_not_saving_over(const std::string& start_from, const std::string& model_save_path,
                           int64_t first, int64_t total);

// Every pass of the config on `schedule`, from `start_from` (gpubox_train --load; "" = the
// config's start) unless a resume finds a save of this run. `loaded`: a model was loaded before
// (runner.model_init_path is then not needed). Returns the reports of the passes it trained
// (fewer than scheduled when hooks.stop_requested or hooks.steps.stop_flag stopped it: the servers
// are then not told that the job ended). A failure goes to the schedule's tell_failure before it
// is thrown on.
std::vector<PassReport> run_epochs(Schedule& schedule, const TrainerConfig& config,
                                   const std::string& start_from, bool loaded,
                                   const RunHooks& hooks = {});

}  // namespace gpubox::trainer
