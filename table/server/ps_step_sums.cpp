#include "table/server/ps_step_sums.hpp"

#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

#include "common/logging.hpp"
#include "table/server/protocol.hpp"

namespace gpubox::table::server {

namespace {

// What a held chunk costs: its keys, slots and values, and kChunkOverheadBytes (its map node,
// request and allocations: an empty chunk is not free).
std::size_t chunk_bytes(const PsPushRequest& request) {
  return PsStepSums::kChunkOverheadBytes +
         request.keys.size() * (sizeof(uint64_t) + sizeof(int32_t)) +
         request.values.size() * sizeof(float);
}

std::string job_name(uint64_t job) { return "job " + std::to_string(job); }

// "PS_PUSH of <peer>, job J, pass P, step S, part p chunk c".
std::string part_name(const PsStepPart& at, const std::string& peer) {
  return "PS_PUSH of " + peer + ", " + job_name(at.job) + ", " + step_name(at.step) + ", part " +
         std::to_string(at.part) + " chunk " + std::to_string(at.chunk);
}

// Whether `request` is a copy, byte for byte, of the chunk `held` holds at its part and chunk
// (a retry whose reply the retry cache already forgot).
bool is_copy(const std::map<uint32_t, PsPushRequest>& held, const PsPushRequest& request) {
  const auto it = held.find(request.step.chunk);
  if (it == held.end()) return false;
  const PsPushRequest& had = it->second;
  return had.dim == request.dim && had.step.chunks == request.step.chunks &&
         had.keys == request.keys && had.slots == request.slots &&
         had.values.size() == request.values.size() &&
         std::memcmp(had.values.data(), request.values.data(), sizeof(float) * had.values.size()) ==
             0;
}

}  // namespace

std::size_t PsStepSums::step_bytes(uint32_t parts) {
  static_assert(sizeof(Part) <= kPartOverheadBytes);
  return sizeof(Step) + std::size_t{parts} * kPartOverheadBytes;
}

std::string step_name(uint64_t step) {
  return "pass " + std::to_string(step >> 32) + ", step " + std::to_string(step & 0xffffffffu);
}

Status PsStepSums::check_fits(const Step& held, const PsPushRequest& request,
                              const std::string& peer) const {
  const PsStepPart& at = request.step;
  const std::string where = part_name(at, peer);
  if (at.parts != held.parts.size()) {
    return Status::InvalidArgument(where + ": the step has " + std::to_string(at.parts) +
                                   " parts, but its parts before said " +
                                   std::to_string(held.parts.size()) +
                                   " (every trainer of the job must run as many threads)");
  }
  if (request.dim != held.dim) {
    return Status::InvalidArgument(where + ": records of width " + std::to_string(request.dim) +
                                   ", the step's before " + std::to_string(held.dim));
  }
  const Part& part = held.parts[at.part];
  if (part.chunks != 0 && part.chunks != at.chunks) {
    return Status::InvalidArgument(where + " of " + std::to_string(at.chunks) +
                                   ": its chunks before said " + std::to_string(part.chunks));
  }
  if (part.by_chunk.count(at.chunk) != 0) {
    return Status::InvalidArgument(
        where +
        " arrived twice (under another request id: a second job pushing the same step "
        "to these servers?)");
  }
  return Status::OK();
}

void PsStepSums::drop(const std::string& why) {
  std::string missing;
  std::size_t listed = 0;
  for (std::size_t p = 0; p < held_->parts.size(); ++p) {
    const Part& part = held_->parts[p];
    if (part.chunks != 0 && part.by_chunk.size() == part.chunks) continue;
    if (++listed > 8) {
      missing += ", ...";
      break;
    }
    missing += (missing.empty() ? "" : ", ") + std::to_string(p);
  }
  GPUBOX_LOG(WARNING) << "gpubox_server: the sync step of " << job_name(held_->job) << ", "
                      << step_name(held_->step) << " was dropped unapplied (" << why
                      << "): " << held_->whole_parts << " of its " << held_->parts.size()
                      << " parts arrived whole, missing part(s) " << missing
                      << " (part = trainer x threads + thread: a trainer died mid-step, and the "
                         "job failed at the step's barrier naming it)";
  remember_dropped(held_->job, held_->step, why);
  held_.reset();
}

void PsStepSums::remember_dropped(uint64_t job, uint64_t step, const std::string& why) {
  if (dropped_ids_.size() == kMaxDroppedSteps) dropped_ids_.pop_front();
  dropped_ids_.push_back(DroppedStep{job, step, why});
  ++dropped_;
}

Status PsStepSums::check_not_dropped(uint64_t job, uint64_t step) const {
  for (const DroppedStep& dropped : dropped_ids_) {
    if (dropped.job != job || dropped.step != step) continue;
    return Status::NotFound("the sync step of " + job_name(job) + ", " + step_name(step) +
                            " was dropped unapplied before this part arrived (" + dropped.why +
                            "): the job cannot go on; resume it from its last save");
  }
  return Status::OK();
}

std::optional<uint64_t> PsStepSums::last_applied(uint64_t job) const {
  for (const AppliedStep& applied : applied_) {
    if (applied.job == job) return applied.step;
  }
  return std::nullopt;
}

void PsStepSums::remember_applied(uint64_t job, uint64_t step) {
  for (auto it = applied_.begin(); it != applied_.end(); ++it) {
    if (it->job != job) continue;
    applied_.erase(it);
    break;
  }
  if (applied_.size() == kMaxAppliedJobs) applied_.pop_front();
  applied_.push_back(AppliedStep{job, step});
}

Status PsStepSums::check_not_older(const PsStepPart& at, std::optional<uint64_t> last,
                                   const std::string& peer) const {
  std::string after;
  if (last && at.step < *last) {
    after = "its " + step_name(*last) + " was applied already";
  } else if (held_ && held_->job == at.job && at.step < held_->step) {
    after = "its " + step_name(held_->step) + " is held already";
  }
  if (after.empty()) return Status::OK();
  return Status::InvalidArgument(part_name(at, peer) + ": a part of an older step of the job (" +
                                 after +
                                 "; a job's steps go forward), refused: a stale copy of a part "
                                 "summed before, or a second job under the same id");
}

Status PsStepSums::add(PsPushRequest request, const std::string& peer, const Apply& apply,
                       Clock::time_point now) {
  const std::size_t bad = first_non_finite(request.values.data(), request.values.size());
  if (bad != request.values.size()) {
    return non_finite_row_error(request.keys.data(), request.keys.size(), request.values.data(),
                                request.dim, bad);
  }
  std::optional<Step> whole;
  {
    MutexLock lock(mu_);
    const PsStepPart at = request.step;
    GPUBOX_RETURN_IF_ERROR(check_not_dropped(at.job, at.step));
    const std::optional<uint64_t> last = last_applied(at.job);
    if (last && at.step == *last) return Status::OK();  // a late copy: that step summed it
    GPUBOX_RETURN_IF_ERROR(check_not_older(at, last, peer));
    if (request.keys.empty() && at.chunks > 1) {
      return Status::InvalidArgument(part_name(at, peer) + " of " + std::to_string(at.chunks) +
                                     ": an empty chunk in a part of several (a part sends a "
                                     "server an empty chunk only alone, having no key there)");
    }
    // Checked before the part may drop the held step: a part too large for the limit drops none.
    const bool next = held_ && (held_->job != at.job || held_->step != at.step);
    if (held_ && !next && at.part < held_->parts.size() &&
        is_copy(held_->parts[at.part].by_chunk, request)) {
      return Status::OK();  // a retry the retry cache forgot: the step holds it once
    }
    const std::size_t bytes = chunk_bytes(request);
    const std::size_t before = held_ && !next ? held_->bytes : step_bytes(at.parts);
    if (before + bytes > limits_.max_bytes) {
      return Status::ResourceExhausted(
          part_name(at, peer) + ": the sync step would hold " + std::to_string(before + bytes) +
          " bytes, over the limit of " + std::to_string(limits_.max_bytes) +
          " (gpubox_server --max_step_mb)");
    }
    if (next) drop("a part of " + job_name(at.job) + ", " + step_name(at.step) + " arrived");
    if (!held_) held_.emplace(at.job, at.step, request.dim, at.parts, now);
    GPUBOX_RETURN_IF_ERROR(check_fits(*held_, request, peer));
    Part& part = held_->parts[at.part];
    part.chunks = at.chunks;
    part.by_chunk.emplace(at.chunk, std::move(request));
    held_->bytes += bytes;
    if (part.by_chunk.size() == part.chunks) ++held_->whole_parts;
    if (held_->whole_parts < held_->parts.size()) return Status::OK();
    remember_applied(held_->job, held_->step);
    whole = std::move(held_);
    held_.reset();
  }
  Status applied = apply(sum(*whole));
  if (!applied.ok()) {
    // Its parts are no longer held, and the retry cache keeps only successes: a retry of the
    // completing chunk would start the step anew and be answered OK, the step silently lost.
    const std::string why = "applying its sums failed: " + applied.to_string();
    GPUBOX_LOG(WARNING) << "gpubox_server: the sync step of " << job_name(whole->job) << ", "
                        << step_name(whole->step) << ", completed by " << peer
                        << ", was not applied (" << why << ")";
    MutexLock lock(mu_);
    remember_dropped(whole->job, whole->step, why);
  }
  return applied;
}

PsPushRequest PsStepSums::sum(const Step& step) {
  PsPushRequest summed;
  summed.kind = PsUpdateKind::kGradient;
  summed.dim = step.dim;
  const std::size_t dim = step.dim;
  std::unordered_map<uint64_t, std::size_t> index;
  for (const Part& part : step.parts) {
    for (const auto& [chunk, request] : part.by_chunk) {
      for (std::size_t i = 0; i < request.keys.size(); ++i) {
        const float* add = request.values.data() + i * dim;
        const auto [it, fresh] = index.emplace(request.keys[i], summed.keys.size());
        if (fresh) {
          summed.keys.push_back(request.keys[i]);
          summed.slots.push_back(request.slots[i]);
          summed.values.insert(summed.values.end(), add, add + dim);
          continue;
        }
        float* into = summed.values.data() + it->second * dim;
        for (std::size_t f = 0; f < dim; ++f) into[f] += add[f];
      }
    }
  }
  return summed;
}

std::size_t PsStepSums::expire(Clock::time_point now) {
  MutexLock lock(mu_);
  if (!held_ || now - held_->started < limits_.max_wait) return 0;
  drop("its parts did not all come within gpubox_server --step_max_wait_s of its first");
  return 1;
}

std::size_t PsStepSums::held_bytes() const {
  MutexLock lock(mu_);
  return held_ ? held_->bytes : 0;
}

uint64_t PsStepSums::dropped_steps() const {
  MutexLock lock(mu_);
  return dropped_;
}

}  // namespace gpubox::table::server
