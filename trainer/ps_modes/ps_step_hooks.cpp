#include "trainer/ps_modes/ps_step_hooks.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/engine/pass_progress.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

namespace gpubox::trainer::ps_modes {

using table::server::DenseAction;

// The step a vote cast after a pass's last step names (votes are floats: exact below 2^24).
constexpr std::size_t kPassEnd = (std::size_t{1} << 24) - 2;

PsProgress::PsProgress(const StepHooks& hooks, int64_t pass, std::size_t steps, int print_interval,
                       const TrainerEnv& env, int threads)
    : progress_(
          std::make_unique<PassProgress>(hooks, pass, steps, print_interval, env.trainer_id == 0)),
      scale_(static_cast<int64_t>(threads) * env.trainers) {}

PsProgress::~PsProgress() = default;

void PsProgress::after_step(std::size_t b, std::size_t examples, PsWorker& worker) {
  examples_ += static_cast<int64_t>(examples);
  if (!progress_->wanted(b)) return;
  progress_->note(b, examples_ * scale_);
  progress_->report(b, worker.running_auc());
}

PsPassStop::PsPassStop(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                       const std::atomic<bool>* flag, int64_t pass)
    : servers_(servers), trainer_id_(trainer_id), trainers_(trainers), flag_(flag), pass_(pass) {}

Status PsPassStop::reset(table::server::RemoteHostTier& servers, int trainers) {
  std::vector<float> zeros(2 * static_cast<std::size_t>(trainers), 0.0f);
  return servers.dense(DenseAction::kWrite, kStopTable, &zeros)
      .with_context("resetting the servers' table " + std::string(kStopTable));
}

void PsPassStop::vote(std::size_t step) {
  if (trainers_ == 1 || voted_.exchange(true)) return;
  std::vector<float> mine(2 * static_cast<std::size_t>(trainers_), 0.0f);
  mine[2 * static_cast<std::size_t>(trainer_id_)] = static_cast<float>(pass_ + 1);
  mine[2 * static_cast<std::size_t>(trainer_id_) + 1] = static_cast<float>(step + 1);
  throw_if_error(servers_.dense(DenseAction::kAdd, kStopTable, &mine)
                     .with_context("casting trainer " + std::to_string(trainer_id_) +
                                   "'s stop vote in pass " + std::to_string(pass_)));
}

bool PsPassStop::voted_up_to(std::size_t step) {
  std::vector<float> all(2 * static_cast<std::size_t>(trainers_), 0.0f);
  throw_if_error(
      servers_.dense(DenseAction::kRead, kStopTable, &all)
          .with_context("reading the trainers' stop votes in pass " + std::to_string(pass_)));
  for (std::size_t w = 0; w < all.size(); w += 2) {
    // Votes are small integers, exact in a float; one of a later pass is not this pass's.
    const auto pass = std::lround(all[w]) - 1;
    const auto at = std::lround(all[w + 1]) - 1;
    if (pass == pass_ && at <= static_cast<long>(step)) return true;
  }
  return false;
}

bool PsPassStop::stop_before_step(int t, std::size_t b) {
  if (stopping()) return true;
  if (flagged()) {
    vote(b);
    stopping_.store(true, std::memory_order_release);
    return true;
  }
  if (trainers_ > 1 && t == 0 && b > 0 && b % kPollSteps == 0 && voted_up_to(b)) {
    stopping_.store(true, std::memory_order_release);
    return true;
  }
  return false;
}

void PsPassStop::before_sync_barrier(std::size_t b) {
  if (trainers_ > 1 && flagged()) vote(b);
}

void PsPassStop::after_sync_barrier(std::size_t b, bool last) {
  if (stopping()) return;
  const bool stop =
      trainers_ == 1 ? flagged() : ((b + 1) % kPollSteps == 0 || last) && voted_up_to(b);
  if (stop) stopping_.store(true, std::memory_order_release);
}

bool PsPassStop::pass_stopped(const std::function<void()>& meet_all) {
  if (trainers_ == 1) return stopping();
  // A flag seen only after the last step still stops the job here, with this pass.
  if (flagged()) vote(kPassEnd);
  meet_all();
  return voted_up_to(kPassEnd);
}

}  // namespace gpubox::trainer::ps_modes
