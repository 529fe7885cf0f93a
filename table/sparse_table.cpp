#include "table/sparse_table.hpp"

#include <algorithm>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/memory_limit.hpp"
#include "table/host_memory_plan.hpp"
#include "table/parallel.hpp"

namespace gpubox::table {
Status SparseTable::check_options(const AccessorConfig& optimizer, const HostTableConfig& config) {
  if (config.shards == 0) return Status::InvalidArgument("HostTableConfig.shards must be > 0");
  if (optimizer.mf_dim < 0) return Status::InvalidArgument("mf_dim must be >= 0");
  const bool disk = !config.rocksdb_path.empty();
  if (config.memory_row_budget > 0 && !disk) {
    return Status::InvalidArgument(
        "a host row budget (runner.host_memory_row_budget, gpubox_server --memory_row_budget) "
        "needs a disk tier (runner.rocksdb_path, gpubox_server --rocksdb_dir)");
  }
  if (config.memory_budget_bytes > 0 && !disk) {
    return Status::InvalidArgument(
        "a host memory budget (runner.host_memory_mb) needs a disk tier (runner.rocksdb_path, "
        "gpubox_server --rocksdb_dir)");
  }
  // A budget is a ceiling the table's index is sized from at start: one past the machine's
  // memory reserved gigabytes up front and ran into the OOM killer with nothing said.
  const UsableMemory usable = usable_memory();
  if (config.memory_budget_bytes > 0 && usable.bytes > 0 &&
      config.memory_budget_bytes > usable.bytes) {
    return Status::InvalidArgument(
        "the host memory budget (runner.host_memory_mb, gpubox_server --memory_mb) is " +
        std::to_string(config.memory_budget_bytes >> 20) + " MiB, more than the " +
        std::to_string(usable.bytes >> 20) + " MiB of " + usable.source +
        ": set at most that (the rows beyond the budget go to the disk tier)");
  }
  if (config.cold_after_days > 0 && !disk) {
    return Status::InvalidArgument(
        "runner.cold_after_days needs a disk tier (runner.rocksdb_path, gpubox_server "
        "--rocksdb_dir)");
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<SparseTable>> SparseTable::open(const AccessorConfig& optimizer,
                                                         const HostTableConfig& config) {
  const Status options = check_options(optimizer, config);
  if (!options.ok()) return options;
  const bool disk = !config.rocksdb_path.empty();
  const HostMemoryPlan plan =
      plan_host_memory(config, planned_classes(optimizer, config.key_slots));
  if (config.memory_row_budget > 0 && config.memory_row_budget < config.shards) {
    // Each shard keeps one row at least: the plan line's count, not the key's, is what holds.
    GPUBOX_LOG(WARNING) << "a host row budget of " << config.memory_row_budget
                        << " (runner.host_memory_row_budget, gpubox_server --memory_row_budget) "
                           "is under the table's "
                        << config.shards
                        << " shards (runner.host_table_shards, gpubox_server --table_shards): "
                           "each shard keeps at least one row in memory, "
                        << plan.rows() << " rows in all";
  }
  std::unique_ptr<DiskTier> disk_tier;
  if (disk) {
    auto opened = DiskTier::open(config.rocksdb_path, record_layout(optimizer).stride(),
                                 plan.disk_memory_bytes);
    if (!opened.ok()) return opened.status();
    disk_tier = std::move(opened).value();
  }
  return std::unique_ptr<SparseTable>(
      new SparseTable(optimizer, config, plan, std::move(disk_tier)));
}

SparseTable::SparseTable(const AccessorConfig& optimizer, const HostTableConfig& config,
                         const HostMemoryPlan& plan, std::unique_ptr<DiskTier> disk)
    : optimizer_(optimizer),
      config_(config),
      layout_(record_layout(optimizer)),
      env_(config.env != nullptr ? config.env : io::FileEnv::posix()),
      disk_(std::move(disk)) {
  shards_.reserve(config.shards);
  for (uint32_t s = 0; s < config.shards; ++s) {
    shards_.push_back(
        std::make_unique<SparseShard>(s, layout_, optimizer_, disk_.get(), plan, &epochs_));
  }
  GPUBOX_LOG(INFO) << plan.to_string();
}

SparseTable::~SparseTable() {
  shards_.clear();  // before the disk tier they point into
}

Status SparseTable::for_shards(bool parallel, const std::function<Status(uint32_t)>& fn) {
  return run_parallel(shards_.size(), parallel ? config_.threads : 1,
                      [&](std::size_t s) { return fn(static_cast<uint32_t>(s)); });
}

void SparseTable::group(const uint64_t* keys, std::size_t n, std::vector<uint32_t>* offsets,
                        std::vector<uint32_t>* pos) const {
  const uint32_t shards = static_cast<uint32_t>(shards_.size());
  std::vector<uint32_t> shard_of(n);
  offsets->assign(shards + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    shard_of[i] = host_shard(keys[i], shards);
    ++(*offsets)[shard_of[i] + 1];
  }
  for (uint32_t s = 0; s < shards; ++s) (*offsets)[s + 1] += (*offsets)[s];
  pos->resize(n);
  std::vector<uint32_t> next(offsets->begin(), offsets->end() - 1);
  // Stable: a key repeated in a batch keeps its order (the last push of it wins).
  for (std::size_t i = 0; i < n; ++i) (*pos)[next[shard_of[i]]++] = static_cast<uint32_t>(i);
}

template <class Access>
Status SparseTable::for_keys_by_shard(const char* what, const uint64_t* keys, std::size_t n,
                                      float* rows, std::size_t* counted, Access access) {
  if (counted != nullptr) *counted = 0;
  if (n == 0) return Status::OK();
  if (keys == nullptr || rows == nullptr) {
    return Status::InvalidArgument(std::string(what) + ": null keys/rows");
  }
  if (n >= (std::size_t{1} << 32)) {
    return Status::InvalidArgument(std::string(what) + ": batch over 2^32 keys");
  }
  std::vector<uint32_t> offsets, pos;
  group(keys, n, &offsets, &pos);
  std::vector<std::size_t> per_shard(shards_.size(), 0);
  GPUBOX_RETURN_IF_ERROR(for_shards(n >= kParallelKeys, [&](uint32_t s) {
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    if (begin == end) return Status::OK();
    return access(*shards_[s], pos.data() + begin, end - begin, &per_shard[s]);
  }));
  if (counted != nullptr) {
    for (std::size_t m : per_shard) *counted += m;
  }
  return Status::OK();
}

Status SparseTable::pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                         std::size_t* created) {
  int64_t before_fault = pulls_before_fault_.load();
  if (before_fault >= 0) {
    while (before_fault > 0 &&
           !pulls_before_fault_.compare_exchange_weak(before_fault, before_fault - 1)) {
    }
    int64_t failing = before_fault == 0 ? failing_pulls_.load() : 0;
    while (failing > 0 && !failing_pulls_.compare_exchange_weak(failing, failing - 1)) {
    }
    if (failing > 0) {
      if (created != nullptr) *created = 0;
      return Status::IOError("pull of " + std::to_string(n) +
                             " keys: fault injected (fail_pulls_after)");
    }
  }
  return for_keys_by_shard(
      "pull", keys, n, rows, created,
      [&](SparseShard& shard, const uint32_t* pos, std::size_t m, std::size_t* made) {
        return shard.pull(keys, slots, pos, m, rows, made);
      });
}

Status SparseTable::peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                         std::size_t* unknown) {
  return for_keys_by_shard(
      "peek", keys, n, rows, unknown,
      [&](SparseShard& shard, const uint32_t* pos, std::size_t m, std::size_t* absent) {
        return shard.peek(keys, slots, pos, m, rows, absent);
      });
}

Status SparseTable::push(const uint64_t* keys, std::size_t n, const float* rows) {
  if (n == 0) return Status::OK();
  if (keys == nullptr || rows == nullptr) return Status::InvalidArgument("push: null keys/rows");
  return push_rows(keys, n, PushedRows::packed(rows, static_cast<std::size_t>(layout_.stride())));
}

Status SparseTable::push_at(const uint64_t* keys, std::size_t n, const float* const* rows) {
  if (n == 0) return Status::OK();
  if (keys == nullptr || rows == nullptr) return Status::InvalidArgument("push_at: null keys/rows");
  // Every row holds at least the narrowest width class's stride (PushedRows::prefetch_floats).
  const int32_t narrowest =
      RowLayout::make(layout_.kind, width_classes(optimizer_).dims[0], layout_.storage).stride();
  return push_rows(keys, n, PushedRows::at(rows, static_cast<std::size_t>(narrowest)));
}

Status SparseTable::push_rows(const uint64_t* keys, std::size_t n, PushedRows rows) {
  if (n >= (std::size_t{1} << 32)) return Status::InvalidArgument("push: batch over 2^32 keys");
  std::vector<uint32_t> offsets, pos;
  group(keys, n, &offsets, &pos);
  return for_shards(n >= kParallelKeys, [&](uint32_t s) {
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    if (begin == end) return Status::OK();
    return shards_[s]->push(keys, pos.data() + begin, end - begin, rows);
  });
}

Status SparseTable::erase(const uint64_t* keys, std::size_t n) {
  if (n == 0) return Status::OK();
  if (keys == nullptr) return Status::InvalidArgument("erase: null keys");
  if (n >= (std::size_t{1} << 32)) return Status::InvalidArgument("erase: batch over 2^32 keys");
  std::vector<uint32_t> offsets, pos;
  group(keys, n, &offsets, &pos);
  return for_shards(n >= kParallelKeys, [&](uint32_t s) {
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    if (begin == end) return Status::OK();
    return shards_[s]->erase(keys, pos.data() + begin, end - begin);
  });
}

StatusOr<HostTierStats> SparseTable::stats() {
  HostTierStats total;
  for (auto& shard : shards_) {
    const ShardStats s = shard->stats();
    total.rows_in_memory += s.rows_in_memory;
    total.rows_on_disk += s.rows_on_disk;
    total.memory_bytes += s.memory_bytes;
  }
  return total;
}

StatusOr<uint64_t> SparseTable::size() {
  auto s = stats();
  if (!s.ok()) return s.status();
  return s->rows_in_memory + s->rows_on_disk;
}

SparseTable::DiskTraffic SparseTable::disk_traffic() {
  DiskTraffic total;
  for (auto& shard : shards_) {
    const ShardStats s = shard->stats();
    total.rows_evicted += s.rows_evicted;
    total.rows_read_back += s.rows_read_back;
    total.rows_written_through += s.rows_written_through;
    total.rows_evicted_clean += s.rows_evicted_clean;
  }
  if (disk_ != nullptr) total.disk = disk_->traffic();
  return total;
}

uint64_t SparseTable::rows_now() {
  uint64_t rows = 0;
  for (auto& shard : shards_) {
    const ShardStats s = shard->stats();
    rows += s.rows_in_memory + s.rows_on_disk;
  }
  return rows;
}

StatusOr<uint64_t> SparseTable::shrink(const std::function<void()>& on_progress) {
  MutexLock lock(io_mu_);
  // Some rows aged, some not, until every shard has aged and the shrink is recorded: no replay
  // of whole days reproduces that. So the flag is set first and restored only once the shrink
  // finished whole: a step that fails or throws (bad_alloc) leaves it set.
  const bool every_row_before = next_delta_every_row_;
  next_delta_every_row_ = true;
  std::vector<uint64_t> deleted(shards_.size(), 0);
  const Status shrunk = for_shards(rows_now() >= kParallelKeys, [&](uint32_t s) {
    auto d = shards_[s]->shrink(config_.cold_after_days, on_progress);
    if (!d.ok()) return d.status();
    deleted[s] = *d;
    if (on_progress) on_progress();  // outside the shard's lock
    return Status::OK();
  });
  if (!shrunk.ok()) return shrunk;
  day_.fetch_add(1);
  if (epochs_.track_deletions.load())
    shrinks_since_save_.push_back(optimizer_.show_click_decay_rate);
  next_delta_every_row_ = every_row_before;
  uint64_t total = 0;
  for (uint64_t d : deleted) total += d;
  return total;
}

Status SparseTable::for_each_row(const std::function<void(uint64_t, const float*)>& fn) {
  for (auto& shard : shards_) GPUBOX_RETURN_IF_ERROR(shard->for_each_row(fn));
  return Status::OK();
}

}  // namespace gpubox::table
