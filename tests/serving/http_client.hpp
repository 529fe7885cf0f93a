// A small blocking HTTP/1.1 client over loopback (Boost.Beast), for the serving tests and the
// load generator (gpubox_bench serve): one keep-alive connection, one request at a time.
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <string>

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
  explicit HttpClient(uint16_t port, std::string host = "127.0.0.1")
      : host_(std::move(host)), port_(port), socket_(ioc_) {}

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
    boost::beast::error_code ec;
    http::write(socket_, request, ec);
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
    boost::beast::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(bytes), ec);
    if (!ec) return read_reply();
    reply.error = "write: " + ec.message();
    return reply;
  }

  HttpReply read_reply() {
    namespace http = boost::beast::http;
    HttpReply reply;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::uint64_t{1} << 30);
    boost::beast::error_code ec;
    http::read(socket_, buffer_, parser, ec);
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
  std::string host_;
  uint16_t port_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
};

}  // namespace gpubox::serving::testing
