// Lost-peer detection between the trainer processes of a job: a heartbeat over TCP of its own,
// apart from the collective transport, so that a peer trainer that is gone, or that this process
// can no longer reach, is named within seconds. The collective timeout stays for slow steps: a
// peer whose steps are slow still beats.
//
// Each trainer listens on `host` (POD_IP) at a free port, publishes "heartbeat/<id>" =
// "<host> <port> <pid> <hostname>" in the rendezvous store, connects to every trainer of a lower
// id (sending a hello that names itself) and accepts every one of a higher id: one connection per
// pair of trainers. A thread then sends one byte to every peer each `timeout` / 5 and reads
// theirs. A peer is lost when
//  - nothing arrived from it for `timeout` (the link to it is down, or its machine stopped), or
//  - its connection ended without its goodbye (its process exited or was killed; reported 1 s
//    later, so that when it stopped on an error the job also saw, this trainer stops on its own
//    error, which says more).
// A trainer that ends normally says goodbye (stop(true)): its peers stop watching it. The first
// loss is reported once to `on_lost` with the peer's id, pid, machine and address and what was
// seen; the heartbeat goes on beating for the other peers until stop().
//
// Thread-safety: construct and stop() from one thread. on_lost runs on the heartbeat's thread
// and must not call stop().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpubox::comm {

class RendezvousStore;

struct HeartbeatOptions {
  std::chrono::milliseconds timeout{10000};  // silence that makes a peer lost (peer_timeout_s)
  std::chrono::milliseconds join_timeout{300000};  // how long the peers may take to join
};

// The reason a peer was lost, for an error message.
using LostPeerHandler = std::function<void(const std::string& reason)>;

class PeerHeartbeat {
 public:
  // Joins the heartbeat of the `trainers` processes of a job through `store` (which must
  // outlive the constructor only). Throws gpubox::Error naming the trainers that did not join
  // within options.join_timeout, or the address that cannot be listened on.
  PeerHeartbeat(RendezvousStore& store, int trainer_id, int trainers, const std::string& host,
                HeartbeatOptions options, LostPeerHandler on_lost);
  // stop(false): the peers see this trainer's connections end as its exit.
  ~PeerHeartbeat();
  PeerHeartbeat(const PeerHeartbeat&) = delete;
  PeerHeartbeat& operator=(const PeerHeartbeat&) = delete;

  // Ends the heartbeat; `finished`: tells every peer this trainer ended normally first (no
  // peer then reports it lost). Idempotent.
  void stop(bool finished);

  // "trainer 1 (pid 4242 on host-b, at 10.231.0.2)".
  std::string describe(int trainer) const;

 private:
  struct Peer {
    int trainer = -1;
    int fd = -1;
    std::string description;  // describe()
    std::chrono::steady_clock::time_point last_heard;
    bool said_goodbye = false;
    bool closed = false;
    std::string ended = {};  // its connection ended without a goodbye: the loss to report, once due
    std::chrono::steady_clock::time_point ended_at = {};
  };
  void listen_on(const std::string& host);
  // Reads every peer's address, connects to the lower ids, accepts the higher ones.
  void join(RendezvousStore& store);
  std::vector<std::pair<std::string, uint16_t>> read_addresses(
      RendezvousStore& store, std::chrono::steady_clock::time_point deadline);
  void connect_to(int trainer, const std::pair<std::string, uint16_t>& address,
                  std::chrono::steady_clock::time_point deadline);
  void accept_higher(std::chrono::steady_clock::time_point deadline);
  void run();
  // Reads what `peer` sent; marks it closed (and reports it lost, unless it said goodbye) when
  // its connection ended.
  void receive(Peer& peer, std::chrono::steady_clock::time_point now);
  void report(const std::string& reason);
  void close_peers(bool finished);

  const int trainer_id_;
  const int trainers_;
  const std::string host_;
  const HeartbeatOptions options_;
  const LostPeerHandler on_lost_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  int wake_[2] = {-1, -1};   // a pipe: stop() wakes the thread
  std::vector<Peer> peers_;  // every other trainer, in id order; the thread's alone once run
  std::vector<std::string> descriptions_;  // per trainer id
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finished_{false};
  bool reported_ = false;  // the thread's
  std::thread thread_;
};

}  // namespace gpubox::comm
