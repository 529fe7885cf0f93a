#include "trainer/ps_modes/sync_barriers.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;

// A mark: the pass + 1, then the barrier + 1 in two halves of kHalfBits (barriers below 2^48).
constexpr std::size_t kMarkSlots = 3;
constexpr int kHalfBits = 24;
constexpr int64_t kHalf = int64_t{1} << kHalfBits;

std::size_t table_size(int trainers) {
  return (1 + kMarkSlots) * static_cast<std::size_t>(trainers);
}

}  // namespace

const char* barrier_failure_cause(const Status& waited) {
  if (waited.code() == Status::Code::kDeadlineExceeded) return "a trainer died or is stuck";
  // The server's refusal of another count of parties (its message names both counts).
  if (waited.code() == Status::Code::kInvalidArgument &&
      waited.message().find(" announced by those already waiting") != std::string::npos) {
    return "the trainers were started with different counts of trainers (PADDLE_TRAINERS_NUM): "
           "every trainer of a job must be given the same";
  }
  return "the first server, which holds the barrier, was lost or restarted";
}

SyncBarriers::SyncBarriers(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                           int64_t pass, double timeout_s)
    : servers_(servers),
      trainer_id_(trainer_id),
      trainers_(trainers),
      pass_(pass),
      timeout_s_(timeout_s) {}

Status SyncBarriers::reset(table::server::RemoteHostTier& servers, int trainers) {
  std::vector<float> zeros(table_size(trainers), 0.0f);
  return servers.dense(DenseAction::kWrite, kProgressTable, &zeros)
      .with_context("resetting the servers' table " + std::string(kProgressTable));
}

std::string SyncBarriers::name(int64_t barrier) const {
  return "ps_sync/" + std::to_string(pass_) + "/" + std::to_string(barrier);
}

std::optional<int64_t> SyncBarriers::lowest_mark(const std::vector<float>& table) const {
  std::optional<int64_t> lowest;
  for (int w = 0; w < trainers_; ++w) {
    const float* mark = table.data() + trainers_ + kMarkSlots * static_cast<std::size_t>(w);
    if (std::lround(mark[0]) != pass_ + 1) continue;  // none, or another pass's
    const int64_t barrier = std::llround(mark[1]) * kHalf + std::llround(mark[2]) - 1;
    lowest = std::min(lowest.value_or(barrier), barrier);
  }
  return lowest;
}

void SyncBarriers::arrive(const std::string& what) {
  GPUBOX_EXPECTS(next_.has_value(), "sync mode, pass ", pass_, ", ", what,
                 ": this trainer left the pass's barriers before");
  const int64_t n = *next_;
  next_.reset();  // a call below that fails leaves this trainer no place to hold
  // The arrival is counted first, so a timeout names the trainers behind the furthest one.
  std::vector<float> table(table_size(trainers_), 0.0f);
  table[static_cast<std::size_t>(trainer_id_)] = 1.0f;
  throw_if_error(servers_.dense(DenseAction::kAdd, kProgressTable, &table)
                     .with_context("sync mode, pass " + std::to_string(pass_) + ", " + what +
                                   ": counting this trainer's arrival"));
  const std::optional<int64_t> mark = lowest_mark(table);
  heard_ = mark.has_value();
  const auto throw_heard = [&] {
    // Told, not this trainer's failure: the restart is named by the one that found it.
    throw FailureTold(detail::concat("sync mode, pass ", pass_, ", ", what,
                                     ": another trainer's step failed on a server restart"));
  };
  if (mark && *mark < n) throw_heard();
  const Status met = servers_.barrier(name(n), static_cast<uint32_t>(trainers_), timeout_s_);
  if (!met.ok()) fail_wait(what, met);
  if (mark) throw_heard();
  next_ = n + 1;
}

void SyncBarriers::fail_wait(const std::string& what, const Status& waited) {
  if (waited.code() != Status::Code::kDeadlineExceeded) {
    GPUBOX_FAIL("sync mode, pass ", pass_, ", ", what, ": waiting for all ", trainers_,
                " trainers: ", barrier_failure_cause(waited), "; ", waited.to_string());
  }
  std::vector<float> progress(table_size(trainers_), 0.0f);
  std::string missing;
  if (servers_.dense(DenseAction::kRead, kProgressTable, &progress).ok()) {
    const float furthest = *std::max_element(progress.begin(), progress.begin() + trainers_);
    for (int w = 0; w < trainers_; ++w) {
      if (progress[static_cast<std::size_t>(w)] < furthest) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(w);
      }
    }
  }
  GPUBOX_FAIL("sync mode, pass ", pass_, ", ", what, ": not every one of the ", trainers_,
              " trainers arrived within runner.collective_timeout_s=", timeout_s_, " s",
              missing.empty() ? std::string() : " (missing: trainer " + missing + ")", ": ",
              barrier_failure_cause(waited), "; ", waited.to_string());
}

void SyncBarriers::hold() {
  // Not for a restart of the first server (endpoint 0, the barriers'): every trainer finds it.
  if (!next_ || trainers_ == 1 || servers_.restart_pending(0)) return;
  const int64_t n = *next_;
  next_.reset();
  // The arrival is counted too, so that a wait at n that runs out does not name this trainer.
  std::vector<float> table(table_size(trainers_), 0.0f);
  table[static_cast<std::size_t>(trainer_id_)] = 1.0f;
  float* mine = table.data() + trainers_ + kMarkSlots * static_cast<std::size_t>(trainer_id_);
  mine[0] = static_cast<float>(pass_ + 1);
  mine[1] = static_cast<float>((n + 1) / kHalf);
  mine[2] = static_cast<float>((n + 1) % kHalf);
  const std::vector<float> adding = table;
  const Status marked = servers_.dense(DenseAction::kAdd, kProgressTable, &table);
  const std::string at = "pass " + std::to_string(pass_) + ", the job's barrier " + name(n);
  if (!marked.ok()) {
    // Mostly the first server was lost or restarted: every trainer finds that at its next call
    // to it. A known limit: the add can also run past the client's deadline on a loaded server
    // that lives on (it may even have applied it); this trainer does not come to n then, and the
    // others wait n out (runner.collective_timeout_s).
    GPUBOX_LOG(WARNING) << at << ": marking a server restart failed: " << marked.to_string();
    return;
  }
  held_ = adding;
  if (lowest_mark(table).value_or(n) < n) return;  // let out of an earlier one: nobody comes here
  GPUBOX_LOG(INFO) << at << ": trainer " << trainer_id_
                   << " found a server restart before it, and comes to it so that the others "
                      "waiting there go on to the pass's end";
  const Status met = servers_.barrier(name(n), static_cast<uint32_t>(trainers_), timeout_s_);
  if (!met.ok()) {
    GPUBOX_LOG(WARNING) << at << ": waiting for the others there failed ("
                        << barrier_failure_cause(met) << "): " << met.to_string();
  }
}

void SyncBarriers::forget_mark() {
  if (held_.empty()) return;
  // Only this trainer adds to its mark's slots: adding the negation zeroes them. The arrival it
  // counted stays (arrivals are only compared among the trainers of one wait).
  std::vector<float> undo(held_.size(), 0.0f);
  for (std::size_t i = static_cast<std::size_t>(trainers_); i < held_.size(); ++i) {
    undo[i] = -held_[i];
  }
  held_.clear();
  const Status taken_back = servers_.dense(DenseAction::kAdd, kProgressTable, &undo);
  if (!taken_back.ok()) {
    GPUBOX_LOG(WARNING) << "pass " << pass_ << ": taking back this trainer's mark of a server "
                        << "restart failed (the job's next start zeroes it): "
                        << taken_back.to_string();
  }
}

}  // namespace gpubox::trainer::ps_modes
