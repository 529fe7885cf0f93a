// The float64 reference of the sparse rows' adam step (table/sparse_row/optimizer.hpp), shared by
// optimizer_test.cu (every optimizer, with Paddle's per_row bias correction) and
// optimizer_table_step_test.cu (adam_bias_correction per_table, Paddle's lazy adam op): one
// place where the reference's adam is written, so the two tests cannot drift apart. Host code
// only, in double throughout.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "table/sparse_row/accessor.hpp"

namespace gpubox::table::reference {

// One part (embed_w or embedx) of one reference row, by named fields rather than RowLayout
// offsets: the weights, and the optimizer's state.
struct RefPart {
  std::vector<double> w;
  std::vector<double> m;  // adam: per-dim (or shared: size 1) first moment
  std::vector<double> v;  // adam: second moment; adagrad: v[0] = g2sum
  // adam's powers of beta1 and beta2 for the part's next step (per_row bias correction:
  // SparseAdamSGDRule's, starting at beta1 and beta2).
  double beta1_pow = 0.0;
  double beta2_pow = 0.0;
};

// Paddle's lazy adam op's accumulators (adam_bias_correction per_table): b^t for the step being
// applied, one pair for the whole table.
struct RefTablePowers {
  double beta1_pow = 0.0;
  double beta2_pow = 0.0;
};

// One adam step of `p` on the gradient `g` (one value per weight, any decay term already in it)
// at learning rate `lr`, with `cfg`'s betas and epsilon. `shared`: SparseSharedAdamSGDRule (one
// moment pair for the part: each weight's step reads it, and it becomes the mean of the new
// ones); else SparseAdamSGDRule (a pair per weight). `table` null: per_row bias correction, the
// part's own powers, advanced after the step, epsilon as is; else per_table, the table's powers
// (its caller advances them once per step) and epsilon times sqrt(1 - beta2_pow), as Paddle's op.
// `clip(w)`: the new weight as the rule bounds it.
template <class Clip>
void ref_adam_step(bool shared, RefPart& p, const std::vector<double>& g, double lr,
                   const AccessorConfig& cfg, const RefTablePowers* table, Clip clip) {
  const double b1 = cfg.optimizer.beta1_decay_rate, b2 = cfg.optimizer.beta2_decay_rate;
  const double b1_pow = table != nullptr ? table->beta1_pow : p.beta1_pow;
  const double b2_pow = table != nullptr ? table->beta2_pow : p.beta2_pow;
  const double lr_t = lr * std::sqrt(1 - b2_pow) / (1 - b1_pow);
  const double eps = cfg.optimizer.ada_epsilon * (table != nullptr ? std::sqrt(1 - b2_pow) : 1.0);
  double sum_m = 0, sum_v = 0;
  for (std::size_t i = 0; i < p.w.size(); ++i) {
    const std::size_t j = shared ? 0 : i;
    const double m = b1 * p.m[j] + (1 - b1) * g[i];
    const double v = b2 * p.v[j] + (1 - b2) * g[i] * g[i];
    p.w[i] = clip(p.w[i] - lr_t * m / (std::sqrt(v) + eps));
    if (shared) {
      sum_m += m;
      sum_v += v;
    } else {
      p.m[i] = m;
      p.v[i] = v;
    }
  }
  if (shared) {
    p.m[0] = sum_m / static_cast<double>(p.w.size());
    p.v[0] = sum_v / static_cast<double>(p.w.size());
  }
  if (table == nullptr) {
    p.beta1_pow *= b1;
    p.beta2_pow *= b2;
  }
}

}  // namespace gpubox::table::reference
