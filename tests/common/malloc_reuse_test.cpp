// common/malloc_reuse.hpp: after keep_freed_memory_for_reuse(), buffers of a few MB (a server
// frame's) come from the heap, allocated and freed again and again without a new mapping (glibc's
// defaults mapped the first of them afresh), while one over 32 MiB is still mapped. Its own
// binary: the setting is process-wide.
#include "common/malloc_reuse.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gpubox {
namespace {

#if defined(__GLIBC__)
std::size_t mapped_chunks() { return ::mallinfo2().hblks; }

TEST(MallocReuse, FrameSizedBuffersComeFromTheHeapAndHugeOnesAreStillMapped) {
  ASSERT_TRUE(keep_freed_memory_for_reuse());
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
TEST(MallocReuse, DoesNothingWithoutGlibc) { EXPECT_FALSE(keep_freed_memory_for_reuse()); }
#endif

}  // namespace
}  // namespace gpubox
