// What a caller of the parameter-server modes hears and asks within a pass (StepHooks,
// schedule.hpp): PsProgress, thread 0's progress; PsPassStop, the stop.
//
// PsProgress: trainer 0's thread 0 reports its steps through the same PassProgress as the
// gpubox mode (the progress line, the caller's on_progress): its running AUC is thread 0's, its
// rate thread 0's examples x threads x trainers; a stream's pass of unknown length has steps 0.
//
// PsPassStop: a stop between two steps in the parameter-server modes (StepHooks::stop_flag,
// schedule.hpp), agreed by every trainer of the job, so that all of them end the same pass
// unsaved while the servers stay consistent.
//
// The flag is read before each step. A trainer that sees it stops taking steps and, with
// several trainers, casts its vote: (pass + 1, step + 1) added once into its two slots of the
// servers' table kStopTable (zeroed at the job's start). The threads then push what they hold
// as at any pass's end (geo's row deltas, the dense window), so the servers hold every applied
// update and nothing half-done; the pass is not reported and not saved.
//   async, geo: each trainer's threads stop on their own; thread 0 reads the table every
//               kPollSteps steps to hear of another trainer's vote. At the pass's end every
//               trainer meets at a server barrier and reads the table: the pass stopped for all
//               when any vote names it (votes are cast before their trainer meets, so every
//               trainer reads the same ones; a vote of the next pass is told apart by its pass).
//   sync:       every trainer takes the same steps: thread 0 casts its vote before the step's
//               server barrier and, every kPollSteps steps and at the pass's last, reads the
//               table after it; every trainer stops after the first step whose read finds a
//               vote cast at or before that step. The pass's end agrees as above.
// One trainer alone: no server request; a flag seen before a step stops the pass there.
//
// Thread-safety: stop_before_step from any training thread; the sync calls from thread 0 of
// the trainer, between two waits of its threads' barrier; pass_stopped on the controlling
// thread after the threads ended.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer {

class PassProgress;
}  // namespace gpubox::trainer

namespace gpubox::trainer::ps_modes {

class PsWorker;

class PsProgress {
 public:
  PsProgress(const StepHooks& hooks, int64_t pass, std::size_t steps, int print_interval,
             const TrainerEnv& env, int threads);
  ~PsProgress();
  PsProgress(const PsProgress&) = delete;
  PsProgress& operator=(const PsProgress&) = delete;
  // Thread 0, after its step `b` of `examples` instances on `worker`.
  void after_step(std::size_t b, std::size_t examples, PsWorker& worker);

 private:
  std::unique_ptr<PassProgress> progress_;
  int64_t scale_;
  int64_t examples_ = 0;
};

inline constexpr const char* kStopTable = "ps_stop_votes";

class PsPassStop {
 public:
  static constexpr std::size_t kPollSteps = 16;

  // `flag` may be null (nothing stops the pass). `servers` is read only with trainers > 1.
  PsPassStop(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
             const std::atomic<bool>* flag, int64_t pass);

  // Trainer 0 at the job's start: the table zeroed.
  static Status reset(table::server::RemoteHostTier& servers, int trainers);

  // async, geo: whether training thread `t` stops before its step `b` (this trainer's flag,
  // or, polled by thread 0, another trainer's vote for this pass).
  bool stop_before_step(int t, std::size_t b);
  // sync, thread 0: before step `b`'s server barrier (casts the vote when flagged), and after
  // it (`last`: the pass's last step); then stopping() says whether every trainer stops after
  // step `b`.
  void before_sync_barrier(std::size_t b);
  void after_sync_barrier(std::size_t b, bool last);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  // After the threads ended: whether the pass stopped, agreed over the job (`meet_all`: every
  // trainer waits at a server barrier of the pass; called with trainers > 1 only).
  bool pass_stopped(const std::function<void()>& meet_all);

 private:
  bool flagged() const { return flag_ != nullptr && flag_->load(std::memory_order_relaxed); }
  void vote(std::size_t step);
  // The table of every trainer's vote.
  std::vector<float> read_votes();
  // Whether a vote in the table names this pass at or before `step`.
  bool voted_up_to(std::size_t step);
  // Whether a vote in the table names this pass, at any step.
  bool voted_in_pass();

  table::server::RemoteHostTier& servers_;
  int trainer_id_;
  int trainers_;
  const std::atomic<bool>* flag_;
  int64_t pass_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> voted_{false};
};

}  // namespace gpubox::trainer::ps_modes
