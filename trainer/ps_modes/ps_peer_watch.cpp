#include "trainer/ps_modes/ps_peer_watch.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using Clock = std::chrono::steady_clock;
using table::server::DenseAction;

// kAliveTable: beats, finished flags, failed flags, begun flags.
constexpr std::size_t kBeats = PsPeerWatch::kBeatSection;
constexpr std::size_t kFinished = PsPeerWatch::kFinishedSection;
constexpr std::size_t kFailed = PsPeerWatch::kFailedSection;
constexpr std::size_t kBegun = PsPeerWatch::kBegunSection;
constexpr std::size_t kSections = PsPeerWatch::kAliveSections;
static_assert(kBeats == 0 && kFinished == 1 && kFailed == 2 && kBegun == 3 && kSections == 4);

std::vector<float> zeros(int trainers) {
  return std::vector<float>(kSections * static_cast<std::size_t>(trainers), 0.0f);
}

// Text travels 3 bytes a float (24 bits: exact in a float), up to its first zero byte.
constexpr std::size_t kBytesPerFloat = 3;
constexpr std::size_t kReasonFloats = PsPeerWatch::kReasonBytes / kBytesPerFloat;
static_assert(kReasonFloats * kBytesPerFloat == PsPeerWatch::kReasonBytes);

// kFailureTable per trainer: the run its reason was reported in, then the reason's text.
constexpr std::size_t kFailureFloats = 1 + kReasonFloats;

std::vector<float> failure_zeros(int trainers) {
  return std::vector<float>(kFailureFloats * static_cast<std::size_t>(trainers), 0.0f);
}

// `text` into `floats` floats at `out` (zeros), as get_text reads it back.
void put_text(const std::string& text, float* out) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<uint32_t>(static_cast<unsigned char>(text[i]));
    const uint32_t shift = 8 * static_cast<uint32_t>(i % kBytesPerFloat);
    out[i / kBytesPerFloat] += static_cast<float>(byte << shift);
  }
}

std::string get_text(const float* in, std::size_t floats) {
  std::string text;
  for (std::size_t f = 0; f < floats; ++f) {
    auto packed = static_cast<uint32_t>(std::lround(in[f]));
    for (std::size_t b = 0; b < kBytesPerFloat; ++b, packed >>= 8) {
      const char byte = static_cast<char>(packed & 0xffu);
      if (byte == '\0') return text;
      text += byte;
    }
  }
  return text;
}

}  // namespace

std::string PsPeerWatch::stored_reason(const std::string& reason) {
  if (reason.size() <= kReasonBytes) return reason;
  // Python decodes the message as UTF-8 (PyErr_SetString): never cut within a character (its
  // continuation bytes are 10xxxxxx).
  std::size_t cut = kReasonBytes - 3;
  while (cut > 0 && (static_cast<unsigned char>(reason[cut]) & 0xc0u) == 0x80u) --cut;
  return reason.substr(0, cut) + "...";
}

Status PsPeerWatch::reset(table::server::RemoteHostTier& servers, int trainers,
                          bool keep_failures) {
  const auto n = static_cast<std::size_t>(trainers);
  std::vector<float> values = zeros(trainers);
  if (keep_failures) {
    // Other trainers beat and may mark their failures meanwhile: a write of what was read would
    // wipe a mark made between the read and the write. The beats and finished flags are taken
    // back by what was read instead, in one add that adds 0 to every failed and begun flag (the
    // watches of the run go on beating: their beats keep their begun flags at the run, and set
    // them again on a first server restarted empty).
    GPUBOX_RETURN_IF_ERROR(
        servers.dense(DenseAction::kRead, kAliveTable, &values)
            .with_context("reading the servers' table " + std::string(kAliveTable)));
    if (values.size() == kSections * n) {
      const auto failed_flags = values.begin() + static_cast<std::ptrdiff_t>(kFailed * n);
      std::transform(values.begin(), failed_flags, values.begin(), std::negate<float>());
      std::fill(failed_flags, values.end(), 0.0f);
      return servers.dense(DenseAction::kAdd, kAliveTable, &values)
          .with_context("restarting the beats of the servers' table " + std::string(kAliveTable));
    }
    values = zeros(trainers);  // none of this job's: written as at the job's start
  }
  GPUBOX_RETURN_IF_ERROR(
      servers.dense(DenseAction::kWrite, kAliveTable, &values)
          .with_context("resetting the servers' table " + std::string(kAliveTable)));
  if (keep_failures) return Status::OK();
  std::vector<float> failures = failure_zeros(trainers);
  return servers.dense(DenseAction::kWrite, kFailureTable, &failures)
      .with_context("resetting the servers' table " + std::string(kFailureTable));
}

Status PsPeerWatch::mark_failed(table::server::RemoteHostTier& servers, int trainer_id,
                                int trainers, const std::string& reason, FailureNotice notice,
                                int run, std::vector<float>* alive_at_mark) {
  if (notice == FailureNotice::kToWatches && run < 1) {
    return Status::InvalidArgument("PsPeerWatch::mark_failed: run " + std::to_string(run) +
                                   " (runs count from 1)");
  }
  if (alive_at_mark != nullptr) alive_at_mark->clear();
  return set_own_failure(servers, trainer_id, trainers,
                         stored_reason(reason.empty() ? "(it reported no reason)" : reason), run,
                         notice == FailureNotice::kToWatches ? static_cast<float>(run) : -1.0f,
                         alive_at_mark);
}

Status PsPeerWatch::clear_failure(table::server::RemoteHostTier& servers, int trainer_id,
                                  int trainers) {
  return set_own_failure(servers, trainer_id, trainers, "", 0, 0.0f, nullptr);
}

Status PsPeerWatch::set_own_failure(table::server::RemoteHostTier& servers, int trainer_id,
                                    int trainers, const std::string& stored, int reason_run,
                                    float flag, std::vector<float>* alive) {
  const std::string context = "telling the other trainers that trainer " +
                              std::to_string(trainer_id) +
                              (stored.empty() ? " did not fail" : " failed");
  // The tables only add (kAdd) and other trainers write them too: trainer `trainer_id`'s slots
  // (written by it alone) are set by adding what they need on top of what they hold, so that a
  // second mark in a job replaces the first instead of summing into it.
  std::vector<float> held = failure_zeros(trainers);
  GPUBOX_RETURN_IF_ERROR(
      servers.dense(DenseAction::kRead, kFailureTable, &held).with_context(context));
  std::vector<float> mine = failure_zeros(trainers);
  const std::size_t first = kFailureFloats * static_cast<std::size_t>(trainer_id);
  mine[first] = static_cast<float>(reason_run);
  put_text(stored, mine.data() + first + 1);
  if (held.size() == mine.size()) {
    for (std::size_t f = first; f < first + kFailureFloats; ++f) mine[f] -= held[f];
  }
  // The reason first: a watch that sees the flag reads it.
  GPUBOX_RETURN_IF_ERROR(
      servers.dense(DenseAction::kAdd, kFailureTable, &mine).with_context(context));
  if (flag < 0) return Status::OK();
  std::vector<float> values = zeros(trainers);
  GPUBOX_RETURN_IF_ERROR(
      servers.dense(DenseAction::kRead, kAliveTable, &values).with_context(context));
  const auto at =
      kFailed * static_cast<std::size_t>(trainers) + static_cast<std::size_t>(trainer_id);
  const float held_flag = values.size() > at ? values[at] : 0.0f;
  values = zeros(trainers);
  values[at] = flag - held_flag;
  GPUBOX_RETURN_IF_ERROR(
      servers.dense(DenseAction::kAdd, kAliveTable, &values).with_context(context));
  if (alive != nullptr && values.size() == kSections * static_cast<std::size_t>(trainers)) {
    *alive = std::move(values);
  }
  return Status::OK();
}

StatusOr<int> PsPeerWatch::failed_peer(table::server::RemoteHostTier& servers, int trainer_id,
                                       int trainers, int run) {
  // Run 0 would take every unflagged trainer (its flag 0) as marked.
  if (run < 1) {
    return Status::InvalidArgument("PsPeerWatch::failed_peer: run " + std::to_string(run) +
                                   " (runs count from 1)");
  }
  const auto n = static_cast<std::size_t>(trainers);
  std::vector<float> values = zeros(trainers);
  GPUBOX_RETURN_IF_ERROR(servers.dense(DenseAction::kRead, kAliveTable, &values)
                             .with_context("reading the trainers' failed flags"));
  if (values.size() != kSections * n) return -1;
  for (std::size_t w = 0; w < n; ++w) {
    const bool failed = values[kFailed * n + w] == static_cast<float>(run);
    if (static_cast<int>(w) != trainer_id && failed) return static_cast<int>(w);
  }
  return -1;
}

StatusOr<std::string> PsPeerWatch::failure_of(table::server::RemoteHostTier& servers,
                                              int trainer_id, int trainers, int run) {
  StatusOr<std::vector<std::string>> all = failures(servers, trainers, run);
  GPUBOX_RETURN_IF_ERROR(all.status());
  return all->empty() ? std::string() : (*all)[static_cast<std::size_t>(trainer_id)];
}

StatusOr<std::vector<std::string>> PsPeerWatch::failures(table::server::RemoteHostTier& servers,
                                                         int trainers, int run) {
  std::vector<float> all = failure_zeros(trainers);
  GPUBOX_RETURN_IF_ERROR(servers.dense(DenseAction::kRead, kFailureTable, &all)
                             .with_context("reading the trainers' failures"));
  if (all.size() != failure_zeros(trainers).size()) return std::vector<std::string>();
  std::vector<std::string> reasons(static_cast<std::size_t>(trainers));
  for (std::size_t w = 0; w < reasons.size(); ++w) {
    const float* slot = all.data() + kFailureFloats * w;
    // A reason of another run than `run` is stale (an earlier train()'s, not yet taken back).
    if (run != kAnyRun && slot[0] != static_cast<float>(run)) continue;
    reasons[w] = get_text(slot + 1, kReasonFloats);
  }
  return reasons;
}

Status PsPeerWatch::wait_until_failure_seen(const std::vector<float>& alive_at_mark,
                                            double timeout_s, const std::atomic<bool>* stop) {
  const auto n = static_cast<std::size_t>(trainers_);
  const auto deadline = Clock::now() + millis_of(timeout_s);
  // The beats as the mark's add left them: a watch that beat past them saw the mark, before
  // this wait's first read too.
  std::vector<float> at_mark =
      alive_at_mark.size() == kSections * n ? alive_at_mark : std::vector<float>();
  std::string unseen;
  auto pause = std::chrono::milliseconds(10);
  while (Clock::now() < deadline && (stop == nullptr || !stop->load())) {
    std::vector<float> values = zeros(trainers_);
    GPUBOX_RETURN_IF_ERROR(servers_.dense(DenseAction::kRead, kAliveTable, &values)
                               .with_context("waiting for the other trainers to see the failure"));
    if (values.size() != kSections * n) return Status::OK();
    // A count at least 1 that went down by half kBeatWrap or more wrapped (at kBeatWrap or past
    // it, back by kBeatWrap - 1; the mark may be a few beats below kBeatWrap): a beat past the
    // mark, kept as one (its baseline just below it; a reset from such a mark followed by a beat
    // reads so too, and that beat came after the mark as well). One that went down otherwise was
    // reset (a recovery's start_job): its beats count from there.
    for (std::size_t w = 0; w < n && !at_mark.empty(); ++w) {
      if (values[w] >= 1.0f && at_mark[w] - values[w] >= kBeatWrap / 2) {
        at_mark[w] = values[w] - 1.0f;
      } else if (values[w] < at_mark[w]) {
        at_mark[w] = values[w];
      }
    }
    if (at_mark.empty()) at_mark = values;
    unseen.clear();
    for (std::size_t w = 0; w < n; ++w) {
      // One that has not begun this run (its begun flag an earlier run's) is not waited for: its
      // watch reads the mark as it starts. One finished in this run or failed watches no more. One
      // that began and stopped beating is waited for up to the timeout.
      const auto run = static_cast<float>(options_.run);
      const bool gone = values[kBegun * n + w] != run || values[kFinished * n + w] == run ||
                        values[kFailed * n + w] > 0;
      if (static_cast<int>(w) != trainer_id_ && !gone && values[w] <= at_mark[w]) {
        unseen += (unseen.empty() ? "" : ", ") + std::to_string(w);
      }
    }
    if (unseen.empty()) return Status::OK();
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, std::chrono::milliseconds(100));
  }
  if (stop != nullptr && stop->load()) return Status::OK();
  std::ostringstream late;
  // `unseen` is empty when no read came before the deadline (a timeout of 0, or a slow first
  // read): no watch was seen to beat past the mark.
  late << (unseen.empty() ? std::string("no other trainer's watch was seen to beat")
                          : "the watch of trainer(s) " + unseen + " did not beat")
       << " within " << timeout_s << " s after trainer " << trainer_id_ << " of " << trainers_
       << " marked its failure";
  return Status::DeadlineExceeded(late.str());
}

PsPeerWatch::PsPeerWatch(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                         PsPeerWatchOptions options,
                         std::function<void(const std::string&)> on_lost)
    : servers_(servers),
      trainer_id_(trainer_id),
      trainers_(trainers),
      options_(options),
      on_lost_(std::move(on_lost)) {
  // Run 0 would read every trainer's finished flag (0) as finished in this run, and every failed
  // flag (0) as marked in it.
  GPUBOX_EXPECTS(options_.run >= 1, "PsPeerWatch: run ", options_.run, " (runs count from 1)");
  beat_thread_ = std::thread([this] { beat_loop(); });
  if (servers_.endpoint_count() > 0) ping_thread_ = std::thread([this] { ping_loop(); });
}

PsPeerWatch::~PsPeerWatch() {
  stop();
  MutexLock lock(mu_);
  if (lost_peer_failed_) forced_exit_.cancel();
}

void PsPeerWatch::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (beat_thread_.joinable()) beat_thread_.join();
  if (ping_thread_.joinable()) ping_thread_.join();
}

Status PsPeerWatch::finish() {
  stop();  // no beat after the flag: a late one could not matter, but keeps the order plain
  const std::string context = "telling the other trainers (table " + std::string(kAliveTable) +
                              ") that trainer " + std::to_string(trainer_id_) + " finished";
  // The flag holds the run, set by adding it less what the slot holds (an earlier run's flag):
  // a trainer that finished an earlier train() has not finished this one.
  std::vector<float> mark = zeros(trainers_);
  GPUBOX_RETURN_IF_ERROR(
      servers_.dense(DenseAction::kRead, kAliveTable, &mark).with_context(context));
  const auto at =
      kFinished * static_cast<std::size_t>(trainers_) + static_cast<std::size_t>(trainer_id_);
  const float held = mark.size() > at ? mark[at] : 0.0f;
  mark = zeros(trainers_);
  mark[at] = static_cast<float>(options_.run) - held;
  return servers_.dense(DenseAction::kAdd, kAliveTable, &mark).with_context(context);
}

std::string PsPeerWatch::lost() const {
  if (!any_lost_.load(std::memory_order_acquire)) return {};
  MutexLock lock(mu_);
  return lost_;
}

void PsPeerWatch::on_lost(const std::string& reason, Loss loss) {
  {
    MutexLock lock(mu_);
    if (!lost_.empty()) {
      // Another trainer's failure after a reported one (trainers failing at once whose marks
      // different beats saw): added to lost(), so that training threads not yet stopped name all,
      // and so does the forced end's line.
      if (loss == Loss::kPeerFailed && first_lost_peer_failed_) {
        GPUBOX_LOG(ERROR) << reason;
        lost_ += "; " + reason;
        forced_exit_.set_reason(lost_);  // armed, or not yet: then armed below with lost_
        return;
      }
      // A server lost after a reported failure: the teardown may hang on it, so the forced end
      // stays, and its line names the server too, as lost() does (before, it named the failure
      // alone). A trainer lost then is mostly one that stopped for that failure: only logged.
      if (loss == Loss::kServer && lost_peer_failed_) {
        GPUBOX_LOG(ERROR) << reason;
        lost_peer_failed_ = false;
        lost_ += "; " + reason;
        forced_exit_.set_reason(lost_);  // armed, or not yet: then armed below with lost_
        return;
      }
      GPUBOX_LOG(WARNING) << reason;
      return;
    }
    lost_ = reason;
    // With lost_, in one step: a server loss reported before the end is armed below clears it.
    lost_peer_failed_ = loss == Loss::kPeerFailed;
    first_lost_peer_failed_ = lost_peer_failed_;
  }
  any_lost_.store(true, std::memory_order_release);
  GPUBOX_LOG(ERROR) << reason;
  if (on_lost_) on_lost_(reason);
  MutexLock lock(mu_);
  // lost_, not `reason`: a failure added since is named too.
  forced_exit_ = arm_forced_exit(lost_, options_.exit_grace_s);
}

bool PsPeerWatch::wait_interval() {
  const auto interval =
      std::max(millis_of(options_.peer_timeout_s) / 5, std::chrono::milliseconds(20));
  MutexLock lock(mu_);
  const auto until = Clock::now() + interval;
  while (!stopping_ && stop_cv_.wait_until(lock, until) != std::cv_status::timeout) {
  }
  return !stopping_;
}

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
  // What the next beat adds to this trainer's begun flag to make it this run: the run less what
  // the slot held as last seen (the first beat reads it first, as finish() does). Every beat's
  // reply shows the slot again, so a flag lost since (a restarted first server recreates the
  // table with zeros) is set again by the next beat; only this trainer writes its slot.
  bool begun_known = false;
  float begun_add = 0.0f;
  // What the next beat adds to this trainer's count: 1, or, once the count reached kBeatWrap,
  // 1 - kBeatWrap, so that it stays exact in a float however long the job runs. Like the begun
  // flag's add, taken from the count as last seen: after a failed beat (its add applied or not)
  // from the count read again, so that a wrap is applied once.
  float beat_add = 1.0f;
  const auto beat_add_after = [](float count) {
    return count >= kBeatWrap ? 1.0f - kBeatWrap : 1.0f;
  };
  // This trainer's begun flag, set by an earlier beat, was found gone (a first server restarted
  // empty: the table recreated with zeros): trainers without their flag are judged by the bound
  // after a loss.
  bool table_lost = false;
  // This trainer's begun flag was read set (this run) since the last loss this watch found: only
  // then is a flag read missing a new loss (an add that set it again and failed leaves it missing
  // at the next read, and must not move loss_at again and again).
  bool own_flag_seen = false;
  // The first server's instance as this trainer's client knows it. Another one since (its trainer
  // accepted the first server's restart: PsTrainer, the recovery) means the table was lost, even
  // when this watch never read its own flag set: its reads and adds failed (Aborted, the restart
  // pending) from the restart until that acceptance, its first beat among them. (A restart
  // adopted quietly, that lost nothing of this client's, is taken as a loss too: that only
  // lengthens the bound for a trainer not begun.)
  const auto first_server_instance = [this] {
    return servers_.endpoint_count() > 0 ? servers_.server_identity(0).instance_id : 0;
  };
  uint64_t first_server = first_server_instance();
  std::vector<float> values;
  do {
    values = zeros(trainers_);
    if (!begun_known) {
      std::vector<float> held = zeros(trainers_);
      if (!servers_.dense(DenseAction::kRead, kAliveTable, &held).ok() ||
          held.size() != kSections * n) {
        continue;
      }
      begun_add = this_run - held[kBegun * n + own];
      beat_add = beat_add_after(held[kBeats * n + own]);
      table_lost = table_lost || (own_flag_seen && held[kBegun * n + own] != this_run);
      own_flag_seen = own_flag_seen && held[kBegun * n + own] == this_run;
    }
    values[kBeats * n + own] = beat_add;
    values[kBegun * n + own] = begun_add;
    // A failed beat (this trainer cannot reach the first server) judges nobody: the others see
    // this one's count stop, and the ping thread names the server. Whether its add was applied
    // is unknown: the next beat reads the begun flag and the count again. (An add to a table
    // the first server lost, restarted empty, fails: NotFound.)
    if (!servers_.dense(DenseAction::kAdd, kAliveTable, &values).ok() ||
        values.size() != kSections * n) {
      begun_known = false;
      continue;
    }
    begun_known = true;
    begun_add = this_run - values[kBegun * n + own];
    beat_add = beat_add_after(values[kBeats * n + own]);
    const auto now = Clock::now();
    // The bound for a trainer not begun counts from this watch's first beat. This trainer's own
    // begun flag found gone, by the read after a failed beat (this watch's add reached the
    // restarted server first and failed) or by this add (another trainer's read recreated the
    // table first: this add left the flag at 0), once it was read set since the last loss, or
    // the first server's instance changed, means every trainer's flag went with the table, to be
    // set again by its next beat that goes through: each trainer whose flag is not back is
    // judged as one not begun, by the bound after a loss, counted from now.
    table_lost = table_lost || (own_flag_seen && values[kBegun * n + own] != this_run);
    own_flag_seen = values[kBegun * n + own] == this_run;
    const uint64_t instance = first_server_instance();
    table_lost = table_lost || (first_server != 0 && instance != first_server);
    first_server = instance;
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
    table_lost = false;
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
