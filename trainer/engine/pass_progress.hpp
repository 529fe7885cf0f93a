// PassProgress: card 0's progress of a pass (of trainer 0) in the gpubox schedule, and thread
// 0's in the PS modes (ps_trainer.hpp; `steps` 0 there when a stream's length is unknown).
//
// The progress line every runner.print_interval steps, redrawn in place on a terminal at most 4
// times a second besides, and the caller's StepHooks::on_progress as often, which takes over the
// terminal's redraw. The running AUC is computed on the card and read with the step's status a
// few steps later, without a wait (CardWorker::train_step's `progress`, its progress sink), so
// the progress costs no card anything; a line names the step it was computed at, with the rate
// at that step.
//
// Thread-safety: card 0's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "common/timer.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer {

class PassProgress {
 public:
  // `first`: this is trainer 0 (the job's lines are its). `hooks` must outlive the object.
  PassProgress(const StepHooks& hooks, int64_t pass, std::size_t steps, int interval, bool first);
  ~PassProgress();  // ends a redrawn line
  PassProgress(const PassProgress&) = delete;
  PassProgress& operator=(const PassProgress&) = delete;

  // Whether step `b` (from 0) reports (then card 0's train_step computes the running AUC).
  bool wanted(std::size_t b) const;
  // After step `b` that wanted() it: `examples` so far over the job.
  void note(std::size_t b, int64_t examples);
  // Step `b`'s running AUC, once read back (after note(b)).
  void report(std::size_t b, double auc);

 private:
  const StepHooks& hooks_;
  int64_t pass_;
  std::size_t steps_;
  int interval_;
  bool first_;
  bool tty_;
  Timer timer_;
  double last_redraw_ = 0;
  // The steps noted and not reported yet (a few: a step's AUC is read back a few steps late):
  // examples and seconds at the step.
  std::map<std::size_t, std::pair<int64_t, double>> noted_;
  bool drawn_ = false;  // a line was noted (the terminal's line ends at destruction)
};

}  // namespace gpubox::trainer
