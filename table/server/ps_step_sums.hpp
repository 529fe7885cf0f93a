// PsStepSums: the sync mode's sparse step of a job of several trainers on one gpubox_server
// (PS_PUSH kStepGradient, ps_protocol.hpp). Each trainer sends its step's gradients merged over
// its threads, one part a thread (that thread's hash share of the trainer's keys); the server
// holds them until every part of the job's step arrived, then sums each key's gradients in part
// order (so the sum does not depend on the order the parts arrive in) and applies the rule once
// to the sum, as the gpubox mode's cards sum a key's gradients before its rule. Applied one
// after another, two trainers' pushes of a key made two updates (two Adam or Adagrad steps on
// half the gradient each; rows 0.04 apart from two cards after one step, issue 32).
//
// A step is applied whole or not at all. Held parts of a step that never completes (a trainer died
// mid-step: the others then fail at the step's barrier, naming it) are dropped, unapplied and
// logged, when a part of a newer step of its job or of another job arrives (the next job's first
// step) or when its parts did not all come within StepSumsLimits::max_wait of its first (the
// server's sweep: expire), or when applying it failed (remembered so; its apply's error is the
// reason); a part refused (too large, empty in a part of several; the server's handler refuses one
// of the table's wrong width before) drops nothing; a part of an older step of the held step's job
// never drops it (a job's steps go forward: such a part is a stale copy, answered OK when its step
// was the job's last applied, else refused); a copy, byte for byte, of a chunk the held step holds
// (a retry the retry cache forgot) is answered OK and held once, other bytes for it refused. A
// part of a dropped step that arrives after all (a
// straggler slower than max_wait) is refused, naming the step and why it was dropped, so that its
// trainer fails instead of going on without the step. One step is held at a time (the sync mode's
// barriers never let a trainer push step s + 1 before every trainer's push of step s returned,
// which is after the part completing it was applied).
//
// Thread-safety: every method may be called from any server thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/ps_protocol.hpp"

namespace gpubox::table::server {

// What bounds the held step (ServerOptions: max_step_bytes, step_max_wait_s).
struct StepSumsLimits {
  // The held step's parts (kPartOverheadBytes each) and chunks (kChunkOverheadBytes each, and
  // their keys, slots and values): the chunks a step holds are at most max_bytes /
  // kChunkOverheadBytes.
  std::size_t max_bytes = std::size_t{4} << 30;
  // A step whose parts did not all arrive within max_wait of its first is dropped (counted from
  // its start, not its last chunk: a client dripping chunks cannot hold the memory longer).
  std::chrono::steady_clock::duration max_wait = std::chrono::seconds(120);
};

class PsStepSums {
 public:
  using Clock = std::chrono::steady_clock;
  // Applies a step's summed gradients (kind kGradient, distinct keys) to the table.
  using Apply = std::function<Status(const PsPushRequest& summed)>;

  // What a held chunk and a step's part cost besides their keys, slots and values (a chunk: its
  // map node, request and allocations, about 160 bytes even empty; a part: sizeof(Part)).
  static constexpr std::size_t kChunkOverheadBytes = 256;
  static constexpr std::size_t kPartOverheadBytes = 128;

  explicit PsStepSums(StepSumsLimits limits = {}) : limits_(limits) {}
  // What a step of `parts` parts costs held before any chunk: the step and its parts.
  static std::size_t step_bytes(uint32_t parts);

  // Holds `request` (a kStepGradient PS_PUSH of `peer`, which the messages name: "client C at
  // ADDRESS"); when it completes its step, sums the step (part order, then chunk order) and calls
  // `apply` on the sum, outside the lock, returning its status (a step whose apply failed is
  // remembered as dropped, the failure its reason, and logged). Refuses (InvalidArgument, nothing
  // held) a chunk received before, an empty chunk of a part of several (the client sends one only
  // alone), a part whose chunk count, a step whose part count or a chunk whose record width
  // disagrees with what arrived before, and non-finite values; ResourceExhausted past
  // StepSumsLimits::max_bytes; NotFound for a part of one of the kMaxDroppedSteps steps dropped
  // last; a part of the step its job applied last is answered OK (it was summed in it), one of an
  // older step refused (InvalidArgument). A part of a newer step of the held step's job, or of
  // another job, drops the held step first (logged, naming the parts missing).
  Status add(PsPushRequest request, const std::string& peer, const Apply& apply,
             Clock::time_point now = Clock::now());
  // Drops the held step when its parts did not all arrive within StepSumsLimits::max_wait of its
  // first, before `now` (logged);
  // returns how many steps it dropped (0 or 1).
  std::size_t expire(Clock::time_point now);
  std::size_t held_bytes() const;
  uint64_t dropped_steps() const;

 private:
  struct Part {
    uint32_t chunks = 0;  // 0: none of it arrived yet
    std::map<uint32_t, PsPushRequest> by_chunk;
  };
  struct Step {
    // Not a default constructor: std::optional<Step> below is declared before Step's member
    // initializers are parsed, where clang takes Step for not default-constructible.
    Step(uint64_t job_id, uint64_t step_id, uint32_t record_dim, uint32_t part_count,
         Clock::time_point first_part)
        : job(job_id),
          step(step_id),
          dim(record_dim),
          parts(part_count),
          bytes(step_bytes(part_count)),
          started(first_part) {}
    uint64_t job = 0;
    uint64_t step = 0;
    uint32_t dim = 0;
    std::vector<Part> parts;
    uint32_t whole_parts = 0;   // parts every chunk of which arrived
    std::size_t bytes = 0;      // step_bytes(parts), and chunk_bytes() a chunk held
    Clock::time_point started;  // its first part's arrival: max_wait counts from it
  };
  // Checks `request` against the held step (the same job and step); InvalidArgument naming why.
  Status check_fits(const Step& held, const PsPushRequest& request, const std::string& peer) const
      GPUBOX_REQUIRES(mu_);
  // Drops the held step, logging `why` and the parts missing, and remembers it (dropped_ids_).
  void drop(const std::string& why) GPUBOX_REQUIRES(mu_);
  // Remembers (job, step) as dropped, `why` its reason, in dropped_ids_; counts it.
  void remember_dropped(uint64_t job, uint64_t step, const std::string& why) GPUBOX_REQUIRES(mu_);
  // NotFound when (job, step) is a step dropped_ids_ remembers, else OK.
  Status check_not_dropped(uint64_t job, uint64_t step) const GPUBOX_REQUIRES(mu_);
  // The step of `job` applied last, when applied_ remembers the job.
  std::optional<uint64_t> last_applied(uint64_t job) const GPUBOX_REQUIRES(mu_);
  void remember_applied(uint64_t job, uint64_t step) GPUBOX_REQUIRES(mu_);
  // InvalidArgument for a part of a step of its job older than the one applied last (`last`) or
  // than the one held: a job's steps go forward, so it is a stale copy (or a second job under
  // the id), and must neither be held nor drop the held step.
  Status check_not_older(const PsStepPart& at, std::optional<uint64_t> last,
                         const std::string& peer) const GPUBOX_REQUIRES(mu_);
  // The held step's gradients summed per key, in part order and chunk order.
  static PsPushRequest sum(const Step& step);

  const StepSumsLimits limits_;
  mutable Mutex mu_;
  std::optional<Step> held_ GPUBOX_GUARDED_BY(mu_);
  uint64_t dropped_ GPUBOX_GUARDED_BY(mu_) = 0;
  struct DroppedStep {
    uint64_t job = 0;
    uint64_t step = 0;
    std::string why;
  };
  static constexpr std::size_t kMaxDroppedSteps = 64;
  std::deque<DroppedStep> dropped_ids_ GPUBOX_GUARDED_BY(mu_);  // the last dropped, oldest first
  // The step each of the kMaxAppliedJobs jobs that applied one last applied last, the job that
  // applied longest ago first: a part of that step arriving again (a retry the retry cache
  // forgot, or a stale copy from a closed connection) was summed in it and is answered OK, and a
  // part of an older step is refused; neither touches the held step.
  struct AppliedStep {
    uint64_t job = 0;
    uint64_t step = 0;
  };
  static constexpr std::size_t kMaxAppliedJobs = 64;
  std::deque<AppliedStep> applied_ GPUBOX_GUARDED_BY(mu_);
};

// "pass P, step S" of a PsStepPart::step.
std::string step_name(uint64_t step);

}  // namespace gpubox::table::server
