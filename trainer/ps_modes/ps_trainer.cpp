// PsTrainer's job (ps_trainer.hpp): connecting the servers, the job's start, the barriers of
// every trainer, train()'s epochs; the passes are in ps_trainer_pass.cpp, the telling of a
// failure in ps_trainer_telling.cpp.
#include "trainer/ps_modes/ps_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/dense_table.hpp"
#include "table/io/model_manifest.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/engine/evaluation_memory.hpp"
#include "trainer/engine/job_agreement.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/ps_modes/job_steady_loss.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_step_hooks.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/ps_modes/sync_barriers.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/dense_state.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;
using table::server::RemoteHostTier;

// What trainer 0 tells the others after a part only it runs (a save, a load): {1 when it
// succeeded, 2 when it failed on a server restart (kRestartOutcome), else 0; the pass it goes on
// with; the job's nonce as two floats (trainer_zero_job_floats)}.
constexpr const char* kOutcomeTable = "ps_outcome";
// Where trainer 0's log is, named where the others fail because of it.
constexpr const char* kTrainerZeroLog = "log/workerlog.0 under scripts/launch.sh";
constexpr float kRestartOutcome = 2.0f;
// The job's id, drawn by trainer 0 at the job's start: 4 floats of 16 bits each (exact in a
// float). A sync job's (MergedPushes::join_job), or the token an async or geo job that recovers
// from saves writes into its save folder (check_shared_saves).
// Its wire name stays the sync job's ("ps_sync_job"): a server that served a job of an earlier
// build keeps that table, and a new name would take one more of its kMaxDenseTables.
constexpr const char* kJobTokenTable = "ps_sync_job";
// Both in kJobDenseTables (ps_trainer_state.hpp), which counts them against kMaxDenseTables.
static_assert(std::string_view(kJobDenseTables[9]) == kOutcomeTable &&
              std::string_view(kJobDenseTables[10]) == kJobTokenTable);
// The token's file in runner.model_save_path while the job starts (hidden: a data folder skips
// it as it skips every hidden entry).
constexpr const char* kJobTokenFile = ".gpubox_job_token";

std::vector<float> job_id_to_floats(uint64_t job) {
  std::vector<float> out(4);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>((job >> (16 * i)) & 0xffffu);
  }
  return out;
}

uint64_t job_id_from_floats(const std::vector<float>& values) {
  uint64_t job = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    job |= static_cast<uint64_t>(std::lround(values[i]) & 0xffff) << (16 * i);
  }
  return job;
}

uint64_t draw_job_id() {
  std::random_device seed;
  return (uint64_t{seed()} << 32) ^ seed();
}

std::unique_ptr<RemoteHostTier> connect_servers(const TrainerConfig& config,
                                                const TrainerEnv& env) {
  GPUBOX_EXPECTS(!env.servers.empty(),
                 "runner.sync_mode: ", name_of(config::kSyncModeNames, config.runner.sync_mode),
                 " trains against gpubox_server processes: name them in "
                 "PADDLE_PSERVERS_IP_PORT_LIST (scripts/launch.sh --server_num S --worker_num W "
                 "starts servers and trainers; its --gpus, Collective mode, trains a config of "
                 "runner.use_fleet without runner.sync_mode: configs/config_collective.yaml); "
                 "--mode infer or export of such a job's save on one machine: add "
                 "-o runner.sync_mode=gpubox");
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

PsTrainer::PsTrainer(TrainerConfig config, TrainerEnv env, OrderHook order_hook)
    : config_(std::move(config)), env_(std::move(env)), order_hook_(std::move(order_hook)) {
  GPUBOX_EXPECTS(config_.runner.sync_mode != SyncMode::kGpubox,
                 "PsTrainer runs the async, sync and geo modes");
  GPUBOX_EXPECTS(env_.trainers >= 1 && env_.trainer_id >= 0 && env_.trainer_id < env_.trainers,
                 "PADDLE_TRAINER_ID=", env_.trainer_id, " is not in [0, ", env_.trainers_from, "=",
                 env_.trainers, ")");
  state_ = std::make_unique<State>(
      State{device::CardSet::from_list(thread_cards(config_, env_), 0, 1, 1),
            nullptr,
            {},
            {},
            nullptr,
            {},
            nullptr,
            {},
            nullptr,
            nullptr,
            false,
            0,
            nullptr});
  State& s = *state_;
  check_evaluation_batch(s.cards, config_);
  publish_ps_mode(env_, config_.runner.sync_mode);  // a gpubox-mode trainer of the job: named
  s.servers = connect_servers(config_, env_);
  make_workers();
  s.lineage = std::make_unique<SaveLineage>(config_);
  start_job();
  GPUBOX_LOG(INFO) << "runner.sync_mode "
                   << name_of(config::kSyncModeNames, config_.runner.sync_mode) << ": trainer "
                   << env_.trainer_id << " of " << env_.trainers << ", "
                   << s.cards.num_local_cards() << " training threads, servers " << env_.servers;
  const std::string dense_note =
      dense_exchange_note(config_, s.workers.at(0)->model().parameters().size());
  if (!dense_note.empty()) GPUBOX_LOG(INFO) << dense_note;
  if (env_.trainers > 1 && env_.trainer_id == 0) {
    // Unlike the gpubox mode's, where trainer 0's lines are the job's (its metric buffer is
    // all-reduced): said once, so that one trainer's share is not read as the job's.
    GPUBOX_LOG(INFO) << "trainer 0's pass lines and runner.metrics_path hold its own share of "
                        "each pass (examples, ips, auc of the instances it trained); each other "
                        "trainer's are in its own log and beside it as <name>.trainer<N>.jsonl; "
                        "the divergence check judges the job's sums";
  }
}

void PsTrainer::make_workers() {
  State& s = *state_;
  s.workers.clear();  // the old threads' cards are free before the new ones allocate
  for (int t = 0; t < s.cards.num_local_cards(); ++t) {
    s.workers.push_back(
        std::make_unique<PsWorker>(s.cards.card(t), *s.servers, config_, env_.trainer_id));
  }
  s.pushes.reset();
  if (config_.runner.sync_mode == SyncMode::kSync) {
    s.pushes =
        std::make_unique<MergedPushes>(s.cards.num_local_cards(), s.servers->layout().push_dim());
  }
}

void PsTrainer::start_job(bool recovery) {
  State& s = *state_;
  // A restart found or agreed on in an earlier job of this object is not this job's.
  restart_agreed_ = false;
  training_pass_ = -1;
  restarts_found_.clear();
  // A recovery keeps the marks (PsPeerWatch::reset), and so what this trainer marked.
  if (!recovery) s.failure_marked = false;
  // The job's start: its own dense table and zeroed sync tables, whatever an earlier job on
  // these servers (another model, another trainer count) left there; nobody reads them before.
  // (The averaged step's gradient tables need nothing here: each step's first writer overwrites
  // its table whole, before anyone adds to it or reads it: PsWorker::add_gradients.)
  const bool sums_steps = s.pushes != nullptr && env_.trainers > 1;
  // At the job's first start, the trainers compare their settings (ps_job_settings.hpp): the
  // training threads too where they shape the job (sync: one step of every thread; geo: deltas
  // scaled by them), not in async, where each trainer's Hogwild threads are its own.
  const bool agrees = !recovery && env_.trainers > 1;
  const bool threads_shape_job = config_.runner.sync_mode != SyncMode::kAsync;
  const JobSettings settings =  // (lists the data: not again at each recovery)
      agrees ? job_settings(config_, env_,
                            threads_shape_job ? "training threads (runner.thread_num)" : "",
                            s.cards.num_local_cards(), threads_shape_job)
             : JobSettings{};
  on_trainer_zero(
      [&] {
        // The servers are this job's before it writes its tables there. Beats as the peer
        // watch's, and at least every 2 s (another job's start waits 2.5 beats for them).
        if (s.owner == nullptr) {
          s.owner = std::make_unique<ServersOwner>(
              *s.servers, std::min(config_.runner.peer_timeout_s / 5, 2.0));
        } else {
          s.owner->reclaim();
        }
        PsWorker& first = *s.workers[0];
        first.card().activate();
        std::vector<float> dense = first.model().parameters().values_to_host();
        throw_if_error(
            s.servers->dense(DenseAction::kWrite, kDenseTableName, &dense, dense_call_of_part())
                .with_context("writing the servers' dense table"));
        std::vector<float> zeros(static_cast<std::size_t>(env_.trainers), 0.0f);
        throw_if_error(
            s.servers->dense(DenseAction::kWrite, kBatchesTable, &zeros)
                .with_context("resetting the servers' table " + std::string(kBatchesTable)));
        throw_if_error(SyncBarriers::reset(*s.servers, env_.trainers));
        zeros = steady_loss_table_zeros(env_.trainers);
        throw_if_error(
            s.servers->dense(DenseAction::kWrite, kSteadyLossTable, &zeros)
                .with_context("resetting the servers' table " + std::string(kSteadyLossTable)));
        // A recovery keeps the failure marks: one made just before it is not wiped.
        throw_if_error(PsPeerWatch::reset(*s.servers, env_.trainers, recovery));
        throw_if_error(PsPassStop::reset(*s.servers, env_.trainers));
        throw_if_error(reset_restart_votes());
        if (agrees) throw_if_error(write_settings_table(*s.servers, env_.trainers, settings));
        if (sums_steps) {
          std::vector<float> job = job_id_to_floats(draw_job_id());
          throw_if_error(s.servers->dense(DenseAction::kWrite, kJobTokenTable, &job)
                             .with_context("writing the sync job's id"));
        }
      },
      "ps/start", "to start the job");
  if (agrees) {
    check_settings(*s.servers, env_.trainer_id, env_.trainers, settings,
                   [this](const std::string& name, const std::string& what) { meet(name, what); });
  }
  // A sync job of several trainers: every trainer's pushes of a step are parts of the job's step,
  // summed by the servers before one update (MergedPushes::join_job).
  if (sums_steps) {
    if (order_hook_) order_hook_("ps/start: read the job's id");
    std::vector<float> job(4, 0.0f);
    throw_if_error(s.servers->dense(DenseAction::kRead, kJobTokenTable, &job)
                       .with_context("reading the sync job's id"));
    s.pushes->join_job(job_id_from_floats(job), env_.trainer_id, env_.trainers);
  }
  for (auto& worker : s.workers) {
    worker->card().activate();
    worker->sync_dense(0.0f);
  }
  s.batches_seen.assign(static_cast<std::size_t>(env_.trainers), 0.0f);
}

void PsTrainer::agree_on_start(const std::optional<SavePoint>& resume, const std::string& origin) {
  (void)resume;  // load() checks that every trainer loads the same save
  (void)origin;
  const RunnerConfig& runner = config_.runner;
  // A recovery from a server restart reloads trainer 0's saves on every trainer (recover).
  const bool recovers = repairs_together() && runner.resume != ResumeMode::kOff &&
                        !runner.model_save_path.empty() && runner.save_mode != SaveKind::kNone;
  if (recovers) check_shared_saves();
}

void PsTrainer::check_shared_saves() {
  const std::string& folder = config_.runner.model_save_path;
  const std::string file = (std::filesystem::path(folder) / kJobTokenFile).string();
  struct RemoveToken {  // trainer 0's, once every trainer read it (or failed to)
    const std::string& file;
    const bool writer;
    ~RemoveToken() {
      std::error_code ignored;
      if (writer) std::filesystem::remove(file, ignored);
    }
  } remove{file, env_.trainer_id == 0};
  on_trainer_zero([&] { write_job_token(file); }, "ps/save_folder",
                  "to write a token into runner.model_save_path");
  // A trainer that does not see the token meets the others before it fails, its reason marked,
  // so that they stop at that meeting naming it.
  const std::string name = "ps/save_folder_seen";
  const std::string what = "once every trainer read the token in runner.model_save_path";
  if (env_.trainer_id != 0) {
    try {
      read_job_token(file);
    } catch (const std::exception&) {
      fail_at_meeting(std::current_exception(), name, what);
    }
  }
  meet(name, what);
  for (int w = 1; w < env_.trainers; ++w) {
    throw_if_marked(w,
                    "trainer " + std::to_string(env_.trainer_id) + " of " +
                        std::to_string(env_.trainers) + ", meeting the others " + what +
                        ": trainer " + std::to_string(w) + " failed, so the job stops",
                    std::nullopt);
  }
}

void PsTrainer::write_job_token(const std::string& file) {
  // A sync job of several trainers has its token already: the job's id, which every trainer read
  // after the start's meeting and sums its steps under. Another value written into that table
  // would put a trainer that reads it late into another job (its steps then never summed).
  const bool sums_steps = state_->pushes != nullptr && env_.trainers > 1;
  std::vector<float> job(4, 0.0f);
  if (sums_steps) {
    throw_if_error(state_->servers->dense(DenseAction::kRead, kJobTokenTable, &job)
                       .with_context("reading the sync job's id"));
  } else {
    job = job_id_to_floats(draw_job_id());
  }
  const uint64_t token = job_id_from_floats(job);
  std::ofstream out(file);
  out << token << "\n";
  // A full or over-quota network mount reports it at the close (ENOSPC, EDQUOT).
  out.close();
  GPUBOX_EXPECTS(!out.fail(), "cannot write the job's token into ", file,
                 " (runner.model_save_path: the folder missing, not writable, full or over "
                 "its quota?)");
  if (sums_steps) return;
  throw_if_error(state_->servers->dense(DenseAction::kWrite, kJobTokenTable, &job)
                     .with_context("writing the job's token"));
}

void PsTrainer::read_job_token(const std::string& file) {
  std::vector<float> job(4, 0.0f);
  throw_if_error(state_->servers->dense(DenseAction::kRead, kJobTokenTable, &job)
                     .with_context("reading the job's token"));
  // A network mount may show trainer 0's new file a moment late (attribute caching): a few
  // reads over about 2 s before it counts as missing.
  constexpr int kAttempts = 8;
  uint64_t seen = 0;
  bool read = false;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    read = static_cast<bool>(std::ifstream(file) >> seen);
    if (read && seen == job_id_from_floats(job)) return;
  }
  GPUBOX_FAIL("trainer ", env_.trainer_id, " of ", env_.trainers, ": runner.model_save_path '",
              config_.runner.model_save_path,
              "' does not hold the token trainer 0 wrote there as the job started (", file,
              read ? " holds another job's" : " cannot be read", "): the trainers of an ",
              name_of(config::kSyncModeNames, config_.runner.sync_mode),
              " job with runner.resume must share that folder (a shared mount at the same path), "
              "since a recovery from a server restart reloads trainer 0's saves on every trainer "
              "(with runner.resume off, the job stops at a server restart instead)");
}

PsTrainer::~PsTrainer() = default;

int PsTrainer::threads() const { return state_->cards.num_local_cards(); }

std::size_t PsTrainer::geo_rows() const {
  std::size_t rows = 0;
  for (const auto& worker : state_->workers) rows += worker->geo_rows();
  return rows;
}

std::vector<float> PsTrainer::dense_values() const {
  state_->workers.at(0)->card().activate();
  return state_->workers.at(0)->model().parameters().values_to_host();
}

void PsTrainer::on_trainer_zero(const std::function<void()>& part, const std::string& name,
                                const std::string& what) {
  State& s = *state_;
  // Trainer 0 draws the job's nonce; the others learn it from trainer 0's outcome of the first
  // part (the job's start, short: the meeting's bound in all; read_outcome_of_trainer_zero).
  if (env_.trainer_id == 0 && trainer_zero_parts_.job == 0) {
    trainer_zero_parts_.job = draw_trainer_zero_job();
  }
  // Counted from 1 again in each train() run and each recovery of it, which every trainer reaches
  // together: a part one trainer skipped on its way to a recovery shifts no count after it
  // (TrainerZeroParts).
  const TrainerZeroPart number = trainer_zero_parts_.next();
  const double collective_s = config_.runner.collective_timeout_s;
  const double server_s = config_.host_tier.remote.deadline_s;
  if (env_.trainers > 1 && env_.trainer_id != 0) {
    // Before the barrier, whose wait is bounded by runner.collective_timeout_s in all: trainer
    // 0's part that moves is waited for however long it takes.
    // Trainer 0 that failed before it reached the servers (a gpubox-mode trainer of this job,
    // refused naming the modes) says so in the job's rendezvous folder, when it has one (a part
    // after the job's start: the first is the meeting's alone, which names it at its end).
    wait_for_trainer_zero(
        *s.servers,
        TrainerZeroWait::of(number, what, collective_s, server_s, kTrainerZeroLog, [this, &s] {
          const std::string lost = s.watch != nullptr ? s.watch->lost() : "";
          return lost.empty() ? failure_told(env_, 0) : lost;
        }));
  }
  if (env_.trainer_id == 0) {
    const auto shown_part = [&] {
      std::optional<TrainerZeroWork> shown;
      if (env_.trainers > 1) {
        shown.emplace(*s.servers, trainer_zero_publishes_, number,
                      TrainerZeroWork::interval_for(collective_s),
                      TrainerZeroWork::call_deadline_for(collective_s, server_s),
                      TrainerZeroWork::end_bound_for(collective_s, server_s),
                      [&s] { return s.watch != nullptr ? s.watch->lost() : ""; });
      }
      part();
    };
    bool restarted = false;
    bool first_restarted = false;  // the first server, which holds the barrier below
    std::exception_ptr failed = run_part_of_trainer_zero(shown_part, &restarted, &first_restarted);
    // The others stop at the barrier below naming what failed (read from the mark); after a
    // restart they go to recover's meeting instead. After a restart of the first server nobody
    // comes to the barrier on its new instance (the others' calls to the old one failed), and
    // this trainer goes to recover's meeting at once.
    if (failed) {
      fail_at_meeting(failed, name, what, -1.0, /*marks=*/!restarted,
                      /*meets=*/!first_restarted);
    }
  }
  meet(name, what);
  if (env_.trainer_id != 0) read_outcome_of_trainer_zero(what);
}

std::exception_ptr PsTrainer::run_part_of_trainer_zero(const std::function<void()>& part,
                                                       bool* restarted, bool* first_restarted) {
  State& s = *state_;
  std::exception_ptr failed;
  try {
    part();
  } catch (...) {
    failed = std::current_exception();
  }
  if (env_.trainers == 1) return failed;
  // A part that failed on a server restart tells the others so: the job goes back to the last
  // save together (recover).
  *restarted = failed && !SaveLineage::describe_restarts(*s.servers).empty();
  std::vector<float> outcome = {failed ? (*restarted ? kRestartOutcome : 0.0f) : 1.0f,
                                static_cast<float>(pass_id_)};
  // The job's nonce, which the others learn here (after the job's first part).
  for (float half : trainer_zero_job_floats(trainer_zero_parts_.job)) outcome.push_back(half);
  // The restarts are accepted now (this trainer's threads send nothing during a save or a
  // reload; recover reloads the servers), so that the outcome goes to the first server as it is
  // now. The others hear of a restart of the first server at their own call to it (the barrier
  // after the part, cut or refused), not from the outcome, and go to recover's meeting.
  if (*restarted && repairs_together()) {
    *first_restarted = s.servers->restart_pending(0);
    restarts_found_ = SaveLineage::describe_restarts(*s.servers);
    restart_agreed_ = true;
    s.servers->accept_restarts();
  }
  const Status told = s.servers->dense(DenseAction::kWrite, kOutcomeTable, &outcome);
  if (!failed) throw_if_error(told.with_context("telling the other trainers the outcome"));
  return failed;
}

void PsTrainer::read_outcome_of_trainer_zero(const std::string& what) {
  std::vector<float> outcome(4, 0.0f);
  throw_if_error(state_->servers->dense(DenseAction::kRead, kOutcomeTable, &outcome)
                     .with_context("reading trainer 0's outcome " + what));
  // Trainer 0 writes its outcome after every part, before the meeting this trainer just passed:
  // the nonce is this job's (a table trainer0_work an earlier job left on the servers is not).
  if (trainer_zero_parts_.job == 0) {
    trainer_zero_parts_.job = trainer_zero_job_of(outcome[2], outcome[3]);
  }
  if (outcome[0] == kRestartOutcome && repairs_together()) {
    restart_agreed_ = true;  // recover() goes back to the last save with trainer 0
    GPUBOX_FAIL("trainer 0 found a server restart ", what);
  }
  if (outcome[0] != 1.0f) {
    throw_if_marked(0, "trainer 0 failed " + what,
                    std::string(" (its log, ") + kTrainerZeroLog + ", names why)");
  }
  GPUBOX_EXPECTS(std::lround(outcome[1]) == pass_id_, "trainer 0 goes on with pass ",
                 std::lround(outcome[1]), ", trainer ", env_.trainer_id, " with pass ", pass_id_,
                 ": every trainer must see the same saves (a folder they share) and "
                 "runner.resume, --load and runner.model_init_path alike");
}

std::vector<PassReport> PsTrainer::train(const std::string& start_from, const RunHooks& hooks) {
  State& s = *state_;
  // First: a train() that throws before its watch exists is a run too (every trainer counts
  // its train() calls alike).
  const int run = ++s.run;
  // The stage of trainer 0's parts: this run's, until it ends however it ends.
  trainer_zero_parts_.begin_run(run);
  struct EndRun {
    TrainerZeroParts& parts;
    ~EndRun() { parts.end_run(); }
  } end_run{trainer_zero_parts_};
  // A lost trainer or server ends the job within runner.peer_timeout_s, naming it; the watch
  // stops beating when train() ends, by an error too (the others then see this trainer lost).
  std::unique_ptr<PsPeerWatch> watch;
  if (env_.trainers > 1 && s.failure_marked) {
    // A failure marked by an earlier train() of this object (the job's tables are reset only as
    // it starts): taken back before this trainer's watch starts.
    throw_if_error(PsPeerWatch::clear_failure(*s.servers, env_.trainer_id, env_.trainers));
  }
  s.failure_marked = false;
  if (env_.trainers > 1) {
    PsPeerWatchOptions options;
    options.peer_timeout_s = config_.runner.peer_timeout_s;
    options.run = run;
    // A trainer that has not begun this train() when a meeting would have given up on it, in
    // the first train() only (the only one that follows a meeting of every trainer: ps/start).
    options.begin_timeout_s = config_.runner.collective_timeout_s;
    // A trainer whose begun flag went with a restarted first server beats again once it accepts
    // the restart, at the latest as it comes to the recovery's meeting, which waits
    // kRecoveryWaits x runner.collective_timeout_s for it. The watch counts from when it found
    // the loss, earlier than that meeting's start (before it, the recovery drops the training
    // threads, looks for the restarts, an attempt of runner.server_connect_timeout_s per server
    // at most, and goes back to the last save), and sees a flag set again up to a beat
    // (runner.peer_timeout_s / 5) and a read late: one more collective_timeout_s and a
    // peer_timeout_s, so that a trainer the meeting would still wait for is not named.
    options.after_loss_timeout_s =
        (kRecoveryWaits + 1) * config_.runner.collective_timeout_s + config_.runner.peer_timeout_s;
    watch = std::make_unique<PsPeerWatch>(*s.servers, env_.trainer_id, env_.trainers, options);
  }
  s.watch = watch.get();
  struct Unwatch {  // however train() ends
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

// A cache made once is kept (a later train() or evaluate may still be served by it).
void PsTrainer::plan_pass_cache(int64_t loads) {
  if (state_->pass_cache == nullptr) {
    state_->pass_cache = make_pass_cache(config_, env_.trainers, loads);
  }
}

const dataset::PassDataCache* PsTrainer::pass_cache() const { return state_->pass_cache.get(); }

const std::atomic<bool>* PsTrainer::alone_stop_flag() const {
  return env_.trainers == 1 ? state_->hooks.stop_flag : nullptr;
}

Status PsTrainer::load_stoppable(dataset::InMemoryDataset& data, const std::string& what,
                                 int64_t pass) const {
  const std::atomic<bool>* stop = alone_stop_flag();
  data.set_stop_flag(stop);
  data.set_pass_cache(state_->pass_cache.get());
  const Status loaded = data.load_into_memory();
  if (loaded.code() == Status::Code::kAborted && stop != nullptr && stop->load()) {
    throw PassStopped(pass, what);
  }
  return loaded;
}

std::size_t PsTrainer::metric_buckets() const { return state_->workers[0]->metrics().buckets(); }

}  // namespace gpubox::trainer::ps_modes
