#include "table/server/connection.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>

namespace gpubox::table::server {
namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count() + 1, 60 * 60 * 1000));
}

bool is_notice(const FrameHeader& header) {
  return header.response && header.request_id == kNoticeRequestId;
}

Status notice_status(const FrameHeader& header, const uint8_t* data, std::size_t n) {
  const Status st = decode_error_reply(header, data, n);
  if (st.ok()) return Status::Corruption("the server sent a notice without a reason");
  return st.with_context("the server closed the connection");
}

StatusOr<std::vector<Endpoint>> parse_endpoints(const std::string& list) {
  std::vector<Endpoint> out;
  std::stringstream in(list);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    entry = trim(entry);
    if (entry.empty()) continue;
    const auto colon = entry.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == entry.size()) {
      return Status::InvalidArgument("endpoint '" + entry + "' is not host:port");
    }
    const std::string port_text = entry.substr(colon + 1);
    char* end = nullptr;
    const long port = std::strtol(port_text.c_str(), &end, 10);
    if (*end != '\0' || port <= 0 || port > 65535) {
      return Status::InvalidArgument("endpoint '" + entry + "' has a bad port '" + port_text + "'");
    }
    std::string host = entry.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);  // [::1]:29011
    }
    out.push_back(Endpoint{host, static_cast<uint16_t>(port)});
  }
  if (out.empty()) return Status::InvalidArgument("empty endpoint list '" + list + "'");
  return out;
}

// ---- Connection -------------------------------------------------------------------------------

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Connection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

StatusOr<Connection> Connection::open(const Endpoint& endpoint, Clock::time_point deadline,
                                      const TcpKeepalive& keepalive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  const int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::Unavailable("cannot resolve '" + endpoint.host + "': " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  Connection conn(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!conn.is_open()) return Status::Unavailable(errno_text("socket"));
  if (::connect(conn.fd(), found->ai_addr, found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return Status::Unavailable(errno_text("connect"));
    pollfd p{conn.fd(), POLLOUT, 0};
    // A signal (a trainer's Ctrl-C handler, a child's exit) ends poll early: that is no
    // failure of the connection, so the wait goes on to the same deadline.
    int ready = 0;
    do {
      ready = ::poll(&p, 1, ms_until(deadline));
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) return Status::Unavailable(kConnectTimedOut);
    if (ready < 0) return Status::Unavailable(errno_text("poll"));
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(conn.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::Unavailable(std::string("connect: ") + std::strerror(err));
  }
  int one = 1;
  ::setsockopt(conn.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (const Status probes = enable_client_keepalive(conn.fd(), keepalive, endpoint.to_string());
      !probes.ok()) {
    return Status::Unavailable("connection to " + endpoint.to_string() + ": " + probes.message());
  }
  return conn;
}

bool Connection::timed_out(const Status& error) {
  const std::string& m = error.message();
  return error.code() == Status::Code::kUnavailable &&
         (m == kConnectTimedOut || m == kSendTimedOut || m == kReplyTimedOut);
}

Status Connection::send_all(const uint8_t* data, std::size_t n, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < n) {
    const ssize_t k = ::send(fd_, data + sent, n - sent, MSG_NOSIGNAL);
    if (k > 0) {
      sent += static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return Status::Unavailable(errno_text("send"));
    }
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, ms_until(deadline)) == 0) return Status::Unavailable(kSendTimedOut);
  }
  return Status::OK();
}

Status Connection::recv_all(uint8_t* data, std::size_t n, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::recv(fd_, data + got, n - got, 0);
    if (k > 0) {
      got += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return Status::Unavailable("connection closed by the server");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return Status::Unavailable(errno_text("recv"));
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, ms_until(deadline)) == 0) return Status::Unavailable(kReplyTimedOut);
  }
  return Status::OK();
}

Status Connection::recv_frame(Frame* frame, uint32_t max_payload_bytes,
                              Clock::time_point deadline) {
  uint8_t head[kHeaderBytes];
  GPUBOX_RETURN_IF_ERROR(recv_all(head, kHeaderBytes, deadline));
  auto header = decode_header(head, kHeaderBytes, max_payload_bytes);
  if (!header.ok()) return header.status();
  frame->header = *header;
  frame->payload.resize(header->payload_bytes);
  return recv_all(frame->payload.data(), frame->payload.size(), deadline);
}

StatusOr<std::vector<uint8_t>> Connection::call(const FrameHeader& request,
                                                const std::vector<uint8_t>& payload,
                                                uint32_t max_payload_bytes,
                                                Clock::time_point deadline, bool* heard) {
  const std::vector<uint8_t> frame = encode_frame(request, payload);
  GPUBOX_RETURN_IF_ERROR(send_all(frame.data(), frame.size(), deadline));
  Frame reply;
  do {
    GPUBOX_RETURN_IF_ERROR(recv_frame(&reply, max_payload_bytes, deadline));
    if (heard != nullptr) *heard = true;
  } while (is_progress(reply.header) && reply.header.request_id == request.request_id);
  if (is_notice(reply.header)) {
    return notice_status(reply.header, reply.payload.data(), reply.payload.size());
  }
  if (!reply.header.response || reply.header.op != request.op ||
      reply.header.request_id != request.request_id) {
    return Status::Corruption(std::string("reply does not match the ") + op_name(request.op) +
                              " request");
  }
  GPUBOX_RETURN_IF_ERROR(
      decode_error_reply(reply.header, reply.payload.data(), reply.payload.size()));
  return std::move(reply.payload);
}

}  // namespace gpubox::table::server
