// The client side of the wire: endpoints, pooled connections, and a pipelined request runner
// that retries lost connections with exponential backoff up to a deadline. Plain POSIX sockets
// with poll(): every wait has a deadline, so a dead or hung server becomes a clear Status.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/connection.hpp"
#include "table/server/connection_limits.hpp"
#include "table/server/protocol.hpp"

namespace gpubox::table::server {

// Runs on every new connection (after AUTH) before it carries requests, e.g. to check which
// server answers. A non-OK status fails the connection; PermissionDenied, InvalidArgument and
// Aborted end the call at once instead of being retried.
using ConnectHook =
    std::function<Status(uint32_t endpoint, Connection& connection, Clock::time_point deadline)>;

struct TransportOptions {
  uint64_t client_id = 0;
  // When set (at least kMinTokenChars): every new connection proves it knows it first
  // (auth_handshake.hpp); the token itself is never sent.
  std::string auth_token;
  double deadline_s = 30.0;  // total time a call may spend, retries included
  // A call gives up sooner (Unavailable) on an endpoint that none of its attempts reached for
  // this long, counted from the first such attempt: an attempt reached it once its TCP connection
  // opened or a frame came, so a live server slow in the handshake (AUTH, on_connect) is retried
  // to the deadline; < 0: deadline_s bounds it alone, so a server restarted within the deadline
  // takes the call. Tests shorten it to fail a call on a stopped server at once while the live
  // servers' calls keep the long deadline; keep it above connect_timeout_s.
  double unreachable_s = -1.0;
  double connect_timeout_s = 2.0;  // one connection attempt
  double initial_backoff_s = 0.01;
  double max_backoff_s = 1.0;
  int max_in_flight = 4;  // pipelined requests per connection
  std::size_t max_idle_per_endpoint = 16;
  uint32_t max_payload_bytes = kDefaultMaxPayloadBytes;
  // Of every connection it opens (Connection::open): bounds the long waits (a BARRIER, up to
  // runner.collective_timeout_s) on a server that vanished without closing the connection.
  TcpKeepalive keepalive;
  ConnectHook on_connect;  // optional
};

// One request of a bulk call. `frame` is complete (header + payload); its request id stays the
// same across retries, so the server can de-duplicate mutations.
struct OutgoingRequest {
  uint32_t endpoint = 0;
  // Requests of one lane travel on one connection, in order; different lanes may use different
  // connections and be applied in any order relative to each other.
  uint32_t lane = 0;
  uint64_t request_id = 0;
  std::vector<uint8_t> frame;
};

// Called once per request with its OK reply's payload (on the calling thread). A non-OK return
// ends the call with that status.
using ReplyHandler =
    std::function<Status(std::size_t index, const uint8_t* payload, std::size_t bytes)>;

// Runs requests against the endpoints. Thread-safe: concurrent run() calls use separate
// connections from the per-endpoint pools.
class Transport {
 public:
  Transport(std::vector<Endpoint> endpoints, TransportOptions options);
  ~Transport();

  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  const TransportOptions& options() const { return options_; }
  uint64_t next_request_id();

  // Sends every request (up to max_in_flight per connection, all endpoints at once) and hands
  // each OK reply to `on_reply`. A lost connection is retried with backoff until the deadline
  // (`deadline_s` < 0: the options' one); then the status names the endpoint, the op, how long
  // and how often it tried, and the last error; when the deadline cut an attempt short after an
  // earlier one had failed, the last error stays that earlier one (why the call kept retrying,
  // e.g. "server busy") and the cut attempt is named beside it. A reply with an error status ends
  // the call with it, except "still being applied" (a retried mutation racing its original), which
  // is retried. retry=false: a lost connection ends the call at once (BARRIER, SHUTDOWN).
  // The code of a call that gave up says what ended it: DeadlineExceeded when the deadline did
  // (retried to it, or, without retries, no reply before it: a BARRIER's wait ran out),
  // Unavailable when a lost connection did (without retries) or unreachable_s did.
  // connections > 1 spreads an endpoint's requests over up to that many connections (by lane),
  // so that several server threads work on one call. *heard (when given): whether any endpoint
  // sent a frame during the call (a reply, a refusal, a notice): it was reachable, even if the
  // call failed (say, its AUTH_PROOF was refused unchecked for its host's backoff).
  Status run(Op op, std::vector<OutgoingRequest>& requests, const ReplyHandler& on_reply,
             bool retry = true, double deadline_s = -1.0, int connections = 1,
             bool* heard = nullptr);

  // run() for an op the server reports progress on while it works (SAVE, LOAD, SHRINK: PROGRESS
  // frames, protocol.hpp), with retries, one connection per endpoint. An endpoint is given up on
  // (DeadlineExceeded, naming it, the op and "no progress reported for <silence_s> s") only once
  // `silence_s` (< 0: the options' deadline_s) passed without a PROGRESS frame from it. A "retry
  // later" answer (server busy: the in-flight budget, or its SAVE/LOAD worker full) is retried
  // but is no progress: a server busy for longer is given up on. (A request the server is still
  // applying after a lost connection is not answered "retry later": its retry waits for the same
  // reply, with PROGRESS frames.) The call's total time bounds nothing: a SAVE of any size that
  // keeps reporting is never cut, while a server that stopped, hung or vanished is found within
  // about silence_s (a connection the server closed is retried within it, as in run()).
  Status run_with_progress(Op op, std::vector<OutgoingRequest>& requests,
                           const ReplyHandler& on_reply, double silence_s);

  // Builds a request frame for `op` with a fresh request id, or with `request_id` when not 0 (a
  // request sent before, sent again: the server applies an id once while its retry cache
  // remembers it).
  OutgoingRequest make_request(Op op, uint32_t endpoint, const std::vector<uint8_t>& payload,
                               uint64_t request_id = 0);

  // How many PROGRESS frames this transport's calls received so far, from any thread: a count
  // that moves while a SAVE, LOAD or SHRINK of this client moves on some server (what a trainer
  // shows the others of its job while they wait for its save,
  // trainer/schedule/trainer_zero_work.hpp).
  uint64_t progress_frames() const { return progress_frames_.load(std::memory_order_relaxed); }

 private:
  struct Pool;
  struct Attempt;
  // A pooled connection (reused=true) or a new one (connected and authenticated).
  // *opened: the TCP connection opened (a pooled one did), even if its handshake then failed;
  // *heard: the server sent a frame (say, refused the AUTH_PROOF).
  StatusOr<Connection> acquire(uint32_t endpoint, Clock::time_point deadline, bool allow_pooled,
                               bool* reused, bool* opened, bool* heard);
  void release(uint32_t endpoint, Connection connection);
  // AUTH and AUTH_PROOF on a new connection.
  Status authenticate(Connection& conn, Clock::time_point deadline, bool* heard);
  struct RunState;
  // Sends and reads the attempts' requests until each finished, failed, or was cut by its
  // endpoint's deadline (RunState::deadline, moved on by PROGRESS frames when by progress).
  Status drive(RunState& state, std::vector<Attempt>& attempts,
               std::vector<OutgoingRequest>& requests, const ReplyHandler& on_reply);
  Status run_until_done(RunState& state, std::vector<OutgoingRequest>& requests,
                        const ReplyHandler& on_reply, int connections);
  // Connections for endpoint `e`'s pending requests, one per lane in use, appended to `attempts`.
  // An endpoint that cannot be reached is scheduled for a retry (OK returned) or, where no retry
  // can help, ends the call.
  Status open_attempts(RunState& state, uint32_t e, const std::vector<std::size_t>& pending,
                       const std::vector<OutgoingRequest>& requests, int connections,
                       std::vector<Attempt>* attempts);
  // After drive(): connections back to the pools, failed endpoints scheduled for a retry.
  Status settle(RunState& state, std::vector<Attempt>& attempts);

  std::vector<Endpoint> endpoints_;
  TransportOptions options_;
  std::vector<std::unique_ptr<Pool>> pools_;
  Mutex id_mu_;
  uint64_t next_id_ GPUBOX_GUARDED_BY(id_mu_) = 1;
  std::atomic<uint64_t> progress_frames_{0};
};

}  // namespace gpubox::table::server
