// Trainer's state and the helpers its source files share (trainer.cpp: set-up and the run;
// trainer_steps.cpp: a pass's and an evaluation's steps; trainer_data.cpp: reading;
// trainer_saves.cpp: saves, loads and what the trainers of a job agree on). Private to
// trainer/engine.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "dataset/pass_data_cache.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/host_tier.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/engine/pass_pipeline.hpp"
#include "trainer/engine/peer_watch.hpp"
#include "trainer/engine/step_sizes.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/dense_state.hpp"
#include "trainer/schedule/servers_owner.hpp"

namespace gpubox::trainer {

struct Trainer::State {
  device::CardSet cards;
  std::unique_ptr<comm::RendezvousStore> store;  // several trainers: where they meet
  std::unique_ptr<comm::CommGroup> group;
  std::unique_ptr<table::HostTier> host;
  // Trainer 0 of a job on gpubox_servers: the servers claimed for it (servers_owner.hpp), released
  // as it ends; after the host tier, so destroyed before it.
  std::unique_ptr<ServersOwner> owner;
  std::unique_ptr<tier_owner::CardTier> card_tier;   // the sparse side of every card
  std::vector<std::unique_ptr<CardWorker>> workers;  // the dense side of every card
  std::unique_ptr<SaveLineage> lineage;              // what saves apply onto, where a resume starts
  // The run's parsed loads (runner.pass_cache_mb; null when off); before the pipeline, which
  // reads through it, so destroyed after it.
  std::unique_ptr<dataset::PassDataCache> pass_cache;
  // The plans of the loads it serves unshuffled, served again (plan_pass_steps).
  std::unique_ptr<StepPlanMemo> step_plans;
  std::unique_ptr<PassPipeline> pipeline;  // during train(): the passes read ahead
  // Several trainers: the other trainers' heartbeat and the servers' pings (peer_watch.hpp).
  // Last, so destroyed first: it uses the group and the host tier.
  std::unique_ptr<PeerWatch> watch;
};

namespace engine_detail {

// Several trainers with the in-process host tier: each trainer holds only the rows its own cards
// own, so no one process can write or read the whole sparse half. Collective mode excepted: there
// every trainer's cards hold the whole table, and so does every trainer's host tier after each
// pass (saves are trainer 0's; a load fills every trainer's).
inline constexpr const char* kLocalTierSaves =
    ": with several trainers and the in-process host tier (GPUBOX_LOCAL_TIER=1) each trainer "
    "holds only the rows its cards own, so models are saved and loaded only with the host tier "
    "on gpubox_server shards (scripts/run_gpubox.sh --trainers T --servers S, or "
    "PADDLE_PSERVERS_IP_PORT_LIST)";

// One card's dense parameters and optimizer state, with its sparse table's step count
// (adam_bias_correction per_table; what a save writes of it): equal on every card of the job
// while their updates stay identical.
inline DenseState dense_state_of(CardWorker& worker, tier_owner::CardTier& card_tier) {
  worker.card().activate();
  DenseState state = DenseState::of(worker.model(), worker.optimizer(), worker.card().stream());
  state.table_steps = card_tier.heter_comm(worker.card().local_index()).table_steps();
  return state;
}

inline int64_t as_int64(uint64_t bits) {
  int64_t out = 0;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace engine_detail
}  // namespace gpubox::trainer
