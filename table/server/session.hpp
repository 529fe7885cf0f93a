// Internal to gpubox_server_lib: one client connection of a Server. Reads a frame, answers it,
// repeats. Handlers of one session never overlap: they run on the socket's strand (a BARRIER
// release and the idle timer are posted to it too).
//
// Memory: a request's payload buffer is allocated once its bytes arrive and grows with them
// (doubling from 256 KiB, never allocated from the announced length), and every buffered byte is
// charged to the connection's limit and to the server's in-flight budget until the reply was
// written.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "table/server/server_impl.hpp"

namespace gpubox::table::server {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server::Impl* server, tcp::socket socket);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  // Ends this session's BARRIER wait with `reply` (from any thread).
  void release_barrier(Reply reply);
  // Called by the barrier, under its lock, while this session is one of its waiters (so the
  // descriptor is still open): false when the client closed its end or sent bytes, which it may
  // not while waiting. Such a waiter is dropped, never counted.
  bool peer_still_waiting() const;

 private:
  using Clock = std::chrono::steady_clock;
  enum class State { kHeader, kPayload, kDraining, kBarrier, kWriting, kLingering, kClosed };

  void read_header();
  void on_header(const boost::system::error_code& ec);
  void read_payload();
  void on_payload(const boost::system::error_code& ec, std::size_t n);
  // The server's budget is spent: read the rest of the frame into a small scratch buffer and
  // answer "retry later".
  void drain();
  void on_drained(const boost::system::error_code& ec, std::size_t n);
  void on_frame();
  void authenticate();
  void watch_barrier_wait();
  void on_barrier_watch(const boost::system::error_code& ec, std::size_t n);
  // send(), after logging an error reply (rate-limited, naming the peer and why).
  void answer(Reply reply);
  void send(Reply reply);
  void on_written(const boost::system::error_code& ec);
  // After a refusal: no more sending, the client's unread bytes are read and dropped (at most
  // kLingerBytes, within the idle timeout) so that closing does not reset the connection before
  // the client read the reply.
  void linger_then_close(std::size_t dropped);
  void arm_idle_timer(Clock::time_point at);
  void on_idle_timer(const boost::system::error_code& ec);
  Status reserve_reply(std::size_t bytes);
  void free_request();
  // An error reply, then the connection is closed (the rest of the frame is never read).
  void refuse(const Status& status);
  void protocol_error(const std::string& reason);
  void close();

  Server::Impl* server_;
  tcp::socket socket_;
  int fd_;  // socket_'s descriptor, for peer_still_waiting()
  std::string peer_;
  asio::steady_timer idle_timer_;
  Clock::time_point last_activity_;
  State state_ = State::kHeader;
  bool closed_ = false;
  bool authenticated_ = false;
  uint8_t header_bytes_[kHeaderBytes] = {};
  FrameHeader header_;
  std::vector<uint8_t> payload_;
  std::size_t payload_got_ = 0;
  bool payload_ready_ = false;    // payload bytes were readable: the buffer may be allocated
  std::size_t request_held_ = 0;  // bytes charged for payload_
  std::size_t reply_held_ = 0;    // bytes charged for the reply being built or written
  std::size_t drain_left_ = 0;
  std::unique_ptr<uint8_t[]> scratch_;  // for drain() and the barrier watch
  std::string barrier_name_;
  Reply reply_;
};

}  // namespace gpubox::table::server
