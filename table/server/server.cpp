#include "table/server/server.hpp"

#include <atomic>
#include <boost/asio.hpp>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "table/server/request_window.hpp"

namespace gpubox::table::server {

namespace asio = boost::asio;
using asio::ip::tcp;

StatusOr<std::string> resolve_model_path(const ServerOptions& options, const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("empty model path");
  std::filesystem::path p(path);
  for (const auto& part : p) {
    if (part == "..") return Status::InvalidArgument("model path '" + path + "' contains '..'");
  }
  if (p.is_relative() && !options.data_dir.empty()) p = std::filesystem::path(options.data_dir) / p;
  if (options.shard_num > 1) p /= "server-" + std::to_string(options.shard_id);
  return p.string();
}

namespace {

class Session;

// A reply on its way: the whole frame, and what to do once it is written.
struct Reply {
  std::vector<uint8_t> frame;
  bool close_after = false;
  bool stop_server_after = false;
};

Reply make_reply(const FrameHeader& request, Status::Code code, std::vector<uint8_t> payload) {
  FrameHeader h = request;
  h.response = true;
  h.status = code;
  Reply reply;
  reply.frame = encode_frame(h, payload);
  return reply;
}

Reply error_reply(const FrameHeader& request, const Status& status) {
  std::vector<uint8_t> payload;
  encode_error_reply(status.message(), &payload);
  return make_reply(request, status.code(), std::move(payload));
}

// A failed table call. Aborted on the wire means "retry later" (see handle()), so a table's own
// Aborted travels as Internal: the client must not retry it until its deadline.
Reply table_error_reply(const FrameHeader& request, const Status& status) {
  const std::string context = op_name(request.op);
  if (status.code() == Status::Code::kAborted) {
    return error_reply(request, Status::Internal(context + ": " + status.to_string()));
  }
  return error_reply(request, status.with_context(context));
}

bool is_mutation(Op op) {
  return op == Op::kPush || op == Op::kErase || op == Op::kShrink || op == Op::kSave ||
         op == Op::kLoad;
}

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

class Server::Impl {
 public:
  Impl(HostTier* table, ServerOptions options)
      : table_(table),
        options_(std::move(options)),
        window_(options_.dedup_per_client, options_.dedup_clients),
        acceptor_(io_),
        work_(asio::make_work_guard(io_)) {}

  Status listen();
  void run_threads();
  void stop();
  void wait();

  // Builds the reply of one decoded request (everything but BARRIER and AUTH).
  Reply handle(const FrameHeader& header, const std::vector<uint8_t>& payload);
  // BARRIER: the reply is posted to the session once `parties` sessions wait on the name.
  void barrier_arrive(const std::shared_ptr<Session>& session, const FrameHeader& header,
                      const std::vector<uint8_t>& payload);

  const ServerOptions& options() const { return options_; }
  uint16_t port() const { return port_; }
  bool stopped() const { return stopped_.load(); }
  ServerCounters counters() const;

  std::atomic<uint64_t> connections{0}, requests{0}, duplicates{0}, rows_pulled{0}, rows_pushed{0},
      protocol_errors{0}, auth_refusals{0};

 private:
  void accept();
  Status check_keys(const uint64_t* keys, std::size_t n) const;
  Reply apply(const FrameHeader& header, const std::vector<uint8_t>& payload);
  // PULL: rows are written by the table straight into the reply frame.
  Reply pull(const FrameHeader& header, const std::vector<uint8_t>& payload);

  HostTier* table_;
  const ServerOptions options_;
  RequestWindow window_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
  std::once_flag joined_;
  std::atomic<bool> stopped_{false};
  uint16_t port_ = 0;

  struct Waiter {
    std::shared_ptr<Session> session;
    FrameHeader header;
  };
  struct Barrier {
    uint32_t parties = 0;
    std::vector<Waiter> waiters;
  };
  std::mutex barrier_mu_;
  std::map<std::string, Barrier> barriers_;  // GUARDED_BY(barrier_mu_)
};

namespace {

// One connection: read a frame, answer it, repeat. Handlers of one session never overlap (one
// operation in flight at a time; a barrier release is posted to the socket's strand).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server::Impl* server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {
    boost::system::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ =
        ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
    authenticated_ = server_->options().auth_token.empty();
  }

  void start() { read_header(); }

  // Sends `reply` on this session's strand (from any thread).
  void post_reply(Reply reply) {
    auto self = shared_from_this();
    asio::post(socket_.get_executor(),
               [self, reply = std::move(reply)]() mutable { self->send(std::move(reply)); });
  }

 private:
  void read_header() {
    auto self = shared_from_this();
    asio::async_read(
        socket_, asio::buffer(header_bytes_),
        [self](const boost::system::error_code& ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(const boost::system::error_code& ec) {
    if (ec) {
      if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
        GPUBOX_LOG(INFO) << "gpubox_server: connection from " << peer_
                         << " ended: " << ec.message();
      }
      return close();
    }
    auto header = decode_header(header_bytes_, kHeaderBytes, server_->options().max_payload_bytes);
    if (!header.ok()) return protocol_error(header.status().to_string());
    if (header->response) return protocol_error("a response frame sent to the server");
    header_ = *header;
    payload_.resize(header_.payload_bytes);
    auto self = shared_from_this();
    asio::async_read(
        socket_, asio::buffer(payload_),
        [self](const boost::system::error_code& ec2, std::size_t) { self->on_payload(ec2); });
  }

  void on_payload(const boost::system::error_code& ec) {
    if (ec) {
      return protocol_error(std::string("truncated ") + op_name(header_.op) + " frame (" +
                            ec.message() + ")");
    }
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    if (!authenticated_) return authenticate();
    if (header_.op == Op::kAuth) return send(make_reply(header_, Status::Code::kOk, {}));
    if (header_.op == Op::kBarrier) {
      return server_->barrier_arrive(shared_from_this(), header_, payload_);
    }
    Reply reply = server_->handle(header_, payload_);
    if (server_->options().drop_reply && server_->options().drop_reply(header_)) {
      GPUBOX_LOG(INFO) << "gpubox_server: fault injection drops the reply to "
                       << op_name(header_.op) << " request " << header_.request_id;
      return close();
    }
    send(std::move(reply));
  }

  void authenticate() {
    server_->auth_refusals.fetch_add(1, std::memory_order_relaxed);
    Status refusal;
    if (header_.op != Op::kAuth) {
      refusal = Status::PermissionDenied(std::string("this server requires AUTH before ") +
                                         op_name(header_.op));
    } else {
      auto token = decode_path_request(payload_.data(), payload_.size());
      if (token.ok() && tokens_equal(*token, server_->options().auth_token)) {
        server_->auth_refusals.fetch_sub(1, std::memory_order_relaxed);
        authenticated_ = true;
        return send(make_reply(header_, Status::Code::kOk, {}));
      }
      refusal = Status::PermissionDenied("wrong auth token");
    }
    GPUBOX_LOG(WARNING) << "gpubox_server: refusing connection from " << peer_ << ": "
                        << refusal.message();
    Reply reply = error_reply(header_, refusal);
    reply.close_after = true;
    send(std::move(reply));
  }

  void protocol_error(const std::string& reason) {
    server_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
    GPUBOX_LOG(WARNING) << "gpubox_server: closing connection from " << peer_ << ": " << reason;
    close();
  }

  void send(Reply reply) {
    reply_ = std::move(reply);
    auto self = shared_from_this();
    asio::async_write(
        socket_, asio::buffer(reply_.frame),
        [self](const boost::system::error_code& ec, std::size_t) { self->on_written(ec); });
  }

  void on_written(const boost::system::error_code& ec) {
    if (ec) {
      GPUBOX_LOG(INFO) << "gpubox_server: reply to " << peer_ << " lost: " << ec.message();
      return close();
    }
    if (reply_.stop_server_after) {
      close();
      return server_->stop();
    }
    if (reply_.close_after) return close();
    reply_.frame = {};
    read_header();
  }

  void close() {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  Server::Impl* server_;
  tcp::socket socket_;
  std::string peer_;
  bool authenticated_ = false;
  uint8_t header_bytes_[kHeaderBytes] = {};
  FrameHeader header_;
  std::vector<uint8_t> payload_;
  Reply reply_;
};

}  // namespace

// ---- Impl ------------------------------------------------------------------------------------

Status Server::Impl::listen() {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options_.bind_address, ec);
  if (ec)
    return Status::InvalidArgument("bad bind address '" + options_.bind_address +
                                   "': " + ec.message());
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
  accept();
  return Status::OK();
}

void Server::Impl::accept() {
  acceptor_.async_accept(
      asio::make_strand(io_), [this](const boost::system::error_code& ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (ec) {
          GPUBOX_LOG(WARNING) << "gpubox_server: accept failed: " << ec.message();
        } else {
          connections.fetch_add(1, std::memory_order_relaxed);
          boost::system::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);
          std::make_shared<Session>(this, std::move(socket))->start();
        }
        accept();
      });
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
  asio::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    work_.reset();
    io_.stop();
  });
}

void Server::Impl::wait() {
  std::call_once(joined_, [this] {
    for (auto& t : threads_) t.join();
  });
}

ServerCounters Server::Impl::counters() const {
  ServerCounters c;
  c.connections = connections.load();
  c.requests = requests.load();
  c.duplicate_requests = duplicates.load();
  c.rows_pulled = rows_pulled.load();
  c.rows_pushed = rows_pushed.load();
  c.protocol_errors = protocol_errors.load();
  c.auth_refusals = auth_refusals.load();
  return c;
}

Status Server::Impl::check_keys(const uint64_t* keys, std::size_t n) const {
  if (options_.shard_num <= 1) return Status::OK();
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t shard = host_shard(keys[i], options_.shard_num);
    if (shard != options_.shard_id) {
      std::ostringstream msg;
      msg << "key " << keys[i] << " belongs to shard " << shard << " of " << options_.shard_num
          << ", not to this server (shard " << options_.shard_id
          << "): the client's endpoint list does not match the servers' --shard_id order";
      return Status::InvalidArgument(msg.str());
    }
  }
  return Status::OK();
}

Reply Server::Impl::handle(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  if (!is_mutation(header.op)) return apply(header, payload);
  CachedReply cached;
  switch (window_.begin(header.client_id, header.request_id, &cached)) {
    case RequestWindow::Begin::kDone: {
      duplicates.fetch_add(1, std::memory_order_relaxed);
      return make_reply(header, cached.status, std::move(cached.payload));
    }
    case RequestWindow::Begin::kInProgress:
      duplicates.fetch_add(1, std::memory_order_relaxed);
      // Aborted = "retry later": the client's transport retries it after a backoff.
      return error_reply(header, Status::Aborted("request " + std::to_string(header.request_id) +
                                                 " is still being applied; retry"));
    case RequestWindow::Begin::kNew:
      break;
  }
  Reply reply = apply(header, payload);
  auto decoded = decode_header(reply.frame.data(), reply.frame.size(), UINT32_MAX);
  cached.status = decoded.ok() ? decoded->status : Status::Code::kInternal;
  cached.payload.assign(reply.frame.begin() + kHeaderBytes, reply.frame.end());
  window_.finish(header.client_id, header.request_id, std::move(cached));
  return reply;
}

Reply Server::Impl::apply(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  const uint8_t* data = payload.data();
  const std::size_t n = payload.size();
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  switch (header.op) {
    case Op::kInfo: {
      InfoReply info;
      info.shard_id = options_.shard_id;
      info.shard_num = options_.shard_num;
      info.optimizer_kind = static_cast<int32_t>(table_->config().kind);
      info.mf_dim = table_->layout().mf_dim;
      info.stride = static_cast<uint32_t>(table_->layout().stride());
      info.max_payload_bytes = options_.max_payload_bytes;
      std::vector<uint8_t> out;
      encode_info_reply(info, &out);
      return make_reply(header, Status::Code::kOk, std::move(out));
    }
    case Op::kPull:
      return pull(header, payload);
    case Op::kPush: {
      auto req = decode_push_request(data, n);
      if (!req.ok()) return fail(req.status());
      const auto stride = static_cast<uint32_t>(table_->layout().stride());
      if (!req->keys.empty() && req->stride != stride) {
        return fail(Status::InvalidArgument("rows of stride " + std::to_string(req->stride) +
                                            " pushed to a table of stride " +
                                            std::to_string(stride)));
      }
      Status st = check_keys(req->keys.data(), req->keys.size());
      if (st.ok()) st = table_->push(req->keys.data(), req->keys.size(), req->rows.data());
      if (!st.ok()) return fail(st);
      rows_pushed.fetch_add(req->keys.size(), std::memory_order_relaxed);
      return make_reply(header, Status::Code::kOk, {});
    }
    case Op::kErase: {
      auto keys = decode_erase_request(data, n);
      if (!keys.ok()) return fail(keys.status());
      Status st = check_keys(keys->data(), keys->size());
      if (st.ok()) st = table_->erase(keys->data(), keys->size());
      if (!st.ok()) return fail(st);
      return make_reply(header, Status::Code::kOk, {});
    }
    case Op::kSave: {
      auto req = decode_save_request(data, n);
      if (!req.ok()) return fail(req.status());
      auto path = resolve_model_path(options_, req->path);
      if (!path.ok()) return fail(path.status());
      Status st = table_->save(*path, req->mode);
      if (!st.ok()) return fail(st);
      GPUBOX_LOG(INFO) << "gpubox_server: saved to " << *path;
      return make_reply(header, Status::Code::kOk, {});
    }
    case Op::kLoad: {
      auto req = decode_path_request(data, n);
      if (!req.ok()) return fail(req.status());
      auto path = resolve_model_path(options_, *req);
      if (!path.ok()) return fail(path.status());
      Status st = table_->load(*path);
      if (!st.ok()) return fail(st);
      GPUBOX_LOG(INFO) << "gpubox_server: loaded " << *path;
      return make_reply(header, Status::Code::kOk, {});
    }
    case Op::kShrink: {
      if (n != 0) return fail(Status::Corruption("SHRINK request carries a payload"));
      auto deleted = table_->shrink();
      if (!deleted.ok()) return fail(deleted.status());
      std::vector<uint8_t> out;
      encode_u64_reply(*deleted, &out);
      return make_reply(header, Status::Code::kOk, std::move(out));
    }
    case Op::kStats: {
      auto stats = table_->stats();
      if (!stats.ok()) return fail(stats.status());
      std::vector<uint8_t> out;
      encode_stats_reply(*stats, &out);
      return make_reply(header, Status::Code::kOk, std::move(out));
    }
    case Op::kShutdown: {
      GPUBOX_LOG(INFO) << "gpubox_server: SHUTDOWN requested by client " << header.client_id;
      Reply reply = make_reply(header, Status::Code::kOk, {});
      reply.stop_server_after = true;
      return reply;
    }
    case Op::kAuth:
    case Op::kBarrier:
      break;  // handled by the session
  }
  return fail(Status::Internal("op not dispatched"));
}

Reply Server::Impl::pull(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  auto req = decode_pull_request(payload.data(), payload.size());
  if (!req.ok()) return fail(req.status());
  Status st = check_keys(req->keys.data(), req->keys.size());
  if (!st.ok()) return fail(st);
  const uint32_t stride = static_cast<uint32_t>(table_->layout().stride());
  const std::size_t bytes = pull_reply_bytes(req->keys.size(), stride);
  if (bytes > options_.max_payload_bytes) {
    return fail(Status::ResourceExhausted("reply of " + std::to_string(bytes) +
                                          " bytes is over the frame limit"));
  }
  // The rows are written in place into the reply frame (48-byte offset: float-aligned).
  FrameHeader h = header;
  h.response = true;
  h.payload_bytes = static_cast<uint32_t>(bytes);
  Reply reply;
  reply.frame.resize(kHeaderBytes + bytes);
  std::size_t created = 0;
  float* rows =
      reinterpret_cast<float*>(reply.frame.data() + kHeaderBytes + pull_reply_rows_offset());
  st = table_->pull(req->keys.data(), req->slots.empty() ? nullptr : req->slots.data(),
                    req->keys.size(), rows, &created);
  if (!st.ok()) return fail(st);
  encode_header(h, reply.frame.data());
  encode_pull_reply_head(req->keys.size(), stride, created, reply.frame.data() + kHeaderBytes);
  rows_pulled.fetch_add(req->keys.size(), std::memory_order_relaxed);
  return reply;
}

void Server::Impl::barrier_arrive(const std::shared_ptr<Session>& session,
                                  const FrameHeader& header, const std::vector<uint8_t>& payload) {
  auto req = decode_barrier_request(payload.data(), payload.size());
  if (!req.ok())
    return session->post_reply(error_reply(header, req.status().with_context("BARRIER")));
  std::vector<Waiter> released;
  {
    std::lock_guard<std::mutex> lock(barrier_mu_);
    Barrier& barrier = barriers_[req->name];
    if (!barrier.waiters.empty() && barrier.parties != req->parties) {
      return session->post_reply(error_reply(
          header,
          Status::InvalidArgument("BARRIER '" + req->name + "': " + std::to_string(req->parties) +
                                  " parties, but " + std::to_string(barrier.parties) +
                                  " announced by those already waiting")));
    }
    barrier.parties = req->parties;
    barrier.waiters.push_back(Waiter{session, header});
    if (barrier.waiters.size() < barrier.parties) return;
    released = std::move(barrier.waiters);
    barriers_.erase(req->name);
  }
  for (auto& waiter : released) {
    waiter.session->post_reply(make_reply(waiter.header, Status::Code::kOk, {}));
  }
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
  auto impl = std::make_unique<Impl>(table, std::move(options));
  GPUBOX_RETURN_IF_ERROR(impl->listen());
  impl->run_threads();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

uint16_t Server::port() const { return impl_->port(); }
std::string Server::endpoint() const {
  return impl_->options().bind_address + ":" + std::to_string(impl_->port());
}
void Server::stop() { impl_->stop(); }
void Server::wait() { impl_->wait(); }
bool Server::stopped() const { return impl_->stopped(); }
ServerCounters Server::counters() const { return impl_->counters(); }

}  // namespace gpubox::table::server
