// common/malloc_reuse.hpp: after keep_freed_memory_for_reuse(), buffers of a few MB (a server
// frame's) come from the heap, allocated and freed again and again without a new mapping (glibc's
// defaults mapped the first of them afresh), while one over 32 MiB is still mapped; an operator's
// malloc variable leaves glibc's settings alone; TrimAfterBurst says when to trim. Its own
// binary: the setting is process-wide.
#include "common/malloc_reuse.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gpubox {
namespace {

TEST(MallocReuse, AnOperatorsMallocVariableLeavesTheSettingsAlone) {
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"}) {
    ASSERT_EQ(::setenv(name, "4", 1), 0);
    const MallocTuning tuning = keep_freed_memory_for_reuse(4);
    ASSERT_EQ(::unsetenv(name), 0);
    EXPECT_FALSE(tuning.applied) << name;
    EXPECT_EQ(tuning.skipped_because, std::string(name) + " is set");
  }
  ASSERT_EQ(::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000", 1), 0);
  const MallocTuning tuning = keep_freed_memory_for_reuse(4);
  ASSERT_EQ(::unsetenv("GLIBC_TUNABLES"), 0);
  EXPECT_FALSE(tuning.applied);
  EXPECT_EQ(tuning.skipped_because, "GLIBC_TUNABLES is set");
}

// A burst is the peak held since the last trim: steady traffic under the size never trims, a
// drain after one at or over it trims once, and a drain to a nonzero level never.
TEST(MallocReuse, TrimAfterBurstSaysOnceForEachBurstThatDrained) {
  constexpr std::size_t kBurst = 1000;
  TrimAfterBurst trim(kBurst);
  for (int i = 0; i < 100; ++i) {  // frames of 999 bytes, one at a time
    trim.held(kBurst - 1);
    EXPECT_FALSE(trim.drained_to(0)) << i;
  }
  trim.held(600);
  trim.held(kBurst);  // two frames held at once: the burst's size
  EXPECT_FALSE(trim.drained_to(400));
  EXPECT_TRUE(trim.drained_to(0));
  EXPECT_FALSE(trim.drained_to(0)) << "the same burst said twice";
  trim.held(kBurst + 1);
  trim.held(1);  // a later, smaller take does not lower the peak
  EXPECT_TRUE(trim.drained_to(0));
  return_freed_memory();  // callable at any time
}

#if defined(__GLIBC__)
std::size_t mapped_chunks() { return ::mallinfo2().hblks; }

TEST(MallocReuse, FrameSizedBuffersComeFromTheHeapAndHugeOnesAreStillMapped) {
  const MallocTuning tuning = keep_freed_memory_for_reuse(8);
  ASSERT_TRUE(tuning.applied) << tuning.skipped_because;
  const std::size_t mapped = mapped_chunks();
  for (std::size_t i = 0; i < 20; ++i) {
    const std::size_t bytes = (std::size_t{1} << 20) + i * (std::size_t{1} << 20) + i * 4096;
    void* frame = std::malloc(bytes);
    ASSERT_NE(frame, nullptr);
    std::memset(frame, 1, bytes);
    EXPECT_EQ(mapped_chunks(), mapped) << bytes << " bytes were mapped";
    std::free(frame);
  }
  void* huge = std::malloc(std::size_t{40} << 20);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(mapped_chunks(), mapped + 1)
      << "40 MiB came from the heap: the threshold is not 32 MiB";
  std::free(huge);
  EXPECT_EQ(mapped_chunks(), mapped);
}
#else
TEST(MallocReuse, DoesNothingWithoutGlibc) { EXPECT_FALSE(keep_freed_memory_for_reuse(8).applied); }
#endif

}  // namespace
}  // namespace gpubox
