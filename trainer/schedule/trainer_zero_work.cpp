#include "trainer/schedule/trainer_zero_work.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using table::server::DenseAction;

// Moves and seq are published modulo this, exact in a float; the job as two such halves.
constexpr uint64_t kExact = uint64_t{1} << 24;
// The floor of the interval: a small collective_timeout_s does not make the reads a busy loop.
constexpr double kMinInterval = 0.01;

std::chrono::microseconds micros_of(double seconds) {
  return std::chrono::microseconds(static_cast<int64_t>(std::ceil(seconds * 1e6)));
}

// The table as read.
struct Row {
  TrainerZeroPart part;
  float state = 0;
  int64_t seq = 0;
};

Row parse(const std::vector<float>& table) {
  Row row;
  row.part.job = trainer_zero_job_of(table[0], table[1]);
  row.part.run = std::llround(table[2]);
  row.part.recovery = std::llround(table[3]);
  row.part.index = std::llround(table[4]);
  row.state = table[5];
  row.seq = std::llround(table[7]);
  return row;
}

// <0, 0, >0 as part `a` of a job comes before, is, or comes after part `b`.
int compare(const TrainerZeroPart& a, const TrainerZeroPart& b) {
  const auto ka = std::make_tuple(a.run, a.recovery, a.index);
  const auto kb = std::make_tuple(b.run, b.recovery, b.index);
  return ka < kb ? -1 : kb < ka ? 1 : 0;
}

Status read_table(table::server::RemoteHostTier& servers, double call_s,
                  std::vector<float>* table) {
  table->assign(TrainerZeroWork::kSlots, 0.0f);
  return servers.dense(DenseAction::kRead, TrainerZeroWork::kTable, table,
                       TrainerZeroWork::call_of(call_s));
}

}  // namespace

uint64_t draw_trainer_zero_job() {
  std::random_device seed;
  uint64_t job = 0;
  while (job == 0) job = ((uint64_t{seed()} << 32) ^ seed()) % (kExact * kExact);
  return job;
}

std::vector<float> trainer_zero_job_floats(uint64_t job) {
  return {static_cast<float>(job % kExact), static_cast<float>(job / kExact % kExact)};
}

uint64_t trainer_zero_job_of(float low, float high) {
  return static_cast<uint64_t>(std::llround(low)) % kExact +
         (static_cast<uint64_t>(std::llround(high)) % kExact) * kExact;
}

void TrainerZeroParts::begin_run(int64_t run) {
  run_ = run;
  recovery_ = 0;
}

void TrainerZeroParts::end_run() { recovery_ = TrainerZeroPart::kAfterRun; }

int64_t TrainerZeroParts::begin_recovery() {
  GPUBOX_EXPECTS(recovery_ + 1 < TrainerZeroPart::kAfterRun,
                 "a recovery begins after a train() run ended");
  return ++recovery_;
}

TrainerZeroPart TrainerZeroParts::next() {
  if (last_.run != run_ || last_.recovery != recovery_) {
    last_ = TrainerZeroPart{0, run_, recovery_, 0};
  }
  ++last_.index;
  TrainerZeroPart part = last_;
  part.job = job;
  return part;
}

double TrainerZeroWork::interval_for(double collective_timeout_s) {
  return std::max(kMinInterval, std::min(0.25, collective_timeout_s / 4));
}

double TrainerZeroWork::call_deadline_for(double collective_timeout_s, double server_timeout_s) {
  return std::min(server_timeout_s, std::max(kMinInterval, collective_timeout_s / 4));
}

double TrainerZeroWork::end_bound_for(double collective_timeout_s, double server_timeout_s) {
  return std::max(collective_timeout_s / 2,
                  collective_timeout_s - call_deadline_for(collective_timeout_s, server_timeout_s) -
                      interval_for(collective_timeout_s));
}

table::server::DenseCall TrainerZeroWork::call_of(double call_s) {
  table::server::DenseCall call;
  call.deadline_s = call_s;
  call.mutation = false;
  return call;
}

std::vector<float> TrainerZeroWork::row(const TrainerZeroPart& part, float state, uint64_t moves,
                                        uint64_t seq) {
  std::vector<float> table = trainer_zero_job_floats(part.job);
  table.insert(table.end(), {static_cast<float>(part.run), static_cast<float>(part.recovery),
                             static_cast<float>(part.index), state,
                             static_cast<float>(moves % kExact), static_cast<float>(seq % kExact)});
  return table;
}

Status TrainerZeroPublishes::send(table::server::RemoteHostTier& servers, const Sent& sent,
                                  double call_s) {
  std::vector<float> table = sent.row;
  table::server::DenseCall call = TrainerZeroWork::call_of(call_s);
  call.request_id = sent.request_id;
  const Status written = servers.dense(DenseAction::kWrite, TrainerZeroWork::kTable, &table, call);
  if (written.ok()) last_answered_ = Clock::now();
  return written;
}

Status TrainerZeroPublishes::publish(table::server::RemoteHostTier& servers, std::vector<float> row,
                                     double call_s) {
  // Nothing newer goes out before the publish not answered: a copy of it the first server still
  // holds would otherwise land after it.
  if (unanswered_) {
    const bool again = unanswered_->row == row;  // this publish, not answered yet
    GPUBOX_RETURN_IF_ERROR(send(servers, *unanswered_, call_s));
    unanswered_.reset();
    if (again) return Status::OK();
  }
  // Unanswered until the server answers: a send that throws leaves it to be sent again first too.
  unanswered_ = Sent{servers.next_request_id(), std::move(row)};
  const Status written = send(servers, *unanswered_, call_s);
  if (written.ok()) unanswered_.reset();
  return written;
}

TrainerZeroWork::TrainerZeroWork(table::server::RemoteHostTier& servers,
                                 TrainerZeroPublishes& publishes, const TrainerZeroPart& part,
                                 double interval_s, double call_s, double end_s,
                                 std::function<std::string()> lost, double max_local_stall_s)
    : servers_(servers),
      publishes_(publishes),
      part_(part),
      interval_s_(interval_s),
      call_s_(call_s),
      end_s_(end_s),
      lost_(std::move(lost)),
      max_local_stall_s_(max_local_stall_s) {
  publish(kRunning, servers_.progress_frames());
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    // The part fails (the meeting tells the others): they stop waiting now.
    publish_end();
    throw;
  }
}

TrainerZeroWork::~TrainerZeroWork() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
  publish_end();
}

bool TrainerZeroWork::publish(float state, uint64_t moves) {
  try {
    const Status written = publishes_.publish(servers_, row(part_, state, moves, ++seq_), call_s_);
    if (written.ok()) return true;
    if (!warned_) {
      warned_ = true;
      GPUBOX_LOG(WARNING) << "trainer 0 cannot show the other trainers how its part " << part_.index
                          << " moves (they fail after runner.collective_timeout_s without a "
                             "move): "
                          << written.to_string();
    }
  } catch (const std::exception& e) {
    GPUBOX_LOG(WARNING) << "trainer 0 cannot show the other trainers how its part " << part_.index
                        << " moves: " << e.what();
  }
  return false;
}

void TrainerZeroWork::publish_end() {
  const auto first = Clock::now();
  const std::vector<float> end = row(part_, kEnded, servers_.progress_frames(), ++seq_);
  int tries = 0;
  std::string cause;  // why it gave up
  try {
    double call_s = call_s_;
    for (;;) {
      ++tries;
      const Status written = publishes_.publish(servers_, end, call_s);
      if (written.ok()) return;
      cause = written.to_string();
      // A lost connection or reply heals; Aborted (the first server found restarted: not until
      // the restart is accepted, after the part) or a refusal does not.
      if (written.code() != Status::Code::kDeadlineExceeded &&
          written.code() != Status::Code::kUnavailable) {
        break;
      }
      if (const std::string lost = lost_ ? lost_() : ""; !lost.empty()) {
        cause = lost + " (the last try: " + cause + ")";
        break;
      }
      // The waiters' silence runs from the last move they may have seen.
      const auto bound =
          std::max(began_, publishes_.last_answered().value_or(began_)) + micros_of(end_s_);
      const auto pause = micros_of(interval_s_);
      const auto left = bound - (Clock::now() + pause);
      if (left < micros_of(kMinInterval)) break;
      std::this_thread::sleep_for(pause);
      call_s = std::min(call_s_, std::chrono::duration<double>(left).count());
    }
  } catch (const std::exception& e) {
    cause = e.what();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - first).count();
  GPUBOX_LOG(WARNING) << "trainer 0 gives up showing the other trainers that its part "
                      << part_.index << " ended, after " << tries << " tries in " << seconds
                      << " s (they may fail after runner.collective_timeout_s naming trainer 0): "
                      << cause;
}

void TrainerZeroWork::run() {
  // Nothing here ends trainer 0 (std::terminate): the waiters fail at their bound instead.
  try {
    uint64_t published = servers_.progress_frames();
    uint64_t local_seen = servers_.local_work().ops();
    MutexLock lock(mu_);
    while (!stopping_) {
      const auto until = Clock::now() + micros_of(interval_s_);
      while (!stopping_ && stop_cv_.wait_until(lock, until) != std::cv_status::timeout) {
      }
      if (stopping_) return;
      const uint64_t moves = servers_.progress_frames();
      // A local file operation under way is a move (the same moves, a new seq) for a while; a
      // publish not answered is sent again (and the newer state after it) every interval.
      const bool local_busy = local_work_moved(&local_seen);
      if (moves == published && !local_busy && !publishes_.unanswered()) continue;
      published = moves;
      lock.unlock();
      publish(kRunning, moves);
      lock.lock();
    }
  } catch (const std::exception& e) {
    GPUBOX_LOG(WARNING) << "trainer 0 stops showing the other trainers how its part " << part_.index
                        << " moves: " << e.what();
  }
}

bool TrainerZeroWork::local_work_moved(uint64_t* seen_ops) {
  std::string stalled;
  const bool moved =
      servers_.local_work().moved(seen_ops, Clock::now(),
                                  std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(max_local_stall_s_)),
                                  &stalled);
  if (!stalled.empty()) {
    GPUBOX_LOG(WARNING) << "trainer 0's " << stalled << " (part " << part_.index
                        << ") has not finished in " << max_local_stall_s_
                        << " s: the other trainers are shown no progress for it any more (they "
                           "fail after runner.collective_timeout_s)";
  }
  return moved;
}

TrainerZeroWait TrainerZeroWait::of(const TrainerZeroPart& part, std::string what,
                                    double collective_timeout_s, double server_timeout_s,
                                    std::string log_hint, std::function<std::string()> lost) {
  TrainerZeroWait wait;
  wait.part = part;
  wait.what = std::move(what);
  wait.silence_s = collective_timeout_s;
  wait.interval_s = TrainerZeroWork::interval_for(collective_timeout_s);
  wait.call_s = TrainerZeroWork::call_deadline_for(collective_timeout_s, server_timeout_s);
  wait.log_hint = std::move(log_hint);
  wait.lost = std::move(lost);
  return wait;
}

void wait_for_trainer_zero(table::server::RemoteHostTier& servers, const TrainerZeroWait& wait) {
  if (wait.part.job == 0) return;  // the job's nonce unknown: the meeting's bound
  std::vector<float> seen;
  int64_t highest_seq = -1;  // of this part, as read so far
  auto last_move = Clock::now();
  std::optional<Clock::time_point> failing_since;  // the reads have failed since
  const auto interval = micros_of(std::max(kMinInterval, wait.interval_s));
  // Short looks first: most parts end within a few of them.
  auto pause = std::min(interval, std::chrono::microseconds(10000));
  for (;;) {
    const std::string lost = wait.lost ? wait.lost() : std::string();
    if (!lost.empty()) GPUBOX_FAIL("waiting for trainer 0 ", wait.what, ": ", lost);
    std::vector<float> table;
    const Status read = read_table(servers, wait.call_s, &table);
    if (!read.ok()) {
      // A server found restarted (Aborted: the meeting on it fails too), or reads failing for
      // the bound: the meeting's bound in all. Else no move yet (a read lost on the way).
      const auto now = Clock::now();
      if (!failing_since) failing_since = now;
      if (read.code() == Status::Code::kAborted ||
          now - *failing_since >= micros_of(wait.silence_s)) {
        GPUBOX_LOG(WARNING) << "cannot follow trainer 0 " << wait.what
                            << " (waiting for it at the meeting, within "
                               "runner.collective_timeout_s): "
                            << read.to_string();
        return;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, interval);
      continue;
    }
    failing_since.reset();
    const Row row = parse(table);
    const bool this_job = row.part.job == wait.part.job;
    const int order = this_job ? compare(row.part, wait.part) : -1;
    if (order > 0) return;  // trainer 0 is past it: it reached the meeting
    // A write of this part older than one already read (applied late) is no move.
    const bool stale = order == 0 && row.seq < highest_seq;
    if (order == 0 && !stale) {
      highest_seq = row.seq;
      if (row.state == TrainerZeroWork::kEnded) return;
    }
    const auto now = Clock::now();
    if (!stale && table != seen) {
      seen = table;
      last_move = now;
    } else if (now - last_move >= micros_of(wait.silence_s)) {
      std::ostringstream silence;
      silence << wait.silence_s;
      GPUBOX_FAIL(
          "trainer 0 made no progress ", wait.what, " for ", silence.str(),
          " s (runner.collective_timeout_s): ",
          order == 0 ? "its part stopped moving" : "it did not begin it (it is stuck before it)",
          " (trainer 0's log, ", wait.log_hint,
          ", names what it was doing; its servers' logs name a SAVE or LOAD that hangs)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, interval);
  }
}

}  // namespace gpubox::trainer
