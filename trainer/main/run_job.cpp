#include "trainer/main/run_job.hpp"

#include <thread>

#include "common/logging.hpp"
#include "common/timer.hpp"
#include "dataset/dataset_config.hpp"
#include "dataset/memory_source.hpp"
#include "table/io/model_manifest.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/pass_data.hpp"

namespace gpubox::trainer {
namespace {

// The gpubox schedule says how it runs runner.pipe_command (train and infer alike).
void log_pipe_note(const TrainerConfig& config) {
  if (const std::string& pipe = config.dataset.pipe_arguments_note; !pipe.empty()) {
    GPUBOX_LOG(INFO) << "runner.pipe_command: " << pipe;
  }
}

}  // namespace

std::unique_ptr<Schedule> make_schedule(const TrainerConfig& config, const TrainerEnv& env) {
  if (config.runner.sync_mode != config::SyncMode::kGpubox) {
    return std::make_unique<ps_modes::PsTrainer>(config, env);
  }
  auto trainer = std::make_unique<Trainer>(config, env);
  log_pipe_note(config);
  return trainer;
}

std::vector<PassReport> train_job(const TrainerConfig& config, const TrainerEnv& env,
                                  const std::string& load, const RunHooks& hooks) {
  if (config.runner.reader_type == config::ReaderType::kQueueDataset && config.runner.shuffle) {
    GPUBOX_LOG(WARNING) << "runner.shuffle: true has no effect with runner.reader_type: "
                           "QueueDataset (each pass is streamed in file order, in every "
                           "mode); set runner.shuffle: false, or read with InmemoryDataset";
  }
  if (config.runner.sync_mode != config::SyncMode::kGpubox) {
    ps_modes::PsTrainer trainer(config, env);
    return trainer.train(load, hooks);
  }
  Trainer trainer(config, env);
  log_pipe_note(config);
  for (const std::string& hint : dataset::cost_hints(config.dataset, trainer.num_cards(),
                                                     std::thread::hardware_concurrency())) {
    GPUBOX_LOG(INFO) << hint;
  }
  return trainer.train(load, hooks);
}

TrainerConfig infer_config(const TrainerConfig& config) {
  // Nothing trains: the next pass's card work (between training steps) never runs, so its
  // scratch is kept out of the card tier's plan.
  TrainerConfig evaluating = config;
  evaluating.runner.next_pass_chunk_keys = 0;
  return evaluating;
}

TrainerConfig one_row_per_line(const TrainerConfig& config, const std::string& what) {
  TrainerConfig strict = config;
  strict.dataset.strict_parse = true;
  strict.dataset.blank_lines_fail = true;
  strict.dataset.strict_parse_reason = what +
                                       " keeps a row per line, and a line skipped would move "
                                       "every row after it off its line: fix or remove it";
  return strict;
}

InferInputs infer_inputs(const TrainerConfig& config, const InferJob& job) {
  const RunnerConfig& runner = config.runner;
  InferInputs in;
  in.saves = job.load.empty() ? saves_to_evaluate(runner.infer_load_path, runner.infer_start_epoch,
                                                  runner.infer_end_epoch)
                              : std::vector<SaveToEvaluate>{{job.load, -1}};
  // Predictions are one save's: with several, all but the last were dropped unsaid.
  if (job.keep_predictions && in.saves.size() > 1) {
    GPUBOX_FAIL("the predictions per instance (--predictions_out) are one save's, and ",
                in.saves.size(), " saves would be evaluated (runner.infer_load_path ",
                runner.infer_load_path, ": ", in.saves.front().dir, " .. ", in.saves.back().dir,
                "): name one with --load, or narrow runner.infer_start_epoch / infer_end_epoch");
  }
  const bool from_config = job.data_dir.empty();
  const std::string data_dir = from_config ? runner.test_data_dir : job.data_dir;
  GPUBOX_EXPECTS(!data_dir.empty(), "--mode infer needs --infer_data_dir or runner.test_data_dir");
  in.files = data_files(data_dir, from_config ? runner.test_data_dirs : std::vector<std::string>{});
  return in;
}

EvalResult infer_job(const TrainerConfig& config, const TrainerEnv& env, const InferJob& job,
                     const InferCallback& on_save) {
  const InferInputs in = infer_inputs(config, job);
  const std::vector<SaveToEvaluate>& saves = in.saves;
  const std::vector<std::string>& files = in.files;
  check_memory_source_transform(files, config.dataset);
  const dataset::MemorySourcePins pinned(files);  // read save after save: kept to the end
  TrainerConfig evaluating = infer_config(config);
  evaluating.evaluated_files = files;  // what the job's trainers compare
  const std::unique_ptr<Schedule> schedule = make_schedule(evaluating, env);
  StepHooks hooks;
  hooks.stop_flag = job.stop_flag;
  schedule->set_step_hooks(hooks);
  schedule->plan_pass_cache(static_cast<int64_t>(saves.size()));  // the same files, each save
  const PassCacheReport cache_report(schedule->pass_cache(), schedule.get());
  EvalResult result;
  for (const SaveToEvaluate& save : saves) {
    Timer timer;
    GPUBOX_LOG(INFO) << "load model " << save.dir;
    // A key the save never saw reads as the row it would have started at: the save's starts.
    auto manifest = table::io::read_model_manifest(table::io::FileEnv::posix(), save.dir);
    if (manifest.ok()) {
      throw_if_error(check_saved_row_starts(manifest->model_keys, config, save.dir));
    }
    schedule->load(save.dir);  // names a save it cannot read
    result = schedule->evaluate(files, job.keep_predictions);
    if (on_save) on_save(save, result, timer.seconds());
  }
  return result;
}

}  // namespace gpubox::trainer
