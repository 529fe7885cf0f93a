// What every mode's lost-peer watch shares (the gpubox and collective modes' PeerWatch, the PS
// modes' PsPeerWatch): the ping of every gpubox_server a job uses, and the forced end of a
// process whose trainer cannot be woken after a loss.
//
// Thread-safety: ServerPings is used by one watch thread; arm_forced_exit and ForcedExit's
// methods from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer {

// A forced end armed by arm_forced_exit. cancel() before it fires keeps the process (its
// trainer stopped by itself, nothing left blocked); an empty one cancels nothing. Copyable.
class ForcedExit {
 public:
  void cancel() const;
  // What the end's stderr line says, from now on (the loss it was armed with and those seen
  // since: a watch's lost()); an empty one ignores it.
  void set_reason(const std::string& reason) const;

 private:
  friend ForcedExit arm_forced_exit(const std::string& reason, double grace_s);
  struct Armed;  // shared with the thread that ends the process
  std::shared_ptr<Armed> armed_;
};

// Ends the process `grace_s` from now with `reason` (or the last ForcedExit::set_reason) on
// stderr and exit status 1, unless it ended by itself first or the returned ForcedExit was
// cancelled; nothing when grace_s <= 0. Detached, holding nothing of the trainer, only the reason
// it shares with the returned ForcedExit and its copies (set_reason): it outlives the trainer,
// whose teardown may be what hangs (a thread in a host-tier call to a server that is no longer
// reachable, a rank blocked inside a Gloo collective).
ForcedExit arm_forced_exit(const std::string& reason, double grace_s);

// Whole milliseconds, rounded up.
std::chrono::milliseconds millis_of(double seconds);

// Pings every server of `servers` (RemoteHostTier::ping) each round; a server that has not
// answered for `timeout_s` is lost, reported once.
class ServerPings {
 public:
  ServerPings(table::server::RemoteHostTier& servers, double timeout_s);
  // One ping of every server (each bounded by timeout / 5, at least 0.2 s); the reasons of the
  // servers newly lost, naming each by address and shard.
  std::vector<std::string> round();
  std::size_t servers() const { return last_answer_.size(); }

 private:
  using Clock = std::chrono::steady_clock;
  table::server::RemoteHostTier& servers_;
  double timeout_s_;
  std::vector<Clock::time_point> last_answer_;
  std::vector<bool> reported_;
};

}  // namespace gpubox::trainer
