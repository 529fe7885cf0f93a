// Trainer's recovery from a restarted server (trainer.hpp, checkpoint.hpp): one trainer alone
// reloads its last save; the trainers of a job agree after every phase that calls the servers
// (agree_on_restarts) whether one of them found a restart, and then all go back to the save
// trainer 0 chooses together.
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/schedule/checkpoint.hpp"

namespace gpubox::trainer {
namespace {

// What a trainer tells the others after a phase (agree_on_restarts).
constexpr int64_t kPhaseDone = 0;
constexpr int64_t kPhaseRestart = 1;  // it found a server restart
constexpr int64_t kPhaseFailed = 2;   // it failed otherwise

// What trainer 0 tells the others of the save it goes back to (agree_on_save): the refusal
// (SaveLineage::Refusal, kNone when it goes back) in the low bits, the save's run pass above.
constexpr int64_t kRefusalCodes = 8;

}  // namespace

std::optional<int64_t> Trainer::recover(const Error& error, int64_t pass) {
  if (env_.trainers > 1) return recover_together(error, pass);
  // A server that restarted while no pass was open: reload the last save and train the passes
  // after it again (checkpoint.hpp); anything else is thrown again.
  State& s = *state_;
  // A server restarted while the save was reloaded (a staggered fleet restart) is accepted and
  // the save reloaded again (recover_and_reload).
  s.lineage->recover_and_reload(
      error, *s.host,
      s.card_tier->in_pass() ? SaveLineage::OpenPass::kFails : SaveLineage::OpenPass::kNone, pass,
      [this, &s](const SaveLineage::Recovery& r) {
        if (s.pipeline) s.pipeline->clear();  // rows staged from before the reload are stale
        pass_id_ = r.run_pass;
        load(r.dir);
      });
  return pass_id_;
}

bool Trainer::restart_found(bool failed) {
  table::HostTier& host = *state_->host;
  if (!SaveLineage::describe_restarts(host).empty()) return true;
  if (!failed) return false;
  // A call cut off as its server went down and came back saw no restart itself: every server is
  // asked who it is now.
  SaveLineage::find_restarts(host, config_.host_tier.remote.connect_timeout_s);
  return !SaveLineage::describe_restarts(host).empty();
}

void Trainer::agree_on_restarts(const std::function<void()>& phase, const std::string& where,
                                bool held_counts) {
  if (env_.trainers == 1) {
    phase();
    return;
  }
  restart_agreed_ = false;  // what the job agrees here, not at an earlier meeting
  std::exception_ptr failed;
  try {
    phase();
  } catch (...) {
    failed = std::current_exception();
  }
  const bool restart = (failed || held_counts) && restart_found(failed != nullptr);
  const int64_t mine = restart ? kPhaseRestart : failed ? kPhaseFailed : kPhaseDone;
  std::vector<int64_t> told;
  try {
    told = gather_over_job(std::vector<int64_t>(static_cast<std::size_t>(num_cards()), mine),
                           where.c_str());
  } catch (const Error&) {
    if (failed) std::rethrow_exception(failed);  // the cause, not the meeting it missed
    throw;
  }
  // The first trainer that failed otherwise, else the first that found a restart.
  const auto cards = static_cast<std::size_t>(num_cards());
  int failing = -1, restarted = -1;
  for (std::size_t rank = 0; rank < told.size(); rank += cards) {
    const int t = static_cast<int>(rank / cards);
    if (told[rank] == kPhaseFailed && failing < 0) failing = t;
    if (told[rank] == kPhaseRestart && restarted < 0) restarted = t;
  }
  if (failing < 0 && restarted < 0) return;
  restart_agreed_ = failing < 0;
  if (failed && restart_agreed_) {
    try {
      std::rethrow_exception(failed);
    } catch (const Error& e) {
      // The log says where the job went back from (check_servers's error says it already).
      if (e.message().rfind(where, 0) == 0) throw;
      throw with_context(where + ": ", e);
    }
  }
  if (failed) std::rethrow_exception(failed);
  if (restart_agreed_) {
    if (restart) GPUBOX_FAIL(where, ": ", SaveLineage::describe_restarts(*state_->host));
    GPUBOX_FAIL("trainer ", restarted, " found a server restart ", where);
  }
  GPUBOX_FAIL("trainer ", failing, " failed ", where, " (its log, log/worker.", failing,
              ".log under scripts/run_gpubox.sh, names why)");
}

SaveLineage::Recovery Trainer::agree_on_save(int64_t pass) {
  State& s = *state_;
  const SaveLineage::OpenPass open =
      s.card_tier->in_pass() ? SaveLineage::OpenPass::kDropped : SaveLineage::OpenPass::kNone;
  s.card_tier->abandon_pass();          // its rows are the save's again after the reload
  if (s.pipeline) s.pipeline->clear();  // rows staged from before the reload are stale
  // Every restarted server named and accepted before trainer 0 reloads them.
  SaveLineage::find_restarts(*s.host, config_.host_tier.remote.connect_timeout_s);
  std::string what = SaveLineage::describe_restarts(*s.host);
  if (what.empty()) what = "another trainer of the job found a server restart";
  SaveLineage::Recovery recovery;
  std::exception_ptr failed;
  auto refusal = SaveLineage::Refusal::kNone;
  if (env_.trainer_id == 0) {
    try {
      recovery = s.lineage->go_back(what, *s.host, open, pass);
    } catch (...) {
      failed = std::current_exception();
      refusal = s.lineage->refusal();
    }
  } else {
    SaveLineage::accept_restarts(*s.host);
  }
  // The others learn trainer 0's choice, or its refusal, now, not at a collective's timeout.
  const int64_t choice = static_cast<int64_t>(refusal) + kRefusalCodes * recovery.run_pass;
  const std::vector<int64_t> told =
      gather_over_job(std::vector<int64_t>(static_cast<std::size_t>(num_cards()), choice),
                      "the save trainer 0 goes back to");
  if (failed) std::rethrow_exception(failed);
  if (env_.trainer_id == 0) return recovery;
  const auto why = static_cast<SaveLineage::Refusal>(told.at(0) % kRefusalCodes);
  GPUBOX_EXPECTS(why == SaveLineage::Refusal::kNone, "pass ", pass, ": ", what,
                 "; trainer 0 cannot go back to a save (",
                 SaveLineage::describe(why, "log/worker.0.log under scripts/run_gpubox.sh"),
                 "), so the job stops; ", s.lineage->rerun_outcome(false));
  recovery.run_pass = told.at(0) / kRefusalCodes;
  recovery.dir = s.lineage->save_dir_of(recovery.run_pass);
  GPUBOX_LOG(WARNING) << "pass " << pass << ": " << what << ". Reloading " << recovery.dir
                      << " with every trainer of the job and training the passes after it again";
  return recovery;
}

std::optional<int64_t> Trainer::recover_together(const Error& error, int64_t pass) {
  // Only a restart the whole job agreed on: every trainer is here with it. Any other failure
  // is thrown again, as before.
  if (!restart_agreed_) return std::nullopt;
  GPUBOX_LOG(WARNING) << error.message()
                      << "; going back to the last save with every trainer of the job";
  for (;;) {
    restart_agreed_ = false;
    const SaveLineage::Recovery recovery = agree_on_save(pass);
    pass_id_ = recovery.run_pass;
    try {
      load(recovery.dir);  // collective: trainer 0 has the servers load it
    } catch (const Error&) {
      // A server that restarted during the reload: every trainer goes back again (trainer 0's
      // lineage gives up after a few); any other failure stops the job.
      if (!restart_agreed_) throw;
      continue;
    }
    GPUBOX_LOG(INFO) << "reloaded " << recovery.dir << " into the servers " << env_.servers
                     << " with the job's " << env_.trainers
                     << " trainers; training again from pass " << pass_id_;
    return pass_id_;
  }
}

}  // namespace gpubox::trainer
