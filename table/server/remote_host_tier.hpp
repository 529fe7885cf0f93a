// RemoteHostTier: the host tier held by gpubox_server processes, behind the same HostTier
// interface as the in-process table. Keys are sharded over the endpoints by
// host_shard(key, endpoints) (endpoint i must run with --shard_id i --shard_num <endpoints>, or
// be the only one); big batches are split into chunks that are pipelined on pooled connections
// to all endpoints at once; lost connections are retried with backoff up to a deadline, and a
// retried mutation keeps its request id so the server applies it once.
//
// Every new connection asks the server who it is (INFO: instance id and generation, see
// server_identity.hpp). A server that restarted in a way that may have lost this client's rows
// fails every call to it with Aborted naming the endpoint, until accept_restarts(): the trainer
// decides (resume from the last save, or stop), never the client silently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"
#include "table/host_tier.hpp"
#include "table/io/progress_env.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/server_identity.hpp"
#include "table/server/transport.hpp"

namespace gpubox::table::server {

struct RemoteHostTierOptions {
  std::string endpoints;  // "ip:port,ip:port" (PADDLE_PSERVERS_IP_PORT_LIST)
  // The trainer's row layout; every server must hold the same (checked at connect).
  AccessorConfig config;
  std::string auth_token;
  std::size_t chunk_rows = 4096;  // keys per request frame (lowered to fit the frame limit)
  int max_in_flight = 4;          // pipelined chunks per connection
  // Connections per endpoint that one pull/push/erase call spreads its chunks over (so several
  // server threads work on it). Keys are dealt to them by a hash, so every key's requests stay
  // on one connection, in order.
  int connections_per_endpoint = 2;
  // Per call, retries included; a SAVE, LOAD or SHRINK: per server, the longest it may report no
  // progress (a save of any size that keeps reporting is never cut).
  double deadline_s = 30.0;
  // A call gives up sooner (Unavailable) on a server none of its attempts reached (no TCP
  // connection opened, no frame heard) for this long (< 0: the deadline alone;
  // TransportOptions::unreachable_s; keep it above connect_timeout_s).
  double unreachable_s = -1.0;
  double connect_timeout_s = 2.0;
  double initial_backoff_s = 0.01;
  double max_backoff_s = 1.0;
  uint64_t client_id = 0;  // 0: random (the server de-duplicates retries per client id)
  // The largest frame payload this client sends or accepts (the servers' INFO may lower what it
  // sends); tests lower it to make small tables travel in several frames.
  uint32_t max_payload_bytes = kDefaultMaxPayloadBytes;
  // TCP keepalive of every connection to the servers (transport.hpp); tests shorten it.
  TcpKeepalive keepalive;
};

// The launcher's server list: $PADDLE_PSERVERS_IP_PORT_LIST, else $GPUBOX_PSERVERS_IP_PORT_LIST,
// else "" (no servers: the trainer keeps the host tier in-process).
std::string endpoints_from_environment();

// How one DENSE call runs (RemoteHostTier::dense).
struct DenseCall {
  // Its bound, retries included; < 0: RemoteHostTierOptions::deadline_s. A table's transfer time
  // is added either way.
  double deadline_s = -1.0;
  // Whether it counts as a change to the first server's state: a server restarted from the
  // last save is adopted quietly only when no change reached it since (ServerIdentityBook). A
  // table that only shows how a part moves (trainer0_work) is no change of the job's state.
  bool mutation = true;
  // Whether each of its frames answered counts in progress_frames(), as a SAVE's or LOAD's
  // PROGRESS frames do: a dense table read or written in a part of trainer 0 (a save, a load, the
  // job's start), so that a long one shows the others that the part moves (trainer_zero_work.hpp).
  // Not for the small tables other threads call meanwhile (trainer0_work itself, the heartbeats).
  bool progress = false;
  // 0: the call is a new request. Otherwise the request id it is sent under
  // (RemoteHostTier::next_request_id): a call made before (same action, table and values) that
  // failed, made again, which the first server applies once however many copies of it reach it
  // (its retry cache, while it remembers the id: gpubox_server --dedup_max_age_s). A table in one
  // frame only (InvalidArgument otherwise).
  uint64_t request_id = 0;
};

class RemoteHostTier final : public HostTier {
 public:
  // Parses the endpoints and checks each server's layout and shard (INFO), retrying until the
  // deadline so trainers may start before their servers.
  static StatusOr<std::unique_ptr<RemoteHostTier>> connect(RemoteHostTierOptions options);

  const RowLayout& layout() const override { return layout_; }
  const AccessorConfig& config() const override { return options_.config; }

  // All thread-safe. n == 0 is a no-op. A call that fails may have been applied on some
  // endpoints (each endpoint's share is applied at most once); pull, push and erase may simply
  // be called again.
  Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* created) override;
  Status peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* unknown) override;  // PEEK: no server changes anything
  Status push(const uint64_t* keys, std::size_t n, const float* rows) override;
  Status erase(const uint64_t* keys, std::size_t n) override;
  StatusOr<HostTierStats> stats() override;  // summed over the servers
  // SHRINK on every server, each bounded by deadline_s without progress reported by it (its
  // PROGRESS frames, as a SAVE's), not in all; rows deleted, summed. `on_progress` is not called.
  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override;
  // Every server saves its share under `path` on its own machine (see resolve_model_path).
  using HostTier::load;
  using HostTier::save;
  Status save(const std::string& path, SaveKind mode, io::FileEnv* env) override;
  Status load(const std::string& path, io::FileEnv* env) override;

  // Waits until `parties` callers (trainers) reached barrier `name` on the first server; not
  // retried (a lost connection would count twice). timeout_s < 0: the call deadline.
  Status barrier(const std::string& name, uint32_t parties, double timeout_s = -1.0);
  // Asks every server to stop gracefully.
  Status shutdown_servers();
  // BARRIER kJobEndBarrier with `trainers` parties on every server; not retried.
  Status end_job(uint32_t trainers) override;
  // Whether endpoint `e` answers (INFO, on a pooled connection or a new one) within
  // `deadline_s`: OK, or the server's own error (it answered); Unavailable or DeadlineExceeded
  // when it could not be reached, with *heard (when given) set when the server still sent
  // something meanwhile (say, it refused the AUTH_PROOF unchecked for this host's backoff): it is
  // reachable. The trainers' lost-server watch. Thread-safe.
  Status ping(std::size_t e, double deadline_s, bool* heard = nullptr);

  // ---- the parameter-server modes (runner.sync_mode async | sync | geo; ps_protocol.hpp) ----
  // Sends one update record (layout().push_dim() floats) per distinct key to the key's server,
  // which applies it on arrival: a gradient through the accessor's rule, or a geo delta. Missing
  // keys are created in `slots`. Thread-safe; retried like push (each share applied once).
  Status push_updates(PsUpdateKind kind, const uint64_t* keys, const int32_t* slots, std::size_t n,
                      const float* values);
  // The sync mode's step of a job of several trainers (remote_step_push.cpp): `part`'s gradients
  // (one record per distinct key) go to the keys' servers as PS_PUSH kStepGradient chunks
  // (part.chunks and part.chunk are set here), and every server this part has no key for gets an
  // empty chunk, so that each server knows when every part of the job's step arrived and applies
  // the step's sums once (ps_step_sums.hpp). n == 0 sends every server its empty chunk.
  // Thread-safe; retried like push_updates (each chunk held once).
  Status push_step(PsStepPart part, const uint64_t* keys, const int32_t* slots, std::size_t n,
                   const float* values);
  // DENSE on the first server: reads dense table `name` (created from *values when absent and
  // *values fits in one frame) or adds *values to it, or writes it; after a read or an add,
  // *values holds the table's values after the request. Thread-safe.
  //
  // A table of any size: one that does not fit in one frame (the smaller of this client's and
  // the servers' frame limits, DENSE's reply counted) travels in ranges, pipelined over the
  // connections a window at a time (two ranges a connection encoded at once, so the frames in
  // memory are bounded by the window, not the table; ps_protocol.hpp). A write is staged on the
  // server and seen whole or not at all. A read or an add is applied range by range, each range
  // atomically: a reader may see some ranges of another client's add and not others (the sync mode
  // reads only behind the barrier that follows every add, so it sees whole adds; the async and geo
  // modes already mix trainers' windows, as Paddle's communicator sends each dense variable on its
  // own), and *values after an add holds each range's sum as it was when that range was applied.
  // Non-finite values are refused before anything is sent; a range whose sum would not be
  // finite is refused whole, but ranges applied before it stay (the error says which range).
  // `call`: its bound, and whether it counts as a change (DenseCall).
  Status dense(DenseAction action, const std::string& name, std::vector<float>* values,
               const DenseCall& call = {});

  std::size_t endpoint_count() const { return transport_.endpoints().size(); }
  // "ip:port" of endpoint `e`.
  std::string endpoint_name(std::size_t e) const {
    return transport_.endpoints().at(e).to_string();
  }
  const RemoteHostTierOptions& options() const { return options_; }
  uint64_t client_id() const { return transport_.options().client_id; }
  // The PROGRESS frames this client's SAVE, LOAD and SHRINK calls received so far (Transport), the
  // frames answered to its DENSE calls made with DenseCall::progress, and the file operations and
  // steps counted in local_work(); from any thread.
  uint64_t progress_frames() const {
    return transport_.progress_frames() + own_progress_.load(std::memory_order_relaxed) +
           local_work_.ops();
  }
  // Where the caller counts file work it does beside the servers for the same part (trainer 0's
  // local writes of a save, its dense half and model manifest, through an io::ProgressEnv over
  // it: trainer_zero_work.hpp): each operation finished counts in progress_frames(), and one under
  // way is a move for a bounded time (TrainerZeroWork::kMaxLocalIoStallS). Thread-safe.
  io::FileWorkProgress& local_work() { return local_work_; }
  // A fresh request id of this client, for DenseCall::request_id. Thread-safe.
  uint64_t next_request_id() { return transport_.next_request_id(); }

  // Servers found restarted by a call that then failed (Aborted, naming the endpoint), in
  // endpoint order. Empty when none is pending.
  std::vector<ServerRestart> pending_restarts() const { return identities_.pending_restarts(); }
  // Whether endpoint `e` is among pending_restarts(). Endpoint 0, the first server, holds
  // trainer0_work and, in the PS modes, the job's barriers, votes and small tables.
  bool restart_pending(std::size_t e) const {
    for (const ServerRestart& restart : pending_restarts()) {
      if (restart.endpoint == e) return true;
    }
    return false;
  }
  // Adopts the restarted servers as they are now, so calls to them proceed: after the caller
  // restored their state (accept first, then load() the last save), or chose to go on without
  // the lost rows. Then checks every server as connect() does (rows, rule, seed, shard): a server
  // restarted with another config throws naming what differs (a recovery trained on under its
  // rule, or failed on a row stride that named no config).
  void accept_restarts();
  // What this client knows of endpoint `e` (instance id and generation).
  ServerIdentity server_identity(std::size_t e) const { return identities_.identity(e); }
  // The generation each server replied to the last successful save() or load(), in endpoint
  // order (the digest of that save's MANIFEST on the server's disk: what a model manifest names
  // the server's share by, table/io/model_manifest.hpp). Empty before the first.
  std::vector<uint64_t> last_sync_generations() const;

 private:
  RemoteHostTier(std::vector<Endpoint> endpoints, RemoteHostTierOptions options,
                 TransportOptions transport_options);
  Status check_servers();
  // The transport's on_connect: INFO on a new connection, checked by identities_.
  Status check_identity(uint32_t endpoint, Connection& connection, Clock::time_point deadline);
  // SAVE or LOAD on every endpoint, each bounded by deadline_s without progress reported by its
  // server (Transport::run_with_progress), not in all; a successful reply's generation syncs
  // identities_.
  Status run_sync(Op op, const std::vector<uint8_t>& payload);
  // PULL or PEEK of n keys, chunked over the endpoints; *created = the replies' counts summed.
  Status fetch_rows(Op op, const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                    std::size_t* created);
  // Keys per chunk so that every frame of a chunk stays under `max_payload_bytes`.
  std::size_t rows_per_frame(uint32_t max_payload_bytes) const;
  // Indices of keys[0..n) per (endpoint, lane) group, group = endpoint * lanes + lane, in order.
  std::vector<std::vector<uint32_t>> split_keys(const uint64_t* keys, std::size_t n) const;
  // The keys, slots and push records (`dim` floats) at positions pos[0..m) into the chunk's
  // arrays (resized to m).
  static void gather_records(const uint64_t* keys, const int32_t* slots, const float* values,
                             uint32_t dim, const uint32_t* pos, std::size_t m,
                             std::vector<uint64_t>* chunk_keys, std::vector<int32_t>* chunk_slots,
                             std::vector<float>* chunk_values);
  OutgoingRequest make_group_request(Op op, std::size_t group, const std::vector<uint8_t>& payload);
  // One request of `op` with `payload` (empty for STATS, SHUTDOWN, ...; a BARRIER's for end_job)
  // per endpoint.
  Status run_on_every_endpoint(Op op, const std::vector<uint8_t>& payload,
                               const ReplyHandler& on_reply, bool retry = true,
                               double timeout_s = -1.0);
  // DENSE of a table that does not fit in one frame: `per_frame` values per range
  // (remote_dense.cpp).
  Status dense_in_ranges(DenseAction action, const std::string& name, std::vector<float>* values,
                         std::size_t per_frame, const DenseCall& call);
  // One try of dense_in_ranges, under a new write id; NotFound when the server dropped the write.
  Status send_ranges(DenseAction action, const std::string& name, std::vector<float>* values,
                     std::size_t per_frame, const DenseCall& call);
  // The payload bytes a frame to and from the servers may hold.
  std::size_t frame_payload_limit() const;

  RemoteHostTierOptions options_;
  RowLayout layout_;
  WidthClasses classes_;    // the widths a PULL reply's rows may have
  std::size_t chunk_rows_;  // set at construction, lowered by check_servers() (before any use)
  // The smallest frame payload the servers accept (check_servers(); DENSE sizes its ranges
  // under it and this client's limit, rather than retry against a closing connection).
  uint32_t frame_limit_ = UINT32_MAX;
  ServerIdentityBook identities_;
  mutable Mutex sync_mu_;
  std::vector<uint64_t> sync_generations_ GPUBOX_GUARDED_BY(sync_mu_);
  Transport transport_;
  // Frames answered to DenseCall::progress calls.
  std::atomic<uint64_t> own_progress_{0};
  io::FileWorkProgress local_work_;
};

}  // namespace gpubox::table::server
