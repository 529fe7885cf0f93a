#include "table/sparse_shard.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace gpubox::table {
namespace {

constexpr uint32_t kAbsent = KeyIndexMap::kAbsent;

std::vector<uint32_t> identity(std::size_t n) {
  std::vector<uint32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0u);
  return pos;
}

// Floats per row of each width class.
std::vector<int32_t> class_strides(const WidthClasses& classes, const AccessorConfig& cfg) {
  std::vector<int32_t> strides;
  for (int32_t c = 0; c < classes.count; ++c) {
    strides.push_back(RowLayout::make(cfg.optimizer.kind, classes.dims[c], cfg.storage).stride());
  }
  return strides;
}

}  // namespace

SparseShard::SparseShard(uint32_t id, const RowLayout& layout, const AccessorConfig& cfg,
                         DiskTier* disk, const HostMemoryPlan& plan, TableEpochs* epochs)
    : id_(id),
      layout_(layout),
      cfg_(cfg),
      disk_(disk),
      memory_limit_(plan.rows_per_shard),
      byte_limit_(plan.row_bytes_per_shard),
      // Under a byte budget only: a row budget alone is a cap, and reserving its whole index
      // (and write-through set) would take its memory for an empty table.
      index_reserve_(disk != nullptr && plan.rows_per_shard > 0 && plan.row_bytes_per_shard > 0
                         ? plan.index_slots
                         : 0),
      write_through_reserve_(index_reserve_ > 0 && plan.write_through_keys_per_shard > 0
                                 ? plan.write_through_slots
                                 : 0),
      epochs_(epochs),
      classes_(width_classes(cfg)),
      arena_(class_strides(classes_, cfg), plan.rows_per_chunk),
      widest_row_bytes_(sizeof(float) * record_layout(cfg).stride() +
                        detail::RowArena::kMetadataBytes),
      write_through_limit_(
          disk != nullptr && plan.rows_per_shard > 0 ? plan.write_through_keys_per_shard : 0) {
  reserve_maps();
}

void SparseShard::reserve_maps() {
  // Planned in full: neither map grows (and briefly holds 1.5 times its new size) later.
  if (index_reserve_ > 0) index_.reserve(index_reserve_);
  if (write_through_reserve_ > 0) write_through_.reserve(write_through_reserve_);
}

uint32_t SparseShard::insert_row(uint64_t key, uint32_t epoch, uint32_t width_class) {
  const uint32_t index = arena_.allocate(width_class, epoch);
  index_.insert(key, index);
  return index;
}

uint32_t SparseShard::slot_class(int32_t slot) const {
  return static_cast<uint32_t>(classes_.class_of(slot_mf_dim(cfg_, slot)));
}

StatusOr<uint32_t> SparseShard::row_class(uint64_t key, const float* row) const {
  if (!layout_.mixed_widths) return 0u;
  const float width = row[layout_.mf_dim_offset()];
  const int32_t c = width >= 0.0f && width <= static_cast<float>(layout_.mf_dim)
                        ? classes_.class_of(static_cast<int32_t>(width))
                        : -1;
  if (c < 0 || width != static_cast<float>(static_cast<int32_t>(width))) {
    return Status::InvalidArgument(
        "host table: the row of key " + std::to_string(key) + " (slot " +
        std::to_string(static_cast<int32_t>(row[layout_.slot()])) + ") has embedx width " +
        std::to_string(width) +
        ", which no slot has under this config's hyper_parameters.slot_dims");
  }
  return static_cast<uint32_t>(c);
}

uint32_t SparseShard::store_row(uint64_t key, uint32_t index, uint32_t width_class,
                                const float* row) {
  if (detail::RowArenas::class_of(index) != width_class) {
    const uint32_t epoch = arena_.epoch(index);
    const bool pinned = arena_.pinned(index);
    const bool disk_copy = arena_.disk_copy(index);
    remove_row(key, index);
    index = insert_row(key, epoch, width_class);
    arena_.set_pinned(index, pinned);
    if (disk_copy) {
      arena_.set_disk_copy(index, /*clean=*/false);
      ++disk_copies_;
    }
  }
  std::memcpy(arena_.row(index), row, sizeof(float) * arena_.stride(index));
  return index;
}

void SparseShard::remove_row(uint64_t key, uint32_t index) {
  if (arena_.disk_copy(index)) --disk_copies_;
  index_.erase(key);
  arena_.release(index);
}

Status SparseShard::delete_rows(const std::vector<std::pair<uint64_t, uint32_t>>& rows,
                                const std::function<void()>& on_batch) {
  DiskTier::Batch batch;
  std::size_t committed = 0;  // rows[0..committed) have no disk copy left
  // A batch's rows lose their disk-copy flag as it commits: when a later batch fails they stay
  // in memory with no copy on record, and eviction writes them (a row still flagged clean, its
  // copy deleted, would be written nowhere and lost).
  const auto commit = [&](std::size_t end) -> Status {
    mu_.assert_held();
    if (batch.count() > 0) {
      GPUBOX_RETURN_IF_ERROR(disk_->write(batch));
      if (on_batch) on_batch();
    }
    batch.clear();
    for (; committed < end; ++committed) {
      const uint32_t index = rows[committed].second;
      if (!arena_.disk_copy(index)) continue;
      arena_.clear_disk_copy(index);
      --disk_copies_;
    }
    return Status::OK();
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (arena_.disk_copy(rows[i].second)) batch.erase(id_, rows[i].first);
    if (batch.count() >= kDiskBatchEntries) GPUBOX_RETURN_IF_ERROR(commit(i + 1));
  }
  GPUBOX_RETURN_IF_ERROR(commit(rows.size()));
  for (const auto& [key, index] : rows) remove_row(key, index);
  return Status::OK();
}

void SparseShard::note_deleted(uint64_t key) {
  if (epochs_->track_deletions.load()) deleted_.emplace_back(key, epochs_->current.load());
}

Status SparseShard::locate(const uint64_t* keys, const int32_t* slots, const uint32_t* pos,
                           std::size_t m, bool create, std::vector<uint32_t>* idx,
                           std::size_t* created) {
  idx->resize(m);
  std::vector<std::pair<uint64_t, uint32_t>> misses;  // (key, j of its first occurrence)
  constexpr std::size_t kAhead = 8;  // prefetch distance, hides the probe's cache miss
  for (std::size_t j = 0; j < std::min(m, kAhead); ++j) index_.prefetch(keys[pos[j]]);
  // Nothing on disk: a missing key is new, create it on the spot (the map dedups repeats).
  const bool create_inline = create && (disk_ == nullptr || rows_on_disk_ == 0);
  const uint32_t now = epochs_->current.load();
  for (std::size_t j = 0; j < m; ++j) {
    if (j + kAhead < m) index_.prefetch(keys[pos[j + kAhead]]);
    const uint64_t key = keys[pos[j]];
    (*idx)[j] = index_.find(key);
    if ((*idx)[j] != kAbsent) continue;
    if (create_inline) {
      const int32_t slot = slots != nullptr ? slots[pos[j]] : 0;
      (*idx)[j] = insert_row(key, now, slot_class(slot));
      init_row(arena_.row((*idx)[j]), RowLayout::for_slot(cfg_, slot), cfg_, key, slot);
      if (created != nullptr) ++*created;
    } else {
      misses.emplace_back(key, static_cast<uint32_t>(j));
    }
  }
  if (misses.empty()) return Status::OK();
  std::sort(misses.begin(), misses.end());
  misses.erase(std::unique(misses.begin(), misses.end(),
                           [](const auto& a, const auto& b) { return a.first == b.first; }),
               misses.end());

  const int32_t stride = layout_.stride();
  std::vector<uint8_t> on_disk(misses.size(), 0);
  if (disk_ != nullptr && rows_on_disk_ > 0) {
    std::vector<uint64_t> miss_keys(misses.size());
    for (std::size_t i = 0; i < misses.size(); ++i) miss_keys[i] = misses[i].first;
    std::vector<float> disk_rows(misses.size() * stride);
    std::vector<uint32_t> disk_epochs(misses.size());
    GPUBOX_RETURN_IF_ERROR(disk_->multi_get(id_, miss_keys.data(), miss_keys.size(),
                                            disk_rows.data(), disk_epochs.data(), on_disk.data()));
    // The disk keeps its copy (a clean row's eviction then writes nothing).
    for (std::size_t i = 0; i < misses.size(); ++i) {
      if (!on_disk[i]) continue;
      const float* row = &disk_rows[i * stride];
      StatusOr<uint32_t> width_class = row_class(miss_keys[i], row);
      if (!width_class.ok()) return width_class.status();
      const uint32_t index = insert_row(miss_keys[i], disk_epochs[i], *width_class);
      std::memcpy(arena_.row(index), row, sizeof(float) * arena_.stride(index));
      arena_.set_disk_copy(index, /*clean=*/true);
      if (write_through_.size() > 0) write_through_.erase(miss_keys[i]);
      --rows_on_disk_;
      ++disk_copies_;
      ++rows_read_back_;
    }
  }
  if (create) {
    for (std::size_t i = 0; i < misses.size(); ++i) {
      if (on_disk[i]) continue;
      const uint64_t key = misses[i].first;
      const int32_t slot = slots != nullptr ? slots[pos[misses[i].second]] : 0;
      const uint32_t index = insert_row(key, now, slot_class(slot));
      init_row(arena_.row(index), RowLayout::for_slot(cfg_, slot), cfg_, key, slot);
      if (created != nullptr) ++*created;
    }
  }
  for (std::size_t j = 0; j < m; ++j) {
    if ((*idx)[j] == kAbsent) (*idx)[j] = index_.find(keys[pos[j]]);
  }
  return Status::OK();
}

std::size_t SparseShard::piece_keys(std::size_t m) const {
  if (disk_ == nullptr || memory_limit_ == 0) return std::max<std::size_t>(m, 1);
  // Eviction leaves at most 7/8 of a limit; a piece of the other 1/8 keeps memory within it.
  uint64_t piece = memory_limit_ / 8;
  if (byte_limit_ > 0) piece = std::min<uint64_t>(piece, byte_limit_ / 8 / widest_row_bytes_);
  return static_cast<std::size_t>(std::max<uint64_t>(1, piece));
}

Status SparseShard::pull(const uint64_t* keys, const int32_t* slots, const uint32_t* pos,
                         std::size_t m, float* rows, std::size_t* created) {
  MutexLock lock(mu_);
  std::vector<uint32_t> idx;
  const std::size_t stride = layout_.stride();
  const std::size_t piece = piece_keys(m);
  for (std::size_t begin = 0; begin < m; begin += piece) {
    const uint32_t* piece_pos = pos + begin;
    const std::size_t n = std::min(m - begin, piece);
    GPUBOX_RETURN_IF_ERROR(enforce_memory_limit(incoming(keys, piece_pos, n, nullptr)));
    GPUBOX_RETURN_IF_ERROR(locate(keys, slots, piece_pos, n, /*create=*/true, &idx, created));
    constexpr std::size_t kAhead = 4;
    for (std::size_t j = 0; j < std::min(n, kAhead); ++j) arena_.prefetch(idx[j]);
    for (std::size_t j = 0; j < n; ++j) {
      if (j + kAhead < n) arena_.prefetch(idx[j + kAhead]);
      float* row = arena_.row(idx[j]);
      arena_.set_pinned(idx[j], true);  // the pass's working set: evicted last until pushed
      if (row[RowLayout::kUnseenDays] != 0.0f) {
        row[RowLayout::kUnseenDays] = 0.0f;
        mark(idx[j]);
      }
      row_into_record(row, layout_, rows + piece_pos[j] * stride);
    }
  }
  return Status::OK();
}

Status SparseShard::peek(const uint64_t* keys, const int32_t* slots, const uint32_t* pos,
                         std::size_t m, float* rows, std::size_t* unknown) {
  MutexLock lock(mu_);
  const std::size_t stride = layout_.stride();
  std::vector<std::size_t> misses;  // j of each key not in memory
  for (std::size_t j = 0; j < m; ++j) {
    const uint32_t index = index_.find(keys[pos[j]]);
    if (index == kAbsent) {
      misses.push_back(j);
    } else {
      row_into_record(arena_.row(index), layout_, rows + pos[j] * stride);
    }
  }
  std::vector<uint8_t> on_disk(misses.size(), 0);
  if (!misses.empty() && disk_ != nullptr && rows_on_disk_ > 0) {
    std::vector<uint64_t> miss_keys(misses.size());
    for (std::size_t i = 0; i < misses.size(); ++i) miss_keys[i] = keys[pos[misses[i]]];
    std::vector<float> disk_rows(misses.size() * stride);
    std::vector<uint32_t> disk_epochs(misses.size());
    GPUBOX_RETURN_IF_ERROR(disk_->multi_get(id_, miss_keys.data(), miss_keys.size(),
                                            disk_rows.data(), disk_epochs.data(), on_disk.data()));
    for (std::size_t i = 0; i < misses.size(); ++i) {
      if (on_disk[i]) {
        std::memcpy(rows + pos[misses[i]] * stride, &disk_rows[i * stride], sizeof(float) * stride);
      }
    }
  }
  for (std::size_t i = 0; i < misses.size(); ++i) {
    if (on_disk[i]) continue;
    const std::size_t j = misses[i];
    init_row(rows + pos[j] * stride, layout_, cfg_, keys[pos[j]],
             slots != nullptr ? slots[pos[j]] : 0);
    if (unknown != nullptr) ++*unknown;
  }
  return Status::OK();
}

Status SparseShard::write_through(const uint64_t* keys, const uint32_t* pos, std::size_t m,
                                  PushedRows rows, std::vector<uint32_t>* rest) {
  rest->resize(m);
  if (write_through_.size() == 0) {
    std::copy(pos, pos + m, rest->begin());
    return Status::OK();
  }
  const int32_t stride = layout_.stride();
  const uint32_t now = epochs_->current.load();
  struct Through {
    uint64_t key;
    uint32_t pos;  // in the batch
    uint32_t width_class;
    bool operator<(const Through& o) const { return key != o.key ? key < o.key : pos < o.pos; }
  };
  // Every row's width is checked before any key leaves the set: an error leaves it as it was.
  constexpr uint32_t kNotInSet = kAbsent;
  std::vector<uint32_t> width_classes(m, kNotInSet);
  for (std::size_t j = 0; j < m; ++j) {
    const uint64_t key = keys[pos[j]];
    if (write_through_.find(key) == kAbsent) continue;
    StatusOr<uint32_t> width_class = row_class(key, rows.row(pos[j]));
    if (!width_class.ok()) return width_class.status();
    width_classes[j] = *width_class;
  }
  std::vector<Through> through;
  std::size_t kept = 0;
  for (std::size_t j = 0; j < m; ++j) {
    // The first push of a key in this call takes it out of the set; a repeat of it later in the
    // call reads that row back and overwrites it in memory, so the last push still wins.
    if (width_classes[j] != kNotInSet && write_through_.erase(keys[pos[j]]) != kAbsent) {
      through.push_back({keys[pos[j]], pos[j], width_classes[j]});
    } else {
      (*rest)[kept++] = pos[j];
    }
  }
  rest->resize(kept);
  if (through.empty()) return Status::OK();
  std::sort(through.begin(), through.end());  // key order, as eviction writes
  std::vector<float> row(stride);
  for (std::size_t begin = 0; begin < through.size(); begin += kDiskBatchEntries) {
    const std::size_t end = std::min(through.size(), begin + kDiskBatchEntries);
    DiskTier::Batch batch;
    for (std::size_t i = begin; i < end; ++i) {
      // The row at its own width, as eviction writes it (the record's padding stays off disk).
      const int32_t own = arena_.arena(through[i].width_class).stride();
      std::memcpy(row.data(), rows.row(through[i].pos), sizeof(float) * own);
      row[RowLayout::kUnseenDays] = 0.0f;
      batch.put(id_, through[i].key, row.data(), now, own);
    }
    GPUBOX_RETURN_IF_ERROR(disk_->write(batch));
    rows_written_through_ += end - begin;
  }
  return Status::OK();
}

Status SparseShard::push(const uint64_t* keys, const uint32_t* pos, std::size_t m,
                         PushedRows rows) {
  MutexLock lock(mu_);
  std::vector<uint32_t> idx, rest;
  const std::size_t piece = piece_keys(m);
  for (std::size_t begin = 0; begin < m; begin += piece) {
    GPUBOX_RETURN_IF_ERROR(
        write_through(keys, pos + begin, std::min(m - begin, piece), rows, &rest));
    const uint32_t* piece_pos = rest.data();
    const std::size_t n = rest.size();
    GPUBOX_RETURN_IF_ERROR(enforce_memory_limit(incoming(keys, piece_pos, n, &rows)));
    // Rows on disk come back; a new key is created below, at the pushed row's width.
    GPUBOX_RETURN_IF_ERROR(locate(keys, nullptr, piece_pos, n, /*create=*/false, &idx, nullptr));
    const uint32_t now = epochs_->current.load();
    bool moved = false;  // a row changed class in this piece: earlier handles may be stale
    // As pull: the rows written lie anywhere in the arena (an end_pass writes back every row of
    // the pass), so each store would wait on its cache miss; and the pushed rows this shard
    // reads lie anywhere in the caller's batch (with 64 shards about one row in 64 is this
    // shard's), so each read would wait on its own. Both are prefetched kAhead rows ahead. After
    // a row changed class a handle may be one released, but its row is still allocated memory
    // (only compact_arenas frees chunks, and it runs before locate, not in this loop): the
    // prefetch of a stale handle only wastes a hint, while the store below looks the key up.
    // (Written out, not a lambda: the thread-safety analysis does not see mu_ held inside one.)
    constexpr std::size_t kAhead = 4;
    const std::size_t pushed_bytes = sizeof(float) * rows.prefetch_floats();
    for (std::size_t j = 0; j < std::min(n, kAhead); ++j) {
      if (idx[j] != kAbsent) arena_.prefetch(idx[j]);
      detail::prefetch_lines(rows.row(piece_pos[j]), pushed_bytes);
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (j + kAhead < n) {
        if (idx[j + kAhead] != kAbsent) arena_.prefetch(idx[j + kAhead]);
        detail::prefetch_lines(rows.row(piece_pos[j + kAhead]), pushed_bytes);
      }
      const uint64_t key = keys[piece_pos[j]];
      const float* pushed = rows.row(piece_pos[j]);
      StatusOr<uint32_t> width_class = row_class(key, pushed);
      if (!width_class.ok()) return width_class.status();
      // A repeat of a key finds the row its first occurrence created or moved.
      uint32_t index = idx[j] == kAbsent || moved ? index_.find(key) : idx[j];
      if (index == kAbsent) index = insert_row(key, now, *width_class);
      moved = moved || detail::RowArenas::class_of(index) != *width_class;
      idx[j] = store_row(key, index, *width_class, pushed);
      float* row = arena_.row(idx[j]);
      row[RowLayout::kUnseenDays] = 0.0f;
      mark(idx[j]);
      arena_.set_pinned(idx[j], false);  // written back: its pass is done with it
    }
  }
  return Status::OK();
}

Status SparseShard::erase(const uint64_t* keys, const uint32_t* pos, std::size_t m) {
  MutexLock lock(mu_);
  std::vector<uint32_t> idx;
  GPUBOX_RETURN_IF_ERROR(locate(keys, nullptr, pos, m, /*create=*/false, &idx, nullptr));
  std::vector<std::pair<uint64_t, uint32_t>> found;  // (key, handle), each key once
  for (std::size_t j = 0; j < m; ++j) {
    if (idx[j] != kAbsent) found.emplace_back(keys[pos[j]], idx[j]);
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  GPUBOX_RETURN_IF_ERROR(delete_rows(found));
  for (const auto& entry : found) note_deleted(entry.first);
  return Status::OK();
}

ShardStats SparseShard::stats() {
  MutexLock lock(mu_);
  ShardStats s;
  s.rows_in_memory = index_.size();
  s.rows_on_disk = rows_on_disk_;
  s.rows_evicted = rows_evicted_;
  s.rows_read_back = rows_read_back_;
  s.rows_written_through = rows_written_through_;
  s.rows_evicted_clean = rows_evicted_clean_;
  s.disk_copies = disk_copies_;
  s.index_slots = index_.capacity();
  s.write_through_slots = write_through_.capacity();
  s.memory_bytes = arena_.memory_bytes() + index_.memory_bytes() +
                   deleted_.capacity() * sizeof(deleted_[0]) + write_through_.memory_bytes();
  return s;
}

Status SparseShard::snapshot(SaveKind mode, SaveForm form, DeltaRows delta_rows, ShardSnapshot* out,
                             const std::function<void()>& on_progress) {
  MutexLock lock(mu_);
  const RecordKind kind = mode == SaveKind::kCheckpoint ? RecordKind::kFullRow : RecordKind::kModel;
  std::vector<float> rec(record_floats(kind, layout_));
  const bool delta = mode == SaveKind::kDelta;
  const bool changed_only = delta && !delta_rows.every_row;
  uint64_t looked_at = 0;
  auto look = [&] {
    if (++looked_at % kSnapshotProgressRows == 0 && on_progress) on_progress();
  };
  auto emit = [&](uint64_t key, const float* row, uint32_t epoch) {
    if (changed_only && epoch <= delta_rows.saved_through) return;
    // Each row's record at its own width (record_shape reads it back).
    const RowLayout own = layout_.of_row(row);
    row_to_record(kind, own, row, rec.data());
    append_record(form, key, rec.data(), record_floats(kind, own), &out->part);
    if (kind == RecordKind::kModel) {
      append_record(form, key, row + RowLayout::kUnseenDays, 1, &out->unseen);
    }
    ++out->rows;
  };
  index_.for_each([&](uint64_t key, uint32_t index) {
    mu_.assert_held();
    look();
    emit(key, arena_.row(index), arena_.epoch(index));
  });
  if (disk_ != nullptr && rows_on_disk_ > 0) {
    // Disk copies of memory rows were emitted from memory.
    GPUBOX_RETURN_IF_ERROR(disk_->scan(id_, [&](uint64_t key, const float* row, uint32_t epoch) {
      mu_.assert_held();
      look();
      if (index_.find(key) == kAbsent) emit(key, row, epoch);
    }));
  }
  if (delta) {
    for (const auto& [key, epoch] : deleted_) {
      if (epoch <= delta_rows.saved_through) continue;
      append_key(form, key, &out->deletes);
      ++out->deleted;
    }
  }
  return Status::OK();
}

void SparseShard::forget_deletions(uint32_t through) {
  MutexLock lock(mu_);
  deleted_.erase(std::remove_if(deleted_.begin(), deleted_.end(),
                                [&](const auto& d) { return d.second <= through; }),
                 deleted_.end());
}

Status SparseShard::clear() {
  MutexLock lock(mu_);
  index_.clear();
  arena_.clear();
  deleted_.clear();
  deleted_.shrink_to_fit();
  write_through_.clear();
  reserve_maps();  // a load follows: the maps stay at their planned sizes
  disk_copies_ = 0;
  if (disk_ != nullptr) GPUBOX_RETURN_IF_ERROR(disk_->clear_shard(id_));
  rows_on_disk_ = 0;
  return Status::OK();
}

Status SparseShard::load_records(RecordKind kind, const uint64_t* keys, const float* recs,
                                 const float* days, std::size_t n) {
  MutexLock lock(mu_);
  // Records come padded to the widest record (parse_records with record_shape).
  const int32_t floats = record_floats(kind, layout_);
  // Pieces bound memory above the row budget while loading.
  const std::size_t piece = std::min<std::size_t>(piece_keys(n), 1 << 16);
  for (std::size_t begin = 0; begin < n; begin += piece) {
    const std::size_t m = std::min(n, begin + piece) - begin;
    GPUBOX_RETURN_IF_ERROR(enforce_memory_limit({m, m * widest_row_bytes_}));
    const std::vector<uint32_t> pos = identity(m);
    std::vector<uint32_t> idx;
    GPUBOX_RETURN_IF_ERROR(
        locate(keys + begin, nullptr, pos.data(), m, /*create=*/false, &idx, nullptr));
    for (std::size_t j = 0; j < m; ++j) {
      const uint64_t key = keys[begin + j];
      const float* rec = recs + (begin + j) * floats;
      // The row's width: a full record's own, a model record's slot's.
      const RowLayout own = kind == RecordKind::kFullRow || !layout_.mixed_widths
                                ? layout_.of_row(rec)
                                : RowLayout::for_slot(cfg_, static_cast<int32_t>(rec[2]));
      const int32_t width_class = classes_.class_of(own.mf_dim);
      if (width_class < 0 || own.stride() > layout_.stride()) {
        return Status::InvalidArgument("host table: the loaded row of key " + std::to_string(key) +
                                       " has embedx width " + std::to_string(own.mf_dim) +
                                       ", which no slot has under this config's "
                                       "hyper_parameters.slot_dims");
      }
      uint32_t index = index_.find(key);
      const bool existing = index != kAbsent;
      if (!existing) {
        index = insert_row(key, 0, static_cast<uint32_t>(width_class));
      } else if (detail::RowArenas::class_of(index) != static_cast<uint32_t>(width_class)) {
        return Status::InvalidArgument("host table: the loaded row of key " + std::to_string(key) +
                                       " has embedx width " + std::to_string(own.mf_dim) +
                                       " but the table holds it at another width");
      }
      record_to_row(kind, own, cfg_, key, rec, existing, arena_.row(index));
      if (days != nullptr) arena_.row(index)[RowLayout::kUnseenDays] = days[begin + j];
      arena_.set_epoch(index, 0);  // as saved
    }
  }
  return Status::OK();
}

Status SparseShard::load_deletions(const uint64_t* keys, std::size_t n) {
  MutexLock lock(mu_);
  const std::vector<uint32_t> pos = identity(n);
  std::vector<uint32_t> idx;
  GPUBOX_RETURN_IF_ERROR(locate(keys, nullptr, pos.data(), n, /*create=*/false, &idx, nullptr));
  std::vector<std::pair<uint64_t, uint32_t>> found;  // (key, handle), each key once
  for (std::size_t j = 0; j < n; ++j) {
    if (idx[j] != kAbsent) found.emplace_back(keys[j], idx[j]);
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return delete_rows(found);
}

Status SparseShard::for_each_row(const std::function<void(uint64_t, const float*)>& fn) {
  MutexLock lock(mu_);
  index_.for_each([&](uint64_t key, uint32_t index) {
    mu_.assert_held();
    fn(key, arena_.row(index));
  });
  if (disk_ == nullptr || rows_on_disk_ == 0) return Status::OK();
  return disk_->scan(id_, [&](uint64_t key, const float* row, uint32_t) {
    mu_.assert_held();
    if (index_.find(key) == kAbsent) fn(key, row);  // a memory row's copy was seen above
  });
}

}  // namespace gpubox::table
