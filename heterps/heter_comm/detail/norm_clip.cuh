// Clipping by global norm on the owner (heter_comm_types.hpp: NormClipState): the squares of the
// step's merged push records, the factor, and the records scaled by it. Portable device functors
// (parallel_for, device::reduce_into_then).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/finite.hpp"
#include "common/macros.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_row/optimizer.hpp"

namespace gpubox::heter_comm::detail {

using card_table::row_index_t;

// Sum of squares of merged key m's gradients that its row's step applies, each times the
// state's sparse_scale; 0 past the live count and for a key without a row (a planned step's miss:
// no update either). embed_g always (embed_threshold, when set, keeps a key's step back for a few
// shows: its gradient still counts, as Paddle's counts every embedding row the batch touched);
// embedx_g only when the row held its embedx part before this step (a part made by this push
// starts at its initial values and takes no step: the values the forward used were not
// parameters), over the row's own width (hyper_parameters.slot_dims).
template <class Position>
struct MergedSquares {
  card_table::CardStoreRef store;
  const row_index_t* rows;
  const float* records;
  int32_t dim;                 // the push record's (the widest row's)
  const Position* live_count;  // null, or the merged keys on the card
  std::size_t count;           // merged keys (a bound when live_count is given)
  const NormClipState* state;  // read on the card: its sparse_scale
  GPUBOX_HD double operator()(std::size_t m) const {
    const std::size_t live = live_count != nullptr ? static_cast<std::size_t>(*live_count) : count;
    if (m >= live || rows[m] == card_table::kInvalidRow) return 0.0;
    const float* row = store.row(rows[m]);
    const table::RowLayout layout = store.layout().of_row(row);
    const float* g = records + m * static_cast<std::size_t>(dim);
    const int32_t end = row[layout.mf_size()] > 0.0f
                            ? table::optimizer::PushRecord::kEmbedxG + layout.mf_dim
                            : table::optimizer::PushRecord::kEmbedxG;
    const double scale = static_cast<double>(state->sparse_scale);
    double sum = 0.0;
    for (int32_t f = table::optimizer::PushRecord::kEmbedG; f < end; ++f) {
      const double v = scale * static_cast<double>(g[f]);
      sum += v * v;
    }
    return sum;
  }
};

struct SumDoubles {
  GPUBOX_HD double operator()(double a, double b) const { return a + b; }
};

struct StoreDouble {
  double* out;
  GPUBOX_HD void operator()(double total) const { *out = total; }
};

// state->factor from the dense part and the step's sparse part (over all cards: every card sees
// the same norm). A norm that is not finite (a NaN or inf gradient; a finite float squared in
// double cannot overflow) vetoes the step: *veto := kNonFiniteNorm unless the dense check already
// vetoed it (its verdict names the parameter), so neither part steps and the host reports it.
struct ClipFactor {
  NormClipState* state;
  const double* sparse_squares;
  uint32_t* veto;
  GPUBOX_HD void operator()(std::size_t) const {
    const double norm = ::sqrt(state->squares + *sparse_squares);
    const double clip = static_cast<double>(state->clip_norm);
    if (!is_finite(norm)) {
      if (*veto == kNoVeto) *veto = kNonFiniteNorm;
      state->factor = 1.0f;  // nothing steps: the factor is not used
      return;
    }
    // Paddle's clip_norm / max(global_norm, clip_norm): exactly 1 at or under the clip.
    state->factor = static_cast<float>(clip / (norm > clip ? norm : clip));
  }
};

// The gradient fields of merged key m's record times the factor (show and click kept).
template <class Position>
struct ScaleMerged {
  float* records;
  int32_t dim;
  const Position* live_count;
  std::size_t count;
  const NormClipState* state;
  GPUBOX_HD void operator()(std::size_t m) const {
    const std::size_t live = live_count != nullptr ? static_cast<std::size_t>(*live_count) : count;
    const float factor = state->factor;
    if (m >= live || factor == 1.0f) return;
    float* g = records + m * static_cast<std::size_t>(dim);
    for (int32_t f = table::optimizer::PushRecord::kEmbedG; f < dim; ++f) g[f] *= factor;
  }
};

}  // namespace gpubox::heter_comm::detail
