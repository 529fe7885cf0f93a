// Session: authentication, BARRIER waits, deadlines, notices and closing (session.hpp).
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "common/logging.hpp"
#include "table/server/session.hpp"

namespace gpubox::table::server {
namespace {

constexpr std::size_t kScratchBytes = 16 * 1024;
constexpr std::size_t kLingerBytes = 64 * 1024;
constexpr auto kLingerTime = std::chrono::seconds(2);

int64_t ns_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", s);
  return text;
}

}  // namespace

// ---- authentication ---------------------------------------------------------------------------

void Session::check_proof() {
  auto proof = decode_auth_proof(payload_.data(), payload_.size());
  free_request();
  if (!proof.ok()) return refuse(proof.status());
  if (!have_nonce_) {
    return refuse(Status::PermissionDenied("AUTH_PROOF before AUTH: ask for the challenge first"));
  }
  proof_ = *proof;
  const auto now = Clock::now();
  const Clock::time_point latest{std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(auth_deadline_ns_.load(std::memory_order_relaxed)))};
  // Past the deadline (the sweep has not closed it yet): refused unchecked, so late proofs from
  // one host are not checked at once side by side.
  if (now > latest) {
    return refuse(Status::DeadlineExceeded(overdue_reason(Overdue::kAuth, now) +
                                           ": its AUTH_PROOF came too late and was not checked"));
  }
  proof_check_ = server_->auth_backoff().reserve_check(peer_address_, now, latest);
  const auto at = proof_check_.at;
  if (at <= now) return on_proof_checked();
  if (at > latest) {
    // Not a wrong proof: unchecked, and the client may try again (Unavailable is retried).
    server_->proofs_deferred.fetch_add(1, std::memory_order_relaxed);
    return refuse(Status::Unavailable(
        "too many wrong AUTH proofs from " + AuthBackoff::cause(peer_address_, proof_check_) +
        " (every process of one host, or of one IPv6 /64, shares its backoff): the next "
        "proof from " +
        peer_address_ + " is checked in " +
        seconds_text(std::chrono::duration<double>(at - now).count()) +
        " s, after this connection's --auth_timeout_s; this proof was not checked, retry later"));
  }
  if (!auth_timer_) auth_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  auth_timer_->expires_at(at);
  proof_waiting_.store(true, std::memory_order_relaxed);
  server_->proofs_waiting.fetch_add(1, std::memory_order_relaxed);
  auto self = shared_from_this();
  auth_timer_->async_wait([self](const boost::system::error_code& ec) {
    if (self->closed_ || ec) return;
    self->proof_waiting_.store(false, std::memory_order_relaxed);
    self->on_proof_checked();
    self->server_->proofs_waiting.fetch_sub(1, std::memory_order_relaxed);
  });
}

bool Session::proof_is_right() const {
  return proofs_equal(proof_, auth_proof(server_->options().auth_token, nonce_, header_.client_id));
}

void Session::on_proof_checked() {
  have_nonce_ = false;  // a nonce answers one proof
  if (proof_is_right()) {
    server_->auth_backoff().succeeded(peer_address_, proof_check_);
    // Claimed for eviction meanwhile: the eviction, posted to this strand, closes it. Waiting
    // beyond the cap: a slot is taken now, for the client proved.
    if (over_cap_ ? !take_slot(header_.client_id) : !evictable_.exchange(false)) return;
    authenticated_ = true;
    bound_client_id_ = header_.client_id;
    client_bound_ = true;  // the id the proof proved; every later frame must carry it
    auth_deadline_ns_.store(0, std::memory_order_relaxed);
    leave_unauthenticated();
    return send(make_reply(header_, Status::Code::kOk, {}));
  }
  count_wrong_proof("wrong AUTH proof");
  refuse(Status::PermissionDenied("wrong auth token"));
}

void Session::count_wrong_proof(const std::string& what) {
  server_->auth_failures.fetch_add(1, std::memory_order_relaxed);
  double delay_s = 0;
  const uint64_t failures = server_->auth_backoff().failed(peer_address_, Clock::now(), &delay_s);
  Server::Impl::warn(server_->auth_log, "gpubox_server: " + what + " from " + peer_ + " (" +
                                            std::to_string(failures) + " in a row from host " +
                                            AuthBackoff::host_of(peer_address_) +
                                            "; its next proof is checked " + seconds_text(delay_s) +
                                            " s from now at the soonest)");
}

void Session::leave_unauthenticated() {
  evictable_.store(false);
  if (!counted_unauthenticated_) return;
  counted_unauthenticated_ = false;
  server_->unauthenticated.fetch_sub(1, std::memory_order_relaxed);
}

void Session::evict(const Status& why, const std::string& what) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, why, what] {
    if (self->closed_) return;
    const std::string client = self->client_bound_
                                   ? " (client " + std::to_string(self->bound_client_id_) + ")"
                                   : std::string();
    Server::Impl::warn(self->server_->connection_log, "gpubox_server: evicted connection from " +
                                                          self->peer_ + client + ": " + what);
    self->notice_and_close(why);
  });
}

// ---- the connection cap -----------------------------------------------------------------------

bool Session::take_slot(uint64_t client_id) {
  if (!over_cap_) return true;
  if (!waiting_.exchange(false)) return false;  // claimed: the eviction, posted here, closes it
  const Status admitted = server_->admit_waiting(*this, Newcomer{peer_address_, true, client_id});
  if (!admitted.ok()) {
    server_->refused_connections.fetch_add(1, std::memory_order_relaxed);
    Server::Impl::warn(server_->connection_log, "gpubox_server: refusing connection from " + peer_ +
                                                    " (client " + std::to_string(client_id) +
                                                    "): " + admitted.message());
    // A notice, not an error reply: the client reads it as a lost connection and retries. It
    // lingers (so the notice is read, not reset) keeping its place in the waiting room, where a
    // new connection may take it: binding new ids over and over piles up no descriptors. In the
    // room before the notice goes, so the client's next connection finds it there.
    waiting_.store(true);
    send_notice_now(fd_, notice_frame(admitted));
    linger_then_close(0);
    return false;
  }
  leave_cap();
  slotted_ = true;  // admit_waiting counted it
  in_share_.store(true);
  auth_deadline_ns_.store(0, std::memory_order_relaxed);
  return true;
}

void Session::leave_cap() {
  in_share_.store(false);
  waiting_.store(false);
  if (slotted_) {
    slotted_ = false;
    server_->release_slot();
  }
  if (!over_cap_) return;
  over_cap_ = false;
  server_->over_cap.fetch_sub(1, std::memory_order_relaxed);
}

bool Session::holding(HeldConnection* out) const {
  if (!in_share_.load()) return false;
  const bool bound = client_bound_.load();
  if (!bound && !server_->options().auth_token.empty()) return false;
  // Claimed to give its slot (its eviction is posted): counted, it would let a second newcomer
  // take its holder's last connection.
  const int64_t idle = idle_since_ns_.load();
  if (idle == kClaimedIdle) return false;
  out->address = peer_address_;
  out->bound = bound;
  out->client_id = bound_client_id_.load();
  out->idle_since = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(std::max<int64_t>(idle, 0))));
  // Idle a frame's grace at least: a client's next frame, sent before it read the last reply
  // (pipelined), has arrived by then, so a call under way is not cut.
  out->idle = idle > 0 && Clock::now() - out->idle_since >= server_->frame_grace();
  return true;
}

bool Session::claim_idle(Clock::time_point since) {
  int64_t expected = ns_of(since);
  return expected > 0 && idle_since_ns_.compare_exchange_strong(expected, kClaimedIdle);
}

bool Session::leave_idle() {
  int64_t idle = idle_since_ns_.load();
  while (idle != kClaimedIdle) {
    if (idle_since_ns_.compare_exchange_weak(idle, 0)) return true;
  }
  return false;
}

// ---- BARRIER ----------------------------------------------------------------------------------

void Session::watch_barrier_wait() {
  // The client sends nothing while it waits: a completed read means it left (or broke the
  // protocol), and either way it must not count toward the barrier any more.
  state_ = State::kBarrier;
  barrier_since_ = Clock::now();
  watch(Watch::kBarrier, barrier_since_ + steady_seconds(server_->options().barrier_timeout_s));
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

void Session::barrier_timed_out() {
  if (state_ != State::kBarrier) return;
  // Not among the waiters any more: a release is on its way to this strand.
  if (!server_->barrier_leave(this, barrier_name_)) return;
  server_->barrier_timeouts.fetch_add(1, std::memory_order_relaxed);
  boost::system::error_code ignored;
  socket_.cancel(ignored);  // the watch read
  answer(error_reply(
      header_,
      Status::DeadlineExceeded(
          "BARRIER '" + barrier_name_ + "' waited " +
          seconds_text(std::chrono::duration<double>(Clock::now() - barrier_since_).count()) +
          " s for its parties (the server's --barrier_timeout_s)")));
}

void Session::release_barrier(Reply reply) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, reply = std::move(reply)]() mutable {
    if (self->closed_ || self->state_ != State::kBarrier) return;
    boost::system::error_code ignored;
    self->socket_.cancel(ignored);  // the watch read
    self->send(std::move(reply));
  });
}

bool Session::peer_still_waiting() const {
  uint8_t byte = 0;
  const ssize_t k = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

// ---- deadlines --------------------------------------------------------------------------------

void Session::watch(Watch kind, Clock::time_point deadline) {
  deadline_ns_.store(kind == Watch::kNone ? 0 : ns_of(deadline), std::memory_order_relaxed);
  watch_.store(static_cast<uint8_t>(kind), std::memory_order_relaxed);
}

void Session::watch_idle() {
  // Bytes of a next frame already here (pipelined): not idle, the frame starts now.
  boost::system::error_code ec;
  int64_t busy = 0;  // never over a claim (claim_idle)
  if (socket_.available(ec) == 0 || ec) {
    idle_since_ns_.compare_exchange_strong(busy, ns_of(Clock::now()));
  }
  const double idle = server_->options().idle_timeout_s;
  if (idle > 0) return watch(Watch::kIdle, Clock::now() + steady_seconds(idle));
  watch(Watch::kNone, {});
}

void Session::frame_started() {
  frame_bytes_.store(0, std::memory_order_relaxed);
  frame_start_ns_.store(ns_of(Clock::now()), std::memory_order_relaxed);
  watch(Watch::kNone, {});  // not idle any more; the frame's own deadline runs
}

Session::Overdue Session::overdue_kind(Clock::time_point now) const {
  const int64_t now_ns = ns_of(now);
  const int64_t auth = auth_deadline_ns_.load(std::memory_order_relaxed);
  if (auth != 0 && now_ns > auth) return Overdue::kAuth;
  const int64_t start = frame_start_ns_.load(std::memory_order_relaxed);
  if (start != 0) {
    // After the grace, the frame's bytes must keep up with the floor rate.
    const int64_t late_ns =
        now_ns - start -
        std::chrono::duration_cast<std::chrono::nanoseconds>(server_->frame_grace()).count();
    if (late_ns > 0 && static_cast<double>(frame_bytes_.load(std::memory_order_relaxed)) <
                           server_->min_transfer_bytes_per_s() * 1e-9 * late_ns) {
      return Overdue::kFrame;
    }
  }
  const int64_t deadline = deadline_ns_.load(std::memory_order_relaxed);
  if (deadline == 0 || now_ns <= deadline) return Overdue::kNone;
  switch (static_cast<Watch>(watch_.load(std::memory_order_relaxed))) {
    case Watch::kIdle:
      return Overdue::kIdle;
    case Watch::kBarrier:
      return Overdue::kBarrier;
    case Watch::kWriting:
      return Overdue::kWriting;
    case Watch::kLingering:
      return Overdue::kLingering;
    case Watch::kNone:
      break;
  }
  return Overdue::kNone;
}

std::string Session::overdue_reason(Overdue kind, Clock::time_point now) const {
  const ServerOptions& o = server_->options();
  const double rate_kb = server_->min_transfer_bytes_per_s() / 1024;
  switch (kind) {
    case Overdue::kAuth:
      if (o.auth_token.empty()) {  // waiting beyond the connection cap for its first frame
        return "no frame within " + seconds_text(o.auth_timeout_s) +
               " s of connecting beyond the connection cap (--auth_timeout_s)";
      }
      return "not authenticated within " + seconds_text(o.auth_timeout_s) +
             " s of connecting (--auth_timeout_s)";
    case Overdue::kFrame: {
      const double start_s =
          std::chrono::duration<double>(std::chrono::nanoseconds(frame_start_ns_.load())).count();
      const double elapsed =
          std::chrono::duration<double>(now.time_since_epoch()).count() - start_s;
      return "a frame fell behind its deadline: " + std::to_string(frame_bytes_.load()) +
             " bytes in " + seconds_text(elapsed) + " s (a frame gets " +
             seconds_text(o.frame_deadline_s) + " s, --frame_deadline_s, then must keep up " +
             seconds_text(rate_kb) + " KiB/s, --min_transfer_kb_s)";
    }
    case Overdue::kIdle:
      return "idle for " + seconds_text(o.idle_timeout_s) + " s (--idle_timeout_s)";
    case Overdue::kWriting:
      return std::string(progress_writing_ ? "a PROGRESS frame of " : "a reply of ") +
             std::to_string(progress_writing_ ? progress_frame_.size() : reply_.frame.size()) +
             " bytes was not read within its deadline (--frame_deadline_s " +
             seconds_text(o.frame_deadline_s) + " s, then " + seconds_text(rate_kb) +
             " KiB/s, --min_transfer_kb_s)";
    case Overdue::kBarrier:
    case Overdue::kLingering:
    case Overdue::kNone:
      break;
  }
  return "";
}

void Session::on_overdue() {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self] {
    if (self->closed_) return;
    const auto now = Clock::now();
    const Overdue kind = self->overdue_kind(now);
    Server::Impl* server = self->server_;
    switch (kind) {
      case Overdue::kNone:
        return;  // moved on meanwhile
      case Overdue::kBarrier:
        return self->barrier_timed_out();
      case Overdue::kLingering:
        return self->close();
      case Overdue::kIdle:
        server->idle_closed.fetch_add(1, std::memory_order_relaxed);
        Server::Impl::warn(server->connection_log, "gpubox_server: closing connection from " +
                                                       self->peer_ + ": " +
                                                       self->overdue_reason(kind, now));
        return self->close();
      case Overdue::kAuth:
      case Overdue::kFrame:
      case Overdue::kWriting:
        break;
    }
    server->deadline_closed.fetch_add(1, std::memory_order_relaxed);
    const std::string why = self->overdue_reason(kind, now);
    Server::Impl::warn(server->connection_log,
                       "gpubox_server: closing connection from " + self->peer_ + ": " + why);
    self->notice_and_close(Status::DeadlineExceeded(why));
  });
}

// ---- closing ----------------------------------------------------------------------------------

void Session::notice_and_close(const Status& why) {
  // Not in the middle of a reply's (or a PROGRESS frame's) bytes: the notice would garble it.
  if (state_ != State::kWriting && !progress_writing_) send_notice_now(fd_, notice_frame(why));
  close();
}

void Session::close_after_stop() {
  if (closed_) return;
  notice_and_close(Status::Unavailable("server stopped"));
}

void Session::linger_then_close(std::size_t dropped) {
  if (state_ != State::kLingering) {
    state_ = State::kLingering;
    auth_deadline_ns_.store(0, std::memory_order_relaxed);  // the linger bounds it now
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    if (!scratch_) scratch_.reset(new uint8_t[kScratchBytes]);
    watch(Watch::kLingering, Clock::now() + kLingerTime);
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

void Session::close() {
  if (closed_) return;
  // Leave the barrier before the descriptor closes: a barrier may peek at it until then.
  if (state_ == State::kBarrier) server_->barrier_leave(this, barrier_name_);
  closed_ = true;
  state_ = State::kClosed;
  frame_ended();
  watch(Watch::kNone, {});
  auth_deadline_ns_.store(0, std::memory_order_relaxed);
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (auth_timer_) auth_timer_->cancel();
  if (progress_timer_) progress_timer_->cancel();
  if (bulk_abandoned_) {  // its SAVE or LOAD, if not started yet, is dropped
    bulk_abandoned_->store(true, std::memory_order_release);
    bulk_abandoned_.reset();
    server_->bulk().abandoned();
  }
  if (proof_waiting_.exchange(false, std::memory_order_relaxed)) {
    if (proof_is_right()) {
      server_->auth_backoff().succeeded(peer_address_, proof_check_);
    } else {
      count_wrong_proof("wrong AUTH proof (closed while it waited for its check)");
    }
    server_->proofs_waiting.fetch_sub(1, std::memory_order_relaxed);  // counted first
  }
  // The payload freed before its bytes are given back, as free_request() does: giving back the
  // last in-flight bytes after a burst trims the heap (malloc_reuse.hpp), which this buffer
  // would otherwise miss.
  std::vector<uint8_t>().swap(payload_);
  server_->budget().give_back(request_held_ + reply_held_);
  request_held_ = reply_held_ = 0;
  leave_unauthenticated();
  leave_cap();
  if (sent_dense_) server_->connection_closed(serial_);
  server_->unregister_session(serial_);
  server_->session_closed();
}

}  // namespace gpubox::table::server
