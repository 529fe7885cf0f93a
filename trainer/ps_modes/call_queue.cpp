#include "trainer/ps_modes/call_queue.hpp"

#include <exception>
#include <string>
#include <utility>

#include "common/error.hpp"
#include "common/error_report.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

Status run_call(const CallQueue::Call& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    return Status::Internal(user_message(e));
  } catch (...) {
    return Status::Internal("an exception that is not a std::exception");
  }
}

}  // namespace

CallQueue::CallQueue(std::size_t capacity) : capacity_(capacity) {
  GPUBOX_EXPECTS(capacity >= 1, "a call queue holds at least one call");
  MutexLock lock(mu_);
  ring_.resize(capacity);
}

CallQueue::~CallQueue() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();  // after the calls still queued
}

uint64_t CallQueue::submit(Call call) {
  // The thread first: if it cannot start (std::system_error), nothing is queued, so no one
  // waits for a call that never runs.
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  uint64_t ticket = 0;
  {
    MutexLock lock(mu_);
    while (submitted_ - finished_ == capacity_) changed_.wait(lock);
    ticket = submitted_++;
    ring_[ticket % capacity_] = std::move(call);
  }
  changed_.notify_all();
  return ticket;
}

Status CallQueue::result_of(uint64_t ticket) const {
  if (!failed_ || ticket < failed_ticket_) return Status::OK();
  return failure_;
}

Status CallQueue::wait(uint64_t ticket) {
  MutexLock lock(mu_);
  GPUBOX_EXPECTS(ticket < submitted_, "waiting for call ", ticket, " of ", submitted_,
                 " submitted");
  while (finished_ <= ticket) changed_.wait(lock);
  return result_of(ticket);
}

Status CallQueue::drain() {
  MutexLock lock(mu_);
  while (finished_ < submitted_) changed_.wait(lock);
  return submitted_ == 0 ? Status::OK() : result_of(submitted_ - 1);
}

void CallQueue::cancel() {
  MutexLock lock(mu_);
  if (!failed_) {
    failed_ = true;
    failed_ticket_ = finished_ + (running_ ? 1 : 0);  // the first call not started
    failure_ = Status::Aborted("the call was cancelled before it started");
  }
  while (running_) changed_.wait(lock);
}

std::size_t CallQueue::pending() const {
  MutexLock lock(mu_);
  return static_cast<std::size_t>(submitted_ - finished_);
}

void CallQueue::run() {
  MutexLock lock(mu_);
  while (true) {
    while (finished_ == submitted_ && !stopping_) changed_.wait(lock);
    if (finished_ == submitted_) return;  // stopping, nothing left to run
    const uint64_t ticket = finished_;
    Call call = std::move(ring_[ticket % capacity_]);
    ring_[ticket % capacity_] = nullptr;
    if (!failed_) {
      running_ = true;
      lock.unlock();
      Status status = run_call(call);
      lock.lock();
      running_ = false;
      // A call under way when cancel() came fails before the calls it skipped.
      if (!status.ok() && (!failed_ || failed_ticket_ > ticket)) {
        failed_ = true;
        failed_ticket_ = ticket;
        failure_ = std::move(status);
      }
    }
    ++finished_;
    changed_.notify_all();
  }
}

}  // namespace gpubox::trainer::ps_modes
