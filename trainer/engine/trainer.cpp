// Trainer (trainer.hpp): its cards, communicator group, host tier, card tier and card workers
// set up, and the run the epoch loop drives (train(): the scheduled passes, read and staged
// ahead). A pass's and an evaluation's steps are in trainer_steps.cpp, reading the data in
// trainer_data.cpp, saves and loads in trainer_saves.cpp, the recovery from a restarted server
// in trainer_recovery.cpp.
#include "trainer/engine/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/card_setup.hpp"
#include "table/host_memory_plan.hpp"
#include "table/server/auth_token.hpp"
#include "table/server/host_tier_factory.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_table.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/engine/evaluation_memory.hpp"
#include "trainer/engine/job_agreement.hpp"
#include "trainer/engine/pass_pipeline.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"

namespace gpubox::trainer {
namespace {

// Bytes each card's memory pool takes from the driver up front (device rule 3): the card-tier
// budget when one is set, else 1 GiB (Card::prewarm_pool caps it by the card's free memory).
std::size_t prewarm_bytes(const TrainerConfig& config) {
  const int64_t budget_mb = config.runner.card_memory_mb;
  return budget_mb > 0 ? static_cast<std::size_t>(budget_mb) << 20 : std::size_t{1} << 30;
}

// The host tier: in-process, or the servers the launcher names (table::make_host_tier), with
// the row rules of every tier (table::sparse_config_from) and the config's host-tier settings.
// Throws naming the servers (and the token) when they cannot be reached, the disk tier's folder
// when it cannot be opened.
// `table_budget_bytes`: the in-process table's share of runner.host_memory_mb (host_table_budget).
std::unique_ptr<table::HostTier> open_host_tier(const TrainerConfig& config, const TrainerEnv& env,
                                                uint64_t table_budget_bytes) {
  table::HostTierConfig host_config = config.host_tier;
  host_config.table.memory_budget_bytes = table_budget_bytes;
  host_config.remote.endpoints = env.servers;
  const auto token_file = table::server::client_token_file(config.runner.auth_token_file);
  if (!env.servers.empty() && !token_file.path.empty()) {
    auto token = table::server::read_auth_token_file(token_file.path, token_file.source);
    if (!token.ok()) GPUBOX_FAIL(token.status().message());
    host_config.remote.auth_token = std::move(token).value();
  }
  auto host = table::make_host_tier(config.sparse, host_config);
  if (!host.ok()) {
    // Its status names the servers, or the in-process table's disk tier.
    const bool refused = host.status().code() == Status::Code::kPermissionDenied;
    GPUBOX_FAIL(host.status().to_string(), !refused ? ""
                                           : token_file.path.empty()
                                               ? " (they need a token: set runner.auth_token_file "
                                                 "or GPUBOX_AUTH_TOKEN_FILE)"
                                               : " (the token of " + token_file.source + " '" +
                                                     token_file.path + "' was refused)");
  }
  return std::move(host).value();
}

// The card tier's options from the config, and from where the host tier lives (`env.servers`).
tier_owner::CardTierOptions card_tier_options(const TrainerConfig& config, const TrainerEnv& env) {
  tier_owner::CardTierOptions options;
  options.pass.card_memory_bytes =
      static_cast<std::size_t>(std::max<int64_t>(0, config.runner.card_memory_mb)) << 20;
  // The next pass's card work starts from the next pass's staging (expect_next_pass, a
  // training pass's): without passes staged ahead it would never run, so it is off and its
  // scratch not in the plan.
  options.pass.next_pass_chunk_keys =
      config.runner.prefetch_passes > 0
          ? static_cast<std::size_t>(std::max(0, config.runner.next_pass_chunk_keys))
          : 0;
  // The staging's host-tier pulls run on threads made here, below the steps as the staging
  // thread (PassPipeline) is.
  options.pass.staging_nice = config.runner.staging_nice;
  // runner.host_memory_mb bounds this process's host memory when the table is in-process (a
  // remote host tier's budget is its servers'): the card tier's pinned buffers count in it.
  if (env.servers.empty()) {
    options.pass.host_memory_bytes = config.host_tier.table.memory_budget_bytes;
    options.pass.host_table_min_bytes = std::max<std::size_t>(
        options.pass.host_table_min_bytes,
        table::smallest_memory_budget(config.host_tier.table,
                                      table::planned_classes(config.sparse, 0)));
  }
  if (config.runner.collective) options.placement = heter_comm::Placement::kReplicated;
  return options;
}

// Whether the card tier takes a share of runner.host_memory_mb: a budget for an in-process table
// and next pass's card work that can run (not with the work off: runner.prefetch_passes 0,
// next_pass_chunk_keys 0, --mode infer; nor in Collective mode, with width classes or several
// trainers). Decided without a store.
bool shares_host_budget(const device::CardSet& cards, const TrainerConfig& config,
                        const tier_owner::CardTierOptions& options) {
  return options.pass.host_memory_bytes > 0 &&
         tier_owner::CardTier::pins_host_memory(cards, config.sparse, options);
}

// The in-process table's share of runner.host_memory_mb: what the card tier's plan, made before
// the table opens, leaves of it once every local card's pinned buffers for the next pass's card
// work are counted (CardTierPlan::host_table_bytes: a budget too small for them fails here, at
// start, naming the key, the need and the cards). When the card tier shares none of it, the
// config's, and no plan is made.
uint64_t host_table_budget(device::CardSet& cards, const TrainerConfig& config,
                           const tier_owner::CardTierOptions& options) {
  if (!shares_host_budget(cards, config, options)) {
    return config.host_tier.table.memory_budget_bytes;
  }
  return tier_owner::CardTier::plan_ahead(cards, config.sparse, options).host_table_bytes();
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
  check_evaluation_batch(cards, config);
  // Each card's pool takes its bytes from the driver before anything is allocated on it: the
  // card tier's budget-sized stores and the dense model then come out of the pool.
  for (int c = 0; c < cards.num_local_cards(); ++c)
    cards.card(c).prewarm_pool(prewarm_bytes(config));
}

}  // namespace

using engine_detail::kLocalTierSaves;

namespace {

// A job of several trainers: they meet through a rendezvous store, and the in-process host tier
// saves nothing (refused here, before the job meets, when the config asks for saves or a start
// from one; save() and load() refuse the same: gpubox_train --load, --mode infer).
void check_job_of_several(const TrainerConfig& config, const TrainerEnv& env) {
  if (env.trainers <= 1) return;
  GPUBOX_EXPECTS(!env.rendezvous.empty(), env.trainers_from, "=", env.trainers,
                 ": the trainers meet through a rendezvous store; set "
                 "GPUBOX_RENDEZVOUS=file:///shared/dir (scripts/run_gpubox.sh does)");
  GPUBOX_EXPECTS(
      !env.servers.empty() || config.runner.collective ||
          (config.runner.model_save_path.empty() && config.runner.model_init_path.empty()),
      env.trainers_from, "=", env.trainers, ": runner.model_save_path / runner.model_init_path",
      kLocalTierSaves);
}

}  // namespace

Trainer::Trainer(TrainerConfig config, TrainerEnv env)
    : config_(std::move(config)), env_(std::move(env)) {
  check_job_of_several(config_, env_);
  state_ = std::make_unique<State>(
      State{device::CardSet::from_list(env_.selected_cards, env_.trainer_id, env_.trainers,
                                       env_.threads_per_card, env_.selected_cards_from),
            env_.trainers > 1 ? comm::open_rendezvous_store(env_.rendezvous) : nullptr,
            nullptr,
            nullptr,
            nullptr,
            nullptr,
            {},
            std::make_unique<SaveLineage>(config_),
            nullptr,
            std::make_unique<StepPlanMemo>(),
            nullptr,
            nullptr});
  State& s = *state_;
  const std::chrono::milliseconds collective_timeout(
      static_cast<int64_t>(std::ceil(config_.runner.collective_timeout_s * 1000.0)));
  if (s.store != nullptr) {
    agree_on_job(*s.store, config_, env_, s.cards.num_local_cards(), collective_timeout);
  }
  // A trainer that fails before its Gloo address is published (its POD_IP) tells why; its
  // peers end with that at once.
  s.group = comm::make_group(s.cards, collective_timeout, s.store.get(), env_.host, [this] {
    for (int t = 0; t < env_.trainers; ++t) {
      std::string told = t == env_.trainer_id ? "" : failure_told(env_, t);
      if (!told.empty()) return told;
    }
    return std::string();
  });
  const tier_owner::CardTierOptions tier_options = card_tier_options(config_, env_);
  // The in-process table's options (a budget without runner.rocksdb_path) before its budget is
  // planned: a missing disk tier is named before a budget too small for the cards.
  if (env_.servers.empty()) {
    const Status table_options =
        table::SparseTable::check_options(config_.sparse, config_.host_tier.table);
    if (!table_options.ok()) GPUBOX_FAIL(table_options.to_string());
  }
  // With runner.host_memory_mb to share with an in-process table, the card tier plans (from a
  // store on card 0, out of the pre-warmed pool) before the table opens, which plans its rows
  // with what the card tier leaves. Otherwise the host tier opens first, so that an unreachable
  // server or a disk-tier folder that cannot be opened is named before the pre-warm (slow on a
  // GPU).
  const bool plan_cards_first = shares_host_budget(s.cards, config_, tier_options);
  if (plan_cards_first) prepare_card_memory(s.cards, config_);
  const uint64_t table_budget = host_table_budget(s.cards, config_, tier_options);
  s.host = open_host_tier(config_, env_, table_budget);
  if (s.store != nullptr) agree_on_servers(*s.store, env_, *s.host, collective_timeout);
  // One job at a time on a set of servers, as the PS modes' (servers_owner.hpp): a gpubox-mode
  // job beside a running job trained on its rows, both exiting 0. Beats as the PS modes'.
  auto* remote = dynamic_cast<table::server::RemoteHostTier*>(s.host.get());
  if (remote != nullptr && env_.trainer_id == 0) {
    s.owner =
        std::make_unique<ServersOwner>(*remote, std::min(config_.runner.peer_timeout_s / 5, 2.0));
  }
  if (env_.trainers > 1) {
    // A lost trainer or server ends the job within runner.peer_timeout_s, naming it.
    PeerWatchOptions watch;
    watch.peer_timeout_s = config_.runner.peer_timeout_s;
    watch.join_timeout_s = config_.runner.collective_timeout_s;
    s.watch = std::make_unique<PeerWatch>(
        *s.group, *s.store, env_, dynamic_cast<table::server::RemoteHostTier*>(s.host.get()),
        watch);
  }
  if (!plan_cards_first) prepare_card_memory(s.cards, config_);
  s.card_tier = std::make_unique<tier_owner::CardTier>(s.cards, *s.group, *s.host, config_.sparse,
                                                       tier_options);
  for (int c = 0; c < s.cards.num_local_cards(); ++c) {
    device::Card& card = s.cards.card(c);
    card.activate();
    s.workers.push_back(std::make_unique<CardWorker>(card, s.group->at(c), *s.card_tier, config_));
  }
  GPUBOX_LOG(INFO) << s.card_tier->plan().to_string();
  GPUBOX_EXPECTS(tier_options.pass.host_memory_bytes == 0 ||
                     s.card_tier->plan().host_table_bytes() == table_budget,
                 "the card tier's plan left the host table ", table_budget,
                 " bytes of runner.host_memory_mb before it opened, and ",
                 s.card_tier->plan().host_table_bytes(), " after");
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

int Trainer::local_cards() const { return state_->cards.num_local_cards(); }

int64_t Trainer::step_plans_served() const {
  return static_cast<int64_t>(state_->step_plans->served());
}

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
  // Several trainers meet after each phase that calls the servers, and go back together when
  // one of them found a restart there (agree_on_restarts).
  agree_on_restarts([&] { SaveLineage::check_servers(*s.host, k); },
                    "before pass " + std::to_string(k));
  const std::shared_ptr<PreparedPass> prepared = pipeline.take(k);
  // The next passes start reading and staging once this one has begun (the previous end_pass
  // is done, as the staging needs; begin_pass has the cores to itself). The next pass's keys
  // keep their rows dirty on the cards when it trains right after this one: same epoch (no
  // evaluation between), no save between (its sync would write them anyway), one trainer (with
  // several, a card's next keys come from every trainer).
  // A shrink after this pass (runner.shrink_every) writes every row back and empties the cards,
  // as a save's sync writes them; nor is a pass after the next shrink started ahead (this
  // pass's or a later one's): its staging would pull (see) its rows before the shrink ages
  // them, so a row unseen until then would escape it.
  const bool shrinking = shrinks_after(config_.runner, plan.ends_epoch(k));
  const bool saving =
      (!config_.runner.model_save_path.empty() && config_.runner.save_mode != SaveKind::kNone) ||
      shrinking;
  const int64_t ahead_end = staged_ahead_end(config_.runner, plan.per_epoch, plan.total, k);
  PassReport report = run_pass(
      *prepared,
      [&] {
        pipeline.start_after(*prepared, ahead_end);
        // The next pass's card work while this one trains, from when its keys are known.
        if (k + 1 < ahead_end) {
          s.card_tier->expect_next_pass(prepared->sorted_keys, pipeline.staged_poll(k + 1));
          if (wait_for_next_staging_) pipeline.wait_for(k + 1);
        }
      },
      [&]() -> std::shared_ptr<const std::vector<uint64_t>> {
        if (saving || env_.trainers > 1 || k + 1 >= plan.total || plan.ends_epoch(k))
          return nullptr;
        return pipeline.keys_of(k + 1);
      });
  // Another job that took the servers over replaced this one's rows: its figures are no longer
  // this job's (before the pass's save, which would record them).
  if (s.owner != nullptr) {
    const std::string taken = s.owner->taken_over();
    GPUBOX_EXPECTS(taken.empty(), "pass ", k, ": ", taken);
  }
  return report;
}

void Trainer::accumulate_pass_metrics(std::vector<double>* sums) const {
  state_->workers[0]->metrics().accumulate_into(sums);
}

std::size_t Trainer::metric_buckets() const { return state_->workers[0]->metrics().buckets(); }

void Trainer::settle() {
  if (state_->pipeline) state_->pipeline->wait();
}

}  // namespace gpubox::trainer
