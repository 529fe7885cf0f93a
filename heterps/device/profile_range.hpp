// ProfileRange: a named range on the profiler's timeline for the lifetime of a scope, so that an
// Nsight Systems profile (scripts/gpu_check.sh's nsys item) reads by phase: the step's upload
// and pull, dense forward/backward, dense all-reduce, push and update; the pass boundary's
// begin_pass, end_pass and the next pass's card work between steps; an evaluation's steps.
//
// CUDA backend: an NVTX push/pop range in the "GPUBox" domain (NVTX3 is header-only in the CUDA
// toolkit; with no profiler attached each call is a check of a null function pointer). cpu
// backend: an empty object, nothing is compiled in.
//
// Thread-safety: ranges nest per thread (open and close a range on the same thread, as a scope
// does); any thread may open ranges. `name` must be a string literal or outlive the range.
#pragma once

#if defined(GPUBOX_BACKEND_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif

namespace gpubox::device {

class ProfileRange {
 public:
#if defined(GPUBOX_BACKEND_CUDA)
  explicit ProfileRange(const char* name) noexcept {
    nvtxEventAttributes_t attributes = {};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    nvtxDomainRangePushEx(domain(), &attributes);
  }
  ~ProfileRange() { nvtxDomainRangePop(domain()); }
#else
  explicit ProfileRange(const char* /*name*/) noexcept {}
#endif
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
#if defined(GPUBOX_BACKEND_CUDA)
  // Created once per process (a function-local static: thread-safe), never destroyed.
  static nvtxDomainHandle_t domain() noexcept {
    static const nvtxDomainHandle_t handle = nvtxDomainCreateA("GPUBox");
    return handle;
  }
#endif
};

}  // namespace gpubox::device
