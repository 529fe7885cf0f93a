// The lost-peer watch of a trainer of a job of several (PADDLE_TRAINERS_NUM > 1): a heartbeat
// with every other trainer (comm::PeerHeartbeat, over POD_IP) and a ping of every gpubox_server
// the job uses (RemoteHostTier::ping), each every peer_timeout / 5. A trainer or server silent
// for runner.peer_timeout_s (a partition, a machine down), or a trainer whose heartbeat ends
// before it finished (its process died), aborts the communicator group with a reason naming it by
// address: its next collective fails at once with that reason (NCCL: ncclCommAbort also ends
// the one under way), so the job ends within seconds rather than at runner.collective_timeout_s,
// which stays the bound of a slow step (a slow peer still beats).
//
// A rank blocked inside a Gloo collective (Gloo cannot wake it) or a trainer blocked elsewhere
// (a host-tier call to an unreachable server retries up to runner.server_timeout_s) is not
// woken by the abort: once a loss is seen, the process ends after `exit_grace_s` at the latest,
// printing the reason (gpubox_train's exit status 1).
//
// Thread-safety: construct and destroy from the controlling thread; the watch's threads call
// CommGroup::abort, which is thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "common/thread_annotations.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/peer_heartbeat.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer {

struct PeerWatchOptions {
  double peer_timeout_s = 10;   // runner.peer_timeout_s
  double join_timeout_s = 300;  // runner.collective_timeout_s: the heartbeat's joining
  double exit_grace_s =
      5;  // after a loss, the longest the process may take to end; 0: never forced
};

class PeerWatch {
 public:
  // Joins the other trainers' heartbeat through `store` (env.trainers > 1) and pings `servers`
  // (may be null: the in-process host tier). `group` and `servers` must outlive the watch.
  PeerWatch(comm::CommGroup& group, comm::RendezvousStore& store, const TrainerEnv& env,
            table::server::RemoteHostTier* servers, PeerWatchOptions options);
  // Stops watching. Says goodbye to the other trainers when the trainer is not unwinding from an
  // error and saw no loss: its end is then not reported as a lost peer.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The first loss seen ("" while none).
  std::string lost() const;

 private:
  // Aborts the group with `reason` (the first reason only) and arms the forced exit.
  void on_lost(const std::string& reason);
  void watch_servers();

  comm::CommGroup& group_;
  table::server::RemoteHostTier* servers_;
  const PeerWatchOptions options_;
  std::unique_ptr<comm::PeerHeartbeat> heartbeat_;
  mutable Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::string lost_ GPUBOX_GUARDED_BY(mu_);
  std::thread server_thread_;
};

}  // namespace gpubox::trainer
