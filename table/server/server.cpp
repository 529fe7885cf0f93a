#include "table/server/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <random>
#include <utility>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "table/io/rooted_env.hpp"
#include "table/server/auth_handshake.hpp"
#include "table/server/model_path.hpp"
#include "table/server/server_impl.hpp"
#include "table/server/session.hpp"

namespace gpubox::table::server {
namespace {

constexpr auto kFirstAcceptPause = std::chrono::milliseconds(100);
constexpr auto kLastAcceptPause = std::chrono::seconds(1);

uint64_t random_instance_id() {
  std::random_device rd;
  const auto now =
      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  const uint64_t id = mix64((static_cast<uint64_t>(rd()) << 32 ^ rd()) ^ fmix64(now) ^
                            (static_cast<uint64_t>(::getpid()) << 20));
  return id == 0 ? 1 : id;
}

std::size_t effective_max_connections(const ServerOptions& options) {
  if (options.max_connections > 0) return options.max_connections;
  return default_max_connections(open_files_limit().soft);
}

// 0 in `value`: half of the connection cap, at least 1.
std::size_t half_of_cap_unless(std::size_t value, std::size_t max_connections) {
  return value > 0 ? value : std::max<std::size_t>(1, max_connections / 2);
}

// A quarter of the shortest deadline in force, between 10 ms and 250 ms: how late the sweep may
// notice one.
std::chrono::steady_clock::duration sweep_interval(const ServerOptions& o) {
  double shortest = std::min(o.frame_deadline_s, o.barrier_timeout_s);
  if (!o.auth_token.empty()) shortest = std::min(shortest, o.auth_timeout_s);
  if (o.idle_timeout_s > 0) shortest = std::min(shortest, o.idle_timeout_s);
  return steady_seconds(std::clamp(shortest / 4, 0.01, 0.25));
}

// The deadlines and rates of `o` that must be positive and finite, as an error naming the first
// that is not.
Status check_deadline_options(const ServerOptions& o) {
  const std::pair<const char*, double> positive[] = {
      {"frame_deadline_s", o.frame_deadline_s},
      {"min_transfer_bytes_per_s", o.min_transfer_bytes_per_s},
      {"auth_timeout_s", o.auth_timeout_s},
      {"barrier_timeout_s", o.barrier_timeout_s},
      {"auth_backoff_max_s", o.auth_backoff_max_s},
      {"dense_write_max_idle_s", o.dense_write_max_idle_s},
      {"step_max_wait_s", o.step_max_wait_s},
      {"progress_interval_s", o.progress_interval_s},
      {"max_io_stall_s", o.max_io_stall_s}};
  for (const auto& [name, value] : positive) {
    if (!(value > 0) || !std::isfinite(value)) {
      return Status::InvalidArgument(std::string(name) + " must be a positive number, not " +
                                     std::to_string(value));
    }
  }
  if (!(o.idle_timeout_s >= 0) || !(o.auth_backoff_base_s >= 0) ||
      !std::isfinite(o.idle_timeout_s) || !std::isfinite(o.auth_backoff_base_s)) {
    return Status::InvalidArgument("idle_timeout_s and auth_backoff_base_s must be >= 0");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::string> resolve_model_path(const ServerOptions& options, const std::string& path) {
  const std::string shard =
      options.shard_num > 1 ? "server-" + std::to_string(options.shard_id) : std::string();
  return model_path_in_data_dir(options.data_dir, path, shard);
}

StatusOr<std::string> load_before_start(HostTier* table, const ServerOptions& options,
                                        const std::string& path) {
  auto folder = resolve_model_path(options, path);
  if (!folder.ok()) return folder.status();
  auto env = io::RootedEnv::open(options.data_dir);
  if (!env.ok()) return env.status().with_context("data_dir");
  GPUBOX_RETURN_IF_ERROR(table->load(*folder, env->get()));
  return folder;
}

Reply make_reply(const FrameHeader& request, Status::Code code, std::vector<uint8_t> payload) {
  FrameHeader h = request;
  h.response = true;
  h.status = code;
  Reply reply;
  reply.frame = encode_frame(h, payload);
  reply.status = code;
  return reply;
}

Reply error_reply(const FrameHeader& request, const Status& status) {
  std::vector<uint8_t> payload;
  encode_error_reply(status.message(), &payload);
  Reply reply = make_reply(request, status.code(), std::move(payload));
  reply.error = status.message();
  return reply;
}

bool ByteBudget::try_take(std::size_t n, std::size_t held) {
  // A connection that would hold more than a small share may not take from the reserve.
  const bool small = held + n <= small_holder();
  const std::size_t cap = small ? limit_ : limit_ - reserve();
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > cap || used > cap - n) return false;
  } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  trim_.held(used + n);
  return true;
}

void ByteBudget::give_back(std::size_t n) {
  const std::size_t left = used_.fetch_sub(n, std::memory_order_relaxed) - n;
  if (trim_.drained_to(left)) return_freed_memory();
}

// ---- Impl ------------------------------------------------------------------------------------

Server::Impl::Impl(HostTier* table, ServerOptions options)
    : table_(table),
      // From `options` itself: ps_store_ is made before options_.
      ps_store_(DenseLimits{options.max_dense_bytes, steady_seconds(options.dense_write_max_idle_s),
                            options.min_transfer_bytes_per_s}),
      ps_step_sums_(
          StepSumsLimits{options.max_step_bytes, steady_seconds(options.step_max_wait_s)}),
      options_(std::move(options)),
      instance_id_(random_instance_id()),
      max_connections_(effective_max_connections(options_)),
      max_unauthenticated_(half_of_cap_unless(options_.max_unauthenticated, max_connections_)),
      max_barrier_waiters_(half_of_cap_unless(options_.max_barrier_waiters, max_connections_)),
      frame_grace_(steady_seconds(options_.frame_deadline_s)),
      budget_(options_.max_inflight_bytes),
      auth_backoff_(options_.auth_backoff_base_s, options_.auth_backoff_max_s),
      window_(options_.dedup_max_bytes,
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                  std::clamp(options_.dedup_max_age_s, 1e-3, 8.64e6))),
              options_.dedup_max_client_bytes > 0 ? options_.dedup_max_client_bytes
                                                  : options_.dedup_max_bytes / 8),
      accept_strand_(asio::make_strand(io_)),
      acceptor_(accept_strand_),
      accept_pause_timer_(accept_strand_),
      sweep_timer_(accept_strand_),
      sweep_interval_(sweep_interval(options_)),
      work_(asio::make_work_guard(io_)) {
  // data_dir is opened once, here: a folder renamed or replaced by a link later does not move
  // where saves go (io/rooted_env.hpp).
  if (!options_.data_dir.empty()) {
    std::error_code ec;  // a missing data_dir is made (its parent is the operator's choice)
    std::filesystem::create_directories(options_.data_dir, ec);
  }
  auto env = io::RootedEnv::open(options_.data_dir);
  if (env.ok()) {
    data_env_ = std::move(env).value();
    if (!options_.loaded_model.empty()) {
      // An absolute path inside data_dir (what callers gave before it was relative) names the
      // same folder.
      auto folder = model_path_in_data_dir(options_.data_dir, options_.loaded_model, "");
      generation_ =
          model_generation(data_env_.get(), folder.ok() ? *folder : options_.loaded_model);
    }
  } else {
    data_env_error_ = env.status().with_context("the server's data_dir");
    GPUBOX_LOG(WARNING) << "gpubox_server: " << data_env_error_.to_string()
                        << "; SAVE and LOAD will fail";
  }
}

Server::Impl::~Impl() {
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
}

std::size_t Server::Impl::connection_buffer_limit(bool authenticated) const {
  if (!authenticated) return kMaxAuthPayloadBytes;
  return options_.max_connection_buffer_bytes > 0 ? options_.max_connection_buffer_bytes
                                                  : options_.max_payload_bytes;
}

void Server::Impl::warn(LogThrottle& throttle, const std::string& line) {
  uint64_t held_back = 0;
  if (!throttle.allow(Clock::now(), &held_back)) return;
  if (held_back > 0) {
    GPUBOX_LOG(WARNING) << line << " (and " << held_back << " similar lines held back)";
  } else {
    GPUBOX_LOG(WARNING) << line;
  }
}

Status Server::Impl::listen() {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options_.bind_address, ec);
  if (ec)
    return Status::InvalidArgument("bad bind address '" + options_.bind_address +
                                   "': " + ec.message());
  if (options_.auth_token.empty() && !address.is_loopback()) {
    return Status::InvalidArgument(
        "bind address " + options_.bind_address +
        " is not loopback, and the server has no auth token: without a token it serves "
        "loopback only (give it --auth_token_file to serve other machines)");
  }
  tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Unavailable("cannot listen on " + options_.bind_address + ":" +
                               std::to_string(options_.port) + ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  asio::post(accept_strand_, [this] {
    accept();
    sweep();
  });
  return Status::OK();
}

void Server::Impl::accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](const boost::system::error_code& ec,
                                                        tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) return accept_failed(ec);
    accept_pause_ = {};
    connections.fetch_add(1, std::memory_order_relaxed);
    // On a token server a new connection is unauthenticated: at their cap (or at the connection
    // cap) it takes the slot of the oldest of them. A cap held by authenticated (or, without a
    // token, any) connections lets it wait beyond the cap for a fair share's slot when one may
    // be found (connection_share.hpp), which it takes only once bound to its client: an
    // unauthenticated connection never evicts an authenticated one. Else it is refused.
    const bool token = !options_.auth_token.empty();
    bool slot = reserve_slot();
    const bool unauthenticated_full = token && unauthenticated.load() >= max_unauthenticated_;
    bool admit = slot && !unauthenticated_full;
    if (!admit && token && evict_oldest_unauthenticated()) {
      admit = true;
      if (!slot) take_over_slot();  // the evicted one's
      slot = true;
    }
    bool waits = false;
    if (!admit && !slot) {
      boost::system::error_code peer_ec;
      const auto remote = socket.remote_endpoint(peer_ec);
      waits = !peer_ec && may_wait_over_cap(remote.address().to_string());
    }
    if (!admit && !waits) {
      if (slot) release_slot();
      refuse_connection(socket);
    } else {
      open_connections.fetch_add(1, std::memory_order_relaxed);
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      // A half-open peer is found in minutes (connection_limits.hpp); without keepalive only
      // --idle_timeout_s ends its session.
      if (const Status keepalive = enable_tcp_keepalive(socket.native_handle()); !keepalive.ok()) {
        warn(accept_log_, "gpubox_server: " + keepalive.to_string());
      }
      std::make_shared<Session>(this, std::move(socket), next_serial_.fetch_add(1), waits)->start();
    }
    accept();
  });
}

void Server::Impl::accept_failed(const boost::system::error_code& ec) {
  // Retrying at once would spin (the listening socket stays readable): pause, longer each time.
  accept_failures.fetch_add(1, std::memory_order_relaxed);
  if (ec == asio::error::no_descriptors || ec.value() == ENFILE) shed_waiting_connection();
  accept_pause_ = accept_pause_ == Clock::duration{}
                      ? Clock::duration(kFirstAcceptPause)
                      : std::min<Clock::duration>(2 * accept_pause_, kLastAcceptPause);
  warn(accept_log_,
       "gpubox_server: accept failed: " + ec.message() + " (" +
           std::to_string(open_connections.load()) + " connections open); pausing accepts for " +
           std::to_string(
               std::chrono::duration_cast<std::chrono::milliseconds>(accept_pause_).count()) +
           " ms");
  accept_pause_timer_.expires_after(accept_pause_);
  accept_pause_timer_.async_wait([this](const boost::system::error_code& timer_ec) {
    if (timer_ec || !acceptor_.is_open()) return;
    accept();
  });
}

void Server::Impl::shed_waiting_connection() {
  if (reserve_fd_ < 0) return;
  ::close(reserve_fd_);
  const int listener = acceptor_.native_handle();
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, 0) == 1) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      ::close(fd);
      refused_connections.fetch_add(1, std::memory_order_relaxed);
    }
  }
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void Server::Impl::run_threads() {
  const int n = std::max(1, options_.threads);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this] {
      for (;;) {
        try {
          io_.run();
          return;
        } catch (const std::exception& e) {
          // A handler threw (a table bug): log it, keep serving the other connections.
          GPUBOX_LOG(ERROR) << "gpubox_server: handler failed: " << e.what();
        }
      }
    });
  }
}

void Server::Impl::stop() {
  if (stopped_.exchange(true)) return;
  asio::post(accept_strand_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    accept_pause_timer_.cancel();
    sweep_timer_.cancel();
    work_.reset();
    io_.stop();
  });
}

void Server::Impl::wait() {
  std::call_once(joined_, [this] {
    for (auto& t : threads_) t.join();
    // No server thread is left to touch a session: the connections still open are closed now,
    // not when the Server is destroyed, so that a client waiting on a call learns at once. Those
    // whose SAVE or LOAD is queued or running are closed once the worker stopped: a SAVE under
    // way finishes first (the table is the caller's after wait()), while its client gets no
    // PROGRESS frame (the network threads ended): it reports the server after its bound without
    // progress (runner.server_timeout_s), or gets "server stopped" when the SAVE ended sooner;
    // either way the SAVE's reply is lost with the server, and its client's call fails.
    std::vector<std::shared_ptr<Session>> working;
    for (auto& session : live_sessions()) {
      if (session->working()) {
        working.push_back(std::move(session));
      } else {
        session->close_after_stop();
      }
    }
    if (options_.stopping_worker_hook) options_.stopping_worker_hook();
    bulk_.stop();  // queued ones are dropped
    for (const auto& session : working) session->close_after_stop();
  });
}

ServerCounters Server::Impl::counters() const {
  ServerCounters c;
  c.connections = connections.load();
  c.open_connections = open_connections.load();
  c.refused_connections = refused_connections.load();
  c.accept_failures = accept_failures.load();
  c.idle_closed = idle_closed.load();
  c.deadline_closed = deadline_closed.load();
  c.evicted = evicted.load();
  c.fair_share_evicted = fair_share_evicted.load();
  c.waiting_over_cap = over_cap.load();
  c.unauthenticated = unauthenticated.load();
  c.auth_failures = auth_failures.load();
  c.auth_proofs_waiting = proofs_waiting.load();
  c.auth_proofs_deferred = proofs_deferred.load();
  c.foreign_client_refusals = foreign_client_refusals.load();
  c.barrier_timeouts = barrier_timeouts.load();
  {
    MutexLock lock(barrier_mu_);
    c.barrier_waiters = barrier_waiters_;
  }
  c.requests = requests.load();
  c.duplicate_requests = duplicates.load();
  c.rows_pulled = rows_pulled.load();
  c.rows_pushed = rows_pushed.load();
  c.protocol_errors = protocol_errors.load();
  c.auth_refusals = auth_refusals.load();
  c.budget_refusals = budget_refusals.load();
  c.inflight_bytes = budget_.used();
  c.barrier_waiters_dropped = barrier_waiters_dropped.load();
  c.dedup_entries = window_.entries();
  c.bulk_queued = bulk_.queued();
  c.bulk_runs = bulk_.runs();
  c.bulk_skipped = bulk_.skipped();
  c.bulk_busy = bulk_.refused();
  c.bulk_attached = bulk_.attached();
  c.dedup_bytes = window_.bytes();
  c.dense_held_writes = ps_store_.held_writes();
  c.step_held_bytes = ps_step_sums_.held_bytes();
  c.steps_dropped = ps_step_sums_.dropped_steps();
  c.sweeps = sweeps.load(std::memory_order_acquire);  // after what the sweep did (sweep())
  return c;
}

// ---- BARRIER ---------------------------------------------------------------------------------

std::optional<Reply> Server::Impl::barrier_arrive(const std::shared_ptr<Session>& session,
                                                  const FrameHeader& header,
                                                  const std::vector<uint8_t>& payload,
                                                  std::string* name) {
  auto req = decode_barrier_request(payload.data(), payload.size());
  if (!req.ok()) return error_reply(header, req.status().with_context("BARRIER"));
  std::vector<Waiter> released;
  {
    MutexLock lock(barrier_mu_);
    Barrier& barrier = barriers_[req->name];
    // A waiter whose client left (its end closed, not yet noticed by its own session) must not
    // count: it would release the others early.
    const auto gone =
        std::remove_if(barrier.waiters.begin(), barrier.waiters.end(),
                       [](const Waiter& w) { return !w.session->peer_still_waiting(); });
    barrier_waiters_dropped.fetch_add(barrier.waiters.end() - gone, std::memory_order_relaxed);
    barrier_waiters_ -= static_cast<std::size_t>(barrier.waiters.end() - gone);
    barrier.waiters.erase(gone, barrier.waiters.end());
    if (!session->peer_still_waiting()) {  // sent BARRIER and left: it does not count either
      barrier_waiters_dropped.fetch_add(1, std::memory_order_relaxed);
      if (barrier.waiters.empty()) barriers_.erase(req->name);
      return error_reply(header, Status::Aborted("BARRIER '" + req->name + "': the client left"));
    }
    if (barrier_waiters_ >= max_barrier_waiters_ &&
        barrier.waiters.size() + 1 < std::max<uint32_t>(req->parties, barrier.parties)) {
      if (barrier.waiters.empty()) barriers_.erase(req->name);
      return error_reply(header,
                         Status::ResourceExhausted("BARRIER '" + req->name +
                                                   "': " + std::to_string(barrier_waiters_) +
                                                   " BARRIER waiters already, the server's limit "
                                                   "(--max_barrier_waiters)"));
    }
    if (!barrier.waiters.empty() && barrier.parties != req->parties) {
      return error_reply(
          header,
          Status::InvalidArgument("BARRIER '" + req->name + "': " + std::to_string(req->parties) +
                                  " parties, but " + std::to_string(barrier.parties) +
                                  " announced by those already waiting"));
    }
    barrier.parties = req->parties;
    if (barrier.waiters.size() + 1 < barrier.parties) {
      barrier.waiters.push_back(Waiter{session, header});
      ++barrier_waiters_;
      *name = req->name;
      return std::nullopt;
    }
    barrier_waiters_ -= barrier.waiters.size();
    released = std::move(barrier.waiters);
    barriers_.erase(req->name);
  }
  if (options_.exit_when_job_ends && req->name == kJobEndBarrier) {
    GPUBOX_LOG(INFO) << "gpubox_server: the job's " << req->parties
                     << " trainers ended it; exiting once they disconnect";
    job_ended_at_.store(std::max<Clock::rep>(1, Clock::now().time_since_epoch().count()));
  }
  for (auto& waiter : released) {
    waiter.session->release_barrier(make_reply(waiter.header, Status::Code::kOk, {}));
  }
  return make_reply(header, Status::Code::kOk, {});
}

bool Server::Impl::barrier_leave(const Session* session, const std::string& name) {
  MutexLock lock(barrier_mu_);
  auto it = barriers_.find(name);
  if (it == barriers_.end()) return false;
  auto& waiters = it->second.waiters;
  const auto gone = std::remove_if(waiters.begin(), waiters.end(),
                                   [&](const Waiter& w) { return w.session.get() == session; });
  const auto left = static_cast<std::size_t>(waiters.end() - gone);
  barrier_waiters_dropped.fetch_add(left, std::memory_order_relaxed);
  barrier_waiters_ -= left;
  waiters.erase(gone, waiters.end());
  if (waiters.empty()) barriers_.erase(it);
  return left > 0;
}

// ---- Server ----------------------------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  stop();
  wait();
}

StatusOr<std::unique_ptr<Server>> Server::start(HostTier* table, ServerOptions options) {
  GPUBOX_EXPECTS(table != nullptr, "Server::start without a table");
  if (options.shard_num == 0 || options.shard_id >= options.shard_num) {
    return Status::InvalidArgument("shard_id " + std::to_string(options.shard_id) +
                                   " is not below shard_num " + std::to_string(options.shard_num));
  }
  if (!options.auth_token.empty()) {
    GPUBOX_RETURN_IF_ERROR(check_token_strength(options.auth_token, "the server"));
  }
  GPUBOX_RETURN_IF_ERROR(check_deadline_options(options));
  if (options.max_inflight_bytes < kMaxAuthPayloadBytes) {
    return Status::InvalidArgument("max_inflight_bytes " +
                                   std::to_string(options.max_inflight_bytes) +
                                   " cannot hold even an AUTH frame");
  }
  if (options.dedup_max_client_bytes > options.dedup_max_bytes) {
    return Status::InvalidArgument(
        "dedup_max_client_bytes " + std::to_string(options.dedup_max_client_bytes) +
        " (gpubox_server --dedup_client_cache_mb) is over the whole retry cache, dedup_max_bytes " +
        std::to_string(options.dedup_max_bytes) +
        " (--dedup_cache_mb): one client's share is at most the cache; 0 takes an eighth of it");
  }
  auto impl = std::make_unique<Impl>(table, std::move(options));
  GPUBOX_RETURN_IF_ERROR(impl->listen());
  GPUBOX_RETURN_IF_ERROR(impl->bulk().start(impl->options().worker_start_fault));
  impl->run_threads();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

uint16_t Server::port() const { return impl_->port(); }
std::string Server::endpoint() const {
  return impl_->options().bind_address + ":" + std::to_string(impl_->port());
}
uint64_t Server::instance_id() const { return impl_->instance_id(); }
std::size_t Server::max_connections() const { return impl_->max_connections(); }
void Server::stop() { impl_->stop(); }
void Server::wait() { impl_->wait(); }
bool Server::stopped() const { return impl_->stopped(); }
ServerCounters Server::counters() const { return impl_->counters(); }

}  // namespace gpubox::table::server
