// gpubox_server's memory limit (--memory_mb): how much of the machine its table may take by
// default, and where the limit goes (the table's budget with a disk tier, the server's cap on
// row creation without one).
#pragma once

#include <cstdint>
#include <string>

#include "common/memory_limit.hpp"

namespace gpubox::table::server {

// The default limit: half of usable_memory_bytes() (common/memory_limit.hpp) (at least 64 MiB; 0 =
// none when the memory is unknown). Half, because the table is not all the server holds: a LOAD
// parses a save's files before it replaces the rows (a second copy, transiently), a SAVE encodes
// each shard's part in memory, and requests in flight and the retry cache take their own share
// (--max_inflight_mb, --dedup_cache_mb).
uint64_t default_memory_limit_bytes();

struct MemoryLimit {
  uint64_t bytes = 0;  // 0: no limit
  std::string source;  // "--memory_mb", "runner.host_memory_mb" or "default: half of ..."
  bool is_default = false;
};

// The limit in force: `flag_mb` when the flag was given (0 = no limit), else `config_bytes`
// (runner.host_memory_mb) when set, else the default.
MemoryLimit choose_memory_limit(bool flag_given, uint64_t flag_mb, uint64_t config_bytes);

}  // namespace gpubox::table::server
