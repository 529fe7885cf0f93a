// Plain data of the parameter-server modes' sparse push (host-only; no device headers), shared by
// PsWorker, which computes a step's push, and MergedPushes, which sums the trainer's threads'.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpubox::trainer::ps_modes {

// A step's gradients merged per key: n distinct keys, their slots and push_dim floats a key
// (keys x push_dim). A non-owning view: whoever hands one out says how long it is valid.
struct ComputedPush {
  const uint64_t* keys = nullptr;
  const int32_t* slots = nullptr;
  const float* values = nullptr;
  std::size_t n = 0;
};

}  // namespace gpubox::trainer::ps_modes
