#include "trainer/ps_modes/merged_pushes.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer::ps_modes {

namespace {
constexpr uint32_t kEmpty = UINT32_MAX;
}  // namespace

MergedPushes::MergedPushes(int threads, int push_dim)
    : threads_(static_cast<std::size_t>(threads)),
      push_dim_(static_cast<std::size_t>(push_dim)),
      shares_(static_cast<std::size_t>(threads)) {
  // Before its first file(), a thread's push is empty: every owner's part of it.
  for (Share& share : shares_) share.owner_start.assign(threads_ + 1, 0u);
}

uint64_t MergedPushes::growths() const {
  uint64_t total = 0;
  for (const Share& share : shares_) total += share.growth.growths();
  return total;
}

void MergedPushes::clear(Share& share, std::size_t keys) const {
  std::size_t entries = 16;
  while (entries < 2 * keys) entries *= 2;
  share.growth.resize(&share.index, entries);
  std::fill(share.index.begin(), share.index.end(), kEmpty);
  share.growth.reserve(&share.keys, keys);
  share.growth.reserve(&share.slots, keys);
  share.growth.reserve(&share.values, keys * push_dim_);
  share.keys.clear();
  share.slots.clear();
  share.values.clear();
}

float* MergedPushes::record(Share& share, uint64_t key, int32_t slot) const {
  const std::size_t mask = share.index.size() - 1;
  std::size_t at = fmix64(key) & mask;
  while (share.index[at] != kEmpty && share.keys[share.index[at]] != key) at = (at + 1) & mask;
  if (share.index[at] == kEmpty) {
    share.index[at] = static_cast<uint32_t>(share.keys.size());
    share.keys.push_back(key);  // within the room clear() made
    share.slots.push_back(slot);
    share.values.resize(share.values.size() + push_dim_, 0.0f);
  }
  return share.values.data() + std::size_t{share.index[at]} * push_dim_;
}

void MergedPushes::file(int t, const ComputedPush& computed) {
  Share& share = shares_.at(static_cast<std::size_t>(t));
  share.filed = computed;
  // Counted per owner first, then placed: one array of the push's n indices, owner by owner.
  const auto owner_of = [this](uint64_t key) { return mix64(key) % threads_; };
  share.growth.resize(&share.by_owner, computed.n);  // kept from step to step
  std::fill(share.owner_start.begin(), share.owner_start.end(), 0u);
  for (std::size_t i = 0; i < computed.n; ++i) ++share.owner_start[owner_of(computed.keys[i]) + 1];
  for (std::size_t o = 0; o < threads_; ++o) share.owner_start[o + 1] += share.owner_start[o];
  for (std::size_t i = 0; i < computed.n; ++i) {  // in index order within each owner's part
    share.by_owner[share.owner_start[owner_of(computed.keys[i])]++] = static_cast<uint32_t>(i);
  }
  // Placing moved each owner's start to the next owner's: back by one owner.
  for (std::size_t o = threads_; o > 0; --o) share.owner_start[o] = share.owner_start[o - 1];
  share.owner_start[0] = 0;
}

ComputedPush MergedPushes::merge(int t) {
  const auto owner = static_cast<std::size_t>(t);
  Share& share = shares_.at(owner);
  std::size_t most = 0;  // this thread's share of every thread's keys
  for (const Share& from : shares_) {
    most += from.owner_start[owner + 1] - from.owner_start[owner];
  }
  clear(share, most);
  for (const Share& from : shares_) {
    for (uint32_t at = from.owner_start[owner]; at < from.owner_start[owner + 1]; ++at) {
      const std::size_t i = from.by_owner[at];
      float* into = record(share, from.filed.keys[i], from.filed.slots[i]);
      const float* add = from.filed.values + i * push_dim_;
      for (std::size_t f = 0; f < push_dim_; ++f) into[f] += add[f];
    }
  }
  return ComputedPush{share.keys.data(), share.slots.data(), share.values.data(),
                      share.keys.size()};
}

void MergedPushes::join_job(uint64_t job, int trainer, int trainers) {
  GPUBOX_EXPECTS(trainer >= 0 && trainer < trainers, "trainer ", trainer, " of ", trainers);
  const std::size_t parts = static_cast<std::size_t>(trainers) * threads_;
  GPUBOX_EXPECTS(trainers == 1 || parts <= table::server::kMaxStepParts, "the sync mode's job of ",
                 trainers, " trainers x ", threads_, " training threads has ", parts,
                 " parts a step, over the servers' limit of ", table::server::kMaxStepParts,
                 " (PS_PUSH step parts): run fewer trainers or fewer threads (cards) each");
  job_ = job;
  for (Share& share : shares_) share.next_step = 0;
  first_part_ = static_cast<uint32_t>(static_cast<std::size_t>(trainer) * threads_);
  parts_ = trainers > 1 ? static_cast<uint32_t>(static_cast<std::size_t>(trainers) * threads_) : 0;
}

void MergedPushes::push(int t, table::server::RemoteHostTier& servers, int64_t pass, int64_t step) {
  const ComputedPush merged = merge(t);
  if (merged.n == 0 && parts_ == 0) return;
  Status pushed;
  if (parts_ == 0) {
    pushed = servers.push_updates(table::server::PsUpdateKind::kGradient, merged.keys, merged.slots,
                                  merged.n, merged.values);
  } else {
    table::server::PsStepPart part;
    part.job = job_;
    part.step = (static_cast<uint64_t>(pass) << 32) | static_cast<uint32_t>(step);
    Share& share = shares_[static_cast<std::size_t>(t)];
    GPUBOX_EXPECTS(part.step >= share.next_step, "pass ", pass, ", step ", step,
                   " pushed again in sync job ", job_,
                   " (a stopped pass trained again?): the servers would take its parts for "
                   "copies of the step they applied and apply nothing; resume from a save, "
                   "which starts a new job");
    share.next_step = part.step + 1;
    part.parts = parts_;
    part.part = first_part_ + static_cast<uint32_t>(t);
    pushed = servers.push_step(part, merged.keys, merged.slots, merged.n, merged.values);
  }
  if (!pushed.ok()) {
    throw_if_error(pushed.with_context("pushing the gradients of pass " + std::to_string(pass) +
                                       ", step " + std::to_string(step) +
                                       " merged over the trainer's threads"));
  }
}

}  // namespace gpubox::trainer::ps_modes
