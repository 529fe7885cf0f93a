// Internal to gpubox_server_lib: Server::Impl and what its parts share. server.cpp holds the
// lifecycle, the accept loop and barriers; session.cpp one connection; handlers.cpp what each op
// does to the table.
#pragma once

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/malloc_reuse.hpp"
#include "common/thread_annotations.hpp"
#include "table/io/rooted_env.hpp"
#include "table/server/auth_backoff.hpp"
#include "table/server/bulk_work.hpp"
#include "table/server/connection_limits.hpp"
#include "table/server/connection_share.hpp"
#include "table/server/ps_step_sums.hpp"
#include "table/server/ps_store.hpp"
#include "table/server/request_window.hpp"
#include "table/server/server.hpp"

namespace gpubox::table::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class Session;

// `s` seconds as the steady clock's duration, clamped to [0, 100 days]: a larger value would
// overflow the clock's nanoseconds.
inline std::chrono::steady_clock::duration steady_seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(s, 0.0, 8.64e6)));
}

// Where a request came from: its connection (the session's serial) and that peer's address
// (without the port).
struct RequestOrigin {
  uint64_t connection = 0;
  std::string_view address;  // the session's peer address, which outlives the request
  // A SAVE, LOAD or SHRINK run on the BulkWorker counts its steps here (bulk_work.hpp), for
  // the PROGRESS frames its session sends; null for a call on the session's strand.
  io::FileWorkProgress* progress = nullptr;
};

Reply make_reply(const FrameHeader& request, Status::Code code, std::vector<uint8_t> payload);
Reply error_reply(const FrameHeader& request, const Status& status);
// A failed table call's reply, in the op's name. Aborted on the wire means "retry later", so a
// table's own Aborted travels as Internal: the client must not retry it until its deadline.
Reply table_error_reply(const FrameHeader& request, const Status& status);

// A notice (protocol.hpp: request id 0) saying why the server closes a connection, in a header
// of protocol `version`; send_notice_now writes it if the socket `fd` takes it at once.
std::vector<uint8_t> notice_frame(const Status& why, uint16_t version = kProtocolVersion);
void send_notice_now(int fd, const std::vector<uint8_t>& frame);

// Asks the connection for `bytes` more of reply buffer before a handler allocates it (PULL):
// OK, ResourceExhausted (over the connection's limit: never fits) or Aborted (over the server's
// in-flight budget now: retry later).
using ReserveReply = std::function<Status(std::size_t bytes)>;

// Bytes buffered by all connections together, against a limit. Thread-safe.
//
// Fair share: the last eighth of the limit (reserve()) goes only to connections that hold at
// most a 64th of it (small_holder()) once they have it, so that a few connections sending big
// frames (slowly, or not at all: session.hpp cuts those at their frame deadline) cannot take all
// of it from the trainers' ordinary chunks.
//
// Once the bytes held fall to 0 after a burst of at least kTrimAfterBurstBytes, the thread that
// gave the last back hands the heaps' free memory to the kernel (common/malloc_reuse.hpp: what
// the heap keeps after a burst is otherwise counted by no limit).
class ByteBudget {
 public:
  explicit ByteBudget(std::size_t limit) : limit_(limit) {}
  // Takes `n` for a connection that holds `held` bytes already, when it fits (see above).
  bool try_take(std::size_t n, std::size_t held);
  std::size_t reserve() const { return limit_ / 8; }
  std::size_t small_holder() const { return limit_ / 64; }
  void give_back(std::size_t n);
  std::size_t used() const { return used_.load(std::memory_order_relaxed); }
  std::size_t limit() const { return limit_; }

 private:
  static constexpr std::size_t kTrimAfterBurstBytes = std::size_t{64} << 20;
  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
  TrimAfterBurst trim_{kTrimAfterBurstBytes};
};

class Server::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(HostTier* table, ServerOptions options);
  ~Impl();

  Status listen();
  void run_threads();
  void stop();
  void wait();

  const ServerOptions& options() const { return options_; }
  uint16_t port() const { return port_; }
  uint64_t instance_id() const { return instance_id_; }
  std::size_t max_connections() const { return max_connections_; }
  bool stopped() const { return stopped_.load(); }
  // How long a server whose job ended waits for its trainers to close their connections.
  static constexpr std::chrono::seconds kJobEndGrace{10};
  ServerCounters counters() const;

  // ---- for sessions ----
  // Payload bytes one connection may hold: kMaxAuthPayloadBytes before it authenticated.
  std::size_t connection_buffer_limit(bool authenticated) const;
  ByteBudget& budget() { return budget_; }
  // Where sessions run SAVE, LOAD and SHRINK (off the network threads, so that they send PROGRESS
  // frames meanwhile).
  BulkWorker& bulk() { return bulk_; }
  AuthBackoff& auth_backoff() { return auth_backoff_; }
  // A frame's grace (--frame_deadline_s) and the floor rate its bytes must keep after it.
  Clock::duration frame_grace() const { return frame_grace_; }
  double min_transfer_bytes_per_s() const { return options_.min_transfer_bytes_per_s; }
  // Connections that have not authenticated (token servers) may hold at most this many slots.
  std::size_t max_unauthenticated() const { return max_unauthenticated_; }
  std::size_t max_barrier_waiters() const { return max_barrier_waiters_; }
  // The session registry, for the deadline sweep and evictions (oldest serial first).
  void register_session(const std::shared_ptr<Session>& session);
  void unregister_session(uint64_t serial);
  // The reply of one decoded request (everything but BARRIER and AUTH) from `origin` (its
  // session serial and peer address), whose header carries the client id that connection is
  // bound to; retried mutations are answered from the retry cache.
  Reply handle(const FrameHeader& header, const std::vector<uint8_t>& payload,
               const ReserveReply& reserve, const RequestOrigin& origin);
  // A connection that sent DENSE requests closed: the held writes it carried learn it (a write
  // every connection of which closed is abandoned, PsStore::connection_closed).
  void connection_closed(uint64_t connection) { ps_store_.connection_closed(connection); }
  // A remembered DENSE write range retried on origin.connection: that connection carries its held
  // write from now on (PsStore::carried_by). Other requests: nothing.
  void note_ranged_write_retry(const FrameHeader& header, const std::vector<uint8_t>& payload,
                               const RequestOrigin& origin);
  // BARRIER: the reply to send now (an error, or OK when this arrival completed the barrier;
  // the other waiters get theirs through Session::release_barrier), or nullopt when `session`
  // now waits on *name.
  std::optional<Reply> barrier_arrive(const std::shared_ptr<Session>& session,
                                      const FrameHeader& header,
                                      const std::vector<uint8_t>& payload, std::string* name);
  // A waiting session whose connection ends or whose wait timed out: it no longer counts toward
  // barrier `name`. False when it was not waiting there (released meanwhile).
  bool barrier_leave(const Session* session, const std::string& name);
  void session_closed() { open_connections.fetch_sub(1, std::memory_order_relaxed); }
  // A slot under --max_connections: reserved while fewer are held (false at the cap; two
  // connections racing for the last slot get one), or taken over from a connection being
  // evicted for it (counted until that one closes), and given back by the session closing.
  bool reserve_slot();
  void take_over_slot() { admitted_.fetch_add(1); }
  void release_slot() { admitted_.fetch_sub(1); }
  // ---- the connection cap's fair share (server_sessions.cpp) ----
  // A connection that waited over the cap (kMaxWaitingOverCap) and is now bound to
  // `newcomer.client_id` (its AUTH proved it, or its first frame named it without a token): OK
  // when it may hold a slot (one is free, an unauthenticated connection gave its own, or
  // fair_share_victim's was claimed and is being evicted), else ResourceExhausted saying why.
  // Called on `session`'s strand; serialized by share_mu_.
  Status admit_waiting(const Session& session, const Newcomer& newcomer) GPUBOX_EXCLUDES(share_mu_);
  // How long a connection must have been idle for a holder only one connection above a newcomer
  // to give it a slot: a quarter of --idle_timeout_s (75 s when that is 0).
  Clock::duration long_idle() const;
  // Logs `line` as a warning unless `throttle` held it back.
  static void warn(LogThrottle& throttle, const std::string& line);

  // Per-connection events (protocol errors, refusals, idle closes), one line per interval.
  LogThrottle connection_log{std::chrono::seconds(2)};
  // Requests answered with an error (a payload that does not decode, a row of a width the table
  // has not, ...), naming the peer: one line per interval, so a client cannot flood the log.
  LogThrottle request_log{std::chrono::seconds(2)};
  // Requests answered "server busy: in-flight budget", and failed AUTH proofs.
  LogThrottle busy_log{std::chrono::seconds(2)};
  LogThrottle auth_log{std::chrono::seconds(2)};
  std::atomic<uint64_t> connections{0}, open_connections{0}, refused_connections{0},
      accept_failures{0}, idle_closed{0}, requests{0}, duplicates{0}, rows_pulled{0},
      rows_pushed{0}, protocol_errors{0}, auth_refusals{0}, budget_refusals{0},
      barrier_waiters_dropped{0}, deadline_closed{0}, evicted{0}, auth_failures{0},
      barrier_timeouts{0}, unauthenticated{0}, foreign_client_refusals{0}, fair_share_evicted{0},
      over_cap{0},         // over_cap: connections waiting beyond the cap (kMaxWaitingOverCap)
      proofs_waiting{0},   // AUTH proofs waiting now for their host's slot (auth_backoff.hpp)
      proofs_deferred{0},  // AUTH proofs refused unchecked for their host's backoff
      sweeps{0};           // sweep() runs finished (deadlines, the job's end)

 private:
  void accept();
  void accept_failed(const boost::system::error_code& ec);
  // Out of descriptors: accept one waiting connection with the reserve descriptor and close it,
  // so the kernel queue drains instead of waking the accept loop forever.
  void shed_waiting_connection();
  void refuse_connection(tcp::socket& socket);
  // A token server at its cap of unauthenticated connections: evicts the oldest one (its slot
  // goes to the new connection). False when none may be evicted.
  bool evict_oldest_unauthenticated();
  // Whether the connections beyond the cap have room for one more from `address`: a fresh client
  // there would find a fair_share_victim, and fewer than kMaxWaitingPerAddress of its share
  // address and kMaxWaitingOverCap in all wait (else the oldest waiting of its address, or of
  // the address waiting with the most, is evicted for it).
  bool may_wait_over_cap(const std::string& address);
  // The sessions the fair share counts (Session::holding) but `except`, and their snapshot;
  // sessions->at(i) is held[i]'s (and keeps its address alive).
  std::vector<HeldConnection> share_snapshot(const Session* except,
                                             std::vector<std::shared_ptr<Session>>* sessions);
  // "server at its connection cap (N, --max_connections)" and why no slot is given.
  std::string cap_reason() const;
  // Every sweep interval: sessions past a deadline act on it (session.hpp).
  void sweep();
  // The registered sessions still alive, oldest first.
  std::vector<std::shared_ptr<Session>> live_sessions();

  // ---- handlers.cpp ----
  Reply apply(const FrameHeader& header, const std::vector<uint8_t>& payload,
              const ReserveReply& reserve, const RequestOrigin& origin);
  Status check_keys(const uint64_t* keys, std::size_t n) const;
  // Under ServerOptions::memory_limit_bytes: OK when the rows the table would create for these
  // keys (those it does not hold) fit under the limit, else ResourceExhausted "server memory
  // limit: ..." (checked before anything is created; concurrent requests may overshoot by what
  // they create between their checks).
  Status admit_new_rows(const uint64_t* keys, const int32_t* slots, std::size_t n);
  Reply info(const FrameHeader& header);
  // PULL, or PEEK (the same message, read-only: HostTier::peek).
  Reply pull(const FrameHeader& header, const std::vector<uint8_t>& payload,
             const ReserveReply& reserve);
  Reply push(const FrameHeader& header, const std::vector<uint8_t>& payload);
  Reply erase(const FrameHeader& header, const std::vector<uint8_t>& payload);
  // Through data_env_, counted in origin.progress when not null. These calls change the whole
  // table (or end the server): each is logged naming its client and address.
  Reply save(const FrameHeader& header, const std::vector<uint8_t>& payload,
             const RequestOrigin& origin);
  Reply load(const FrameHeader& header, const std::vector<uint8_t>& payload,
             const RequestOrigin& origin);
  // Each step the table reports (HostTier::shrink) counted in origin.progress when not null.
  Reply shrink(const FrameHeader& header, const std::vector<uint8_t>& payload,
               const RequestOrigin& origin);
  Reply stats(const FrameHeader& header);
  Reply shutdown(const FrameHeader& header, const RequestOrigin& origin);
  // ---- ps_handlers.cpp: the parameter-server modes' ops ----
  Reply ps_push(const FrameHeader& header, const std::vector<uint8_t>& payload,
                const RequestOrigin& origin);
  // The sync mode's step part (kStepGradient): held, and the step applied once whole.
  Status ps_step_push(const FrameHeader& header, PsPushRequest request,
                      const RequestOrigin& origin);
  // The sweep's part: drops a held sync step not whole within --step_max_wait_s of its start.
  void expire_step_sums(Clock::time_point now);
  // DENSE: a read's or an add's reply is checked against the frame limit and reserved first.
  Reply dense(const FrameHeader& header, const std::vector<uint8_t>& payload,
              const ReserveReply& reserve, const RequestOrigin& origin);
  // A retried DENSE add (applied before): the range read again under the dense lock, not added.
  Reply dense_reread(const FrameHeader& header, const std::vector<uint8_t>& payload,
                     const ReserveReply& reserve, const RequestOrigin& origin);
  Reply dense_request(const FrameHeader& header, DenseRequest request, const ReserveReply& reserve,
                      const RequestOrigin& origin);

  HostTier* table_;
  PsStore ps_store_;         // the PS modes' row locks and dense tables
  PsStepSums ps_step_sums_;  // the sync mode's step of several trainers, until it is whole
  const ServerOptions options_;
  // Every SAVE and LOAD goes through it (io/rooted_env.hpp): opened on data_dir at start; null
  // when data_dir could not be opened (data_env_error_ says why, and SAVE/LOAD fail with it).
  std::unique_ptr<io::RootedEnv> data_env_;
  Status data_env_error_;
  const uint64_t instance_id_;
  const std::size_t max_connections_;
  std::atomic<uint64_t> generation_{0};  // of the model last loaded; 0: none
  const std::size_t max_unauthenticated_;
  const std::size_t max_barrier_waiters_;
  const Clock::duration frame_grace_;
  ByteBudget budget_;
  AuthBackoff auth_backoff_;
  RequestWindow window_;
  LogThrottle accept_log_{std::chrono::seconds(2)};
  Mutex sessions_mu_;
  std::map<uint64_t, std::weak_ptr<Session>> sessions_ GPUBOX_GUARDED_BY(sessions_mu_);
  std::atomic<uint64_t> admitted_{0};  // slots held (reserve_slot)
  // Held by admit_waiting across its census and claim (taken before sessions_mu_).
  Mutex share_mu_;
  // Until when a new connection at the cap is refused without a fair share's census: none found
  // a slot for it at the last one (may_wait_over_cap; accept() only, one accept at a time).
  Clock::time_point no_share_until_{};
  std::atomic<uint64_t> next_serial_{1};
  // Declared before io_: sessions destroyed with the io_context still reach the counters above.
  asio::io_context io_;
  // After io_: stopped (its job finished) before io_, to which a job's end is posted, goes.
  BulkWorker bulk_;
  asio::strand<asio::io_context::executor_type> accept_strand_;
  tcp::acceptor acceptor_;                 // used on accept_strand_
  asio::steady_timer accept_pause_timer_;  // used on accept_strand_
  Clock::duration accept_pause_{};         // used on accept_strand_
  int reserve_fd_ = -1;                    // used on accept_strand_
  asio::steady_timer sweep_timer_;         // used on accept_strand_
  Clock::duration sweep_interval_{};
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
  std::once_flag joined_;
  std::atomic<bool> stopped_{false};
  uint16_t port_ = 0;
  // exit_when_job_ends: when the job-end barrier completed (Clock ticks; 0: not yet). The sweep
  // stops the server once no connection is open, or kJobEndGrace after it.
  std::atomic<Clock::rep> job_ended_at_{0};

  struct Waiter {
    std::shared_ptr<Session> session;
    FrameHeader header;
  };
  struct Barrier {
    uint32_t parties = 0;
    std::vector<Waiter> waiters;
  };
  mutable Mutex barrier_mu_;
  std::map<std::string, Barrier> barriers_ GPUBOX_GUARDED_BY(barrier_mu_);
  std::size_t barrier_waiters_ GPUBOX_GUARDED_BY(barrier_mu_) = 0;  // over all barriers
};

}  // namespace gpubox::table::server
