#include "trainer/ps_modes/merged_pushes.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

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

void MergedPushes::push(int t, const std::vector<std::unique_ptr<PsWorker>>& workers,
                        table::server::RemoteHostTier& servers, int64_t pass, int64_t step) {
  Share& share = shares_.at(static_cast<std::size_t>(t));
  std::size_t most = 0;  // every thread's keys: room enough whatever the hash sends here
  for (const auto& worker : workers) most += worker->computed_push().n;
  clear(share, most);
  for (const auto& worker : workers) {
    const PsWorker::ComputedPush from = worker->computed_push();
    for (std::size_t i = 0; i < from.n; ++i) {
      if (mix64(from.keys[i]) % threads_ != static_cast<std::size_t>(t)) continue;
      float* into = record(share, from.keys[i], from.slots[i]);
      const float* add = from.values + i * push_dim_;
      for (std::size_t f = 0; f < push_dim_; ++f) into[f] += add[f];
    }
  }
  if (share.keys.empty()) return;
  const Status pushed =
      servers.push_updates(table::server::PsUpdateKind::kGradient, share.keys.data(),
                           share.slots.data(), share.keys.size(), share.values.data());
  if (!pushed.ok()) {
    throw_if_error(pushed.with_context("pushing the gradients of pass " + std::to_string(pass) +
                                       ", step " + std::to_string(step) +
                                       " merged over the trainer's threads"));
  }
}

}  // namespace gpubox::trainer::ps_modes
