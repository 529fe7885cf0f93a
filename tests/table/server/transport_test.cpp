// The client transport against a scripted peer on loopback: replies that ask for a retry, and
// request ids that stay the same across retries.
#include "table/server/transport.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace gpubox::table::server {
namespace {

// A listening socket on 127.0.0.1 with an ephemeral port.
int listen_loopback(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST(Transport, RetryLaterRepliesAreResentWithTheSameRequestId) {
  uint16_t port = 0;
  const int listener = listen_loopback(&port);
  ASSERT_GE(listener, 0);
  std::vector<uint64_t> seen_ids;
  std::thread peer([&] {
    Connection conn(::accept(listener, nullptr, nullptr));
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (int i = 0; i < 3; ++i) {
      Frame frame;
      if (!conn.recv_frame(&frame, kDefaultMaxPayloadBytes, deadline).ok()) return;
      seen_ids.push_back(frame.header.request_id);
      FrameHeader h = frame.header;
      h.response = true;
      std::vector<uint8_t> payload;
      // The first copy of request A is "still being applied": the client must try again later.
      if (i == 0) {
        h.status = Status::Code::kAborted;
        encode_error_reply("still being applied; retry", &payload);
      }
      auto reply = encode_frame(h, payload);
      if (!conn.send_all(reply.data(), reply.size(), deadline).ok()) return;
    }
  });
  TransportOptions options;
  options.deadline_s = 3;
  options.initial_backoff_s = 0.01;
  Transport transport({Endpoint{"127.0.0.1", port}}, options);
  std::vector<OutgoingRequest> requests{transport.make_request(Op::kPush, 0, {}),
                                        transport.make_request(Op::kPush, 0, {})};
  std::vector<int> replies(2, 0);
  Status st = transport.run(Op::kPush, requests, [&](std::size_t i, const uint8_t*, std::size_t) {
    ++replies[i];
    return Status::OK();
  });
  peer.join();
  ::close(listener);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(replies, (std::vector<int>{1, 1}));
  // A, B (pipelined), then A again with its original id.
  ASSERT_EQ(seen_ids.size(), 3u);
  EXPECT_EQ(seen_ids[0], requests[0].request_id);
  EXPECT_EQ(seen_ids[1], requests[1].request_id);
  EXPECT_EQ(seen_ids[2], requests[0].request_id);
}

TEST(Transport, ServerErrorReplyEndsTheCallWithItsMessage) {
  uint16_t port = 0;
  const int listener = listen_loopback(&port);
  ASSERT_GE(listener, 0);
  std::thread peer([&] {
    Connection conn(::accept(listener, nullptr, nullptr));
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    Frame frame;
    if (!conn.recv_frame(&frame, kDefaultMaxPayloadBytes, deadline).ok()) return;
    FrameHeader h = frame.header;
    h.response = true;
    h.status = Status::Code::kIOError;
    std::vector<uint8_t> payload;
    encode_error_reply("disk full writing part-3", &payload);
    auto reply = encode_frame(h, payload);
    (void)conn.send_all(reply.data(), reply.size(), deadline);
  });
  Transport transport({Endpoint{"127.0.0.1", port}}, TransportOptions{});
  std::vector<OutgoingRequest> requests{transport.make_request(Op::kSave, 0, {})};
  Status st = transport.run(Op::kSave, requests,
                            [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); });
  peer.join();
  ::close(listener);
  EXPECT_EQ(st.code(), Status::Code::kIOError);
  EXPECT_NE(st.message().find("SAVE at 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("disk full writing part-3"), std::string::npos);
}

// A PROGRESS frame whose status is not OK is refused: it is no sign of progress (and the reply that
// follows it on that connection is not taken).
TEST(Transport, AProgressFrameWithAnErrorStatusIsRefused) {
  uint16_t port = 0;
  const int listener = listen_loopback(&port);
  ASSERT_GE(listener, 0);
  std::thread peer([&] {
    Connection conn(::accept(listener, nullptr, nullptr));
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    Frame frame;
    if (!conn.recv_frame(&frame, kDefaultMaxPayloadBytes, deadline).ok()) return;
    FrameHeader h = frame.header;
    h.response = true;
    h.op = Op::kProgress;
    h.status = Status::Code::kIOError;
    std::vector<uint8_t> payload;
    encode_progress(ProgressNote{1, 2}, &payload);
    auto progress = encode_frame(h, payload);
    if (!conn.send_all(progress.data(), progress.size(), deadline).ok()) return;
    h = frame.header;
    h.response = true;
    auto reply = encode_frame(h, {});
    (void)conn.send_all(reply.data(), reply.size(), deadline);
  });
  TransportOptions options;
  options.initial_backoff_s = 0.01;
  Transport transport({Endpoint{"127.0.0.1", port}}, options);
  std::vector<OutgoingRequest> requests{transport.make_request(Op::kSave, 0, {})};
  Status st = transport.run_with_progress(
      Op::kSave, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*silence_s=*/1.0);
  peer.join();
  ::close(listener);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a PROGRESS frame with status"), std::string::npos) << st.to_string();
}

// A call that retried until its deadline names why it retried (here "retry later" replies), not
// the attempt the deadline cut: before, a client refused at a server's connection cap until its
// deadline reported "no reply: timed out" whenever the deadline fell inside an attempt.
TEST(Transport, AnAttemptCutByTheDeadlineDoesNotHideWhyTheCallRetried) {
  uint16_t port = 0;
  const int listener = listen_loopback(&port);
  ASSERT_GE(listener, 0);
  std::atomic<bool> given_up{false};
  std::thread peer([&] {
    Connection conn(::accept(listener, nullptr, nullptr));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    Frame frame;
    for (int i = 0; i < 2; ++i) {  // the first copy: retry later; the second: never answered
      if (!conn.recv_frame(&frame, kDefaultMaxPayloadBytes, deadline).ok()) return;
      if (i == 1) break;
      FrameHeader h = frame.header;
      h.response = true;
      h.status = Status::Code::kAborted;
      std::vector<uint8_t> payload;
      encode_error_reply("server busy: in-flight budget; retry", &payload);
      auto reply = encode_frame(h, payload);
      if (!conn.send_all(reply.data(), reply.size(), deadline).ok()) return;
    }
    while (!given_up.load() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  TransportOptions options;
  options.deadline_s = 2.5;  // not less: a loaded machine must still answer the first copy
  options.initial_backoff_s = 0.01;
  Transport transport({Endpoint{"127.0.0.1", port}}, options);
  std::vector<OutgoingRequest> requests{transport.make_request(Op::kPush, 0, {})};
  Status st = transport.run(Op::kPush, requests,
                            [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); });
  given_up = true;
  peer.join();
  ::close(listener);
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("last error: Aborted: server busy: in-flight budget; retry"),
            std::string::npos)
      << st.to_string();
  EXPECT_NE(
      st.message().find("(then the deadline cut an attempt: DeadlineExceeded: no reply before "
                        "the deadline)"),
      std::string::npos)
      << st.to_string();
}

// Connects to `port` without completing until one stays pending: the listener's accept queue
// is then full, and a further connect waits in SYN_SENT. The sockets are returned to close.
std::vector<int> fill_accept_queue(uint16_t port) {
  std::vector<int> held;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  for (int i = 0; i < 16; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    held.push_back(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) continue;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 100) == 0) return held;  // this one is pending: the queue is full
  }
  return held;
}

void ignore_signal(int) {}

// A signal that lands while a connection is being made (a trainer's Ctrl-C handler, a child's
// exit) does not fail it: the wait goes on to its deadline. Before, poll's EINTR ended the
// connect as "poll: Interrupted system call", and a barrier's fresh connection gave up.
TEST(Transport, ASignalDuringConnectWaitsOnToTheDeadline) {
  uint16_t port = 0;
  const int listener = listen_loopback(&port);
  ASSERT_GE(listener, 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  const std::vector<int> held = fill_accept_queue(port);
  struct sigaction action {};
  struct sigaction previous {};
  action.sa_handler = ignore_signal;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &action, &previous), 0);
  std::atomic<bool> done{false};
  const pthread_t target = ::pthread_self();
  std::thread interrupter([&] {
    while (!done.load()) {
      ::pthread_kill(target, SIGUSR1);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const auto start = Clock::now();
  auto conn = Connection::open(Endpoint{"127.0.0.1", port}, start + std::chrono::milliseconds(400));
  const auto waited = Clock::now() - start;
  done = true;
  interrupter.join();
  ::sigaction(SIGUSR1, &previous, nullptr);
  for (int fd : held) ::close(fd);
  ::close(listener);
  ASSERT_FALSE(conn.ok()) << "the accept queue was not full: the test proves nothing";
  EXPECT_EQ(conn.status().message(), "connect: timed out");
  EXPECT_TRUE(Connection::timed_out(conn.status()));
  EXPECT_GE(waited, std::chrono::milliseconds(350));
}

// Only Connection's own deadline timeouts count as timed out: a socket error that reads alike
// (ETIMEDOUT from keepalive probes or a lost SYN) is the connection's failure, not the deadline's.
TEST(Transport, OnlyAConnectionsOwnDeadlineIsATimeout) {
  EXPECT_TRUE(Connection::timed_out(Status::Unavailable(kReplyTimedOut)));
  EXPECT_TRUE(Connection::timed_out(Status::Unavailable(kSendTimedOut)));
  EXPECT_FALSE(Connection::timed_out(Status::Unavailable("recv: Connection timed out")));
  EXPECT_FALSE(Connection::timed_out(Status::Unavailable("connect: Connection timed out")));
  EXPECT_FALSE(Connection::timed_out(Status::DeadlineExceeded(kReplyTimedOut)));
  EXPECT_FALSE(Connection::timed_out(Status::OK()));
}

// A port on 127.0.0.1 that nothing listens on (it was bound, then closed): connects are refused.
uint16_t refused_port() {
  uint16_t port = 0;
  const int fd = listen_loopback(&port);
  if (fd >= 0) ::close(fd);
  return fd >= 0 ? port : 0;
}

// A call with one request to `endpoint` under `options`.
Status call_once(const Endpoint& endpoint, const TransportOptions& options) {
  Transport transport({endpoint}, options);
  std::vector<OutgoingRequest> requests{transport.make_request(Op::kPush, 0, {})};
  return transport.run(Op::kPush, requests,
                       [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); });
}

// A peer that accepts connections until one sends a request, answers it OK and stops (or until
// told to stop). Connections closed before sending a request (a failed handshake) are dropped.
class AnsweringPeer {
 public:
  AnsweringPeer() : listener_(listen_loopback(&port_)) {
    if (listener_ >= 0) thread_ = std::thread([this] { serve(); });
  }
  ~AnsweringPeer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listener_ >= 0) ::close(listener_);
  }
  bool ok() const { return listener_ >= 0; }
  Endpoint endpoint() const { return Endpoint{"127.0.0.1", port_}; }
  int connections() const { return connections_.load(); }

 private:
  void serve() {
    while (!stop_.load()) {
      pollfd pfd{listener_, POLLIN, 0};
      if (::poll(&pfd, 1, 50) <= 0) continue;
      Connection conn(::accept(listener_, nullptr, nullptr));
      ++connections_;
      Frame frame;
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      if (!conn.recv_frame(&frame, kDefaultMaxPayloadBytes, deadline).ok()) continue;
      FrameHeader h = frame.header;
      h.response = true;
      const auto reply = encode_frame(h, {});
      (void)conn.send_all(reply.data(), reply.size(), deadline);
      return;
    }
  }

  uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// An on_connect whose first run on a connection waits out the handshake's deadline (a slow
// identity check) and fails; later ones pass.
ConnectHook first_handshake_times_out(std::atomic<int>* runs) {
  return [runs](uint32_t, Connection&, Clock::time_point deadline) {
    if (runs->fetch_add(1) > 0) return Status::OK();
    std::this_thread::sleep_until(deadline);
    return Status::Unavailable("identity check: timed out");
  };
}

// unreachable_s: a call on an endpoint that refuses every connect gives up at that bound
// (Unavailable, naming it) rather than at its deadline.
TEST(TransportUnreachable, ADeadEndpointGivesUpEarly) {
  const uint16_t port = refused_port();
  ASSERT_NE(port, 0);
  TransportOptions options;
  options.deadline_s = 10;
  options.unreachable_s = 0.2;
  const Status st = call_once(Endpoint{"127.0.0.1", port}, options);
  EXPECT_EQ(st.code(), Status::Code::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("no attempt reached it for 0.2 s"), std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("Connection refused"), std::string::npos) << st.to_string();
}

// Without unreachable_s the same call retries to its deadline, and says so.
TEST(TransportUnreachable, OffADeadEndpointIsRetriedToTheDeadline) {
  const uint16_t port = refused_port();
  ASSERT_NE(port, 0);
  TransportOptions options;
  options.deadline_s = 0.5;
  const Status st = call_once(Endpoint{"127.0.0.1", port}, options);
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_EQ(st.message().find("no attempt reached"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("Connection refused"), std::string::npos) << st.to_string();
}

// An attempt whose TCP connection opened reached the server even if its handshake then timed
// out: a live server slow in its first handshake takes the call on a retry, though that attempt
// took longer than unreachable_s (before, it counted as "not reached" and the call gave up).
TEST(TransportUnreachable, ALiveServerWhoseFirstHandshakeIsSlowTakesTheCall) {
  for (const double unreachable_s : {0.05, -1.0}) {
    SCOPED_TRACE("unreachable_s=" + std::to_string(unreachable_s));
    AnsweringPeer peer;
    ASSERT_TRUE(peer.ok());
    std::atomic<int> runs{0};
    TransportOptions options;
    options.deadline_s = 30;
    options.connect_timeout_s = 0.2;  // the first handshake waits this out: > unreachable_s
    options.unreachable_s = unreachable_s;
    options.on_connect = first_handshake_times_out(&runs);
    const Status st = call_once(peer.endpoint(), options);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(runs.load(), 2);
    EXPECT_EQ(peer.connections(), 2);
  }
}

}  // namespace
}  // namespace gpubox::table::server
