// What gpubox_train's --mode train and --mode infer run, as a library: gpubox_train's main and
// the Python package (python/, gpubox._core) call the same code, so a Python run is the
// binary's run.
//
// Thread-safety: one controlling thread per call (training threads live inside).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config/trainer_config.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/saved_models.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {

// The schedule runner.sync_mode picks: gpubox / Collective (Trainer, the cards of `env`) or the
// parameter-server modes async, sync and geo (PsTrainer, against the servers `env` names).
std::unique_ptr<Schedule> make_schedule(const TrainerConfig& config, const TrainerEnv& env);

// --mode train: every pass of the config on the schedule it picks, from the save `load` ("" =
// the config's start), with the dataset's cost hints logged first. Throws gpubox::Error as the
// engine does. Returns the reports of the passes trained.
std::vector<PassReport> train_job(const TrainerConfig& config, const TrainerEnv& env,
                                  const std::string& load, const RunHooks& hooks = {});

// What --mode infer evaluates.
struct InferJob {
  // A save (--load); "" = every save runner.infer_load_path names (one save, or its
  // <epoch> folders in [infer_start_epoch, infer_end_epoch)).
  std::string load;
  // A data folder (--infer_data_dir); "" = runner.test_data_dir with runner.test_data_dirs.
  std::string data_dir;
  // Labels and predictions per instance (--predictions_out): of one save (several are refused).
  bool keep_predictions = false;
  // Set (from any thread or a signal handler) to stop: reading the data stops within a few
  // thousand lines (and a PS mode's evaluation between batches), and infer_job throws
  // PassStopped (schedule.hpp). nullptr: none.
  const std::atomic<bool>* stop_flag = nullptr;
};

// What --mode infer reads: the saves of `job` in order and the data files evaluated. Throws
// gpubox::Error naming what is missing (no data folder; several saves with predictions kept).
struct InferInputs {
  std::vector<SaveToEvaluate> saves;
  std::vector<std::string> files;
};
InferInputs infer_inputs(const TrainerConfig& config, const InferJob& job);

// After each save's evaluation: the save, its result, the seconds its load and evaluation took.
using InferCallback =
    std::function<void(const SaveToEvaluate& save, const EvalResult& result, double seconds)>;

// The config --mode infer builds its schedule from: `config` with the next pass's card work off
// (runner.next_pass_chunk_keys 0), as nothing trains, so its scratch is neither made nor in the
// card tier's plan (card and pinned bytes).
TrainerConfig infer_config(const TrainerConfig& config);

// --mode infer: each save of `job` loaded on the schedule runner.sync_mode picks (the PS modes
// load it into their servers) and evaluated on the same data, in order; `on_save` after each.
// Returns the last save's result. Throws gpubox::Error naming what is missing.
EvalResult infer_job(const TrainerConfig& config, const TrainerEnv& env, const InferJob& job,
                     const InferCallback& on_save = {});

// `config` for predictions kept a row per input line (--predictions_out, Python's
// evaluate(predictions=True)): a line skipped as malformed, or blank, would move every row after
// it off its line, so the first such line stops the load, naming it and `what` (the flag).
TrainerConfig one_row_per_line(const TrainerConfig& config, const std::string& what);

}  // namespace gpubox::trainer
