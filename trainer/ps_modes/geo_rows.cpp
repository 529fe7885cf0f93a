#include "trainer/ps_modes/geo_rows.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_row/optimizer.hpp"

namespace gpubox::trainer::ps_modes {

GeoRows::GeoRows(table::server::RemoteHostTier& servers)
    : servers_(servers),
      layout_(servers.layout()),
      config_(servers.config()),
      stride_(static_cast<std::size_t>(layout_.stride())),
      push_dim_(static_cast<std::size_t>(layout_.push_dim())) {}

void GeoRows::read(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                   uint32_t* locals) {
  // One hash lookup per key (every step of the thread reads its batch's keys here).
  std::vector<std::size_t>& missing = missing_;
  missing.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const auto it = index_.find(keys[i]);
    if (it == index_.end()) {
      missing.push_back(i);
    } else {
      locals[i] = it->second;
    }
  }
  if (!missing.empty()) {
    const std::size_t first = keys_.size();
    std::vector<uint64_t> missing_keys(missing.size());
    std::vector<int32_t> missing_slots(missing.size());
    for (std::size_t j = 0; j < missing.size(); ++j) {
      missing_keys[j] = keys[missing[j]];
      missing_slots[j] = slots[missing[j]];
    }
    rows_.resize((first + missing.size()) * stride_);
    synced_.resize((first + missing.size()) * push_dim_);
    throw_if_error(servers_
                       .pull(missing_keys.data(), missing_slots.data(), missing.size(),
                             rows_.data() + first * stride_, nullptr)
                       .with_context("geo: pulling new rows from the servers"));
    for (std::size_t j = 0; j < missing.size(); ++j) {
      const auto local = static_cast<uint32_t>(first + j);
      index_.emplace(missing_keys[j], local);
      keys_.push_back(missing_keys[j]);
      is_dirty_.push_back(0);
      table::fill_pull_record(row(local), layout_, synced_.data() + std::size_t{local} * push_dim_);
      locals[missing[j]] = local;
    }
  }
  for (std::size_t i = 0; i < n; ++i) std::copy_n(row(locals[i]), stride_, rows + i * stride_);
}

void GeoRows::apply(const uint32_t* locals, std::size_t n, const float* push) {
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t local = locals[i];
    if (table::optimizer::apply_push(row(local), layout_, config_, keys_[local],
                                     push + i * push_dim_)) {
      // Created here at the key's initial values, as the servers create it from the first delta
      // (apply_delta): its delta counts from them, so that they count once however many
      // trainers create the part.
      std::copy_n(
          row(local) + layout_.embedx_w(), layout_.mf_dim,
          synced_.data() + std::size_t{local} * push_dim_ + table::optimizer::PushRecord::kEmbedxG);
    }
    if (!is_dirty_[local]) {
      is_dirty_[local] = 1;
      dirty_.push_back(local);
    }
  }
}

void GeoRows::adopt(float* local, const float* merged) const {
  using table::RowLayout;
  for (int32_t f :
       {RowLayout::kShow, RowLayout::kClick, RowLayout::kDeltaScore, RowLayout::kUnseenDays}) {
    local[f] = merged[f];
  }
  table::write_embed_w(local, layout_, table::read_embed_w(merged, layout_));
  if (merged[layout_.mf_size()] <= 0.0f) return;  // no embedx on the servers: keep the local one
  if (local[layout_.mf_size()] <= 0.0f) {
    // Created by another trainer: its state starts here.
    table::detail::init_state(local + layout_.embedx_state(), layout_.embedx_state_dim,
                              config_.optimizer);
    local[layout_.mf_size()] = merged[layout_.mf_size()];
  }
  for (int32_t i = 0; i < layout_.mf_dim; ++i) {
    table::write_embedx_w(local, layout_, i, table::read_embedx_w(merged, layout_, i));
  }
}

std::size_t GeoRows::sync(float scale) {
  const std::size_t n = dirty_.size();
  if (n == 0) return 0;
  std::vector<uint64_t> keys(n);
  std::vector<int32_t> slots(n);
  std::vector<float> deltas(n * push_dim_);
  std::vector<float> record(push_dim_);
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t local = dirty_[i];
    keys[i] = keys_[local];
    slots[i] = static_cast<int32_t>(row(local)[layout_.slot()]);
    table::fill_pull_record(row(local), layout_, record.data());
    const float* synced = synced_.data() + std::size_t{local} * push_dim_;
    for (std::size_t f = 0; f < push_dim_; ++f) {
      const float moved = record[f] - synced[f];
      deltas[i * push_dim_ + f] =
          f < static_cast<std::size_t>(table::optimizer::PushRecord::kEmbedG) ? moved
                                                                              : moved * scale;
    }
  }
  throw_if_error(servers_
                     .push_updates(table::server::PsUpdateKind::kDelta, keys.data(), slots.data(),
                                   n, deltas.data())
                     .with_context("geo: pushing the deltas of " + std::to_string(n) + " rows"));
  std::vector<float> merged(n * stride_);
  throw_if_error(servers_.pull(keys.data(), slots.data(), n, merged.data(), nullptr)
                     .with_context("geo: pulling the merged rows"));
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t local = dirty_[i];
    adopt(row(local), merged.data() + i * stride_);
    table::fill_pull_record(row(local), layout_, synced_.data() + std::size_t{local} * push_dim_);
    is_dirty_[local] = 0;
  }
  dirty_.clear();
  return n;
}

}  // namespace gpubox::trainer::ps_modes
