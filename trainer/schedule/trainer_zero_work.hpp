// Trainer 0's part of a meeting of the trainers of a job (a save, a load into the servers: the
// others wait while trainer 0 alone works), bounded by its progress rather than its total time
// (issue 32): the waiters go on waiting while trainer 0's part moves, and fail within
// runner.collective_timeout_s of its last move, naming trainer 0 and its part, when it stopped
// moving (its SAVE stuck, the trainer itself stuck), or at once when their watch lost a trainer
// or a server.
//
// Trainer 0 publishes its part in the dense table kTable on the first server: {job, part, state,
// moves, seq}. `job` is the job's nonce (TrainerZeroPart::job: trainer 0 draws it, every trainer
// of the job learns it: gathered before the first part, or in PS from trainer 0's ps_outcome), so
// that a table an earlier job left on long-lived servers (its parts numbered alike from 1) is never
// taken for this job's. `part` is {stage, index}: every trainer counts its parts of trainer 0
// alike, the index from 1 again in each stage (one every trainer reaches together: a PS job's
// train() run, each recovery of that run, and the run's end: TrainerZeroParts), so that a part a
// trainer skipped while failing towards a recovery does not shift the count after it. `state` is
// kRunning or kEnded (whether it succeeded or failed: the meeting that follows tells the others
// which), `moves` the PROGRESS frames its client received so far (RemoteHostTier::progress_frames:
// its servers' SAVE, LOAD or SHRINK moved; in the PS modes also each frame of the dense table
// trainer 0's part reads or writes, DenseCall::progress; and each file operation of its own local
// writes of a save, RemoteHostTier::local_work), published again whenever they grew, every
// interval, and while one of those local operations is under way (a long fsync; for up to
// kMaxLocalIoStallS); `seq` counts the part's publishes. Trainer 0's publishes reach the table in
// the order it makes them (TrainerZeroPublishes): a publish the client gave up on, which the first
// server may still apply late, is sent again under its request id before any later one, so that,
// while the first server remembers that id (gpubox_server --dedup_max_age_s, or less when its retry
// cache or trainer 0's share of it, --dedup_client_cache_mb, is full), it never lands after a later
// publish of the part or of the next part (which showed the waiters the part running, or the
// previous part, after its end: they failed naming trainer 0). The part's end is sent again until
// the first server answers it, for end_bound_for after the last publish answered (a dropped end
// left the waiters to fail naming trainer 0, which had finished). Every call to the table is
// bounded by call_deadline_for (a quarter of runner.collective_timeout_s, at most
// runner.server_timeout_s) and is no change of the job's state on the first server
// (DenseCall::mutation): trainer 0 reaches its meeting within about that bound of its part's end
// with the first server restarted (Aborted is not tried again), soon after its watch finds a server
// or a trainer lost, and within end_bound_for while the first server does not answer; and (gpubox
// mode; in the PS modes the heartbeat's adds are changes) a first server restarted from the save
// just written is still adopted quietly.
//
// A waiter reads the table every interval: this job's part `part` ended, or a later part of this
// job (trainer 0 counted one more), it goes to the meeting (which trainer 0 reached or is about
// to); the table unchanged for the bound, it throws. A publish of the part with a lower seq than
// one already read (a copy the server applied after it forgot its request id) is no move. Another
// job's table, or an earlier part, is a part not begun yet: trainer 0 publishes its own as it
// begins it. A read refused as Aborted (the first server found restarted: the meeting on it fails
// too), reads failing for runner.collective_timeout_s (until then a failed read is no move), or a
// job whose nonce the waiter does not know (a PS job's first part), ends the watching: the waiter
// goes to the meeting, bounded by runner.collective_timeout_s in all as before. A failed publish is
// logged once and sent again before the next: while the publishes fail, the waiters fail at the
// bound, naming trainer 0; so they do when trainer 0 gave up on its end (logged, naming why).
//
// Thread-safety: a TrainerZeroWork belongs to one thread (it runs its own), and so does the job's
// TrainerZeroPublishes it uses; wait_for_trainer_zero may run on any thread. All use the
// thread-safe RemoteHostTier.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
struct DenseCall;
}  // namespace gpubox::table::server

namespace gpubox::trainer {

// One part of trainer 0 (the file comment).
struct TrainerZeroPart {
  // `recovery` between two train() runs (after `run`, however it ended): after every stage of the
  // run, exact in the table's floats.
  static constexpr int64_t kAfterRun = int64_t{1} << 23;

  uint64_t job = 0;  // the job's nonce (draw_trainer_zero_job); 0 while unknown
  // The stage every trainer of the job reaches together ({run, recovery} of a PS job:
  // TrainerZeroParts), and the part's number within it, from 1.
  int64_t run = 0;
  int64_t recovery = 0;
  int64_t index = 0;
};

// A job's nonce: never 0, exact in the table's floats (48 bits).
uint64_t draw_trainer_zero_job();
// A nonce as two floats, each exact (24 bits), and back (PS: ps_outcome carries it).
std::vector<float> trainer_zero_job_floats(uint64_t job);
uint64_t trainer_zero_job_of(float low, float high);

// Every trainer's count of its parts of trainer 0 (alike on every trainer of the job), in stages
// every trainer reaches together, so that a part one trainer skipped (failing towards a recovery)
// shifts no count after the stage. The gpubox mode counts in one stage; a PS job's stage is
// {run, recovery}: its train() run (every trainer counts its train() calls alike) and that run's
// recoveries so far (each a meeting of every trainer, named by its number), or kAfterRun once the
// run ended. The recoveries are counted per run, not per job: a recovery that failed (a trainer
// went to its meeting, another did not come) ends the run on every trainer with the counts
// apart, and the next run starts them alike again (a count kept for the job would put that
// trainer's parts one stage after trainer 0's for the rest of the job: it waited for a part
// trainer 0 never begins, and failed after runner.collective_timeout_s).
class TrainerZeroParts {
 public:
  uint64_t job = 0;  // the job's nonce, once known
  // Train() run `run` begins: its parts and recoveries count from the start.
  void begin_run(int64_t run);
  // The run ends, however it ends: the parts until the next run (a save or a load a program calls
  // between train() calls) are stage {run, kAfterRun}.
  void end_run();
  // A recovery of the run begins: its number in the run, from 1 (its meeting's name). Only
  // before end_run (a recovery is of a run).
  int64_t begin_recovery();
  // The next part in the current stage: index 1 in a new stage.
  TrainerZeroPart next();

 private:
  int64_t run_ = 0;
  int64_t recovery_ = 0;
  TrainerZeroPart last_;
};

// Trainer 0's publishes to TrainerZeroWork::kTable over the parts of a job, in the order it makes
// them: one request at a time, and one the client gave up on (its call failed; the first server may
// still apply it, late: a request it read, or that waited in a socket while its threads were busy)
// sent again under its own request id, before anything newer, until the first server answers it.
// The server applies a request id once (its retry cache), so the late copy and the one sent again
// are one write, applied before every publish after it: the table only moves forward through
// trainer 0's publishes. Kept for the job next to the trainer's TrainerZeroParts, so that a part's
// first publish follows the previous part's last.
//
// Why whole writes and not monotone counters added (DenseAction::kAdd) with a total the waiters
// expect: an add the client gave up on is lost or late, which only sending it again under its
// request id tells apart (a new request would count it twice when the first lands late), and
// once every publish is sent so, whole writes already land in order. Only while the first server
// remembers its id, though (--dedup_max_age_s, 120 s, or less when its retry cache or trainer 0's
// share of it is full): a copy that lands after the server forgot it sets the table back to one
// older publish. Of the same part, a waiter that read a newer one ignores it (its seq), where an
// add would count twice. Of the previous part, seq does not tell (it orders one part's publishes
// only): the waiter reads this part not begun yet and waits on, and when that copy lands after this
// part's end, a waiter that had not read the end yet fails after runner.collective_timeout_s
// saying trainer 0 did not begin it.
//
// Thread-safety: one caller at a time (a part's TrainerZeroWork: its thread, then its end).
class TrainerZeroPublishes {
 public:
  // Sends the publish not answered yet, if any, then `row` (the whole table) to the first server,
  // each call bounded by `call_s` and no change of the job's state (TrainerZeroWork::call_of). OK
  // once `row` was answered. Otherwise the publish not answered is kept: `row` when it was sent
  // (also when its send threw), else the earlier one (`row` is dropped: the caller publishes its
  // newer state later).
  // `row` equal to the publish not answered is that publish, sent again under its request id (a
  // part's end tried again, TrainerZeroWork), not a new one.
  Status publish(table::server::RemoteHostTier& servers, std::vector<float> row, double call_s);
  // Whether a publish was not answered yet (the next publish sends it again first).
  bool unanswered() const { return unanswered_.has_value(); }
  // When the first server last answered a publish (a publish sent again included): the last move
  // the waiters may have seen. Empty before the first answer.
  std::optional<std::chrono::steady_clock::time_point> last_answered() const {
    return last_answered_;
  }

 private:
  struct Sent {
    uint64_t request_id = 0;
    std::vector<float> row;
  };
  // Sends `sent` under its request id: OK when the first server answered it (noted in
  // last_answered_).
  Status send(table::server::RemoteHostTier& servers, const Sent& sent, double call_s);

  std::optional<Sent> unanswered_;
  std::optional<std::chrono::steady_clock::time_point> last_answered_;
};

class TrainerZeroWork {
 public:
  static constexpr const char* kTable = "trainer0_work";
  static constexpr float kRunning = 1.0f;
  static constexpr float kEnded = 2.0f;
  // The table's floats: job (2), run, recovery, index, state, moves, seq.
  static constexpr std::size_t kSlots = 8;
  // How long one of trainer 0's local file operations (RemoteHostTier::local_work: an fsync of
  // the save's dense half on a slow disk) may be under way with nothing else moving and still
  // count as a move of its part: as long as gpubox_server's --max_io_stall_s lets a server's SAVE
  // (its default). Longer, the disk is taken for hung: the part shows no move for it (logged
  // once, naming the operation), and the others fail runner.collective_timeout_s later.
  static constexpr double kMaxLocalIoStallS = 600;

  // Trainer 0, as its part `part` begins: publishes it running now, then every `interval_s`
  // while its moves grow, while a local file operation is under way (for up to
  // `max_local_stall_s`: the same moves under a new seq, which the waiters read as a move), or
  // while a publish is not answered, through `publishes` (the job's). Every call to the table is
  // bounded by `call_s` (call_deadline_for), so that this publish delays trainer 0 by little when
  // the first server is lost or restarted: at worst 2 call_s (a publish not answered sent again,
  // then this one). The part's end is tried again for `end_s` (end_bound_for) unless `lost`
  // (trainer 0's watch: a trainer or server lost, "" while none; may be empty) reports a loss.
  // `servers` and `publishes` must outlive this object.
  TrainerZeroWork(table::server::RemoteHostTier& servers, TrainerZeroPublishes& publishes,
                  const TrainerZeroPart& part, double interval_s, double call_s, double end_s,
                  std::function<std::string()> lost, double max_local_stall_s = kMaxLocalIoStallS);
  // Publishes the part ended (whatever its outcome), after any publish not answered yet, and
  // tries again until the first server answers it: a dropped end would leave the waiters to fail
  // at their bound naming trainer 0, which finished. The first try is bounded by call_s; the
  // next ones begin every interval_s until `end_s` after the last publish the first server
  // answered (or the part's start, if later: the last move the waiters saw), each bounded by
  // what is left of it (twice that when the publish not answered before the end is sent again
  // first: the end never lands before it). Only a failure that can heal is tried again (a lost
  // connection or reply, DeadlineExceeded or Unavailable); any other (Aborted: the first server
  // found restarted, which the meeting fails on too) stops at once, as does a loss `lost`
  // reports. Giving up is logged once, naming the cause, the tries and the seconds; an end sent
  // and not answered then stays unanswered in `publishes`, sent again first by the next part.
  // At worst the thread's publishes in flight (2 call_s), then the later of 2 call_s and that
  // bound.
  ~TrainerZeroWork();
  TrainerZeroWork(const TrainerZeroWork&) = delete;
  TrainerZeroWork& operator=(const TrainerZeroWork&) = delete;

  // How often trainer 0 publishes and the waiters read, for a bound of `collective_timeout_s`:
  // a quarter of it, at most 0.25 s, at least 10 ms.
  static double interval_for(double collective_timeout_s);
  // The bound of each call to the table, for runner.collective_timeout_s and
  // runner.server_timeout_s: a quarter of the former, at most the latter, at least 10 ms.
  static double call_deadline_for(double collective_timeout_s, double server_timeout_s);
  // How long trainer 0 tries its part's end again after the last publish answered: the waiters'
  // bound (runner.collective_timeout_s) less one read of theirs (call_deadline_for) and one
  // interval, so that an end answered within it is read before they fail; at least half the
  // bound (each is at most a quarter of it, but for their floors of 10 ms below 40 ms).
  static double end_bound_for(double collective_timeout_s, double server_timeout_s);
  // How a call to the table runs: bounded by `call_s`, and no change of the job's state on the
  // first server (in the gpubox mode a restart of it from the last save is still adopted quietly).
  static table::server::DenseCall call_of(double call_s);
  // The table's floats for `part` in `state`, `moves`, publish `seq` (tests write it directly).
  static std::vector<float> row(const TrainerZeroPart& part, float state, uint64_t moves,
                                uint64_t seq);

 private:
  bool publish(float state, uint64_t moves);
  // The part's end, tried again as the destructor says.
  void publish_end();
  void run();
  // Whether trainer 0's local file work moved since *seen_ops (RemoteHostTier::local_work,
  // bounded by max_local_stall_s_); logs an operation found stalled, once.
  bool local_work_moved(uint64_t* seen_ops);

  table::server::RemoteHostTier& servers_;
  TrainerZeroPublishes& publishes_;
  const TrainerZeroPart part_;
  const double interval_s_;
  const double call_s_;
  const double end_s_;
  const std::function<std::string()> lost_;
  const double max_local_stall_s_;
  const std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();
  uint64_t seq_ = 0;     // publishes so far (the thread's, then the destructor's after the join)
  bool warned_ = false;  // a failed publish was logged
  Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// What a trainer other than trainer 0 waits for (wait_for_trainer_zero).
struct TrainerZeroWait {
  TrainerZeroPart part;      // part.job 0: not watched (the meeting's bound in all)
  std::string what;          // what trainer 0 does, for the error: "to write the save DIR"
  double silence_s = 300;    // runner.collective_timeout_s: the longest trainer 0 may not move
  double interval_s = 0.25;  // TrainerZeroWork::interval_for
  double call_s = 5;         // TrainerZeroWork::call_deadline_for: each read's bound
  // Where trainer 0's log is: "log/worker.0.log under scripts/run_gpubox.sh".
  std::string log_hint;
  // A loss this trainer's watch saw ("" while none): trainer 0 died, or a server was lost.
  std::function<std::string()> lost;

  // The wait for `part` under runner.collective_timeout_s `collective_timeout_s` and
  // runner.server_timeout_s `server_timeout_s`.
  static TrainerZeroWait of(const TrainerZeroPart& part, std::string what,
                            double collective_timeout_s, double server_timeout_s,
                            std::string log_hint, std::function<std::string()> lost);
};

// Returns once trainer 0 ended part `wait.part` or went past it (or the watching ended, see the
// file comment); throws gpubox::Error when trainer 0 did not move for wait.silence_s, naming it
// and wait.what, or at once when wait.lost() reports a loss.
void wait_for_trainer_zero(table::server::RemoteHostTier& servers, const TrainerZeroWait& wait);

}  // namespace gpubox::trainer
