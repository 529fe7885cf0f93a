#include "table/server/memory_limit.hpp"

#include <algorithm>

namespace gpubox::table::server {

uint64_t default_memory_limit_bytes() {
  const uint64_t usable = usable_memory_bytes();
  if (usable == 0) return 0;
  return std::max<uint64_t>(usable / 2, uint64_t{64} << 20);
}

MemoryLimit choose_memory_limit(bool flag_given, uint64_t flag_mb, uint64_t config_bytes) {
  if (flag_given) return {std::min<uint64_t>(flag_mb, UINT64_MAX >> 20) << 20, "--memory_mb"};
  if (config_bytes > 0) return {config_bytes, "runner.host_memory_mb"};
  return {default_memory_limit_bytes(),
          "default: half of the " + std::to_string(usable_memory_bytes() >> 20) +
              " MiB this machine (or its cgroup) gives the server",
          /*is_default=*/true};
}

}  // namespace gpubox::table::server
