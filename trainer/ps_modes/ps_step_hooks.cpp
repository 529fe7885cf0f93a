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

// A vote is three floats per trainer: the pass + 1 and the step + 1 split in 12-bit halves, each
// exact in a float (steps below 2^36). kPassEnd: the step a vote cast after a pass's last names.
constexpr std::size_t kVoteSlots = 3;
constexpr std::size_t kLowBits = 12;
constexpr std::size_t kPassEnd = (std::size_t{1} << 36) - 2;

namespace {

struct Vote {
  long pass = -1;  // -1: none
  std::size_t step = 0;
};

Vote vote_at(const std::vector<float>& table, std::size_t trainer) {
  const float* v = table.data() + kVoteSlots * trainer;
  Vote vote;
  vote.pass = std::lround(v[0]) - 1;
  const auto step_plus_one = (static_cast<std::size_t>(std::llround(v[1])) << kLowBits) +
                             static_cast<std::size_t>(std::llround(v[2]));
  vote.step = step_plus_one == 0 ? 0 : step_plus_one - 1;
  return vote;
}

}  // namespace

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
  std::vector<float> zeros(kVoteSlots * static_cast<std::size_t>(trainers), 0.0f);
  return servers.dense(DenseAction::kWrite, kStopTable, &zeros)
      .with_context("resetting the servers' table " + std::string(kStopTable));
}

void PsPassStop::vote(std::size_t step) {
  if (trainers_ == 1 || voted_.exchange(true)) return;
  GPUBOX_EXPECTS(step <= kPassEnd, "a stop vote at step ", step, " of pass ", pass_,
                 ": votes name steps below 2^36");
  const auto me = static_cast<std::size_t>(trainer_id_);
  std::vector<float> mine(kVoteSlots * static_cast<std::size_t>(trainers_), 0.0f);
  mine[kVoteSlots * me] = static_cast<float>(pass_ + 1);
  mine[kVoteSlots * me + 1] = static_cast<float>((step + 1) >> kLowBits);
  mine[kVoteSlots * me + 2] = static_cast<float>((step + 1) & ((std::size_t{1} << kLowBits) - 1));
  throw_if_error(servers_.dense(DenseAction::kAdd, kStopTable, &mine)
                     .with_context("casting trainer " + std::to_string(trainer_id_) +
                                   "'s stop vote in pass " + std::to_string(pass_)));
  // The reply is the sums: this trainer's slots read back as cast, or it had voted before (a
  // table not zeroed at the job's start), which no trainer could read right.
  const Vote cast = vote_at(mine, me);
  GPUBOX_EXPECTS(cast.pass == pass_ && cast.step == step, "trainer ", trainer_id_,
                 "'s stop vote in pass ", pass_, " step ", step, " reads back as pass ", cast.pass,
                 " step ", cast.step, " in the servers' table ", kStopTable,
                 ": a vote cast before in this job");
}

std::vector<float> PsPassStop::read_votes() {
  std::vector<float> all(kVoteSlots * static_cast<std::size_t>(trainers_), 0.0f);
  throw_if_error(
      servers_.dense(DenseAction::kRead, kStopTable, &all)
          .with_context("reading the trainers' stop votes in pass " + std::to_string(pass_)));
  return all;
}

bool PsPassStop::voted_up_to(std::size_t step) {
  const std::vector<float> all = read_votes();
  for (std::size_t w = 0; w < static_cast<std::size_t>(trainers_); ++w) {
    const Vote vote = vote_at(all, w);  // one of a later pass is not this pass's
    if (vote.pass == pass_ && vote.step <= step) return true;
  }
  return false;
}

bool PsPassStop::voted_in_pass() {
  const std::vector<float> all = read_votes();
  for (std::size_t w = 0; w < static_cast<std::size_t>(trainers_); ++w) {
    if (vote_at(all, w).pass == pass_) return true;
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
  return voted_in_pass();
}

}  // namespace gpubox::trainer::ps_modes
