#include "common/malloc_reuse.hpp"

#include <cstdlib>  // (first: on glibc it defines __GLIBC__)
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gpubox {
namespace {

// The operator's malloc variable that is set, or nullptr.
const char* operator_malloc_variable() {
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX",
                           "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (std::getenv(name) != nullptr) return name;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) {
    return "GLIBC_TUNABLES";
  }
  return nullptr;
}

}  // namespace

MallocTuning keep_freed_memory_for_reuse(int max_arenas) {
  MallocTuning result;
  if (const char* name = operator_malloc_variable()) {
    result.skipped_because = std::string(name) + " is set";
    return result;
  }
#if defined(__GLIBC__)
  constexpr int kThresholdBytes = 32 << 20;
  const bool mmap_set = ::mallopt(M_MMAP_THRESHOLD, kThresholdBytes) == 1;
  const bool trim_set = ::mallopt(M_TRIM_THRESHOLD, kThresholdBytes) == 1;
  const bool arenas_set = ::mallopt(M_ARENA_MAX, max_arenas < 1 ? 1 : max_arenas) == 1;
  result.applied = mmap_set && trim_set && arenas_set;
  if (!result.applied) result.skipped_because = "mallopt refused";
#else
  (void)max_arenas;
  result.skipped_because = "not glibc";
#endif
  return result;
}

void return_freed_memory() {
#if defined(__GLIBC__)
  (void)::malloc_trim(0);
#endif
}

void TrimAfterBurst::held(std::size_t bytes) {
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (bytes > peak && !peak_.compare_exchange_weak(peak, bytes, std::memory_order_relaxed)) {
  }
}

bool TrimAfterBurst::drained_to(std::size_t bytes) {
  if (bytes != 0) return false;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (peak >= burst_bytes_) {
    if (peak_.compare_exchange_weak(peak, 0, std::memory_order_relaxed)) return true;
  }
  return false;
}

}  // namespace gpubox
