#include "trainer/ps_modes/dense_exchanger.hpp"

#include <exception>
#include <utility>

#include "common/error.hpp"
#include "common/error_report.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer::ps_modes {

DenseExchanger::DenseExchanger(table::server::RemoteHostTier& servers, std::string table)
    : servers_(servers), table_(std::move(table)) {}

DenseExchanger::~DenseExchanger() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();  // after the add under way, if any
}

void DenseExchanger::start(std::vector<float>* values) {
  GPUBOX_EXPECTS(!pending_, "a dense exchange started before the last was waited for");
  // The thread first: if it cannot start (std::system_error), nothing is pending, so no one
  // waits for an exchange that never runs.
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  {
    MutexLock lock(mu_);
    job_ = values;
    done_ = false;
  }
  pending_ = true;
  changed_.notify_all();
}

Status DenseExchanger::wait() {
  GPUBOX_EXPECTS(pending_, "waiting for a dense exchange that was not started");
  MutexLock lock(mu_);
  while (!done_) changed_.wait(lock);
  pending_ = false;
  return std::move(result_);
}

void DenseExchanger::run() {
  MutexLock lock(mu_);
  while (true) {
    while (job_ == nullptr && !stopping_) changed_.wait(lock);
    if (job_ == nullptr) return;  // stopping, nothing left to add
    std::vector<float>* values = job_;
    lock.unlock();
    Status status;
    try {
      status = servers_.dense(table::server::DenseAction::kAdd, table_, values);
    } catch (const std::exception& e) {
      status = Status::Internal(user_message(e));
    } catch (...) {
      status = Status::Internal("an exception that is not a std::exception");
    }
    lock.lock();
    job_ = nullptr;
    result_ = std::move(status);
    done_ = true;
    changed_.notify_all();
  }
}

}  // namespace gpubox::trainer::ps_modes
