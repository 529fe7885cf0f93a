#include "trainer/schedule/trainer_zero_work.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using table::server::DenseAction;

constexpr std::size_t kSlots = 3;  // part, state, moves
// Moves are published modulo this, exact in a float; a waiter compares them for change only.
constexpr uint64_t kMovesModulo = uint64_t{1} << 24;

std::chrono::microseconds micros_of(double seconds) {
  return std::chrono::microseconds(static_cast<int64_t>(std::ceil(seconds * 1e6)));
}

}  // namespace

double TrainerZeroWork::interval_for(double collective_timeout_s) {
  return std::min(0.25, collective_timeout_s / 4);
}

TrainerZeroWork::TrainerZeroWork(table::server::RemoteHostTier& servers, int64_t part,
                                 double interval_s)
    : servers_(servers), part_(part), interval_s_(interval_s) {
  publish(kRunning, servers_.progress_frames());
  thread_ = std::thread([this] { run(); });
}

TrainerZeroWork::~TrainerZeroWork() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
  publish(kEnded, servers_.progress_frames());
}

void TrainerZeroWork::publish(float state, uint64_t moves) {
  std::vector<float> table = {static_cast<float>(part_), state,
                              static_cast<float>(moves % kMovesModulo)};
  const Status written = servers_.dense(DenseAction::kWrite, kTable, &table);
  if (written.ok() || warned_) return;
  warned_ = true;
  GPUBOX_LOG(WARNING) << "trainer 0 cannot show the other trainers how its part " << part_
                      << " moves (they fail after runner.collective_timeout_s without a move): "
                      << written.to_string();
}

void TrainerZeroWork::run() {
  uint64_t published = servers_.progress_frames();
  MutexLock lock(mu_);
  while (!stopping_) {
    const auto until = Clock::now() + micros_of(interval_s_);
    while (!stopping_ && stop_cv_.wait_until(lock, until) != std::cv_status::timeout) {
    }
    if (stopping_) return;
    const uint64_t moves = servers_.progress_frames();
    if (moves == published) continue;
    published = moves;
    lock.unlock();
    publish(kRunning, moves);
    lock.lock();
  }
}

void wait_for_trainer_zero(table::server::RemoteHostTier& servers, const TrainerZeroWait& wait) {
  std::vector<float> seen;
  auto last_move = Clock::now();
  // Short looks first: most parts end within a few of them.
  auto pause = std::min(micros_of(wait.interval_s), std::chrono::microseconds(10000));
  for (;;) {
    const std::string lost = wait.lost ? wait.lost() : std::string();
    if (!lost.empty()) GPUBOX_FAIL("waiting for trainer 0 ", wait.what, ": ", lost);
    std::vector<float> table(kSlots, 0.0f);
    const Status read = servers.dense(DenseAction::kRead, TrainerZeroWork::kTable, &table);
    if (!read.ok()) {
      GPUBOX_LOG(WARNING) << "cannot follow trainer 0 " << wait.what
                          << " (waiting for it at the meeting, within "
                             "runner.collective_timeout_s): "
                          << read.to_string();
      return;
    }
    const int64_t part = std::llround(table[0]);
    if (part == wait.part && table[1] == TrainerZeroWork::kEnded) return;
    const auto now = Clock::now();
    if (table != seen) {
      seen = table;
      last_move = now;
    } else if (now - last_move >= micros_of(wait.silence_s)) {
      std::ostringstream silence;
      silence << wait.silence_s;
      GPUBOX_FAIL("trainer 0 made no progress ", wait.what, " for ", silence.str(),
                  " s (runner.collective_timeout_s): ",
                  part == wait.part ? "its part stopped moving"
                                    : "it did not begin it (it is stuck before it)",
                  " (trainer 0's log, log/worker.0.log under scripts/run_gpubox.sh, names what "
                  "it was doing; its servers' logs name a SAVE or LOAD that hangs)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, micros_of(wait.interval_s));
  }
}

}  // namespace gpubox::trainer
