// PsTrainer's passes (ps_trainer.hpp): a pass's data, the sync mode's barriers and agreed step
// count, every training thread's steps, and the pass's report.
#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/ps_modes/job_steady_loss.hpp"
#include "trainer/ps_modes/ps_step_hooks.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/ps_modes/sync_barriers.hpp"
#include "trainer/ps_modes/thread_barrier.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;

std::vector<float> one_hot(int size, int index, float value) {
  std::vector<float> v(static_cast<std::size_t>(size), 0.0f);
  v.at(static_cast<std::size_t>(index)) = value;
  return v;
}

}  // namespace

// One pass's data as a PS trainer reads it: held whole (InmemoryDataset), or streamed
// (QueueDataset; in the sync mode read once first for its batch count, as every trainer takes as
// many steps as the longest).
struct PsTrainer::PassData {
  std::unique_ptr<dataset::InMemoryDataset> held;
  std::unique_ptr<dataset::QueueDataset> stream;
  std::size_t batches = 0;  // per thread; unknown (0) for an async or geo stream
  std::size_t steps = 0;    // per thread, agreed over the job in the sync mode
  const dataset::LoadStats& stats() const {
    return stream ? stream->load_stats() : held->load_stats();
  }
  // A stream's own failure (a file, pipe_command, strict_parse) is the pass's error, also when a
  // training thread stopped for it first.
  void check_stream(int64_t pass) const {
    const Status read = stream->finish();
    if (!read.ok() && read.code() != Status::Code::kAborted) {
      GPUBOX_FAIL("reading pass ", pass, ": ", read.message());
    }
  }
  // Thread t's (of `threads`) batch of step b; false when the thread has no step left.
  // `open_ended`: a stream's batches are taken until it ends (async and geo), else `steps`.
  bool next_batch(int t, int threads, std::size_t b, bool open_ended, int64_t pass,
                  dataset::Batch* batch) const {
    if (open_ended) return stream->next_batch(t, batch);
    if (b >= steps) return false;
    if (b >= batches) {
      *batch = dataset::Batch{};  // an empty step: this trainer has no batch left
    } else if (stream != nullptr) {
      GPUBOX_EXPECTS(stream->next_batch(t, batch), "pass ", pass, ": its stream ended at batch ", b,
                     " of ", batches);
    } else {
      held->fill_batch(t, threads, b, batch);
    }
    return true;
  }
};

PsTrainer::PassData PsTrainer::read_pass(const std::vector<std::string>& share, int64_t pass) {
  const int threads = state_->cards.num_local_cards();
  PassData data;
  if (config_.runner.reader_type == ReaderType::kQueueDataset) {
    data.stream = std::make_unique<dataset::QueueDataset>(config_.dataset);
    data.stream->set_filelist(share);
    if (config_.runner.sync_mode == SyncMode::kSync) {
      const Status counted = data.stream->scan();
      if (!counted.ok()) GPUBOX_FAIL("reading pass ", pass, " (to count it): ", counted.message());
      data.batches = data.stream->num_batches_per_card(threads);
    }
    data.stream->start(threads);
    GPUBOX_LOG(INFO) << "pass " << pass << ": " << data.stream->memory_note();
  } else {
    data.held = std::make_unique<dataset::InMemoryDataset>(config_.dataset);
    data.held->set_filelist(share);
    const Status loaded = load_stoppable(*data.held, "reading pass " + std::to_string(pass), pass);
    if (!loaded.ok()) GPUBOX_FAIL("loading pass ", pass, ": ", loaded.message());
    report_read(data.held->load_stats(), share, "pass " + std::to_string(pass),
                config_.dataset.max_malformed_share);
    if (config_.runner.shuffle) data.held->local_shuffle(config_.runner.seed * 1000003 + pass);
    data.batches = data.held->num_batches_per_card(threads);
  }
  data.steps = data.batches;
  return data;
}

PsTrainer::PassData PsTrainer::read_eval(const std::vector<std::string>& files) {
  PassData data;
  if (config_.runner.reader_type == ReaderType::kQueueDataset) {
    data.stream = std::make_unique<dataset::QueueDataset>(config_.dataset);
    data.stream->set_filelist(files);
    data.stream->set_batch_size(config_.runner.infer_batch_size);
    data.stream->start(1);  // one consumer: thread 0
  } else {
    data.held = std::make_unique<dataset::InMemoryDataset>(config_.dataset);
    data.held->set_filelist(files);
    const Status loaded = load_stoppable(*data.held, "reading the evaluation data", -1);
    if (!loaded.ok()) GPUBOX_FAIL("loading evaluation data: ", loaded.message());
    report_read(data.held->load_stats(), files, "evaluation data",
                config_.dataset.max_malformed_share);
    data.held->set_batch_size(config_.runner.infer_batch_size);
    data.batches = data.held->num_batches_per_card(1);
  }
  data.steps = data.batches;
  return data;
}

std::size_t PsTrainer::agree_sync_steps(SyncBarriers& barriers, std::size_t batches) {
  State& s = *state_;
  std::vector<float> mine = one_hot(env_.trainers, env_.trainer_id, static_cast<float>(batches));
  throw_if_error(s.servers->dense(DenseAction::kAdd, kBatchesTable, &mine));
  barriers.arrive("counting batches");
  std::vector<float> all(static_cast<std::size_t>(env_.trainers), 0.0f);
  throw_if_error(s.servers->dense(DenseAction::kRead, kBatchesTable, &all));
  std::size_t steps = batches;
  for (std::size_t w = 0; w < all.size(); ++w) {
    steps = std::max(steps, static_cast<std::size_t>(std::lround(all[w] - s.batches_seen[w])));
  }
  s.batches_seen = all;
  barriers.arrive("agreeing on the steps");
  return steps;
}

// What every training thread of a pass shares: its data and stop, the sync mode's barriers of
// every trainer, the schedule of its dense syncs, the threads' barrier and thread 0's progress
// line.
struct PsTrainer::PassThreads {
  PassThreads(PsTrainer& trainer, PassData& data, int64_t pass, PsPassStop& stop,
              SyncBarriers& barriers, int threads)
      : trainer(trainer),
        data(data),
        pass(pass),
        stop(stop),
        barriers(barriers),
        threads(threads),
        mode(trainer.config_.runner.sync_mode),
        local(threads),
        progress(trainer.state_->hooks, pass, data.steps, trainer.config_.runner.print_interval,
                 trainer.env_, threads) {
    const RunnerConfig& runner = trainer.config_.runner;
    // async and geo take a stream's batches until it ends; everything else `steps` of them.
    open_ended = data.stream != nullptr && mode != SyncMode::kSync;
    // sync (runner.dense_sync_steps 1) averages the gradients of every thread of the job, and
    // every thread takes the same optimizer step on them with the same moments, as the gpubox
    // mode's cards all-reduce theirs and as Paddle's sync mode's dense table applies its rule once
    // to the trainers' averaged gradients (averages_gradients, issue 32); over longer windows
    // each thread steps its own copy and the windows' changes are averaged; geo averages the
    // threads' local moves since the last sync, dense and sparse, as Paddle's GeoCommunicator
    // does (it scales each trainer's delta by 1 / trainers); async adds each thread's change as
    // it comes.
    average_gradients = averages_gradients(runner);
    job_of_one = trainer.env_.trainers * threads == 1;
    dense_scale = mode == SyncMode::kAsync
                      ? 1.0f
                      : 1.0f / static_cast<float>(trainer.env_.trainers * threads);
    // The running statistics' changes are averaged in every mode (async: PsWorker::sync_dense).
    statistic_scale = 1.0f / static_cast<float>(trainer.env_.trainers * threads);
    dense_every = static_cast<std::size_t>(mode == SyncMode::kGeo ? runner.geo_step
                                                                  : runner.dense_sync_steps);
  }
  // Sync: every thread of the job has pulled step b's rows before any pushes its gradients, so
  // that every pull of a step reads the rows of the step before, as the gpubox mode's cards do
  // (else a slow thread's pull could find a fast one's update of the same step: the rows of one
  // step depended on the threads' timing, and two threads' step differed from two cards' by up
  // to 5e-3 in a dense value after one step, issue 32). Threads of one trainer alone meet on the
  // local barrier only.
  void meet_pulled(int t, std::size_t b) {
    if (trainer.env_.trainers == 1) {
      local.wait();
      return;
    }
    meet_all(t, "step " + std::to_string(b) + "'s pulls");
  }
  // How thread t takes part in the averaged dense step (PsWorker::add_gradients): trainer 0's
  // thread 0 overwrites the step's gradient table right after computing the step, before the
  // step's pull barrier, and every other thread adds to it after that barrier. The overwrite
  // needs no clearing before it: the table of step b was last read by every thread's
  // step_averaged of step b - 2, which each thread finishes before it computes step b - 1 and
  // meets at meet_pulled(b - 1); the overwriting thread passes that barrier before it computes
  // step b, and every add of step b waits at meet_pulled(b) for the overwrite to be done.
  PsWorker::GradientShare gradient_share(int t) const {
    if (job_of_one) return PsWorker::GradientShare::kLocal;
    return trainer.env_.trainer_id == 0 && t == 0 ? PsWorker::GradientShare::kOverwrite
                                                  : PsWorker::GradientShare::kAdd;
  }
  // Thread t's batch of step b; false when the thread has no step left.
  bool next_batch(int t, std::size_t b, dataset::Batch* batch) const {
    return data.next_batch(t, threads, b, open_ended, pass, batch);
  }
  // Every trainer's updates of step b are on the servers before anyone's next pull (sync), and
  // thread 0 agrees on a stop around the barrier (PsPassStop).
  void meet_step(int t, std::size_t b) {
    local.wait();  // every thread's updates of this step are on the servers
    if (t == 0) stop.before_sync_barrier(b);
    if (t == 0) arrive("step " + std::to_string(b));
    if (t == 0) stop.after_sync_barrier(b, b + 1 == data.steps);
    if (t == 0 && (b + 1 == data.steps || stop.stopping()) && !end_pass_meets(b + 1)) {
      barriers.leave();
    }
    local.wait();  // ... and every trainer's
  }
  // A barrier of every thread of every trainer with no stop vote: the step's pulls
  // (meet_pulled), the pass's last dense window, its dense table. `last`: the pass's last one.
  void meet_all(int t, const std::string& what, bool last = false) {
    local.wait();
    if (t == 0) arrive(what);
    if (t == 0 && last) barriers.leave();
    local.wait();
  }
  // Thread 0's arrival at a barrier of every trainer, between the order hook's points "arrive
  // pass p, <what>" and "arrived pass p, <what>" (tests).
  void arrive(const std::string& what) {
    const auto point = [&](const char* at) {
      if (trainer.order_hook_) trainer.order_hook_(detail::concat(at, " pass ", pass, ", ", what));
    };
    point("arrive");
    barriers.arrive(what);
    point("arrived");
  }
  // Whether end_pass meets every trainer after a pass of `steps` steps (sync).
  bool end_pass_meets(std::size_t steps) const {
    return (mode == SyncMode::kSync && steps % dense_every != 0) || average_gradients;
  }

  // Sync, once every thread computed step b: this thread's share of the trainer's keys, each
  // key's gradients summed over the threads, goes to the servers (MergedPushes), after every
  // pull of the step (meet_pulled); the step's first writer of the averaged gradient writes
  // before that barrier, as gradient_share says.
  void push_merged(int t, std::size_t b, PsWorker& worker) {
    PsTrainer::State& s = *trainer.state_;
    try {
      s.pushes->file(t, worker.computed_push());
      if (average_gradients && gradient_share(t) == PsWorker::GradientShare::kOverwrite) {
        worker.add_gradients(PsWorker::GradientShare::kOverwrite);
      }
      meet_pulled(t, b);
      s.pushes->push(t, *s.servers, pass, static_cast<int64_t>(b));
    } catch (...) {
      worker.discard_step();  // the worker stays usable for a later pass
      throw;
    }
  }
  // The end of thread t's pass of `steps` steps: what is left goes to the servers. In the sync
  // mode every thread of every trainer took the same steps, so all agree on whether a partial
  // dense window is left; it is added and adopted behind one more barrier, as a step's.
  void end_pass(int t, std::size_t steps, PsWorker& worker) {
    // No barrier of every trainer follows (meet_step left already, unless the pass took no step).
    if (t == 0 && !end_pass_meets(steps)) barriers.leave();
    if (mode == SyncMode::kGeo) worker.sync_rows(dense_scale);
    if (mode != SyncMode::kSync) worker.sync_dense(dense_scale, statistic_scale);
    if (mode == SyncMode::kSync && steps % dense_every != 0) {
      worker.sync_dense(dense_scale);
      meet_all(t, "the pass's last dense window", /*last=*/!average_gradients);
      worker.sync_dense(0.0f);
    }
    // Averaged steps leave every thread's dense parameters the same: one thread writes them to
    // the servers' table (a save, an evaluation and the next job read it), which every thread
    // adopts.
    if (average_gradients) {
      if (gradient_share(t) != PsWorker::GradientShare::kAdd) worker.publish_dense();
      meet_all(t, "the pass's dense table", /*last=*/true);
      worker.sync_dense(0.0f);
    }
  }

  PsTrainer& trainer;
  PassData& data;
  const int64_t pass;
  PsPassStop& stop;
  SyncBarriers& barriers;  // sync: every trainer's
  const int threads;
  const SyncMode mode;
  bool open_ended = false;
  bool average_gradients = false;
  bool job_of_one = false;  // one trainer of one thread: its dense step needs no server
  float dense_scale = 1.0f;
  float statistic_scale = 1.0f;
  std::size_t dense_every = 1;
  ThreadBarrier local;
  PsProgress progress;
};

std::size_t PsTrainer::train_threads(PassData& data, int64_t pass, PsPassStop& stop,
                                     SyncBarriers& barriers) {
  State& s = *state_;
  PassThreads run(*this, data, pass, stop, barriers, s.cards.num_local_cards());
  std::size_t steps_taken = 0;  // thread 0's
  s.cards.run_on_cards(
      [&](device::Card& card) {
        const int t = card.local_index();
        const std::size_t steps = train_thread(run, t);
        if (t == 0) steps_taken = steps;
      },
      [&](const std::string& why) {
        run.local.abort(why);
        if (data.stream != nullptr) data.stream->abort(why);
      });
  return steps_taken;
}

std::size_t PsTrainer::train_thread(PassThreads& run, int t) {
  State& s = *state_;
  const SyncMode mode = run.mode;
  PsWorker& worker = *s.workers[static_cast<std::size_t>(t)];
  const PsWorker::GradientShare share = run.gradient_share(t);
  worker.begin_pass_steps(run.open_ended ? -1 : static_cast<int64_t>(run.data.steps));
  // async reads one batch ahead: its rows are pulled while this step computes (PsWorker). Not
  // when the pass stops before it: its pull would create rows it never trains. So async asks
  // whether to stop before step b + 1 at step b's read-ahead, and that answer is step b + 1's.
  dataset::Batch batch;
  dataset::Batch next;
  bool have_next = false;
  bool asked = false;      // async: stop_before_step(t, b) was asked at the read-ahead ...
  bool stop_next = false;  // ... and answered this
  const auto stops_before = [&](std::size_t step) {
    if (mode == SyncMode::kSync) return false;
    const bool stop = asked ? stop_next : run.stop.stop_before_step(t, step);
    asked = false;
    return stop;
  };
  std::size_t b = 0;
  for (; !stops_before(b) && (have_next || run.next_batch(t, b, &batch)); ++b) {
    if (have_next) std::swap(batch, next);
    if (s.watch != nullptr) {
      if (const std::string lost = s.watch->lost(); !lost.empty()) {
        GPUBOX_FAIL("pass ", run.pass, ", step ", b, ": ", lost);
      }
    }
    asked = mode == SyncMode::kAsync;
    stop_next = asked && run.stop.stop_before_step(t, b + 1);
    have_next = asked && !stop_next && run.next_batch(t, b + 1, &next);
    worker.compute_step(batch, run.pass, static_cast<int64_t>(b), have_next ? &next : nullptr);
    if (mode == SyncMode::kSync) run.push_merged(t, b, worker);
    worker.apply_step(mode != SyncMode::kSync);
    if (t == 0) run.progress.after_step(b, batch.size(), worker);
    const bool dense_step = (b + 1) % run.dense_every == 0;
    if (mode == SyncMode::kGeo && dense_step) worker.sync_rows(run.dense_scale);
    if (dense_step && mode == SyncMode::kAsync) worker.exchange_dense(run.statistic_scale);
    if (run.average_gradients && share != PsWorker::GradientShare::kOverwrite) {
      worker.add_gradients(share);
    }
    if (dense_step && mode != SyncMode::kAsync && !run.average_gradients) {
      worker.sync_dense(run.dense_scale);
    }
    if (mode == SyncMode::kSync) {
      run.meet_step(t, b);
      if (run.average_gradients) worker.step_averaged(share);
      if (dense_step && !run.average_gradients) worker.sync_dense(0.0f);
      if (run.stop.stopping()) {  // every thread of every trainer after this step
        ++b;
        break;
      }
    }
  }
  run.end_pass(t, b, worker);
  return b;
}

EvalResult PsTrainer::evaluate(const std::vector<std::string>& files, bool keep_predictions) {
  State& s = *state_;
  // Read like the training passes: held whole, or streamed.
  PassData data = read_eval(files);
  EvalResult result;
  bool whole = true;
  s.cards.run_on_cards(
      [&](device::Card& card) {
        if (card.local_index() != 0) return;
        if (order_hook_) order_hook_("evaluate");
        whole = eval_thread(data, keep_predictions, &result);
      },
      [&](const std::string& why) {
        if (data.stream != nullptr) data.stream->abort(why);
      });
  if (!whole && data.stream != nullptr) data.stream->abort("the run was asked to stop");
  if (!whole && data.stream != nullptr) (void)data.stream->finish();
  if (!whole) throw PassStopped(-1, "the evaluation");
  if (data.stream != nullptr) {
    const Status read = data.stream->finish();
    if (!read.ok()) GPUBOX_FAIL("reading evaluation data: ", read.message());
    report_read(data.stream->load_stats(), files, "evaluation data",
                config_.dataset.max_malformed_share);
  }
  // Its figures are of this job's dense table only while no other job took the servers over.
  check_still_owner("the evaluation");
  return result;
}

void PsTrainer::check_still_owner(const std::string& what) const {
  const State& s = *state_;
  if (s.owner == nullptr) return;
  if (const std::string taken = s.owner->taken_over(); !taken.empty()) {
    GPUBOX_FAIL(what, ": ", taken);
  }
}

bool PsTrainer::eval_thread(PassData& data, bool keep_predictions, EvalResult* result) {
  PsWorker& worker = *state_->workers[0];
  worker.sync_dense(0.0f);  // the servers' dense table
  worker.metrics().reset();
  const std::atomic<bool>* stop = alone_stop_flag();
  dataset::Batch batch;
  for (std::size_t b = 0;; ++b) {
    // One trainer alone stops between two batches when asked (several: in the next pass).
    if (stop != nullptr && stop->load()) return false;
    if (!data.next_batch(0, 1, b, data.stream != nullptr, -1, &batch)) break;
    worker.eval_step(batch);
    if (!keep_predictions || batch.size() == 0) continue;
    const std::vector<float> predictions = worker.last_predictions();
    result->labels.insert(result->labels.end(), batch.labels.begin(), batch.labels.end());
    result->predictions.insert(result->predictions.end(), predictions.begin(), predictions.end());
  }
  result->metrics = worker.metrics().compute();
  return true;
}

uint64_t PsTrainer::step_allocations() const {
  uint64_t total = 0;
  for (const auto& worker : state_->workers) total += worker->step_allocations();
  if (state_->pushes != nullptr) total += state_->pushes->growths();
  return total;
}

PassReport PsTrainer::train_pass(const std::vector<std::string>& files) {
  State& s = *state_;
  const int64_t pass = pass_id_++;
  training_pass_ = pass;  // until it returns
  Timer pass_timer;
  const std::vector<std::string> share =
      config_.runner.split_file_list ? trainer_file_share(files, env_.trainer_id, env_.trainers)
                                     : files;
  GPUBOX_EXPECTS(!share.empty(), "pass ", pass, ": trainer ", env_.trainer_id, " of ",
                 env_.trainers, " gets none of the ", files.size(),
                 " files (runner.split_file_list shares them among the trainers: give at least ",
                 env_.trainers, " files)");
  PassData data = read_pass(share, pass);
  const double load_seconds = pass_timer.seconds();
  const bool sync = config_.runner.sync_mode == SyncMode::kSync;
  SyncBarriers barriers(*s.servers, env_.trainer_id, env_.trainers, pass,
                        config_.runner.collective_timeout_s);
  if (sync) data.steps = agree_sync_steps(barriers, data.batches);
  Timer train_timer;
  const uint64_t allocations_before = step_allocations();
  std::size_t steps_taken = 0;
  PsPassStop stop(*s.servers, env_.trainer_id, env_.trainers, s.hooks.stop_flag, pass);
  // The steps taken before a stream's failure stay taken: a streamed pass is never whole in
  // memory to be checked first. A server restart found in the pass, in a job whose trainers go
  // back to the last save together, is voted on at the pass's end, at the meeting where every
  // trainer agrees on a stop (agree_on_restart), and recover() goes back with all of them; in
  // the sync mode, the others wait at the step's barrier for this trainer: it comes there and
  // tells them (SyncBarriers::hold).
  std::exception_ptr restarted;
  try {
    steps_taken = train_threads(data, pass, stop, barriers);
  } catch (const Error&) {
    if (data.stream != nullptr) data.check_stream(pass);
    restart_agreed_ = restart_agreed_ || barriers.heard_restart();
    if (!repairs_together() || !restart_found()) throw;
    restarted = std::current_exception();
    if (sync) barriers.hold();
  }
  const std::string p = std::to_string(pass);
  bool stopped = false;
  const auto meet_at_end = [&] {
    stopped = stop.pass_stopped([&] { meet("ps/stop/" + p, "at the end of pass " + p); });
  };
  if (!repairs_together()) {
    meet_at_end();
  } else if (agree_on_restart(pass, restarted, meet_at_end)) {
    barriers.forget_mark();  // every trainer read the marks before the vote's meeting
    if (data.stream != nullptr) data.stream->abort("a server restarted");
    if (data.stream != nullptr) (void)data.stream->finish();  // the rest is not read
    pass_id_ = pass;
    if (restarted) std::rethrow_exception(restarted);
    GPUBOX_FAIL("pass ", pass, ": another trainer of the job found a server restart in it");
  }
  if (stopped) {
    if (data.stream != nullptr) data.stream->abort("the run was asked to stop");
    if (data.stream != nullptr) (void)data.stream->finish();  // the rest is not read
    pass_id_ = pass;
    throw PassStopped(pass, steps_taken, data.steps);
  }
  const double train_seconds = train_timer.seconds();
  if (data.stream != nullptr) {
    data.check_stream(pass);
    report_read(data.stream->load_stats(), share, "pass " + std::to_string(pass),
                config_.dataset.max_malformed_share);
  }
  check_still_owner("pass " + std::to_string(pass));
  PassReport report = pass_report(pass, pass_timer);
  report.extra = {
      {"load_seconds", load_seconds},
      {"train_seconds", train_seconds},
      {"steps", static_cast<double>(steps_taken)},
      {"pass_step_allocations", static_cast<double>(step_allocations() - allocations_before)},
      {"trainer_id", static_cast<double>(env_.trainer_id)},
      {"trainers", static_cast<double>(env_.trainers)},
      {"cached_instances", static_cast<double>(data.stats().cached_instances)},
      {"skipped_lines", static_cast<double>(data.stats().skipped_lines())}};
  training_pass_ = -1;
  return report;
}

PassReport PsTrainer::pass_report(int64_t pass, const Timer& pass_timer) {
  State& s = *state_;
  std::vector<double>& sums = s.metric_sums;
  sums.clear();
  for (auto& worker : s.workers) {
    worker->metrics().compute();
    worker->metrics().accumulate_into(&sums);
  }
  PassReport report;
  report.pass = pass;
  report.seconds = pass_timer.seconds();
  report.cards = s.cards.num_local_cards();
  report.metrics = compute_metrics(sums.data(), s.workers[0]->metrics().buckets());
  // The divergence and dead-output checks judge the job's figures: every trainer the same.
  if (env_.trainers > 1) {
    job_steady_loss(*s.servers, env_.trainer_id, env_.trainers, pass, &report.metrics, [&] {
      meet("ps/steady_loss/" + std::to_string(pass), "at the end of pass " + std::to_string(pass));
    });
  }
  return report;
}

}  // namespace gpubox::trainer::ps_modes
