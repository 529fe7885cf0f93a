// Which job the servers serve (a PS mode's or the gpubox mode's): kOwnerTable on the first server,
// {the job's nonce in 3 floats of 24 bits, beats, beat interval in ms}. Trainer 0 claims the
// servers in its part of the job's start, before it writes the job's tables: a table holding
// another job's nonce whose beats advance is that job running, and this one is refused naming it (a
// second job, or an --mode infer, on the servers of a running job replaced its dense table and
// rows, both exiting 0 with wrong figures). A claim whose beats stand still (its job ended without
// releasing, e.g. killed) is taken over after 2.5 of its intervals. Trainer 0 then beats while it
// lives, reading the nonce back from each beat's reply: a job that took the servers over anyway
// (two starts at once, neither seeing the other's beats) is reported by taken_over(), which each
// pass's end throws. Released (zeroed) as trainer 0 ends, while the table is still its job's; the
// release reads, then writes, so a job that took the servers over between the two has its claim
// erased: its next beat claims again.
//
// Thread-safety: construct, reclaim and destroy from one thread; taken_over() from any.
#pragma once

#include <cstdint>
#include <string>
#include <thread>

#include "common/thread_annotations.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer {

inline constexpr const char* kOwnerTable = "ps_job_owner";

class ServersOwner {
 public:
  // Claims the servers for a job beating every `interval_s` (throws as above), then beats.
  ServersOwner(table::server::RemoteHostTier& servers, double interval_s);
  ~ServersOwner();
  ServersOwner(const ServersOwner&) = delete;
  ServersOwner& operator=(const ServersOwner&) = delete;

  // Claims again, with no wait for a claim of this job's own (a recovery's start: a first server
  // restarted empty lost the table; one that kept it holds this job's nonce).
  void reclaim();
  // "" while the servers are this job's; else what took them over.
  std::string taken_over() const;

 private:
  void claim();
  void beat_loop();

  table::server::RemoteHostTier& servers_;
  const double interval_s_;
  const uint64_t nonce_;
  mutable Mutex mu_;
  CondVar wake_;
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::string taken_over_ GPUBOX_GUARDED_BY(mu_);
  float count_ GPUBOX_GUARDED_BY(mu_) = 0.0f;  // the beats the last reply held
  std::thread beats_;
};

}  // namespace gpubox::trainer
