// A small blocking HTTP/1.1 client over loopback (Boost.Beast), for the serving tests and the
// load generator (gpubox_bench serve): one keep-alive connection, one request at a time. Every
// write and read has a deadline (`io_timeout`, 60 s by default): a server that never answers
// fails the call with "timed out" instead of hanging the test until CI's limit. (SO_RCVTIMEO
// would not do: Asio's blocking read polls again, without a limit, when recv times out.)
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace gpubox::serving::testing {

struct HttpReply {
  int status = 0;  // 0: no reply (connection failed or closed); `error` says why
  std::string body;
  std::string content_type;
  bool keep_alive = false;
  std::string error;
};

class HttpClient {
 public:
  explicit HttpClient(uint16_t port, std::string host = "127.0.0.1",
                      std::chrono::milliseconds io_timeout = std::chrono::seconds(60))
      : host_(std::move(host)), port_(port), io_timeout_(io_timeout), socket_(ioc_) {}

  bool connect() {
    boost::beast::error_code ec;
    socket_.close(ec);
    socket_ = boost::asio::ip::tcp::socket(ioc_);
    socket_.connect({boost::asio::ip::make_address(host_), port_}, ec);
    return !ec;
  }
  bool connected() const { return socket_.is_open(); }

  // Sends one request (connecting first when needed) and reads its reply.
  HttpReply send(boost::beast::http::verb method, const std::string& target,
                 const std::string& body = "", const std::string& content_type = "") {
    namespace http = boost::beast::http;
    HttpReply reply;
    if (!socket_.is_open() && !connect()) {
      reply.error = "cannot connect";
      return reply;
    }
    http::request<http::string_body> request(method, target, 11);
    request.set(http::field::host, host_);
    request.keep_alive(true);
    if (!content_type.empty()) request.set(http::field::content_type, content_type);
    request.body() = body;
    request.prepare_payload();
    boost::beast::error_code ec = run_io([&](auto done) {
      http::async_write(socket_, request,
                        [done](boost::beast::error_code e, std::size_t) { done(e); });
    });
    if (!ec) return read_reply();
    reply.error = "write: " + ec.message();
    socket_.close(ec);
    return reply;
  }

  // Sends raw bytes (a malformed request) and reads one reply.
  HttpReply send_raw(const std::string& bytes) {
    HttpReply reply;
    if (!socket_.is_open() && !connect()) {
      reply.error = "cannot connect";
      return reply;
    }
    boost::beast::error_code ec = run_io([&](auto done) {
      boost::asio::async_write(socket_, boost::asio::buffer(bytes),
                               [done](boost::beast::error_code e, std::size_t) { done(e); });
    });
    if (!ec) return read_reply();
    reply.error = "write: " + ec.message();
    return reply;
  }

  HttpReply read_reply() {
    namespace http = boost::beast::http;
    HttpReply reply;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::uint64_t{1} << 30);
    boost::beast::error_code ec = run_io([&](auto done) {
      http::async_read(socket_, buffer_, parser,
                       [done](boost::beast::error_code e, std::size_t) { done(e); });
    });
    if (ec) {
      reply.error = "read: " + ec.message();
      socket_.close(ec);
      return reply;
    }
    const auto& response = parser.get();
    reply.status = static_cast<int>(response.result_int());
    reply.body = response.body();
    reply.content_type = std::string(response[http::field::content_type]);
    reply.keep_alive = response.keep_alive();
    if (!reply.keep_alive) socket_.close(ec);
    return reply;
  }

  boost::asio::ip::tcp::socket& socket() { return socket_; }

 private:
  // Starts one asynchronous operation (`start(done)`; the operation calls done(error_code)) and
  // runs it to completion or to the deadline; at the deadline the socket is closed (which
  // completes the operation with operation_aborted) and the error is "timed out".
  template <class Start>
  boost::beast::error_code run_io(Start&& start) {
    boost::beast::error_code result;
    bool finished = false;
    start([&result, &finished](boost::beast::error_code e) {
      result = e;
      finished = true;
    });
    ioc_.restart();
    ioc_.run_for(io_timeout_);
    if (finished) return result;
    boost::beast::error_code ignored;
    socket_.close(ignored);
    ioc_.restart();
    ioc_.run();  // the aborted operation's handler
    return boost::asio::error::timed_out;
  }

  std::string host_;
  uint16_t port_;
  std::chrono::milliseconds io_timeout_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
};

}  // namespace gpubox::serving::testing
