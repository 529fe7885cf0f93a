#include "trainer/ps_modes/ps_peer_watch.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <utility>

#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using Clock = std::chrono::steady_clock;
using table::server::DenseAction;

std::vector<float> zeros(int trainers) {
  return std::vector<float>(2 * static_cast<std::size_t>(trainers), 0.0f);
}

}  // namespace

Status PsPeerWatch::reset(table::server::RemoteHostTier& servers, int trainers) {
  std::vector<float> values = zeros(trainers);
  return servers.dense(DenseAction::kWrite, kAliveTable, &values)
      .with_context("resetting the servers' table " + std::string(kAliveTable));
}

StatusOr<std::vector<bool>> PsPeerWatch::finished(table::server::RemoteHostTier& servers,
                                                  int trainers) {
  std::vector<float> values = zeros(trainers);
  GPUBOX_RETURN_IF_ERROR(servers.dense(DenseAction::kRead, kAliveTable, &values));
  std::vector<bool> done(static_cast<std::size_t>(trainers));
  for (std::size_t w = 0; w < done.size(); ++w) done[w] = values[done.size() + w] > 0;
  return done;
}

PsPeerWatch::PsPeerWatch(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                         PsPeerWatchOptions options,
                         std::function<void(const std::string&)> on_lost)
    : servers_(servers),
      trainer_id_(trainer_id),
      trainers_(trainers),
      options_(options),
      on_lost_(std::move(on_lost)) {
  beat_thread_ = std::thread([this] { beat_loop(); });
  if (servers_.endpoint_count() > 0) ping_thread_ = std::thread([this] { ping_loop(); });
}

PsPeerWatch::~PsPeerWatch() { stop(); }

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
  std::vector<float> mark = zeros(trainers_);
  mark[static_cast<std::size_t>(trainers_ + trainer_id_)] = 1.0f;
  return servers_.dense(DenseAction::kAdd, kAliveTable, &mark)
      .with_context("telling the other trainers (table " + std::string(kAliveTable) +
                    ") that trainer " + std::to_string(trainer_id_) + " finished");
}

std::string PsPeerWatch::lost() const {
  if (!any_lost_.load(std::memory_order_acquire)) return {};
  MutexLock lock(mu_);
  return lost_;
}

void PsPeerWatch::on_lost(const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (!lost_.empty()) {
      GPUBOX_LOG(WARNING) << reason;
      return;
    }
    lost_ = reason;
  }
  any_lost_.store(true, std::memory_order_release);
  GPUBOX_LOG(ERROR) << reason;
  if (on_lost_) on_lost_(reason);
  arm_forced_exit(reason, options_.exit_grace_s);
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

void PsPeerWatch::beat_loop() {
  const auto timeout = millis_of(options_.peer_timeout_s);
  const auto n = static_cast<std::size_t>(trainers_);
  std::vector<float> last_count(n, -1.0f);
  std::vector<Clock::time_point> last_move(n, Clock::now());
  std::vector<bool> reported(n, false);
  std::vector<float> values;
  do {
    values = zeros(trainers_);
    values[static_cast<std::size_t>(trainer_id_)] = 1.0f;
    // A failed beat (this trainer cannot reach the first server) judges nobody: the others see
    // this one's count stop, and the ping thread names the server.
    if (!servers_.dense(DenseAction::kAdd, kAliveTable, &values).ok() || values.size() != 2 * n) {
      continue;
    }
    const auto now = Clock::now();
    for (std::size_t w = 0; w < n; ++w) {
      // A trainer not yet beating (still starting, its count 0 since the job's reset) is not
      // judged: one that never comes is left to the barriers' runner.collective_timeout_s.
      if (static_cast<int>(w) == trainer_id_ || values[n + w] > 0 || reported[w]) continue;
      if (values[w] <= 0) {
        last_move[w] = now;
        continue;
      }
      if (values[w] != last_count[w]) {
        last_count[w] = values[w];
        last_move[w] = now;
        continue;
      }
      if (now - last_move[w] < timeout) continue;
      reported[w] = true;
      std::ostringstream reason;
      reason.precision(3);
      reason << "lost trainer " << w << " of " << n << ": its heartbeat through server "
             << servers_.endpoint_name(0) << " stopped "
             << std::chrono::duration<double>(now - last_move[w]).count()
             << " s ago (runner.peer_timeout_s=" << options_.peer_timeout_s
             << ") before it finished: its process died or was stopped, or its link to the "
                "servers is down";
      on_lost(reason.str());
    }
  } while (wait_interval());
}

void PsPeerWatch::ping_loop() {
  ServerPings pings(servers_, options_.peer_timeout_s);
  do {
    for (const std::string& reason : pings.round()) on_lost(reason);
  } while (wait_interval());
}

}  // namespace gpubox::trainer::ps_modes
