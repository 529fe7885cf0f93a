// Trainer 0's part of a meeting of the trainers of a job (a save, a load into the servers: the
// others wait while trainer 0 alone works), bounded by its progress rather than its total time
// (issue 32): the waiters go on waiting while trainer 0's part moves, and fail within
// runner.collective_timeout_s of its last move, naming trainer 0 and its part, when it stopped
// moving (its SAVE stuck, the trainer itself stuck), or at once when their watch lost it.
//
// Trainer 0 publishes its part in the dense table kTable on the first server: {part, state,
// moves}, `part` the number of the part (every trainer counts its parts of trainer 0 alike, one
// per meeting), `state` kRunning or kEnded (whether it succeeded or failed: the meeting that
// follows tells the others which), `moves` the PROGRESS frames its client received so far
// (RemoteHostTier::progress_frames: its servers' SAVE or LOAD moved), published again whenever
// they grew, every interval. A waiter reads the table every interval: part `part` ended, it goes
// to the meeting (which trainer 0 reached or is about to); the table unchanged for the bound, it
// throws. Another part there (an earlier one, or one an earlier job on the same servers left) is
// a part not begun yet: trainer 0 publishes its own as it begins it. A table it cannot read (the
// first server lost or restarted: the meeting on it fails too) ends the watching: the waiter
// goes to the meeting, bounded by runner.collective_timeout_s as before. A failed publish is
// logged once and otherwise ignored: the waiters then fail at the bound, naming trainer 0.
//
// Thread-safety: a TrainerZeroWork belongs to one thread (it runs its own); wait_for_trainer_zero
// may run on any thread. Both use the thread-safe RemoteHostTier.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "common/thread_annotations.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer {

class TrainerZeroWork {
 public:
  static constexpr const char* kTable = "trainer0_work";
  static constexpr float kRunning = 1.0f;
  static constexpr float kEnded = 2.0f;

  // Trainer 0, as its part number `part` begins: publishes it running now, then its moves every
  // `interval_s` while they grow. `servers` must outlive this object.
  TrainerZeroWork(table::server::RemoteHostTier& servers, int64_t part, double interval_s);
  // Publishes the part ended (whatever its outcome).
  ~TrainerZeroWork();
  TrainerZeroWork(const TrainerZeroWork&) = delete;
  TrainerZeroWork& operator=(const TrainerZeroWork&) = delete;

  // How often trainer 0 publishes and the waiters read, for a bound of `collective_timeout_s`:
  // a quarter of it, at most 0.25 s.
  static double interval_for(double collective_timeout_s);

 private:
  void publish(float state, uint64_t moves);
  void run();

  table::server::RemoteHostTier& servers_;
  const int64_t part_;
  const double interval_s_;
  bool warned_ = false;  // a failed publish was logged
  Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// What a trainer other than trainer 0 waits for (wait_for_trainer_zero).
struct TrainerZeroWait {
  int64_t part = 0;          // the part's number (TrainerZeroWork)
  std::string what;          // what trainer 0 does, for the error: "writing the save DIR"
  double silence_s = 300;    // runner.collective_timeout_s: the longest trainer 0 may not move
  double interval_s = 0.25;  // TrainerZeroWork::interval_for
  // A loss this trainer's watch saw ("" while none): trainer 0 died, or a server was lost.
  std::function<std::string()> lost;
};

// Returns once trainer 0 ended part `wait.part` (or the watching ended, see the file comment);
// throws gpubox::Error when trainer 0 did not move for wait.silence_s, naming it and wait.what,
// or at once when wait.lost() reports a loss.
void wait_for_trainer_zero(table::server::RemoteHostTier& servers, const TrainerZeroWait& wait);

}  // namespace gpubox::trainer
