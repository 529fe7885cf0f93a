// DenseExchanger: the thread on which a PS training thread's dense adds run (the async mode's
// exchange_dense, ps_worker.hpp), one at a time: a CallQueue of one (call_queue.hpp), its thread
// made at the first add and kept (a std::async per add started a thread and allocated its shared
// state every dense step). Its own queue, not the sparse rows': a window's table (1.2 MB for
// config_ps.yaml's net, 71 MB for PaddleRec fat_deepffm's) never holds up a batch's pull.
//
// Thread-safety: start(), wait(), cancel() and pending() from one thread (the training thread);
// the exchange runs on the exchanger's own thread. The servers' client must outlive the
// exchanger.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "trainer/ps_modes/call_queue.hpp"

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
  ~DenseExchanger() = default;
  DenseExchanger(const DenseExchanger&) = delete;
  DenseExchanger& operator=(const DenseExchanger&) = delete;

  // Starts adding *values to the table; *values then holds the servers' sum. *values is the
  // exchanger's until wait() returns. Only when none is pending.
  void start(std::vector<float>* values);
  // Waits for the add start() began; its status (an exception thrown by the call becomes an
  // Internal status naming it; after a failed add, every later one returns that failure). Only
  // when one is pending.
  Status wait();
  // Drops the add start() began, if any: not sent when it has not begun running, waited for
  // when under way (it uses *values and the servers' client); its status is dropped. Nothing is
  // pending once it returns, and the exchanger adds nothing more (a later add returns Aborted).
  void cancel();
  // Whether an add was started and not waited for.
  bool pending() const { return pending_; }

 private:
  table::server::RemoteHostTier& servers_;
  const std::string table_;
  bool pending_ = false;
  uint64_t ticket_ = 0;  // the pending add's
  CallQueue calls_{1};   // last: its destructor runs an add under way, which uses the above
};

}  // namespace gpubox::trainer::ps_modes
