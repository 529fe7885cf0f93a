// Plain options of the host tier: the in-process table (SparseTable) with its disk tier, and the
// client of the remote tier. Host-only, no RocksDB or device headers, so configs and tools can
// include it cheaply.
#pragma once

#include <cstdint>
#include <string>

#include "common/config/config_enums.hpp"

namespace gpubox::table {

namespace io {
class FileEnv;
}

// How save() writes part files (runner.save_form): text or binary (config_enums.hpp).
using SaveForm = config::SaveForm;
using config::kSaveFormNames;

// Filled from a config by host_tier_config_from (table/sparse_config.hpp: runner.host_table_shards,
// runner.save_form, runner.rocksdb_path, runner.host_memory_row_budget, runner.cold_after_days,
// runner.host_memory_mb), by gpubox_server's flags, or by hand in tests and tools.
struct HostTableConfig {
  // Key shards (host_shard(key, shards)); each has its own lock and its own part-<shard> file.
  uint32_t shards = 64;
  // Sparse slots the keys come from (hyper_parameters.sparse_inputs_slots less the label): the
  // memory plan's assumed mix of width classes (planned_classes). 0: unknown, planned at the
  // widest class.
  uint32_t key_slots = 0;
  // Threads for bulk calls and save/load; 0 = OpenMP's default. Small batches run inline.
  int threads = 0;
  // Form of the part files save() writes; load() reads either (the MANIFEST says which).
  SaveForm save_form = SaveForm::kBinary;
  // Disk tier folder (RocksDB). Empty: no disk tier, every row stays in memory. The folder is
  // working storage, wiped when the table opens; save/load is what persists a model.
  std::string rocksdb_path;
  // Rows kept in memory at most (0 = no limit; needs the disk tier). Each shard keeps at most
  // max(1, budget / shards). A bulk call works through a shard's keys in pieces of 1/8 of its
  // share; after each piece, a shard over its share moves its lowest-score rows (row_score, then
  // the longest unseen) to disk, down to 7/8 of its share, so memory never holds more than the
  // share. Score is Paddle's CTR rule (nonclk_coeff * (show - click) + clk_coeff * click, decayed
  // by shrink): rows a pass will likely see again stay in memory.
  uint64_t memory_row_budget = 0;
  // Bytes the rows and their index may take (0 = no limit; needs the disk tier): turned into a
  // row budget and a row-bytes limit per shard by plan_host_memory (table/host_memory_plan.hpp),
  // which counts each row's floats (at each width class's stride) and epoch, as the row storage
  // allocates them (chunks freed rows leave are given back), and the hash index, reserved at its
  // planned size. With memory_row_budget too, the smaller budget wins (a row budget alone
  // reserves nothing).
  uint64_t memory_budget_bytes = 0;
  // shrink() moves rows unseen for at least this many days to disk (0 = never; needs the disk
  // tier).
  int32_t cold_after_days = 0;
  // With a budget: a push of a row that eviction moved to disk while it was pinned (pulled for a
  // pass in flight) writes the pushed row over the disk copy instead of reading it back first
  // (HostMemoryPlan plans the keys it remembers). false only to compare against it in tests and
  // benchmarks.
  bool write_through = true;
  // File system for save/load; nullptr = POSIX. Borrowed; must outlive the table.
  io::FileEnv* env = nullptr;
};

// The client side of a remote host tier (gpubox_server processes), from the config: the rest
// (endpoints, token) comes from the launcher. See table/server/remote_host_tier.hpp.
struct RemoteTierConfig {
  std::string endpoints;     // "ip:port,..." (PADDLE_PSERVERS_IP_PORT_LIST); empty: in-process
  std::string auth_token;    // presented on every connection when not empty
  double deadline_s = 30.0;  // runner.server_timeout_s: per call, retries included
  double connect_timeout_s = 2.0;    // runner.server_connect_timeout_s
  int connections_per_endpoint = 2;  // runner.server_connections
};

// Where the host tier lives and how it is set up: what table::make_host_tier builds from.
struct HostTierConfig {
  HostTableConfig table;    // the in-process table (gpubox_server builds its own from the same)
  RemoteTierConfig remote;  // used when remote.endpoints is set
};

}  // namespace gpubox::table
