// The client side of one TCP connection to a gpubox_server: endpoints, a connection with
// blocking, deadline-bound helpers for handshakes and single calls, and what a server's notice
// (protocol.hpp: request id 0) says. Transport (transport.hpp) pools and pipelines them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/server/connection_limits.hpp"
#include "table/server/protocol.hpp"

namespace gpubox::table::server {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

// "ip:port,ip:port" (PADDLE_PSERVERS_IP_PORT_LIST). Spaces around entries are ignored; an empty
// list, a missing or out-of-range port is an error naming the entry.
StatusOr<std::vector<Endpoint>> parse_endpoints(const std::string& list);

// One TCP connection (non-blocking fd, TCP_NODELAY, TCP keepalive). Move-only; closes on
// destruction.
inline constexpr char kConnectTimedOut[] = "connect: timed out";
inline constexpr char kSendTimedOut[] = "send: timed out";
inline constexpr char kReplyTimedOut[] = "no reply: timed out";

class Connection {
 public:
  Connection() = default;
  explicit Connection(int fd) : fd_(fd) {}
  Connection(Connection&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Connection& operator=(Connection&& other) noexcept;
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects before `deadline`, with TCP keepalive on at `keepalive`'s times: a server whose
  // machine vanished without closing the connection (no RST: lost, cut off) fails a wait on it
  // once its probes go unanswered (2 minutes by default), whatever that wait's own deadline.
  static StatusOr<Connection> open(const Endpoint& endpoint, Clock::time_point deadline,
                                   const TcpKeepalive& keepalive = {});
  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  void close();

  // Whether `error` is one of these helpers' (or open()'s) own timeouts: its poll reached the
  // deadline (not an error of the socket's, say ETIMEDOUT "Connection timed out").
  static bool timed_out(const Status& error);
  // Blocking helpers (poll with the deadline) for handshakes: one whole frame each way.
  Status send_all(const uint8_t* data, std::size_t n, Clock::time_point deadline);
  Status recv_frame(Frame* frame, uint32_t max_payload_bytes, Clock::time_point deadline);
  // Sends one request and reads its reply: the reply's payload, or the error it carries (or a
  // Corruption when it does not answer this request). PROGRESS frames for it are skipped (the
  // deadline bounds the whole call). *heard (when given) is set once a frame came back, whatever
  // it says.
  StatusOr<std::vector<uint8_t>> call(const FrameHeader& request,
                                      const std::vector<uint8_t>& payload,
                                      uint32_t max_payload_bytes, Clock::time_point deadline,
                                      bool* heard = nullptr);

 private:
  Status recv_all(uint8_t* data, std::size_t n, Clock::time_point deadline);
  int fd_ = -1;
};

// Milliseconds left until `deadline` for poll() (0 once passed, at most an hour).
int ms_until(Clock::time_point deadline);
// A notice (protocol.hpp): a frame answering no request, sent before the server closes the
// connection.
bool is_notice(const FrameHeader& header);
// A PROGRESS frame (protocol.hpp): a SAVE, LOAD or SHRINK in flight still moves; its reply follows.
inline bool is_progress(const FrameHeader& header) {
  return header.response && header.op == Op::kProgress && header.request_id != kNoticeRequestId;
}
// What a notice says: the server closes the connection, and why.
Status notice_status(const FrameHeader& header, const uint8_t* data, std::size_t n);

}  // namespace gpubox::table::server
