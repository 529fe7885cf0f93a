// Session: a SAVE or LOAD on the server's BulkWorker, and the PROGRESS frames its client gets
// meanwhile (session.hpp, bulk_work.hpp).
#include <algorithm>
#include <chrono>

#include "table/server/session.hpp"

namespace gpubox::table::server {
namespace {

std::chrono::steady_clock::duration seconds(double s) {
  // Clamped to 100 days: a larger value would overflow the clock's nanoseconds.
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::clamp(s, 0.0, 8.64e6)));
}

}  // namespace

void Session::start_bulk() {
  state_ = State::kWorking;
  WorkProgress* const progress = &server_->bulk().progress();
  progress_seen_ = progress->note().steps;  // a PROGRESS frame tells of moves from now on
  bulk_reply_.reset();
  // The job reads copies (or the moved payload): the session's members belong to its strand.
  // The request's bytes stay charged until finish_request().
  auto self = shared_from_this();
  server_->bulk().post([self, progress, strand = socket_.get_executor(), header = header_,
                        payload = std::move(payload_)]() mutable {
    const ReserveReply no_reply_buffer = [](std::size_t) {
      return Status::ResourceExhausted("a SAVE or LOAD reply takes no reply buffer");
    };
    Reply reply =
        self->server_->handle(header, payload, no_reply_buffer,
                              RequestOrigin{self->serial_, self->peer_address_, progress});
    asio::post(strand,
               [self, reply = std::move(reply)]() mutable { self->bulk_done(std::move(reply)); });
  });
  schedule_progress();
}

void Session::schedule_progress() {
  if (!progress_timer_) {
    progress_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  }
  progress_timer_->expires_after(seconds(server_->options().progress_interval_s));
  auto self = shared_from_this();
  progress_timer_->async_wait([self](const boost::system::error_code& ec) {
    if (ec || self->closed_ || self->state_ != State::kWorking || self->bulk_reply_) return;
    self->send_progress();
    self->schedule_progress();
  });
}

void Session::send_progress() {
  WorkProgress& progress = server_->bulk().progress();
  if (progress_writing_ || !progress.moved(&progress_seen_)) return;
  FrameHeader h = header_;  // the SAVE or LOAD's request id and client id
  h.op = Op::kProgress;
  h.response = true;
  h.status = Status::Code::kOk;
  std::vector<uint8_t> payload;
  encode_progress(progress.note(), &payload);
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
  if (progress_timer_) progress_timer_->cancel();
  if (progress_writing_) {
    bulk_reply_ = std::move(reply);  // sent by on_progress_written
    return;
  }
  finish_request(std::move(reply));
}

}  // namespace gpubox::table::server
