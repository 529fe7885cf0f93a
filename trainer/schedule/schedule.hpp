// Schedule: one way to train (gpubox / Collective: trainer/engine/trainer.hpp; the PS modes
// async, sync and geo: trainer/ps_modes/ps_trainer.hpp) as the one epoch loop
// (epoch_loop.hpp) drives it, as Paddle's TrainerBase/DeviceWorker split the loop from the
// device work. A fix to the loop (resume, epoch lines, metrics file, test evaluation, save
// cadence) is then made once for every mode; a schedule says only how it trains a pass,
// evaluates, saves and loads.
//
// Thread-safety: one controlling thread calls every method (training threads live inside).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "table/host_tier.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/table_shrink.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::dataset {
class PassDataCache;
}

namespace gpubox::trainer {

struct EvalResult {
  MetricValues metrics;
  std::vector<float> labels;       // in file order, when predictions were asked for
  std::vector<float> predictions;  // in file order, when predictions were asked for
  // What a schedule adds (gpubox: eval_step_allocations, eval_step_frees,
  // eval_step_pinned_allocations: totals over every card's every step; eval_*_per_step: per card
  // per step past the warm-up, as a pass reports its steps).
  std::vector<std::pair<std::string, double>> extra;
};

// The passes of a run as the config schedules them: every epoch goes over `pass_files` (one
// entry per runner.pass_dirs folder, or runner.train_data_dir alone); the pass at index k has
// id k, from 0 as PaddleRec numbers its epochs.
struct RunPlan {
  std::vector<std::vector<std::string>> pass_files;
  std::vector<std::string> test_files;  // runner.test_data_dir's, evaluated after each epoch
  int64_t per_epoch = 1;
  int64_t total = 0;
  const std::vector<std::string>& files_of(int64_t pass) const {
    return pass_files[static_cast<std::size_t>(pass % per_epoch)];
  }
  bool ends_epoch(int64_t pass) const { return (pass + 1) % per_epoch == 0; }
};

// Where a pass stands (card 0 of trainer 0, after a step): what its progress line says.
struct StepProgress {
  int64_t pass = 0;
  std::size_t step = 0;   // steps done, from 1
  std::size_t steps = 0;  // of the pass
  double examples_per_second = 0;
  double auc = 0;  // the pass's running AUC (NaN before both classes were seen)
  double seconds = 0;
};

// What a caller hears and asks within a pass (RunHooks::steps, epoch_loop.hpp; read by
// Schedule::set_step_hooks).
struct StepHooks {
  // Set (from any thread, or a signal handler: it is lock-free) to stop within a pass: every
  // card reads it before each step and votes it into the step's all-reduce; all cards of the
  // job stop after the first step in which any card voted, and train_scheduled_pass throws
  // PassStopped (the PS modes agree through the servers instead: ps_step_hooks.hpp). Reading
  // a pass's data or an evaluation's stops too (one trainer alone), and the epoch loop reads
  // it between passes.
  const std::atomic<bool>* stop_flag = nullptr;
  // Called on card 0's thread of trainer 0 after a step, at most about 4 times a second and
  // after the pass's last step (the progress line's figures). While set, the progress line is
  // not redrawn on a terminal (the callback shows it); the print_interval lines stay.
  std::function<void(const StepProgress&)> on_progress;
};

// Thrown by Schedule::train_scheduled_pass when the stop flag (StepHooks) stopped the pass
// between two steps, every card of the job after the same one: the pass is neither reported nor
// saved, and the epoch loop returns. Not a gpubox::Error: nothing failed, and no recovery
// applies.
class PassStopped : public std::runtime_error {
 public:
  PassStopped(int64_t pass, std::size_t steps_done, std::size_t steps)
      : std::runtime_error("stopped in pass " + std::to_string(pass) + " after step " +
                           std::to_string(steps_done) + " of " + std::to_string(steps) +
                           " as asked; the pass is not saved"),
        pass_(pass) {}
  // Stopped while reading: pass `pass`'s data (`what` says so; the pass is not trained), or,
  // with `pass` -1, an evaluation after the last pass's save.
  PassStopped(int64_t pass, const std::string& what)
      : std::runtime_error(what + " stopped as asked"), pass_(pass) {}
  int64_t pass() const { return pass_; }

 private:
  int64_t pass_;
};

class Schedule {
 public:
  virtual ~Schedule() = default;

  virtual const TrainerEnv& env() const = 0;
  // Where the sparse rows live between passes (the in-process table or the servers).
  virtual table::HostTier& host_tier() = 0;
  // The saves this run makes and restores.
  virtual SaveLineage& lineage() = 0;
  // Whether this process prints the job's pass and epoch lines.
  virtual bool prints() const = 0;
  // The cards (or, in the PS modes, training threads) this trainer trains on.
  virtual int local_cards() const = 0;

  // The passes done so far (the next pass's id); set before a resumed save is loaded, so that
  // the load records the pass it stands for.
  virtual int64_t passes_done() const = 0;
  virtual void set_passes_done(int64_t passes) = 0;
  // Several trainers: every trainer must start alike (all from scratch, all from `origin`, or
  // all resuming the same save); throws naming the trainer that differs. Default: nothing to
  // agree (one trainer, or a schedule whose load checks it).
  virtual void agree_on_start(const std::optional<SavePoint>& resume, const std::string& origin) {
    (void)resume;
    (void)origin;
  }
  // Whether `mine` holds on any trainer of the job, the same answer on every trainer (a choice
  // of the epoch loop that every trainer takes alike; `what` names it in errors); nullopt when
  // this schedule cannot ask the others (the loop then does without). One trainer: `mine`.
  virtual std::optional<bool> on_any_trainer(bool mine, const char* what) {
    (void)what;
    if (env().trainers == 1) return mine;
    return std::nullopt;
  }

  // Every file list this schedule loads from now on is loaded `loads` times (the epochs a run has
  // left, the saves an infer evaluates): it keeps the parsed loads (runner.pass_cache_mb) when
  // a later one can be served. Default: no cache.
  virtual void plan_pass_cache(int64_t loads) { (void)loads; }
  // The cache plan_pass_cache made (owned by the schedule); null when none.
  virtual const dataset::PassDataCache* pass_cache() const { return nullptr; }
  // The step plans served kept so far (plans of the loads the cache serves unshuffled, kept and
  // served instead of planned again); -1: this schedule keeps none.
  virtual int64_t step_plans_served() const { return -1; }
  // The run begins and ends (a schedule's background work over the run: the pass pipeline).
  virtual void begin_run(const RunPlan& plan) { (void)plan; }
  virtual void end_run() noexcept {}
  // Trains pass `pass` of `plan` (pass ids count from passes_done() up, one call each).
  virtual PassReport train_scheduled_pass(const RunPlan& plan, int64_t pass) = 0;
  // The hooks read within a pass (StepHooks; {} = none) until the next call. Default: not read
  // (the schedule stops between passes only, where the epoch loop reads the stop flag).
  virtual void set_step_hooks(const StepHooks& hooks) { (void)hooks; }
  // Adds the last pass's metric buffer (merged over the job's cards) to `sums`, so that an
  // epoch of several passes reports their metrics merged exactly (compute_metrics(sums,
  // metric_buckets())).
  virtual void accumulate_pass_metrics(std::vector<double>* sums) const = 0;
  virtual std::size_t metric_buckets() const = 0;
  // Background work is settled before a save (it must see no staging under way).
  virtual void settle() {}

  virtual EvalResult evaluate(const std::vector<std::string>& files, bool keep_predictions) = 0;
  // Right after the evaluation of the epoch that ended with pass `pass`, before its results are
  // printed (the epoch loop's, in its try): a schedule whose trainers go back to a save together
  // agrees whether any of them found a server restart in it, and throws when one did (recover()
  // then goes back with all of them). Default: nothing to agree.
  virtual void agree_after_evaluation(int64_t pass) { (void)pass; }
  virtual void save(const std::string& dir) = 0;
  virtual void load(const std::string& dir) = 0;
  // The sparse table's shrink after pass `pass` (runner.shrink_every; table_shrink.hpp), after
  // the pass ended and before its save and the next pass begins: no card may hold a row the
  // shrink would delete (a schedule with cards writes them back and empties them first), and
  // with servers trainer 0 alone shrinks them while the others wait. Default: background work
  // settled, then the host tier shrunk here.
  virtual void shrink(int64_t pass) {
    settle();
    shrink_logged(host_tier(), pass);
  }

  // The run fails on this trainer with `error` (run_epochs, before it throws it on): a schedule
  // of several trainers tells the others, so that they stop naming it rather than at their
  // timeout. Never throws. Default: nothing to tell.
  virtual void tell_failure(const std::exception& error) noexcept { (void)error; }

  // `error` stopped pass `pass`: the pass to train again from when the schedule repaired the
  // cause (a server restarted between passes: the last save reloaded), else nullopt (the loop
  // throws `error` again).
  virtual std::optional<int64_t> recover(const Error& error, int64_t pass) {
    (void)error;
    (void)pass;
    return std::nullopt;
  }
};

}  // namespace gpubox::trainer
