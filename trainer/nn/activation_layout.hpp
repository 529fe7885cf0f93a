// The row stride every dense part gives its activation matrices (DenseModel and the model parts,
// and the layer-gemms benchmark that times their GEMMs): one rule, so the parts' layouts agree.
#pragma once

#include <cstdint>

namespace gpubox::trainer {

// Row stride of an activation matrix with `cols` columns: a multiple of 8 elements (16 bytes of
// bf16), so every row starts where tensor-core GEMMs want it; a single column stays dense.
inline int64_t activation_ld(int64_t cols) { return cols == 1 ? 1 : (cols + 7) / 8 * 8; }

}  // namespace gpubox::trainer
