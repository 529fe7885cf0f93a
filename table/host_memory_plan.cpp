#include "table/host_memory_plan.hpp"

#include <algorithm>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "table/detail/row_arena.hpp"
#include "table/disk_tier.hpp"
#include "table/key_index_map.hpp"

namespace gpubox::table {
namespace {

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

// Most rows of `row_bytes` (floats and metadata, on average) a shard of `bytes` holds together
// with the index that keeps them, plus 1/8 more arriving before eviction, under the growth fill.
// The index's slot count is a power of two: try each and keep the best (*slots).
uint64_t rows_within(uint64_t bytes, double row_bytes, std::size_t* index_slots) {
  uint64_t best = 0;
  std::size_t best_slots = 16;
  for (std::size_t slots = 16; slots * KeyIndexMap::kSlotBytes <= bytes; slots *= 2) {
    const auto by_fill =
        static_cast<uint64_t>(static_cast<double>(slots) * KeyIndexMap::kMaxLoad * 8 / 9);
    const auto by_bytes = static_cast<uint64_t>(
        static_cast<double>(bytes - slots * KeyIndexMap::kSlotBytes) / row_bytes);
    const uint64_t rows = std::min(by_fill, by_bytes);
    if (rows > best) {
      best = rows;
      best_slots = slots;
    }
  }
  *index_slots = best_slots;
  return std::max<uint64_t>(best, 1);
}

double row_floats_bytes(int32_t stride) { return static_cast<double>(sizeof(float) * stride); }

}  // namespace

std::vector<PlannedClass> planned_classes(const AccessorConfig& accessor, uint32_t key_slots) {
  const WidthClasses widths = width_classes(accessor);
  std::vector<PlannedClass> classes;
  for (int32_t c = 0; c < widths.count; ++c) {
    PlannedClass planned;
    planned.mf_dim = widths.dims[c];
    planned.stride =
        RowLayout::make(accessor.optimizer.kind, widths.dims[c], accessor.storage).stride();
    classes.push_back(planned);
  }
  if (key_slots == 0) {
    classes.back().share = 1.0;  // the widest
    return classes;
  }
  // Slots 1..key_slots, each one share; the listed ones at their width, the rest at the default.
  // Each slot counted once: a slot id listed twice keeps its first width (as slot_mf_dim
  // finds it), and ids outside 1..key_slots bring no keys.
  std::set<int32_t> listed_slots;
  for (int32_t i = 0; i < accessor.slot_dims.count; ++i) {
    const int32_t slot = accessor.slot_dims.slot[i];
    if (slot < 1 || static_cast<uint32_t>(slot) > key_slots) continue;
    if (!listed_slots.insert(slot).second) continue;
    classes[widths.class_of(accessor.slot_dims.dim[i])].share += 1.0 / key_slots;
  }
  const auto listed = static_cast<uint32_t>(listed_slots.size());  // <= key_slots
  classes[widths.class_of(accessor.mf_dim)].share +=
      static_cast<double>(key_slots - listed) / key_slots;
  return classes;
}

HostMemoryPlan plan_host_memory(const HostTableConfig& config, int32_t stride) {
  PlannedClass only;
  only.stride = stride;
  only.share = 1.0;
  return plan_host_memory(config, std::vector<PlannedClass>{only});
}

HostMemoryPlan plan_host_memory(const HostTableConfig& config,
                                const std::vector<PlannedClass>& classes) {
  GPUBOX_EXPECTS(!classes.empty(), "host memory plan: no width class");
  HostMemoryPlan plan;
  plan.shards = config.shards;
  plan.classes = classes;
  int32_t widest = 0;
  for (const PlannedClass& c : classes) {
    plan.row_bytes += c.share * row_floats_bytes(c.stride);
    widest = std::max(widest, c.stride);
  }
  plan.metadata_bytes = detail::RowArena::kMetadataBytes;
  plan.widest_row_bytes = sizeof(float) * static_cast<std::size_t>(widest) + plan.metadata_bytes;
  // DiskTier's encoding: a 12-byte key, the epoch, the row at its own width.
  plan.disk_bytes_per_key = 12 + sizeof(uint32_t) + plan.row_bytes;
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
    const uint64_t shard_bytes = rows_bytes / config.shards;
    per_shard = rows_within(shard_bytes, plan.row_bytes + static_cast<double>(plan.metadata_bytes),
                            &plan.index_slots);
    const uint64_t index_bytes = plan.index_slots * KeyIndexMap::kSlotBytes;
    // At least one row of any class (a tiny budget keeps one row a shard, as the row count).
    plan.row_bytes_per_shard = std::max<uint64_t>(
        shard_bytes > index_bytes ? shard_bytes - index_bytes : 0, plan.widest_row_bytes);
  }
  if (config.memory_row_budget > 0) {
    const uint64_t by_rows = std::max<uint64_t>(1, config.memory_row_budget / config.shards);
    if (per_shard == 0 || by_rows < per_shard) {
      per_shard = by_rows;
      plan.index_slots = index_slots_for(per_shard);
    }
  }
  plan.rows_per_shard = per_shard;
  if (per_shard > 0) {
    plan.index_bytes_per_key = static_cast<double>(plan.index_slots * KeyIndexMap::kSlotBytes) /
                               static_cast<double>(per_shard);
  }
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
  // Each class grows its own chunks: an eighth of the shard's rows over all of them.
  const uint64_t chunk_rows = per_shard / 8 / classes.size();
  while (per_shard > 0 && plan.rows_per_chunk > 16 && plan.rows_per_chunk > chunk_rows) {
    plan.rows_per_chunk /= 2;
  }
  return plan;
}

uint64_t smallest_memory_budget(const HostTableConfig& config,
                                const std::vector<PlannedClass>& classes) {
  int32_t widest = 0;
  for (const PlannedClass& c : classes) widest = std::max(widest, c.stride);
  const uint64_t per_shard =
      16 * KeyIndexMap::kSlotBytes + sizeof(float) * widest + detail::RowArena::kMetadataBytes;
  // RocksDB takes at most 1/8 and the write-through sets 1/16 (each rounded down), so the rows
  // get at least 13/16 of a budget, and a shard its share of that less a byte of rounding.
  const uint64_t rows_share = kDiskMemoryShare * kWriteThroughShare;
  const uint64_t rows_parts =
      rows_share - rows_share / kDiskMemoryShare - rows_share / kWriteThroughShare;
  const uint64_t rows_bytes = std::max<uint64_t>(1, config.shards) * (per_shard + 1);
  return (rows_bytes * rows_share + rows_parts - 1) / rows_parts;
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
      << static_cast<uint64_t>(disk_bytes_per_key + 0.5) << " bytes before RocksDB's own overhead";
  if (index_slots > 0 && row_bytes_per_shard > 0) {
    out << "; index " << index_slots << " slots a shard ("
        << static_cast<double>(index_slots * KeyIndexMap::kSlotBytes * shards) / (1 << 20)
        << " MiB), reserved at start, never grows";
  }
  if (classes.size() > 1) {
    out << "; rows planned as";
    for (std::size_t c = 0; c < classes.size(); ++c) {
      out << (c == 0 ? " " : ", ") << classes[c].share * 100 << "% of width " << classes[c].mf_dim;
    }
    out << ", at most " << static_cast<double>(row_bytes_per_shard) / (1 << 20)
        << " MiB of rows a shard whatever the mix";
  }
  return out.str();
}

}  // namespace gpubox::table
