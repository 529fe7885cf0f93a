#include "trainer/schedule/lost_peers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer {

std::chrono::milliseconds millis_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

struct ForcedExit::Armed {
  std::atomic<bool> cancelled{false};
  Mutex mu;
  std::string reason GPUBOX_GUARDED_BY(mu);
};

void ForcedExit::cancel() const {
  if (armed_) armed_->cancelled.store(true);
}

void ForcedExit::set_reason(const std::string& reason) const {
  if (!armed_) return;
  MutexLock lock(armed_->mu);
  armed_->reason = reason;
}

ForcedExit arm_forced_exit(const std::string& reason, double grace_s) {
  ForcedExit exit;
  if (grace_s <= 0) return exit;
  exit.armed_ = std::make_shared<ForcedExit::Armed>();
  exit.set_reason(reason);
  std::thread([grace_s, armed = exit.armed_] {
    std::this_thread::sleep_for(millis_of(grace_s));
    if (armed->cancelled.load()) return;
    std::string reason;
    {
      MutexLock lock(armed->mu);
      reason = armed->reason;
    }
    std::fprintf(stderr, "gpubox_train: %s (the trainer had not stopped %.3g s after: ending it)\n",
                 reason.c_str(), grace_s);
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
  return exit;
}

ServerPings::ServerPings(table::server::RemoteHostTier& servers, double timeout_s)
    : servers_(servers),
      timeout_s_(timeout_s),
      last_answer_(servers.endpoint_count(), Clock::now()),
      reported_(servers.endpoint_count(), false) {}

std::vector<std::string> ServerPings::round() {
  const auto timeout = millis_of(timeout_s_);
  const double ping_deadline_s = std::max(0.2, timeout_s_ / 5);
  const std::size_t n = last_answer_.size();
  std::vector<std::string> lost;
  for (std::size_t e = 0; e < n; ++e) {
    bool heard = false;
    const Status st = servers_.ping(e, ping_deadline_s, &heard);
    const auto now = Clock::now();
    const auto code = st.code();
    // Any answer, an error included (a busy or restarted server, a proof refused unchecked for
    // this host's AUTH backoff), means it is reachable.
    if (heard || (code != Status::Code::kUnavailable && code != Status::Code::kDeadlineExceeded)) {
      last_answer_[e] = now;
      continue;
    }
    if (reported_[e] || now - last_answer_[e] < timeout) continue;
    reported_[e] = true;
    std::ostringstream reason;
    reason.precision(3);
    reason << "lost server " << servers_.endpoint_name(e) << " (shard " << e << " of " << n
           << "): no answer for " << std::chrono::duration<double>(now - last_answer_[e]).count()
           << " s (runner.peer_timeout_s=" << timeout_s_
           << "): the network to it is down, or it stopped; last error: " << st.to_string();
    lost.push_back(reason.str());
  }
  return lost;
}

}  // namespace gpubox::trainer
