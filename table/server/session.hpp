// Internal to gpubox_server_lib: one client connection of a Server. Reads a frame, answers it,
// repeats. Handlers of one session never overlap: they run on the socket's strand (a BARRIER
// release, a deadline and an eviction are posted to it too).
//
// Memory: a request's payload buffer is allocated once its bytes arrive and grows with them
// (doubling from 256 KiB, never allocated from the announced length), and every buffered byte is
// charged to the connection's limit and to the server's in-flight budget until the reply was
// written.
//
// Time: every phase has a deadline (session_guard.cpp), checked by the server's sweep (Server::
// Impl::sweep, from another thread: hence the atomics below) and acted on on the strand:
//   - a frame (header and payload), from its first byte: its bytes must keep up with
//     --min_transfer_kb_s after a grace of --frame_deadline_s, so a client dripping bytes is cut
//     within the grace whatever it announced; a reply must be read as fast;
//   - on a token server, authentication within --auth_timeout_s of connecting;
//   - between frames, --idle_timeout_s; a BARRIER wait, --barrier_timeout_s.
// A SAVE, LOAD or SHRINK runs on the server's BulkWorker (session_bulk.cpp, bulk_work.hpp): no
// deadline of the session's own runs meanwhile (its client bounds the call by the time without
// PROGRESS frames), but each PROGRESS frame must be read as fast as a reply.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "table/server/auth_handshake.hpp"
#include "table/server/server_impl.hpp"

namespace gpubox::table::server {

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Clock = std::chrono::steady_clock;

  // over_cap: accepted beyond --max_connections to wait for a fair share's slot (server.cpp).
  Session(Server::Impl* server, tcp::socket socket, uint64_t serial, bool over_cap = false);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  uint64_t serial() const { return serial_; }
  // Ends this session's BARRIER wait with `reply` (from any thread).
  void release_barrier(Reply reply);
  // Called by the barrier, under its lock, while this session is one of its waiters (so the
  // descriptor is still open): false when the client closed its end or sent bytes, which it may
  // not while waiting. Such a waiter is dropped, never counted.
  bool peer_still_waiting() const;

  // ---- for the server's sweep and accept loop (any thread) ----
  // Whether a deadline of this session passed at `now` (then the sweep calls on_overdue(),
  // which acts on the strand if it still holds there).
  bool overdue(Clock::time_point now) const { return overdue_kind(now) != Overdue::kNone; }
  void on_overdue();
  // Claims this session for eviction: true once, and only while it has not authenticated.
  bool claim_for_eviction() { return evictable_.exchange(false); }
  // Its AUTH_PROOF waits for its host's slot (a hint: eviction takes the others first).
  bool proof_waiting() const { return proof_waiting_.load(std::memory_order_relaxed); }
  // Claims a session waiting beyond the cap for eviction: true once, only before it bound (or
  // while it lingers, refused when it bound).
  bool claim_waiting() { return waiting_.exchange(false); }
  // Waiting beyond the cap (not bound yet, or refused when it bound and lingering), not claimed.
  bool waiting() const { return waiting_.load(); }
  const std::string& peer_address() const { return peer_address_; }  // set once, at accept
  // This connection as the cap's fair share sees it (connection_share.hpp); false when it does
  // not count: closed, waiting beyond the cap, claimed to give its slot (claim_idle), or not
  // authenticated on a token server (those give their slots by claim_for_eviction).
  bool holding(HeldConnection* out) const;
  // Claims this connection, idle since `since` (as holding() saw it), to give its slot: true
  // once, and only while no frame began on it since (a call in progress is never taken).
  bool claim_idle(Clock::time_point since);
  // Closes a session claimed by claim_for_eviction(), claim_waiting() or claim_idle(), with a
  // notice saying `why`, logged naming the peer and `what` was evicted.
  void evict(const Status& why, const std::string& what);
  // The server stopped and its threads ended (Server::Impl::wait; never while one runs): closes
  // the connection with a notice "server stopped" (unless a reply was being written), so that
  // its client's call fails at once, naming the server, and may reconnect to a restarted one.
  void close_after_stop();
  // Its SAVE, LOAD or SHRINK is queued or running on the BulkWorker. Only once the server's threads
  // ended (Server::Impl::wait), as close_after_stop().
  bool working() const { return state_ == State::kWorking; }

 private:
  // kWorking: a SAVE, LOAD or SHRINK runs on the BulkWorker (session_bulk.cpp).
  enum class State {
    kHeader,
    kPayload,
    kDraining,
    kBarrier,
    kWorking,
    kWriting,
    kLingering,
    kClosed
  };
  // What deadline_ns_ stands for.
  enum class Watch : uint8_t { kNone, kIdle, kBarrier, kWriting, kLingering };
  enum class Overdue { kNone, kAuth, kFrame, kIdle, kBarrier, kWriting, kLingering };

  void read_header();
  void on_header_bytes(const boost::system::error_code& ec, std::size_t n);
  void on_header();
  void read_payload();
  void on_payload(const boost::system::error_code& ec, std::size_t n);
  // The server's budget is spent: read the rest of the frame into a small scratch buffer and
  // answer "server busy: in-flight budget" (retry later).
  void drain();
  void on_drained(const boost::system::error_code& ec, std::size_t n);
  void on_frame();
  // The request's reply: the request's buffer given back, then answered (or dropped, by the
  // drop_reply test hook).
  void finish_request(Reply reply);
  // ---- session_bulk.cpp: SAVE, LOAD and SHRINK on the BulkWorker, with PROGRESS frames ----
  static bool runs_on_bulk_worker(Op op) {
    return op == Op::kSave || op == Op::kLoad || op == Op::kShrink;
  }
  // A SAVE or LOAD request names a path and a mode (a SHRINK carries nothing): a larger one is
  // refused from its header.
  static constexpr std::size_t kMaxBulkPayloadBytes = 64 * 1024;
  void start_bulk();
  // While kWorking: closes the session as soon as its client closes (or sends bytes).
  void watch_bulk_client();
  void schedule_progress();
  // A PROGRESS frame, when the call moved since the last one and none is being written.
  void send_progress();
  void on_progress_written(const boost::system::error_code& ec);
  // The call's reply (posted to the strand): sent once no PROGRESS frame is being written.
  void bulk_done(Reply reply);
  // A frame of another protocol version: answered in that version, naming both, then closed.
  void refuse_version(uint16_t version);
  // ---- session_guard.cpp: authentication, BARRIER, deadlines, notices ----
  // AUTH_PROOF on a connection that has not authenticated: checked at once, or when the backoff
  // of its peer address allows (a timer), or refused when that is past the auth deadline.
  void check_proof();
  void on_proof_checked();
  bool proof_is_right() const;
  // A failure for the peer's host (auth_backoff.hpp), counted and logged as `what`.
  void count_wrong_proof(const std::string& what);
  void watch_barrier_wait();
  void on_barrier_watch(const boost::system::error_code& ec, std::size_t n);
  void barrier_timed_out();
  // Charges `growth` more request bytes to the server's budget; false (logged, counted) when
  // the budget has no room.
  bool take_budget(std::size_t growth);
  // send(), after logging an error reply (rate-limited, naming the peer and why).
  void answer(Reply reply);
  void send(Reply reply);
  void on_written(const boost::system::error_code& ec);
  // After a refusal: no more sending, the client's unread bytes are read and dropped (at most
  // kLingerBytes, for at most kLingerTime) so that closing does not reset the connection before
  // the client read the reply.
  void linger_then_close(std::size_t dropped);
  Status reserve_reply(std::size_t bytes);
  void free_request();
  // An AUTH refusal (counted as one): reject_and_close.
  void refuse(const Status& status);
  // An error reply, logged naming the peer, then the connection is closed (the rest of the frame
  // is never read).
  void reject_and_close(const Status& status);
  // A frame whose client id is not the one this connection is bound to: refused, closed.
  void refuse_foreign_client();
  void protocol_error(const std::string& reason);
  // Writes a notice (protocol.hpp: request id 0) if the socket takes it now and no reply is
  // being written, then closes.
  void notice_and_close(const Status& why);
  void close();
  // ---- deadlines (session_guard.cpp) ----
  void watch(Watch kind, Clock::time_point deadline);
  void watch_idle();
  void frame_started();
  void frame_progress(std::size_t bytes) { frame_bytes_.store(bytes, std::memory_order_relaxed); }
  void frame_ended() { frame_start_ns_.store(0, std::memory_order_relaxed); }
  Overdue overdue_kind(Clock::time_point now) const;
  // Why a connection is closed for `kind`, for the log and the client's notice.
  std::string overdue_reason(Overdue kind, Clock::time_point now) const;
  void leave_unauthenticated();
  // ---- the connection cap (session_guard.cpp) ----
  // A session waiting beyond the cap, bound now to `client_id`: true when it took a slot
  // (Server::Impl::admit_waiting); false when it was claimed for eviction meanwhile (closing) or
  // refused (closed after a notice saying why).
  bool take_slot(uint64_t client_id);
  // Not idle any more (a frame began): false when claim_idle() took it first (being evicted).
  bool leave_idle();
  // No longer counted by the cap: closing.
  void leave_cap();

  Server::Impl* server_;
  tcp::socket socket_;
  int fd_;  // socket_'s descriptor, for peer_still_waiting()
  const uint64_t serial_;
  std::string peer_;
  std::string peer_address_;  // without the port: AUTH failures are slowed per address
  State state_ = State::kHeader;
  bool closed_ = false;
  bool authenticated_ = false;
  // The client id this connection speaks for: the one its AUTH proof proved (token server), or
  // its first frame's (no token). Every later frame must carry it (the retry cache, held DENSE
  // writes and their caps are keyed by it).
  // Atomics: the cap's fair share reads them from other threads (holding()).
  std::atomic<bool> client_bound_{false};
  std::atomic<uint64_t> bound_client_id_{0};
  bool sent_dense_ = false;  // a DENSE request came: its close is told to the held writes
  bool counted_unauthenticated_ = false;
  std::atomic<bool> evictable_{false};
  bool over_cap_ = false;  // counted in Server::Impl::over_cap (waiting for a slot)
  bool slotted_ = false;   // holds a slot (Server::Impl::reserve_slot), given back on close
  // Over the cap and not bound yet (or refused at bind, lingering): claim_waiting() may take it.
  std::atomic<bool> waiting_{false};
  std::atomic<bool> in_share_{false};  // holds a slot under the cap: holding() counts it
  // Since when it waits for a frame between calls (steady-clock ns): 0 while a frame or reply is
  // under way, kClaimedIdle once claim_idle() took it.
  static constexpr int64_t kClaimedIdle = -1;
  std::atomic<int64_t> idle_since_ns_{0};
  // Deadlines, read by the sweep (steady-clock nanoseconds; 0: none).
  std::atomic<int64_t> auth_deadline_ns_{0};
  std::atomic<int64_t> deadline_ns_{0};
  std::atomic<uint8_t> watch_{0};  // Watch
  std::atomic<int64_t> frame_start_ns_{0};
  std::atomic<uint64_t> frame_bytes_{0};
  bool have_nonce_ = false;
  AuthNonce nonce_{};
  AuthProof proof_{};
  AuthBackoff::Check proof_check_{};  // when proof_ is checked (auth_backoff.hpp)
  Clock::time_point barrier_since_;
  uint8_t header_bytes_[kHeaderBytes] = {};
  std::size_t header_got_ = 0;
  FrameHeader header_;
  std::vector<uint8_t> payload_;
  std::size_t payload_got_ = 0;
  bool payload_ready_ = false;    // payload bytes were readable: the buffer may be allocated
  std::size_t request_held_ = 0;  // bytes charged for payload_
  std::size_t reply_held_ = 0;    // bytes charged for the reply being built or written
  std::size_t drain_left_ = 0;
  std::unique_ptr<uint8_t[]> scratch_;              // for drain() and the barrier watch
  std::unique_ptr<asio::steady_timer> auth_timer_;  // a slowed AUTH_PROOF waits on it
  // A slowed AUTH_PROOF holds its host's slot (auth_backoff.hpp) and waits: closed before it is
  // checked, it is checked then, unanswered, and counts as a failure if wrong (else a client could
  // take slots and leave without a failure); a right one closed (say evicted) is not held against
  // its host. Atomic: the eviction of unauthenticated connections reads it (proof_waiting()).
  std::atomic<bool> proof_waiting_{false};
  std::string barrier_name_;
  Reply reply_;
  // The SAVE or LOAD under way (kWorking): the worker's operation count it last looked at
  // (io::FileWorkProgress::moved), the PROGRESS frame being written (at most one at a time) and the
  // reply that waits for it.
  uint64_t progress_seen_ = 0;
  std::unique_ptr<asio::steady_timer> progress_timer_;
  std::vector<uint8_t> progress_frame_;
  bool progress_writing_ = false;
  std::optional<Reply> bulk_reply_;
  // Set when this session closes while its call is queued or running (BulkWaiter).
  std::shared_ptr<std::atomic<bool>> bulk_abandoned_;
};

}  // namespace gpubox::table::server
