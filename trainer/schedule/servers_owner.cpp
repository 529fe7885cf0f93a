#include "trainer/schedule/servers_owner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"

namespace gpubox::trainer {
namespace {

using table::server::DenseAction;

constexpr std::size_t kFloats = 5;  // nonce (3 x 24 bits), beats, interval in ms
constexpr uint64_t kPart = (uint64_t{1} << 24) - 1;
// The longest wait for a claim's beats (its interval is its job's peer_timeout_s / 5).
constexpr double kLongestWaitS = 30.0;
// A count wraps as the PS peer watch's beats do (PsPeerWatch::kBeatWrap): at 2^23.
constexpr float kBeatWrap = 8388608.0f;
// The bound of the release as trainer 0 ends, and of a beat (at most: its interval).
constexpr double kReleaseDeadlineS = 2.0;

uint64_t draw_nonce() {
  std::random_device seed;
  uint64_t nonce = 0;
  while (nonce == 0) nonce = ((uint64_t{seed()} << 32) ^ seed()) & ((uint64_t{1} << 63) - 1);
  return nonce;
}

uint64_t nonce_of(const std::vector<float>& table) {
  uint64_t nonce = 0;
  for (std::size_t p = 0; p < 3; ++p) {
    nonce |= (static_cast<uint64_t>(std::llround(table[p])) & kPart) << (24 * p);
  }
  return nonce;
}

std::vector<float> table_of(uint64_t nonce, double interval_s) {
  std::vector<float> table(kFloats, 0.0f);
  for (std::size_t p = 0; p < 3; ++p) table[p] = static_cast<float>((nonce >> (24 * p)) & kPart);
  table[4] = static_cast<float>(std::lround(interval_s * 1000.0));
  return table;
}

// The table (created zeroed when absent: a first server that never served a job, or restarted).
std::vector<float> read_table(table::server::RemoteHostTier& servers) {
  std::vector<float> table(kFloats, 0.0f);
  throw_if_error(servers.dense(DenseAction::kRead, kOwnerTable, &table)
                     .with_context(std::string("reading the first server's table ") + kOwnerTable +
                                   " (which job the servers serve)"));
  return table;
}

}  // namespace

ServersOwner::ServersOwner(table::server::RemoteHostTier& servers, double interval_s)
    : servers_(servers), interval_s_(std::max(interval_s, 0.01)), nonce_(draw_nonce()) {
  claim();
  beats_ = std::thread([this] { beat_loop(); });
}

ServersOwner::~ServersOwner() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  beats_.join();
  // Released while still this job's (a first server gone or slow: left to go stale, bounded).
  table::server::DenseCall call;
  call.deadline_s = kReleaseDeadlineS;
  std::vector<float> table(kFloats, 0.0f);
  if (!servers_.dense(DenseAction::kRead, kOwnerTable, &table, call).ok()) return;
  if (nonce_of(table) != nonce_) return;
  std::vector<float> zeros(kFloats, 0.0f);
  (void)servers_.dense(DenseAction::kWrite, kOwnerTable, &zeros, call);
}

void ServersOwner::reclaim() { claim(); }

std::string ServersOwner::taken_over() const {
  MutexLock lock(mu_);
  return taken_over_;
}

void ServersOwner::claim() {
  const std::vector<float> seen = read_table(servers_);
  const uint64_t other = nonce_of(seen);
  if (other != 0 && other != nonce_) {
    // Another job's claim: running while its beats advance.
    const double its_interval_s = seen[4] > 0.0f ? seen[4] / 1000.0 : 2.0;
    const double wait_s = std::min(2.5 * its_interval_s, kLongestWaitS);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    const std::vector<float> now = read_table(servers_);
    const uint64_t holder = nonce_of(now);
    const bool beating = holder == other && now[3] != seen[3];
    GPUBOX_EXPECTS(!beating && (holder == other || holder == 0 || holder == nonce_),
                   "the servers (", servers_.endpoint_name(0),
                   " first) serve another job that is running: its trainer 0 beats in the first "
                   "server's table ",
                   kOwnerTable, " (", std::lround(now[3] - seen[3]), " beats in the last ", wait_s,
                   " s): a second job there would replace its dense table and rows, and both "
                   "would report wrong figures; start this one against other servers "
                   "(PADDLE_PSERVERS_IP_PORT_LIST), or when that job has ended (or, if this "
                   "process is a trainer of that job, its PADDLE_TRAINER_ID is 0 twice)");
    GPUBOX_LOG(INFO) << "the servers held the claim of a job that no longer beats (its trainer 0 "
                        "ended without releasing them): this job takes them over";
  }
  std::vector<float> mine = table_of(nonce_, interval_s_);
  throw_if_error(servers_.dense(DenseAction::kWrite, kOwnerTable, &mine)
                     .with_context(std::string("claiming the servers in the first server's "
                                               "table ") +
                                   kOwnerTable));
}

void ServersOwner::beat_loop() {
  MutexLock lock(mu_);
  for (;;) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(interval_s_));
    while (!stopping_ && wake_.wait_until(lock, until) != std::cv_status::timeout) {
    }
    if (stopping_) return;
    std::vector<float> beat(kFloats, 0.0f);
    // A count at 2^23 goes back by 2^23 - 1 (float adds of 1 stop counting at 2^24): every beat
    // still changes it, which is all a claim's reader looks at.
    beat[3] = count_ >= kBeatWrap ? 1.0f - kBeatWrap : 1.0f;
    lock.unlock();
    table::server::DenseCall call;
    call.mutation = false;  // a sign of life, no change of the job's state
    call.deadline_s = std::min(interval_s_, kReleaseDeadlineS);
    const Status added = servers_.dense(DenseAction::kAdd, kOwnerTable, &beat, call);
    lock.lock();
    // A failed beat (a server restarting, which the job finds and repairs itself) says nothing.
    if (!added.ok()) continue;
    count_ = beat[3];
    if (!taken_over_.empty()) continue;
    const uint64_t holder = nonce_of(beat);
    if (holder == 0) {
      // The claim was erased while this job runs: zeroed by an ending job's release that read
      // its own claim just before this job took the servers over (a read, then a write: not one
      // step), or the table created afresh by another client. Claimed again, so that a third
      // job's start still finds this one running.
      lock.unlock();
      std::vector<float> mine = table_of(nonce_, interval_s_);
      const Status wrote = servers_.dense(DenseAction::kWrite, kOwnerTable, &mine, call);
      lock.lock();
      if (wrote.ok()) {
        count_ = 0.0f;
        GPUBOX_LOG(INFO) << "the first server's table " << kOwnerTable
                         << " held no job's claim while this job runs (released by a job that "
                            "ended as this one started?): claimed again";
      }
      continue;
    }
    if (holder != nonce_) {
      taken_over_ = std::string("another job took the servers over (the first server's table ") +
                    kOwnerTable +
                    " holds its claim now): its start replaced this job's dense table and rows, "
                    "so this job's figures are no longer its own; run one job at a time on a "
                    "set of servers";
    }
  }
}

}  // namespace gpubox::trainer
