// isa_clones(f): a parallel_for functor whose cpu items run in a function compiled for AVX-512,
// AVX2 + FMA and the baseline, the loader picking the best the machine runs (the build targets
// the baseline, SSE2, where oneDNN JITs its own kernels): for the dense net's elementwise and
// column loops, whose float work is otherwise 4 lanes wide. `f`'s run_range form (parallel_for.cuh)
// runs there if it has one, else f(i) item by item. CUDA: f itself.
//
// Only from sources built with -ffp-contract=off (CMake: gpubox_no_fp_contract, which also
// defines GPUBOX_FP_CONTRACT_OFF; g++ builds without it stop below): the AVX2 and AVX-512 clones
// have FMA, which g++ would contract a * b + c into otherwise, and each clone would then round
// differently. Without contraction every clone does the same IEEE operations on each value as the
// baseline (a vectorized loop keeps each lane's order; no reassociation without -ffast-math): the
// same bits on any machine.
#pragma once

#include <cstddef>

#include "common/macros.hpp"
#include "heterps/device/parallel_for.cuh"

#if !defined(GPUBOX_BACKEND_CUDA) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__CUDACC__) && !defined(GPUBOX_FP_CONTRACT_OFF)
#error "isa_clones.cuh: build this source with gpubox_no_fp_contract (cmake/GpuboxBackend.cmake)"
#endif

// A cpu function compiled once per instruction set (see the file comment). g++ 12 and later only:
// clang's target_clones takes no arch=, and older g++ handle the x86-64-v3/v4 names unreliably
// (those builds run the baseline alone).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && \
    !defined(__CUDACC__)
#define GPUBOX_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GPUBOX_ISA_CLONES
#endif

namespace gpubox::device {

#if defined(GPUBOX_BACKEND_CUDA)
template <class F>
F isa_clones(F f) {
  return f;
}
#else
namespace detail {
// Items [begin, end) of `f`, compiled per instruction set; flatten inlines `f`'s forms and
// everything they call into each clone (else g++ calls the baseline's out-of-line copy).
template <class F>
GPUBOX_ISA_CLONES __attribute__((flatten)) void run_items_cloned(const F& f, std::size_t begin,
                                                                 std::size_t end) {
  if constexpr (HasRunRange<F>::value) {
    f.run_range(begin, end);
  } else {
    for (std::size_t i = begin; i < end; ++i) f(i);
  }
}
}  // namespace detail

// `f` with its items run through detail::run_items_cloned.
template <class F>
struct IsaClones {
  F f;
  void operator()(std::size_t i) const { f(i); }
  void run_range(std::size_t begin, std::size_t end) const {
    detail::run_items_cloned(f, begin, end);
  }
};

template <class F>
IsaClones<F> isa_clones(F f) {
  return IsaClones<F>{f};
}
#endif

}  // namespace gpubox::device
