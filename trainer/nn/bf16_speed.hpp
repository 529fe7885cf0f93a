// Whether a card's bf16 GEMMs outrun its fp32 ones. Having bf16 GEMMs in hardware does not make
// them faster: on an Intel Xeon with AVX512-BF16 and no AMX (oneDNN: avx512_core_bf16) a bf16
// dot-product instruction does half the work a cycle of fp32's FMAs, and every bf16 GEMM took
// about twice fp32's time, while an AMD EPYC reporting the same ISA ran them 1.9x faster
// (BENCHMARKS.md, 2026-12-02). DenseModel measures it once per process where bf16 is asked for
// and runs in hardware, and warns when bf16 is the slower choice (it still runs what was asked).
#pragma once

#include <string>

namespace gpubox::trainer {

class Blas;

// bf16 GEMM rate / fp32 GEMM rate on `blas`'s card: Blas::gemm_bf16 against Blas::sgemm on one
// square n x n x n product, 5 interleaved rounds, each precision's fastest of its 10 timed calls
// (card buffers allocated and freed here). Needs blas.bf16() != kNone. The first call's figure is
// kept for the process: later calls return it without measuring.
double bf16_gemm_speedup(Blas& blas, int n = 512);

// The start-up warning for a measured speedup below 1 (naming it and the ISA); empty otherwise.
std::string bf16_speed_warning(double speedup, const std::string& isa);

}  // namespace gpubox::trainer
