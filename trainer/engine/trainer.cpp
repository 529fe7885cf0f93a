#include "trainer/engine/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "common/timer.hpp"
#include "dataset/data_files.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/load_report.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/ps/card_tier.hpp"
#include "table/host_tier_factory.hpp"
#include "table/io/model_manifest.hpp"
#include "table/io/save_dir.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_table.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/engine/pass_pipeline.hpp"
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

// Steps of a pass not counted in its per-step device counts: the first steps size the buffers
// and the scratch arena (allocations), later ones repeat the same work.
constexpr std::size_t kWarmupSteps = 2;

// Bytes each card's memory pool takes from the driver up front (device rule 3): the card-tier
// budget when one is set, else 1 GiB (Card::prewarm_pool caps it by the card's free memory).
std::size_t prewarm_bytes(const TrainerConfig& config) {
  const int64_t budget_mb = config.runner.card_memory_mb;
  return budget_mb > 0 ? static_cast<std::size_t>(budget_mb) << 20 : std::size_t{1} << 30;
}

// The steps of a pass, agreed by every card of every trainer (collective over `comm`): as many
// as the trainer with the most batches has (a card past its own batches trains empty ones,
// still joining every collective), and each step's instances over every card of the job (the
// dense gradients' scale).
struct StepPlan {
  std::size_t local_batches = 0;      // this trainer's batches per card
  std::vector<int64_t> global_batch;  // per step: instances over every card of the job
  std::size_t steps() const { return global_batch.size(); }
};

StepPlan agree_step_plan(std::size_t instances, std::size_t batch, int cards, device::Card& card,
                         comm::Communicator& comm) {
  const device::Stream& stream = card.stream();
  StepPlan plan;
  plan.local_batches = dataset::batches_per_card(instances, batch, cards);
  auto counts = card.make_buffer<int64_t>(static_cast<std::size_t>(comm.size()));
  auto mine = device::to_device(std::vector<int64_t>{static_cast<int64_t>(plan.local_batches)},
                                card.memory(), stream);
  comm.all_gather(mine.data(), counts.data(), 1, stream);
  comm.synchronize(stream, "the pass's batch counts");
  int64_t steps = 0;
  for (int64_t n : device::to_host(counts)) steps = std::max(steps, n);
  std::vector<int64_t> sizes(static_cast<std::size_t>(steps), 0);
  for (std::size_t b = 0; b < plan.local_batches; ++b) {
    sizes[b] = static_cast<int64_t>(
        dataset::batch_span_of(instances, batch, card.local_index(), cards, b).size());
  }
  auto global = device::to_device(sizes, card.memory(), stream);
  comm.all_reduce_sum(global.data(), global.data(), sizes.size(), stream);
  comm.synchronize(stream, "the pass's batch sizes");
  plan.global_batch = device::to_host(global);
  return plan;
}

// Batch `b` of this card: the dataset's (held, or the stream's next) while it has one, else an
// empty batch.
void fill_step_batch(const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                     const StepPlan& plan, int card, int cards, std::size_t b,
                     const dataset::DatasetConfig& config, dataset::Batch* batch) {
  if (b >= plan.local_batches) {
    dataset::assemble_batch(nullptr, 0, static_cast<int>(config.slots.size()), config.dense_dim,
                            batch);
  } else if (stream != nullptr) {
    GPUBOX_EXPECTS(stream->next_batch(card, batch), "the pass's stream ended at batch ", b, " of ",
                   plan.local_batches);
  } else {
    ds->fill_batch(card, cards, b, batch);
  }
}

}  // namespace

using engine_detail::kLocalTierSaves;

void append_step_counts(const std::vector<device::DeviceCounts>& per_card, std::size_t steps,
                        PassReport* report) {
  if (steps == 0 || per_card.empty()) return;
  device::DeviceCounts total;
  for (const auto& counts : per_card) total += counts;
  const double per_step = 1.0 / (static_cast<double>(steps) * static_cast<double>(per_card.size()));
  auto& extra = report->extra;
  extra.emplace_back("steady_steps", static_cast<double>(steps));
  extra.emplace_back("host_syncs_per_step", total.host_syncs * per_step);
  extra.emplace_back("allocations_per_step", total.allocations * per_step);
  extra.emplace_back("pageable_copies_per_step", total.pageable_copies * per_step);
  extra.emplace_back("pinned_copies_per_step", total.pinned_copies * per_step);
  extra.emplace_back("launches_per_step", total.launches * per_step);
  extra.emplace_back("collectives_per_step", total.collectives * per_step);
}

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
            nullptr});
  State& s = *state_;
  s.group = comm::make_group(s.cards,
                             std::chrono::milliseconds(static_cast<int64_t>(
                                 std::ceil(config_.runner.collective_timeout_s * 1000.0))),
                             s.store.get(), env_.host);
  // The host tier: in-process, or the servers the launcher names (table::make_host_tier), with
  // the row rules of every tier (table::sparse_config_from) and the config's host-tier settings.
  table::HostTierConfig host_config = config_.host_tier;
  host_config.remote.endpoints = env_.servers;
  const auto token_file = table::server::client_token_file(config_.runner.auth_token_file);
  if (!env_.servers.empty() && !token_file.path.empty()) {
    auto token = table::server::read_auth_token_file(token_file.path, token_file.source);
    if (!token.ok()) GPUBOX_FAIL(token.status().message());
    host_config.remote.auth_token = std::move(token).value();
  }
  auto host = table::make_host_tier(config_.sparse, host_config);
  if (!host.ok()) {
    const bool refused = host.status().code() == Status::Code::kPermissionDenied;
    GPUBOX_FAIL(
        "cannot reach the host-tier servers ", env_.servers, ": ", host.status().to_string(),
        !refused ? ""
        : token_file.path.empty()
            ? " (they need a token: set runner.auth_token_file "
              "or GPUBOX_AUTH_TOKEN_FILE)"
            : " (the token of " + token_file.source + " '" + token_file.path + "' was refused)");
  }
  s.host = std::move(host).value();
  // Each card's pool takes its bytes from the driver before anything is allocated on it: the
  // card tier's budget-sized stores and the dense model then come out of the pool.
  for (int c = 0; c < s.cards.num_local_cards(); ++c)
    s.cards.card(c).prewarm_pool(prewarm_bytes(config_));
  ps::CardTierOptions tier_options;
  tier_options.pass.card_memory_bytes =
      static_cast<std::size_t>(std::max<int64_t>(0, config_.runner.card_memory_mb)) << 20;
  tier_options.pass.next_pass_chunk_keys =
      static_cast<std::size_t>(std::max(0, config_.runner.next_pass_chunk_keys));
  if (config_.runner.collective) tier_options.placement = heter_comm::Placement::kReplicated;
  s.card_tier =
      std::make_unique<ps::CardTier>(s.cards, *s.group, *s.host, config_.sparse, tier_options);
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
ps::CardTier& Trainer::card_tier() { return *state_->card_tier; }
int Trainer::num_cards() const { return state_->cards.num_local_cards(); }

std::vector<float> Trainer::dense_values(int card) const {
  return state_->workers.at(card)->model().parameters().values_to_host();
}

std::unique_ptr<dataset::InMemoryDataset> Trainer::load_dataset(
    const std::vector<std::string>& files, const std::string& what) const {
  auto ds = std::make_unique<dataset::InMemoryDataset>(config_.dataset);
  if (files.empty() && env_.trainers > 1) {
    // An uneven split left this trainer no file: it joins every step with empty batches.
    GPUBOX_LOG(INFO) << what << ": trainer " << env_.trainer_id << " of " << env_.trainers
                     << " has no file of it";
    return ds;
  }
  ds->set_filelist(files);
  const Status st = ds->load_into_memory();
  if (!st.ok()) GPUBOX_FAIL("loading ", what, ": ", st.message());
  report_read(ds->load_stats(), files, what);
  return ds;
}

void Trainer::read_pass(const std::vector<std::string>& files, int64_t pass,
                        PreparedPass* into) const {
  const std::vector<std::string> share = trainer_file_share(files, env_.trainer_id, env_.trainers);
  const std::string what = "pass " + std::to_string(pass);
  if (config_.runner.reader_type != ReaderType::kQueueDataset) {
    into->data = load_dataset(share, what);
    if (config_.runner.shuffle) into->data->local_shuffle(config_.runner.seed * 1000003 + pass);
    return;
  }
  // Streamed: read once now for the pass's keys (begin_pass needs them all before the first
  // step; memory: the keys, not the instances), streamed again by run_pass.
  into->stream = std::make_unique<dataset::QueueDataset>(config_.dataset);
  if (share.empty() && env_.trainers > 1) {
    GPUBOX_LOG(INFO) << what << ": trainer " << env_.trainer_id << " of " << env_.trainers
                     << " has no file of it";
  } else {
    into->stream->set_filelist(share);
  }
  const Status st = into->stream->scan(&into->keys);
  if (!st.ok()) GPUBOX_FAIL("reading ", what, " for its keys: ", st.message());
  if (!share.empty() || env_.trainers == 1) {
    report_read(into->stream->load_stats(), share, what);
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
};

Trainer::StepTally Trainer::train_steps(const dataset::InMemoryDataset* ds,
                                        dataset::QueueDataset* stream, int64_t pass) {
  State& s = *state_;
  const int cards = s.cards.num_local_cards();
  const std::size_t instances = ds != nullptr ? ds->size() : stream->size();
  const auto batch_size = static_cast<std::size_t>(config_.dataset.batch_size);
  StepTally tally;
  tally.steady.resize(static_cast<std::size_t>(cards));
  tally.steady_interprocess.assign(static_cast<std::size_t>(cards), 0);
  const bool tty = isatty(fileno(stdout)) != 0 && env_.trainer_id == 0;
  const int interval = std::max(1, config_.runner.print_interval);
  Mutex print_mu;
  s.cards.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        CardWorker& worker = *s.workers[static_cast<std::size_t>(c)];
        comm::Communicator& comm = s.group->at(c);
        worker.metrics().reset();
        // Every card's plan is the same (agreed over the job).
        const StepPlan plan = agree_step_plan(instances, batch_size, cards, card, comm);
        const std::size_t batches = plan.steps();
        if (c == 0) tally.steps = batches;
        dataset::Batch batch;
        Timer card_timer;
        double last_redraw = 0;
        int64_t examples = 0;
        for (std::size_t b = 0; b < batches; ++b) {
          fill_step_batch(ds, stream, plan, c, cards, b, config_.dataset, &batch);
          const int64_t global = plan.global_batch[b];
          // Card 0's progress line: the running AUC is computed on the card and read with the
          // step's own last wait, so printing it costs the other cards nothing. On a terminal
          // the line is redrawn in place, at most 4 times a second besides print_interval.
          const bool redraw =
              tty && (b + 1 == batches || card_timer.seconds() - last_redraw >= 0.25);
          const bool progress =
              c == 0 && env_.trainer_id == 0 && ((b + 1) % interval == 0 || redraw);
          const uint64_t sent_before = comm.bytes_to_other_processes();
          worker.train_step(batch, global, pass, static_cast<int64_t>(b), progress);
          // A chunk of the next pass's card work (runner.next_pass_chunk_keys), after the
          // step's counts were taken: the pass reports its own counts.
          s.card_tier->prepare_next_pass(c);
          if (b >= kWarmupSteps) {
            tally.steady[static_cast<std::size_t>(c)] += worker.last_step_counts();
            tally.steady_interprocess[static_cast<std::size_t>(c)] +=
                comm.bytes_to_other_processes() - sent_before;
          }
          examples += global;
          if (!progress) continue;
          const double elapsed = card_timer.seconds();
          last_redraw = elapsed;
          const std::string line =
              format_progress_line(pass, b + 1, batches, examples / std::max(1e-9, elapsed),
                                   worker.progress_auc(), elapsed);
          MutexLock lock(print_mu);
          // On a terminal: back to the line's start, and clear what a longer line left.
          std::printf(tty ? "\r%s\033[K" : "%s\n", line.c_str());
          std::fflush(stdout);
        }
        worker.all_reduce_metrics();
      },
      [&](const std::string& why) {
        s.group->abort(why);
        if (stream != nullptr) stream->abort(why);
      });
  if (tty && tally.steps >= 1) std::printf("\n");
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
    tally = train_steps(ds, stream, pass);
  } catch (const Error&) {
    // The stream's own failure (a file, pipe_command, its second read differing from the first)
    // is the pass's error, also when a card stopped for it first.
    const Status read = stream != nullptr ? stream->finish() : Status::OK();
    if (!read.ok() && read.code() != Status::Code::kAborted) {
      GPUBOX_FAIL("reading pass ", pass, ": ", read.message());
    }
    throw;
  }
  if (stream != nullptr) {
    const Status read = stream->finish();
    if (!read.ok()) GPUBOX_FAIL("reading pass ", pass, ": ", read.message());
  }
  const double train_seconds = phase.seconds();

  const std::shared_ptr<const std::vector<uint64_t>> keep = next_keys ? next_keys() : nullptr;
  const pass::PassStats end = s.card_tier->end_pass(keep ? *keep : std::vector<uint64_t>{});
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
                  {"skipped_lines",
                   static_cast<double>(
                       (ds != nullptr ? ds->load_stats() : stream->load_stats()).skipped_lines())}};
  append_step_counts(tally, &report);
  return report;
}

void Trainer::append_step_counts(const StepTally& tally, PassReport* report) const {
  const std::size_t steady = tally.steps > kWarmupSteps ? tally.steps - kWarmupSteps : 0;
  trainer::append_step_counts(tally.steady, steady, report);
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
  auto ds =
      load_dataset(trainer_file_share(files, env_.trainer_id, env_.trainers), "evaluation data");
  ds->set_batch_size(config_.runner.infer_batch_size);
  const dataset::UniqueKeys eval_keys = ds->unique_keys_and_slots();
  // Read-only: evaluating leaves the model (host tier, card tier keys) as it found it.
  s.card_tier->begin_pass(eval_keys.keys, eval_keys.slots, nullptr, pass::PassAccess::kEvaluate);
  const int cards = s.cards.num_local_cards();
  EvalResult result;
  if (keep_predictions) {
    result.predictions.assign(ds->size(), 0.0f);
    result.labels.assign(ds->size(), 0.0f);
  }
  s.cards.run_on_cards(
      [&](device::Card& card) {
        CardWorker& worker = *s.workers[card.local_index()];
        worker.metrics().reset();
        const StepPlan plan =
            agree_step_plan(ds->size(), static_cast<std::size_t>(ds->config().batch_size), cards,
                            card, s.group->at(card.local_index()));
        dataset::Batch batch;
        for (std::size_t b = 0; b < plan.steps(); ++b) {
          fill_step_batch(ds.get(), nullptr, plan, card.local_index(), cards, b, config_.dataset,
                          &batch);
          worker.eval_step(batch);
          if (keep_predictions && b < plan.local_batches) {
            const dataset::BatchSpan span = ds->batch_span(card.local_index(), cards, b);
            const std::vector<float> preds = worker.last_predictions();
            for (std::size_t i = 0; i < span.size(); ++i) {
              result.predictions[span.begin + i] = preds[i];
              result.labels[span.begin + i] = batch.labels[i];
            }
          }
        }
        worker.all_reduce_metrics();
      },
      [&](const std::string& why) { s.group->abort(why); });
  s.card_tier->end_pass();
  result.metrics = s.workers[0]->metrics().compute();
  return result;
}

std::vector<PassReport> Trainer::train(const std::string& start_from) {
  return run_epochs(*this, config_, start_from, loaded_);
}

SaveLineage& Trainer::lineage() { return *state_->lineage; }

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
