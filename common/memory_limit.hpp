// How much memory this process may use: the machine's physical memory, or its cgroup's limit when
// lower (a container's memory.max is what the kernel enforces; the machine's total is not). The
// one reading of it for every component that sizes a default by memory (gpubox_server's
// --memory_mb default, the trainer's runner.pass_cache_mb: -1) or skips a copy that would not
// fit (the trainer's store_in_order of a pass).
//
// Host-only, no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpubox {

struct UsableMemory {
  uint64_t bytes = 0;  // 0: unknown
  std::string source;  // "physical memory" or "the cgroup limit in <file>"
};

// The cgroup files read for a limit, in order: v2 memory.max, v1 memory.limit_in_bytes.
const std::vector<std::string>& cgroup_limit_files();

// The lower of `physical_bytes` (0: unknown) and the limit in each of `cgroup_files`: the first
// number the file holds; "max", a missing, unreadable or non-numeric file, and a limit not below
// the physical memory (v1 writes "no limit" as a huge number) do not count.
UsableMemory usable_memory(uint64_t physical_bytes, const std::vector<std::string>& cgroup_files);
// This process's: the machine's physical memory (sysconf) and cgroup_limit_files().
UsableMemory usable_memory();
inline uint64_t usable_memory_bytes() { return usable_memory().bytes; }
// This process's resident memory (/proc/self/statm; 0: unknown).
uint64_t resident_memory_bytes();
// What every process may still take, others' use counted: the lower of `meminfo`'s MemAvailable
// and, for each cgroup, its limit less its members' memory other than page cache (the kernel
// reclaims that first). A cgroup whose files are missing or unlimited does not count; nothing
// known: the largest value.
struct CgroupUsageFiles {
  std::string limit;  // v2 memory.max, v1 memory.limit_in_bytes
  std::string usage;  // v2 memory.current, v1 memory.usage_in_bytes
  std::string stat;   // memory.stat
  std::string cache;  // its page-cache field: v2 "file", v1 "total_cache"
};
uint64_t available_memory(const std::string& meminfo, const std::vector<CgroupUsageFiles>& cgroups);
// /proc/meminfo and this process's cgroup (v2, then v1).
uint64_t available_memory_bytes();
// The lower of usable_memory_bytes() less resident_memory_bytes() and available_memory_bytes():
// what this process may still take, beside what other processes of the machine or its cgroup
// hold (0 when none is left; nothing known: the largest value).
uint64_t memory_headroom_bytes();

}  // namespace gpubox
