#include "table/server/session.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.hpp"

namespace gpubox::table::server {
namespace {

// A typical PUSH chunk (a few thousand rows) fits the first step, taken once payload bytes are
// readable; a slow sender holds at most this much more than it sent.
constexpr std::size_t kFirstChunkBytes = 256 * 1024;
constexpr std::size_t kScratchBytes = 16 * 1024;

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

Session::Session(Server::Impl* server, tcp::socket socket, uint64_t serial, bool over_cap)
    : server_(server),
      socket_(std::move(socket)),
      fd_(socket_.native_handle()),
      serial_(serial),
      over_cap_(over_cap) {
  boost::system::error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  peer_address_ = ec ? std::string("?") : remote.address().to_string();
  peer_ = ec ? peer_address_ : peer_address_ + ":" + std::to_string(remote.port());
  authenticated_ = server_->options().auth_token.empty();
  slotted_ = !over_cap_;  // the accept reserved it
  in_share_.store(!over_cap_);
  waiting_.store(over_cap_);
  if (over_cap_) server_->over_cap.fetch_add(1, std::memory_order_relaxed);
  if (!authenticated_ && !over_cap_) {
    counted_unauthenticated_ = true;
    server_->unauthenticated.fetch_add(1, std::memory_order_relaxed);
    evictable_.store(true);
  }
  if (!authenticated_ || over_cap_) {  // waiting beyond the cap: bound as soon (--auth_timeout_s)
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                           std::min(server_->options().auth_timeout_s, 8.64e6)));
    auth_deadline_ns_.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count(),
        std::memory_order_relaxed);
  }
}

Session::~Session() {
  // Destroyed without close() (the server stopped with this session pending): the counters must
  // still balance.
  if (!closed_) {
    server_->budget().give_back(request_held_ + reply_held_);
    leave_unauthenticated();
    leave_cap();
    if (sent_dense_) server_->connection_closed(serial_);
    server_->unregister_session(serial_);
    server_->session_closed();
  }
}

void Session::start() {
  server_->register_session(shared_from_this());
  watch_idle();
  read_header();
}

// ---- reading a frame --------------------------------------------------------------------------

void Session::read_header() {
  state_ = State::kHeader;
  auto self = shared_from_this();
  socket_.async_read_some(
      asio::buffer(header_bytes_ + header_got_, kHeaderBytes - header_got_),
      [self](const boost::system::error_code& ec, std::size_t n) { self->on_header_bytes(ec, n); });
}

void Session::on_header_bytes(const boost::system::error_code& ec, std::size_t n) {
  if (closed_) return;
  if (ec) {
    if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
      Server::Impl::warn(server_->connection_log,
                         "gpubox_server: connection from " + peer_ + " ended: " + ec.message());
    }
    return close();
  }
  if (header_got_ == 0) {
    if (!leave_idle()) return;  // claimed to give its slot at the cap: the eviction closes it
    frame_started();            // a frame's deadline runs from its first byte
  }
  header_got_ += n;
  frame_progress(header_got_);
  if (header_got_ < kHeaderBytes) return read_header();
  header_got_ = 0;
  on_header();
}

void Session::on_header() {
  const uint16_t version = header_version(header_bytes_, kHeaderBytes);
  if (version != 0 && version != kProtocolVersion) return refuse_version(version);
  auto header = decode_header(header_bytes_, kHeaderBytes, server_->options().max_payload_bytes);
  if (!header.ok()) return protocol_error(header.status().to_string());
  if (header->response) return protocol_error("a response frame sent to the server");
  if (header->op == Op::kProgress) return protocol_error("a PROGRESS frame sent to the server");
  header_ = *header;
  if (client_bound_ && header_.client_id != bound_client_id_) return refuse_foreign_client();
  if (!client_bound_ && authenticated_) {  // no token: the first frame names the client
    if (over_cap_ && !take_slot(header_.client_id)) return;
    bound_client_id_ = header_.client_id;
    client_bound_ = true;
  }
  if (!authenticated_) {
    // Refused from the header alone: nothing of an unauthenticated frame is buffered but AUTH.
    if (header_.op != Op::kAuth && header_.op != Op::kAuthProof) {
      return refuse(Status::PermissionDenied(std::string("this server requires AUTH before ") +
                                             op_name(header_.op)));
    }
    if (header_.payload_bytes > kMaxAuthPayloadBytes) {
      return refuse(Status::PermissionDenied(
          std::string(op_name(header_.op)) + " frame of " + std::to_string(header_.payload_bytes) +
          " bytes is over the limit of " + std::to_string(kMaxAuthPayloadBytes)));
    }
  }
  if (header_.payload_bytes > server_->connection_buffer_limit(authenticated_)) {
    return protocol_error(std::string(op_name(header_.op)) + " frame of " +
                          std::to_string(header_.payload_bytes) +
                          " payload bytes is over the connection's buffer limit of " +
                          std::to_string(server_->connection_buffer_limit(authenticated_)));
  }
  if (runs_on_bulk_worker(header_.op) && header_.payload_bytes > kMaxBulkPayloadBytes) {
    return reject_and_close(Status::InvalidArgument(
        std::string(op_name(header_.op)) + " frame of " + std::to_string(header_.payload_bytes) +
        " payload bytes is over the limit of " + std::to_string(kMaxBulkPayloadBytes) +
        " for a SAVE, LOAD or SHRINK request"));
  }
  payload_got_ = 0;
  payload_ready_ = false;
  read_payload();
}

void Session::refuse_version(uint16_t version) {
  // The header layout is the same in every version: read this one's op and request id as ours,
  // so the reply answers the client's request in words its own version decodes.
  uint8_t as_ours[kHeaderBytes];
  std::memcpy(as_ours, header_bytes_, kHeaderBytes);
  std::memcpy(as_ours + 4, &kProtocolVersion, sizeof(kProtocolVersion));
  const std::string why = "unsupported protocol version " + std::to_string(version) +
                          ": this gpubox_server speaks protocol version " +
                          std::to_string(kProtocolVersion) +
                          "; client and server must be of the same GPUBox release";
  auto header = decode_header(as_ours, kHeaderBytes, UINT32_MAX);
  if (!header.ok()) return protocol_error(why);
  server_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
  Server::Impl::warn(server_->connection_log,
                     "gpubox_server: refusing connection from " + peer_ + ": " + why);
  header_ = *header;
  std::vector<uint8_t> frame = notice_frame(Status::InvalidArgument(why), version);
  FrameHeader reply = header_;
  reply.response = true;
  reply.status = Status::Code::kInvalidArgument;
  reply.payload_bytes = static_cast<uint32_t>(frame.size() - kHeaderBytes);
  encode_header(reply, frame.data(), version);
  Reply out;
  out.frame = std::move(frame);
  out.status = reply.status;
  out.close_after = true;
  send(std::move(out));
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
    if (!take_budget(target - payload_.size())) return drain();
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
  payload_got_ += n;
  frame_progress(kHeaderBytes + payload_got_);
  read_payload();
}

bool Session::take_budget(std::size_t growth) {
  if (server_->budget().try_take(growth, request_held_ + reply_held_)) {
    request_held_ += growth;
    return true;
  }
  server_->budget_refusals.fetch_add(1, std::memory_order_relaxed);
  return false;
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
  drain_left_ -= n;
  frame_progress(kHeaderBytes + header_.payload_bytes - drain_left_);
  if (drain_left_ == 0) {
    frame_ended();
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    const ByteBudget& budget = server_->budget();
    const std::string why =
        "server busy: in-flight budget: the server holds " + std::to_string(budget.used()) +
        " bytes of requests and replies, " + "its limit (--max_inflight_mb) is " +
        std::to_string(budget.limit()) + "; this " + op_name(header_.op) + " of " +
        std::to_string(header_.payload_bytes) + " bytes was read and dropped; retry";
    Server::Impl::warn(server_->busy_log, "gpubox_server: request " +
                                              std::to_string(header_.request_id) + " of client " +
                                              std::to_string(header_.client_id) + " from " + peer_ +
                                              ": " + why);
    return send(error_reply(header_, Status::Aborted(why)));
  }
  auto self = shared_from_this();
  socket_.async_read_some(
      asio::buffer(scratch_.get(), std::min(drain_left_, kScratchBytes)),
      [self](const boost::system::error_code& ec2, std::size_t k) { self->on_drained(ec2, k); });
}

// ---- answering it -----------------------------------------------------------------------------

void Session::on_frame() {
  frame_ended();
  server_->requests.fetch_add(1, std::memory_order_relaxed);
  if (header_.op == Op::kAuth) {
    free_request();
    nonce_ = random_nonce();
    have_nonce_ = true;
    std::vector<uint8_t> challenge;
    encode_auth_challenge(nonce_, &challenge);
    return send(make_reply(header_, Status::Code::kOk, std::move(challenge)));
  }
  if (header_.op == Op::kAuthProof) {
    if (!authenticated_) return check_proof();
    free_request();  // a server without a token, or a connection that proved it already
    return send(make_reply(header_, Status::Code::kOk, {}));
  }
  if (header_.op == Op::kBarrier) {
    auto reply = server_->barrier_arrive(shared_from_this(), header_, payload_, &barrier_name_);
    free_request();
    if (reply) return answer(std::move(*reply));
    return watch_barrier_wait();
  }
  if (runs_on_bulk_worker(header_.op)) return start_bulk();
  if (server_->options().before_apply && server_->options().before_apply(header_)) {
    GPUBOX_LOG(INFO) << "gpubox_server: fault injection drops " << op_name(header_.op)
                     << " request " << header_.request_id << " unapplied";
    free_request();
    return close();
  }
  sent_dense_ = sent_dense_ || header_.op == Op::kDense;
  finish_request(server_->handle(
      header_, payload_, [this](std::size_t bytes) { return reserve_reply(bytes); },
      RequestOrigin{serial_, peer_address_, nullptr}));
}

void Session::finish_request(Reply reply) {
  free_request();
  if (server_->options().drop_reply && server_->options().drop_reply(header_)) {
    GPUBOX_LOG(INFO) << "gpubox_server: fault injection drops the reply to " << op_name(header_.op)
                     << " request " << header_.request_id;
    return close();
  }
  answer(std::move(reply));
}

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
    return Status::ResourceExhausted(
        "a reply of " + std::to_string(bytes) + " bytes with the request's " +
        std::to_string(request_held_ + reply_held_) + " bytes still held (" +
        std::to_string(request_held_ + reply_held_ + bytes) +
        " in all) is over the connection's buffer limit of " + std::to_string(limit) +
        " bytes (--max_connection_buffer_mb): ask for fewer rows per request");
  }
  if (!server_->budget().try_take(bytes, request_held_ + reply_held_)) {
    server_->budget_refusals.fetch_add(1, std::memory_order_relaxed);
    const ByteBudget& budget = server_->budget();
    const std::string why = "server busy: in-flight budget: no room for a reply of " +
                            std::to_string(bytes) + " bytes now (" + std::to_string(budget.used()) +
                            " of " + std::to_string(budget.limit()) +
                            " bytes held, --max_inflight_mb); retry";
    Server::Impl::warn(server_->busy_log, "gpubox_server: " + std::string(op_name(header_.op)) +
                                              " request " + std::to_string(header_.request_id) +
                                              " from " + peer_ + ": " + why);
    return Status::Aborted(why);
  }
  reply_held_ += bytes;
  return Status::OK();
}

void Session::free_request() {
  std::vector<uint8_t>().swap(payload_);
  server_->budget().give_back(request_held_);
  request_held_ = 0;
}

void Session::refuse(const Status& status) {
  server_->auth_refusals.fetch_add(1, std::memory_order_relaxed);
  reject_and_close(status);
}

void Session::refuse_foreign_client() {
  server_->foreign_client_refusals.fetch_add(1, std::memory_order_relaxed);
  const bool token = !server_->options().auth_token.empty();
  reject_and_close(Status::PermissionDenied(
      std::string(op_name(header_.op)) + " request " + std::to_string(header_.request_id) +
      " from " + peer_ + " carries client id " + std::to_string(header_.client_id) +
      ", but this connection is bound to client id " + std::to_string(bound_client_id_.load()) +
      (token ? " (proved by its AUTH)" : " (its first frame's)") +
      ": a connection speaks for one client; refused, and the connection closed"));
}

void Session::reject_and_close(const Status& status) {
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

// ---- writing ----------------------------------------------------------------------------------

void Session::send(Reply reply) {
  state_ = State::kWriting;
  frame_ended();  // the request is done with, or abandoned (a refusal from its header)
  reply_ = std::move(reply);
  // A reply must be read as fast as a request must arrive.
  const double seconds =
      static_cast<double>(reply_.frame.size()) / server_->min_transfer_bytes_per_s();
  watch(Watch::kWriting, Clock::now() + server_->frame_grace() +
                             std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(std::min(seconds, 8.64e6))));
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
  if (reply_.stop_server_after) {
    close();
    return server_->stop();
  }
  if (reply_.close_after) return linger_then_close(0);
  reply_ = Reply{};
  watch_idle();
  read_header();
}

}  // namespace gpubox::table::server
