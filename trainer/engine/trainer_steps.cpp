// Trainer's passes and evaluations on the cards (trainer.hpp): the steps of a pass on every card
// (train_steps, one host thread per card) between its begin_pass and end_pass (run_pass), an
// evaluation's steps, and what each tells its report (the steady steps' device counts, the
// step times, the pass boundary's figures).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/engine/pass_pipeline.hpp"
#include "trainer/engine/pass_progress.hpp"
#include "trainer/engine/step_plan.hpp"
#include "trainer/engine/step_times.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {
namespace {

// Steps of a pass not counted in its per-step device counts: without the pass's step sizes (a
// stream) the first steps size the buffers and the scratch arena (allocations); later ones
// repeat the same work. The pass report's pass_step_* totals count every step.
constexpr std::size_t kWarmupSteps = 2;

// A failure between steps: none of the pass's (or evaluation's) pending slots is read later:
// their tags may point into locals of the step loop (the progress sink, kept predictions).
struct AbandonUnlessDone {
  CardWorker& worker;
  bool done = false;
  ~AbandonUnlessDone() {
    if (!done) worker.abandon();
  }
};

// The largest of the cards' values (0 for none).
uint64_t most_of(const std::vector<uint64_t>& per_card) {
  return per_card.empty() ? 0 : *std::max_element(per_card.begin(), per_card.end());
}

}  // namespace

// What the cards' steps of a pass tell its report.
struct Trainer::StepTally {
  std::size_t steps = 0;  // of every card (agreed over the job)
  // Per card: what its steady steps (after kWarmupSteps) asked of the device layer, and the
  // bytes it sent to other trainer processes over them.
  std::vector<device::DeviceCounts> steady;
  std::vector<uint64_t> steady_interprocess;
  // Per card: the most pipeline waits one of its steady steps counted.
  std::vector<uint64_t> steady_max_pipeline_waits;
  // Every card's every step, the first ones included (sizing them all before the pass is the
  // point: pass_allocations etc. in the report), and the next pass's card work between them.
  device::DeviceCounts every_step;
  device::DeviceCounts between_steps;
  // Per card: the wall time of each steady step (the batch, the step, the next pass's chunk).
  std::vector<std::vector<double>> steady_seconds;
  // The steps done when a stop vote ended the pass early (every card after the same one), else
  // 0.
  std::size_t stopped_after = 0;
};

Trainer::StepTally Trainer::train_steps(const dataset::InMemoryDataset* ds,
                                        dataset::QueueDataset* stream, int64_t pass,
                                        const PassStepSizes* sizes) {
  State& s = *state_;
  const int cards = s.cards.num_local_cards();
  const std::size_t instances = ds != nullptr ? ds->size() : stream->size();
  const auto batch_size = static_cast<std::size_t>(config_.dataset.batch_size);
  StepTally tally;
  tally.steady.resize(static_cast<std::size_t>(cards));
  tally.steady_interprocess.assign(static_cast<std::size_t>(cards), 0);
  tally.steady_max_pipeline_waits.assign(static_cast<std::size_t>(cards), 0);
  tally.steady_seconds.resize(static_cast<std::size_t>(cards));
  std::vector<device::DeviceCounts> every_step(static_cast<std::size_t>(cards));
  std::vector<device::DeviceCounts> between_steps(static_cast<std::size_t>(cards));
  std::unique_ptr<PassProgress> progress;  // card 0's, made by it once the steps are known
  s.cards.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        CardWorker& worker = *s.workers[static_cast<std::size_t>(c)];
        comm::Communicator& comm = s.group->at(c);
        // Every card's plan is the same (agreed over the job).
        const StepPlan plan = agree_step_plan(instances, batch_size, cards, card, comm, sizes);
        reserve_steps(worker, plan, batch_size, config_.dataset);
        const std::size_t batches = plan.steps();
        worker.begin_pass_steps(batches);
        if (c == 0) {
          tally.steps = batches;
          progress = std::make_unique<PassProgress>(
              step_hooks_, pass, batches, config_.runner.print_interval, env_.trainer_id == 0);
        }
        tally.steady_seconds[static_cast<std::size_t>(c)].reserve(batches);
        // Card 0's progress line: the running AUC is computed on the card and read with the
        // step's status, a few steps late and without a wait (PassProgress).
        if (c == 0) {
          worker.set_progress_sink([&](int64_t step, double auc) {
            progress->report(static_cast<std::size_t>(step), auc);
          });
        }
        AbandonUnlessDone abandon{worker};
        train_card_steps(card, plan, ds, stream, pass, c == 0 ? progress.get() : nullptr, &tally,
                         &every_step[static_cast<std::size_t>(c)],
                         &between_steps[static_cast<std::size_t>(c)]);
        // Every step's verdict and sparse check read (a non-finite step throws here at the
        // latest, naming its step) before the pass's metrics, write-back and save.
        worker.drain();
        worker.set_progress_sink(nullptr);  // it refers to this pass's locals
        abandon.done = true;
        // A vote in the pass's last kStatusDepth steps is read by the drain, the same on every
        // card (and trainer): the whole pass trained, and the job stops after it, unsaved.
        if (c == 0 && tally.stopped_after == 0 && worker.stop_votes() > 0) {
          tally.stopped_after = batches;
        }
        worker.all_reduce_metrics();
      },
      [&](const std::string& why) {
        s.group->abort(why);
        if (stream != nullptr) stream->abort(why);
      });
  progress.reset();  // ends a redrawn line
  for (int c = 0; c < cards; ++c) {
    tally.every_step += every_step[static_cast<std::size_t>(c)];
    tally.between_steps += between_steps[static_cast<std::size_t>(c)];
  }
  return tally;
}

void Trainer::train_card_steps(device::Card& card, const StepPlan& plan,
                               const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                               int64_t pass, PassProgress* progress, StepTally* tally,
                               device::DeviceCounts* every_step,
                               device::DeviceCounts* between_steps) {
  State& s = *state_;
  const int cards = s.cards.num_local_cards();
  const int c = card.local_index();
  CardWorker& worker = *s.workers[static_cast<std::size_t>(c)];
  comm::Communicator& comm = s.group->at(c);
  const std::atomic<bool>* stop_flag = step_hooks_.stop_flag;
  std::vector<double>& step_seconds = tally->steady_seconds[static_cast<std::size_t>(c)];
  dataset::Batch batch;
  int64_t examples = 0;
  for (std::size_t b = 0; b < plan.steps(); ++b) {
    const Timer step_timer;
    fill_step_batch(ds, stream, plan, c, cards, b, config_.dataset, &batch);
    const int64_t global = plan.global_batch[b];
    const bool report = progress != nullptr && progress->wanted(b);
    const uint64_t sent_before = comm.bytes_to_other_processes();
    // A stop asked rides on the step's all-reduce as this card's vote.
    const bool vote = stop_flag != nullptr && stop_flag->load(std::memory_order_relaxed);
    worker.train_step(batch, global, pass, static_cast<int64_t>(b), report, plan.counts_of(b),
                      vote);
    *every_step += worker.last_step_counts();
    // A chunk of the next pass's card work (runner.next_pass_chunk_keys), after the step's
    // counts were taken: the pass reports its own counts.
    const device::DeviceCounts before_work = card.counts();
    s.card_tier->prepare_next_pass(c);
    *between_steps += card.counts() - before_work;
    if (b >= kWarmupSteps) {
      tally->steady[static_cast<std::size_t>(c)] += worker.last_step_counts();
      uint64_t& most = tally->steady_max_pipeline_waits[static_cast<std::size_t>(c)];
      most = std::max(most, worker.last_step_counts().pipeline_waits);
      tally->steady_interprocess[static_cast<std::size_t>(c)] +=
          comm.bytes_to_other_processes() - sent_before;
      step_seconds.push_back(step_timer.seconds());
    }
    examples += global;
    if (report) progress->note(b, examples);
    // The votes are read with the step's status kStatusDepth steps late, at the same step on
    // every card: all stop after the same one.
    if (worker.stop_votes() > 0) {
      if (c == 0) tally->stopped_after = b + 1;
      break;
    }
  }
}

Trainer::StepTally Trainer::train_pass_steps(const dataset::InMemoryDataset* ds,
                                             dataset::QueueDataset* stream, int64_t pass,
                                             const PassStepSizes* sizes) {
  State& s = *state_;
  if (stream != nullptr) {
    stream->start(s.cards.num_local_cards());
    GPUBOX_LOG(INFO) << "pass " << pass << ": " << stream->memory_note();
  }
  StepTally tally;
  try {
    tally = train_steps(ds, stream, pass, sizes);
  } catch (const Error&) {
    // The stream's own failure (a file, pipe_command, its second read differing from the first)
    // is the pass's error, also when a card stopped for it first.
    const Status read = stream != nullptr ? stream->finish() : Status::OK();
    if (!read.ok() && read.code() != Status::Code::kAborted) {
      GPUBOX_FAIL("reading pass ", pass, ": ", read.message());
    }
    throw;
  }
  if (tally.stopped_after > 0) stop_pass(stream, pass, tally);
  if (stream != nullptr) {
    const Status read = stream->finish();
    if (!read.ok()) GPUBOX_FAIL("reading pass ", pass, ": ", read.message());
  }
  return tally;
}

PassReport Trainer::run_pass(
    PreparedPass& prepared, const std::function<void()>& begun,
    const std::function<std::shared_ptr<const std::vector<uint64_t>>()>& next_keys) {
  State& s = *state_;
  const int64_t pass = prepared.pass;  // from 0, as PaddleRec numbers its epochs
  pass_id_ = pass + 1;
  Timer pass_timer;
  const dataset::InMemoryDataset* ds = prepared.data.get();  // one of these two
  dataset::QueueDataset* stream = prepared.stream.get();
  // What the pass boundary waited for the pass's data: reading it now, or what was left of
  // reading it ahead.
  const double load_seconds = prepared.waited_seconds;
  // A staging that failed (its rows never fetched) or several trainers (stage_rows stages
  // nothing) hand no rows: begin_pass then pulls them itself, as the pipeline's warning says.
  const bool staged_rows =
      prepared.prefetched && prepared.staged.fetched && !prepared.staged.owned.empty();
  const pass::PassStats begin = begin_pass_agreed(
      *prepared.sorted_keys, prepared.keys->slots, staged_rows ? &prepared.staged : nullptr,
      pass::PassAccess::kTrain, "at the start of pass " + std::to_string(pass));
  const std::size_t staged = staged_rows ? prepared.staged.keys.size() : 0;
  prepared.staged = {};  // in the cards now
  if (begun) begun();
  Timer phase;
  const StepTally tally = train_pass_steps(ds, stream, pass, prepared.step_sizes.get());
  const double train_seconds = phase.seconds();

  const std::shared_ptr<const std::vector<uint64_t>> keep = next_keys ? next_keys() : nullptr;
  pass::PassStats end;
  agree_on_restarts([&] { end = s.card_tier->end_pass(keep ? *keep : std::vector<uint64_t>{}); },
                    "at the end of pass " + std::to_string(pass));
  trim_pools();
  PassReport report;
  report.pass = pass;
  report.seconds = load_seconds + pass_timer.seconds();
  report.cards = s.cards.total_cards();
  report.metrics = s.workers[0]->metrics().compute();
  report.extra = {{"load_seconds", load_seconds},
                  {"begin_pass_seconds", end.begin_seconds},
                  {"train_seconds", train_seconds},
                  {"end_pass_seconds", end.end_seconds},
                  {"keys_in_pass", static_cast<double>(begin.keys_in_pass)},
                  {"hits", static_cast<double>(begin.hits)},
                  {"pulled", static_cast<double>(begin.pulled)},
                  {"staged", static_cast<double>(staged)},
                  {"prefetched", static_cast<double>(begin.prefetched)},
                  {"read_ahead_seconds", prepared.prefetched ? prepared.read_seconds : 0.0},
                  {"created", static_cast<double>(begin.created)},
                  {"evicted", static_cast<double>(begin.evicted)},
                  {"written_back", static_cast<double>(end.written_back)},
                  {"kept_dirty", static_cast<double>(end.kept_dirty)},
                  {"early_inserted", static_cast<double>(begin.early_inserted)},
                  {"early_evicted", static_cast<double>(begin.early_evicted)},
                  {"early_seconds", begin.early_seconds},
                  {"early_host_syncs", static_cast<double>(begin.early_host_syncs)},
                  {"early_allocations", static_cast<double>(begin.early_allocations)},
                  {"cached_instances",
                   static_cast<double>(ds != nullptr ? ds->load_stats().cached_instances : 0)},
                  {"skipped_lines",
                   static_cast<double>(
                       (ds != nullptr ? ds->load_stats() : stream->load_stats()).skipped_lines())}};
  // Host memory outside runner.host_memory_mb: the write-back's pinned buffers, kept.
  report.extra.emplace_back("write_back_pinned_mb",
                            static_cast<double>(end.write_back_pinned_bytes) / (1 << 20));
  append_step_counts(tally, &report);
  return report;
}

[[noreturn]] void Trainer::stop_pass(dataset::QueueDataset* stream, int64_t pass,
                                     const StepTally& tally) {
  if (stream != nullptr) {
    stream->abort("the run was asked to stop");
    (void)stream->finish();  // aborted: the rest of the pass is not read
  }
  // The rows the steps changed go back to the host tier as any pass's (the tiers stay
  // consistent; a later save or rerun sees them), but nothing is saved: the saves end with the
  // pass before this one, and a resume trains this one again.
  // Every trainer of a job stops here alike (the vote is the same on each): they meet after the
  // write-back, so that a server restart found in it ends each one stopped too, not one with an
  // error (one trainer, too: it does not go back to train a pass it was asked to stop in). The
  // saves end with the pass before; a rerun reloads them into the servers.
  // What ends the run instead of the stop asked for, "" when nothing does.
  std::string failed;
  try {
    agree_on_restarts([&] { state_->card_tier->end_pass(); },
                      "at the end of pass " + std::to_string(pass) + " (stopped)");
  } catch (const AgreedRestart& restart) {
    // Another failure beside the restart (a device fault, another server down) is not what was
    // asked: the run ends with it and the restart, not stopped (recover() does not go back).
    // So is one of another trainer: every trainer's stopped pass ends with it.
    if (!restart.failure().empty() || !restart.other_failed().empty()) failed = restart.message();
    // Dropped, not left open (nothing of it stays on the cards); the restart stays pending in
    // this process, and a rerun reloads the save. Emptying the cards fails on a card that
    // faulted for good: the run ends with that beside the restart, not with that alone.
    try {
      state_->card_tier->abandon_pass();
    } catch (const std::exception& e) {
      failed = restart.message() + "; dropping the pass: " + e.what();
    }
    if (failed.empty()) GPUBOX_LOG(WARNING) << restart.message() << "; the run stops as asked";
  }
  pass_id_ = pass;
  if (!failed.empty()) {
    // The pools are trimmed as a stopped pass's; a card that cannot be trimmed does not hide
    // the failure the run ends with.
    try {
      trim_pools();
    } catch (const std::exception& e) {
      GPUBOX_LOG(WARNING) << "trimming the card pools after pass " << pass << ": " << e.what();
    }
    // A job's AgreedRestart names the restarts without a rerun's advice (a recovery goes back);
    // one trainer's holds the restart's error, which has it.
    throw StoppedPassFailed(failed +
                            (env_.trainers > 1 ? "; rerun to resume from the last save" : ""));
  }
  trim_pools();
  throw PassStopped(pass, tally.stopped_after, tally.steps);
}

void Trainer::append_step_counts(const StepTally& tally, PassReport* report) const {
  const std::size_t steady = tally.steps > kWarmupSteps ? tally.steps - kWarmupSteps : 0;
  const auto& maxima = tally.steady_max_pipeline_waits;
  trainer::append_step_counts(tally.steady, steady, most_of(maxima), report);
  append_step_times(tally.steady_seconds, report);
  append_card_memory_peak(state_->cards, report);
  // Totals over every step of the pass (every card, warm-up steps included): the step buffers
  // are sized for the pass's largest batch before its first step, so all stay 0.
  const device::DeviceCounts& all = tally.every_step;
  report->extra.emplace_back("pass_step_allocations", static_cast<double>(all.allocations));
  report->extra.emplace_back("pass_step_frees", static_cast<double>(all.frees));
  report->extra.emplace_back("pass_step_pinned_allocations",
                             static_cast<double>(all.pinned_allocations + all.pinned_frees));
  report->extra.emplace_back("pass_step_window_allocations",
                             static_cast<double>(all.window_allocations));
  // The next pass's card work between the steps (card-tier growth, not step buffers).
  report->extra.emplace_back("between_steps_allocations",
                             static_cast<double>(tally.between_steps.allocations));
  report->extra.emplace_back("between_steps_pinned_allocations",
                             static_cast<double>(tally.between_steps.pinned_allocations +
                                                 tally.between_steps.pinned_frees));
  if (env_.trainers == 1) return;
  report->extra.emplace_back("trainer", env_.trainer_id);
  report->extra.emplace_back("trainers", env_.trainers);
  if (steady == 0) return;
  // This trainer's cards together, per steady step (GlooCommunicator's count).
  uint64_t sent = 0;
  for (uint64_t bytes : tally.steady_interprocess) sent += bytes;
  report->extra.emplace_back("interprocess_bytes_per_step",
                             static_cast<double>(sent) / static_cast<double>(steady));
}

namespace {

// What an evaluation's steps asked of each card: every step, and the steady ones (after
// kWarmupSteps) with the most pipeline waits one of them counted.
struct EvalTally {
  explicit EvalTally(int cards)
      : counts(static_cast<std::size_t>(cards)),
        steady(static_cast<std::size_t>(cards)),
        steady_max_pipeline_waits(static_cast<std::size_t>(cards), 0) {}
  std::vector<device::DeviceCounts> counts;
  std::vector<device::DeviceCounts> steady;
  std::vector<uint64_t> steady_max_pipeline_waits;
  std::size_t steps = 0;  // of every card (agreed)
};

// Card `card`'s evaluation steps of `plan` over `ds`: its batches' predictions (and labels) go
// into `result` when kept; what each step asked of the card into `tally`.
void run_eval_steps(CardWorker& worker, device::Card& card, const dataset::InMemoryDataset& ds,
                    const StepPlan& plan, int cards, const dataset::DatasetConfig& config,
                    bool keep_predictions, EvalResult* result, EvalTally* tally) {
  const auto c = static_cast<std::size_t>(card.local_index());
  dataset::Batch batch;
  for (std::size_t b = 0; b < plan.steps(); ++b) {
    // What the whole step asks of the card, the predictions' way back included.
    const device::DeviceCounts before = card.counts();
    fill_step_batch(&ds, nullptr, plan, card.local_index(), cards, b, config, &batch);
    float* predictions_out = nullptr;
    if (keep_predictions && b < plan.local_batches) {
      // Written when the step's slot is read (a few steps later, or at the drain): no wait.
      const dataset::BatchSpan span = ds.batch_span(card.local_index(), cards, b);
      GPUBOX_EXPECTS(span.size() == batch.size(), "evaluation step ", b, " on card ",
                     card.local_index(), ": a batch of ", batch.size(), " instances for a span of ",
                     span.size());
      predictions_out = result->predictions.data() + span.begin;
      std::copy_n(batch.labels.begin(), span.size(), result->labels.begin() + span.begin);
    }
    worker.eval_step(batch, plan.counts_of(b), predictions_out);
    const device::DeviceCounts step = card.counts() - before;
    tally->counts[c] += step;
    if (b >= kWarmupSteps) {
      tally->steady[c] += step;
      uint64_t& most = tally->steady_max_pipeline_waits[c];
      most = std::max(most, step.pipeline_waits);
    }
  }
}

// The evaluation's report figures: every card's every step (sized before the first one: all 0),
// and per card per steady step (eval_graph_launches_per_step, ...), as a pass reports.
std::vector<std::pair<std::string, double>> eval_step_extra(const EvalTally& tally) {
  device::DeviceCounts steps;
  for (const device::DeviceCounts& counts : tally.counts) steps += counts;
  std::vector<std::pair<std::string, double>> extra = {
      {"eval_step_allocations", static_cast<double>(steps.allocations)},
      {"eval_step_frees", static_cast<double>(steps.frees)},
      {"eval_step_pinned_allocations",
       static_cast<double>(steps.pinned_allocations + steps.pinned_frees)},
      {"eval_step_host_syncs", static_cast<double>(steps.host_syncs)},
      // The host's waits for a card behind it by a full ring (at most one a step).
      {"eval_step_pipeline_waits", static_cast<double>(steps.pipeline_waits)},
      // Step graphs captured over the evaluation (every card, every step): one per batch size
      // and upload buffer, the predictions kept or not.
      {"eval_step_graph_captures", static_cast<double>(steps.graph_captures)}};
  append_eval_step_counts(tally.steady, tally.steps > kWarmupSteps ? tally.steps - kWarmupSteps : 0,
                          most_of(tally.steady_max_pipeline_waits), &extra);
  return extra;
}

}  // namespace

EvalResult Trainer::evaluate(const std::vector<std::string>& files, bool keep_predictions) {
  State& s = *state_;
  auto ds = load_dataset(trainer_file_share(files, env_.trainer_id, env_.trainers),
                         "evaluation data", -1);
  ds->set_batch_size(config_.runner.infer_batch_size);
  const std::shared_ptr<const dataset::UniqueKeys> eval_keys = ds->unique_keys_and_slots_shared();
  const auto infer_batch = static_cast<std::size_t>(ds->config().batch_size);
  const std::shared_ptr<const PassStepSizes> sizes = plan_pass_steps(*ds, infer_batch);
  // Read-only: evaluating leaves the model (host tier, card tier keys) as it found it.
  begin_pass_agreed(eval_keys->keys, eval_keys->slots, nullptr, pass::PassAccess::kEvaluate,
                    "at the start of an evaluation");
  const int cards = s.cards.num_local_cards();
  EvalResult result;
  if (keep_predictions) {
    result.predictions.assign(ds->size(), 0.0f);
    result.labels.assign(ds->size(), 0.0f);
  }
  EvalTally tally(cards);
  s.cards.run_on_cards(
      [&](device::Card& card) {
        CardWorker& worker = *s.workers[card.local_index()];
        worker.metrics().reset();
        const StepPlan plan = agree_step_plan(ds->size(), infer_batch, cards, card,
                                              s.group->at(card.local_index()), sizes.get());
        reserve_steps(worker, plan, infer_batch, config_.dataset);
        if (card.local_index() == 0) tally.steps = plan.steps();
        AbandonUnlessDone abandon{worker};  // the slots' predictions point into `result`
        run_eval_steps(worker, card, *ds, plan, cards, config_.dataset, keep_predictions, &result,
                       &tally);
        worker.drain();  // the steps' sparse checks, before the evaluation's metrics
        abandon.done = true;
        worker.all_reduce_metrics();
      },
      [&](const std::string& why) { s.group->abort(why); });
  s.card_tier->end_pass();
  trim_pools();
  result.metrics = s.workers[0]->metrics().compute();
  result.extra = eval_step_extra(tally);
  return result;
}

}  // namespace gpubox::trainer
