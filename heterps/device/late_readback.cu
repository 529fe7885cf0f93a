// LateReadback's card half (late_readback.hpp): the copies into the slot the card's counter names
// (and into the slot's own block), and the counter's reset. Portable device code: nvcc on CUDA, the
// host compiler on cpu.
#include <cstdint>

#include "common/error.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::device::detail {
namespace {

// One thread: every segment into slot (*counter % depth), then the counter advanced. One thread
// orders the counter's read before its write without a grid-wide barrier; the segments are a
// few dozen words (a step's status, a check's words), written straight into pinned memory
// (CUDA: cudaMallocHost memory is mapped at the same address under unified addressing).
struct CopyIntoRingSlot {
  unsigned char* slots;
  std::size_t slot_bytes;
  std::size_t depth;
  uint64_t* counter;
  RingSegment segments[kMaxRingSegments];
  std::size_t count;
  GPUBOX_HD void operator()(std::size_t) const {
    const uint64_t at = *counter % depth;
    unsigned char* slot = slots + at * slot_bytes;
    for (std::size_t s = 0; s < count; ++s) {
      const auto* from = static_cast<const uint32_t*>(segments[s].from);
      auto* to = reinterpret_cast<uint32_t*>(slot + segments[s].offset);
      for (std::size_t w = 0; w < segments[s].bytes / sizeof(uint32_t); ++w) to[w] = from[w];
    }
    *counter = *counter + 1;
  }
};

// A thread a word: every thread reads the same counter (not written here), so the block is the
// open slot's for the whole copy; written straight into pinned memory as above.
struct CopyIntoRingBlock {
  uint32_t* blocks[kMaxRingDepth];
  std::size_t depth;
  const uint64_t* counter;
  const uint32_t* from;
  GPUBOX_HD void operator()(std::size_t w) const { blocks[*counter % depth][w] = from[w]; }
};

struct SetRingCounter {
  uint64_t* counter;
  uint64_t value;
  GPUBOX_HD void operator()(std::size_t) const { *counter = value; }
};

}  // namespace

void copy_into_ring_slot(const Stream& stream, void* slots, std::size_t slot_bytes,
                         std::size_t depth, uint64_t* counter, const RingSegment* segments,
                         std::size_t count) {
  GPUBOX_EXPECTS(count <= kMaxRingSegments, "LateReadback: ", count, " segments into one slot (",
                 kMaxRingSegments, " at most)");
  CopyIntoRingSlot copy{static_cast<unsigned char*>(slots), slot_bytes, depth, counter, {}, count};
  for (std::size_t s = 0; s < count; ++s) {
    const RingSegment& segment = segments[s];
    // Whole aligned words (every record copied so far is made of 4- and 8-byte fields).
    GPUBOX_EXPECTS(segment.bytes % sizeof(uint32_t) == 0 &&
                       segment.offset % sizeof(uint32_t) == 0 &&
                       reinterpret_cast<std::uintptr_t>(segment.from) % sizeof(uint32_t) == 0 &&
                       segment.offset + segment.bytes <= slot_bytes,
                   "LateReadback: segment of ", segment.bytes, " bytes at offset ", segment.offset,
                   " of a ", slot_bytes, "-byte slot: whole aligned 4-byte words inside the slot");
    copy.segments[s] = segment;
  }
  parallel_for(stream, 1, copy);
}

void copy_into_ring_block(const Stream& stream, void* const* blocks, std::size_t depth,
                          const uint64_t* counter, const void* from, std::size_t bytes) {
  GPUBOX_EXPECTS(depth >= 1 && depth <= kMaxRingDepth && bytes % sizeof(uint32_t) == 0 &&
                     reinterpret_cast<std::uintptr_t>(from) % sizeof(uint32_t) == 0,
                 "LateReadback: a block copy of ", bytes, " bytes over ", depth,
                 " slots: whole aligned 4-byte words, at most ", kMaxRingDepth, " slots");
  CopyIntoRingBlock copy{{}, depth, counter, static_cast<const uint32_t*>(from)};
  for (std::size_t i = 0; i < depth; ++i) {
    GPUBOX_EXPECTS(reinterpret_cast<std::uintptr_t>(blocks[i]) % sizeof(uint32_t) == 0,
                   "LateReadback: slot ", i, "'s block is not 4-byte aligned");
    copy.blocks[i] = static_cast<uint32_t*>(blocks[i]);
  }
  parallel_for(stream, bytes / sizeof(uint32_t), copy);
}

void set_ring_counter(const Stream& stream, uint64_t* counter, uint64_t value) {
  parallel_for(stream, 1, SetRingCounter{counter, value});
}

}  // namespace gpubox::device::detail
