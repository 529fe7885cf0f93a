#include "table/host_memory_plan.hpp"

#include <algorithm>
#include <sstream>

#include "table/detail/key_index_map.hpp"
#include "table/detail/row_arena.hpp"
#include "table/disk_tier.hpp"

namespace gpubox::table {
namespace {

using detail::KeyIndexMap;

// 1/kDiskMemoryShare of a byte budget goes to RocksDB's memtables and block cache, up to
// 1/kWriteThroughShare to the write-through sets.
constexpr uint64_t kDiskMemoryShare = 8;
constexpr uint64_t kWriteThroughShare = 16;

// Slots of a write-through map: the most (a power of two, >= 16) within `bytes`; 0 when not even
// 16 fit. Its key limit stays below the growth fill, so the map never grows past them.
std::size_t write_through_slots_within(uint64_t bytes) {
  if (bytes < 16 * KeyIndexMap::kSlotBytes) return 0;
  std::size_t slots = 16;
  while ((slots * 2) * KeyIndexMap::kSlotBytes <= bytes) slots *= 2;
  return slots;
}

// Keys a map of `slots` slots takes without growing: insert grows when (size + 1) exceeds
// slots * kMaxLoad.
uint64_t keys_below_growth(std::size_t slots) {
  return static_cast<uint64_t>(static_cast<double>(slots) * KeyIndexMap::kMaxLoad);
}

// Slots of the index a shard of `rows` rows grows to: those rows and 1/8 more (one call's worth
// before eviction brings it back) under the growth fill.
std::size_t index_slots_for(uint64_t rows) {
  std::size_t slots = 16;
  while (static_cast<double>(slots) * KeyIndexMap::kMaxLoad < static_cast<double>(rows) * 9 / 8) {
    slots *= 2;
  }
  return slots;
}

// Most rows of `row_bytes` (floats and metadata) a shard of `bytes` holds together with the
// index that keeps them, plus 1/8 more arriving before eviction, under the growth fill. The
// index's slot count is a power of two: try each and keep the best.
uint64_t rows_within(uint64_t bytes, std::size_t row_bytes, double* index_bytes_per_key) {
  uint64_t best = 0;
  std::size_t best_slots = 16;
  for (std::size_t slots = 16; slots * KeyIndexMap::kSlotBytes <= bytes; slots *= 2) {
    const auto by_fill =
        static_cast<uint64_t>(static_cast<double>(slots) * KeyIndexMap::kMaxLoad * 8 / 9);
    const uint64_t by_bytes = (bytes - slots * KeyIndexMap::kSlotBytes) / row_bytes;
    const uint64_t rows = std::min(by_fill, by_bytes);
    if (rows > best) {
      best = rows;
      best_slots = slots;
    }
  }
  best = std::max<uint64_t>(best, 1);
  *index_bytes_per_key =
      static_cast<double>(best_slots * KeyIndexMap::kSlotBytes) / static_cast<double>(best);
  return best;
}

}  // namespace

HostMemoryPlan plan_host_memory(const HostTableConfig& config, int32_t stride) {
  HostMemoryPlan plan;
  plan.shards = config.shards;
  plan.row_bytes = sizeof(float) * static_cast<std::size_t>(stride);
  plan.metadata_bytes = detail::RowArena::kMetadataBytes;
  plan.disk_bytes_per_key = 12 + sizeof(uint32_t) + plan.row_bytes;  // DiskTier's encoding
  // No budget: the index doubles at the growth fill, so right after it the fill is half that.
  plan.index_bytes_per_key = KeyIndexMap::kSlotBytes / (KeyIndexMap::kMaxLoad / 2);
  plan.rows_per_chunk = detail::RowArena::kMaxRowsPerChunk;
  if (config.shards == 0) return plan;
  uint64_t per_shard = 0;
  plan.disk_memory_bytes = DiskTier::kDefaultMemoryBytes;
  if (config.memory_budget_bytes > 0) {
    plan.disk_memory_bytes = config.memory_budget_bytes / kDiskMemoryShare;
    if (config.write_through) {
      plan.write_through_slots = write_through_slots_within(config.memory_budget_bytes /
                                                            kWriteThroughShare / config.shards);
    }
    const uint64_t rows_bytes =
        config.memory_budget_bytes - plan.disk_memory_bytes - plan.write_through_bytes();
    per_shard = rows_within(rows_bytes / config.shards, plan.row_bytes + plan.metadata_bytes,
                            &plan.index_bytes_per_key);
  }
  if (config.memory_row_budget > 0) {
    const uint64_t by_rows = std::max<uint64_t>(1, config.memory_row_budget / config.shards);
    if (per_shard == 0 || by_rows < per_shard) {
      per_shard = by_rows;
      plan.index_bytes_per_key =
          static_cast<double>(index_slots_for(per_shard) * KeyIndexMap::kSlotBytes) /
          static_cast<double>(per_shard);
    }
  }
  plan.rows_per_shard = per_shard;
  if (config.memory_budget_bytes == 0 && per_shard > 0 && config.write_through) {
    // A row budget: room for a quarter of a shard's rows, on top of the rows.
    plan.write_through_slots = 16;
    while (keys_below_growth(plan.write_through_slots) < (per_shard + 3) / 4) {
      plan.write_through_slots *= 2;
    }
  }
  if (plan.write_through_slots > 0) {
    plan.write_through_keys_per_shard = keys_below_growth(plan.write_through_slots) - 1;
  }
  plan.rows_per_chunk = detail::RowArena::kMaxRowsPerChunk;
  while (per_shard > 0 && plan.rows_per_chunk > 16 && plan.rows_per_chunk > per_shard / 8) {
    plan.rows_per_chunk /= 2;
  }
  return plan;
}

std::string HostMemoryPlan::to_string() const {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << "host tier: ";
  if (rows_per_shard == 0) {
    out << "no memory budget";
  } else {
    out << rows() << " rows in memory at most (" << rows_per_shard << " per shard, " << shards
        << " shards), " << memory_bytes_per_key() * static_cast<double>(rows()) / (1 << 20)
        << " MiB, RocksDB " << static_cast<double>(disk_memory_bytes) / (1 << 20)
        << " MiB, write-through keys " << write_through_keys_per_shard * shards << " ("
        << static_cast<double>(write_through_bytes()) / (1 << 20) << " MiB)";
  }
  out << "; per key in memory " << memory_bytes_per_key() << " bytes (row " << row_bytes
      << ", epoch " << metadata_bytes << ", index " << index_bytes_per_key << "), on disk "
      << disk_bytes_per_key << " bytes before RocksDB's own overhead";
  return out.str();
}

}  // namespace gpubox::table
