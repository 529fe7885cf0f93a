// SyncBarriers: the barriers of every trainer of a sync job within one pass (PsTrainer's pass:
// the step count, each step's pulls and its updates, the pass's last dense window), numbered in
// the order every trainer reaches them, and how a trainer whose step failed on a restarted server
// lets the others out of the barrier they wait at (issue 32), so that all of them meet at the
// pass's end, where the vote on the restart takes them back to the last save together
// (PsTrainer::agree_on_restart).
//
// A trainer's pass fails on a server restart between two of its barriers: every other trainer
// left the barrier before (the failed one came to it), and none can leave the next one, n,
// without it (the one whose push reached the restarted server first waits there; the server lost
// the step). So the failed trainer holds its place at n (hold): it marks n in its slots of the
// servers' table ps_sync_progress (on the first server), and comes to n. Every trainer adds its
// arrival to that table before it waits at a barrier, and the add's reply is the table, marks
// included: hearing of a restart costs no request. A trainer that reads
//   - no mark of this pass: waits at the barrier, as always;
//   - the lowest mark at this barrier: waits there (the failed trainer comes too), then stops;
//   - the lowest mark at an earlier barrier: stops at once, not waiting (it left that barrier
//     before the mark was read, and nobody comes to this one).
// The lowest mark is the first one made: no trainer can be behind the barrier the first failed
// trainer did not reach. Another trainer failing before that barrier marks it too and comes to it
// (it was not left yet); one failing after it left it (it read no mark there) finds the lowest mark
// below its own and does not come to its next barrier. So every trainer comes to the lowest
// marked barrier, and none waits at a later one.
//
// The table holds, per trainer, its arrivals (a timeout names the trainers behind the furthest
// one) and its mark: the pass + 1 and the barrier's number + 1 in two 24-bit halves, exact in a
// float. Trainer 0 zeroes it at the job's start (reset), which a recovery starts again; a trainer
// that marked takes its mark back at the pass's end (forget_mark), for a job that does not start
// again.
//
// Thread-safety: arrive and leave from the trainer's thread 0 between two waits of its threads'
// barrier; hold, forget_mark and heard_restart on the controlling thread after the threads ended.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

class SyncBarriers {
 public:
  // The servers' table of every trainer's arrivals and marks (the file comment).
  static constexpr const char* kProgressTable = "ps_sync_progress";

  // Trainer `trainer_id` of `trainers` in pass `pass`, each barrier waited at for at most
  // `timeout_s` (runner.collective_timeout_s).
  SyncBarriers(table::server::RemoteHostTier& servers, int trainer_id, int trainers, int64_t pass,
               double timeout_s);

  // Trainer 0 at the job's start: every trainer's arrivals and marks zeroed.
  static Status reset(table::server::RemoteHostTier& servers, int trainers);

  // Waits until every trainer reached the pass's next barrier (`what` names it in an error).
  // Throws when the wait failed, naming why (the trainers behind when it ran out), and when
  // another trainer's step failed on a server restart (heard_restart() is then true).
  void arrive(const std::string& what);
  bool heard_restart() const { return heard_; }

  // After the pass's last barrier (thread 0, right after its last arrive): this trainer left the
  // barriers, so a later hold() does nothing (no barrier follows, and nobody would come to one).
  void leave() { next_.reset(); }

  // This trainer's pass failed on a server restart (not of the first server: every trainer finds
  // that at its next call to it) between two barriers: it marks the next one, counting its
  // arrival there as arrive does, and comes to it, unless another trainer marked an earlier one.
  // Nothing once it left the barriers (leave, a call of arrive failed, or it heard of a
  // restart). Never throws: a failure is logged (the restart is known, and the pass's end
  // follows).
  void hold();
  // At the pass's end, once every trainer left its barriers (after the meeting of the pass's
  // vote): hold's mark is taken back, so that this object's next job, when it does not start
  // again (train() called again after a refused recovery), neither reads it nor adds a mark onto
  // it. Never throws: a failure is logged.
  void forget_mark();

 private:
  std::string name(int64_t barrier) const;
  // The lowest barrier marked in this pass in `table` (ps_sync_progress as read back).
  std::optional<int64_t> lowest_mark(const std::vector<float>& table) const;
  [[noreturn]] void fail_wait(const std::string& what, const Status& waited);

  table::server::RemoteHostTier& servers_;
  const int trainer_id_;
  const int trainers_;
  const int64_t pass_;
  const double timeout_s_;
  // The number of the next barrier this trainer comes to; none once it left the barriers.
  std::optional<int64_t> next_ = 0;
  bool heard_ = false;
  // What hold() added to the table, arrival and mark (empty when it added nothing).
  std::vector<float> held_;
};

// Why a barrier on the first server failed, in words: its wait ran out (DeadlineExceeded: the
// server's answer, or no reply before the client's deadline), so a trainer died or is stuck; else
// the first server, which holds it, was lost or restarted.
const char* barrier_failure_cause(const Status& waited);

}  // namespace gpubox::trainer::ps_modes
