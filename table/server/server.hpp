// gpubox_server's engine: serves one HostTier over TCP (protocol.hpp) with Boost.Asio on a small
// thread pool. Embeddable: the gpubox_server binary, the tests and `gpubox_bench server` all
// start it in-process. Asio stays inside server.cpp.
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
  std::string bind_address = "127.0.0.1";  // loopback unless told otherwise
  uint16_t port = 0;                       // 0: an ephemeral port, see Server::port()
  int threads = 2;                         // Asio threads; table calls run on them
  uint32_t shard_id = 0;                   // this server's share of the keys: host_shard(key,
  uint32_t shard_num = 1;                  // shard_num) == shard_id; other keys are refused
  std::string data_dir;                    // relative SAVE/LOAD paths resolve under it
  std::string auth_token;                  // non-empty: connections must AUTH with it first
  uint32_t max_payload_bytes = kDefaultMaxPayloadBytes;
  std::size_t dedup_per_client = 4096;  // remembered mutation ids per client (retries)
  std::size_t dedup_clients = 1024;     // clients remembered
  // Fault injection for tests: called after a request was applied; returning true drops its
  // reply and closes the connection, as a network failure after the server's work would.
  std::function<bool(const FrameHeader&)> drop_reply;
};

struct ServerCounters {
  uint64_t connections = 0;         // accepted
  uint64_t requests = 0;            // frames that passed decoding
  uint64_t duplicate_requests = 0;  // retried mutations answered from the request window
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
  uint64_t protocol_errors = 0;  // connections closed for a bad frame
  uint64_t auth_refusals = 0;
};

// Where the server stores SAVE/LOAD `path`: under data_dir when relative, and in a
// `server-<shard_id>` sub-folder when shard_num > 1 (servers may share one file system).
// Paths with ".." are refused.
StatusOr<std::string> resolve_model_path(const ServerOptions& options, const std::string& path);

class Server {
 public:
  // Binds, listens and starts the threads. `table` must outlive the server. Thread-safe calls
  // of `table` are made from the server threads.
  static StatusOr<std::unique_ptr<Server>> start(HostTier* table, ServerOptions options);
  ~Server();  // stop() + wait()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;         // the bound port (the ephemeral one when asked for 0)
  std::string endpoint() const;  // "ip:port"
  // Stops accepting and serving; returns at once (wait() for the threads). Thread-safe,
  // idempotent. A SHUTDOWN frame calls it after its reply was sent.
  void stop();
  // Blocks until the server stopped and its threads ended. Call from one thread, not from a
  // server thread.
  void wait();
  bool stopped() const;
  ServerCounters counters() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpubox::table::server
