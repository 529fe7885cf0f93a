// The client transport against a scripted peer on loopback: replies that ask for a retry, and
// request ids that stay the same across retries.
#include "table/server/transport.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

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

}  // namespace
}  // namespace gpubox::table::server
