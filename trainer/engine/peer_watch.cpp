#include "trainer/engine/peer_watch.hpp"

#include <algorithm>
#include <chrono>
#include <exception>

#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::trainer {

PeerWatch::PeerWatch(comm::CommGroup& group, comm::RendezvousStore& store, const TrainerEnv& env,
                     table::server::RemoteHostTier* servers, PeerWatchOptions options)
    : group_(group), servers_(servers), options_(options) {
  comm::HeartbeatOptions beat;
  beat.timeout = millis_of(options_.peer_timeout_s);
  beat.join_timeout = millis_of(options_.join_timeout_s);
  heartbeat_ =
      std::make_unique<comm::PeerHeartbeat>(store, env.trainer_id, env.trainers, env.host, beat,
                                            [this](const std::string& reason) { on_lost(reason); });
  if (servers_ != nullptr && servers_->endpoint_count() > 0) {
    server_thread_ = std::thread([this] { watch_servers(); });
  }
}

PeerWatch::~PeerWatch() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (server_thread_.joinable()) server_thread_.join();
  heartbeat_->stop(std::uncaught_exceptions() == 0 && lost().empty());
}

std::string PeerWatch::lost() const {
  MutexLock lock(mu_);
  return lost_;
}

void PeerWatch::on_lost(const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (!lost_.empty()) {
      GPUBOX_LOG(WARNING) << reason;
      return;
    }
    lost_ = reason;
  }
  GPUBOX_LOG(ERROR) << reason;
  group_.abort(reason);
  arm_forced_exit(reason, options_.exit_grace_s);
}

void PeerWatch::watch_servers() {
  const auto interval =
      std::max(millis_of(options_.peer_timeout_s) / 5, std::chrono::milliseconds(20));
  ServerPings pings(*servers_, options_.peer_timeout_s);
  MutexLock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    for (const std::string& reason : pings.round()) on_lost(reason);
    lock.lock();
    const auto until = std::chrono::steady_clock::now() + interval;
    while (!stopping_ && stop_cv_.wait_until(lock, until) != std::cv_status::timeout) {
    }
  }
}

}  // namespace gpubox::trainer
