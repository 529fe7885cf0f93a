#include "common/memory_limit.hpp"

#include <unistd.h>

#include <fstream>

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

uint64_t memory_headroom_bytes() {
  const uint64_t usable = usable_memory_bytes();
  if (usable == 0) return UINT64_MAX;
  const uint64_t resident = resident_memory_bytes();
  return usable > resident ? usable - resident : 0;
}

}  // namespace gpubox
