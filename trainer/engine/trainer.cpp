#include "trainer/engine/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "dataset/data_files.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/load_report.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/card_setup.hpp"
#include "table/io/model_manifest.hpp"
#include "table/io/save_dir.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/host_tier_factory.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_table.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/engine/pass_pipeline.hpp"
#include "trainer/engine/pass_progress.hpp"
#include "trainer/engine/step_plan.hpp"
#include "trainer/engine/step_times.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/dense_state.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"

namespace gpubox::trainer {
namespace {

// Steps of a pass not counted in its per-step device counts: without the pass's step sizes (a
// stream) the first steps size the buffers and the scratch arena (allocations); later ones
// repeat the same work. The pass report's pass_step_* totals count every step.
constexpr std::size_t kWarmupSteps = 2;

// Bytes each card's memory pool takes from the driver up front (device rule 3): the card-tier
// budget when one is set, else 1 GiB (Card::prewarm_pool caps it by the card's free memory).
std::size_t prewarm_bytes(const TrainerConfig& config) {
  const int64_t budget_mb = config.runner.card_memory_mb;
  return budget_mb > 0 ? static_cast<std::size_t>(budget_mb) << 20 : std::size_t{1} << 30;
}

// The host tier: in-process, or the servers the launcher names (table::make_host_tier), with
// the row rules of every tier (table::sparse_config_from) and the config's host-tier settings.
// Throws naming the servers (and the token) when they cannot be reached.
std::unique_ptr<table::HostTier> open_host_tier(const TrainerConfig& config,
                                                const TrainerEnv& env) {
  table::HostTierConfig host_config = config.host_tier;
  host_config.remote.endpoints = env.servers;
  const auto token_file = table::server::client_token_file(config.runner.auth_token_file);
  if (!env.servers.empty() && !token_file.path.empty()) {
    auto token = table::server::read_auth_token_file(token_file.path, token_file.source);
    if (!token.ok()) GPUBOX_FAIL(token.status().message());
    host_config.remote.auth_token = std::move(token).value();
  }
  auto host = table::make_host_tier(config.sparse, host_config);
  if (!host.ok()) {
    const bool refused = host.status().code() == Status::Code::kPermissionDenied;
    GPUBOX_FAIL("cannot reach the host-tier servers ", env.servers, ": ", host.status().to_string(),
                !refused                  ? ""
                : token_file.path.empty() ? " (they need a token: set runner.auth_token_file "
                                            "or GPUBOX_AUTH_TOKEN_FILE)"
                                          : " (the token of " + token_file.source + " '" +
                                                token_file.path + "' was refused)");
  }
  return std::move(host).value();
}

// Checks that the card tier's budget fits every local card, then has each card's pool take its
// bytes from the driver (device rule 3).
void prepare_card_memory(device::CardSet& cards, const TrainerConfig& config) {
  // The card tier's budget must fit each card beside what NCCL and cuBLAS still take: fail now,
  // naming runner.card_memory_mb, not with an allocation failure passes later.
  for (int c = 0; c < cards.num_local_cards(); ++c) {
    const Status fits = device::check_card_memory_budget(
        config.runner.card_memory_mb,
        device::card_free_bytes(cards.card(c), cards.num_local_cards()),
        device::library_reserve_bytes(cards.total_cards()), cards.card(c).rank());
    if (!fits.ok()) GPUBOX_FAIL(fits.message());
  }
  // Each card's pool takes its bytes from the driver before anything is allocated on it: the
  // card tier's budget-sized stores and the dense model then come out of the pool.
  for (int c = 0; c < cards.num_local_cards(); ++c)
    cards.card(c).prewarm_pool(prewarm_bytes(config));
}

// A failure between steps: none of the pass's (or evaluation's) pending slots is read later:
// their tags may point into locals of the step loop (the progress sink, kept predictions).
struct AbandonUnlessDone {
  CardWorker& worker;
  bool done = false;
  ~AbandonUnlessDone() {
    if (!done) worker.abandon();
  }
};

}  // namespace

using engine_detail::kLocalTierSaves;

Trainer::Trainer(TrainerConfig config, TrainerEnv env)
    : config_(std::move(config)), env_(std::move(env)) {
  if (env_.trainers > 1) {
    GPUBOX_EXPECTS(!env_.rendezvous.empty(), "PADDLE_TRAINERS_NUM=", env_.trainers,
                   ": the trainers meet through a rendezvous store; set "
                   "GPUBOX_RENDEZVOUS=file:///shared/dir (scripts/run_gpubox.sh does)");
    // Refused here, before the job meets, when the config asks for saves or a start from one;
    // save() and load() refuse the same (gpubox_train --load, --mode infer).
    GPUBOX_EXPECTS(
        !env_.servers.empty() || config_.runner.collective ||
            (config_.runner.model_save_path.empty() && config_.runner.model_init_path.empty()),
        "PADDLE_TRAINERS_NUM=", env_.trainers, ": runner.model_save_path / runner.model_init_path",
        kLocalTierSaves);
  }
  state_ = std::make_unique<State>(
      State{device::CardSet::from_list(env_.selected_cards, env_.trainer_id, env_.trainers,
                                       env_.threads_per_card),
            env_.trainers > 1 ? comm::open_rendezvous_store(env_.rendezvous) : nullptr,
            nullptr,
            nullptr,
            nullptr,
            {},
            std::make_unique<SaveLineage>(config_),
            nullptr,
            nullptr,
            nullptr});
  State& s = *state_;
  s.group = comm::make_group(s.cards,
                             std::chrono::milliseconds(static_cast<int64_t>(
                                 std::ceil(config_.runner.collective_timeout_s * 1000.0))),
                             s.store.get(), env_.host);
  s.host = open_host_tier(config_, env_);
  if (env_.trainers > 1) {
    // A lost trainer or server ends the job within runner.peer_timeout_s, naming it.
    PeerWatchOptions watch;
    watch.peer_timeout_s = config_.runner.peer_timeout_s;
    watch.join_timeout_s = config_.runner.collective_timeout_s;
    s.watch = std::make_unique<PeerWatch>(
        *s.group, *s.store, env_, dynamic_cast<table::server::RemoteHostTier*>(s.host.get()),
        watch);
  }
  prepare_card_memory(s.cards, config_);
  tier_owner::CardTierOptions tier_options;
  tier_options.pass.card_memory_bytes =
      static_cast<std::size_t>(std::max<int64_t>(0, config_.runner.card_memory_mb)) << 20;
  tier_options.pass.next_pass_chunk_keys =
      static_cast<std::size_t>(std::max(0, config_.runner.next_pass_chunk_keys));
  if (config_.runner.collective) tier_options.placement = heter_comm::Placement::kReplicated;
  s.card_tier = std::make_unique<tier_owner::CardTier>(s.cards, *s.group, *s.host, config_.sparse,
                                                       tier_options);
  for (int c = 0; c < s.cards.num_local_cards(); ++c) {
    device::Card& card = s.cards.card(c);
    card.activate();
    s.workers.push_back(std::make_unique<CardWorker>(card, s.group->at(c), *s.card_tier, config_));
  }
  GPUBOX_LOG(INFO) << s.card_tier->plan().to_string();
  if (config_.runner.collective) {
    GPUBOX_LOG(INFO) << "Collective mode (runner.use_fleet without runner.sync_mode): every one "
                        "of the job's "
                     << s.cards.total_cards()
                     << " cards holds the whole embedding table; sparse gradients are "
                        "all-gathered, dense gradients all-reduced";
  }
}

Trainer::~Trainer() = default;

table::HostTier& Trainer::host_tier() { return *state_->host; }
tier_owner::CardTier& Trainer::card_tier() { return *state_->card_tier; }
int Trainer::num_cards() const { return state_->cards.num_local_cards(); }

std::vector<float> Trainer::dense_values(int card) const {
  return state_->workers.at(card)->model().parameters().values_to_host();
}

void Trainer::trim_pools() {
  // A pass boundary's peak (begin_pass's sorts, a grown scratch arena's old block) goes back to
  // the driver; the pool keeps its pre-warmed size, which the steady steps are served from.
  for (int c = 0; c < state_->cards.num_local_cards(); ++c) {
    device::trim_card_pool(state_->cards.card(c), prewarm_bytes(config_));
  }
}

PassReport Trainer::train_pass(const std::vector<std::string>& files) {
  Timer timer;
  const auto prepared = prepare_pass(
      [&](int64_t pass, PreparedPass* into) { read_pass(files, pass, into); }, pass_id_);
  prepared->waited_seconds = timer.seconds();
  return run_pass(*prepared);
}

// What the cards' steps of a pass tell its report.
struct Trainer::StepTally {
  std::size_t steps = 0;  // of every card (agreed over the job)
  // Per card: what its steady steps (after kWarmupSteps) asked of the device layer, and the
  // bytes it sent to other trainer processes over them.
  std::vector<device::DeviceCounts> steady;
  std::vector<uint64_t> steady_interprocess;
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
  tally.steady_seconds.resize(static_cast<std::size_t>(cards));
  std::vector<device::DeviceCounts> every_step(static_cast<std::size_t>(cards));
  std::vector<device::DeviceCounts> between_steps(static_cast<std::size_t>(cards));
  const std::atomic<bool>* stop_flag = step_hooks_.stop_flag;
  std::unique_ptr<PassProgress> progress;  // card 0's, made by it once the steps are known
  s.cards.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        CardWorker& worker = *s.workers[static_cast<std::size_t>(c)];
        comm::Communicator& comm = s.group->at(c);
        worker.metrics().reset();
        // Every card's plan is the same (agreed over the job).
        const StepPlan plan = agree_step_plan(instances, batch_size, cards, card, comm, sizes);
        reserve_steps(worker, plan, batch_size, config_.dataset);
        const std::size_t batches = plan.steps();
        if (c == 0) {
          tally.steps = batches;
          progress = std::make_unique<PassProgress>(
              step_hooks_, pass, batches, config_.runner.print_interval, env_.trainer_id == 0);
        }
        std::vector<double>& step_seconds = tally.steady_seconds[static_cast<std::size_t>(c)];
        step_seconds.reserve(batches);
        dataset::Batch batch;
        int64_t examples = 0;
        // Card 0's progress line: the running AUC is computed on the card and read with the
        // step's status, a few steps late and without a wait (PassProgress).
        if (c == 0) {
          worker.set_progress_sink([&](int64_t step, double auc) {
            progress->report(static_cast<std::size_t>(step), auc);
          });
        }
        AbandonUnlessDone abandon{worker};
        for (std::size_t b = 0; b < batches; ++b) {
          const Timer step_timer;
          fill_step_batch(ds, stream, plan, c, cards, b, config_.dataset, &batch);
          const int64_t global = plan.global_batch[b];
          const bool report = c == 0 && progress->wanted(b);
          const uint64_t sent_before = comm.bytes_to_other_processes();
          // A stop asked rides on the step's all-reduce as this card's vote.
          const bool vote = stop_flag != nullptr && stop_flag->load(std::memory_order_relaxed);
          worker.train_step(batch, global, pass, static_cast<int64_t>(b), report, plan.counts_of(b),
                            vote);
          every_step[static_cast<std::size_t>(c)] += worker.last_step_counts();
          // A chunk of the next pass's card work (runner.next_pass_chunk_keys), after the
          // step's counts were taken: the pass reports its own counts.
          const device::DeviceCounts before_work = card.counts();
          s.card_tier->prepare_next_pass(c);
          between_steps[static_cast<std::size_t>(c)] += card.counts() - before_work;
          if (b >= kWarmupSteps) {
            tally.steady[static_cast<std::size_t>(c)] += worker.last_step_counts();
            tally.steady_interprocess[static_cast<std::size_t>(c)] +=
                comm.bytes_to_other_processes() - sent_before;
            step_seconds.push_back(step_timer.seconds());
          }
          examples += global;
          if (report) progress->note(b, examples);
          // The votes are read with the step's status kStatusDepth steps late, at the same step
          // on every card: all stop after the same one.
          if (worker.stop_votes() > 0) {
            if (c == 0) tally.stopped_after = b + 1;
            break;
          }
        }
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
  const pass::PassStats begin = s.card_tier->begin_pass(*prepared.sorted_keys, prepared.keys.slots,
                                                        staged_rows ? &prepared.staged : nullptr);
  const std::size_t staged = staged_rows ? prepared.staged.keys.size() : 0;
  prepared.staged = {};  // in the cards now
  if (begun) begun();
  Timer phase;
  if (stream != nullptr) {
    stream->start(s.cards.num_local_cards());
    GPUBOX_LOG(INFO) << "pass " << pass << ": " << stream->memory_note();
  }
  StepTally tally;
  try {
    tally = train_steps(ds, stream, pass, prepared.step_sizes.get());
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
  const double train_seconds = phase.seconds();

  const std::shared_ptr<const std::vector<uint64_t>> keep = next_keys ? next_keys() : nullptr;
  const pass::PassStats end = s.card_tier->end_pass(keep ? *keep : std::vector<uint64_t>{});
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
  state_->card_tier->end_pass();
  trim_pools();
  pass_id_ = pass;
  throw PassStopped(pass, tally.stopped_after, tally.steps);
}

void Trainer::append_step_counts(const StepTally& tally, PassReport* report) const {
  const std::size_t steady = tally.steps > kWarmupSteps ? tally.steps - kWarmupSteps : 0;
  trainer::append_step_counts(tally.steady, steady, report);
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

EvalResult Trainer::evaluate(const std::vector<std::string>& files, bool keep_predictions) {
  State& s = *state_;
  auto ds = load_dataset(trainer_file_share(files, env_.trainer_id, env_.trainers),
                         "evaluation data", -1);
  ds->set_batch_size(config_.runner.infer_batch_size);
  const dataset::UniqueKeys eval_keys = ds->unique_keys_and_slots();
  const auto infer_batch = static_cast<std::size_t>(ds->config().batch_size);
  const PassStepSizes sizes = plan_pass_steps(*ds, infer_batch);
  // Read-only: evaluating leaves the model (host tier, card tier keys) as it found it.
  s.card_tier->begin_pass(eval_keys.keys, eval_keys.slots, nullptr, pass::PassAccess::kEvaluate);
  const int cards = s.cards.num_local_cards();
  EvalResult result;
  if (keep_predictions) {
    result.predictions.assign(ds->size(), 0.0f);
    result.labels.assign(ds->size(), 0.0f);
  }
  std::vector<device::DeviceCounts> eval_counts(static_cast<std::size_t>(cards));
  std::vector<device::DeviceCounts> steady_counts(static_cast<std::size_t>(cards));
  std::size_t eval_steps = 0;  // of every card (agreed)
  s.cards.run_on_cards(
      [&](device::Card& card) {
        CardWorker& worker = *s.workers[card.local_index()];
        worker.metrics().reset();
        const StepPlan plan = agree_step_plan(ds->size(), infer_batch, cards, card,
                                              s.group->at(card.local_index()), &sizes);
        reserve_steps(worker, plan, infer_batch, config_.dataset);
        if (card.local_index() == 0) eval_steps = plan.steps();
        dataset::Batch batch;
        device::DeviceCounts& counts = eval_counts[static_cast<std::size_t>(card.local_index())];
        device::DeviceCounts& steady = steady_counts[static_cast<std::size_t>(card.local_index())];
        AbandonUnlessDone abandon{worker};  // the slots' predictions point into `result`
        for (std::size_t b = 0; b < plan.steps(); ++b) {
          // What the whole step asks of the card, the predictions' way back included.
          const device::DeviceCounts before = card.counts();
          fill_step_batch(ds.get(), nullptr, plan, card.local_index(), cards, b, config_.dataset,
                          &batch);
          float* predictions_out = nullptr;
          if (keep_predictions && b < plan.local_batches) {
            // Written when the step's slot is read (a few steps later, or at the drain): no wait.
            const dataset::BatchSpan span = ds->batch_span(card.local_index(), cards, b);
            GPUBOX_EXPECTS(span.size() == batch.size(), "evaluation step ", b, " on card ",
                           card.local_index(), ": a batch of ", batch.size(),
                           " instances for a span of ", span.size());
            predictions_out = result.predictions.data() + span.begin;
            std::copy_n(batch.labels.begin(), span.size(), result.labels.begin() + span.begin);
          }
          worker.eval_step(batch, plan.counts_of(b), predictions_out);
          counts += card.counts() - before;
          if (b >= kWarmupSteps) steady += card.counts() - before;
        }
        worker.drain();  // the steps' sparse checks, before the evaluation's metrics
        abandon.done = true;
        worker.all_reduce_metrics();
      },
      [&](const std::string& why) { s.group->abort(why); });
  s.card_tier->end_pass();
  trim_pools();
  result.metrics = s.workers[0]->metrics().compute();
  // Every card's every evaluation step (sized before the first one: all 0).
  device::DeviceCounts steps;
  for (const device::DeviceCounts& counts : eval_counts) steps += counts;
  result.extra = {{"eval_step_allocations", static_cast<double>(steps.allocations)},
                  {"eval_step_frees", static_cast<double>(steps.frees)},
                  {"eval_step_pinned_allocations",
                   static_cast<double>(steps.pinned_allocations + steps.pinned_frees)},
                  {"eval_step_host_syncs", static_cast<double>(steps.host_syncs)},
                  // Step graphs captured over the evaluation (every card, every step): one per
                  // batch size and upload buffer, the predictions kept or not.
                  {"eval_step_graph_captures", static_cast<double>(steps.graph_captures)}};
  // Per card per step past the warm-up (eval_graph_launches_per_step, ...), as a pass reports.
  append_eval_step_counts(steady_counts, eval_steps > kWarmupSteps ? eval_steps - kWarmupSteps : 0,
                          &result.extra);
  return result;
}

std::vector<PassReport> Trainer::train(const std::string& start_from, const RunHooks& hooks) {
  return run_epochs(*this, config_, start_from, loaded_, hooks);
}

SaveLineage& Trainer::lineage() { return *state_->lineage; }

// A cache made once is kept (a later train() or evaluate may still be served by it).
void Trainer::plan_pass_cache(int64_t loads) {
  if (state_->pass_cache == nullptr) {
    state_->pass_cache = make_pass_cache(config_, env_.trainers, loads);
  }
}

const dataset::PassDataCache* Trainer::pass_cache() const { return state_->pass_cache.get(); }

void Trainer::begin_run(const RunPlan& plan) {
  State& s = *state_;
  // The passes after the one training are read and staged ahead (runner.prefetch_passes).
  s.pipeline = std::make_unique<PassPipeline>(
      *s.card_tier, config_.runner.prefetch_passes,
      [this, plan](int64_t pass, PreparedPass* into) {
        read_pass(plan.files_of(pass), pass, into);
      },
      config_.host_tier.table.memory_budget_bytes, config_.runner.staging_nice);
  if (s.pipeline->depth() > 0 && plan.total > 1) {
    GPUBOX_LOG(INFO) << "runner.prefetch_passes = " << s.pipeline->depth()
                     << ": while a pass trains, the next " << s.pipeline->depth()
                     << " pass(es) are read and their host-tier rows staged; each holds its data "
                        "set and staged rows ("
                     << staged_bytes_per_key(s.host->layout().stride())
                     << " bytes a key) in host memory until its begin_pass, outside "
                        "runner.host_memory_mb";
  }
}

void Trainer::end_run() noexcept { state_->pipeline.reset(); }

PassReport Trainer::train_scheduled_pass(const RunPlan& plan, int64_t k) {
  State& s = *state_;
  PassPipeline& pipeline = *s.pipeline;
  SaveLineage::check_servers(*s.host, k);
  const std::shared_ptr<PreparedPass> prepared = pipeline.take(k);
  // The next passes start reading and staging once this one has begun (the previous end_pass
  // is done, as the staging needs; begin_pass has the cores to itself). The next pass's keys
  // keep their rows dirty on the cards when it trains right after this one: same epoch (no
  // evaluation between), no save between (its sync would write them anyway), one trainer (with
  // several, a card's next keys come from every trainer).
  const bool saving =
      !config_.runner.model_save_path.empty() && config_.runner.save_mode != SaveKind::kNone;
  return run_pass(
      *prepared,
      [&] {
        pipeline.start_after(*prepared, plan.total);
        // The next pass's card work while this one trains, from when its keys are known.
        if (k + 1 < plan.total) {
          s.card_tier->expect_next_pass(prepared->sorted_keys, pipeline.staged_poll(k + 1));
          if (wait_for_next_staging_) pipeline.wait_for(k + 1);
        }
      },
      [&]() -> std::shared_ptr<const std::vector<uint64_t>> {
        if (saving || env_.trainers > 1 || k + 1 >= plan.total || plan.ends_epoch(k))
          return nullptr;
        return pipeline.keys_of(k + 1);
      });
}

void Trainer::accumulate_pass_metrics(std::vector<double>* sums) const {
  state_->workers[0]->metrics().accumulate_into(sums);
}

std::size_t Trainer::metric_buckets() const { return state_->workers[0]->metrics().buckets(); }

void Trainer::settle() {
  if (state_->pipeline) state_->pipeline->wait();
}

std::optional<int64_t> Trainer::recover(const Error& error, int64_t pass) {
  // A server that restarted while no pass was open: reload the last save and train the passes
  // after it again (checkpoint.hpp); anything else is thrown again. Several trainers do not
  // find a restart at the same point, so their reload could not be one collective: the job
  // stops, and running it again resumes from the last complete save.
  if (env_.trainers > 1) return std::nullopt;
  State& s = *state_;
  const auto recovery = s.lineage->recover(error, *s.host, s.card_tier->in_pass(), pass);
  if (s.pipeline) s.pipeline->clear();  // rows staged from before the reload are stale
  pass_id_ = recovery.run_pass;
  load(recovery.dir);
  return pass_id_;
}

}  // namespace gpubox::trainer
