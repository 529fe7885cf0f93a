#include "table/server/ps_store.hpp"

#include "common/hash.hpp"
#include "table/accessor/sparse_rule.hpp"
#include "table/server/protocol.hpp"

namespace gpubox::table::server {

Status PsStore::apply(HostTier& table, const PsPushRequest& request) {
  const RowLayout& layout = table.layout();
  const AccessorConfig& config = table.config();
  const std::size_t n = request.keys.size();
  if (n == 0) return Status::OK();
  const auto dim = static_cast<uint32_t>(layout.push_dim());
  if (request.dim != dim) {
    return Status::InvalidArgument("PS_PUSH records of width " + std::to_string(request.dim) +
                                   " sent to a table whose records are " + std::to_string(dim) +
                                   " wide (mf_dim " + std::to_string(layout.mf_dim) + ")");
  }
  const std::size_t bad = first_non_finite(request.values.data(), request.values.size());
  if (bad != request.values.size()) {
    return non_finite_row_error(request.keys.data(), n, request.values.data(), dim, bad);
  }
  std::array<std::vector<uint32_t>, kStripes> by_stripe;
  for (std::size_t i = 0; i < n; ++i) {
    by_stripe[fmix64(request.keys[i]) % kStripes].push_back(static_cast<uint32_t>(i));
  }
  const auto stride = static_cast<std::size_t>(layout.stride());
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  std::vector<float> rows;
  for (std::size_t s = 0; s < kStripes; ++s) {
    const std::vector<uint32_t>& members = by_stripe[s];
    if (members.empty()) continue;
    keys.resize(members.size());
    slots.resize(members.size());
    rows.resize(members.size() * stride);
    for (std::size_t j = 0; j < members.size(); ++j) {
      keys[j] = request.keys[members[j]];
      slots[j] = request.slots[members[j]];
    }
    MutexLock lock(stripes_[s]);
    GPUBOX_RETURN_IF_ERROR(
        table.pull(keys.data(), slots.data(), keys.size(), rows.data(), nullptr));
    for (std::size_t j = 0; j < members.size(); ++j) {
      float* row = rows.data() + j * stride;
      const float* update = request.values.data() + std::size_t{members[j]} * dim;
      if (request.kind == PsUpdateKind::kGradient) {
        optimizer::apply_push(row, layout, config, keys[j], update);
      } else {
        optimizer::apply_delta(row, layout, config, keys[j], update);
      }
    }
    GPUBOX_RETURN_IF_ERROR(table.push(keys.data(), keys.size(), rows.data()));
  }
  return Status::OK();
}

Status PsStore::dense(DenseRequest request, std::vector<uint8_t>* reply) {
  const std::size_t bad = first_non_finite(request.values.data(), request.values.size());
  if (bad != request.values.size()) {
    return Status::InvalidArgument("DENSE '" + request.name + "': value " + std::to_string(bad) +
                                   " is not finite; nothing was applied");
  }
  MutexLock lock(dense_mu_);
  auto it = dense_.find(request.name);
  if (it != dense_.end() && request.action == DenseAction::kWrite) {
    it->second = std::move(request.values);
  } else if (it == dense_.end()) {
    if (request.action == DenseAction::kAdd) {
      return Status::NotFound("DENSE '" + request.name +
                              "': an add to a table no trainer has read (created) yet");
    }
    if (dense_.size() >= kMaxDenseTables) {
      return Status::ResourceExhausted("DENSE '" + request.name + "': this server already holds " +
                                       std::to_string(kMaxDenseTables) + " dense tables");
    }
    it = dense_.emplace(request.name, std::move(request.values)).first;
  } else {
    std::vector<float>& values = it->second;
    if (request.values.size() != values.size()) {
      return Status::InvalidArgument("DENSE '" + request.name + "' holds " +
                                     std::to_string(values.size()) + " values; the request has " +
                                     std::to_string(request.values.size()) +
                                     " (trainers with different models?)");
    }
    if (request.action == DenseAction::kAdd) {
      for (std::size_t i = 0; i < values.size(); ++i) values[i] += request.values[i];
    }
  }
  // Encoded from the table itself: the async mode sends the whole dense net every step.
  encode_dense_reply(it->second.data(), it->second.size(), reply);
  return Status::OK();
}

}  // namespace gpubox::table::server
