// SparseShard's rows between memory and the disk tier: shrink (aging, deletion, cold rows to
// disk), a load's replay of shrinks (rows in memory and on disk), and the memory limits (rows, and
// the row storage's bytes) kept by eviction.
#include <algorithm>
#include <cstring>

#include "table/sparse_shard.hpp"

namespace gpubox::table {

namespace {

// The days of aging a shrink gives a row, one a rate, without the rules' verdict: show and click
// times each rate in turn (not their product: a live table multiplied once a day), unseen days
// plus one each.
void decay_days(float* row, const float* decay_rates, std::size_t days) {
  for (std::size_t d = 0; d < days; ++d) {
    row[RowLayout::kShow] *= decay_rates[d];
    row[RowLayout::kClick] *= decay_rates[d];
    row[RowLayout::kUnseenDays] += 1.0f;
  }
}

}  // namespace

bool age_row_one_day(float* row, const AccessorConfig& cfg, float decay_rate) {
  decay_days(row, &decay_rate, 1);
  return row_score(row, cfg) < cfg.delete_threshold ||
         row[RowLayout::kUnseenDays] > cfg.delete_after_unseen_days;
}

StatusOr<uint64_t> SparseShard::age_disk_rows(const std::function<void()>& aged) {
  const int32_t stride = layout_.stride();
  DiskTier::Batch batch;
  Status st;
  uint64_t deleted = 0;
  std::vector<uint64_t> deleted_keys;
  // After a failed write nothing more is written or counted: the error ends the shrink.
  const auto commit = [&] {
    mu_.assert_held();
    if (st.ok()) st = disk_->write(batch);
    if (!st.ok()) return;
    batch.clear();
    deleted += deleted_keys.size();
    rows_on_disk_ -= deleted_keys.size();
    for (uint64_t k : deleted_keys) note_deleted(k);
    deleted_keys.clear();
  };
  std::vector<float> row(stride);
  GPUBOX_RETURN_IF_ERROR(disk_->scan(id_, [&](uint64_t key, const float* r, uint32_t epoch) {
    mu_.assert_held();
    if (!st.ok()) return;
    aged();
    // A copy of a memory row: the memory row is aged in memory, and its copy goes stale.
    if (index_.find(key) != KeyIndexMap::kAbsent) return;
    std::memcpy(row.data(), r, sizeof(float) * stride);
    if (age_row(row.data())) {
      batch.erase(id_, key);
      deleted_keys.push_back(key);
      if (write_through_.size() > 0) write_through_.erase(key);
    } else {
      // Aged, not changed: its epoch stays (a delta save records the shrink, see shrink()).
      batch.put(id_, key, row.data(), epoch, layout_.of_row(row.data()).stride());
    }
    if (batch.count() >= kDiskBatchEntries) commit();
  }));
  commit();
  GPUBOX_RETURN_IF_ERROR(st);
  return deleted;
}

StatusOr<uint64_t> SparseShard::shrink(int32_t cold_after_days,
                                       const std::function<void()>& on_progress) {
  MutexLock lock(mu_);
  uint64_t deleted = 0;
  uint64_t aged = 0;
  const auto age = [&] {
    if (++aged % kShrinkProgressRows == 0 && on_progress) on_progress();
  };
  // A disk batch written (up to kDiskBatchEntries erases or rows) is a step too.
  const auto wrote_batch = [&] {
    if (on_progress) on_progress();
  };
  // Disk rows first, so that rows moved to disk below are aged once, not twice.
  if (disk_ != nullptr && rows_on_disk_ > 0) {
    StatusOr<uint64_t> on_disk = age_disk_rows(age);
    GPUBOX_RETURN_IF_ERROR(on_disk.status());
    deleted += *on_disk;
  }
  std::vector<std::pair<uint64_t, uint32_t>> entries;
  entries.reserve(index_.size());
  index_.for_each([&](uint64_t key, uint32_t index) { entries.emplace_back(key, index); });
  std::vector<std::pair<uint64_t, uint32_t>> dead;
  std::vector<Victim> cold;
  for (const auto& [key, index] : entries) {
    float* row = arena_.row(index);
    age();
    const bool dies = age_row(row);
    // A row that dies is marked (one whose deletion fails below stays, changed; the shrink's
    // error makes the next delta hold every row). A row aged keeps its epoch: the next delta
    // save records the shrink for its loader to replay (SparseTable::save), rather than hold
    // every row a decay changed. Its disk copy is stale either way.
    if (dies) {
      mark(index);
    } else if (arena_.disk_copy(index)) {
      arena_.set_disk_copy(index, /*clean=*/false);
    }
    if (dies) {
      dead.emplace_back(key, index);
      continue;
    }
    if (disk_ != nullptr && cold_after_days > 0 &&
        row[RowLayout::kUnseenDays] >= static_cast<float>(cold_after_days)) {
      cold.push_back({key, index, /*pinned=*/false});
    }
  }
  std::sort(dead.begin(), dead.end());
  GPUBOX_RETURN_IF_ERROR(delete_rows(dead, wrote_batch));
  for (const auto& entry : dead) note_deleted(entry.first);
  deleted += dead.size();
  std::sort(cold.begin(), cold.end(),
            [](const Victim& a, const Victim& b) { return a.key < b.key; });
  // Each aged above: none has a clean disk copy.
  GPUBOX_RETURN_IF_ERROR(evict(cold, wrote_batch));
  return deleted;
}

Status SparseShard::replay_shrinks(const std::vector<float>& decay_rates,
                                   const std::function<void()>& on_progress) {
  MutexLock lock(mu_);
  if (decay_rates.empty()) return Status::OK();
  uint64_t aged = 0;
  // Every day at once (decay_days: the bits of one age_row_one_day a rate), deleting none (see
  // .hpp).
  const auto age = [&](float* row) {
    decay_days(row, decay_rates.data(), decay_rates.size());
    if (++aged % kShrinkProgressRows == 0 && on_progress) on_progress();
  };
  // The memory rows in storage order (every live row is one the index holds), not the index's:
  // that jumps about the chunks, and a row's cache miss would be most of its aging.
  arena_.for_each_live([&](uint32_t index) {
    mu_.assert_held();
    age(arena_.row(index));
    if (arena_.disk_copy(index)) arena_.set_disk_copy(index, /*clean=*/false);
  });
  if (disk_ == nullptr || rows_on_disk_ == 0) return Status::OK();
  const int32_t stride = layout_.stride();
  std::vector<float> row(stride);
  DiskTier::Batch batch;
  Status st;
  const auto commit = [&] {
    if (st.ok()) st = disk_->write(batch);
    batch.clear();
    if (on_progress) on_progress();
  };
  GPUBOX_RETURN_IF_ERROR(disk_->scan(id_, [&](uint64_t key, const float* r, uint32_t epoch) {
    mu_.assert_held();
    // A copy of a memory row: the memory row was aged above, and its copy is stale.
    if (!st.ok() || index_.find(key) != KeyIndexMap::kAbsent) return;
    std::memcpy(row.data(), r, sizeof(float) * stride);
    age(row.data());
    batch.put(id_, key, row.data(), epoch, layout_.of_row(row.data()).stride());
    if (batch.count() >= kDiskBatchEntries) commit();
  }));
  if (batch.count() > 0) commit();
  return st;
}

SparseShard::Incoming SparseShard::incoming(const uint64_t* keys, const uint32_t* pos,
                                            std::size_t m, const PushedRows* pushed) const {
  const Incoming all{m, static_cast<uint64_t>(m) * widest_row_bytes_};
  if (disk_ == nullptr || memory_limit_ == 0) return all;
  if (index_.size() + m <= memory_limit_ &&
      (byte_limit_ == 0 || arena_.allocated_row_bytes() + all.bytes <= byte_limit_)) {
    return all;
  }
  Incoming in{0, 0};
  for (std::size_t j = 0; j < m; ++j) {
    const uint64_t key = keys[pos[j]];
    const uint32_t index = index_.find(key);
    if (index == KeyIndexMap::kAbsent) {
      ++in.rows;
      in.bytes += widest_row_bytes_;
    } else if (pushed != nullptr && layout_.mixed_widths) {
      // A push that moves the row to another class takes a row of that class (the one it
      // leaves is released, its chunk kept until a compaction); a bad width fails the push later.
      StatusOr<uint32_t> width_class = row_class(key, pushed->row(pos[j]));
      if (width_class.ok() && *width_class != detail::RowArenas::class_of(index)) {
        in.bytes +=
            sizeof(float) * arena_.arena(*width_class).stride() + detail::RowArena::kMetadataBytes;
      }
    }
  }
  return in;
}

void SparseShard::compact_arenas() {
  std::vector<uint32_t> boundary(arena_.classes());
  bool any = false;
  for (std::size_t c = 0; c < boundary.size(); ++c) {
    boundary[c] = arena_.compact_boundary(c);
    any = any || boundary[c] != detail::RowArena::kNoCompaction;
  }
  if (!any) return;
  std::vector<std::pair<uint32_t, uint64_t>> moving;  // (handle, key) of the rows to move
  index_.for_each([&](uint64_t key, uint32_t handle) {
    if ((handle & detail::RowArenas::kIndexMask) >= boundary[detail::RowArenas::class_of(handle)]) {
      moving.emplace_back(handle, key);
    }
  });
  std::sort(moving.begin(), moving.end());
  arena_.compact([&](uint32_t from, uint32_t to) {
    mu_.assert_held();
    const auto it =
        std::lower_bound(moving.begin(), moving.end(), std::make_pair(from, uint64_t{0}));
    GPUBOX_EXPECTS(it != moving.end() && it->first == from, "shard ", id_, ": row ", from,
                   " moved by compaction has no key");
    index_.assign(it->second, to);
  });
}

std::vector<SparseShard::Victim> SparseShard::coldest_rows(std::size_t rows, uint64_t bytes) {
  struct Candidate {
    bool pinned;
    float score;
    float minus_unseen;
    uint32_t index;
    uint64_t key;
    bool operator<(const Candidate& o) const {
      if (pinned != o.pinned) return !pinned;
      return score != o.score ? score < o.score : minus_unseen < o.minus_unseen;
    }
  };
  std::vector<Candidate> scored;
  scored.reserve(index_.size());
  index_.for_each([&](uint64_t key, uint32_t index) {
    mu_.assert_held();
    const float* row = arena_.row(index);
    scored.push_back(
        {arena_.pinned(index), row_score(row, cfg_), -row[RowLayout::kUnseenDays], index, key});
  });
  // The rows' count, then as many more as the bytes need: each row frees at most the widest
  // row's bytes, so a step of excess / widest rows never overshoots the bytes by a row's worth.
  const auto rows_for = [&](uint64_t excess) {
    return static_cast<std::size_t>((excess + widest_row_bytes_ - 1) / widest_row_bytes_);
  };
  std::size_t victims = std::min(scored.size(), std::max(rows, rows_for(bytes)));
  std::nth_element(scored.begin(), scored.begin() + victims, scored.end());
  uint64_t freed = 0;
  for (std::size_t i = 0; i < victims; ++i) freed += arena_.row_bytes(scored[i].index);
  while (freed < bytes && victims < scored.size()) {
    const std::size_t more = std::min(scored.size() - victims, rows_for(bytes - freed));
    std::nth_element(scored.begin() + victims, scored.begin() + victims + more, scored.end());
    for (std::size_t i = victims; i < victims + more; ++i) {
      freed += arena_.row_bytes(scored[i].index);
    }
    victims += more;
  }
  std::vector<Victim> out;
  out.reserve(victims);
  for (std::size_t i = 0; i < victims; ++i) {
    out.push_back({scored[i].key, scored[i].index, scored[i].pinned});
  }
  std::sort(out.begin(), out.end(), [](const Victim& a, const Victim& b) { return a.key < b.key; });
  return out;
}

Status SparseShard::evict(const std::vector<Victim>& victims,
                          const std::function<void()>& on_batch) {
  for (std::size_t begin = 0; begin < victims.size(); begin += kDiskBatchEntries) {
    const std::size_t end = std::min(victims.size(), begin + kDiskBatchEntries);
    DiskTier::Batch batch;
    for (std::size_t i = begin; i < end; ++i) {
      const uint32_t index = victims[i].index;
      // A clean copy on disk is the row already: nothing to write.
      if (arena_.disk_copy_clean(index)) continue;
      batch.put(id_, victims[i].key, arena_.row(index), arena_.epoch(index), arena_.stride(index));
    }
    GPUBOX_RETURN_IF_ERROR(disk_->write(batch));
    if (on_batch) on_batch();
    rows_evicted_clean_ += (end - begin) - batch.count();
    for (std::size_t i = begin; i < end; ++i) {
      remove_row(victims[i].key, victims[i].index);
      if (victims[i].pinned && write_through_.size() < write_through_limit_) {
        write_through_.insert(victims[i].key, 0);
      }
    }
    rows_on_disk_ += end - begin;
    rows_evicted_ += end - begin;
  }
  return Status::OK();
}

Status SparseShard::enforce_memory_limit(Incoming in) {
  if (disk_ == nullptr || memory_limit_ == 0) return Status::OK();
  // The byte limit holds on the rows' storage as allocated: chunks that freed rows left behind
  // (each class keeps its peak otherwise) go back before anything is evicted.
  const auto within = [&] {
    mu_.assert_held();
    return index_.size() + in.rows <= memory_limit_ &&
           (byte_limit_ == 0 || arena_.allocated_row_bytes() + in.bytes <= byte_limit_);
  };
  if (within()) return Status::OK();
  if (byte_limit_ > 0) {
    compact_arenas();
    if (within()) return Status::OK();
  }
  const uint64_t bytes = arena_.allocated_row_bytes();
  // Evict a little below the limits so that the next pulls do not each evict a handful of rows.
  const auto target = [](uint64_t limit, uint64_t incoming) {
    return std::min<uint64_t>(limit - limit / 8, limit - std::min<uint64_t>(incoming, limit));
  };
  const uint64_t target_rows = target(memory_limit_, in.rows);
  const uint64_t target_bytes = byte_limit_ == 0 ? bytes : target(byte_limit_, in.bytes);
  const std::size_t excess_rows = index_.size() > target_rows ? index_.size() - target_rows : 0;
  const uint64_t excess_bytes = bytes > target_bytes ? bytes - target_bytes : 0;
  GPUBOX_RETURN_IF_ERROR(evict(coldest_rows(excess_rows, excess_bytes)));
  if (byte_limit_ > 0) compact_arenas();
  return Status::OK();
}

}  // namespace gpubox::table
