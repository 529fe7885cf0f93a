// PsPeerWatch: the lost-peer watch of a parameter-server-mode trainer in a job of several
// (PADDLE_TRAINERS_NUM > 1). PS trainers never talk to each other, only to the servers (often
// the only machines every trainer can reach), so they beat through the first server: every
// peer_timeout / 5 each adds 1 to its own count in the dense table kAliveTable and gets every
// other trainer's count back in the same request; its first beat also sets its begun flag to the
// run it watches (which train(), see below). A count that reached kBeatWrap (2^23) goes back by
// kBeatWrap - 1 at its next beat, and the watch compares counts by inequality only
// (wait_until_failure_seen reads a fall of at least kBeatWrap - 1 as that beat): a float holds
// every count exactly however long the job runs (a count kept going past 2^24 would stop there, its
// trainer then found lost). A trainer that began this run (its begun flag this run's) and whose
// count has not moved for runner.peer_timeout_s since this watch first read it so, while this
// one's requests went through, and that did not say it finished this run (finish()), is lost: its
// process died or was stopped, or its link to the servers is down. One that has not begun this
// run (still starting, or its watch of the run before still beating as it leaves that run's last
// meeting) is judged, in run 1 only, by a longer bound, begin_timeout_s
// (runner.collective_timeout_s: what a meeting waits for a trainer) after this watch's first
// beat: every trainer passed the job's start meeting (ps/start, PsTrainer's constructor) just
// before its first train(), so one that has not begun by then died or is stuck before its
// train(), or cannot reach the first server (named "did not begin training run 1"). A slow
// starter within the bound is not judged; one slower is taken for one that never comes, as a
// meeting that waited as long would take it (though the run's first meeting, reached later, might
// still have seen it come: a program must not hold one trainer's first train() that long after
// the others'). A later run (train() called again) has no common start: the trainers come to it
// from whatever the program does between calls, so one not begun is never judged by a bound; it
// is found at the run's first meeting's timeout (in the async and geo modes, the end of its first
// pass), as one that never came to run 1 was before the bound. When this watch finds the first
// server restarted empty (its own begun flag, read set before, gone; or the first server another
// instance, its trainer having accepted the restart: its beats failed until then), every trainer's
// flag and count went with it: in any run, every trainer whose flag is not back is judged as one
// not begun, and by one bound only, after_loss_timeout_s from then (PsTrainer: (kRecoveryWaits + 1)
// times runner.collective_timeout_s plus runner.peer_timeout_s, what the recovery's meeting waits
// for a trainer, from its start, later than this): after such a restart a trainer's calls, its
// watch's beats too, fail until it accepts the restart, which the trainers do at different times
// (one as it finds the restart, another only as it comes to that meeting), so its count standing
// still says nothing. Its next beat that goes through sets its flag again, and from there it is
// judged by its silence. A server silent for runner.peer_timeout_s is lost too (ServerPings).
// Without the watch, such a loss was seen only at the next barrier, runner.collective_timeout_s
// later (5 minutes by default) — in the async and geo modes, only at the job's end.
//
// A trainer that fails for good (any error of its own: unreadable data, a save it cannot write)
// says so with its heartbeat (mark_failed): its failed flag in kAliveTable and what it reported in
// kFailureTable. Every other trainer's next beat sees the flag and reports the trainer lost with
// its reason ("trainer 1 of 2 failed: ..."), within one beat, not runner.peer_timeout_s or
// runner.collective_timeout_s later; the failed trainer waits for those beats
// (wait_until_failure_seen, at most runner.peer_timeout_s) and ends. The flag holds the run it
// was marked in (which train() of the trainers' objects: PsTrainer counts them alike on every
// trainer), and a watch reports only a flag of its own run: a mark left by an earlier train()
// (a C++ program calling PsTrainer::train() again on the same objects, which must call it the
// same number of times on every trainer) is stale, and must not stop a trainer that began
// the next train() first: its trainer takes it back as its next train() starts, before its watch
// does (and so before it has begun that run). A trainer whose failed flag is an earlier run's is
// judged as any other.
// Two trainers failing at once may both mark (PsTrainer::tell_failure looks for a mark, then
// marks: not one atomic step). Neither reports the other; every other trainer reports both: in
// one report when one beat saw both marks ("trainer 1 of 3 failed: ...; trainer 2 of 3 failed:
// ..."), else the second, seen at a later beat, is logged and added to lost() and to the forced
// end's line (a trainer whose training threads stopped with the first before names only it, its
// log and that line both).
//
// A loss is reported once: logged as an error, kept for lost() (the training threads check it
// between steps and stop with it), and, as the gpubox mode's watch does, the process is ended
// after `exit_grace_s` at the latest (a trainer blocked in a barrier cannot be woken). When the
// loss was another trainer's reported failure, the watch's destructor cancels that end: it runs
// as train() unwinds, no barrier of this trainer left blocked, and the servers answered the beat
// that read the mark (a Python process that caught the error goes on). A lost trainer or server
// keeps it: the trainer's teardown may hang in a call to that server.
//
// The tables, zeroed by reset() at the job's start (trainer 0, before any trainer's watch starts;
// a recovery's restart of the job zeroes the beats and finished flags only, in one add that
// leaves the failed and begun flags alone, since other trainers may mark theirs meanwhile and
// their watches go on beating in the run):
//   kAliveTable: {beats of trainer 0 .. T-1, finished flags of 0 .. T-1 (each 0, or the last run
//                 it finished), failed flags of 0 .. T-1 (each 0, or the run it was marked in),
//                 begun flags of 0 .. T-1 (each 0, or the last run its watch beat in)}
//   kFailureTable: per trainer, the run it reported its failure in (0: outside any train()),
//                  then what it reported (its first 513 bytes, cut at a character's boundary),
//                  3 bytes a float: 1 + 171 floats. A reason of another run is never reported.
//
// Thread-safety: construct, finish() and destroy from one thread; lost() from any.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

struct PsPeerWatchOptions {
  double peer_timeout_s = 10;  // runner.peer_timeout_s
  double exit_grace_s = 5;     // after a loss, the longest the process may take to end; 0: never
  // In run 1 only: a trainer that has not begun this run so long after this watch's first beat is
  // lost (no meeting waits longer for it). PsTrainer passes runner.collective_timeout_s (at least
  // 1e-3); <= 0 (tests) judges none.
  double begin_timeout_s = 300;
  // After this watch found the first server's table lost (a first server restarted empty: every
  // begun flag went with it), in any run: a trainer whose begun flag is not this run is lost only
  // this long after the loss was found (until then it is not judged, by its silence neither: its
  // beats fail until it accepts the restart). PsTrainer passes (PsTrainer::kRecoveryWaits + 1)
  // times runner.collective_timeout_s plus runner.peer_timeout_s (what the recovery's meeting
  // waits for it, from its start, later than the loss found here); <= 0 judges none.
  double after_loss_timeout_s = 900;
  int run = 1;  // the run (train()) of the job it watches: only failed flags of this run count
};

// Thrown by a trainer told that another trainer of its job failed (at a meeting, by what that
// trainer marked): it does not tell the others in turn (PsTrainer::tell_failure).
class PeerFailed : public Error {
 public:
  using Error::Error;
};

// Who reads a failure's mark (PsPeerWatch::mark_failed).
enum class FailureNotice {
  kAtMeeting,  // only the trainers that read it after the meeting they wait at with this one
  kToWatches,  // every other trainer's watch too, at its next beat
};

class PsPeerWatch {
 public:
  static constexpr const char* kAliveTable = "ps_alive";
  static constexpr const char* kFailureTable = "ps_failures";
  // kAliveTable's sections, each one float per trainer (see the file comment).
  static constexpr std::size_t kBeatSection = 0;
  static constexpr std::size_t kFinishedSection = 1;
  static constexpr std::size_t kFailedSection = 2;
  static constexpr std::size_t kBegunSection = 3;
  static constexpr std::size_t kAliveSections = 4;
  // A count at or past this goes back by kBeatWrap - 1 at its next beat (see the file comment).
  static constexpr float kBeatWrap = 8388608.0f;  // 2^23
  // The longest text of kFailureTable, in bytes.
  static constexpr std::size_t kReasonBytes = 513;

  // Zeroes kAliveTable and kFailureTable for a job of `trainers` (whatever an earlier job on these
  // servers left). `keep_failures` (a recovery's restart of the job, other trainers' watches
  // beating): only the beats and finished flags go back to 0, by one add of what a read found
  // there (a beat between the two stays counted); the failed and begun flags and the reasons are
  // not written, so that a mark made just before, or meanwhile, is not wiped, and the trainers
  // beating in the run stay begun (a watch's beats set its begun flag again when it is lost: a
  // first server restarted empty).
  static Status reset(table::server::RemoteHostTier& servers, int trainers,
                      bool keep_failures = false);
  // Trainer `trainer_id` of `trainers` failed for good in run `run` with `reason` (""
  // reads as "(it reported no reason)"): failure_of reads it (a second mark in a job replaces the
  // first); with FailureNotice::kToWatches every other trainer's watch of that run also reports
  // it at its next beat (and ends its process exit_grace_s later, as for a lost trainer), and
  // `*alive_at_mark` (may be null) is kAliveTable as the flag's add left it: every beat counted
  // past it saw the flag (wait_until_failure_seen). `run` (the flag's value) must be >= 1 with
  // kToWatches (InvalidArgument otherwise); kAtMeeting sets no flag. Needs no watch running.
  static Status mark_failed(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                            const std::string& reason, FailureNotice notice, int run,
                            std::vector<float>* alive_at_mark = nullptr);
  // Takes back trainer `trainer_id`'s mark (its reason and failed flag zeroed): a new train() of
  // the same trainer, in the job of the old one.
  static Status clear_failure(table::server::RemoteHostTier& servers, int trainer_id, int trainers);
  // The first trainer other than `trainer_id` whose failed flag is set in run `run`
  // (kToWatches), -1 if none. (Run 1: the first train() of the trainers' objects.)
  static StatusOr<int> failed_peer(table::server::RemoteHostTier& servers, int trainer_id,
                                   int trainers, int run);
  // Reads every run's reason (failure_of): a check of what a job's tables hold, not a trainer's.
  static constexpr int kAnyRun = -1;
  // What trainer `trainer_id` reported as it failed in run `run` ("" while it did not, or when
  // what it reported was an earlier run's: a mark of an earlier train() is stale). A mark made
  // outside any train() (the constructor's meetings) holds run 0.
  static StatusOr<std::string> failure_of(table::server::RemoteHostTier& servers, int trainer_id,
                                          int trainers, int run);
  // `reason` as kFailureTable holds it: cut to kReasonBytes at a UTF-8 character's boundary,
  // ending in "..." when cut. For the tests.
  static std::string stored_reason(const std::string& reason);

  // Starts beating and watching (the first beat sets this trainer's begun flag to options.run,
  // which must be >= 1). `on_lost` (may be empty) is called once, on a watch thread, with the
  // first loss's reason. `servers` must outlive the watch.
  PsPeerWatch(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
              PsPeerWatchOptions options,
              std::function<void(const std::string&)> on_lost = nullptr);
  // Stops beating without saying finished: the others see this trainer's count stop. Cancels
  // the forced end of a loss that was another trainer's reported failure (see the file comment).
  ~PsPeerWatch();
  PsPeerWatch(const PsPeerWatch&) = delete;
  PsPeerWatch& operator=(const PsPeerWatch&) = delete;

  // This trainer ended its run (its finished flag set to options.run): tells the others (they
  // stop watching it) and stops the watch.
  Status finish();
  // The first loss seen ("" while none). Cheap while there is none.
  std::string lost() const;
  // This trainer is failing (PsTrainer::tell_failure began): from the next beat on, the watch
  // judges no other trainer, neither by its failed flag nor as lost (a failure every trainer hit
  // at once, marked by another, is not this one's loss: it would end this process exit_grace_s
  // later); its beats go on, as with this trainer's own failed flag set. Any thread.
  void ignore_failed_peers() { failing_.store(true, std::memory_order_release); }
  // After mark_failed for this trainer: waits until every other trainer still in the job (not
  // finished in this run, not failed, beating) has beaten past `alive_at_mark` (mark_failed's;
  // empty: the table as this wait first reads it), so its watch saw the mark; at most
  // `timeout_s` (then DeadlineExceeded, naming the trainers that did not beat), and not past
  // `*stop` (may be null) turning true (then OK). A peer that saw the mark before this wait
  // began counts: the mark's own add set the baseline. A trainer that has not begun this run
  // (its begun flag an earlier run's) is not waited for: its watch reports the mark as it
  // starts. An error when the first server does not answer.
  Status wait_until_failure_seen(const std::vector<float>& alive_at_mark, double timeout_s,
                                 const std::atomic<bool>* stop);

 private:
  // Sets trainer `trainer_id`'s reason to `stored`, reported in run `reason_run`, and, unless
  // `flag` < 0, its failed flag to `flag` (see mark_failed; `*alive` the table after the flag's
  // add, when not null).
  static Status set_own_failure(table::server::RemoteHostTier& servers, int trainer_id,
                                int trainers, const std::string& stored, int reason_run, float flag,
                                std::vector<float>* alive);
  // What each trainer reported in run `run` (failure_of), in one read; empty when the table is
  // not this job's size.
  static StatusOr<std::vector<std::string>> failures(table::server::RemoteHostTier& servers,
                                                     int trainers, int run);
  struct Peers;
  void beat_loop();
  void report_failed_peers(const std::vector<float>& values, std::vector<bool>* reported);
  // Reports every other trainer lost by `values` (the heartbeat table as a beat at `now` left
  // it): silent for peer_timeout_s since it began this run, or not begun begin_timeout_s after
  // this watch's first beat (run 1), or not begun again after_loss_timeout_s after the table was
  // found lost.
  void judge_peers(const std::vector<float>& values, std::chrono::steady_clock::time_point now,
                   Peers* peers);
  void ping_loop();
  // Waits one interval; false once stopping.
  bool wait_interval();
  // What was lost: a trainer whose heartbeat stopped, a server, or another trainer's reported
  // failure (its failed flag: the only loss whose forced end the destructor cancels).
  enum class Loss { kTrainer, kServer, kPeerFailed };
  void on_lost(const std::string& reason, Loss loss);
  void stop();

  table::server::RemoteHostTier& servers_;
  const int trainer_id_;
  const int trainers_;
  const PsPeerWatchOptions options_;
  const std::function<void(const std::string&)> on_lost_;
  std::atomic<bool> any_lost_{false};
  std::atomic<bool> failing_{false};
  mutable Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  std::string lost_ GPUBOX_GUARDED_BY(mu_);
  ForcedExit forced_exit_ GPUBOX_GUARDED_BY(mu_);  // the first loss's, naming lost()
  // The first loss was another trainer's reported failure: later ones are added to lost().
  bool first_lost_peer_failed_ GPUBOX_GUARDED_BY(mu_) = false;
  // ... and no server was lost since: the destructor cancels the forced end.
  bool lost_peer_failed_ GPUBOX_GUARDED_BY(mu_) = false;
  std::thread beat_thread_;
  std::thread ping_thread_;
};

}  // namespace gpubox::trainer::ps_modes
