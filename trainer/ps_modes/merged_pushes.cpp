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
      shares_(static_cast<std::size_t>(threads)) {}

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

void MergedPushes::file(int t, const PsWorker::ComputedPush& computed) {
  Share& share = shares_.at(static_cast<std::size_t>(t));
  share.filed = computed;
  share.by_owner.resize(threads_);
  for (std::vector<uint32_t>& owned : share.by_owner) {
    share.growth.reserve(&owned, computed.n);  // kept from step to step
    owned.clear();
  }
  for (std::size_t i = 0; i < computed.n; ++i) {
    share.by_owner[mix64(computed.keys[i]) % threads_].push_back(static_cast<uint32_t>(i));
  }
}

PsWorker::ComputedPush MergedPushes::merge(int t) {
  const auto owner = static_cast<std::size_t>(t);
  Share& share = shares_.at(owner);
  std::size_t most = 0;  // this thread's share of every thread's keys
  for (const Share& from : shares_) most += from.by_owner.empty() ? 0 : from.by_owner[owner].size();
  clear(share, most);
  for (const Share& from : shares_) {
    if (from.by_owner.empty()) continue;
    for (const uint32_t i : from.by_owner[owner]) {
      float* into = record(share, from.filed.keys[i], from.filed.slots[i]);
      const float* add = from.filed.values + std::size_t{i} * push_dim_;
      for (std::size_t f = 0; f < push_dim_; ++f) into[f] += add[f];
    }
  }
  return PsWorker::ComputedPush{share.keys.data(), share.slots.data(), share.values.data(),
                                share.keys.size()};
}

void MergedPushes::push(int t, table::server::RemoteHostTier& servers, int64_t pass, int64_t step) {
  const PsWorker::ComputedPush merged = merge(t);
  if (merged.n == 0) return;
  const Status pushed = servers.push_updates(table::server::PsUpdateKind::kGradient, merged.keys,
                                             merged.slots, merged.n, merged.values);
  if (!pushed.ok()) {
    throw_if_error(pushed.with_context("pushing the gradients of pass " + std::to_string(pass) +
                                       ", step " + std::to_string(step) +
                                       " merged over the trainer's threads"));
  }
}

}  // namespace gpubox::trainer::ps_modes
