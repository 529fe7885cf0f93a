// PsJobMeetings: the meetings of the trainers of a parameter-server job of several (server
// barriers on the first server: PsTrainer::meet), and how a trainer that fails for good tells the
// others at the next one, so that they stop there, naming it and what it reported, instead of
// waiting runner.collective_timeout_s for it (or runner.peer_timeout_s for its heartbeat).
//
// Every trainer goes through the same meetings in the same order, so a meeting has the same index
// on every trainer: the meetings met so far, from 1. Two small tables of the first server:
//   kMeetingTable: {index, name} of the last meeting a trainer arrived at; every trainer arriving
//                  there writes the same.
//   kFailureTable: per trainer, {mark, what it reported (its first 513 bytes)}, added once by the
//                  trainer itself; the mark is the index of the meeting at which it tells it.
// A trainer reads kFailureTable after each meeting it met: a mark naming that meeting ends it
// with the failure (PeerFailed). The failing trainer marks the meeting after the last one it met
// (the one the others go to next), waits until kMeetingTable names it (another trainer arrived
// there), and meets them there. It waits for none that failed too or finished its job
// (PsPeerWatch), and for at most runner.collective_timeout_s; not at all when it failed at that
// meeting itself (its wait ran out there). Both tables are written whole at the job's start,
// before its first meeting; a recovery's start keeps them (the indices go on).
//
// The sync mode's step barriers are not meetings: a trainer that fails within a sync pass is
// still heard at the others' step barrier, at its timeout.
//
// Thread-safety: one controlling thread.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

// Thrown by a meeting at which another trainer told its failure: the job stops. Not a
// gpubox::Error (as PassStopped): no recovery applies, since the failed trainer does not go back
// to a save with the others.
class PeerFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class PsJobMeetings {
 public:
  static constexpr const char* kMeetingTable = "ps_meeting";
  static constexpr const char* kFailureTable = "ps_failures";

  // `servers` must outlive this object.
  PsJobMeetings(table::server::RemoteHostTier& servers, int trainer_id, int trainers);

  // Trainer 0 at the job's start, before its first meeting: both tables written whole.
  Status reset();
  // Whether no meeting was met yet (the job's start, not a recovery's).
  bool none_met() const { return met_ == 0; }
  // Waits at meeting `name` (at most 129 bytes) with every trainer of the job, for at most
  // `timeout_s`; then failure_told() says whether a trainer told its failure there.
  Status meet(const std::string& name, double timeout_s);
  // After meet() returned OK: "trainer w failed, so the job stops; trainer w reported: ..." for
  // each trainer that told its failure at that meeting; "" when none did.
  StatusOr<std::string> failure_told();
  // This trainer failed with `reason`: its mark for the meeting after the last one it met (once a
  // job; a second failure is not marked). Before a meeting the others go to (trainer 0's failed
  // part of a save, which it meets them at), or through tell_failure.
  Status mark_failed(const std::string& reason);
  // This trainer failed for good with `reason`: marked, and met with the others at the meeting
  // they go to next (see the file comment). Never throws: a failure to tell is logged.
  void tell_failure(const std::string& reason, double timeout_s);

 private:
  // kFailureTable as the first server holds it now.
  StatusOr<std::vector<float>> failures();
  // Whether every other trainer failed (marked) or finished its job: none comes to a meeting.
  StatusOr<bool> others_gone();
  // The meeting the others wait at once kMeetingTable names the next one ("" before).
  StatusOr<std::string> next_meeting();

  table::server::RemoteHostTier& servers_;
  const int trainer_id_;
  const int trainers_;
  int64_t met_ = 0;      // meetings met since the job's start
  int64_t arrived_ = 0;  // the index of the last meeting this trainer arrived at
  bool marked_ = false;  // this trainer's failure is marked
};

}  // namespace gpubox::trainer::ps_modes
