#include "common/memory_limit.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace gpubox {
namespace {

// The first number in `path` ("max", no file or no number: 0).
uint64_t read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text == "max") return 0;
  if (text.find_first_not_of("0123456789") != std::string::npos) return 0;
  try {
    return std::stoull(text);
  } catch (...) {
    return 0;  // out of range
  }
}

// The number after `field` at the start of a line of `path` ("field value [kB]"; none: 0 and
// false), times 1024 when the line says kB.
bool read_field(const std::string& path, const std::string& field, uint64_t* value) {
  std::ifstream in(path);
  std::string name;
  std::string unit;
  uint64_t number = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    if (!(words >> name) || (name != field && name != field + ":")) continue;
    if (!(words >> number)) return false;
    *value = (words >> unit) && unit == "kB" ? number << 10 : number;
    return true;
  }
  return false;
}

}  // namespace

const std::vector<std::string>& cgroup_limit_files() {
  static const std::vector<std::string> files = {"/sys/fs/cgroup/memory.max",
                                                 "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  return files;
}

UsableMemory usable_memory(uint64_t physical_bytes, const std::vector<std::string>& cgroup_files) {
  UsableMemory out{physical_bytes, "physical memory"};
  for (const std::string& file : cgroup_files) {
    const uint64_t limit = read_limit(file);
    if (limit > 0 && (out.bytes == 0 || limit < out.bytes))
      out = {limit, "the cgroup limit in " + file};
  }
  return out;
}

UsableMemory usable_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  const uint64_t physical = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  return usable_memory(physical, cgroup_limit_files());
}

uint64_t resident_memory_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0;
  uint64_t resident = 0;
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (!(in >> size >> resident) || page <= 0) return 0;
  return resident * uint64_t(page);
}

uint64_t available_memory(const std::string& meminfo,
                          const std::vector<CgroupUsageFiles>& cgroups) {
  uint64_t available = UINT64_MAX;
  uint64_t machine = 0;
  if (read_field(meminfo, "MemAvailable", &machine)) available = machine;
  for (const CgroupUsageFiles& cgroup : cgroups) {
    const uint64_t limit = read_limit(cgroup.limit);
    const uint64_t usage = read_limit(cgroup.usage);
    if (limit == 0 || usage == 0) continue;
    uint64_t cache = 0;
    read_field(cgroup.stat, cgroup.cache, &cache);
    const uint64_t held = usage - std::min(usage, cache);
    available = std::min(available, limit > held ? limit - held : 0);
  }
  return available;
}

uint64_t available_memory_bytes() {
  static const std::vector<CgroupUsageFiles> cgroups = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
       "file"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
       "/sys/fs/cgroup/memory/memory.stat", "total_cache"}};
  return available_memory("/proc/meminfo", cgroups);
}

uint64_t memory_headroom_bytes() {
  const uint64_t usable = usable_memory_bytes();
  const uint64_t resident = resident_memory_bytes();
  const uint64_t own = usable == 0 ? UINT64_MAX : usable > resident ? usable - resident : 0;
  return std::min(own, available_memory_bytes());
}

}  // namespace gpubox
