// A process whose requests allocate and free buffers of a megabyte or more again and again
// (gpubox_server: every frame's payload and reply; a PS step's rows are a few hundred KB, the
// dense table of config_ps.yaml 1.2 MB each way) keeps the memory it frees for the next ones.
//
// glibc's defaults serve an allocation over its mmap threshold (128 KiB, raised to the largest
// mapping freed so far) with a fresh mapping, and hand a heap's free top back to the kernel once
// it passes the trim threshold (twice that): so each such frame was mapped, faulted in and zeroed
// page by page, and unmapped again. Fixed thresholds of 32 MiB each (glibc's largest mmap
// threshold; setting one turns off glibc's adjustment of both, so both are set) keep the freed
// buffers in the heap: gpubox_server's system time in scripts/bench_peer_paddle.sh --mode ps's
// async run fell from 1.6 to 0.8 s a run, and the job's examples/s rose 1.1-1.4x in interleaved
// runs on a loaded 2-core machine, its replies no longer waiting on page faults.
//
// The cost: every glibc arena (one per thread that allocates, up to 8 per core by default) keeps
// the chunks freed in it, so the resident size settles at the sum of each arena's peak, memory no
// limit of the server counts (--memory_mb, --max_inflight_mb, --max_dense_mb see only live
// data). So the arenas are capped (max_arenas), and the server hands free memory back with
// return_freed_memory() once a burst has drained (TrimAfterBurst) and after a bulk call (LOAD,
// SAVE, SHRINK). An operator's own malloc settings (GLIBC_TUNABLES, MALLOC_*_ environment
// variables) are left alone: then nothing is set here.
//
// Thread-safety: keep_freed_memory_for_reuse once at the start of main, before other threads
// allocate; return_freed_memory and TrimAfterBurst from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

namespace gpubox {

// What keep_freed_memory_for_reuse did.
struct MallocTuning {
  bool applied = false;  // the thresholds and the arena cap are set
  // Why not, when not: the operator's variable that was set, or that the C library refused.
  std::string skipped_because;
};

// Sets the thresholds above and at most `max_arenas` arenas (glibc; elsewhere nothing), unless
// an operator's malloc variable is set. Not applied: the defaults stay (slower, not wrong).
MallocTuning keep_freed_memory_for_reuse(int max_arenas);

// Hands the heaps' free memory back to the kernel (glibc's malloc_trim; elsewhere nothing).
void return_freed_memory();

// Says when the bytes a server holds in flight have fallen to 0 after reaching at least
// `burst_bytes` since the last time it said so: the moment to return_freed_memory(). Thread-safe.
class TrimAfterBurst {
 public:
  explicit TrimAfterBurst(std::size_t burst_bytes) : burst_bytes_(burst_bytes) {}
  // The bytes held after a take.
  void held(std::size_t bytes);
  // The bytes held after a give-back; true once for each burst that drained.
  bool drained_to(std::size_t bytes);

 private:
  const std::size_t burst_bytes_;
  std::atomic<std::size_t> peak_{0};
};

}  // namespace gpubox
