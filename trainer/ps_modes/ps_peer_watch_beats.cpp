// The heartbeat side of PsPeerWatch: its beats (beat_loop), the judging of the other trainers by
// them (judge_peers, report_failed_peers) and the pings of the servers (ping_loop). The table's
// layout and the static reads and writes of it are in ps_peer_watch.cpp.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "table/server/remote_host_tier.hpp"
#include "trainer/ps_modes/ps_alive_table.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using Clock = std::chrono::steady_clock;
using table::server::DenseAction;

using namespace alive_table;  // NOLINT: the table's sections, this file's vocabulary

// This trainer's own slot of kAliveTable as beat_loop keeps it between beats: what its next beat
// adds, and whether the table was found lost.
struct OwnSlot {
  std::size_t n;
  std::size_t own;
  float this_run;
  // What the next beat adds to this trainer's begun flag to make it this run: the run less what
  // the slot held as last seen (the first beat reads it first, as finish() does). Every beat's
  // reply shows the slot again, so a flag lost since (a restarted first server recreates the
  // table with zeros) is set again by the next beat; only this trainer writes its slot.
  bool known = false;
  float begun_add = 0.0f;
  // What the next beat adds to this trainer's count: 1, or, once the count reached kBeatWrap,
  // 1 - kBeatWrap, so that it stays exact in a float however long the job runs. Like the begun
  // flag's add, taken from the count as last seen: after a failed beat (its add applied or not)
  // from the count read again, so that a wrap is applied once.
  float beat_add = 1.0f;
  // This trainer's begun flag, set by an earlier beat, was found gone (a first server restarted
  // empty: the table recreated with zeros): trainers without their flag are judged by the bound
  // after a loss.
  bool table_lost = false;
  // This trainer's begun flag was read set (this run) since the last loss this watch found: only
  // then is a flag read missing a new loss (an add that set it again and failed leaves it missing
  // at the next read, and must not move loss_at again and again).
  bool own_flag_seen = false;
  uint64_t first_server = 0;  // the first server's instance as last seen (beat_loop)

  static float beat_add_after(float count) {
    return count >= PsPeerWatch::kBeatWrap ? 1.0f - PsPeerWatch::kBeatWrap : 1.0f;
  }

  // The table as read before a beat whose slot is not known (the first, or one after a failure).
  void take_read(const std::vector<float>& held) {
    begun_add = this_run - held[kBegun * n + own];
    beat_add = beat_add_after(held[kBeats * n + own]);
    table_lost = table_lost || (own_flag_seen && held[kBegun * n + own] != this_run);
    own_flag_seen = own_flag_seen && held[kBegun * n + own] == this_run;
  }

  // The table as a beat's add left it, `instance` the first server's now: whether the table was
  // found lost since the last beat that went through. The bound for a trainer not begun counts
  // from this watch's first beat. This trainer's own begun flag found gone, by the read after a
  // failed beat (this watch's add reached the restarted server first and failed) or by this add
  // (another trainer's read recreated the table first: this add left the flag at 0), once it was
  // read set since the last loss, or the first server's instance changed, means every trainer's
  // flag went with the table, to be set again by its next beat that goes through: each trainer
  // whose flag is not back is judged as one not begun, by the bound after a loss, counted from
  // now.
  bool take_reply(const std::vector<float>& values, uint64_t instance) {
    known = true;
    begun_add = this_run - values[kBegun * n + own];
    beat_add = beat_add_after(values[kBeats * n + own]);
    bool lost = table_lost || (own_flag_seen && values[kBegun * n + own] != this_run);
    own_flag_seen = values[kBegun * n + own] == this_run;
    lost = lost || (first_server != 0 && instance != first_server);
    first_server = instance;
    table_lost = false;
    return lost;
  }
};

}  // namespace

// Reports every other trainer whose failed flag (in `values`, the heartbeat table as a beat left
// it) is this run's, once each (`reported`), with what it reported in this run: those one beat
// saw flagged in one report, so that trainers failing at once are all named.
void PsPeerWatch::report_failed_peers(const std::vector<float>& values,
                                      std::vector<bool>* reported) {
  const auto n = static_cast<std::size_t>(trainers_);
  const auto own = static_cast<std::size_t>(trainer_id_);
  const auto this_run = static_cast<float>(options_.run);
  std::vector<std::size_t> flagged;
  for (std::size_t w = 0; w < n; ++w) {
    if (w != own && values[kFailed * n + w] == this_run && !(*reported)[w]) flagged.push_back(w);
  }
  if (flagged.empty()) return;
  StatusOr<std::vector<std::string>> reasons = failures(servers_, trainers_, options_.run);
  std::string report;
  for (const std::size_t w : flagged) {
    (*reported)[w] = true;
    std::string reason;
    if (!reasons.ok()) {
      reason = "(what it reported cannot be read: " + reasons.status().to_string() + ")";
    } else if (reasons->empty() || (*reasons)[w].empty()) {
      // Written before the flag: one missing is another run's (stale) or was lost with the table.
      reason = "(what it reported in this run is not on the first server)";
    } else {
      reason = (*reasons)[w];
    }
    report += (report.empty() ? "" : "; ") + std::string("trainer ") + std::to_string(w) + " of " +
              std::to_string(n) + " failed: " + reason;
  }
  on_lost(report, Loss::kPeerFailed);
}

// What this watch knows of every trainer, kept by beat_loop between its beats.
struct PsPeerWatch::Peers {
  explicit Peers(std::size_t n)
      : seen_begun(n, false),
        last_count(n, 0.0f),
        last_move(n, Clock::now()),
        reported(n, false),
        finished(n, false) {}
  // A trainer is judged by its silence once its begun flag is this run, timed from when this
  // watch first read it so (its count as read then), not from anything an earlier run left;
  // cleared when its flag went with the table (loss_at), until this watch reads it set again.
  std::vector<bool> seen_begun;
  std::vector<float> last_count;
  std::vector<Clock::time_point> last_move;
  std::vector<bool> reported;  // a loss or failure of it was reported
  // Its finished flag was read this run: it is judged no more, its flag gone with the table too.
  std::vector<bool> finished;
  // This watch's first beat that went through: a trainer that has not begun this run by
  // options.begin_timeout_s later never came (run 1, no table lost).
  std::optional<Clock::time_point> first_beat;
  // When this watch last found the table lost (its own begun flag gone, or the first server
  // another instance): a trainer whose begun flag is not this run is judged only
  // options.after_loss_timeout_s later.
  std::optional<Clock::time_point> loss_at;
};

void PsPeerWatch::judge_peers(const std::vector<float>& values, Clock::time_point now,
                              Peers* peers) {
  const auto n = static_cast<std::size_t>(trainers_);
  const auto this_run = static_cast<float>(options_.run);
  const auto timeout = millis_of(options_.peer_timeout_s);
  for (std::size_t w = 0; w < n; ++w) {
    // Not judged: one that finished this run (a finished flag of an earlier run is stale); one
    // that failed in this run, reported by its flag (report_failed_peers) or not at all. A failed
    // flag of an earlier run is stale (taken back before its trainer's watch starts): its trainer
    // is judged as any other. One read finished stays so (a first server restarted empty after
    // it finished lost its flag: it never beats again).
    if (values[kFinished * n + w] == this_run) peers->finished[w] = true;
    if (w == static_cast<std::size_t>(trainer_id_) || peers->finished[w] ||
        values[kFailed * n + w] == this_run || peers->reported[w]) {
      continue;
    }
    std::ostringstream reason;
    reason.precision(3);
    if (values[kBegun * n + w] != this_run && !peers->seen_begun[w]) {
      // Not begun (still starting, or its watch of the run before still beating as it leaves that
      // run's last meeting), or its flag went with the table (a first server restarted empty:
      // its beats fail until it accepts the restart, which trainers do at different times, at
      // the latest as they come to the recovery's meeting): not judged by its silence. Once the
      // table was lost, judged only after_loss_timeout_s after this watch found it so (what that
      // meeting waits for it), in any run. Else in run 1 only (the trainers met at the job's
      // start just before it; a later run has no common start), once it is later than any
      // meeting would wait for it.
      if (peers->loss_at) {
        const auto waited = now - *peers->loss_at;
        if (options_.after_loss_timeout_s <= 0 ||
            waited < millis_of(options_.after_loss_timeout_s)) {
          continue;
        }
        reason << "lost trainer " << w << " of " << n << ": it did not beat in training run "
               << options_.run << " within " << std::chrono::duration<double>(waited).count()
               << " s after trainer " << trainer_id_ << " found the table " << kAliveTable
               << " of server " << servers_.endpoint_name(0)
               << " lost (a first server restarted empty; the bound after such a loss: "
               << options_.after_loss_timeout_s
               << " s, what the recovery's meeting waits for a trainer): its process died or is "
                  "stuck, or its link to the servers is down";
      } else {
        const auto waited = now - *peers->first_beat;
        if (options_.run != 1 || options_.begin_timeout_s <= 0 ||
            waited < millis_of(options_.begin_timeout_s)) {
          continue;
        }
        reason << "lost trainer " << w << " of " << n << ": it did not begin training run "
               << options_.run << " within " << std::chrono::duration<double>(waited).count()
               << " s of trainer " << trainer_id_
               << " (runner.collective_timeout_s=" << options_.begin_timeout_s
               << "; its first beat through server " << servers_.endpoint_name(0)
               << " marks it begun): its process died or is stuck before it, or its link to the "
                  "servers is down";
      }
    } else if (!peers->seen_begun[w] || values[kBeats * n + w] != peers->last_count[w]) {
      // Counts are compared by inequality only: a count that wrapped (kBeatWrap) moved.
      peers->seen_begun[w] = true;
      peers->last_count[w] = values[kBeats * n + w];
      peers->last_move[w] = now;
      continue;
    } else if (now - peers->last_move[w] < timeout) {
      continue;
    } else {
      reason << "lost trainer " << w << " of " << n << ": its heartbeat through server "
             << servers_.endpoint_name(0) << " stopped "
             << std::chrono::duration<double>(now - peers->last_move[w]).count()
             << " s ago (runner.peer_timeout_s=" << options_.peer_timeout_s
             << ") before it finished: its process died or was stopped, or its link to the "
                "servers is down";
    }
    peers->reported[w] = true;
    on_lost(reason.str(), Loss::kTrainer);
  }
}

void PsPeerWatch::beat_loop() {
  const auto n = static_cast<std::size_t>(trainers_);
  const auto own = static_cast<std::size_t>(trainer_id_);
  const auto this_run = static_cast<float>(options_.run);
  Peers peers(n);
  OwnSlot slot{n, own, this_run};
  // The first server's instance as this trainer's client knows it. Another one since (its trainer
  // accepted the first server's restart: PsTrainer, the recovery) means the table was lost, even
  // when this watch never read its own flag set: its reads and adds failed (Aborted, the restart
  // pending) from the restart until that acceptance, its first beat among them. (A restart
  // adopted quietly, that lost nothing of this client's, is taken as a loss too: that only
  // lengthens the bound for a trainer not begun.)
  const auto first_server_instance = [this] {
    return servers_.endpoint_count() > 0 ? servers_.server_identity(0).instance_id : 0;
  };
  slot.first_server = first_server_instance();
  std::vector<float> values;
  do {
    values = zeros(trainers_);
    if (!slot.known) {
      std::vector<float> held = zeros(trainers_);
      if (!servers_.dense(DenseAction::kRead, kAliveTable, &held).ok() ||
          held.size() != kSections * n) {
        continue;
      }
      slot.take_read(held);
    }
    values[kBeats * n + own] = slot.beat_add;
    values[kBegun * n + own] = slot.begun_add;
    // A failed beat (this trainer cannot reach the first server) judges nobody: the others see
    // this one's count stop, and the ping thread names the server. Whether its add was applied
    // is unknown: the next beat reads the begun flag and the count again. (An add to a table
    // the first server lost, restarted empty, fails: NotFound.)
    if (!servers_.dense(DenseAction::kAdd, kAliveTable, &values).ok() ||
        values.size() != kSections * n) {
      slot.known = false;
      continue;
    }
    const auto now = Clock::now();
    const bool table_lost = slot.take_reply(values, first_server_instance());
    if (!peers.first_beat) peers.first_beat = now;
    if (table_lost) {
      // Every count went with the table too: each trainer's silence is timed from now, from its
      // count as read now (a count of the recreated table equal by chance to the one last read
      // before is not silence since then).
      peers.loss_at = now;
      for (std::size_t w = 0; w < n; ++w) {
        if (values[kBegun * n + w] != this_run) peers.seen_begun[w] = false;
        peers.last_count[w] = values[kBeats * n + w];
        peers.last_move[w] = now;
      }
    }
    // A trainer that failed itself (its flag, or tell_failure began) judges no other trainer: a
    // failure every trainer hit at once is not its loss, nor one that ended as it did (it ends
    // anyway, and a report would end its process exit_grace_s later). Servers are still pinged.
    // A failed flag of another run (an earlier train()) is stale: its trainer takes it back as
    // it begins this run.
    const bool failing =
        failing_.load(std::memory_order_acquire) || values[kFailed * n + own] == this_run;
    if (failing) continue;
    report_failed_peers(values, &peers.reported);
    judge_peers(values, now, &peers);
  } while (wait_interval());
}

void PsPeerWatch::ping_loop() {
  ServerPings pings(servers_, options_.peer_timeout_s);
  do {
    for (const std::string& reason : pings.round()) on_lost(reason, Loss::kServer);
  } while (wait_interval());
}

}  // namespace gpubox::trainer::ps_modes
