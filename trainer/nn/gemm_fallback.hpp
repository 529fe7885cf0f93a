// The fused layer GEMMs' fallback (linear_gemms_cublaslt.cpp; issue 31, item 6): when cuBLASLt
// has no algorithm for a GEMM with its epilogue, another of the heuristic's algorithms, then a
// plain GEMM (cublasGemmEx) followed by the element-wise kernels below that do the epilogue's
// work. A layer never fails for want of an algorithm (the 1-wide logit layer was the likeliest
// shape to hit it). The choice and the element-wise work are backend-neutral: the cpu tests run
// them; only the cuBLAS calls around them are cuda-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "heterps/device/stream.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::trainer {

// The first of the heuristic's candidate algorithms (best first) that passed its check, or -1:
// none did, run the plain GEMM and the element-wise kernels.
int first_usable_algorithm(const std::vector<bool>& passed_check);

// Logs `message` (a warning) the first time this process sees `key` (e.g. "fc_4 forward"); true
// when it logged. Thread-safe: card threads prepare their layers at once.
bool log_fallback_once(const std::string& key, const std::string& message);

// Whether GPUBOX_FORCE_GEMM_FALLBACK=1 is set: the cuda backend then makes every layer GEMM as if
// cuBLASLt had no algorithm for it, so the plain cublasGemmEx and the element-wise kernels below
// run every one (scripts/gpu_check.sh runs the layer tests so: a GPU whose cuBLASLt has every
// algorithm never takes that path otherwise). Unset, empty or 0: off; any other value throws
// naming the variable. Read at each call (as layers make their GEMM plans); logged once per
// process when on. The cpu backend's oneDNN GEMMs have no such fallback and do not read it.
bool gemm_fallback_forced();

// The forward epilogue without cuBLASLt: y[r][c] = act(y[r][c] + bias[c]) for r < batch, c < out
// (row-major, row stride y_ld, y of `y_type`; act = ReLU when `relu`, else identity). On `stream`.
void add_bias_activation(void* y, ElementType y_type, int64_t y_ld, const float* bias,
                         int64_t batch, int out, bool relu, const device::Stream& stream);

// The ReLU backward without a recorded mask (DRELU's work): dx[r][c] = 0 where x[r][c] <= 0, for
// r < batch, c < cols; x is the producer's ReLU output (what oneDNN's path reads too).
void mask_by_relu_input(void* dx, ElementType dx_type, int64_t dx_ld, const void* x,
                        ElementType x_type, int64_t x_ld, int64_t batch, int cols,
                        const device::Stream& stream);

}  // namespace gpubox::trainer
