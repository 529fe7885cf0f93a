#include "table/server/session.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/logging.hpp"

namespace gpubox::table::server {
namespace {

// A typical PUSH chunk (a few thousand rows) fits the first step, taken once payload bytes are
// readable; a slow sender holds at most this much more than it sent.
constexpr std::size_t kFirstChunkBytes = 256 * 1024;
constexpr std::size_t kScratchBytes = 16 * 1024;
constexpr std::size_t kLingerBytes = 64 * 1024;
constexpr auto kLingerTime = std::chrono::seconds(2);

bool tokens_equal(const std::string& a, const std::string& b) {
  // Length-independent comparison time would need padding; a constant-time loop over the
  // longer string is enough to not leak the matching prefix length.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

Session::Session(Server::Impl* server, tcp::socket socket)
    : server_(server),
      socket_(std::move(socket)),
      fd_(socket_.native_handle()),
      idle_timer_(socket_.get_executor()),
      last_activity_(Clock::now()) {
  boost::system::error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  peer_ =
      ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
  authenticated_ = server_->options().auth_token.empty();
}

Session::~Session() {
  // Destroyed without close() (the server stopped with this session pending): the descriptor
  // closes with socket_, the counters must still balance.
  if (!closed_) {
    server_->budget().give_back(request_held_ + reply_held_);
    server_->session_closed();
  }
}

void Session::start() {
  if (server_->options().idle_timeout_s > 0) arm_idle_timer(last_activity_);
  read_header();
}

// ---- reading a frame --------------------------------------------------------------------------

void Session::read_header() {
  state_ = State::kHeader;
  auto self = shared_from_this();
  asio::async_read(
      socket_, asio::buffer(header_bytes_),
      [self](const boost::system::error_code& ec, std::size_t) { self->on_header(ec); });
}

void Session::on_header(const boost::system::error_code& ec) {
  if (closed_) return;
  if (ec) {
    if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
      Server::Impl::warn(server_->connection_log,
                         "gpubox_server: connection from " + peer_ + " ended: " + ec.message());
    }
    return close();
  }
  last_activity_ = Clock::now();
  auto header = decode_header(header_bytes_, kHeaderBytes, server_->options().max_payload_bytes);
  if (!header.ok()) return protocol_error(header.status().to_string());
  if (header->response) return protocol_error("a response frame sent to the server");
  header_ = *header;
  if (!authenticated_) {
    // Refused from the header alone: nothing of an unauthenticated frame is buffered but AUTH.
    if (header_.op != Op::kAuth) {
      return refuse(Status::PermissionDenied(std::string("this server requires AUTH before ") +
                                             op_name(header_.op)));
    }
    if (header_.payload_bytes > kMaxAuthPayloadBytes) {
      return refuse(Status::PermissionDenied(
          "AUTH frame of " + std::to_string(header_.payload_bytes) +
          " bytes is over the limit of " + std::to_string(kMaxAuthPayloadBytes)));
    }
  }
  if (header_.payload_bytes > server_->connection_buffer_limit(authenticated_)) {
    return protocol_error(std::string(op_name(header_.op)) + " frame of " +
                          std::to_string(header_.payload_bytes) +
                          " payload bytes is over the connection's buffer limit of " +
                          std::to_string(server_->connection_buffer_limit(authenticated_)));
  }
  payload_got_ = 0;
  payload_ready_ = false;
  read_payload();
}

void Session::read_payload() {
  state_ = State::kPayload;
  const std::size_t want = header_.payload_bytes;
  if (payload_got_ == want) return on_frame();
  if (payload_.empty() && !payload_ready_) {
    // Nothing is allocated before payload bytes arrive: a forged length alone costs nothing.
    auto self = shared_from_this();
    return socket_.async_wait(tcp::socket::wait_read, [self](const boost::system::error_code& ec) {
      if (self->closed_) return;
      if (ec) return self->on_payload(ec, 0);
      // The reactor may report readiness that an earlier read already consumed (an edge seen
      // when the header arrived): allocate only once a payload byte, or the end, is there.
      uint8_t byte = 0;
      if (::recv(self->socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
          (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return self->read_payload();
      }
      self->payload_ready_ = true;
      self->read_payload();
    });
  }
  if (payload_got_ == payload_.size()) {
    // Grow by doubling, only as far as bytes have arrived.
    const std::size_t target = std::min(want, std::max(kFirstChunkBytes, 2 * payload_.size()));
    const std::size_t growth = target - payload_.size();
    if (!server_->budget().try_take(growth)) {
      server_->budget_refusals.fetch_add(1, std::memory_order_relaxed);
      return drain();
    }
    request_held_ += growth;
    payload_.reserve(target);
    payload_.resize(target);
  }
  auto self = shared_from_this();
  socket_.async_read_some(
      asio::buffer(payload_.data() + payload_got_, payload_.size() - payload_got_),
      [self](const boost::system::error_code& ec, std::size_t n) { self->on_payload(ec, n); });
}

void Session::on_payload(const boost::system::error_code& ec, std::size_t n) {
  if (closed_) return;
  if (ec) {
    return protocol_error(std::string("truncated ") + op_name(header_.op) + " frame (" +
                          ec.message() + ")");
  }
  last_activity_ = Clock::now();
  payload_got_ += n;
  read_payload();
}

void Session::drain() {
  state_ = State::kDraining;
  drain_left_ = header_.payload_bytes - payload_got_;
  free_request();
  if (!scratch_) scratch_.reset(new uint8_t[kScratchBytes]);
  on_drained({}, 0);
}

void Session::on_drained(const boost::system::error_code& ec, std::size_t n) {
  if (closed_) return;
  if (ec) return protocol_error(std::string("truncated ") + op_name(header_.op) + " frame");
  if (n > 0) last_activity_ = Clock::now();
  drain_left_ -= n;
  if (drain_left_ == 0) {
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    return send(error_reply(
        header_, Status::Aborted("the server holds " + std::to_string(server_->budget().used()) +
                                 " bytes of requests and replies, its in-flight limit is " +
                                 std::to_string(server_->budget().limit()) + "; retry")));
  }
  auto self = shared_from_this();
  socket_.async_read_some(
      asio::buffer(scratch_.get(), std::min(drain_left_, kScratchBytes)),
      [self](const boost::system::error_code& ec2, std::size_t k) { self->on_drained(ec2, k); });
}

// ---- answering it -----------------------------------------------------------------------------

void Session::on_frame() {
  server_->requests.fetch_add(1, std::memory_order_relaxed);
  if (!authenticated_) return authenticate();
  if (header_.op == Op::kAuth) {
    free_request();
    return send(make_reply(header_, Status::Code::kOk, {}));
  }
  if (header_.op == Op::kBarrier) {
    auto reply = server_->barrier_arrive(shared_from_this(), header_, payload_, &barrier_name_);
    free_request();
    if (reply) return answer(std::move(*reply));
    return watch_barrier_wait();
  }
  Reply reply = server_->handle(header_, payload_,
                                [this](std::size_t bytes) { return reserve_reply(bytes); });
  free_request();
  if (server_->options().drop_reply && server_->options().drop_reply(header_)) {
    GPUBOX_LOG(INFO) << "gpubox_server: fault injection drops the reply to " << op_name(header_.op)
                     << " request " << header_.request_id;
    return close();
  }
  answer(std::move(reply));
}

namespace {
// A refusal's reason can quote what the client sent (a SAVE path, say): one log line of at most
// kMaxLogged bytes, control characters and every byte past ASCII escaped (no UTF-8 line
// separators, no character cut in two), so a client cannot forge or flood lines.
std::string loggable(const std::string& text) {
  constexpr std::size_t kMaxLogged = 256;
  std::string out;
  for (const char c : text) {
    if (out.size() >= kMaxLogged) {
      out += "... (" + std::to_string(text.size()) + " bytes)";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

void Session::answer(Reply reply) {
  // Aborted means "retry later" (the in-flight budget, a request still being applied): load,
  // not a refusal.
  if (reply.status != Status::Code::kOk && reply.status != Status::Code::kAborted) {
    Server::Impl::warn(server_->request_log,
                       std::string("gpubox_server: refused ") + op_name(header_.op) + " request " +
                           std::to_string(header_.request_id) + " of client " +
                           std::to_string(header_.client_id) + " from " + peer_ + ": " +
                           Status::code_name(reply.status) + ": " + loggable(reply.error));
  }
  send(std::move(reply));
}

Status Session::reserve_reply(std::size_t bytes) {
  const std::size_t limit = server_->connection_buffer_limit(authenticated_);
  if (request_held_ + reply_held_ + bytes > limit) {
    return Status::ResourceExhausted("a reply of " + std::to_string(bytes) +
                                     " bytes is over the connection's buffer limit of " +
                                     std::to_string(limit) + " (ask for fewer rows per request)");
  }
  if (!server_->budget().try_take(bytes)) {
    server_->budget_refusals.fetch_add(1, std::memory_order_relaxed);
    return Status::Aborted(
        "the server's in-flight limit of " + std::to_string(server_->budget().limit()) +
        " bytes has no room for a reply of " + std::to_string(bytes) + " bytes now; retry");
  }
  reply_held_ += bytes;
  return Status::OK();
}

void Session::free_request() {
  std::vector<uint8_t>().swap(payload_);
  server_->budget().give_back(request_held_);
  request_held_ = 0;
}

void Session::authenticate() {
  auto token = decode_path_request(payload_.data(), payload_.size());
  free_request();
  if (token.ok() && tokens_equal(*token, server_->options().auth_token)) {
    authenticated_ = true;
    return send(make_reply(header_, Status::Code::kOk, {}));
  }
  refuse(Status::PermissionDenied("wrong auth token"));
}

void Session::refuse(const Status& status) {
  server_->auth_refusals.fetch_add(1, std::memory_order_relaxed);
  Server::Impl::warn(server_->connection_log,
                     "gpubox_server: refusing connection from " + peer_ + ": " + status.message());
  Reply reply = error_reply(header_, status);
  reply.close_after = true;
  send(std::move(reply));
}

void Session::protocol_error(const std::string& reason) {
  server_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
  Server::Impl::warn(server_->connection_log,
                     "gpubox_server: closing connection from " + peer_ + ": " + reason);
  close();
}

// ---- BARRIER ----------------------------------------------------------------------------------

void Session::watch_barrier_wait() {
  // The client sends nothing while it waits: a completed read means it left (or broke the
  // protocol), and either way it must not count toward the barrier any more.
  state_ = State::kBarrier;
  if (!scratch_) scratch_.reset(new uint8_t[kScratchBytes]);
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(scratch_.get(), 1),
                          [self](const boost::system::error_code& ec, std::size_t n) {
                            self->on_barrier_watch(ec, n);
                          });
}

void Session::on_barrier_watch(const boost::system::error_code& ec, std::size_t n) {
  if (closed_ || ec == asio::error::operation_aborted) return;
  if (state_ != State::kBarrier) {
    // Released meanwhile; a byte that was read belongs to a request sent too early.
    if (!ec && n > 0) protocol_error("bytes sent while a BARRIER was waiting");
    return;
  }
  if (ec) return close();  // the client left: close() drops the waiter
  protocol_error("bytes sent while a BARRIER was waiting");
}

void Session::release_barrier(Reply reply) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, reply = std::move(reply)]() mutable {
    if (self->closed_ || self->state_ != State::kBarrier) return;
    boost::system::error_code ignored;
    self->socket_.cancel(ignored);  // the watch read
    self->last_activity_ = Clock::now();
    self->send(std::move(reply));
  });
}

bool Session::peer_still_waiting() const {
  uint8_t byte = 0;
  const ssize_t k = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

// ---- writing ----------------------------------------------------------------------------------

void Session::send(Reply reply) {
  state_ = State::kWriting;
  reply_ = std::move(reply);
  last_activity_ = Clock::now();
  auto self = shared_from_this();
  asio::async_write(
      socket_, asio::buffer(reply_.frame),
      [self](const boost::system::error_code& ec, std::size_t) { self->on_written(ec); });
}

void Session::on_written(const boost::system::error_code& ec) {
  if (closed_) return;
  server_->budget().give_back(reply_held_);
  reply_held_ = 0;
  if (ec) {
    Server::Impl::warn(server_->connection_log,
                       "gpubox_server: reply to " + peer_ + " lost: " + ec.message());
    return close();
  }
  last_activity_ = Clock::now();
  if (reply_.stop_server_after) {
    close();
    return server_->stop();
  }
  if (reply_.close_after) return linger_then_close(0);
  reply_ = Reply{};
  read_header();
}

void Session::linger_then_close(std::size_t dropped) {
  if (state_ != State::kLingering) {
    state_ = State::kLingering;
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    if (!scratch_) scratch_.reset(new uint8_t[kScratchBytes]);
    // At most kLingerTime, whatever the idle timeout (on_idle_timer closes a lingering session).
    idle_timer_.expires_after(kLingerTime);
    auto self = shared_from_this();
    idle_timer_.async_wait(
        [self](const boost::system::error_code& ec) { self->on_idle_timer(ec); });
  }
  if (dropped >= kLingerBytes) return close();
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(scratch_.get(), kScratchBytes),
                          [self, dropped](const boost::system::error_code& ec, std::size_t n) {
                            if (self->closed_) return;
                            if (ec) return self->close();  // the client closed: done
                            self->linger_then_close(dropped + n);
                          });
}

// ---- idle timeout and close -------------------------------------------------------------------

void Session::arm_idle_timer(Clock::time_point from) {
  // Clamped to 100 days: a larger value would overflow the clock's nanoseconds.
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(server_->options().idle_timeout_s, 8.64e6)));
  idle_timer_.expires_at(from + timeout);
  auto self = shared_from_this();
  idle_timer_.async_wait([self](const boost::system::error_code& ec) { self->on_idle_timer(ec); });
}

void Session::on_idle_timer(const boost::system::error_code& ec) {
  if (closed_ || ec == asio::error::operation_aborted) return;
  if (state_ == State::kLingering) return close();
  const auto now = Clock::now();
  if (state_ == State::kBarrier) return arm_idle_timer(now);  // waiting on the server: not idle
  const auto timeout = std::chrono::duration<double>(server_->options().idle_timeout_s);
  if (now - last_activity_ < timeout) return arm_idle_timer(last_activity_);
  server_->idle_closed.fetch_add(1, std::memory_order_relaxed);
  Server::Impl::warn(server_->connection_log,
                     "gpubox_server: closing connection from " + peer_ + " idle for " +
                         std::to_string(server_->options().idle_timeout_s) + " s");
  close();
}

void Session::close() {
  if (closed_) return;
  // Leave the barrier before the descriptor closes: a barrier may peek at it until then.
  if (state_ == State::kBarrier) server_->barrier_leave(this, barrier_name_);
  closed_ = true;
  state_ = State::kClosed;
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  idle_timer_.cancel();
  server_->budget().give_back(request_held_ + reply_held_);
  request_held_ = reply_held_ = 0;
  std::vector<uint8_t>().swap(payload_);
  server_->session_closed();
}

}  // namespace gpubox::table::server
