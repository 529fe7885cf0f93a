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
// runs on a loaded 2-core machine, its replies no longer waiting on page faults. What the heap
// keeps is bounded by what the process used at its peak (and 32 MiB of free top a heap), not
// returned at once after a burst.
//
// Thread-safety: call once at the start of main, before other threads allocate.
#pragma once

namespace gpubox {

// Sets the thresholds above (glibc; elsewhere nothing). Returns false when the C library
// refused or lacks them (the defaults then stay: slower, not wrong).
bool keep_freed_memory_for_reuse();

}  // namespace gpubox
