// Session: a SAVE, LOAD or SHRINK on the server's BulkWorker, and the PROGRESS frames its client
// gets meanwhile (session.hpp, bulk_work.hpp).
#include <sys/socket.h>

#include <cerrno>
#include <chrono>

#include "common/logging.hpp"
#include "table/server/session.hpp"

namespace gpubox::table::server {

void Session::start_bulk() {
  // The request is decoded on the worker from a copy no longer charged to the in-flight budget:
  // it is small (kMaxBulkPayloadBytes, checked from the header), and the worker holds at most
  // BulkWorker::kMaxJobs of them.
  std::vector<uint8_t> payload = std::move(payload_);
  free_request();
  io::FileWorkProgress* const progress = &server_->bulk().progress();
  const uint64_t seen = progress->ops();  // a PROGRESS frame tells of moves from now on
  auto abandoned = std::make_shared<std::atomic<bool>>(false);
  auto self = shared_from_this();
  BulkWaiter waiter{abandoned, [self, strand = socket_.get_executor()](const Reply& reply) {
                      asio::post(strand,
                                 [self, reply]() mutable { self->bulk_done(std::move(reply)); });
                    }};
  Server::Impl* const server = server_;
  auto work = [server, progress, header = header_, payload = std::move(payload),
               connection = serial_, address = peer_address_]() -> Reply {
    const ReserveReply no_reply_buffer = [](std::size_t) {
      return Status::ResourceExhausted("a SAVE, LOAD or SHRINK reply takes no reply buffer");
    };
    std::string failure;
    try {
      return server->handle(header, payload, no_reply_buffer,
                            RequestOrigin{connection, address, progress});
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an unknown exception";
    }
    // As a network thread does with a handler that throws (server.cpp): logged, the server goes
    // on; the client gets an error instead of waiting for a reply that never comes.
    GPUBOX_LOG(ERROR) << "gpubox_server: " << op_name(header.op) << " request " << header.request_id
                      << " of client " << header.client_id << " failed: " << failure;
    return error_reply(header, Status::Internal(std::string(op_name(header.op)) +
                                                " failed on the server: " + failure));
  };
  const BulkWorker::Key key{header_.client_id, header_.request_id, header_.op};
  switch (server_->bulk().submit(key, std::move(work), std::move(waiter))) {
    case BulkWorker::Admit::kBusy: {
      const std::string why =
          std::string(
              "server busy: a SAVE, LOAD or SHRINK of this client is queued or running, or ") +
          std::to_string(BulkWorker::kMaxJobs) + " are; retry";
      Server::Impl::warn(server_->busy_log, "gpubox_server: " + std::string(op_name(header_.op)) +
                                                " request " + std::to_string(header_.request_id) +
                                                " of client " + std::to_string(header_.client_id) +
                                                " from " + peer_ + ": " + why);
      return answer(error_reply(header_, Status::Aborted(why)));
    }
    case BulkWorker::Admit::kQueued:
    case BulkWorker::Admit::kAttached:
      break;
  }
  state_ = State::kWorking;
  bulk_abandoned_ = std::move(abandoned);
  progress_seen_ = seen;
  bulk_reply_.reset();
  schedule_progress();
  watch_bulk_client();
}

void Session::watch_bulk_client() {
  // Readable while the call runs: the client closed (its call is abandoned at once, so that the
  // worker's slot it holds is freed), or it pipelined its next request (read after the reply;
  // a close behind it is then noticed only when the reply is written).
  auto self = shared_from_this();
  socket_.async_wait(tcp::socket::wait_read, [self](const boost::system::error_code& ec) {
    if (ec || self->closed_ || self->state_ != State::kWorking) return;
    uint8_t byte = 0;
    const ssize_t k = ::recv(self->fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return self->watch_bulk_client();
    }
    if (k > 0) return;  // a pipelined request
    self->close();      // the client left; a successful reply waits in the retry cache
  });
}

void Session::schedule_progress() {
  if (!progress_timer_) {
    progress_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  }
  progress_timer_->expires_after(steady_seconds(server_->options().progress_interval_s));
  auto self = shared_from_this();
  progress_timer_->async_wait([self](const boost::system::error_code& ec) {
    if (ec || self->closed_ || self->state_ != State::kWorking || self->bulk_reply_) return;
    self->send_progress();
    self->schedule_progress();
  });
}

void Session::send_progress() {
  io::FileWorkProgress& progress = server_->bulk().progress();
  if (progress_writing_) return;
  std::string stalled;
  if (!progress.moved(&progress_seen_, Clock::now(),
                      steady_seconds(server_->options().max_io_stall_s), &stalled)) {
    if (!stalled.empty()) {
      GPUBOX_LOG(WARNING) << "gpubox_server: " << op_name(header_.op) << " request "
                          << header_.request_id << ": its " << stalled << " has not finished in "
                          << server_->options().max_io_stall_s
                          << " s (--max_io_stall_s): no progress is reported for it any more";
    }
    return;
  }
  FrameHeader h = header_;  // the call's request id and client id
  h.op = Op::kProgress;
  h.response = true;
  h.status = Status::Code::kOk;
  std::vector<uint8_t> payload;
  encode_progress(progress_note(progress), &payload);
  progress_frame_ = encode_frame(h, payload);
  progress_writing_ = true;
  // Read as fast as a reply must be (the sweep closes the connection otherwise).
  watch(Watch::kWriting, Clock::now() + server_->frame_grace());
  auto self = shared_from_this();
  asio::async_write(
      socket_, asio::buffer(progress_frame_),
      [self](const boost::system::error_code& ec, std::size_t) { self->on_progress_written(ec); });
}

void Session::on_progress_written(const boost::system::error_code& ec) {
  progress_writing_ = false;
  if (closed_) return;
  if (ec) {
    // The client is gone. The call goes on: its reply waits in the retry cache for a retry.
    Server::Impl::warn(server_->connection_log, "gpubox_server: PROGRESS of " +
                                                    std::string(op_name(header_.op)) + " to " +
                                                    peer_ + " lost: " + ec.message());
    return close();
  }
  watch(Watch::kNone, {});
  if (bulk_reply_) {  // the call ended while the frame was written
    Reply reply = std::move(*bulk_reply_);
    bulk_reply_.reset();
    finish_request(std::move(reply));
  }
}

void Session::bulk_done(Reply reply) {
  if (closed_) return;  // the client left; a successful reply waits in the retry cache
  bulk_abandoned_.reset();
  if (progress_timer_) progress_timer_->cancel();
  if (progress_writing_) {
    bulk_reply_ = std::move(reply);  // sent by on_progress_written
    return;
  }
  finish_request(std::move(reply));
}

}  // namespace gpubox::table::server
