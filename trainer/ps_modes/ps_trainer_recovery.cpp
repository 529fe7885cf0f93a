// PsTrainer's recovery from a restarted server (ps_trainer.hpp, its file comment): one trainer
// alone, or the trainers of a job of several together.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "heterps/device/card.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/restart_beside.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;

// Per trainer, pass + 1 of the pass in which it found a server restart (found in an epoch's
// evaluation, after the epoch's last pass: the next one); 0 while none since the job's start
// (start_job zeroes it, and a trainer votes at most once before the job starts again after the
// restart). Then, per trainer, pass + 1 again when its threads also failed otherwise there.
constexpr const char* kRestartVotesTable = "ps_restart_votes";
// What trainer 0 tells the others once every trainer met to go back: {SaveLineage::encode of
// kNone, or of why it refuses; the pass of the save it reloads (SaveLineage::Recovery::run_pass)}.
constexpr const char* kRecoveryTable = "ps_recovery";

}  // namespace

std::optional<int64_t> PsTrainer::recover(const Error& error, int64_t pass) {
  State& s = *state_;
  if (repairs_together()) return recover_together(error, pass);
  // Only a restart a call saw (Aborted, naming the server) is repaired. A call that failed while
  // a server was down saw none, and the pass fails naming it even if the server is back as
  // another instance by now: asking the servers again then would race the server's return.
  if (SaveLineage::describe_restarts(*s.servers).empty()) return std::nullopt;  // fails as before
  // The order matters: the old threads are dropped (the row calls and dense add they still had
  // queued not sent, those under way waited for, their failures expected and not logged:
  // PsWorker::abandon) after every server was asked who it is and before the restarts are
  // accepted, so that none of their pushes lands on an accepted server before the reload (to a
  // restart not yet accepted, a call under way fails Aborted); only then are the restarts
  // accepted and new threads made. A thread whose server call failed is unusable
  // (PsWorker), and the restarted servers lost the job's tables: the job starts again as a
  // resume in a new process starts it, from the save.
  // Every restarted server known before this trainer's failure is classified (one cut off by a
  // server of a fleet restart names a restart too); recover() asks again, finding the same.
  SaveLineage::find_restarts(*s.servers, config_.host_tier.remote.connect_timeout_s);
  const std::string beside = own_failure_in_pass(error, pass);
  const SaveLineage::Recovery recovery = s.lineage->recover_and_reload(
      error, *s.servers, SaveLineage::OpenPass::kRetried, pass,
      [this](const SaveLineage::Recovery& r) {
        make_workers();
        start_job(/*recovery=*/true);
        pass_id_ = r.run_pass;
        load(r.dir);
      },
      [this] { drop_workers(); }, beside);
  GPUBOX_LOG(INFO) << "reloaded " << recovery.dir << " into the servers " << env_.servers
                   << "; training again from pass " << pass_id_;
  return pass_id_;
}

bool PsTrainer::repairs_together() const { return env_.trainers > 1; }

int PsTrainer::local_cards() const { return state_->cards.num_local_cards(); }

std::string PsTrainer::own_failure_in_pass(const Error& error, int64_t pass, bool after) const {
  const auto* cards = dynamic_cast<const device::CardsFailed*>(&error);
  if (cards == nullptr) return "";
  const std::string own = card_failures_beside_restart(cards->failures(), *state_->servers);
  if (own.empty()) return "";
  return "this trainer also failed " + std::string(after ? "after" : "in") + " pass " +
         std::to_string(pass) + ": " + own;
}

std::string PsTrainer::own_failure_in_pass(const std::exception_ptr& error, int64_t pass) const {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return own_failure_in_pass(e, pass);
  } catch (...) {
  }
  return "";
}

std::string PsTrainer::other_failed_in_pass(int64_t pass, bool voted_after, bool after) {
  const auto trainers = static_cast<std::size_t>(env_.trainers);
  std::vector<float> votes(2 * trainers, 0.0f);
  // Bounded like a ping: a first server down (it holds the votes) does not hold the recovery.
  table::server::DenseCall call;
  call.deadline_s = config_.host_tier.remote.connect_timeout_s;
  call.mutation = false;
  if (!state_->servers->dense(DenseAction::kRead, kRestartVotesTable, &votes, call).ok()) {
    return "";
  }
  // A restart found after the pass's vote is voted for the pass after (vote_after_evaluation).
  const auto mark = static_cast<float>(voted_after ? pass + 2 : pass + 1);
  for (std::size_t k = 0; k < trainers; ++k) {
    if (k == static_cast<std::size_t>(env_.trainer_id)) continue;
    // With the trainer's vote for the pass: a mark left by an earlier train() of this object
    // (its recovery refused, the table not reset since) whose vote was added to again is not
    // this pass's.
    if (votes[k] != mark || votes[trainers + k] != mark) continue;
    return detail::concat("trainer ", k, " also failed ", after ? "after" : "in", " pass ", pass,
                          " (its log, log/workerlog.", k, " under scripts/launch.sh, names why)");
  }
  return "";
}

Status PsTrainer::reset_restart_votes() {
  std::vector<float> zeros(2 * static_cast<std::size_t>(env_.trainers), 0.0f);
  return state_->servers->dense(DenseAction::kWrite, kRestartVotesTable, &zeros)
      .with_context("resetting the servers' table " + std::string(kRestartVotesTable));
}

void PsTrainer::drop_workers() {
  State& s = *state_;
  for (auto& worker : s.workers) worker->abandon();
  s.workers.clear();
  s.pushes.reset();
}

bool PsTrainer::restart_found() {
  State& s = *state_;
  if (restart_agreed_ || !SaveLineage::describe_restarts(*s.servers).empty()) return true;
  // A call cut off as its server went down and came back (a barrier of the first server is not
  // retried) found no restart itself: every server is asked who it is now.
  SaveLineage::find_restarts(*s.servers, config_.host_tier.remote.connect_timeout_s);
  return !SaveLineage::describe_restarts(*s.servers).empty();
}

void PsTrainer::vote_restart(int64_t pass, bool also_failed) {
  const auto trainers = static_cast<std::size_t>(env_.trainers);
  const auto me = static_cast<std::size_t>(env_.trainer_id);
  std::vector<float> vote(2 * trainers, 0.0f);
  vote[me] = static_cast<float>(pass + 1);
  if (also_failed) vote[trainers + me] = static_cast<float>(pass + 1);
  throw_if_error(
      state_->servers->dense(DenseAction::kAdd, kRestartVotesTable, &vote)
          .with_context("voting that a server restarted in pass " + std::to_string(pass)));
}

bool PsTrainer::restart_voted(int64_t pass) {
  const auto trainers = static_cast<std::size_t>(env_.trainers);
  std::vector<float> votes(2 * trainers, 0.0f);
  throw_if_error(
      state_->servers->dense(DenseAction::kRead, kRestartVotesTable, &votes)
          .with_context("reading the votes on a server restart in pass " + std::to_string(pass)));
  const float mark = static_cast<float>(pass + 1);
  const auto last = votes.begin() + static_cast<std::ptrdiff_t>(trainers);
  return std::any_of(votes.begin(), last, [mark](float v) { return v == mark; });
}

void PsTrainer::agree_after_evaluation(int64_t pass) {
  if (!repairs_together()) return;
  const std::string p = std::to_string(pass);
  bool voted = false;
  try {
    // Every vote for a restart found in this evaluation is cast before its trainer meets here
    // (recover_together): every trainer reads the same ones.
    meet("ps/evaluated/" + p, "after the evaluation of pass " + p);
    voted = restart_voted(pass + 1);
  } catch (const Error&) {
    // As at the pass's vote (agree_on_restart): a trainer that cannot meet the others here goes
    // back with them when a restart is known, and fails as before when none is.
    if (!restart_found()) throw;
    restart_agreed_ = true;
    throw;
  }
  if (!voted) return;
  restart_agreed_ = true;
  GPUBOX_FAIL("after the evaluation of pass ", pass,
              ": another trainer of the job found a server restart in it");
}

bool PsTrainer::agree_on_restart(int64_t pass, const std::exception_ptr& restarted,
                                 const std::function<void()>& meet_all) {
  State& s = *state_;
  const double timeout_s = config_.host_tier.remote.connect_timeout_s;
  bool found = restarted != nullptr;
  try {
    if (found) {
      // A restart of the first server, which holds the votes and the barriers, is the vote's
      // answer: every trainer finds it at its next call to it (this vote's, at the latest).
      SaveLineage::find_restarts(*s.servers, timeout_s);
      if (s.servers->restart_pending(0)) return restart_agreed_ = true;
      // Classified once every restarted server is known (a call cut off by another one of a
      // fleet restart names a restart too).
      vote_restart(pass, !own_failure_in_pass(restarted, pass).empty());
    }
    // Every vote is cast before its trainer meets: every trainer reads the same ones.
    meet_all();
    found = restart_voted(pass) || found;
  } catch (const Error& e) {
    // The vote's own calls found the first server restarted (or lost it as it restarted), or
    // this trainer found a restart and waited out another trainer late to the meeting: with a
    // restart known, this trainer goes back. The late one meets nobody (this one left), waits
    // out its own timeout, and goes back too when it finds a restart by asking every server who
    // it is (restart_found); the recovery meeting waits for that (kRecoveryWaits).
    if (!restart_found()) throw;
    GPUBOX_LOG(WARNING) << "pass " << pass << ": " << e.what()
                        << "; a server restarted: going back to the last save with the others";
    found = true;
  }
  restart_agreed_ = found;
  return found;
}

void PsTrainer::vote_after_evaluation(int64_t pass, const Error& error) {
  State& s = *state_;
  // Found after pass `pass`'s vote by this trainer's own calls (an epoch's evaluation): the
  // others hear of it where every trainer meets after the evaluation (agree_after_evaluation),
  // this one with its vote for the pass after. A restart of the first server, which holds the
  // votes and the barriers, needs no vote: every trainer finds it at its next call to it
  // (every server is asked who it is first). Trainer 0's save tells the others itself.
  drop_workers();
  const double timeout_s = config_.host_tier.remote.connect_timeout_s;
  SaveLineage::find_restarts(*s.servers, timeout_s);
  bool voted = false;
  if (!s.servers->restart_pending(0)) {  // the first server (the votes') not restarted
    const std::string p = std::to_string(pass);
    try {
      // Classified once every restarted server is known (above).
      vote_restart(pass + 1, !own_failure_in_pass(error, pass, /*after=*/true).empty());
      voted = true;
      meet("ps/evaluated/" + p, "after the evaluation of pass " + p);
    } catch (const Error& e) {
      // The restart is known (the caller found it), so this trainer goes back whatever failed
      // here, as agree_on_restart does. The vote counts only when this trainer reaches the
      // meeting after it; another that hears neither (the vote not taken, the first server
      // restarted since it was asked, or this one gone from the meeting before it came) waits
      // out the meeting after the evaluation and finds the restart itself by asking every
      // server who it is (agree_after_evaluation's restart_found); the recovery meeting waits
      // for it (kRecoveryWaits). Every restarted server is found again here (the first one too).
      SaveLineage::find_restarts(*s.servers, timeout_s);
      GPUBOX_LOG(WARNING) << e.what() << (voted ? "" : " (the vote was not cast)")
                          << "; going back to the last save with the others";
    }
  }
  restart_agreed_ = true;
}

SaveLineage::Recovery PsTrainer::choose_save(const std::string& what, int64_t pass,
                                             std::exception_ptr* failed) {
  State& s = *state_;
  SaveLineage::Recovery recovery;
  float outcome = SaveLineage::encode(SaveLineage::Refusal::kNone);
  try {
    recovery = s.lineage->go_back(what, *s.servers, SaveLineage::OpenPass::kRetried, pass);
  } catch (...) {
    *failed = std::current_exception();
    s.servers->accept_restarts();  // the others hear of it through the first server
    outcome = SaveLineage::encode(s.lineage->refusal());
  }
  std::vector<float> told = {outcome, static_cast<float>(recovery.run_pass)};
  const Status written = s.servers->dense(DenseAction::kWrite, kRecoveryTable, &told);
  if (!*failed) throw_if_error(written.with_context("telling the other trainers the save"));
  return recovery;
}

SaveLineage::Recovery PsTrainer::read_chosen_save(const std::string& what, int64_t pass) {
  State& s = *state_;
  std::vector<float> told(2, 0.0f);
  throw_if_error(s.servers->dense(DenseAction::kRead, kRecoveryTable, &told)
                     .with_context("reading the save trainer 0 goes back to"));
  const SaveLineage::Refusal why = SaveLineage::decode(told[0]);
  if (why != SaveLineage::Refusal::kNone) {
    // Told by trainer 0 (which marked it): PeerFailed, so that this trainer does not tell in turn.
    throw PeerFailed(detail::concat("pass ", pass, ": ", what,
                                    "; trainer 0 cannot go back to a save (",
                                    SaveLineage::describe(why,
                                                          "log/workerlog.0 under "
                                                          "scripts/launch.sh"),
                                    "), so the job stops; ", s.lineage->rerun_outcome(false)));
  }
  SaveLineage::Recovery recovery;
  recovery.run_pass = std::lround(told[1]);
  recovery.dir = s.lineage->save_dir_of(recovery.run_pass);
  // Run pass 0 is the model the job started from (runner.model_init_path, --load, Python's
  // load()) before its first save, which every trainer loaded itself from the same config: its
  // folder holds the save of the pass it was made in, not 0. A later run pass's folder is named
  // by it (save_dir_of): what it holds must be that pass's save.
  if (recovery.run_pass > 0) {
    int64_t saved = 0;
    try {
      saved = plan_restore(recovery.dir, false).save().manifest.pass;
    } catch (const Error& e) {
      throw with_context("pass " + std::to_string(pass) + ": reading the save trainer 0 goes " +
                             "back to, " + recovery.dir + " (trainer 0 writes it under " +
                             "runner.model_save_path: every trainer must see it, a shared mount " +
                             "at the same path): ",
                         e);
    }
    GPUBOX_EXPECTS(saved == recovery.run_pass, "pass ", pass,
                   ": trainer 0 goes back to the save of pass ", recovery.run_pass - 1, " and ",
                   recovery.dir, " holds the save of pass ", saved - 1,
                   ": every trainer must see the saves trainer 0 writes (a folder they share)");
  }
  GPUBOX_LOG(WARNING) << "pass " << pass << ": " << what << ". Reloading " << recovery.dir
                      << " with every trainer of the job and training the passes after it again";
  return recovery;
}

SaveLineage::Recovery PsTrainer::meet_to_go_back(int64_t pass,
                                                 const std::function<std::string()>& beside_of) {
  State& s = *state_;
  // From here no thread of any trainer sends anything until the save is reloaded: each trainer
  // drops its threads before it meets the others, and trainer 0 reloads after they met.
  drop_workers();
  SaveLineage::find_restarts(*s.servers, config_.host_tier.remote.connect_timeout_s);
  const std::string pending = SaveLineage::describe_restarts(*s.servers);
  const std::string beside = beside_of();  // once every restarted server is known
  std::string what =
      restarts_found_ + (restarts_found_.empty() || pending.empty() ? "" : "; ") + pending;
  if (what.empty()) what = "another trainer of the job found a server restart";
  restarts_found_.clear();
  restart_agreed_ = false;
  // Named by the run and the recovery's number in it (TrainerZeroParts), the same on every
  // trainer that comes: one left by a recovery that failed in an earlier run is another meeting.
  const std::string name = "ps/recover/" + std::to_string(s.run) + "." +
                           std::to_string(trainer_zero_parts_.begin_recovery());
  const std::string meeting = "to go back to the last save together after " + what;
  SaveLineage::Recovery recovery;
  std::exception_ptr failed;
  // This trainer's own failure beside the restarts, named in its refusal before what a rerun
  // does (not in the meeting's name: the others' differ).
  const std::string named = beside.empty() ? what : what + "; " + beside;
  if (env_.trainer_id == 0) {
    recovery = choose_save(named, pass, &failed);
  } else {
    s.servers->accept_restarts();
  }
  const double wait_s = kRecoveryWaits * config_.runner.collective_timeout_s;
  // Trainer 0's refusal, marked for that meeting: the others read it there (read_chosen_save).
  if (failed) fail_at_meeting(failed, name, meeting, wait_s);
  meet(name, meeting, wait_s);
  if (env_.trainer_id != 0) recovery = read_chosen_save(named, pass);
  return recovery;
}

std::optional<int64_t> PsTrainer::recover_together(const Error& error, int64_t pass) {
  // The failure came from the pass's training (agreed at the pass's vote, or not: a call cut
  // off as a server went down, found only now), or after it: an epoch's evaluation, a save, or
  // another trainer's, heard at the meeting after them.
  const bool after_pass = training_pass_ != pass;
  training_pass_ = -1;
  if (!restart_found()) return std::nullopt;  // fails as before
  GPUBOX_LOG(WARNING) << "pass " << pass << ": " << error.what()
                      << "; a server restarted: going back to the last save with the others";
  // A recovery that fails or is refused leaves the trainer with training threads, as it found
  // it (their servers' restarts accepted): the object stays usable (an evaluation, train()).
  struct RemakeOnThrow {
    PsTrainer& trainer;
    const int uncaught = std::uncaught_exceptions();
    ~RemakeOnThrow() {
      if (std::uncaught_exceptions() == uncaught) return;
      try {
        trainer.make_workers();
      } catch (const std::exception& e) {
        GPUBOX_LOG(WARNING) << "making the training threads again after a failed recovery: "
                            << e.what();
      }
    }
  } remake{*this};
  // The vote that agreed on the restart, whose marks tell who else failed: the pass's, or the one
  // after the pass (for the pass after): this trainer's own below, a failure of the pass's
  // training among them when the pass's vote did not agree (its restart found only now), or
  // another trainer's heard at the meeting after an evaluation.
  const bool voted_after = after_pass || !restart_agreed_;
  if (!restart_agreed_) vote_after_evaluation(pass, error);
  // Found at the first round (every restarted server known then) and named at each.
  std::optional<std::string> beside;
  const auto beside_of = [&] {
    if (beside) return *beside;
    beside = own_failure_in_pass(error, pass, after_pass);
    if (beside->empty()) beside = other_failed_in_pass(pass, voted_after, after_pass);
    return *beside;
  };
  for (;;) {
    const SaveLineage::Recovery recovery = meet_to_go_back(pass, beside_of);
    pass_id_ = recovery.run_pass;
    try {
      make_workers();
      start_job(/*recovery=*/true);
      load(recovery.dir);
    } catch (const Error&) {
      // A server that restarted during the reload: every trainer goes back again (trainer 0's
      // lineage gives up after a few); any other failure stops the job.
      if (!restart_found()) throw;
      continue;
    }
    GPUBOX_LOG(INFO) << "reloaded " << recovery.dir << " into the servers " << env_.servers
                     << " with the job's " << env_.trainers
                     << " trainers; training again from pass " << pass_id_;
    return pass_id_;
  }
}

}  // namespace gpubox::trainer::ps_modes
