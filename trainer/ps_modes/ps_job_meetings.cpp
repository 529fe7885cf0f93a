#include "trainer/ps_modes/ps_job_meetings.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;
using Clock = std::chrono::steady_clock;

// Text travels 3 bytes a float (24 bits: exact in a float), up to its first zero byte.
constexpr std::size_t kBytesPerFloat = 3;
constexpr std::size_t kNameFloats = 43;     // a meeting's name: 129 bytes
constexpr std::size_t kReasonFloats = 171;  // what a failed trainer reported: 513 bytes
constexpr std::size_t kMeetingFloats = 1 + kNameFloats;
constexpr std::size_t kFailureSlot = 1 + kReasonFloats;

// `text` into `floats` floats at `out`, cut (ending in "...") where it does not fit.
void put_text(std::string text, float* out, std::size_t floats) {
  const std::size_t room = floats * kBytesPerFloat;
  if (text.size() > room) text = text.substr(0, room - 3) + "...";
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<uint32_t>(static_cast<unsigned char>(text[i]));
    const uint32_t shift = 8 * static_cast<uint32_t>(i % kBytesPerFloat);
    out[i / kBytesPerFloat] += static_cast<float>(byte << shift);
  }
}

std::string get_text(const float* in, std::size_t floats) {
  std::string text;
  for (std::size_t f = 0; f < floats; ++f) {
    auto packed = static_cast<uint32_t>(std::lround(in[f]));
    for (std::size_t b = 0; b < kBytesPerFloat; ++b, packed >>= 8) {
      const char byte = static_cast<char>(packed & 0xffu);
      if (byte == '\0') return text;
      text += byte;
    }
  }
  return text;
}

}  // namespace

PsJobMeetings::PsJobMeetings(table::server::RemoteHostTier& servers, int trainer_id, int trainers)
    : servers_(servers), trainer_id_(trainer_id), trainers_(trainers) {}

Status PsJobMeetings::reset() {
  std::vector<float> meeting(kMeetingFloats, 0.0f);
  GPUBOX_RETURN_IF_ERROR(
      servers_.dense(DenseAction::kWrite, kMeetingTable, &meeting)
          .with_context("resetting the servers' table " + std::string(kMeetingTable)));
  std::vector<float> failures(kFailureSlot * static_cast<std::size_t>(trainers_), 0.0f);
  return servers_.dense(DenseAction::kWrite, kFailureTable, &failures)
      .with_context("resetting the servers' table " + std::string(kFailureTable));
}

Status PsJobMeetings::meet(const std::string& name, double timeout_s) {
  GPUBOX_EXPECTS(name.size() <= kNameFloats * kBytesPerFloat, "meeting name '", name, "' over ",
                 kNameFloats * kBytesPerFloat, " bytes");
  std::vector<float> arrival(kMeetingFloats, 0.0f);
  arrival[0] = static_cast<float>(met_ + 1);
  put_text(name, arrival.data() + 1, kNameFloats);
  GPUBOX_RETURN_IF_ERROR(servers_.dense(DenseAction::kWrite, kMeetingTable, &arrival)
                             .with_context("arriving at the trainers' meeting " + name));
  arrived_ = met_ + 1;
  GPUBOX_RETURN_IF_ERROR(servers_.barrier(name, static_cast<uint32_t>(trainers_), timeout_s));
  ++met_;
  return Status::OK();
}

StatusOr<std::vector<float>> PsJobMeetings::failures() {
  std::vector<float> all(kFailureSlot * static_cast<std::size_t>(trainers_), 0.0f);
  GPUBOX_RETURN_IF_ERROR(servers_.dense(DenseAction::kRead, kFailureTable, &all)
                             .with_context("reading the trainers' failures"));
  return all;
}

StatusOr<std::string> PsJobMeetings::failure_told() {
  StatusOr<std::vector<float>> all = failures();
  if (!all.ok()) return all.status();
  std::string told;
  for (int w = 0; w < trainers_; ++w) {
    const float* slot = all->data() + kFailureSlot * static_cast<std::size_t>(w);
    if (w == trainer_id_ || std::lround(slot[0]) != met_) continue;
    const std::string who = "trainer " + std::to_string(w);
    told += (told.empty() ? "" : "; ") + who + " failed, so the job stops; " + who +
            " reported: " + get_text(slot + 1, kReasonFloats);
  }
  return told;
}

Status PsJobMeetings::mark_failed(const std::string& reason) {
  if (marked_) return Status::OK();
  marked_ = true;
  std::vector<float> mine(kFailureSlot * static_cast<std::size_t>(trainers_), 0.0f);
  float* slot = mine.data() + kFailureSlot * static_cast<std::size_t>(trainer_id_);
  slot[0] = static_cast<float>(met_ + 1);
  put_text(reason, slot + 1, kReasonFloats);
  return servers_.dense(DenseAction::kAdd, kFailureTable, &mine)
      .with_context("telling the other trainers that trainer " + std::to_string(trainer_id_) +
                    " failed");
}

StatusOr<bool> PsJobMeetings::others_gone() {
  StatusOr<std::vector<float>> all = failures();
  if (!all.ok()) return all.status();
  auto finished = PsPeerWatch::finished(servers_, trainers_);
  if (!finished.ok()) return finished.status();
  for (int w = 0; w < trainers_; ++w) {
    const bool marked = (*all)[kFailureSlot * static_cast<std::size_t>(w)] != 0.0f;
    if (w != trainer_id_ && !marked && !(*finished)[static_cast<std::size_t>(w)]) return false;
  }
  return true;
}

StatusOr<std::string> PsJobMeetings::next_meeting() {
  std::vector<float> meeting(kMeetingFloats, 0.0f);
  GPUBOX_RETURN_IF_ERROR(servers_.dense(DenseAction::kRead, kMeetingTable, &meeting));
  if (std::lround(meeting[0]) != met_ + 1) return std::string();
  return get_text(meeting.data() + 1, kNameFloats);
}

void PsJobMeetings::tell_failure(const std::string& reason, double timeout_s) {
  const bool marked_before = marked_;
  Status told = mark_failed(reason);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  auto pause = std::chrono::milliseconds(10);
  // A mark made before (for a meeting this trainer then met) was told there already; a meeting
  // this trainer arrived at and did not meet (it failed there: its wait ran out, its server was
  // lost) is not waited at again.
  while (told.ok() && !marked_before && arrived_ == met_) {
    StatusOr<std::string> name = next_meeting();
    if (!name.ok() || !name->empty()) {
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      told = name.ok()
                 ? servers_.barrier(*name, static_cast<uint32_t>(trainers_), std::max(0.0, left))
                 : name.status();
      break;
    }
    StatusOr<bool> gone = others_gone();
    told = gone.status();
    if (!gone.ok() || *gone || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, std::chrono::milliseconds(200));
  }
  if (!told.ok()) {
    GPUBOX_LOG(WARNING) << "trainer " << trainer_id_ << " could not tell the other trainers of its "
                        << "failure (they stop at their timeout): " << told.to_string();
  }
}

}  // namespace gpubox::trainer::ps_modes
