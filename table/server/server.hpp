// gpubox_server's engine: serves one HostTier over TCP (protocol.hpp) with Boost.Asio on a small
// thread pool. Embeddable: the gpubox_server binary, the tests and `gpubox_bench server` all
// start it in-process. Asio stays inside the server's .cpp files.
//
// What bounds it (docs/operations.md, "Security and durability"): connections (max_connections,
// a share of them for unauthenticated ones, deadlines per frame, for authentication, between
// frames and per BARRIER wait), bytes buffered per connection and in all (requests are read as
// their bytes arrive, never allocated from an announced length), the retry cache (bytes and
// age), and where SAVE and LOAD may touch (inside data_dir, links never followed). Without an
// auth token it serves loopback only; with one, connections prove they know it
// (auth_handshake.hpp) and wrong proofs are slowed per peer address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.hpp"
#include "table/host_tier.hpp"
#include "table/server/protocol.hpp"

namespace gpubox::table::server {

struct ServerOptions {
  // Loopback unless told otherwise; another address needs an auth_token.
  std::string bind_address = "127.0.0.1";
  uint16_t port = 0;       // 0: an ephemeral port, see Server::port()
  int threads = 2;         // Asio threads; table calls run on them
  uint32_t shard_id = 0;   // this server's share of the keys: host_shard(key,
  uint32_t shard_num = 1;  // shard_num) == shard_id; other keys are refused
  // SAVE/LOAD paths stay inside it (the working directory when empty): made when missing and
  // opened once at start; every file operation of a SAVE or LOAD is resolved beneath that
  // descriptor, never through a symbolic link (resolve_model_path).
  std::string data_dir;
  // Non-empty (at least kMinTokenChars): connections must prove they know it first.
  std::string auth_token;
  // The model folder the table was loaded from before start (--load, load_before_start), if
  // any, relative to data_dir (or absolute inside it): its generation is what INFO reports until
  // a LOAD, so clients can tell a restart that restored their last save.
  std::string loaded_model;
  uint32_t max_payload_bytes = kDefaultMaxPayloadBytes;

  // Connections beyond this are accepted and closed at once with a notice "server at its
  // connection cap (N)" (and a line per interval in the log).
  // 0: default_max_connections(the open files limit), see connection_limits.hpp.
  std::size_t max_connections = 0;
  // With a token: connections that have not authenticated may hold at most this many slots (0:
  // half of max_connections, at least 1); a new connection beyond evicts the oldest of them, so
  // a flood of them never keeps a trainer out.
  std::size_t max_unauthenticated = 0;
  // With a token: authentication must complete this long after connecting (else closed).
  double auth_timeout_s = 10.0;
  // Wrong AUTH proofs from one address: the next is checked base * 2^(k-1) s after the k-th,
  // at most max (auth_backoff.hpp).
  double auth_backoff_base_s = 0.1;
  double auth_backoff_max_s = 30.0;
  // A connection that waited this long for the first byte of its client's next frame is closed
  // (clients reconnect transparently). 0: never.
  double idle_timeout_s = 300.0;
  // Deadline of every frame, request or reply, from its first byte: its bytes must keep up with
  // min_transfer_bytes_per_s after a grace of frame_deadline_s (so a frame of B bytes has
  // frame_deadline_s + B / rate in all, and a client dripping bytes is cut after the grace).
  double frame_deadline_s = 10.0;
  double min_transfer_bytes_per_s = 1024.0 * 1024.0;
  // BARRIER waiters: at most this many at once over all barriers (0: half of max_connections),
  // each waiting at most barrier_timeout_s (then answered DeadlineExceeded).
  std::size_t max_barrier_waiters = 0;
  double barrier_timeout_s = 3600.0;
  // When the BARRIER kJobEndBarrier completes (every trainer of the job ended it well), stop:
  // once no connection is left open, at most kJobEndGrace later. Off: a server outlives jobs.
  bool exit_when_job_ends = false;
  // Request and reply payload bytes one connection may hold at once; 0: max_payload_bytes.
  // Before a connection authenticated it may hold kMaxAuthPayloadBytes only.
  std::size_t max_connection_buffer_bytes = 0;
  // Request and reply payload bytes of all connections together (ByteBudget: its last eighth
  // kept for connections holding little). A request that does not fit is read and dropped and
  // answered "server busy: in-flight budget" (the client's transport retries it).
  std::size_t max_inflight_bytes = std::size_t{1} << 30;
  // Bytes the table's rows and index may take (HostTierStats::memory_bytes) before the server
  // stops creating rows: a PULL, PUSH or PS_PUSH whose keys the table does not hold would go
  // over it is refused whole, ResourceExhausted "server memory limit: ..."; rows it holds are
  // served and updated as before. 0: no limit. gpubox_server sets it from --memory_mb when it
  // has no disk tier (with one, --memory_mb is the table's budget and rows beyond it go to disk).
  std::size_t memory_limit_bytes = 0;
  // The PS modes' dense tables (ps_store.hpp: DenseLimits): their bytes and every ranged write
  // held (at its announced size), together at most this many (a DENSE write or a ranged write's
  // first range over it is refused, ResourceExhausted).
  std::size_t max_dense_bytes = std::size_t{4} << 30;
  // A ranged DENSE write that received no range for this long is dropped (the sweep checks;
  // gpubox_server --dense_write_max_idle_s).
  double dense_write_max_idle_s = 120.0;
  // The sync mode's held sparse step of a job of several trainers (ps_step_sums.hpp:
  // StepSumsLimits): at most this many bytes held (a part over it is refused,
  // ResourceExhausted; gpubox_server --max_step_mb), and dropped unapplied when its parts did not
  // all arrive within step_max_wait_s of its first (gpubox_server --step_max_wait_s).
  std::size_t max_step_bytes = std::size_t{4} << 30;
  double step_max_wait_s = 300.0;  // runner.collective_timeout_s's default
  // The retry cache (successful mutations only): at most this many bytes, entries this old.
  // A DENSE add is remembered without its values (a retry reads the range again).
  std::size_t dedup_max_bytes = std::size_t{64} << 20;
  double dedup_max_age_s = 120.0;
  // What one client's remembered replies may take of dedup_max_bytes (0: an eighth of it; more
  // than dedup_max_bytes is refused at start): beyond it, that client's own oldest are forgotten
  // first, never another client's (gpubox_server --dedup_client_cache_mb).
  std::size_t dedup_max_client_bytes = 0;

  // While a SAVE, LOAD or SHRINK runs (on a worker thread of its own, not a network thread), its
  // connection gets a PROGRESS frame (protocol.hpp) at most this often, and only when the call
  // moved since the last one (finished a file operation or a step, or is in a file operation): its
  // client bounds such a call by the time without progress (Transport::run_with_progress), which
  // must stay well above this.
  double progress_interval_s = 0.25;
  // A file operation under way counts as moving only until it has been this long without a
  // file operation or step beginning or ending (a hung mount): then no PROGRESS frame is sent
  // and the hang is logged once, naming the operation (gpubox_server --max_io_stall_s).
  double max_io_stall_s = 600;

  // Fault injection for tests: called after a request was applied; returning true drops its
  // reply and closes the connection, as a network failure after the server's work would.
  std::function<bool(const FrameHeader&)> drop_reply;
  // Fault injection for tests: called before a request that runs on the network threads (not AUTH,
  // BARRIER, SAVE, LOAD or SHRINK) is applied, on the thread that read it, which it may block (a
  // request that waited in the server while its client gave up on it, applied late); returning
  // true drops it unapplied and closes the connection, as a network failure before the server
  // read it would.
  std::function<bool(const FrameHeader&)> before_apply;
  // Fault injection for tests: runs where the SAVE/LOAD worker thread starts; throwing
  // std::system_error there is that thread failing to start (BulkWorker::start).
  std::function<void()> worker_start_fault;
  // For tests: runs in wait() as it stops the SAVE/LOAD worker (after the network threads ended),
  // before it waits for the SAVE or LOAD under way.
  std::function<void()> stopping_worker_hook;
};

struct ServerCounters {
  uint64_t connections = 0;          // accepted (refused ones included)
  uint64_t open_connections = 0;     // now
  uint64_t refused_connections = 0;  // over max_connections, or shed while out of descriptors
  uint64_t accept_failures = 0;      // accept() errors (each pauses accepting)
  uint64_t idle_closed = 0;          // connections closed by the idle timeout
  uint64_t deadline_closed = 0;      // closed at a frame, reply or authentication deadline
  uint64_t evicted = 0;  // unauthenticated (or waiting beyond the cap) ones evicted for a new one
  // Idle connections that gave their slot at the cap to a client holding fewer (connection_share)
  uint64_t fair_share_evicted = 0;
  uint64_t waiting_over_cap = 0;  // connections now waiting beyond the cap to bind and take a slot
  uint64_t unauthenticated = 0;   // connections open now that have not authenticated
  uint64_t auth_failures = 0;     // wrong AUTH proofs
  // A gauge: AUTH proofs held now for their host's backoff (auth_backoff.hpp), not yet checked;
  // one closed while it waits leaves it once counted (a wrong one in auth_failures).
  uint64_t auth_proofs_waiting = 0;
  // AUTH proofs refused unchecked because their host's next slot is past their connection's
  // --auth_timeout_s (Unavailable, which clients retry); not in auth_failures.
  uint64_t auth_proofs_deferred = 0;
  // Frames refused (and their connections closed) for a client id other than the one their
  // connection is bound to (proved by its AUTH, or its first frame's without a token).
  uint64_t foreign_client_refusals = 0;
  uint64_t barrier_timeouts = 0;    // BARRIER waits answered at barrier_timeout_s
  uint64_t barrier_waiters = 0;     // a gauge: BARRIER waits open now, all barriers
  uint64_t requests = 0;            // frames that passed decoding
  uint64_t duplicate_requests = 0;  // retried mutations answered from the retry cache
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
  uint64_t protocol_errors = 0;  // connections closed for a bad frame
  uint64_t auth_refusals = 0;
  uint64_t budget_refusals = 0;          // requests answered "retry later" for the in-flight budget
  uint64_t inflight_bytes = 0;           // payload bytes buffered now, all connections
  uint64_t barrier_waiters_dropped = 0;  // waiters whose client left before the release
  uint64_t dedup_entries = 0;            // retry cache entries now
  uint64_t dedup_bytes = 0;
  // SAVE, LOAD and SHRINK on the server's worker: queued, run, dropped unrun (every client waiting
  // for one closed first), refused "server busy" (one per client id, 16 in all, queued or
  // running), and retries that waited for the same request's call instead of running it again.
  uint64_t bulk_queued = 0;
  uint64_t bulk_runs = 0;
  uint64_t bulk_skipped = 0;
  uint64_t bulk_busy = 0;
  uint64_t bulk_attached = 0;
  uint64_t dense_held_writes = 0;  // ranged DENSE writes held now, all clients
  uint64_t step_held_bytes = 0;    // the sync mode's held sparse step now (ps_step_sums.hpp)
  uint64_t steps_dropped = 0;      // sync steps dropped unapplied (or whose apply failed)
  // Sweeps finished: every sweep interval the server closes overdue connections and, once the job
  // ended (exit_when_job_ends), stops when no connection is open. A sweep begun after an event
  // has seen it once this grew by 2.
  uint64_t sweeps = 0;
};

// Where the server stores SAVE/LOAD `path`: a folder relative to data_dir
// (model_path_in_data_dir), in a `server-<shard_id>` sub-folder when shard_num > 1 (servers may
// share one file system). Every file operation on it then goes through the server's data_dir
// env (io::RootedEnv): resolved beneath data_dir's descriptor, never through a link.
StatusOr<std::string> resolve_model_path(const ServerOptions& options, const std::string& path);
// What --load does before the server starts: loads SAVE/LOAD `path` into `table` through an env
// rooted at options.data_dir, and returns the folder (relative to data_dir) for
// ServerOptions::loaded_model.
StatusOr<std::string> load_before_start(HostTier* table, const ServerOptions& options,
                                        const std::string& path);

class Server {
 public:
  // Binds, listens and starts the threads. `table` must outlive the server. Thread-safe calls
  // of `table` are made from the server threads. A non-loopback bind_address without an
  // auth_token is refused.
  static StatusOr<std::unique_ptr<Server>> start(HostTier* table, ServerOptions options);
  ~Server();  // stop() + wait()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;                // the bound port (the ephemeral one when asked for 0)
  std::string endpoint() const;         // "ip:port"
  uint64_t instance_id() const;         // random per Server, never 0 (INFO reports it)
  std::size_t max_connections() const;  // the effective cap
  // Stops accepting and serving; returns at once (wait() for the threads). Thread-safe,
  // idempotent. A SHUTDOWN frame calls it after its reply was sent.
  void stop();
  // Blocks until the server stopped and its threads ended, then closes the connections still
  // open (each told "server stopped", but one with a reply half-written): their clients' calls fail
  // at once rather than at their deadlines. Call from one thread, not from a server thread.
  void wait();
  bool stopped() const;
  ServerCounters counters() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpubox::table::server
