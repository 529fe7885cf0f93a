// PsTrainer's meetings and its telling of a failure to the other trainers of its job
// (ps_trainer.hpp): a meeting (meet) and one it fails at (fail_at_meeting), to their watches
// (tell_failure, PsPeerWatch's marks), and what a trainer told of another's failure throws
// (throw_if_marked).
#include <algorithm>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/engine/job_agreement.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"
#include "trainer/ps_modes/sync_barriers.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

// What `failed` tells a user (user_message).
std::string message_of(const std::exception_ptr& failed) {
  try {
    std::rethrow_exception(failed);
  } catch (const std::exception& e) {
    return user_message(e);
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

void PsTrainer::fail_at_meeting(const std::exception_ptr& failed, const std::string& name,
                                const std::string& what, double timeout_s, bool marks, bool meets) {
  State& s = *state_;
  if (marks && env_.trainers > 1) {
    // Set before the call, as tell_failure does: a mark whose reply was lost may still be there,
    // and the next train() must take it back.
    s.failure_marked = true;
    const Status marked =
        PsPeerWatch::mark_failed(*s.servers, env_.trainer_id, env_.trainers, message_of(failed),
                                 FailureNotice::kAtMeeting, s.run);
    if (!marked.ok()) GPUBOX_LOG(WARNING) << marked.to_string();
  }
  if (meets) {
    try {
      meet(name, what, timeout_s);  // the others learn of the failure now, not at their timeout
    } catch (const std::exception& e) {
      GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " failed, and then " << e.what();
    }
  }
  std::rethrow_exception(failed);
}

void PsTrainer::throw_if_marked(int w, const std::string& told,
                                const std::optional<std::string>& unmarked) {
  // Only what it reported in this run (a reason of an earlier train() is stale).
  StatusOr<std::string> reported =
      PsPeerWatch::failure_of(*state_->servers, w, env_.trainers, state_->run);
  if (!unmarked) throw_if_error(reported.status());
  if (reported.ok() && !reported->empty()) {
    throw PeerFailed(told + "; trainer " + std::to_string(w) + " reported: " + *reported);
  }
  if (unmarked) throw PeerFailed(told + *unmarked);
}

void PsTrainer::tell_failure(const std::exception& error) noexcept {
  State& s = *state_;
  if (env_.trainers == 1) return;
  // From here this trainer's watch judges no other trainer (PsPeerWatch::ignore_failed_peers): a
  // failure every trainer hit at once (divergence, a dead output) must not end this process
  // exit_grace_s later.
  if (s.watch != nullptr) s.watch->ignore_failed_peers();
  try {
    const std::string reason = user_message(error);
    // Logged before anything that can wait (or be ended by a watch's forced exit).
    GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " of " << env_.trainers
                        << " failed: " << reason;
    // A trainer that was told of another's failure (PeerFailed, or by its watch), or lost a
    // trainer or server, does not tell: every trainer hears of those on its own (and the first
    // server may not answer). Nor one that marked its failure already (at a meeting).
    const bool told_of_peer = dynamic_cast<const PeerFailed*>(&error) != nullptr ||
                              (s.watch != nullptr && !s.watch->lost().empty());
    if (told_of_peer || s.failure_marked) return;
    // Outside any train() (the constructor's meetings) there is no run to mark the failure in,
    // and no other trainer's watch to read it.
    if (s.run < 1) {
      GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " does not mark its failure for the "
                          << "other trainers' watches: it failed before its first train()";
      return;
    }
    // A short look first, so that an unreachable first server costs no call deadline.
    const double look_s = std::clamp(config_.runner.peer_timeout_s / 5, 0.2, 2.0);
    bool heard = false;
    const Status reachable = s.servers->ping(0, look_s, &heard);
    if (!heard) {
      GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " cannot tell the other trainers "
                          << "of its failure (they find it lost by its heartbeat): the first "
                          << "server does not answer: " << reachable.to_string();
      return;
    }
    // Another trainer that marked its failure first is what every trainer reports: a second
    // mark would make its watch report this one failed too (and end its process).
    StatusOr<int> first =
        PsPeerWatch::failed_peer(*s.servers, env_.trainer_id, env_.trainers, s.run);
    if (first.ok() && *first >= 0) {
      GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " does not mark its failure: trainer "
                          << *first << " marked its own first";
      // It ends its job: trainer `first`'s wait for its watch to see the mark (which it read
      // itself) does not wait for it, nor does any watch find it lost.
      if (s.watch != nullptr) {
        if (const Status ended = s.watch->finish(); !ended.ok()) {
          GPUBOX_LOG(WARNING) << ended.to_string();
        }
      }
      return;
    }
    s.failure_marked = true;
    std::vector<float> alive_at_mark;
    Status told = PsPeerWatch::mark_failed(*s.servers, env_.trainer_id, env_.trainers, reason,
                                           FailureNotice::kToWatches, s.run, &alive_at_mark);
    // Every other trainer's watch sees the mark at its next beat; this trainer's keeps beating
    // meanwhile (at most runner.peer_timeout_s: past it, the others find it lost anyway).
    if (told.ok() && s.watch != nullptr) {
      told = s.watch->wait_until_failure_seen(alive_at_mark, config_.runner.peer_timeout_s,
                                              s.hooks.stop_flag);
    }
    if (told.code() == Status::Code::kDeadlineExceeded) {
      GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " marked its failure; "
                          << told.to_string()
                          << "; a trainer whose watch did not see the mark yet reports it at its "
                             "next beat";
    } else if (!told.ok()) {
      GPUBOX_LOG(WARNING) << "trainer " << env_.trainer_id << " could not tell the other trainers "
                          << "of its failure (they find it lost by its heartbeat): "
                          << told.to_string();
    }
  } catch (const std::exception& e) {
    GPUBOX_LOG(WARNING) << "telling the other trainers of this trainer's failure: " << e.what();
  }
}

void PsTrainer::meet(const std::string& name, const std::string& what, double timeout_s) {
  if (env_.trainers == 1) return;
  if (order_hook_) order_hook_("meet " + name);
  const double collective_s = config_.runner.collective_timeout_s;
  std::ostringstream limit;  // seconds as written in a config: 20, 2.5
  if (timeout_s < 0) limit << "runner.collective_timeout_s=" << collective_s << " s";
  if (timeout_s >= 0) limit << timeout_s << " s";
  if (timeout_s < 0) timeout_s = collective_s;
  const Status met =
      state_->servers->barrier(name, static_cast<uint32_t>(env_.trainers), timeout_s);
  if (met.ok()) return;
  // The trainers that told their failure in the job's rendezvous folder, when it has one (a
  // gpubox-mode trainer of this job, refused naming the modes, never comes to the servers).
  std::string told;
  for (int t = 0; t < env_.trainers; ++t) {
    const std::string failure = t == env_.trainer_id ? "" : failure_told(env_, t);
    if (!failure.empty()) told += "; " + failure;
  }
  // A barrier is not retried (barrier_failure_cause says why it failed).
  throw_if_error(met.with_context("trainer " + std::to_string(env_.trainer_id) +
                                  ": waiting for all " + std::to_string(env_.trainers) +
                                  " trainers " + what + " (" + limit.str() +
                                  "): " + barrier_failure_cause(met) + told));
}

}  // namespace gpubox::trainer::ps_modes
