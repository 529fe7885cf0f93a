#include "trainer/engine/pass_progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer {

PassProgress::PassProgress(const StepHooks& hooks, int64_t pass, std::size_t steps, int interval,
                           bool first)
    : hooks_(hooks),
      pass_(pass),
      steps_(steps),
      interval_(std::max(1, interval)),
      first_(first),
      tty_(first && !hooks.on_progress && isatty(fileno(stdout)) != 0) {}

PassProgress::~PassProgress() {
  if (tty_ && drawn_) std::printf("\n");
}

bool PassProgress::wanted(std::size_t b) const {
  if (!first_) return false;
  const bool timely = b + 1 == steps_ || timer_.seconds() - last_redraw_ >= 0.25;
  return (b + 1) % interval_ == 0 || ((tty_ || hooks_.on_progress) && timely);
}

void PassProgress::note(std::size_t b, int64_t examples) {
  last_redraw_ = timer_.seconds();
  noted_[b] = {examples, last_redraw_};
  drawn_ = true;
}

void PassProgress::report(std::size_t b, double auc) {
  const auto [examples, elapsed] = noted_.at(b);
  noted_.erase(b);
  const double rate = static_cast<double>(examples) / std::max(1e-9, elapsed);
  if (hooks_.on_progress) hooks_.on_progress({pass_, b + 1, steps_, rate, auc, elapsed});
  if (!tty_ && (b + 1) % interval_ != 0) return;
  const std::string line = format_progress_line(pass_, static_cast<int64_t>(b + 1),
                                                static_cast<int64_t>(steps_), rate, auc, elapsed);
  // On a terminal: back to the line's start, and clear what a longer line left.
  std::printf(tty_ ? "\r%s\033[K" : "%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace gpubox::trainer
