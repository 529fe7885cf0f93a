#include "serving/http_server.hpp"

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <exception>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/enum_names.hpp"
#include "common/error_report.hpp"
#include "common/json.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "serving/predictor.hpp"
#include "serving/request_parser.hpp"

namespace gpubox::serving {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kHeaderLimit = 8 * 1024;

std::string error_body(const std::string& message) {
  return "{\"error\": " + json_quote(message) + "}\n";
}

std::string predictions_body(const std::vector<float>& predictions) {
  std::string out = "{\"predictions\": [";
  char buf[32];
  for (std::size_t i = 0; i < predictions.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%.9g", i ? ", " : "", static_cast<double>(predictions[i]));
    out += buf;
  }
  return out + "]}\n";
}

// Metric label of a request target: the served paths, else "other" (bounded label values).
std::string path_label(beast::string_view target) {
  for (const char* path : {"/predict", "/health", "/metrics"}) {
    if (target == path) return path;
  }
  return "other";
}

}  // namespace

class Session;

// "address:port" of the client, "(unknown)" when the socket no longer says.
static std::string peer_of(const tcp::socket& socket) {
  beast::error_code ec;
  const auto endpoint = socket.remote_endpoint(ec);
  if (ec) return "(unknown)";
  return endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
}

struct PredictionServer::Impl {
  Impl(const ServingModel& model_in, ServerOptions options_in)
      : model(model_in),
        options(std::move(options_in)),
        predictor(model, options.card_threads, options.precision),
        parser(model.spec(), options.max_instances),
        accept_strand(net::make_strand(ioc)),
        acceptor(accept_strand),
        retry_accept(accept_strand) {
    metrics.set_model(model.rows(), model.dense_values().size());
    batcher =
        std::make_unique<MicroBatcher>(predictor, model.spec().model.slots,
                                       model.spec().model.dense_dim, options.batcher, &metrics);
  }

  void accept();
  void refuse(tcp::socket socket);
  // An error answered to `peer` (a 4xx or 5xx, a refused connection), logged at most once a
  // second with how many went unlogged since: an operator finds a broken or abusive client by
  // its address (only /metrics counted them).
  void log_error(const std::string& peer, const std::string& what);
  std::size_t live_sessions() {
    MutexLock lock(sessions_mu);
    return sessions.size();
  }

  const ServingModel& model;
  ServerOptions options;
  ServeMetrics metrics;
  Predictor predictor;
  RequestParser parser;
  std::unique_ptr<MicroBatcher> batcher;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> last_error_log_ms{-1000000};
  std::atomic<uint64_t> errors_unlogged{0};

  // Before ioc: sessions still queued in ioc when it is destroyed unregister here.
  Mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions GPUBOX_GUARDED_BY(sessions_mu);

  Mutex stop_mu;
  CondVar stop_cv;
  bool stop_requested GPUBOX_GUARDED_BY(stop_mu) = false;
  bool finished GPUBOX_GUARDED_BY(stop_mu) = false;

  net::io_context ioc;
  // The acceptor, its retry timer and the stop closure run on one strand: accept handlers on
  // one HTTP thread never race request_stop's close on another.
  net::strand<net::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  net::steady_timer retry_accept;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  uint16_t port = 0;
};

// One connection. Its handlers run on its strand, one at a time: read a request -> answer it
// (for /predict, after the micro-batcher's callback posts the predictions back) -> read the
// next, until the client closes, the connection idles past idle_timeout, or the server stops.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, PredictionServer::Impl& server)
      : stream_(std::move(socket)), server_(server), peer_(peer_of(stream_.socket())) {}
  ~Session() {
    {
      MutexLock lock(server_.sessions_mu);
      server_.sessions.erase(this);
    }
    server_.metrics.connection_closed();
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }
  // Closes the connection if it is waiting for a request of which nothing has come (server
  // stop). A request part-way received is read to its end and answered (it was dropped, the
  // client told nothing): its read still ends at the idle timeout, the server's wait at the
  // drain timeout.
  void close_if_idle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      const bool begun = self->buffer_.size() > 0 || (self->parser_ && self->parser_->got_some());
      if (self->reading_ && !begun) self->stream_.socket().close(self->ignored_);
    });
  }

 private:
  void read() {
    if (server_.stopping.load()) return close();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(server_.options.max_body_bytes);
    stream_.expires_after(server_.options.idle_timeout);
    reading_ = true;
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  // A client that sends "Expect: 100-continue" waits for the interim answer before its body
  // (curl does, for bodies over 1 MiB: it waited a second, then sent it anyway). A body over
  // --max_body_kb ends the header's read with body_limit, answered 413 without the 100; a request
  // that will not be served (another path or method, a server stopping) gets no 100 either.
  void on_header(beast::error_code ec, std::size_t) {
    if (ec) return on_read(ec, 0);
    const http::request<http::string_body>& request = parser_->get();
    beast::string_view target = request.target();
    target = target.substr(0, target.find('?'));
    if (request.version() >= 11 && !parser_->is_done() && target == "/predict" &&
        request.method() == http::verb::post && !server_.stopping.load() &&
        beast::iequals(request[http::field::expect], "100-continue")) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(stream_, net::buffer(kContinue, sizeof(kContinue) - 1),
                              [self = shared_from_this()](beast::error_code write_ec, std::size_t) {
                                if (write_ec) return self->close();
                                self->read_body();
                              });
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    reading_ = false;
    started_ = Clock::now();
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted ||
        ec == beast::error::timeout || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::bad_descriptor) {
      return close();
    }
    if (ec) {
      keep_alive_ = false;
      version_ = 11;
      label_ = "other";
      if (ec == http::error::body_limit) {
        label_ = path_label(parser_->get().target());
        return respond(http::status::payload_too_large,
                       error_body("request body over --max_body_kb (" +
                                  std::to_string(server_.options.max_body_bytes) + " bytes)"));
      }
      if (ec == http::error::header_limit) {
        return respond(
            http::status::bad_request,
            error_body("request header over " + std::to_string(kHeaderLimit) + " bytes"));
      }
      if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
        return respond(http::status::bad_request,
                       error_body("malformed HTTP request: " + ec.message()));
      }
      return close();
    }
    try {
      handle(parser_->release());
    } catch (const std::exception& e) {
      keep_alive_ = false;
      // The client is told what failed; where in the code goes to the log only.
      GPUBOX_LOG(WARNING) << "gpubox_serve: request failed: " << e.what();
      respond(http::status::internal_server_error, error_body(user_message(e)));
    }
  }

  void handle(http::request<http::string_body> request) {
    version_ = request.version();
    keep_alive_ = request.keep_alive() && !server_.stopping.load();
    beast::string_view target = request.target();
    if (const auto query = target.find('?'); query != beast::string_view::npos) {
      target = target.substr(0, query);
    }
    label_ = path_label(target);
    const http::verb method = request.method();
    if (target == "/health") {
      if (method != http::verb::get) return not_allowed("GET");
      if (server_.stopping.load()) {
        return respond(http::status::service_unavailable, "{\"status\": \"stopping\"}\n");
      }
      return respond(
          http::status::ok,
          "{\"status\": \"ok\", \"rows\": " + std::to_string(server_.model.rows()) +
              ", \"dense_parameters\": " + std::to_string(server_.model.dense_values().size()) +
              ", \"precision\": \"" +
              name_of(trainer::kDensePrecisionNames, server_.predictor.precision()) + "\"}\n");
    }
    if (target == "/metrics") {
      if (method != http::verb::get) return not_allowed("GET");
      return respond(http::status::ok, server_.metrics.render_prometheus(),
                     "text/plain; version=0.0.4; charset=utf-8");
    }
    if (target != "/predict") {
      return respond(http::status::not_found,
                     error_body("no such path; gpubox_serve answers POST /predict, GET /health "
                                "and GET /metrics"));
    }
    if (method != http::verb::post) return not_allowed("POST");
    BodyForm form = BodyForm::kAuto;
    const beast::string_view type = request[http::field::content_type];
    if (type.find("json") != beast::string_view::npos) {
      form = BodyForm::kJson;
    } else if (type.find("text/plain") != beast::string_view::npos) {
      form = BodyForm::kSlotText;
    }
    auto parsed = server_.parser.parse(request.body(), form);
    if (!parsed.ok()) {
      const bool too_many = parsed.status().code() == Status::Code::kResourceExhausted;
      return respond(too_many ? http::status::payload_too_large : http::status::bad_request,
                     error_body(parsed.status().message()));
    }
    auto instances = std::make_shared<const dataset::InstanceBlock>(std::move(parsed).value());
    const bool queued = server_.batcher->submit(
        instances, [self = shared_from_this()](const Status& status, std::vector<float> preds) {
          net::post(self->stream_.get_executor(), [self, status, preds = std::move(preds)] {
            self->on_predicted(status, preds);
          });
        });
    if (!queued) {
      keep_alive_ = false;
      return respond(
          http::status::service_unavailable,
          error_body(server_.stopping.load() ? "the server is stopping"
                                             : "too many instances queued; retry later"));
    }
  }

  void on_predicted(const Status& status, const std::vector<float>& predictions) {
    if (!status.ok()) {
      return respond(http::status::internal_server_error, error_body(status.message()));
    }
    respond(http::status::ok, predictions_body(predictions));
  }

  void not_allowed(const char* allowed) {
    allow_ = allowed;
    respond(http::status::method_not_allowed,
            error_body(std::string("method not allowed; use ") + allowed));
  }

  void respond(http::status status, std::string body,
               const char* content_type = "application/json") {
    auto response = std::make_shared<http::response<http::string_body>>(status, version_);
    response->set(http::field::server, "gpubox_serve");
    response->set(http::field::content_type, content_type);
    if (allow_ != nullptr) response->set(http::field::allow, allow_);
    allow_ = nullptr;
    response->keep_alive(keep_alive_ && !server_.stopping.load());
    response->body() = std::move(body);
    response->prepare_payload();
    server_.metrics.record_request(label_, static_cast<int>(status),
                                   std::chrono::duration<double>(Clock::now() - started_).count());
    if (static_cast<int>(status) >= 400) {
      server_.log_error(peer_, std::to_string(static_cast<int>(status)) + " on " + label_ + ": " +
                                   response->body().substr(0, 300));
    }
    stream_.expires_after(server_.options.idle_timeout);
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](beast::error_code ec, std::size_t) {
                        if (ec || response->need_eof()) return self->close();
                        self->read();
                      });
  }

  void close() {
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored_);
    stream_.socket().close(ignored_);
  }

  beast::tcp_stream stream_;
  PredictionServer::Impl& server_;
  const std::string peer_;  // "address:port", for the log
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Clock::time_point started_ = Clock::now();
  std::string label_ = "other";
  const char* allow_ = nullptr;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  bool reading_ = false;
  beast::error_code ignored_;
};

void PredictionServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors or a transient failure: pause instead of spinning on accept.
      retry_accept.expires_after(std::chrono::milliseconds(100));
      retry_accept.async_wait([this](beast::error_code) {
        if (!stopping.load()) accept();
      });
      return;
    }
    if (stopping.load()) return;
    if (live_sessions() >= options.max_connections) {
      metrics.connection_refused();
      refuse(std::move(socket));
    } else {
      auto session = std::make_shared<Session>(std::move(socket), *this);
      {
        MutexLock lock(sessions_mu);
        sessions[session.get()] = session;
      }
      metrics.connection_opened();
      session->start();
    }
    accept();
  });
}

void PredictionServer::Impl::log_error(const std::string& peer, const std::string& what) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_error_log_ms.load();
  if (now - last < 1000 || !last_error_log_ms.compare_exchange_strong(last, now)) {
    errors_unlogged.fetch_add(1);
    return;
  }
  const uint64_t unlogged = errors_unlogged.exchange(0);
  std::string text = what;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  GPUBOX_LOG(WARNING) << "gpubox_serve: client " << peer << ": " << text
                      << (unlogged > 0 ? " (and " + std::to_string(unlogged) +
                                             " error answers since the last such line)"
                                       : std::string());
}

void PredictionServer::Impl::refuse(tcp::socket socket) {
  beast::error_code endpoint_ec;
  const auto endpoint = socket.remote_endpoint(endpoint_ec);
  log_error(endpoint_ec ? std::string("(unknown)")
                        : endpoint.address().to_string() + ":" + std::to_string(endpoint.port()),
            "503: refused, --max_connections (" + std::to_string(options.max_connections) +
                ") connections are open");
  static const std::string kRefusal = [] {
    const std::string body = error_body("too many connections (--max_connections); retry later");
    return "HTTP/1.1 503 Service Unavailable\r\nServer: gpubox_serve\r\nContent-Type: "
           "application/json\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  auto held = std::make_shared<tcp::socket>(std::move(socket));
  net::async_write(*held, net::buffer(kRefusal), [held](beast::error_code, std::size_t) {
    beast::error_code ignored;
    held->shutdown(tcp::socket::shutdown_both, ignored);
    held->close(ignored);
  });
}

PredictionServer::PredictionServer(const ServingModel& model, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(options))) {}

PredictionServer::~PredictionServer() {
  if (!impl_->threads.empty()) {
    request_stop();
    wait();
  }
}

Status PredictionServer::start() {
  Impl& s = *impl_;
  beast::error_code ec;
  const auto address = net::ip::make_address(s.options.bind, ec);
  if (ec) return Status::InvalidArgument("--bind '" + s.options.bind + "' is not an IP address");
  const tcp::endpoint endpoint(address, s.options.port);
  const std::string where = s.options.bind + ":" + std::to_string(s.options.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status::Unavailable("cannot listen on " + where + ": " + ec.message());
  s.port = s.acceptor.local_endpoint().port();
  s.work.emplace(net::make_work_guard(s.ioc));
  s.accept();
  const int threads = std::max(1, s.options.threads);
  for (int t = 0; t < threads; ++t) s.threads.emplace_back([&s] { s.ioc.run(); });
  return Status::OK();
}

uint16_t PredictionServer::port() const { return impl_->port; }
ServeMetrics& PredictionServer::metrics() { return impl_->metrics; }

trainer::DensePrecision PredictionServer::precision() const { return impl_->predictor.precision(); }

void PredictionServer::request_stop() {
  Impl& s = *impl_;
  {
    MutexLock lock(s.stop_mu);
    if (s.stop_requested) return;
    s.stop_requested = true;
  }
  s.stopping.store(true);
  net::post(s.accept_strand, [&s] {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    s.retry_accept.cancel();
    std::vector<std::shared_ptr<Session>> live;
    {
      MutexLock lock(s.sessions_mu);
      for (auto& [raw, weak] : s.sessions) {
        if (auto session = weak.lock()) live.push_back(std::move(session));
      }
    }
    for (auto& session : live) session->close_if_idle();
  });
  s.stop_cv.notify_all();
}

void PredictionServer::wait() {
  Impl& s = *impl_;
  {
    MutexLock lock(s.stop_mu);
    while (!s.stop_requested) s.stop_cv.wait(lock);
    if (s.finished) return;
    s.finished = true;
  }
  // Requests being served finish (their connections close after the response); then no more
  // submits, the queued predictions run and their responses are written.
  const auto deadline = Clock::now() + s.options.drain_timeout;
  while (s.live_sessions() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  s.batcher->stop();
  s.batcher->join();
  while (s.live_sessions() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

}  // namespace gpubox::serving
