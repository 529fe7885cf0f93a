// Server::Impl's view of its sessions: the registry, the deadline sweep, evictions of
// unauthenticated connections, the connection cap's fair share (connection_share.hpp) and the
// refusal of connections over the cap.
#include <sys/socket.h>

#include <algorithm>
#include <map>

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
  expire_step_sums(now);
  // Release: a reader that sees this sweep (counters(), acquire) sees what it did.
  sweeps.fetch_add(1, std::memory_order_release);
  sweep_timer_.expires_after(sweep_interval_);
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) sweep();
  });
}

bool Server::Impl::evict_oldest_unauthenticated() {
  std::shared_ptr<Session> victim;
  auto sessions = live_sessions();  // oldest first
  // A proof waiting for its host's slot goes last: plain connects would otherwise evict the
  // trainers' right proofs slowed by a neighbour's wrong ones, again and again.
  for (const bool take_waiting : {false, true}) {
    for (auto& session : sessions) {
      if (session->proof_waiting() && !take_waiting) continue;
      if (session->claim_for_eviction()) {
        victim = std::move(session);
        break;
      }
    }
    if (victim) break;
  }
  if (!victim) return false;
  evicted.fetch_add(1, std::memory_order_relaxed);
  const std::string slots = std::to_string(max_unauthenticated_);
  victim->evict(Status::ResourceExhausted(
                    "evicted: the server's " + slots +
                    " slots for connections that have not authenticated are full "
                    "(--max_unauthenticated); a client authenticates right after connecting"),
                "unauthenticated connection: " + slots +
                    " such connections open (--max_unauthenticated), a new one came");
  return true;
}

Server::Impl::Clock::duration Server::Impl::long_idle() const {
  const double idle = options_.idle_timeout_s > 0 ? options_.idle_timeout_s / 4 : 75.0;
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(idle, 8.64e6)));
}

std::string Server::Impl::cap_reason() const {
  return "server at its connection cap (" + std::to_string(max_connections_) +
         ", --max_connections): every connection is in a call or was used within "
         "--frame_deadline_s, or is held by a client holding no more than its share (a client's "
         "last connection is never taken)";
}

std::vector<HeldConnection> Server::Impl::share_snapshot(
    const Session* except, std::vector<std::shared_ptr<Session>>* sessions) {
  std::vector<HeldConnection> held;
  for (auto& session : live_sessions()) {
    HeldConnection h;
    if (session.get() == except || !session->holding(&h)) continue;
    held.push_back(h);
    sessions->push_back(std::move(session));
  }
  return held;
}

bool Server::Impl::reserve_slot() {
  uint64_t held = admitted_.load();
  while (held < max_connections_) {
    if (admitted_.compare_exchange_weak(held, held + 1)) return true;
  }
  return false;
}

bool Server::Impl::may_wait_over_cap(const std::string& address) {
  // A refusal flood stays cheap: a census that found no slot is trusted for kShareRecheck. (For
  // a connection not bound yet the answer does not depend on its address: some client holds two
  // connections, one of them idle.) A slot that comes free meanwhile is found by the next one.
  const auto now = Clock::now();
  if (now < no_share_until_) return false;
  std::vector<std::shared_ptr<Session>> sessions;
  const auto held = share_snapshot(nullptr, &sessions);
  if (!fair_share_victim(held, Newcomer{address, false, 0}, now, long_idle()).found()) {
    no_share_until_ = now + kShareRecheck;
    return false;
  }
  // The waiting room by share address, each oldest first: an address at its half gives its own
  // oldest; a full room, that of the address with the most waiting. So a flood from one address
  // churns its own, not another's trainer waiting to bind.
  std::map<std::string, std::vector<std::shared_ptr<Session>>> waiting;
  std::size_t total = 0;
  for (auto& session : live_sessions()) {
    if (!session->waiting()) continue;
    waiting[share_address(session->peer_address())].push_back(std::move(session));
    ++total;
  }
  const std::string own = share_address(address);
  auto from = waiting.find(own);
  if (from == waiting.end() || from->second.size() < kMaxWaitingPerAddress) {
    if (total < kMaxWaitingOverCap) return true;
    from = std::max_element(waiting.begin(), waiting.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size();
    });
  }
  for (auto& session : from->second) {
    if (!session->claim_waiting()) continue;
    evicted.fetch_add(1, std::memory_order_relaxed);
    session->evict(Status::ResourceExhausted(
                       "evicted: the waiting room beyond the server's connection cap (" +
                       std::to_string(max_connections_) + ", --max_connections) is full (" +
                       std::to_string(kMaxWaitingOverCap) + ", " +
                       std::to_string(kMaxWaitingPerAddress) + " an address) and " + from->first +
                       " waits with the most; a new connection came (reconnect)"),
                   "connection waiting beyond the connection cap: a new one came (" + from->first +
                       " waits with the most)");
    return true;
  }
  return false;
}

Status Server::Impl::admit_waiting(const Session& session, const Newcomer& newcomer) {
  if (reserve_slot()) return Status::OK();  // a slot came free meanwhile
  // One census and claim at a time: two binds that each counted the other's victim could take
  // both of a holder's last two connections.
  MutexLock lock(share_mu_);
  if (!options_.auth_token.empty() && evict_oldest_unauthenticated()) {
    take_over_slot();
    return Status::OK();
  }
  std::vector<std::shared_ptr<Session>> sessions;
  auto held = share_snapshot(&session, &sessions);
  const auto now = Clock::now();
  for (;;) {
    const ShareVictim victim = fair_share_victim(held, newcomer, now, long_idle());
    if (!victim.found()) return Status::ResourceExhausted(cap_reason());
    if (!sessions[victim.index]->claim_idle(held[victim.index].idle_since)) {
      held[victim.index].idle = false;  // a call began on it meanwhile: never taken then
      continue;
    }
    fair_share_evicted.fetch_add(1, std::memory_order_relaxed);
    take_over_slot();
    const std::string taker =
        "client " + std::to_string(newcomer.client_id) + " from " + std::string(newcomer.address);
    sessions[victim.index]->evict(
        Status::ResourceExhausted("evicted: the server is at its connection cap (" +
                                  std::to_string(max_connections_) + ", --max_connections) and " +
                                  victim.why + " to " + taker + "; reconnect"),
        "idle connection at the connection cap (" + std::to_string(max_connections_) +
            ", --max_connections) for " + taker + ": " + victim.why);
    return Status::OK();
  }
}

void Server::Impl::refuse_connection(tcp::socket& socket) {
  refused_connections.fetch_add(1, std::memory_order_relaxed);
  boost::system::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  const std::string peer =
      ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
  const std::string why = cap_reason();
  warn(connection_log, "gpubox_server: refusing connection from " + peer + ": " + why);
  send_notice_now(socket.native_handle(), notice_frame(Status::ResourceExhausted(why)));
  socket.close(ec);
}

}  // namespace gpubox::table::server
