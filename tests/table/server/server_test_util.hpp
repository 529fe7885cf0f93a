// Helpers of the loopback server tests: the test row layout, a server over a table on an
// ephemeral port, client options with short deadlines, and raw-socket probes.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "table/server/auth_handshake.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/common/free_port.hpp"
#include "tests/table/server/process_probe.hpp"

namespace gpubox::table::server::testing {

inline AccessorConfig test_config() {
  AccessorConfig cfg;
  cfg.optimizer.kind = SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  cfg.optimizer.initial_range = 0.5f;  // non-zero embed_w: created rows are distinguishable
  cfg.seed = 17;
  cfg.delete_threshold = 0.0f;  // shrink decays and keeps rows (the retry test counts decays)
  return cfg;
}

// A fresh folder under the temp dir (named after the test's `name` and this process), removed at
// the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("gpubox_server_test_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::unique_ptr<Server> start_server(HostTier* table, ServerOptions options = {}) {
  auto server = Server::start(table, std::move(options));
  EXPECT_TRUE(server.ok()) << server.status().to_string();
  return server.ok() ? std::move(*server) : nullptr;
}

inline RemoteHostTierOptions client_options(const std::string& endpoints) {
  RemoteHostTierOptions o;
  o.endpoints = endpoints;
  o.config = test_config();
  o.chunk_rows = 64;  // small chunks: batches are split and pipelined
  o.max_in_flight = 3;
  o.deadline_s = 3.0;
  o.connect_timeout_s = 0.5;
  o.initial_backoff_s = 0.005;
  o.max_backoff_s = 0.1;
  return o;
}

inline std::unique_ptr<RemoteHostTier> connect_client(RemoteHostTierOptions options) {
  auto client = RemoteHostTier::connect(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status().to_string();
  return client.ok() ? std::move(*client) : nullptr;
}

inline Clock::time_point seconds_from_now(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A raw connection to the server on `port` (not authenticated, not checked).
inline Connection raw_connection(uint16_t port) {
  auto conn = Connection::open(Endpoint{"127.0.0.1", port}, seconds_from_now(2));
  EXPECT_TRUE(conn.ok()) << conn.status().to_string();
  return conn.ok() ? std::move(*conn) : Connection();
}

// Sends one request frame on `conn` and reads the reply: its status (OK, or the error it
// carries), or Unavailable when the connection closed first.
inline Status raw_call(Connection& conn, Op op, const std::vector<uint8_t>& payload,
                       uint64_t request_id = 1, uint64_t client_id = 1,
                       std::vector<uint8_t>* reply_payload = nullptr) {
  FrameHeader h;
  h.op = op;
  h.request_id = request_id;
  h.client_id = client_id;
  auto reply = conn.call(h, payload, kDefaultMaxPayloadBytes, seconds_from_now(3));
  if (!reply.ok()) return reply.status();
  if (reply_payload) *reply_payload = std::move(*reply);
  return Status::OK();
}

// A raw connection to the server on 127.0.0.1:`port` from the loopback address `source`
// (loopback_socket_from: the server sees another peer address).
inline Connection raw_connection_from(const char* source, uint16_t port) {
  const int fd = loopback_socket_from(source, port);
  EXPECT_GE(fd, 0) << "from " << source << ": " << std::strerror(errno);
  return Connection(fd);
}

// A token long enough for a server (kMinTokenChars).
inline constexpr char kTestToken[] = "0123456789abcdef0123456789abcdef";

// AUTH and AUTH_PROOF by hand on `conn`: the proof's status. *nonce, *proof: what was used.
inline Status raw_authenticate(Connection& conn, const std::string& token, uint64_t client_id = 1,
                               AuthNonce* nonce = nullptr, AuthProof* proof = nullptr) {
  std::vector<uint8_t> challenge;
  GPUBOX_RETURN_IF_ERROR(raw_call(conn, Op::kAuth, {}, 1, client_id, &challenge));
  auto n = decode_auth_challenge(challenge.data(), challenge.size());
  if (!n.ok()) return n.status();
  const AuthProof p = auth_proof(token, *n, client_id);
  if (nonce) *nonce = *n;
  if (proof) *proof = p;
  return raw_call(conn, Op::kAuthProof, std::vector<uint8_t>(p.begin(), p.end()), 2, client_id);
}

// A connection to `server` from loopback address `source` bound to `client`: authenticated as it
// on a token server, or bound by a first frame (STATS) carrying it.
inline Connection connect_as(const Server& server, bool token, uint64_t client,
                             const char* source = "127.0.0.1") {
  Connection conn = raw_connection_from(source, server.port());
  const Status st = token ? raw_authenticate(conn, kTestToken, client)
                          : raw_call(conn, Op::kStats, {}, 1, client);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return conn;
}

// ---- DENSE ranges by hand (ps_protocol.hpp) ---------------------------------------------------

// One raw DENSE range from `client` (1 unless told): its status (the reply's payload in *reply).
inline Status raw_dense(Connection& conn, DenseRequest head, const std::vector<float>* values,
                        uint64_t request_id, std::vector<uint8_t>* reply = nullptr,
                        uint64_t client = 1) {
  std::vector<uint8_t> payload;
  head.has_values = values != nullptr;
  encode_dense_range(head, values ? values->data() : nullptr, &payload);
  return raw_call(conn, Op::kDense, payload, request_id, client, reply);
}

// Whether the reply to a write range says the write was committed.
inline bool dense_committed(const std::vector<uint8_t>& reply, uint32_t offset) {
  auto head = decode_dense_reply(reply.data(), reply.size(), offset, 0);
  return head.ok() && head->committed;
}

// The head of a DENSE request of table "dense": a range of a table of `total` values.
inline DenseRequest dense_range(DenseAction action, uint32_t total, uint32_t offset, uint32_t count,
                                uint64_t write_id = 0) {
  DenseRequest head;
  head.action = action;
  head.name = "dense";
  head.total = total;
  head.offset = offset;
  head.count = count;
  head.write_id = write_id;
  return head;
}

// Half of table "dense" (8 values) and another half: what the ranged-write tests send.
inline const std::vector<float> kFour = {1.0f, 2.0f, 3.0f, 4.0f};
inline const std::vector<float> kOtherFour = {5.0f, 6.0f, 7.0f, 8.0f};

// Range [offset, offset + 4) of ranged write `write` of table "dense" (8 values) from `client`:
// its status (the reply's payload in *reply).
inline Status write_half(Connection& conn, uint64_t client, uint64_t write, uint32_t offset,
                         const std::vector<float>& values, uint64_t request_id,
                         std::vector<uint8_t>* reply = nullptr) {
  return raw_dense(conn, dense_range(DenseAction::kWrite, 8, offset, 4, write), &values, request_id,
                   reply, client);
}

// A trainer's whole ranged write of "dense" (two ranges) from loopback address `source` as
// `client`: asserts it was committed.
inline void write_commits(const Server& server, bool token, const char* source, uint64_t client) {
  Connection conn = connect_as(server, token, client, source);
  std::vector<uint8_t> reply;
  const Status first = write_half(conn, client, 1, 0, kFour, 2);
  ASSERT_TRUE(first.ok()) << source << " client " << client << ": " << first.to_string();
  const Status last = write_half(conn, client, 1, 4, kOtherFour, 3, &reply);
  ASSERT_TRUE(last.ok()) << source << " client " << client << ": " << last.to_string();
  EXPECT_TRUE(dense_committed(reply, 4)) << source << " client " << client;
}

// Clients first_client, first_client + 1, ... of loopback address `source`, each on a connection
// of its own kept in *open, start `per_client` ranged writes each (their first range only) until
// the server holds `until` in all (or `until` clients started: a share full of them holds no
// more).
inline void hold_writes(const Server& server, bool token, const char* source, uint64_t first_client,
                        std::size_t per_client, std::size_t until, std::vector<Connection>* open) {
  for (uint64_t c = first_client;
       server.counters().dense_held_writes < until && c < first_client + until; ++c) {
    open->push_back(connect_as(server, token, c, source));
    for (uint64_t w = 1; w <= per_client; ++w) {
      const Status st = write_half(open->back(), c, w, 0, kFour, 10 + w);
      ASSERT_TRUE(st.ok()) << source << " client " << c << ": " << st.to_string();
    }
  }
}

// True when `fd` has bytes to read (or was closed) within `seconds`.
inline bool readable_within(int fd, double seconds) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(seconds * 1000)) == 1;
}

// Waits until `done()` holds, up to `seconds`; returns whether it did.
inline bool eventually(const std::function<bool()>& done, double seconds = 5.0) {
  const auto deadline = seconds_from_now(seconds);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Sends raw bytes on a fresh connection; true when the server then closes it.
inline bool server_closes_after(uint16_t port, const std::vector<uint8_t>& bytes) {
  auto conn = Connection::open(Endpoint{"127.0.0.1", port}, seconds_from_now(2));
  if (!conn.ok()) return false;
  if (!conn->send_all(bytes.data(), bytes.size(), seconds_from_now(2)).ok()) return true;
  ::shutdown(conn->fd(), SHUT_WR);  // a truncated frame ends here
  // A frame that happened to be valid is answered first; read until the server closes.
  return closed_by_peer(conn->fd(), 2.0);
}

}  // namespace gpubox::table::server::testing
