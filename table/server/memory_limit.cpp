#include "table/server/memory_limit.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace gpubox::table::server {
namespace {

// The first number in `path` ("max" or no file: 0).
uint64_t read_limit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text == "max") return 0;
  try {
    return std::stoull(text);
  } catch (...) {
    return 0;
  }
}

}  // namespace

uint64_t usable_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  for (const char* cgroup :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = read_limit(cgroup);
    // v1 reports "no limit" as a huge number: only a limit below the machine's counts.
    if (limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  }
  return bytes;
}

uint64_t default_memory_limit_bytes() {
  const uint64_t usable = usable_memory_bytes();
  if (usable == 0) return 0;
  return std::max<uint64_t>(usable / 2, uint64_t{64} << 20);
}

MemoryLimit choose_memory_limit(bool flag_given, uint64_t flag_mb, uint64_t config_bytes) {
  if (flag_given) return {std::min<uint64_t>(flag_mb, UINT64_MAX >> 20) << 20, "--memory_mb"};
  if (config_bytes > 0) return {config_bytes, "runner.host_memory_mb"};
  return {default_memory_limit_bytes(), "default: half of the " +
                                            std::to_string(usable_memory_bytes() >> 20) +
                                            " MiB this machine (or its cgroup) gives the server"};
}

}  // namespace gpubox::table::server
