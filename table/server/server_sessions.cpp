// Server::Impl's view of its sessions: the registry, the deadline sweep, evictions of
// unauthenticated connections, and the refusal of connections over the cap.
#include <sys/socket.h>

#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/server_impl.hpp"
#include "table/server/session.hpp"

namespace gpubox::table::server {

std::vector<uint8_t> notice_frame(const Status& why, uint16_t version) {
  FrameHeader h;
  h.op = Op::kInfo;  // a notice answers no request: its op means nothing
  h.response = true;
  h.status = why.code();
  h.request_id = kNoticeRequestId;
  std::vector<uint8_t> payload;
  encode_error_reply(why.message(), &payload);
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> frame(kHeaderBytes);
  encode_header(h, frame.data(), version);
  frame.insert(frame.end(), payload.begin(), payload.end());
  return frame;
}

void send_notice_now(int fd, const std::vector<uint8_t>& frame) {
  // A fresh or idle socket's send buffer takes a notice whole; one that does not is not waited
  // for (the connection is being closed because its peer misbehaves or there is no room).
  (void)::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void Server::Impl::register_session(const std::shared_ptr<Session>& session) {
  MutexLock lock(sessions_mu_);
  sessions_.emplace(session->serial(), session);
}

void Server::Impl::unregister_session(uint64_t serial) {
  MutexLock lock(sessions_mu_);
  sessions_.erase(serial);
}

std::vector<std::shared_ptr<Session>> Server::Impl::live_sessions() {
  // Locked outside the registry's lock and released after it: the last reference to a session
  // may be one of these, and its destructor unregisters it.
  std::vector<std::shared_ptr<Session>> live;
  MutexLock lock(sessions_mu_);
  live.reserve(sessions_.size());
  for (const auto& entry : sessions_) {
    if (auto session = entry.second.lock()) live.push_back(std::move(session));
  }
  return live;
}

void Server::Impl::sweep() {
  if (!acceptor_.is_open()) return;
  const auto now = Clock::now();
  if (const Clock::rep ended = job_ended_at_.load(); ended != 0) {
    if (open_connections.load() == 0 ||
        now - Clock::time_point(Clock::duration(ended)) >= kJobEndGrace) {
      stop();
      return;
    }
  }
  for (const auto& session : live_sessions()) {
    if (session->overdue(now)) session->on_overdue();  // rechecked on the session's strand
  }
  if (const std::size_t expired = ps_store_.expire_held_writes(now); expired > 0) {
    warn(request_log, "gpubox_server: dropped " + std::to_string(expired) +
                          " ranged DENSE write(s) that received no range for " +
                          std::to_string(options_.dense_write_max_idle_s) + " s");
  }
  sweep_timer_.expires_after(sweep_interval_);
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) sweep();
  });
}

bool Server::Impl::evict_oldest_unauthenticated() {
  std::shared_ptr<Session> victim;
  for (auto& session : live_sessions()) {  // oldest first
    if (session->claim_for_eviction()) {
      victim = std::move(session);
      break;
    }
  }
  if (!victim) return false;
  evicted.fetch_add(1, std::memory_order_relaxed);
  victim->evict();
  return true;
}

void Server::Impl::refuse_connection(tcp::socket& socket) {
  refused_connections.fetch_add(1, std::memory_order_relaxed);
  boost::system::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  const std::string peer =
      ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
  const std::string why =
      "server at its connection cap (" + std::to_string(max_connections_) + ", --max_connections)";
  warn(connection_log, "gpubox_server: refusing connection from " + peer + ": " + why);
  send_notice_now(socket.native_handle(), notice_frame(Status::ResourceExhausted(why)));
  socket.close(ec);
}

}  // namespace gpubox::table::server
