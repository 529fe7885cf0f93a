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
#include "trainer/ps_modes/ps_alive_table.hpp"
#include "trainer/ps_modes/table_text.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using Clock = std::chrono::steady_clock;
using table::server::DenseAction;

using namespace alive_table;  // NOLINT: the table's sections, this file's vocabulary

constexpr std::size_t kReasonFloats = PsPeerWatch::kReasonBytes / kTextBytesPerFloat;
static_assert(kReasonFloats * kTextBytesPerFloat == PsPeerWatch::kReasonBytes);

// kFailureTable per trainer: the run its reason was reported in, then the reason's text.
constexpr std::size_t kFailureFloats = 1 + kReasonFloats;

std::vector<float> failure_zeros(int trainers) {
  return std::vector<float>(kFailureFloats * static_cast<std::size_t>(trainers), 0.0f);
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
  put_table_text(stored, mine.data() + first + 1);
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
    reasons[w] = get_table_text(slot + 1, kReasonFloats);
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

}  // namespace gpubox::trainer::ps_modes
