#include "table/server/transport.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <sstream>
#include <thread>
#include <utility>

#include "table/server/auth_handshake.hpp"

namespace gpubox::table::server {
namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Whether a connect (and its AUTH) ended by timing out at `deadline` (Connection's own timeout:
// its poll reached the deadline); any other error is the peer's or the socket's own.
bool cut_by(const Status& error, Clock::time_point deadline) {
  return Connection::timed_out(error) && Clock::now() >= deadline;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, seconds)));
}

}  // namespace

// ---- Transport --------------------------------------------------------------------------------

struct Transport::Pool {
  Mutex mu;
  std::vector<Connection> idle GPUBOX_GUARDED_BY(mu);
};

// One connection's share of a run(): the requests it sends, in order, and its read state.
struct Transport::Attempt {
  uint32_t endpoint = 0;
  Connection conn;
  bool reused = false;
  std::vector<std::size_t> queue;  // request indices, sent in this order
  std::size_t next_send = 0;       // queue position of the frame being sent
  std::size_t sent_bytes = 0;      // of that frame
  std::deque<std::size_t> in_flight;
  uint8_t head[kHeaderBytes] = {};
  std::size_t head_got = 0;
  FrameHeader reply;
  std::vector<uint8_t> payload;
  std::size_t payload_got = 0;
  std::size_t replies = 0;
  std::vector<std::size_t> retry_later;  // answered "retry later" (server busy, still applying)
  Status retry_reason;                   // the last such answer
  bool notice = false;                   // the frame being read is a notice (protocol.hpp)
  bool progress = false;                 // ... is a PROGRESS frame (the reply follows it)
  bool progressed = false;               // a PROGRESS frame came (drive() takes it)
  bool heard = false;                    // a frame from the server came (it is reachable)
  bool failed = false;
  bool cut = false;  // failed because the call's deadline came (drive), not by an error of its own
  Status error;

  bool finished() const { return failed || (next_send == queue.size() && in_flight.empty()); }
  void fail(Status st) {
    failed = true;
    error = std::move(st);
    conn.close();
  }

  // Writes queued frames until the socket is full or max_in_flight replies are awaited.
  void send_some(const std::vector<OutgoingRequest>& requests, std::size_t max_in_flight) {
    while (next_send < queue.size() && (sent_bytes > 0 || in_flight.size() < max_in_flight)) {
      const auto& frame = requests[queue[next_send]].frame;
      const ssize_t k =
          ::send(conn.fd(), frame.data() + sent_bytes, frame.size() - sent_bytes, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          fail(Status::Unavailable(errno_text("send")));
        }
        return;
      }
      sent_bytes += static_cast<std::size_t>(k);
      if (sent_bytes == frame.size()) {
        in_flight.push_back(queue[next_send]);
        ++next_send;
        sent_bytes = 0;
      }
    }
  }

  // Reads what the socket holds and hands each complete reply to on_reply. A broken connection
  // or a reply that does not match the request in flight fails the attempt (to be retried); an
  // error reply from the server, or from on_reply, is returned (the call ends with it).
  Status receive_some(Op op, const std::vector<OutgoingRequest>& requests,
                      uint32_t max_payload_bytes, const ReplyHandler& on_reply) {
    for (;;) {
      const bool in_head = head_got < kHeaderBytes;
      uint8_t* dst = in_head ? head + head_got : payload.data() + payload_got;
      const std::size_t want = in_head ? kHeaderBytes - head_got : payload.size() - payload_got;
      ssize_t k = 0;
      if (want > 0) {
        k = ::recv(conn.fd(), dst, want, 0);
        if (k == 0) {
          fail(Status::Unavailable("connection closed by the server"));
          return Status::OK();
        }
        if (k < 0) {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            fail(Status::Unavailable(errno_text("recv")));
          }
          return Status::OK();
        }
      }
      if (in_head) {
        head_got += static_cast<std::size_t>(k);
        if (head_got < kHeaderBytes) continue;
        auto header = decode_header(head, kHeaderBytes, max_payload_bytes);
        if (!header.ok()) {
          fail(header.status());
          return Status::OK();
        }
        heard = true;
        notice = is_notice(*header);
        progress = !notice && is_progress(*header);
        if (!notice && (in_flight.empty() || !header->response || (header->op != op && !progress) ||
                        header->request_id != requests[in_flight.front()].request_id)) {
          fail(Status::Corruption("reply does not match the request in flight"));
          return Status::OK();
        }
        if (progress && header->payload_bytes != kProgressPayloadBytes) {
          fail(Status::Corruption("PROGRESS frame of " + std::to_string(header->payload_bytes) +
                                  " bytes"));
          return Status::OK();
        }
        reply = *header;
        payload.resize(header->payload_bytes);
        payload_got = 0;
      } else {
        payload_got += static_cast<std::size_t>(k);
      }
      if (payload_got < payload.size()) continue;
      if (notice) {  // the server closes the connection; the requests in flight are retried
        fail(notice_status(reply, payload.data(), payload.size()));
        return Status::OK();
      }
      head_got = 0;
      if (progress) {  // the request is still being worked on: its reply comes later
        const auto note = decode_progress(payload.data(), payload.size());
        if (!note.ok() || reply.status != Status::Code::kOk) {
          fail(note.ok() ? Status::Corruption("a PROGRESS frame with status " +
                                              std::string(Status::code_name(reply.status)))
                         : note.status());
          return Status::OK();
        }
        progressed = true;
        continue;
      }
      // A whole reply.
      const std::size_t index = in_flight.front();
      in_flight.pop_front();
      ++replies;
      if (reply.status == Status::Code::kAborted) {
        // The server is busy, or a retried mutation races its original: later.
        retry_later.push_back(index);
        retry_reason = decode_error_reply(reply, payload.data(), payload.size());
      } else if (reply.status != Status::Code::kOk) {
        return decode_error_reply(reply, payload.data(), payload.size());
      } else {
        GPUBOX_RETURN_IF_ERROR(on_reply(index, payload.data(), payload.size()));
      }
      if (finished()) return Status::OK();
    }
  }
};

Transport::Transport(std::vector<Endpoint> endpoints, TransportOptions options)
    : endpoints_(std::move(endpoints)), options_(std::move(options)) {
  GPUBOX_EXPECTS(!endpoints_.empty(), "Transport without endpoints");
  GPUBOX_EXPECTS(options_.max_in_flight >= 1, "max_in_flight must be at least 1");
  for (std::size_t i = 0; i < endpoints_.size(); ++i) pools_.push_back(std::make_unique<Pool>());
}

Transport::~Transport() = default;

uint64_t Transport::next_request_id() {
  MutexLock lock(id_mu_);
  return next_id_++;
}

OutgoingRequest Transport::make_request(Op op, uint32_t endpoint,
                                        const std::vector<uint8_t>& payload, uint64_t request_id) {
  FrameHeader h;
  h.op = op;
  h.request_id = request_id != 0 ? request_id : next_request_id();
  h.client_id = options_.client_id;
  OutgoingRequest req;
  req.endpoint = endpoint;
  req.request_id = h.request_id;
  req.frame = encode_frame(h, payload);
  return req;
}

StatusOr<Connection> Transport::acquire(uint32_t endpoint, Clock::time_point deadline,
                                        bool allow_pooled, bool* reused, bool* opened,
                                        bool* heard) {
  if (allow_pooled) {
    MutexLock lock(pools_[endpoint]->mu);
    auto& idle = pools_[endpoint]->idle;
    if (!idle.empty()) {
      Connection conn = std::move(idle.back());
      idle.pop_back();
      *reused = true;
      *opened = true;
      return conn;
    }
  }
  *reused = false;
  const auto connect_deadline = std::min(deadline, after(options_.connect_timeout_s));
  auto conn = Connection::open(endpoints_[endpoint], connect_deadline, options_.keepalive);
  if (!conn.ok()) return conn;
  *opened = true;
  if (!options_.auth_token.empty()) {
    GPUBOX_RETURN_IF_ERROR(authenticate(*conn, connect_deadline, heard));
  }
  if (options_.on_connect) {
    GPUBOX_RETURN_IF_ERROR(options_.on_connect(endpoint, *conn, connect_deadline));
  }
  return conn;
}

Status Transport::authenticate(Connection& conn, Clock::time_point deadline, bool* heard) {
  // Challenge-response (auth_handshake.hpp): the token itself never crosses the wire.
  FrameHeader ask;
  ask.op = Op::kAuth;
  ask.request_id = next_request_id();
  ask.client_id = options_.client_id;
  auto challenge = conn.call(ask, {}, options_.max_payload_bytes, deadline, heard);
  if (!challenge.ok()) return challenge.status();
  auto nonce = decode_auth_challenge(challenge->data(), challenge->size());
  if (!nonce.ok()) return nonce.status();
  const AuthProof proof = auth_proof(options_.auth_token, *nonce, options_.client_id);
  FrameHeader answer = ask;
  answer.op = Op::kAuthProof;
  answer.request_id = next_request_id();
  auto reply = conn.call(answer, std::vector<uint8_t>(proof.begin(), proof.end()),
                         options_.max_payload_bytes, deadline, heard);
  return reply.ok() ? Status::OK() : reply.status();
}

void Transport::release(uint32_t endpoint, Connection connection) {
  MutexLock lock(pools_[endpoint]->mu);
  if (pools_[endpoint]->idle.size() < options_.max_idle_per_endpoint) {
    pools_[endpoint]->idle.push_back(std::move(connection));
  }
}

// One run() call's retry book: per endpoint, the tries so far, the backoff, when it may be tried
// again, its last error and its deadline; per request, whether it is answered.
struct Transport::RunState {
  // by_progress: `budget` bounds the time without a sign of progress from an endpoint
  // (run_with_progress), else the whole call.
  RunState(Op op, bool retry, double budget, std::size_t requests, const Transport& transport,
           bool by_progress = false)
      : op(op),
        retry(retry),
        budget(budget),
        by_progress(by_progress),
        start(Clock::now()),
        deadlines(transport.endpoints_.size(), after(budget)),
        done(requests, 0),
        tries(transport.endpoints_.size(), 0),
        backoff(transport.endpoints_.size(), transport.options_.initial_backoff_s),
        next_try(transport.endpoints_.size(), start),
        unreachable_since(transport.endpoints_.size()),
        last_error(transport.endpoints_.size()),
        cut_error(transport.endpoints_.size()),
        heard(transport.endpoints_.size(), 0),
        endpoints(transport.endpoints_),
        max_backoff_s(transport.options_.max_backoff_s),
        unreachable_s(transport.options_.unreachable_s) {}

  // The requests not answered yet, by endpoint; `any` says whether there are some.
  std::vector<std::vector<std::size_t>> pending(const std::vector<OutgoingRequest>& requests,
                                                bool* any) const {
    std::vector<std::vector<std::size_t>> by_endpoint(endpoints.size());
    *any = false;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (done[i]) continue;
      by_endpoint[requests[i].endpoint].push_back(i);
      *any = true;
    }
    return by_endpoint;
  }

  // The code says what ended the call: DeadlineExceeded when its deadline did (a call with
  // retries that tried to the end, or one without whose attempt the deadline `cut`), so that a
  // caller tells a wait that ran out (a BARRIER) from a lost server by code; Unavailable when a
  // lost connection ended a call without retries, or when it gave up for unreachable_s
  // (`reach` kUnreachable), before the deadline.
  enum class Reach { kReached, kUnreachable };        // for unreachable_s
  enum class LastAttempt { kEnded, kCutByDeadline };  // ended by the call's deadline?
  Status gave_up(uint32_t e, Reach reach = Reach::kReached,
                 LastAttempt last = LastAttempt::kEnded) const {
    const bool unreachable = reach == Reach::kUnreachable;
    const bool cut = last == LastAttempt::kCutByDeadline;
    std::ostringstream msg;
    msg << op_name(op) << " to " << endpoints[e].to_string() << ": gave up after "
        << seconds_since(start) << " s and " << tries[e] << " attempt(s) ("
        << (by_progress ? "no progress reported for " : "deadline ") << budget << " s";
    if (unreachable) msg << "; no attempt reached it for " << unreachable_s << " s";
    msg << "); last error: " << last_error[e].to_string();
    if (!cut_error[e].ok()) {
      msg << " (then the deadline cut an attempt: " << cut_error[e].to_string() << ")";
    }
    const bool deadline_ended_it = retry ? !unreachable : cut;
    return deadline_ended_it ? Status::DeadlineExceeded(msg.str()) : Status::Unavailable(msg.str());
  }

  // An attempt's error becomes the endpoint's last error, unless the call's deadline cut the
  // attempt (`cut`: drive() or the connect ended it at the deadline, not an error landing after
  // it) after an earlier one had failed: that earlier error (a refusal, "server busy") says why
  // the call was still retrying, and the cut attempt is named beside it.
  void record(uint32_t e, Status error, bool cut) {
    if (cut && !last_error[e].ok()) {
      cut_error[e] = std::move(error);
    } else {
      last_error[e] = std::move(error);
    }
  }

  // An attempt on endpoint `e` begun at `tried_at` reached it (`reached`) or not: whether the
  // endpoint has now been unreachable for unreachable_s.
  bool note_reach(uint32_t e, bool reached, Clock::time_point tried_at) {
    if (reached) {
      unreachable_since[e] = Clock::time_point{};
    } else if (unreachable_since[e] == Clock::time_point{}) {
      unreachable_since[e] = tried_at;
    }
    return unreachable(e);
  }
  bool unreachable(uint32_t e) const {
    return unreachable_s >= 0 && unreachable_since[e] != Clock::time_point{} &&
           seconds_since(unreachable_since[e]) >= unreachable_s;
  }

  // The endpoint's deadline, and a sign of progress from it (a PROGRESS frame; not a "retry
  // later" answer, see settle()), which moves it on when the call is bounded by progress.
  Clock::time_point deadline(uint32_t e) const { return deadlines[e]; }
  void progressed(uint32_t e) {
    if (by_progress) deadlines[e] = after(budget);
  }

  void schedule_retry(uint32_t e) {
    next_try[e] = after(backoff[e]);
    backoff[e] = std::min(backoff[e] * 2.0, max_backoff_s);
  }

  const Op op;
  const bool retry;
  const double budget;
  const bool by_progress;
  const Clock::time_point start;
  std::vector<Clock::time_point> deadlines;  // per endpoint (all alike unless by_progress)
  std::vector<char> done;
  std::vector<int> tries;
  std::vector<double> backoff;
  std::vector<Clock::time_point> next_try;
  // When the attempts that did not reach the endpoint began (none since: the epoch).
  std::vector<Clock::time_point> unreachable_since;
  std::vector<Status> last_error;
  std::vector<Status> cut_error;  // an attempt the deadline cut after last_error (record)
  std::vector<char> heard;        // a frame from the endpoint came during the call
  const std::vector<Endpoint>& endpoints;
  const double max_backoff_s;
  const double unreachable_s;
};

Status Transport::drive(RunState& state, std::vector<Attempt>& attempts,
                        std::vector<OutgoingRequest>& requests, const ReplyHandler& on_reply) {
  const Op op = state.op;
  const std::size_t max_in_flight = static_cast<std::size_t>(options_.max_in_flight);
  std::vector<pollfd> fds;
  std::vector<Attempt*> active;
  for (;;) {
    fds.clear();
    active.clear();
    auto wake = Clock::time_point::max();
    for (auto& a : attempts) {
      if (a.finished()) continue;
      short events = POLLIN;
      if (a.next_send < a.queue.size() &&
          (a.sent_bytes > 0 || a.in_flight.size() < max_in_flight)) {
        events |= POLLOUT;
      }
      fds.push_back(pollfd{a.conn.fd(), events, 0});
      active.push_back(&a);
      wake = std::min(wake, state.deadline(a.endpoint));
    }
    if (active.empty()) return Status::OK();
    const int wait_ms = ms_until(wake);
    const int ready = wait_ms > 0 ? ::poll(fds.data(), fds.size(), wait_ms) : 0;
    if (ready < 0 && errno == EINTR) continue;
    const auto now = ready < 0 ? Clock::time_point::max() : Clock::now();  // a failed poll: all cut
    bool any_cut = false;
    for (std::size_t i = 0; i < active.size(); ++i) {
      Attempt& a = *active[i];
      const short revents = ready > 0 ? fds[i].revents : 0;
      if (revents == 0 && now >= state.deadline(a.endpoint)) {  // cut by the call's deadline
        a.fail(Status::DeadlineExceeded(state.by_progress ? "no progress before the deadline"
                                                          : "no reply before the deadline"));
        a.cut = true;
        any_cut = true;
        continue;
      }
      if (revents & POLLOUT) a.send_some(requests, max_in_flight);
      if (a.failed || !(revents & (POLLIN | POLLHUP | POLLERR))) continue;
      GPUBOX_RETURN_IF_ERROR(a.receive_some(op, requests, options_.max_payload_bytes, on_reply)
                                 .with_context(std::string(op_name(op)) + " at " +
                                               endpoints_[a.endpoint].to_string()));
      if (a.progressed) {
        state.progressed(a.endpoint);
        progress_frames_.fetch_add(1, std::memory_order_relaxed);
      }
      a.progressed = false;
    }
    if (!any_cut) continue;
    // The call gives up on the endpoint its deadline passed for (run_until_done): the attempts
    // still going (other servers', which kept reporting progress) end with it, unpooled.
    for (Attempt* a : active) {
      if (a->finished()) continue;
      a->fail(Status::Aborted("ended with the call, cut at another server's deadline"));
      a->cut = true;
    }
    return Status::OK();
  }
}

Status Transport::open_attempts(RunState& state, uint32_t e,
                                const std::vector<std::size_t>& pending,
                                const std::vector<OutgoingRequest>& requests, int connections,
                                std::vector<Attempt>* attempts) {
  ++state.tries[e];
  // One connection per lane in use (lanes folded onto `connections`), each in request order.
  const auto lanes = static_cast<std::size_t>(std::max(1, connections));
  std::vector<std::vector<std::size_t>> queues(lanes);
  for (std::size_t i : pending) queues[requests[i].lane % lanes].push_back(i);
  for (auto& queue : queues) {
    if (queue.empty()) continue;
    bool reused = false;
    bool opened = false;
    bool heard = false;
    const auto tried_at = Clock::now();
    // Without retries, a pooled connection the server closed meanwhile would fail the call.
    auto conn =
        acquire(e, state.deadline(e), /*allow_pooled=*/state.retry, &reused, &opened, &heard);
    if (heard) state.heard[e] = 1;
    // A connection that opened reached a live server, even if its handshake then timed out.
    const bool unreachable = state.note_reach(e, opened || heard, tried_at);
    if (!conn.ok()) {
      const bool cut = cut_by(conn.status(), state.deadline(e));
      state.record(e, conn.status(), cut);
      const auto code = conn.status().code();
      if (code == Status::Code::kPermissionDenied || code == Status::Code::kInvalidArgument ||
          code == Status::Code::kAborted) {
        return with_token_hint(conn.status(), !options_.auth_token.empty())
            .with_context(std::string(op_name(state.op)) + " at " + endpoints_[e].to_string());
      }
      if (!state.retry || unreachable) {
        return state.gave_up(
            e, unreachable ? RunState::Reach::kUnreachable : RunState::Reach::kReached,
            cut ? RunState::LastAttempt::kCutByDeadline : RunState::LastAttempt::kEnded);
      }
      state.schedule_retry(e);
      return Status::OK();  // the lanes not started wait for the retry
    }
    Attempt a;
    a.endpoint = e;
    a.conn = std::move(*conn);
    a.reused = reused;
    a.queue = std::move(queue);
    attempts->push_back(std::move(a));
  }
  return Status::OK();
}

Status Transport::settle(RunState& state, std::vector<Attempt>& attempts) {
  for (auto& a : attempts) {
    if (a.heard) state.heard[a.endpoint] = 1;
    if (!a.failed) {
      if (!a.retry_later.empty()) {
        state.last_error[a.endpoint] = a.retry_reason;  // e.g. "server busy: in-flight budget"
        // Not progress: a server busy for longer than the bound (its worker full of other
        // clients' saves, or the in-flight budget) is given up on as one that does not move.
        state.schedule_retry(a.endpoint);
      }
      release(a.endpoint, std::move(a.conn));
      continue;
    }
    state.record(a.endpoint, a.error, a.cut);
    if (!state.retry) {
      return state.gave_up(
          a.endpoint, RunState::Reach::kReached,
          a.cut ? RunState::LastAttempt::kCutByDeadline : RunState::LastAttempt::kEnded);
    }
    if (a.reused && a.replies == 0) {
      // A pooled connection the server closed meanwhile (e.g. it restarted): the pool may hold
      // more such; reconnecting at once is not a retry of a failing server.
      MutexLock lock(pools_[a.endpoint]->mu);
      pools_[a.endpoint]->idle.clear();
      state.next_try[a.endpoint] = Clock::now();
    } else {
      state.schedule_retry(a.endpoint);
    }
  }
  return Status::OK();
}

Status Transport::run(Op op, std::vector<OutgoingRequest>& requests, const ReplyHandler& on_reply,
                      bool retry, double deadline_s, int connections, bool* heard) {
  if (heard != nullptr) *heard = false;
  if (requests.empty()) return Status::OK();
  RunState state(op, retry, deadline_s >= 0 ? deadline_s : options_.deadline_s, requests.size(),
                 *this);
  const Status st = run_until_done(state, requests, on_reply, connections);
  if (heard != nullptr) {
    *heard = std::any_of(state.heard.begin(), state.heard.end(), [](char h) { return h != 0; });
  }
  return st;
}

Status Transport::run_with_progress(Op op, std::vector<OutgoingRequest>& requests,
                                    const ReplyHandler& on_reply, double silence_s) {
  if (requests.empty()) return Status::OK();
  RunState state(op, /*retry=*/true, silence_s >= 0 ? silence_s : options_.deadline_s,
                 requests.size(), *this, /*by_progress=*/true);
  return run_until_done(state, requests, on_reply, /*connections=*/1);
}

Status Transport::run_until_done(RunState& state, std::vector<OutgoingRequest>& requests,
                                 const ReplyHandler& on_reply, int connections) {
  // Replies are handled as they come, so record them in `done` through the handler.
  const ReplyHandler mark = [&](std::size_t index, const uint8_t* data, std::size_t bytes) {
    GPUBOX_RETURN_IF_ERROR(on_reply(index, data, bytes));
    state.done[index] = 1;
    return Status::OK();
  };
  for (;;) {
    bool any = false;
    const auto pending = state.pending(requests, &any);
    if (!any) return Status::OK();
    const auto now = Clock::now();
    for (uint32_t e = 0; e < pending.size(); ++e) {
      if (!pending[e].empty() && now >= state.deadline(e)) return state.gave_up(e);
    }
    std::vector<Attempt> attempts;
    for (uint32_t e = 0; e < pending.size(); ++e) {
      if (pending[e].empty() || now < state.next_try[e]) continue;
      GPUBOX_RETURN_IF_ERROR(open_attempts(state, e, pending[e], requests, connections, &attempts));
    }
    if (!attempts.empty()) {
      GPUBOX_RETURN_IF_ERROR(drive(state, attempts, requests, mark));
      GPUBOX_RETURN_IF_ERROR(settle(state, attempts));
    }
    // Sleep until the earliest endpoint with work left may be retried (never past its deadline).
    const auto left = state.pending(requests, &any);
    if (!any) return Status::OK();
    auto wake = Clock::time_point::max();
    for (uint32_t e = 0; e < left.size(); ++e) {
      if (!left[e].empty()) wake = std::min({wake, state.next_try[e], state.deadline(e)});
    }
    if (wake > Clock::now()) std::this_thread::sleep_until(wake);
  }
}

}  // namespace gpubox::table::server
