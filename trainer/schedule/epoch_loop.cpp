#include "trainer/schedule/epoch_loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/logging.hpp"
#include "dataset/batch.hpp"
#include "dataset/memory_source.hpp"
#include "dataset/queue_dataset.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/dead_output.hpp"
#include "trainer/schedule/divergence.hpp"
#include "trainer/schedule/earlier_saves.hpp"
#include "trainer/schedule/evaluation_marks.hpp"
#include "trainer/schedule/job_identity.hpp"
#include "trainer/schedule/metrics_file.hpp"
#include "trainer/schedule/output_paths.hpp"
#include "trainer/schedule/pass_data.hpp"
#include "trainer/schedule/save_folder_lock.hpp"

namespace gpubox::trainer {
namespace {

// What an epoch's PaddleRec lines report: its passes' time and examples, and their metrics
// merged (a run resumed within an epoch counts the passes it trained of it, and so does a run
// that reloaded a save after a server restart).
struct EpochTally {
  double seconds = 0;
  MetricValues last;         // the last pass's metrics (an epoch of one pass)
  std::vector<double> sums;  // the passes' metric buffers, merged (an epoch of several)
  int64_t first_pass = -1;   // the first pass counted (-1: none yet)
  void reset() {
    seconds = 0;
    sums.clear();
    first_pass = -1;
  }
};

// The save the run starts from: --load wins over runner.model_init_path ("" for neither); a
// resume only continues a run that started from the same one.
std::string run_origin(Schedule& schedule, const TrainerConfig& config,
                       const std::string& start_from, bool loaded) {
  if (!start_from.empty() || loaded || schedule.passes_done() != 0 ||
      config.runner.model_init_path.empty()) {
    return start_from;
  }
  GPUBOX_LOG(INFO) << "starting from runner.model_init_path " << config.runner.model_init_path;
  return config.runner.model_init_path;
}

// Where the run starts; returns the first pass to train.
int64_t start_run(Schedule& schedule, const TrainerConfig& config, const RunPlan& plan,
                  const std::string& origin) {
  schedule.lineage().set_job(
      job_identity(config, plan, schedule.env().trainers, schedule.local_cards()), plan.total);
  // As train_passes marks them: a run that saves and evaluates, whose trainers can agree.
  const RunnerConfig& runner = config.runner;
  const bool evaluates_saves = !runner.model_save_path.empty() &&
                               runner.save_mode != SaveKind::kNone && !plan.test_files.empty();
  schedule.lineage().set_marks_evaluations(
      evaluates_saves &&
          schedule.on_any_trainer(false, "whether the run's evaluations are marked").has_value(),
      plan.per_epoch);
  const auto resume = schedule.lineage().find_resume_point(origin, schedule.host_tier());
  schedule.agree_on_start(resume, origin);
  if (resume) {
    // Before load(): the lineage records the passes done (pass P's save: P + 1), the next pass.
    schedule.set_passes_done(resume->manifest.pass);
    schedule.load(resume->dir);
    // A save that records its job and ends it starts the job afresh (find_resume_point); one
    // from before saves recorded their job may still be past this config's passes.
    GPUBOX_EXPECTS(
        schedule.passes_done() < plan.total ||
            (schedule.lineage().resumed_to_evaluate() && schedule.passes_done() == plan.total),
        "runner.resume: the config schedules ", plan.total, " passes (0 to ", plan.total - 1,
        ") and the save ", resume->dir, " (made before saves recorded their job) is of pass ",
        schedule.passes_done() - 1,
        ": nothing is left to train; -o runner.resume=off trains afresh, more epochs "
        "or pass_dirs continue it");
  } else if (!origin.empty()) {
    schedule.load(origin);
  }
  return schedule.passes_done();
}

// The epoch's training metrics (its passes merged), and its PaddleRec lines printed.
MetricValues print_epoch(Schedule& schedule, const RunPlan& plan, int64_t pass,
                         const EpochTally& tally, int cards) {
  const int64_t epoch = pass / plan.per_epoch;
  const MetricValues merged = plan.per_epoch > 1
                                  ? compute_metrics(tally.sums.data(), schedule.metric_buckets())
                                  : tally.last;
  if (schedule.prints()) {
    std::printf(
        "%s\n%s\n",
        format_paddlerec_epoch_line(epoch, tally.seconds, merged.examples, cards, merged.auc)
            .c_str(),
        format_paddlerec_done_line(epoch, merged, tally.seconds).c_str());
    std::fflush(stdout);
    // After a resume (or a reload) within the epoch the lines count its passes from there on
    // only: said, or they read as the whole epoch's.
    const int64_t begins = epoch * plan.per_epoch;
    if (tally.first_pass > begins) {
      GPUBOX_LOG(INFO) << "epoch " << epoch << ": its lines count passes " << tally.first_pass
                       << " to " << pass << " only (this run went on after pass "
                       << tally.first_pass - 1 << "'s save; passes " << begins << " to "
                       << tally.first_pass - 1 << " are in the pass lines of the run before)";
    }
  }
  return merged;
}

// How an epoch's end is evaluated: whether this trainer writes the evaluation's marks in pass's
// save (evaluation_marks.hpp), and whether it is the evaluation a run before cut short (its
// test line may end metrics_path already).
struct EpochEnd {
  bool writes_marks = false;
  bool cut_short = false;
};

// The epoch's test evaluation (its line, the metrics file) and on_epoch, after its lines were
// printed (print_epoch: `merged`), between the marks of its start and end.
void evaluate_epoch(Schedule& schedule, const RunnerConfig& runner, const RunPlan& plan,
                    int64_t pass, const MetricValues& merged, MetricsFile* metrics,
                    const RunHooks& hooks, EpochEnd end) {
  const int64_t epoch = pass / plan.per_epoch;
  if (plan.test_files.empty()) {
    if (hooks.on_epoch) hooks.on_epoch(epoch, merged, nullptr);
    return;
  }
  mark_evaluating(runner, end.writes_marks, pass);
  const EvalResult test = schedule.evaluate(plan.test_files, false);
  // Every trainer of a job hears here of a restart another one's evaluation found (the last
  // epoch's too: no pass comes after it), before this one's results are published.
  schedule.agree_after_evaluation(pass);
  if (schedule.prints()) {
    std::printf("epoch: %lld, test auc: %.6f, test logloss: %.6f, test examples: %.0f\n",
                static_cast<long long>(epoch), test.metrics.auc, test.metrics.logloss,
                test.metrics.examples);
    std::fflush(stdout);
    const std::string one_class = one_class_note(test.metrics);
    if (!one_class.empty()) GPUBOX_LOG(WARNING) << "runner.test_data_dir: " << one_class;
  }
  if (end.cut_short && metrics->ends_with_test_line(epoch)) {
    GPUBOX_LOG(INFO) << "runner.metrics_path: its last line is epoch " << epoch
                     << "'s test line, written by the run before: not written again";
  } else {
    metrics->append(format_test_json(epoch, test.metrics));
  }
  if (hooks.on_epoch) hooks.on_epoch(epoch, merged, &test.metrics);
  mark_evaluated(runner, end.writes_marks, pass);
}

// The test data's first batch, read through the config's reader before the first pass: data
// that does not fit the reader (every line malformed, an unreadable file, a failing
// pipe_command) stops the run now, with the reader's error, not after an epoch of training.
void check_test_data(const TrainerConfig& config, const std::vector<std::string>& files) {
  if (files.empty() || dataset::is_memory_source(files.front())) return;  // parsed already
  dataset::QueueDataset probe(config.dataset);
  probe.set_filelist(files);
  probe.set_batch_size(config.runner.infer_batch_size);
  probe.start(1);
  dataset::Batch batch;
  const bool read = probe.next_batch(0, &batch) && batch.size() > 0;
  if (read) probe.abort("runner.test_data_dir: its first batch was read");
  const Status finished = probe.finish();
  if (read) return;
  if (!finished.ok()) {
    GPUBOX_FAIL("reading runner.test_data_dir (checked before the first pass): ",
                finished.message());
  }
  report_read(probe.load_stats(), files, "runner.test_data_dir (checked before the first pass)",
              config.dataset.max_malformed_share);
}

// Test files that are training files too (the same file by any name): the "test auc" of data the
// model trained on is no held-out measure, said once at the start.
void warn_of_shared_test_files(const RunPlan& plan) {
  if (plan.test_files.empty() || dataset::is_memory_source(plan.test_files.front())) return;
  const auto canonical = [](const std::string& file) {
    std::error_code ec;
    const std::string c = std::filesystem::canonical(file, ec).string();
    return ec ? file : c;
  };
  std::set<std::string> trained;
  for (const std::vector<std::string>& files : plan.pass_files) {
    for (const std::string& f : files) trained.insert(canonical(f));
  }
  std::vector<std::string> shared;
  for (const std::string& f : plan.test_files) {
    if (trained.count(canonical(f)) != 0) shared.push_back(f);
  }
  if (shared.empty()) return;
  std::string names;
  for (std::size_t i = 0; i < shared.size() && i < 3; ++i) names += (i ? ", " : "") + shared[i];
  if (shared.size() > 3) names += ", ...";
  GPUBOX_LOG(WARNING) << shared.size() << " of the " << plan.test_files.size()
                      << " files of runner.test_data_dir are training data too (" << names
                      << "): the 'test auc' of each epoch is measured on instances the model "
                         "trained on, not held out";
}

// What the saves hold when pass `pass` stops the job before its save (the divergence error).
std::string saves_note(const RunnerConfig& runner, bool saving, int64_t pass) {
  if (!saving) return "runner.model_save_path or save_mode saves nothing";
  if (pass == 0) return "no pass before it was saved";
  return "the saves under " + runner.model_save_path + " end with pass " +
         std::to_string(pass - 1) + ", the model before it";
}

// The pass line, with the divergence warning after it (divergence.hpp) when the pass ends above
// the constant predictor but under the stop limit (a stop says it in its error).
void print_pass_line(Schedule& schedule, const RunnerConfig& runner, const PassReport& report,
                     const DivergenceVerdict& verdict) {
  if (report.metrics.examples > 0) {
    const std::string note = divergence_note(report.pass, runner.print_interval, verdict);
    if (!note.empty()) GPUBOX_LOG(INFO) << note;
  }
  if (!schedule.prints()) return;
  std::printf("%s\n", format_pass_line(report).c_str());
  if (verdict.warn && !verdict.stop) {
    std::printf("%s\n", divergence_warning(report.pass, runner.print_interval, verdict).c_str());
  }
  std::fflush(stdout);
  // The pass line's auc and ne read nan: said why, as for the test data.
  const std::string one_class = one_class_note(report.metrics);
  if (!one_class.empty()) {
    GPUBOX_LOG(WARNING) << "pass " << report.pass << "'s training data: " << one_class;
  }
}

// A pass whose shrink or save failed, said in the log only (the pass line at WARNING, with its
// divergence note and warning, as print_pass_line gives them): the failure may end the job (not
// repaired), and the pass would leave no trace; a repaired one trains the pass again, whose record
// (record_pass) is then its only one.
void log_unrecorded_pass(const RunnerConfig& runner, const PassReport& report,
                         const DivergenceVerdict& verdict) {
  const std::string note = divergence_note(report.pass, runner.print_interval, verdict);
  if (!note.empty()) GPUBOX_LOG(INFO) << note;
  GPUBOX_LOG(WARNING) << format_pass_line(report) << " (its shrink or save failed: not recorded)";
  if (verdict.warn && !verdict.stop) {
    GPUBOX_LOG(WARNING) << divergence_warning(report.pass, runner.print_interval, verdict);
  }
}

// The pass's record: its line printed, its metrics in the epoch's tally and its JSON line in the
// metrics file.
void record_pass(Schedule& schedule, const RunnerConfig& runner, const RunPlan& plan,
                 const PassReport& report, const DivergenceVerdict& verdict, EpochTally* tally,
                 MetricsFile* metrics) {
  print_pass_line(schedule, runner, report, verdict);
  // A pass that trained nothing was not saved (train_and_save_pass); it ends the job here,
  // after its line.
  GPUBOX_EXPECTS(report.metrics.examples > 0, "pass ", report.pass,
                 ": trained no instance (files: ", plan.files_of(report.pass).size(),
                 "); nothing is saved");
  tally->seconds += report.seconds;
  tally->last = report.metrics;
  if (tally->first_pass < 0) tally->first_pass = report.pass;
  if (plan.per_epoch > 1) schedule.accumulate_pass_metrics(&tally->sums);
  metrics->append(format_pass_json(report));
}

// Pass k of the run: trained, judged for divergence and a dead output (either stops the job
// before the pass's save: the pass is recorded, then the job fails), shrunk when
// runner.shrink_every says so, saved when `saving`, then
// recorded (record_pass). A shrink or save that fails (a server restart found during it, which
// the loop repairs by training the pass again) leaves the pass unrecorded: each completed pass is
// recorded once, with the metrics of the training its save holds. Its line is logged
// (log_unrecorded_pass) before the failure goes on.
PassReport train_and_save_pass(Schedule& schedule, const TrainerConfig& config, const RunPlan& plan,
                               int64_t k, bool saving, EpochTally* tally, MetricsFile* metrics) {
  const RunnerConfig& runner = config.runner;
  PassReport report = schedule.train_scheduled_pass(plan, k);
  // Judged on job-wide figures: every trainer stops alike (divergence.hpp).
  const DivergenceVerdict verdict =
      judge_divergence(report.metrics.steady, runner.stop_on_divergence);
  report.extra.emplace_back("ne_after_warmup", verdict.ratio);
  const bool dead = dead_output(report.metrics);
  // Every schedule refuses data without a valid instance as it reads it (pass_data.hpp); the
  // examples' count holds the line for any path that did not: no save of a pass that trained
  // nothing (record_pass then ends the job).
  // runner.shrink_every: the shrink before the save, so that the save (and a resume from it)
  // holds the shrunk table and its day counter.
  const bool shrinking = shrinks_after(runner, plan.ends_epoch(k));
  if ((saving || shrinking) && !verdict.stop && !dead && report.metrics.examples > 0) {
    try {
      if (shrinking) schedule.shrink(report.pass);
      if (saving) {
        schedule.settle();  // the save sees no staging under way
        const std::string dir =
            (std::filesystem::path(runner.model_save_path) / std::to_string(report.pass)).string();
        metrics->keep_pass_line(dir, format_pass_json(report));
        schedule.save(dir);
      }
    } catch (...) {
      log_unrecorded_pass(runner, report, verdict);
      throw;
    }
  }
  record_pass(schedule, runner, plan, report, verdict, tally, metrics);
  if (verdict.stop) {
    GPUBOX_FAIL(divergence_error(report.pass, runner.print_interval, verdict,
                                 saves_note(runner, saving, k)));
  }
  if (dead) {
    GPUBOX_FAIL(
        dead_output_error(report.pass, report.metrics, config, saves_note(runner, saving, k)));
  }
  return report;
}

// Whether the caller asked the run to stop (its flag, or its stop_requested).
bool stop_asked(const RunHooks& hooks) {
  const bool flagged = hooks.steps.stop_flag != nullptr && hooks.steps.stop_flag->load();
  // Asked either way: stop_requested may be where the caller sees its own request.
  const bool requested = hooks.stop_requested && hooks.stop_requested();
  return flagged || requested;
}

// The run's passes from `first` on, each trained and saved, each epoch's end evaluated; a pass
// that failed is trained again from where the schedule recovered it. Returns whether the job
// reached its end (false: stopped as asked, between passes or within one).
bool train_passes(Schedule& schedule, const TrainerConfig& config, const RunPlan& plan,
                  int64_t first, bool saving, const RunHooks& hooks, MetricsFile* metrics,
                  std::vector<PassReport>* reports) {
  // Several trainers stop together: a stop asked between passes in one of them rides on the
  // next pass's first step as its vote (schedule.hpp), so that every trainer ends after the
  // same pass; alone, it stops here, before reading the next pass.
  const bool alone = schedule.env().trainers == 1;
  EpochTally tally;
  // An epoch's end (its evaluation, metrics and on_epoch) under way, its training metrics kept:
  // a server restart found there (after the epoch's last pass was saved) reloads that save, and
  // the passes go on right after it, so the evaluation runs again after the reload (rerun_end),
  // before the next pass, or the epoch would never be evaluated (nor the job's last one). Its
  // PaddleRec lines were printed before the evaluation and are not printed again.
  std::optional<MetricValues> ending;
  bool rerun_end = false;  // `ending`, of the pass before k, runs again first
  // The epoch before `first`, its evaluation cut short: its training metrics were the run
  // before's (on_epoch is not called for it).
  const std::optional<bool> unevaluated = saving && !plan.test_files.empty()
                                              ? epoch_cut_short(schedule, config, plan, first)
                                              : std::nullopt;
  bool cut_short = unevaluated.value_or(false);
  const bool writes_marks = unevaluated.has_value() && schedule.env().trainer_id == 0;
  RunHooks cut_short_hooks = hooks;
  cut_short_hooks.on_epoch = nullptr;
  if (cut_short) {
    ending = MetricValues{};
    rerun_end = true;
  }
  for (int64_t k = first; k < plan.total || rerun_end;) {
    if (!rerun_end) {
      if (k > first && stop_asked(hooks) && alone) {
        GPUBOX_LOG(INFO) << "stopped before pass " << k << " as asked; the saves end with pass "
                         << k - 1;
        return false;  // not the job's end: the servers keep its state
      }
      if (k % plan.per_epoch == 0) tally.reset();
    }
    try {
      if (rerun_end) {
        evaluate_epoch(schedule, config.runner, plan, k - 1, *ending, metrics,
                       cut_short ? cut_short_hooks : hooks, {writes_marks, cut_short});
        ending.reset();
        rerun_end = cut_short = false;
        continue;
      }
      PassReport report = train_and_save_pass(schedule, config, plan, k, saving, &tally, metrics);
      const int cards = report.cards;
      if (hooks.on_pass) hooks.on_pass(report);
      reports->push_back(std::move(report));
      if (plan.ends_epoch(k)) {
        ending = print_epoch(schedule, plan, k, tally, cards);
        evaluate_epoch(schedule, config.runner, plan, k, *ending, metrics, hooks, {writes_marks});
        ending.reset();
      }
      ++k;
    } catch (const PassStopped& stopped) {
      // An evaluation stopped (pass -1) comes after pass k's save (pass k - 1's when it was an
      // epoch's end run again).
      const int64_t saved = stopped.pass() < 0 && !rerun_end ? k : k - 1;
      GPUBOX_LOG(INFO) << stopped.what()
                       << (saving && saved >= first
                               ? "; the saves end with pass " + std::to_string(saved)
                               : std::string());
      return false;  // as a stop between passes: not the job's end
    } catch (const Error& e) {
      const int64_t pass = rerun_end ? k - 1 : k;  // the pass the failure came after or in
      const std::optional<int64_t> again = schedule.recover(e, pass);
      if (!again) throw;
      k = *again;  // the epoch's passes from k on are trained again
      // The epoch's lines then count its passes from k on, as a resume in a new process from
      // the save reloaded counts those it trained (EpochTally): the epoch's passes saved before
      // k, in the tally with their right figures, are dropped, as that process never had them.
      tally.reset();
      // The epoch's end was under way and the reload lands right after its last pass.
      rerun_end = ending.has_value() && k == pass + 1;
      cut_short = cut_short && rerun_end;  // that epoch's end is not run again otherwise
      if (!rerun_end) ending.reset();
    }
  }
  return true;
}

}  // namespace

void check_not_saving_over(const std::string& start_from, const std::string& model_save_path,
                           int64_t first, int64_t total) {
  if (start_from.empty()) return;
  // The save and the saves its delta chain applies onto: a pass that replaced a base under the
  // delta it started from left neither loadable (the new save, a delta, applied onto itself).
  std::vector<std::string> restored = {start_from};
  try {
    for (const SavePoint& link : plan_restore(start_from, false).chain) {
      if (link.dir != start_from) restored.push_back(link.dir);
    }
  } catch (const Error&) {
    // Not a complete save: its load names what is wrong.
  }
  std::error_code ec;
  for (const std::string& folder : restored) {
    const std::filesystem::path from = std::filesystem::weakly_canonical(folder, ec);
    if (ec) continue;
    for (int64_t pass = first; pass < total; ++pass) {
      const std::filesystem::path save = std::filesystem::weakly_canonical(
          std::filesystem::path(model_save_path) / std::to_string(pass), ec);
      GPUBOX_EXPECTS(
          ec || save != from, "the run starts from the save ", start_from,
          folder == start_from ? std::string() : ", a delta save that applies onto " + folder,
          ", which its pass ", pass, " saves over (runner.model_save_path ", model_save_path, "): ",
          folder == start_from ? "every rerun would start from the model the last one left there"
                               : "neither that save nor the new ones would load after",
          "; save into another runner.model_save_path, or load a copy of that save");
    }
  }
}

RunPlan plan_run(const RunnerConfig& runner) {
  RunPlan plan;
  if (!runner.pass_dirs.empty()) {
    // A day named twice (a copy-paste in the list, a link to it) trained twice an epoch and
    // left out the day it stood for, unsaid; named twice on purpose (a day trained as two
    // passes) it is said too.
    std::map<std::string, std::size_t> named;  // a folder's canonical path -> its pass
    for (std::size_t p = 0; p < runner.pass_dirs.size(); ++p) {
      const std::string& dir = runner.pass_dirs[p];
      std::error_code ec;
      const std::string canonical = std::filesystem::canonical(dir, ec).string();
      if (ec || dataset::is_memory_source(dir)) continue;  // listing it names what is wrong
      const auto [it, inserted] = named.emplace(canonical, p);
      if (inserted) continue;
      const std::string& first_name = runner.pass_dirs[it->second];
      GPUBOX_LOG(WARNING) << "runner.pass_dirs names '" << first_name << "' twice (passes "
                          << it->second << " and " << p
                          << (dir == first_name ? "" : ", again as '" + dir + "'")
                          << "): its data trains twice an epoch (a copy of a line meant for "
                             "another day?)";
    }
    for (const auto& dir : runner.pass_dirs) plan.pass_files.push_back(data_files(dir));
  } else {
    GPUBOX_EXPECTS(!runner.train_data_dir.empty(),
                   "the config sets neither runner.train_data_dir nor runner.pass_dirs: nothing to "
                   "train (--mode infer evaluates a save)");
    plan.pass_files.push_back(data_files(runner.train_data_dir, runner.train_data_dirs));
  }
  if (!runner.test_data_dir.empty()) {
    plan.test_files = data_files(runner.test_data_dir, runner.test_data_dirs);
  }
  for (const std::vector<std::string>& files : plan.pass_files) {
    // QueueDataset streams files through its readers; a data set in memory is read whole.
    GPUBOX_EXPECTS(runner.reader_type != ReaderType::kQueueDataset || files.empty() ||
                       !dataset::is_memory_source(files.front()),
                   "runner.reader_type: QueueDataset streams data files, and the in-memory data "
                   "set '",
                   files.empty() ? std::string() : files.front(),
                   "' (a DataFrame or arrays) is held whole already: train it with "
                   "runner.reader_type: InmemoryDataset");
  }
  plan.per_epoch = static_cast<int64_t>(plan.pass_files.size());
  plan.total = plan.per_epoch * std::max(1, runner.epochs);
  return plan;
}

namespace {

std::vector<PassReport> run_all_epochs(Schedule& schedule, const TrainerConfig& config,
                                       const std::string& start_from, bool loaded,
                                       const RunHooks& hooks) {
  const RunnerConfig& runner = config.runner;
  const RunPlan plan = plan_run(runner);
  // Its data sets in memory stay registered to its end (a release meanwhile waits for it).
  std::vector<std::string> sources = plan.test_files;
  for (const auto& files : plan.pass_files) {
    sources.insert(sources.end(), files.begin(), files.end());
  }
  const dataset::MemorySourcePins pinned(sources);
  for (const std::vector<std::string>& files : plan.pass_files) {
    check_memory_source_transform(files, config.dataset);
  }
  check_memory_source_transform(plan.test_files, config.dataset);
  check_test_data(config, plan.test_files);
  warn_of_shared_test_files(plan);
  check_metrics_path(trainer_metrics_path(runner.metrics_path, schedule.env().trainer_id), config,
                     plan, start_from);
  MetricsFile metrics(runner.metrics_path, schedule.env().trainer_id);
  const bool saving = !runner.model_save_path.empty() && runner.save_mode != SaveKind::kNone;
  // Before the resume looks at the saves: the folder is made (or refused) before any pass
  // trains, and no other run saves into it meanwhile. Trainer 0 writes every save.
  const SaveFolderLock save_lock = saving && schedule.env().trainer_id == 0
                                       ? SaveFolderLock(runner.model_save_path)
                                       : SaveFolderLock();
  const bool saver = saving && schedule.env().trainer_id == 0;
  // What an interrupted removal left is deleted before the resume looks at the saves.
  if (saver) delete_removal_leftovers(runner.model_save_path, save_lock.held());
  const std::string origin = run_origin(schedule, config, start_from, loaded);
  const int64_t first = start_run(schedule, config, plan, origin);
  if (saving) check_not_saving_over(start_from, runner.model_save_path, first, plan.total);
  // The earlier run's saves this run's end removes (earlier_saves.hpp) are checked now, before
  // any pass trains; trainer 0 writes every save.
  if (saver) check_earlier_saves(runner.model_save_path, origin, plan.total);
  schedule.plan_pass_cache(epochs_left(plan, first));
  // After end_run (declared before EndRun): the pipeline's last read-ahead is counted.
  const PassCacheReport cache_report(schedule.pass_cache(), &schedule);
  // The hooks are set before the run's background work (a pass read ahead reads the stop
  // flag) begins, and cleared after it ended.
  schedule.set_step_hooks(hooks.steps);
  struct EndRun {
    Schedule& schedule;
    ~EndRun() {
      schedule.end_run();
      schedule.set_step_hooks({});
    }
  } end_run{schedule};
  schedule.begin_run(plan);
  std::vector<PassReport> reports;
  if (saving && first > 0) {  // the line of the save it resumes after, if the run before lost it
    metrics.restore_pass_line(
        (std::filesystem::path(runner.model_save_path) / std::to_string(first - 1)).string());
  }
  if (!train_passes(schedule, config, plan, first, saving, hooks, &metrics, &reports)) {
    return reports;
  }
  // The job ended well, its last pass saved: the earlier run's saves after it go.
  if (saver) remove_earlier_saves(runner.model_save_path, origin, plan.total, save_lock.held());
  // A tier on servers tells them (a TRAINING_ROLE=PSERVER server exits with
  // its job). The model is trained and saved by now, so a failure here is only a warning.
  const auto trainers = static_cast<uint32_t>(schedule.env().trainers);
  if (const Status told = schedule.host_tier().end_job(trainers); !told.ok()) {
    GPUBOX_LOG(WARNING) << "telling the servers that the job ended: " << told.to_string()
                        << " (training is complete; a server started with "
                           "--exit_when_job_ends keeps running)";
  }
  return reports;
}

}  // namespace

std::vector<PassReport> run_epochs(Schedule& schedule, const TrainerConfig& config,
                                   const std::string& start_from, bool loaded,
                                   const RunHooks& hooks) {
  try {
    return run_all_epochs(schedule, config, start_from, loaded, hooks);
  } catch (const std::exception& e) {
    schedule.tell_failure(e);  // the other trainers stop, naming it
    throw;
  }
}

}  // namespace gpubox::trainer
