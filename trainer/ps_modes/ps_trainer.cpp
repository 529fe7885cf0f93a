#include "trainer/ps_modes/ps_trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "common/timer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/dense_table.hpp"
#include "table/io/model_manifest.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/ps_modes/job_steady_loss.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_step_hooks.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/ps_modes/thread_barrier.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/dense_state.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;
using table::server::RemoteHostTier;

// Sync mode's small tables on the servers: per trainer, the barriers it reached (a timeout names
// the trainers behind) and the batches of each pass (so every trainer takes the same steps).
constexpr const char* kProgressTable = "ps_sync_progress";
constexpr const char* kBatchesTable = "ps_sync_batches";
// What trainer 0 tells the others after a part only it runs (a save, a load): {1 when it
// succeeded, else 0; the pass it goes on with}.
constexpr const char* kOutcomeTable = "ps_outcome";

std::vector<float> one_hot(int size, int index, float value) {
  std::vector<float> v(static_cast<std::size_t>(size), 0.0f);
  v.at(static_cast<std::size_t>(index)) = value;
  return v;
}

std::unique_ptr<RemoteHostTier> connect_servers(const TrainerConfig& config,
                                                const TrainerEnv& env) {
  GPUBOX_EXPECTS(!env.servers.empty(),
                 "runner.sync_mode: ", name_of(config::kSyncModeNames, config.runner.sync_mode),
                 " trains against gpubox_server processes: name them in "
                 "PADDLE_PSERVERS_IP_PORT_LIST (scripts/launch.sh starts servers and trainers)");
  table::server::RemoteHostTierOptions options;
  options.endpoints = env.servers;
  options.config = config.sparse;
  options.deadline_s = config.host_tier.remote.deadline_s;
  options.connect_timeout_s = config.host_tier.remote.connect_timeout_s;
  options.connections_per_endpoint = config.host_tier.remote.connections_per_endpoint;
  const auto token_file = table::server::client_token_file(config.runner.auth_token_file);
  if (!token_file.path.empty()) {
    auto token = table::server::read_auth_token_file(token_file.path, token_file.source);
    if (!token.ok()) GPUBOX_FAIL(token.status().message());
    options.auth_token = std::move(token).value();
  }
  auto servers = RemoteHostTier::connect(std::move(options));
  if (!servers.ok()) {
    GPUBOX_FAIL("cannot reach the servers ", env.servers, ": ", servers.status().to_string());
  }
  return std::move(servers).value();
}

// The cards of the training threads: runner.thread_num simulated cards on the cpu backend, the
// selected cards on cuda.
std::string thread_cards(const TrainerConfig& config, const TrainerEnv& env) {
#if defined(GPUBOX_BACKEND_CUDA)
  (void)config;
  return env.selected_cards;
#else
  (void)env;
  std::string list;
  for (int t = 0; t < config.dataset.thread_num; ++t) list += (t ? "," : "") + std::to_string(t);
  return list;
#endif
}

}  // namespace

PsTrainer::PsTrainer(TrainerConfig config, TrainerEnv env)
    : config_(std::move(config)), env_(std::move(env)) {
  GPUBOX_EXPECTS(config_.runner.sync_mode != SyncMode::kGpubox,
                 "PsTrainer runs the async, sync and geo modes");
  GPUBOX_EXPECTS(env_.trainers >= 1 && env_.trainer_id >= 0 && env_.trainer_id < env_.trainers,
                 "PADDLE_TRAINER_ID=", env_.trainer_id,
                 " is not in [0, PADDLE_TRAINERS_NUM=", env_.trainers, ")");
  state_ = std::make_unique<State>(
      State{device::CardSet::from_list(thread_cards(config_, env_), 0, 1, 1),
            nullptr,
            {},
            {},
            nullptr,
            {},
            nullptr,
            {}});
  State& s = *state_;
  s.servers = connect_servers(config_, env_);
  for (int t = 0; t < s.cards.num_local_cards(); ++t) {
    s.workers.push_back(std::make_unique<PsWorker>(s.cards.card(t), *s.servers, config_));
  }
  s.lineage = std::make_unique<SaveLineage>(config_);
  // The job's start: its own dense table and zeroed sync tables, whatever an earlier job on
  // these servers (another model, another trainer count) left there; nobody reads them before.
  on_trainer_zero(
      [&] {
        PsWorker& first = *s.workers[0];
        first.card().activate();
        std::vector<float> dense = first.model().parameters().values_to_host();
        throw_if_error(s.servers->dense(DenseAction::kWrite, kDenseTableName, &dense)
                           .with_context("writing the servers' dense table"));
        for (const char* name : {kProgressTable, kBatchesTable}) {
          std::vector<float> zeros(static_cast<std::size_t>(env_.trainers), 0.0f);
          throw_if_error(s.servers->dense(DenseAction::kWrite, name, &zeros)
                             .with_context("resetting the servers' table " + std::string(name)));
        }
        std::vector<float> zeros = steady_loss_table_zeros(env_.trainers);
        throw_if_error(
            s.servers->dense(DenseAction::kWrite, kSteadyLossTable, &zeros)
                .with_context("resetting the servers' table " + std::string(kSteadyLossTable)));
        throw_if_error(PsPeerWatch::reset(*s.servers, env_.trainers));
        throw_if_error(PsPassStop::reset(*s.servers, env_.trainers));
      },
      "ps/start", "to start the job");
  for (auto& worker : s.workers) {
    worker->card().activate();
    worker->sync_dense(0.0f);
  }
  s.batches_seen.assign(static_cast<std::size_t>(env_.trainers), 0.0f);
  GPUBOX_LOG(INFO) << "runner.sync_mode "
                   << name_of(config::kSyncModeNames, config_.runner.sync_mode) << ": trainer "
                   << env_.trainer_id << " of " << env_.trainers << ", "
                   << s.cards.num_local_cards() << " training threads, servers " << env_.servers;
  const std::string dense_note =
      dense_exchange_note(config_, s.workers.at(0)->model().parameters().size());
  if (!dense_note.empty()) GPUBOX_LOG(INFO) << dense_note;
}

PsTrainer::~PsTrainer() = default;

int PsTrainer::threads() const { return state_->cards.num_local_cards(); }

std::vector<float> PsTrainer::dense_values() const {
  state_->workers.at(0)->card().activate();
  return state_->workers.at(0)->model().parameters().values_to_host();
}

void PsTrainer::meet(const std::string& name, const std::string& what) {
  if (env_.trainers == 1) return;
  throw_if_error(
      state_->servers
          ->barrier(name, static_cast<uint32_t>(env_.trainers), config_.runner.collective_timeout_s)
          .with_context("trainer " + std::to_string(env_.trainer_id) + ": waiting for all " +
                        std::to_string(env_.trainers) + " trainers " + what +
                        " (runner.collective_timeout_s=" +
                        std::to_string(config_.runner.collective_timeout_s) +
                        " s): a trainer died or is stuck"));
}

void PsTrainer::on_trainer_zero(const std::function<void()>& part, const std::string& name,
                                const std::string& what) {
  State& s = *state_;
  std::exception_ptr failed;
  if (env_.trainer_id == 0) {
    try {
      part();
    } catch (...) {
      failed = std::current_exception();
    }
    if (env_.trainers > 1) {
      std::vector<float> outcome = {failed ? 0.0f : 1.0f, static_cast<float>(pass_id_)};
      const Status told = s.servers->dense(DenseAction::kWrite, kOutcomeTable, &outcome);
      if (!failed) throw_if_error(told.with_context("telling the other trainers the outcome"));
    }
  }
  if (failed) {
    try {
      meet(name, what);  // the others learn of the failure now, not at their timeout
    } catch (const Error&) {
    }
    std::rethrow_exception(failed);
  }
  meet(name, what);
  if (env_.trainer_id == 0) return;
  std::vector<float> outcome(2, 0.0f);
  throw_if_error(s.servers->dense(DenseAction::kRead, kOutcomeTable, &outcome)
                     .with_context("reading trainer 0's outcome " + what));
  GPUBOX_EXPECTS(outcome[0] == 1.0f, "trainer 0 failed ", what,
                 " (its log, log/workerlog.0 under scripts/launch.sh, names why)");
  GPUBOX_EXPECTS(std::lround(outcome[1]) == pass_id_, "trainer 0 goes on with pass ",
                 std::lround(outcome[1]), ", trainer ", env_.trainer_id, " with pass ", pass_id_,
                 ": every trainer must see the same saves (a folder they share) and "
                 "runner.resume, --load and runner.model_init_path alike");
}

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
    report_read(data.held->load_stats(), share, "pass " + std::to_string(pass));
    if (config_.runner.shuffle) data.held->local_shuffle(config_.runner.seed * 1000003 + pass);
    data.batches = data.held->num_batches_per_card(threads);
  }
  data.steps = data.batches;
  return data;
}

void PsTrainer::sync_barrier(int64_t pass, const std::string& name, const std::string& what) {
  State& s = *state_;
  // Each arrival is counted first in kProgressTable, so a timeout names the trainers behind the
  // furthest one.
  std::vector<float> arrival = one_hot(env_.trainers, env_.trainer_id, 1.0f);
  throw_if_error(s.servers->dense(DenseAction::kAdd, kProgressTable, &arrival));
  const Status st =
      s.servers->barrier("ps_sync/" + std::to_string(pass) + "/" + name,
                         static_cast<uint32_t>(env_.trainers), config_.runner.collective_timeout_s);
  if (st.ok()) return;
  std::vector<float> progress(static_cast<std::size_t>(env_.trainers), 0.0f);
  std::string missing;
  if (s.servers->dense(DenseAction::kRead, kProgressTable, &progress).ok()) {
    const float furthest = *std::max_element(progress.begin(), progress.end());
    for (int w = 0; w < env_.trainers; ++w) {
      if (progress[static_cast<std::size_t>(w)] < furthest) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(w);
      }
    }
  }
  GPUBOX_FAIL(
      "sync mode, pass ", pass, ", ", what, ": not every one of the ", env_.trainers,
      " trainers arrived within runner.collective_timeout_s=", config_.runner.collective_timeout_s,
      " s", missing.empty() ? std::string() : " (missing: trainer " + missing + ")",
      ": a trainer died or is stuck; ", st.to_string());
}

std::size_t PsTrainer::agree_sync_steps(int64_t pass, std::size_t batches) {
  State& s = *state_;
  std::vector<float> mine = one_hot(env_.trainers, env_.trainer_id, static_cast<float>(batches));
  throw_if_error(s.servers->dense(DenseAction::kAdd, kBatchesTable, &mine));
  sync_barrier(pass, "count", "counting batches");
  std::vector<float> all(static_cast<std::size_t>(env_.trainers), 0.0f);
  throw_if_error(s.servers->dense(DenseAction::kRead, kBatchesTable, &all));
  std::size_t steps = batches;
  for (std::size_t w = 0; w < all.size(); ++w) {
    steps = std::max(steps, static_cast<std::size_t>(std::lround(all[w] - s.batches_seen[w])));
  }
  s.batches_seen = all;
  sync_barrier(pass, "counted", "agreeing on the steps");
  return steps;
}

std::size_t PsTrainer::train_threads(PassData& data, int64_t pass, PsPassStop& stop) {
  State& s = *state_;
  const SyncMode mode = config_.runner.sync_mode;
  const int threads = s.cards.num_local_cards();
  // async and geo take a stream's batches until it ends; everything else `steps` of them.
  const bool open_ended = data.stream != nullptr && mode != SyncMode::kSync;
  const auto next_batch = [&](int t, std::size_t b, dataset::Batch* batch) {
    return data.next_batch(t, threads, b, open_ended, pass, batch);
  };
  ThreadBarrier local(threads);
  // sync averages the step's gradients of every thread of the job; geo averages the threads'
  // local moves since the last sync, dense and sparse, as Paddle's GeoCommunicator does (it
  // scales each trainer's delta by 1 / trainers); async adds each thread's change as it comes.
  const float dense_scale =
      mode == SyncMode::kAsync ? 1.0f : 1.0f / static_cast<float>(env_.trainers * threads);
  const auto dense_every = static_cast<std::size_t>(
      mode == SyncMode::kGeo ? config_.runner.geo_step : config_.runner.dense_sync_steps);
  // Every trainer's updates of a step are on the servers before anyone's next pull (sync).
  // At step barriers (`b` < data.steps) thread 0 also agrees on a stop (PsPassStop).
  const auto meet_all = [&](int t, const std::string& name, const std::string& what,
                            std::size_t b) {
    local.wait();  // every thread's updates of this step are on the servers
    if (t == 0 && b < data.steps) stop.before_sync_barrier(b);
    if (t == 0) sync_barrier(pass, name, what);
    if (t == 0 && b < data.steps) stop.after_sync_barrier(b, b + 1 == data.steps);
    local.wait();  // ... and every trainer's
  };
  PsProgress progress(s.hooks, pass, data.steps, config_.runner.print_interval, env_, threads);
  std::size_t steps_taken = 0;  // thread 0's
  s.cards.run_on_cards(
      [&](device::Card& card) {
        const int t = card.local_index();
        PsWorker& worker = *s.workers[static_cast<std::size_t>(t)];
        worker.metrics().reset();
        dataset::Batch batch;
        std::size_t b = 0;
        for (;
             (mode == SyncMode::kSync || !stop.stop_before_step(t, b)) && next_batch(t, b, &batch);
             ++b) {
          if (s.watch != nullptr) {
            if (const std::string lost = s.watch->lost(); !lost.empty()) {
              GPUBOX_FAIL("pass ", pass, ", step ", b, ": ", lost);
            }
          }
          worker.train_step(batch, pass, static_cast<int64_t>(b));
          if (t == 0) progress.after_step(b, batch.size(), worker);
          const bool dense_step = (b + 1) % dense_every == 0;
          if (mode == SyncMode::kGeo && dense_step) worker.sync_rows(dense_scale);
          if (dense_step && mode == SyncMode::kAsync) worker.exchange_dense();
          if (dense_step && mode != SyncMode::kAsync) worker.sync_dense(dense_scale);
          if (mode == SyncMode::kSync) {
            meet_all(t, std::to_string(b), "step " + std::to_string(b), b);
            if (dense_step) worker.sync_dense(0.0f);
            if (stop.stopping()) {  // every thread of every trainer after this step
              ++b;
              break;
            }
          }
        }
        // The end of a pass: what is left goes to the servers. In the sync mode every thread of
        // every trainer took the same `steps`, so all agree on whether a partial dense window
        // is left; it is added and adopted behind one more barrier, as a step's.
        if (mode == SyncMode::kGeo) worker.sync_rows(dense_scale);
        if (mode != SyncMode::kSync) worker.sync_dense(dense_scale);
        if (mode == SyncMode::kSync && b % dense_every != 0) {
          worker.sync_dense(dense_scale);
          meet_all(t, "dense", "the pass's last dense window", data.steps);
          worker.sync_dense(0.0f);
        }
        if (t == 0) steps_taken = b;
      },
      [&](const std::string& why) {
        local.abort(why);
        if (data.stream != nullptr) data.stream->abort(why);
      });
  return steps_taken;
}

PassReport PsTrainer::train_pass(const std::vector<std::string>& files) {
  State& s = *state_;
  const int64_t pass = pass_id_++;
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
  if (config_.runner.sync_mode == SyncMode::kSync)
    data.steps = agree_sync_steps(pass, data.batches);
  Timer train_timer;
  std::size_t steps_taken = 0;
  PsPassStop stop(*s.servers, env_.trainer_id, env_.trainers, s.hooks.stop_flag, pass);
  // The steps taken before a stream's failure stay taken: a streamed pass is never whole in
  // memory to be checked first.
  try {
    steps_taken = train_threads(data, pass, stop);
  } catch (const Error&) {
    if (data.stream != nullptr) data.check_stream(pass);
    throw;
  }
  if (stop.pass_stopped([&] {
        meet("ps/stop/" + std::to_string(pass), "at the end of pass " + std::to_string(pass));
      })) {
    if (data.stream != nullptr) data.stream->abort("the run was asked to stop");
    if (data.stream != nullptr) (void)data.stream->finish();  // the rest is not read
    pass_id_ = pass;
    throw PassStopped(pass, steps_taken, data.steps);
  }
  const double train_seconds = train_timer.seconds();
  if (data.stream != nullptr) {
    data.check_stream(pass);
    report_read(data.stream->load_stats(), share, "pass " + std::to_string(pass));
  }
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
  // The divergence check judges the job's steady loss: every trainer the same figure.
  if (env_.trainers > 1) {
    report.metrics.steady = job_steady_loss(*s.servers, env_.trainer_id, env_.trainers, pass,
                                            report.metrics.steady, [&] {
                                              meet("ps/steady_loss/" + std::to_string(pass),
                                                   "at the end of pass " + std::to_string(pass));
                                            });
  }
  report.extra = {{"load_seconds", load_seconds},
                  {"train_seconds", train_seconds},
                  {"steps", static_cast<double>(steps_taken)},
                  {"trainer_id", static_cast<double>(env_.trainer_id)},
                  {"trainers", static_cast<double>(env_.trainers)},
                  {"skipped_lines", static_cast<double>(data.stats().skipped_lines())}};
  return report;
}

EvalResult PsTrainer::evaluate(const std::vector<std::string>& files, bool keep_predictions) {
  State& s = *state_;
  // Read like the training passes: held whole, or streamed (one consumer: thread 0).
  std::unique_ptr<dataset::InMemoryDataset> held;
  std::unique_ptr<dataset::QueueDataset> stream;
  if (config_.runner.reader_type == ReaderType::kQueueDataset) {
    stream = std::make_unique<dataset::QueueDataset>(config_.dataset);
    stream->set_filelist(files);
    stream->set_batch_size(config_.runner.infer_batch_size);
    stream->start(1);
  } else {
    held = std::make_unique<dataset::InMemoryDataset>(config_.dataset);
    held->set_filelist(files);
    const Status loaded = load_stoppable(*held, "reading the evaluation data", -1);
    if (!loaded.ok()) GPUBOX_FAIL("loading evaluation data: ", loaded.message());
    report_read(held->load_stats(), files, "evaluation data");
    held->set_batch_size(config_.runner.infer_batch_size);
  }
  EvalResult result;
  const std::atomic<bool>* stop = alone_stop_flag();
  bool stopped = false;
  s.cards.run_on_cards(
      [&](device::Card& card) {
        if (card.local_index() != 0) return;
        PsWorker& worker = *s.workers[0];
        worker.sync_dense(0.0f);  // the servers' dense table
        worker.metrics().reset();
        dataset::Batch batch;
        const auto step = [&] {
          worker.eval_step(batch);
          if (!keep_predictions || batch.size() == 0) return;
          const std::vector<float> predictions = worker.last_predictions();
          result.labels.insert(result.labels.end(), batch.labels.begin(), batch.labels.end());
          result.predictions.insert(result.predictions.end(), predictions.begin(),
                                    predictions.end());
        };
        // One trainer alone stops between two batches when asked (several: in the next pass).
        const auto go_on = [&] {
          stopped = stop != nullptr && stop->load();
          return !stopped;
        };
        if (stream != nullptr) {
          while (go_on() && stream->next_batch(0, &batch)) step();
        } else {
          const std::size_t batches = held->num_batches_per_card(1);
          for (std::size_t b = 0; b < batches && go_on(); ++b) {
            held->fill_batch(0, 1, b, &batch);
            step();
          }
        }
        result.metrics = worker.metrics().compute();
      },
      [&](const std::string& why) {
        if (stream != nullptr) stream->abort(why);
      });
  if (stopped && stream != nullptr) stream->abort("the run was asked to stop");
  if (stopped && stream != nullptr) (void)stream->finish();
  if (stopped) throw PassStopped(-1, "the evaluation");
  if (stream != nullptr) {
    const Status read = stream->finish();
    if (!read.ok()) GPUBOX_FAIL("reading evaluation data: ", read.message());
    report_read(stream->load_stats(), files, "evaluation data");
  }
  return result;
}

std::vector<PassReport> PsTrainer::train(const std::string& start_from, const RunHooks& hooks) {
  State& s = *state_;
  // A lost trainer or server ends the job within runner.peer_timeout_s, naming it; the watch
  // stops beating when train() ends, by an error too (the others then see this trainer lost).
  std::unique_ptr<PsPeerWatch> watch;
  if (env_.trainers > 1) {
    PsPeerWatchOptions options;
    options.peer_timeout_s = config_.runner.peer_timeout_s;
    watch = std::make_unique<PsPeerWatch>(*s.servers, env_.trainer_id, env_.trainers, options);
  }
  s.watch = watch.get();
  struct Unwatch {
    State& s;
    ~Unwatch() { s.watch = nullptr; }
  } unwatch{s};
  std::vector<PassReport> reports = run_epochs(*this, config_, start_from, loaded_, hooks);
  if (watch) {
    if (const Status told = watch->finish(); !told.ok()) {
      GPUBOX_LOG(WARNING) << told.to_string() << " (training is complete; a trainer still "
                          << "running may report this one lost)";
    }
  }
  return reports;
}

table::HostTier& PsTrainer::host_tier() { return *state_->servers; }

SaveLineage& PsTrainer::lineage() { return *state_->lineage; }

PassReport PsTrainer::train_scheduled_pass(const RunPlan& plan, int64_t pass) {
  pass_id_ = pass;
  return train_pass(plan.files_of(pass));
}

void PsTrainer::accumulate_pass_metrics(std::vector<double>* sums) const {
  const std::vector<double>& last = state_->metric_sums;
  if (sums->empty()) sums->assign(last.size(), 0.0);
  for (std::size_t i = 0; i < last.size(); ++i) (*sums)[i] += last[i];
}

void PsTrainer::set_step_hooks(const StepHooks& hooks) { state_->hooks = hooks; }

const std::atomic<bool>* PsTrainer::alone_stop_flag() const {
  return env_.trainers == 1 ? state_->hooks.stop_flag : nullptr;
}

Status PsTrainer::load_stoppable(dataset::InMemoryDataset& data, const std::string& what,
                                 int64_t pass) const {
  const std::atomic<bool>* stop = alone_stop_flag();
  data.set_stop_flag(stop);
  const Status loaded = data.load_into_memory();
  if (loaded.code() == Status::Code::kAborted && stop != nullptr && stop->load()) {
    throw PassStopped(pass, what);
  }
  return loaded;
}

std::size_t PsTrainer::metric_buckets() const { return state_->workers[0]->metrics().buckets(); }

}  // namespace gpubox::trainer::ps_modes
