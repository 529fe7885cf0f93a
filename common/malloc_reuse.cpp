#include "common/malloc_reuse.hpp"

#include <cstdlib>  // (first: on glibc it defines __GLIBC__)

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gpubox {

bool keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  constexpr int kThresholdBytes = 32 << 20;
  const bool mmap_set = ::mallopt(M_MMAP_THRESHOLD, kThresholdBytes) == 1;
  const bool trim_set = ::mallopt(M_TRIM_THRESHOLD, kThresholdBytes) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace gpubox
