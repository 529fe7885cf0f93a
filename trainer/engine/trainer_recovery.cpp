// Trainer's recovery from a restarted server (trainer.hpp, checkpoint.hpp): the open pass, if
// any, is dropped from the cards and the last save reloaded into the servers. One trainer alone
// does so wherever it found the restart (its meetings are trivial: the phase alone); the
// trainers of a job agree after every phase that calls the servers (agree_on_restarts) whether
// one of them found a restart, and then all go back to the save trainer 0 chooses together.
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "common/error.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "heterps/device/card.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/restart_beside.hpp"

namespace gpubox::trainer {
namespace {

// What a trainer tells the others after a phase (agree_on_restarts).
constexpr int64_t kPhaseDone = 0;
constexpr int64_t kPhaseRestart = 1;  // it found a server restart
constexpr int64_t kPhaseFailed = 2;   // it failed otherwise
// It found a server restart and failed otherwise beside it (own_failure_beside_restart): the
// others name it, so that a pass stopped as asked ends with an error on every trainer.
constexpr int64_t kPhaseRestartFailed = 3;

// What trainer 0 tells the others of the save it goes back to (agree_on_save): the refusal
// (SaveLineage::Refusal, kNone when it goes back) in the low bits, the save's run pass above.
constexpr int64_t kRefusalCodes = 8;

// What the trainers told at a meeting after a phase: the first that failed otherwise, the first
// that found a server restart, the first that found one and failed otherwise beside it (-1:
// none).
struct PhaseTally {
  int failing = -1;
  int restarted = -1;
  int also_failing = -1;
};

PhaseTally count_phase_outcomes(const std::vector<int64_t>& told, std::size_t cards) {
  PhaseTally tally;
  for (std::size_t rank = 0; rank < told.size(); rank += cards) {
    const int t = static_cast<int>(rank / cards);
    const int64_t said = told[rank];
    if (said == kPhaseFailed && tally.failing < 0) tally.failing = t;
    const bool restart = said == kPhaseRestart || said == kPhaseRestartFailed;
    if (restart && tally.restarted < 0) tally.restarted = t;
    if (said == kPhaseRestartFailed && tally.also_failing < 0) tally.also_failing = t;
  }
  return tally;
}

// What `failed` says (whatever its type).
std::string what_failed(const std::exception_ptr& failed) {
  try {
    std::rethrow_exception(failed);
  } catch (const std::exception& e) {
    return user_message(e);
  } catch (...) {
  }
  return "an unknown exception";
}

// failure_beside_restart (restart_beside.hpp) of `failed`, this trainer's failure in the phase
// where it found a server restart (one that is no std::exception is named as such).
std::string own_failure_beside_restart(const std::exception_ptr& failed, table::HostTier& host) {
  try {
    std::rethrow_exception(failed);
  } catch (const std::exception& e) {
    return failure_beside_restart(e, host);
  } catch (...) {
  }
  return "an unknown exception";
}

// The job agreed on a restart after the phase `where`: an AgreedRestart is thrown in place of
// this trainer's own failure there (`own`, already logged, when it is not the restart's), naming
// the restarts it found (`restarts`), else the first trainer that found one (`tally`), then
// `own`, or else the first other trainer that failed beside the restart.
[[noreturn]] void throw_agreed_restart(const std::string& own, const std::string& where,
                                       const std::string& restarts, const PhaseTally& tally) {
  std::string also = own.empty() ? "" : "; " + AgreedRestart::also_failed("there", own);
  std::string other;
  if (own.empty() && tally.also_failing >= 0) {
    const std::string k = std::to_string(tally.also_failing);
    other = "trainer " + k + " also failed there (its log, log/worker." + k +
            ".log under scripts/run_gpubox.sh, names why)";
    also = "; " + other;
  }
  if (!restarts.empty()) throw AgreedRestart(where + ": " + restarts + also, own, where, other);
  throw AgreedRestart(
      "trainer " + std::to_string(tally.restarted) + " found a server restart " + where + also, own,
      where, other);
}

}  // namespace

std::optional<int64_t> Trainer::recover(const Error& error, int64_t pass) {
  // A pass stopped as asked, failed beside a restart: the run ends with it (stop_pass).
  if (dynamic_cast<const StoppedPassFailed*>(&error) != nullptr) return std::nullopt;
  const auto* agreed = dynamic_cast<const AgreedRestart*>(&error);
  if (agreed == nullptr || agreed->failure().empty()) return recover_unannotated(error, pass);
  try {
    return recover_unannotated(error, pass);
  } catch (const Error& stopped) {
    // A recovery refused names the failure found beside the restart (logged as the restart was
    // agreed) before what a rerun does (the restarts' clause, SaveLineage::recover's `beside`);
    // one that failed otherwise, or the restart's own error thrown again, is named with it here
    // unless its message holds it already.
    const bool plain =
        typeid(stopped) == typeid(Error) || typeid(stopped) == typeid(device::CardsFailed);
    if (!plain || stopped.message().find(agreed->failure()) != std::string::npos) {
      throw;
    }
    throw Error(stopped.message() + "; " + agreed->own_failure(), stopped.where());
  }
}

std::optional<int64_t> Trainer::recover_unannotated(const Error& error, int64_t pass) {
  // Several trainers: only a restart the whole job agreed on (every trainer is here with it);
  // any other failure is thrown again.
  const auto* agreed = dynamic_cast<const AgreedRestart*>(&error);
  const std::string beside = agreed != nullptr ? agreed->own_failure() : "";
  if (env_.trainers > 1) {
    if (agreed == nullptr) return std::nullopt;
    return recover_together(error, pass, beside);
  }
  // A server that restarted: the pass open on the cards (found in its write-back) is dropped as
  // a job drops it, the last save reloaded and the passes after it trained again
  // (checkpoint.hpp); anything else is thrown again, and so is a restart the lineage refuses to
  // go back for.
  State& s = *state_;
  const SaveLineage::OpenPass open =
      s.card_tier->in_pass() ? SaveLineage::OpenPass::kDropped : SaveLineage::OpenPass::kNone;
  // A restart found in a phase (agree_on_restarts), logged as found there: that phase cannot go
  // on whatever the lineage decides, so the card work is dropped before it is asked, as
  // agree_on_save drops it; a refusal then leaves no pass open nor passes read ahead from the
  // servers as they were.
  if (agreed != nullptr) {
    GPUBOX_LOG(WARNING) << error.message();
    drop_card_work();
  }
  // A server restarted while the save was reloaded (a staggered fleet restart) is accepted and
  // the save reloaded again (recover_and_reload).
  s.lineage->recover_and_reload(
      error, *s.host, open, pass,
      [this](const SaveLineage::Recovery& r) {
        pass_id_ = r.run_pass;
        load(r.dir);
      },
      [this] { drop_card_work(); }, beside,
      [](const Error& again, const std::string& dir) {
        // A reload's phase that found a restart beside a failure of this trainer's
        // (agree_on_restarts): that failure, named with the save it reloaded.
        const auto* agreed_again = dynamic_cast<const AgreedRestart*>(&again);
        if (agreed_again == nullptr || agreed_again->failure().empty()) return std::string();
        return AgreedRestart::also_failed("reloading " + dir, agreed_again->failure());
      });
  return pass_id_;
}

void Trainer::drop_card_work() {
  State& s = *state_;
  if (s.pipeline) s.pipeline->clear();  // rows staged from before the reload are stale
  s.card_tier->abandon_pass();          // no card thread runs now; its rows are the save's again
}

pass::PassStats Trainer::begin_pass_agreed(const std::vector<uint64_t>& keys,
                                           const std::vector<int32_t>& slots,
                                           const pass::StagedRows* staged, pass::PassAccess access,
                                           const std::string& where) {
  tier_owner::CardTier& tier = *state_->card_tier;
  pass::PassStats begin;
  if (env_.trainers == 1) {
    agree_on_restarts([&] { begin = tier.begin_pass(keys, slots, staged, access); }, where);
    return begin;
  }
  // Outside the meeting: every trainer is in the exchange, or fails out of train() before it.
  const tier_owner::CardTier::ReceivedKeys received = tier.exchange_keys(keys, slots);
  agree_on_restarts([&] { begin = tier.begin_received_pass(received, access); }, where);
  return begin;
}

bool Trainer::restart_found(bool failed) {
  table::HostTier& host = *state_->host;
  // After a failed call every server is asked who it is now (within a connect timeout), even
  // when a restart is already known: a call cut off as its server went down and came back saw
  // no restart itself, and the failure is classified (failure_beside_restart) once every
  // restarted server is known, so one cut off by another server of a fleet restart is not
  // 'also failed'. The PS modes do the same.
  if (failed) SaveLineage::find_restarts(host, config_.host_tier.remote.connect_timeout_s);
  return !SaveLineage::describe_restarts(host).empty();
}

void Trainer::agree_on_restarts(const std::function<void()>& phase, const std::string& where,
                                bool count_held_restarts) {
  if (env_.trainers == 1) {
    // A meeting of one: a failure in which this trainer finds a server restart is the restart
    // it agrees on (recover() goes back; a stopped pass ends stopped), any other is thrown as it
    // is. Only a phase that calls the servers asks them who they are after its failure
    // (`count_held_restarts`; reading a save's files knows only the restarts already found).
    // recover() names the restarts from the client; the message is for a caller that does not
    // recover (infer_job, evaluate, save), the phase's error with its advice.
    try {
      if (meeting_hook_) meeting_hook_(where);
      phase();
    } catch (const Error& e) {
      if (!restart_found(/*failed=*/count_held_restarts)) throw;
      const std::string own = failure_beside_restart(e, *state_->host);
      if (own.empty()) throw AgreedRestart(where + ": " + user_message(e));
      // Another failure beside the restart: the restart named first, the phase once, then the
      // failure and a rerun's advice.
      throw AgreedRestart(where + ": " + SaveLineage::describe_restarts(*state_->host) + "; " +
                              AgreedRestart::also_failed("there", own) +
                              "; rerun to resume from the last save",
                          own, where);
    }
    return;
  }
  std::exception_ptr failed;
  try {
    if (meeting_hook_) meeting_hook_(where);
    phase();
  } catch (...) {
    failed = std::current_exception();
  }
  const bool restart = (failed || count_held_restarts) && restart_found(failed != nullptr);
  // This trainer's failure beside the restart it found (logged as it is), "" when none.
  std::string own;
  if (restart && failed) {
    GPUBOX_LOG(WARNING) << where << ": " << what_failed(failed);
    own = own_failure_beside_restart(failed, *state_->host);
  }
  const int64_t mine = !restart      ? (failed ? kPhaseFailed : kPhaseDone)
                       : own.empty() ? kPhaseRestart
                                     : kPhaseRestartFailed;
  std::vector<int64_t> told;
  try {
    told = gather_over_job(std::vector<int64_t>(static_cast<std::size_t>(num_cards()), mine),
                           where.c_str());
  } catch (const Error&) {
    if (failed) std::rethrow_exception(failed);  // the cause, not the meeting it missed
    throw;
  }
  const PhaseTally tally = count_phase_outcomes(told, static_cast<std::size_t>(num_cards()));
  if (tally.failing < 0 && tally.restarted < 0) return;
  if (tally.failing >= 0 && mine == kPhaseFailed) std::rethrow_exception(failed);
  const std::string restarts = restart ? SaveLineage::describe_restarts(*state_->host) : "";
  if (tally.failing >= 0) {
    GPUBOX_FAIL("trainer ", tally.failing, " failed ", where, " (its log, log/worker.",
                tally.failing, ".log under scripts/run_gpubox.sh, names why), so the job stops",
                restarts.empty() ? "" : "; this trainer found a server restart there: " + restarts);
  }
  throw_agreed_restart(own, where, restarts, tally);
}

SaveLineage::Recovery Trainer::agree_on_save(int64_t pass, const std::string& beside) {
  State& s = *state_;
  const SaveLineage::OpenPass open =
      s.card_tier->in_pass() ? SaveLineage::OpenPass::kDropped : SaveLineage::OpenPass::kNone;
  drop_card_work();
  // Every restarted server named and accepted before trainer 0 reloads them.
  SaveLineage::find_restarts(*s.host, config_.host_tier.remote.connect_timeout_s);
  std::string what = SaveLineage::describe_restarts(*s.host);
  if (what.empty()) what = "another trainer of the job found a server restart";
  if (!beside.empty()) what += "; " + beside;  // named before what a rerun does
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
  const int64_t told =
      gather_over_job(std::vector<int64_t>(static_cast<std::size_t>(num_cards()), choice),
                      "the save trainer 0 goes back to")
          .at(0);
  if (failed) std::rethrow_exception(failed);
  if (env_.trainer_id == 0) return recovery;
  const auto why = static_cast<SaveLineage::Refusal>(told % kRefusalCodes);
  if (why != SaveLineage::Refusal::kNone) {
    GPUBOX_FAIL("pass ", pass, ": ", what, "; trainer 0 cannot go back to a save (",
                SaveLineage::describe(why, kTrainerZeroLog), "), so the job stops; ",
                s.lineage->rerun_outcome(false));
  }
  recovery.run_pass = told / kRefusalCodes;  // its folder: found where load() reads it
  return recovery;
}

std::optional<int64_t> Trainer::recover_together(const Error& error, int64_t pass,
                                                 const std::string& beside) {
  GPUBOX_LOG(WARNING) << error.message()
                      << "; going back to the last save with every trainer of the job";
  for (;;) {
    const SaveLineage::Recovery recovery = agree_on_save(pass, beside);
    pass_id_ = recovery.run_pass;
    // Trainer 0 knows the save's folder; another finds it in its lineage (model_save_path), in
    // load()'s first phase, so that one that cannot stops the others at once.
    const auto locate = [&] {
      if (env_.trainer_id == 0) return recovery.dir;
      std::string dir = state_->lineage->save_dir_of(recovery.run_pass);
      GPUBOX_LOG(WARNING) << "pass " << pass << ": reloading " << dir
                          << " with every trainer of the job and training the passes after it "
                             "again";
      return dir;
    };
    std::string dir;
    try {
      dir = load_located(locate, "the save trainer 0 goes back to");  // a collective
    } catch (const AgreedRestart&) {
      // A server that restarted during the reload: every trainer goes back again (trainer 0's
      // lineage gives up after a few); any other failure stops the job.
      continue;
    }
    GPUBOX_LOG(INFO) << "reloaded " << dir << " into the servers " << env_.servers
                     << " with the job's " << env_.trainers
                     << " trainers; training again from pass " << pass_id_;
    return pass_id_;
  }
}

}  // namespace gpubox::trainer
