// DenseExchanger: the thread on which a PS training thread's dense adds run (the async mode's
// exchange_dense, ps_worker.hpp), one at a time, made at the first add and kept: a std::async
// per add started a thread and allocated its shared state every dense step.
//
// Thread-safety: start(), wait() and pending() from one thread (the training thread); the
// exchange runs on the exchanger's own thread. The servers' client must outlive the exchanger.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

class DenseExchanger {
 public:
  // Adds go to the servers' dense table `table`.
  DenseExchanger(table::server::RemoteHostTier& servers, std::string table);
  // Waits for an add under way (its status is dropped: the caller logs it first, see
  // PsWorker's destructor) and ends the thread.
  ~DenseExchanger();
  DenseExchanger(const DenseExchanger&) = delete;
  DenseExchanger& operator=(const DenseExchanger&) = delete;

  // Starts adding *values to the table; *values then holds the servers' sum. *values is the
  // exchanger's until wait() returns. Only when none is pending.
  void start(std::vector<float>* values) GPUBOX_EXCLUDES(mu_);
  // Waits for the add start() began; its status (an exception thrown by the call becomes an
  // Internal status naming it). Only when one is pending.
  Status wait() GPUBOX_EXCLUDES(mu_);
  // Whether an add was started and not waited for.
  bool pending() const { return pending_; }

 private:
  void run() GPUBOX_EXCLUDES(mu_);

  table::server::RemoteHostTier& servers_;
  const std::string table_;
  bool pending_ = false;  // the training thread's own view
  Mutex mu_;
  CondVar changed_;
  std::vector<float>* job_ GPUBOX_GUARDED_BY(mu_) = nullptr;  // the add to run, until it ran
  bool done_ GPUBOX_GUARDED_BY(mu_) = false;
  Status result_ GPUBOX_GUARDED_BY(mu_);
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first start()
};

}  // namespace gpubox::trainer::ps_modes
