#include "trainer/engine/peer_watch.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <vector>

#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

// Ends the process `grace_s` from now with `reason`, unless it ended by itself first. Detached
// and holding only its own copy of the reason: it outlives the trainer (whose teardown may be
// what hangs, e.g. a thread in a host-tier call to a server that is no longer reachable).
void arm_forced_exit(const std::string& reason, double grace_s) {
  if (grace_s <= 0) return;
  std::thread([reason, grace_s] {
    std::this_thread::sleep_for(millis(grace_s));
    std::fprintf(stderr, "gpubox_train: %s (the trainer had not stopped %.3g s after: ending it)\n",
                 reason.c_str(), grace_s);
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

}  // namespace

PeerWatch::PeerWatch(comm::CommGroup& group, comm::RendezvousStore& store, const TrainerEnv& env,
                     table::server::RemoteHostTier* servers, PeerWatchOptions options)
    : group_(group), servers_(servers), options_(options) {
  comm::HeartbeatOptions beat;
  beat.timeout = millis(options_.peer_timeout_s);
  beat.join_timeout = millis(options_.join_timeout_s);
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
  const auto timeout = millis(options_.peer_timeout_s);
  const auto interval = std::max(timeout / 5, std::chrono::milliseconds(20));
  const double ping_deadline_s = std::max(0.2, options_.peer_timeout_s / 5);
  const std::size_t n = servers_->endpoint_count();
  std::vector<Clock::time_point> last_answer(n, Clock::now());
  std::vector<bool> reported(n, false);
  MutexLock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    for (std::size_t e = 0; e < n; ++e) {
      const Status st = servers_->ping(e, ping_deadline_s);
      const auto now = Clock::now();
      const auto code = st.code();
      // Any answer, an error included (a busy or restarted server), means it is reachable.
      if (code != Status::Code::kUnavailable && code != Status::Code::kDeadlineExceeded) {
        last_answer[e] = now;
        continue;
      }
      if (reported[e] || now - last_answer[e] < timeout) continue;
      reported[e] = true;
      std::ostringstream reason;
      reason.precision(3);
      reason << "lost server " << servers_->endpoint_name(e) << " (shard " << e << " of " << n
             << "): no answer for " << std::chrono::duration<double>(now - last_answer[e]).count()
             << " s (runner.peer_timeout_s=" << options_.peer_timeout_s
             << "): the network to it is down, or it stopped; last error: " << st.to_string();
      on_lost(reason.str());
    }
    lock.lock();
    const auto until = Clock::now() + interval;
    while (!stopping_ && stop_cv_.wait_until(lock, until) != std::cv_status::timeout) {
    }
  }
}

}  // namespace gpubox::trainer
