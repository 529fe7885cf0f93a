// SaveLineage's going back to the last save after a server restart (checkpoint.hpp's "A server
// restart during the run"): finding and naming the restarted servers, the reload, and why a
// trainer refuses to go back. The saves themselves and their restore: checkpoint.cpp.
#include <cctype>
#include <functional>
#include <string>

#include "common/logging.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/detail/save_lineage_detail.hpp"

namespace gpubox::trainer {
namespace {

using detail::as_remote;
using detail::describe_start;

// Server restarts repaired in one run before it gives up: a server that keeps restarting is not
// something a reload repairs.
constexpr int kMaxRecoveries = 3;

}  // namespace

std::string SaveLineage::describe_restarts(table::HostTier& host) {
  auto* remote = as_remote(host);
  if (remote == nullptr) return "";
  std::string what;
  for (const auto& r : remote->pending_restarts()) {
    what += (what.empty() ? "" : "; ") + r.what_was_lost();
  }
  return what;
}

bool SaveLineage::names_a_restart(const std::string& failure, table::HostTier& host) {
  auto* remote = as_remote(host);
  if (remote == nullptr) return false;
  for (const auto& restart : remote->pending_restarts()) {
    if (names_server(failure, restart.where)) return true;
  }
  return false;
}

bool SaveLineage::names_server(const std::string& text, const std::string& where) {
  if (where.empty()) return false;
  // A char that continues a host name or address before it: job_ps1:6000 and the IPv6
  // fe80:1::2:6000 are other servers than ps1:6000 and 1::2:6000.
  const auto host_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == '_' ||
           c == ':';
  };
  for (auto at = text.find(where); at != std::string::npos; at = text.find(where, at + 1)) {
    const std::size_t end = at + where.size();
    const bool starts = at == 0 || !host_char(text[at - 1]);
    const bool ends =
        end == text.size() || std::isdigit(static_cast<unsigned char>(text[end])) == 0;
    if (starts && ends) return true;
  }
  return false;
}

void SaveLineage::find_restarts(table::HostTier& host, double timeout_s) {
  auto* remote = as_remote(host);
  if (remote == nullptr) return;
  // A restarted server's ping fails Aborted and leaves its restart pending; one down fails
  // Unavailable: either way the answer is in pending_restarts(), not in the status.
  for (std::size_t e = 0; e < remote->endpoint_count(); ++e) (void)remote->ping(e, timeout_s);
}

std::string SaveLineage::rerun_outcome(bool writes_saves) const {
  const RunnerConfig& r = config_.runner;
  if (r.resume == ResumeMode::kOff) {
    return "runner.resume is off: running the command again starts " + describe_start(origin_);
  }
  // Before last_: a trainer that writes no save knows only the save it loaded, which trainer
  // 0's saves since have replaced.
  if (!writes_saves && !r.model_save_path.empty() && r.save_mode != table::SaveKind::kNone) {
    return "running the command again resumes from the newest complete save under " +
           r.model_save_path + " (trainer 0 writes them) if one was made, else starts " +
           describe_start(origin_);
  }
  if (last_) return "running the command again resumes from " + last_save();
  return "no save was made or loaded yet: running the command again starts " +
         describe_start(origin_);
}

SaveLineage::Recovery SaveLineage::recover(const Error& error, table::HostTier& host, OpenPass open,
                                           int64_t pass, const std::function<void()>& before_accept,
                                           const std::string& beside) {
  if (describe_restarts(host).empty()) throw error;
  // The failed call named the first restarted server it met; the others are found now, so that
  // they are all named and accepted together, before one reload.
  find_restarts(host, config_.host_tier.remote.connect_timeout_s);
  return go_back(describe_restarts(host) + (beside.empty() ? "" : "; " + beside), host, open, pass,
                 before_accept);
}

SaveLineage::Recovery SaveLineage::go_back(const std::string& what, table::HostTier& host,
                                           OpenPass open, int64_t pass,
                                           const std::function<void()>& before_accept) {
  if (config_.runner.resume == ResumeMode::kOff || !last_) {
    GPUBOX_FAIL("pass ", pass, ": ", what, "; the trainer stops: ", rerun_outcome());
  }
  if (++recoveries_ > kMaxRecoveries) {
    GPUBOX_FAIL("pass ", pass, ": ", what, "; the servers restarted ", kMaxRecoveries,
                " times already in this run: giving up; ", rerun_outcome());
  }
  GPUBOX_LOG(WARNING) << "pass " << pass << ": " << what
                      << (open == OpenPass::kNone      ? ". No pass was open: reloading "
                          : open == OpenPass::kRetried ? ". Every update of the pass went to the "
                                                         "servers: reloading "
                                                       : ". The pass's rows on the cards are "
                                                         "dropped: reloading ")
                      << last_save() << " into the servers and training the passes after it again";
  if (before_accept) before_accept();
  as_remote(host)->accept_restarts();
  return Recovery{last_->dir, last_run_pass_};
}

bool SaveLineage::recoveries_spent() const { return recoveries_ > kMaxRecoveries; }

SaveLineage::Refusal SaveLineage::refusal() const {
  if (config_.runner.resume == ResumeMode::kOff) return Refusal::kResumeOff;
  if (!last_) return Refusal::kNoSave;
  if (recoveries_spent()) return Refusal::kSpent;
  return Refusal::kOther;
}

std::string SaveLineage::describe(Refusal why, const std::string& log) {
  switch (why) {
    case Refusal::kNone:
      return "it goes back";
    case Refusal::kResumeOff:
      return "runner.resume is off";
    case Refusal::kNoSave:
      return "this run made or loaded no save yet";
    case Refusal::kSpent:
      return "the servers restarted too often in this run";
    case Refusal::kOther:
      break;
  }
  return "trainer 0's log, " + log + ", names why";
}

float SaveLineage::encode(Refusal why) {
  switch (why) {
    case Refusal::kNone:
      return 1.0f;
    case Refusal::kResumeOff:
      return 2.0f;
    case Refusal::kNoSave:
      return 3.0f;
    case Refusal::kSpent:
      return 4.0f;
    case Refusal::kOther:
      break;
  }
  return 0.0f;
}

SaveLineage::Refusal SaveLineage::decode(float told) {
  for (const Refusal why :
       {Refusal::kNone, Refusal::kResumeOff, Refusal::kNoSave, Refusal::kSpent}) {
    if (told == encode(why)) return why;
  }
  return Refusal::kOther;
}

void SaveLineage::accept_restarts(table::HostTier& host) {
  if (auto* remote = as_remote(host)) remote->accept_restarts();
}

SaveLineage::Recovery SaveLineage::recover_and_reload(
    const Error& error, table::HostTier& host, OpenPass open, int64_t pass,
    const std::function<void(const Recovery&)>& reload, const std::function<void()>& before_accept,
    const std::string& beside, const ReloadBeside& beside_reload) {
  Recovery recovery = recover(error, host, open, pass, before_accept, beside);
  for (;;) {
    try {
      reload(recovery);
      return recovery;
    } catch (const Error& again) {
      // A server that restarted while the save was reloaded: accepted and reloaded again;
      // recover() throws anything else again, and gives up after kMaxRecoveries. No pass is open
      // now. A refusal names what else failed: in the pass (`beside`), in the reload (logged).
      GPUBOX_LOG(WARNING) << "pass " << pass << ", reloading " << recovery.dir << ": "
                          << again.message();
      std::string also = beside_reload ? beside_reload(again, recovery.dir) : "";
      also = beside.empty() || also.empty() ? beside + also : beside + "; " + also;
      recovery = recover(again, host, OpenPass::kNone, pass, before_accept, also);
    }
  }
}

void SaveLineage::check_servers(table::HostTier& host, int64_t pass) {
  if (as_remote(host) == nullptr) return;
  const auto stats = host.stats();
  if (!stats.ok()) GPUBOX_FAIL("before pass ", pass, ": ", stats.status().to_string());
}

}  // namespace gpubox::trainer
