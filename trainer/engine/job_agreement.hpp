// The trainers of one gpubox-mode (or Collective) job agree on what they train before they
// connect: each publishes, in the job's rendezvous store, its count of trainers, its cards and
// the keys that shape the job (TrainerConfig::model_keys and job_keys, less those a trainer sets
// for its own machine: memory budgets, the disk tier's folder, reader threads), and compares
// them with trainer 0's (trainer 0: with every other trainer's). Without it, trainers started
// with another learning rate trained diverging replicas with exit 0, another row width aborted
// with no message, and another trainer count failed inside Gloo's address exchange.
#pragma once

#include <chrono>
#include <string>

#include "heterps/comm/rendezvous_store.hpp"
#include "table/host_tier.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {

// Publishes this trainer's entry (key "job/config/<id>") and compares as above, waiting up to
// `timeout` for the entries it reads. Throws naming every key that differs with both trainers'
// values (up to a few), a trainer whose entry never appeared, or an entry of this trainer's id
// already in the store (an earlier job's folder, or two trainers started with one id).
// A trainer whose entry never comes is named at once when it said it failed
// (tell_job_failed), after `timeout` otherwise.
void agree_on_job(comm::RendezvousStore& store, const TrainerConfig& config, const TrainerEnv& env,
                  int cards_per_trainer, std::chrono::milliseconds timeout);

// A trainer that fails (its config refused, its environment or cards wrong, or later) tells the
// others through the job's rendezvous store ("job/failed/<id>": its message), so that trainers
// waiting for it to meet end at once naming it, not after runner.collective_timeout_s (they were
// started by hand, or by a launcher that does not stop them). From the launcher's environment
// (TrainerEnv::from_environment); nothing for a job of one trainer or without GPUBOX_RENDEZVOUS,
// nor when the store cannot be reached. Never throws.
void tell_job_failed(const std::string& message) noexcept;

// A PS-mode trainer of a job of several with a rendezvous folder (GPUBOX_RENDEZVOUS) says its
// mode there ("job/ps_mode/<id>"): a gpubox-mode or Collective trainer of the same job waiting
// for its entry (agree_on_job) ends at once naming both modes, instead of after
// runner.collective_timeout_s. Never throws.
void publish_ps_mode(const TrainerEnv& env, SyncMode mode) noexcept;

// "trainer <trainer> of the job failed: <its message>" when it told its failure in the job's
// rendezvous folder (tell_job_failed), else "" (also without a folder). Never throws.
std::string failure_told(const TrainerEnv& env, int trainer) noexcept;

// After the host tier opened: whether every trainer reaches the same servers, by their instance
// ids (learned as the tier connected) in PADDLE_PSERVERS_IP_PORT_LIST's order, not by address (one
// server has other names on other machines). Published as "job/servers/<id>", compared as
// agree_on_job compares; throws naming both trainers' servers. Trainers pointed at other servers
// each trained a table of their own, their dense nets all-reduced, with exit 0.
void agree_on_servers(comm::RendezvousStore& store, const TrainerEnv& env,
                      const table::HostTier& host, std::chrono::milliseconds timeout);

}  // namespace gpubox::trainer
