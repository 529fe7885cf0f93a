// Sparse optimizers: one optimizer step for one row from one merged push record, on host and
// card alike (GPUBOX_HD, no allocation, no exceptions): the card tier's HeterComm and, in the
// async/sync parameter-server modes, gpubox_server apply the same rule. The row layout and the
// accessor rules (init_row, maybe_create_embedx, row_score) come from
// table/sparse_row/accessor.hpp; the update formulas are Paddle's sparse SGD rules
// (ps/table/sparse_sgd_rule.cc, and for the GPU table GPUBox mirrors heter_ps/optimizer.cuh.h),
// with g the step's gradient (below):
//
//   sgd          w -= lr * g
//   adagrad      (SparseAdaGradSGDRule, one g2sum shared by the part, starting at 0)
//                w -= lr * g * sqrt(initial_g2sum / (initial_g2sum + g2sum));
//                g2sum += mean(g^2) over the part   (after the step: g2sum excludes this g)
//   adam         (SparseAdamSGDRule, per-dim moments) lr_t = lr * sqrt(1 - b2pow) / (1 - b1pow);
//                m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr_t m / (sqrt(v) + eps);
//                b1pow *= b1; b2pow *= b2
//   shared_adam  (SparseSharedAdamSGDRule) as adam, but every dim starts from the part's shared
//                m, v; afterwards the shared m, v are the means of the per-dim new m, v
//
// adam and shared_adam correct per row as above (adam_bias_correction: per_row, Paddle's
// parameter-server rules), or per table (per_table, Paddle's adam op with lazy_mode): b1pow and
// b2pow are the table's, b^t at the table's step t (TableAdamStep, advanced once a training step
// whether a row is in the batch or not), and epsilon is scaled as that op scales it:
//                lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); w -= lr_t m / (sqrt(v) + eps sqrt(1 -
//                b2^t))
// and the row's own b1pow, b2pow stay at their start.
//
// and every weight is clipped to the part's [min_bound, max_bound] after its update.
//
// The step's gradient. With show_scale (the default; Paddle's ctr_accessor_param.show_scale, and
// always so in its GPU rules) the merged gradient (summed over the batch's occurrences of the
// key, on every card) is divided by the key's show in that batch: a hot key takes a mean-gradient
// step rather than one hundreds of times larger. GPUBox's addition, off by default: weight_decay
// (L2, as Paddle optimizers' weight_decay / L2Decay) adds weight_decay * w, and l1_decay (L1, as
// Paddle's L1Decay, embed_w only: PaddleRec logistic_regression's reg) adds l1_decay * sign(w)
// (sign(0) = 0), on the steps a key takes:
//   g = push_g / (show_scale ? max(push_show, 1) : 1) + weight_decay * w + l1_decay * sign(w)
#pragma once

#include <cmath>
#include <cstdint>

#include "common/macros.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table::optimizer {

using table::AccessorConfig;
using table::PartWeights;
using table::RowLayout;
using table::SparseOptimizerConfig;
using table::SparseOptimizerKind;

// The table's step of adam_bias_correction: per_table (one per table on each card that applies
// its rows' steps; every card of a job counts the same steps). advance_table_adam before each
// training step's updates, which then read it. Plain data, card memory on the card tier.
struct TableAdamStep {
  int64_t steps = 0;       // training steps the table took, the one being applied included
  float lr_scale = 1.0f;   // sqrt(1 - b2^t) / (1 - b1^t) at t = steps
  float eps_scale = 1.0f;  // sqrt(1 - b2^t)
};

// Whether rows of `cfg` step with the table's step: adam or shared_adam under per_table.
GPUBOX_HD inline bool uses_table_step(const AccessorConfig& cfg) {
  return cfg.optimizer.bias_correction == table::AdamBiasCorrection::kPerTable &&
         (cfg.optimizer.kind == SparseOptimizerKind::kAdam ||
          cfg.optimizer.kind == SparseOptimizerKind::kSharedAdam);
}

// The next step's corrections in double (the same on every card of a backend; CUDA's and glibc's
// pow may differ by an ulp), rounded once, as the dense adam's (trainer/nn/dense_optimizer.cu).
GPUBOX_HD inline void advance_table_adam(TableAdamStep& step, float beta1, float beta2) {
  step.steps += 1;
  const double t = static_cast<double>(step.steps);
  const double correction = ::sqrt(1.0 - ::pow(static_cast<double>(beta2), t));
  step.lr_scale = static_cast<float>(correction / (1.0 - ::pow(static_cast<double>(beta1), t)));
  step.eps_scale = static_cast<float>(correction);
}

// Field offsets of the push record (RowLayout::push_dim() floats per key).
struct PushRecord {
  static constexpr int32_t kShow = 0;
  static constexpr int32_t kClick = 1;
  static constexpr int32_t kEmbedG = 2;
  static constexpr int32_t kEmbedxG = 3;
};

// Hyper-parameters of one part of the row (embed_w or embedx). Plain data.
struct PartRule {
  float learning_rate;
  float initial_g2sum;
  float min_bound;
  float max_bound;
  float weight_decay;
  float l1_decay;
};

GPUBOX_HD inline PartRule embed_rule(const SparseOptimizerConfig& cfg) {
  return PartRule{cfg.learning_rate, cfg.initial_g2sum, cfg.min_bound,
                  cfg.max_bound,     cfg.weight_decay,  cfg.l1_decay};
}
GPUBOX_HD inline PartRule embedx_rule(const SparseOptimizerConfig& cfg) {
  return PartRule{cfg.mf_learning_rate, cfg.mf_initial_g2sum, cfg.mf_min_bound,
                  cfg.mf_max_bound,     cfg.mf_weight_decay,  0.0f};
}

// w < min_bound ? min_bound : (w > max_bound ? max_bound : w), for every w and bounds, written
// as two selects rather than nested ones so that a loop of it vectorizes (adam_update).
GPUBOX_HD inline float clip_weight(float w, const PartRule& rule) {
  const float below_max = w > rule.max_bound ? rule.max_bound : w;
  return w < rule.min_bound ? rule.min_bound : below_max;
}

// The gradient of one weight for this step (see the file comment), read before w changes. The
// sign is 1, -1 or 0 (NaN: 0) as a difference of two selects (vectorizes, as clip_weight).
GPUBOX_HD inline float step_gradient(float push_g, float w, const PartRule& rule, float scale) {
  const float sign = (w > 0.0f ? 1.0f : 0.0f) - (w < 0.0f ? 1.0f : 0.0f);
  return push_g / scale + rule.weight_decay * w + rule.l1_decay * sign;
}

// --- one part: w[dim], its optimizer state, its gradient g[dim] ---------------------------
// The weights are read and written through PartWeights (sparse_row.hpp): each step computes in
// fp32 and rounds once per weight on its write when the storage is 16-bit.

// `g`: the pushed gradient; `scale`: its divisor (the key's show; see the file comment).
GPUBOX_HD inline void sgd_update(PartWeights w, const float* g, int32_t dim, const PartRule& rule,
                                 float scale) {
  for (int32_t i = 0; i < dim; ++i) {
    const float wi = w.get(i);
    w.set(i, clip_weight(wi - rule.learning_rate * step_gradient(g[i], wi, rule, scale), rule));
  }
}

// state: [g2sum]
GPUBOX_HD inline void adagrad_update(PartWeights w, float* state, const float* g, int32_t dim,
                                     const PartRule& rule, float scale) {
  float& g2sum = state[0];
  const float ratio = rule.learning_rate * sqrtf(rule.initial_g2sum / (rule.initial_g2sum + g2sum));
  float add_g2sum = 0.0f;
  for (int32_t i = 0; i < dim; ++i) {
    const float wi = w.get(i);
    const float gi = step_gradient(g[i], wi, rule, scale);
    w.set(i, clip_weight(wi - ratio * gi, rule));
    add_g2sum += gi * gi;
  }
  if (dim > 0) g2sum += add_g2sum / static_cast<float>(dim);
}

// Bias-corrected step size of adam / shared_adam (constant within one update).
GPUBOX_HD inline float adam_step_size(float learning_rate, float beta1_pow, float beta2_pow) {
  return learning_rate * sqrtf(1.0f - beta2_pow) / (1.0f - beta1_pow);
}

// One adam weight: its moments m, v advanced by the step's gradient, the new weight returned.
GPUBOX_HD GPUBOX_FORCEINLINE float adam_weight(float w, float push_g, float& m, float& v,
                                               const PartRule& rule, float b1, float b2, float lr,
                                               float epsilon, float scale) {
  const float g = step_gradient(push_g, w, rule, scale);
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  return clip_weight(w - lr * (m / (sqrtf(v) + epsilon)), rule);
}

// adam over fp32 weights, which lie side by side in the row: nothing aliases and every element
// is adam_weight's, so the loop vectorizes (on cpu: the sqrt and division 4 lanes wide) with each
// element's operations in the same order, the same bits as one at a time. g++ vectorizes a sqrt
// only in a TU built without errno (-fno-math-errno; the optimize attribute does not do it), so
// this, adam_update, update_part and apply_push are inlined into their callers: ApplyUpdates
// (heterps/heter_comm, built so) gets the vector loop whichever TU's copy of an out-of-line
// function the linker would have kept.
GPUBOX_HD GPUBOX_FORCEINLINE void adam_fp32(float* __restrict__ w, float* __restrict__ gsum,
                                            float* __restrict__ g2sum, const float* __restrict__ g,
                                            int32_t dim, const PartRule rule, float b1, float b2,
                                            float lr, float epsilon, float scale) {
  for (int32_t i = 0; i < dim; ++i) {
    w[i] = adam_weight(w[i], g[i], gsum[i], g2sum[i], rule, b1, b2, lr, epsilon, scale);
  }
}

// The step size and epsilon of one adam / shared_adam update: from the row's powers (`table`
// null: per_row), or the table's step (per_table; the row's powers are not used).
struct AdamScalars {
  float lr;
  float epsilon;
};
GPUBOX_HD inline AdamScalars adam_scalars(float learning_rate, float epsilon, float beta1_pow,
                                          float beta2_pow, const TableAdamStep* table) {
  if (table != nullptr) {
    return AdamScalars{learning_rate * table->lr_scale, epsilon * table->eps_scale};
  }
  return AdamScalars{adam_step_size(learning_rate, beta1_pow, beta2_pow), epsilon};
}

// state: [gsum[dim], g2sum[dim], beta1_pow, beta2_pow]; `table`: as adam_scalars.
GPUBOX_HD GPUBOX_FORCEINLINE void adam_update(PartWeights w, float* state, const float* g,
                                              int32_t dim, const PartRule& rule,
                                              const SparseOptimizerConfig& cfg, float scale,
                                              const TableAdamStep* table) {
  float* gsum = state;
  float* g2sum = state + dim;
  float& beta1_pow = state[2 * dim];
  float& beta2_pow = state[2 * dim + 1];
  const float b1 = cfg.beta1_decay_rate;
  const float b2 = cfg.beta2_decay_rate;
  const AdamScalars step =
      adam_scalars(rule.learning_rate, cfg.ada_epsilon, beta1_pow, beta2_pow, table);
  if (w.embedx && !w.layout.packed()) {
    adam_fp32(w.row + w.layout.embedx_w(), gsum, g2sum, g, dim, rule, b1, b2, step.lr, step.epsilon,
              scale);
  } else {
    for (int32_t i = 0; i < dim; ++i) {
      w.set(i, adam_weight(w.get(i), g[i], gsum[i], g2sum[i], rule, b1, b2, step.lr, step.epsilon,
                           scale));
    }
  }
  if (table != nullptr) return;
  beta1_pow *= b1;
  beta2_pow *= b2;
}

// state: [gsum, g2sum, beta1_pow, beta2_pow], moments shared by the part; `table`: as
// adam_scalars.
GPUBOX_HD inline void shared_adam_update(PartWeights w, float* state, const float* g, int32_t dim,
                                         const PartRule& rule, const SparseOptimizerConfig& cfg,
                                         float scale, const TableAdamStep* table) {
  float& gsum = state[0];
  float& g2sum = state[1];
  float& beta1_pow = state[2];
  float& beta2_pow = state[3];
  const float b1 = cfg.beta1_decay_rate;
  const float b2 = cfg.beta2_decay_rate;
  const AdamScalars step =
      adam_scalars(rule.learning_rate, cfg.ada_epsilon, beta1_pow, beta2_pow, table);
  float sum_gsum = 0.0f;
  float sum_g2sum = 0.0f;
  for (int32_t i = 0; i < dim; ++i) {
    const float wi = w.get(i);
    const float gi = step_gradient(g[i], wi, rule, scale);
    const float new_gsum = b1 * gsum + (1.0f - b1) * gi;
    const float new_g2sum = b2 * g2sum + (1.0f - b2) * gi * gi;
    w.set(i, clip_weight(wi - step.lr * (new_gsum / (sqrtf(new_g2sum) + step.epsilon)), rule));
    sum_gsum += new_gsum;
    sum_g2sum += new_g2sum;
  }
  if (dim > 0) {
    gsum = sum_gsum / static_cast<float>(dim);
    g2sum = sum_g2sum / static_cast<float>(dim);
  }
  if (table != nullptr) return;
  beta1_pow *= b1;
  beta2_pow *= b2;
}

// One step of `kind` over one part. The kind is uniform over a batch, so the switch does not
// diverge across card threads. `table`: the table's step for adam and shared_adam under
// per_table, null otherwise.
GPUBOX_HD GPUBOX_FORCEINLINE void update_part(SparseOptimizerKind kind, PartWeights w, float* state,
                                              const float* g, int32_t dim, const PartRule& rule,
                                              const SparseOptimizerConfig& cfg, float scale,
                                              const TableAdamStep* table) {
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      sgd_update(w, g, dim, rule, scale);
      break;
    case SparseOptimizerKind::kAdagrad:
      adagrad_update(w, state, g, dim, rule, scale);
      break;
    case SparseOptimizerKind::kAdam:
      adam_update(w, state, g, dim, rule, cfg, scale, table);
      break;
    case SparseOptimizerKind::kSharedAdam:
      shared_adam_update(w, state, g, dim, rule, cfg, scale, table);
      break;
  }
}

// --- one row -------------------------------------------------------------------------------

// Applies one merged push record to `row` (the step of one key in one batch), in the order of
// Paddle's accessors (CtrCommonAccessor::Update, heter_ps dy_mf_update_value):
//   show/click += the push's show/click; delta_score += show_click_score of the push;
//   unseen_days = 0; embed_w takes one optimizer step (when embed_threshold > 0: only once
//   the row's new score reaches it; by default always, as in Paddle); then, if the embedx part
//   existed before this step it takes one step, otherwise it is created when the row's new
//   score reaches embedx_threshold (its gradient of this step is not applied).
// Returns true when this step created the embedx part. `row` is a row of `layout`'s optimizer,
// of any width (its own layout, RowLayout::of_row, is used); `push` holds at least its width.
// `table`: the table's step (advance_table_adam'd for this step) when cfg's optimizer is adam or
// shared_adam with adam_bias_correction per_table; null otherwise (then ignored).
GPUBOX_HD GPUBOX_FORCEINLINE bool apply_push(float* row, const RowLayout& any_layout,
                                             const AccessorConfig& cfg, uint64_t key,
                                             const float* push,
                                             const TableAdamStep* table = nullptr) {
  const RowLayout layout = any_layout.of_row(row);
  const float show = push[PushRecord::kShow];
  const float click = push[PushRecord::kClick];
  row[RowLayout::kShow] += show;
  row[RowLayout::kClick] += click;
  row[RowLayout::kDeltaScore] += table::show_click_score(show, click, cfg);
  row[RowLayout::kUnseenDays] = 0.0f;
  // A key without a show takes its gradient as is.
  const float scale = cfg.show_scale && show > 1.0f ? show : 1.0f;

  // Below embed_threshold a key is counted but not learned: the weights of keys seen a few
  // times are what a dnn memorises in a second epoch over the same data (BENCHMARKS.md).
  const SparseOptimizerConfig& opt = cfg.optimizer;
  if (cfg.embed_threshold <= 0.0f || table::row_score(row, cfg) >= cfg.embed_threshold) {
    update_part(opt.kind, PartWeights{row, layout, false}, row + RowLayout::kEmbedState,
                push + PushRecord::kEmbedG, 1, embed_rule(opt), opt, scale, table);
  }

  if (row[layout.mf_size()] > 0.0f) {
    update_part(opt.kind, PartWeights{row, layout, true}, row + layout.embedx_state(),
                push + PushRecord::kEmbedxG, layout.mf_dim, embedx_rule(opt), opt, scale, table);
    return false;
  }
  return table::maybe_create_embedx(row, layout, cfg, key);
}

// Geo mode (runner.sync_mode: geo): adds a trainer's delta to `row`. `delta` has the push
// record's shape (show, click, embed_w, embedx_w[mf_dim]): the change of the trainer's local
// copy since it last synced. show/click, delta_score and unseen_days change as a push's would;
// the weights move by the delta, clipped to their bounds. An embedx part the row lacks is
// created at `key`'s initial values (create_embedx) when the delta carries one: a trainer
// created it locally at those same values, and its delta is the change since then, so the
// initial values count once however many trainers created the part.
GPUBOX_HD inline void apply_delta(float* row, const RowLayout& any_layout,
                                  const AccessorConfig& cfg, uint64_t key, const float* delta) {
  const RowLayout layout = any_layout.of_row(row);
  const float show = delta[PushRecord::kShow];
  const float click = delta[PushRecord::kClick];
  row[RowLayout::kShow] += show;
  row[RowLayout::kClick] += click;
  row[RowLayout::kDeltaScore] += table::show_click_score(show, click, cfg);
  row[RowLayout::kUnseenDays] = 0.0f;
  const SparseOptimizerConfig& opt = cfg.optimizer;
  table::write_embed_w(
      row, layout,
      clip_weight(table::read_embed_w(row, layout) + delta[PushRecord::kEmbedG], embed_rule(opt)));
  const float* dx = delta + PushRecord::kEmbedxG;
  if (row[layout.mf_size()] <= 0.0f) {
    bool carries = false;
    for (int32_t i = 0; i < layout.mf_dim; ++i) carries = carries || dx[i] != 0.0f;
    if (!carries) return;
    table::create_embedx(row, layout, cfg, key);
  }
  const PartRule rule = embedx_rule(opt);
  for (int32_t i = 0; i < layout.mf_dim; ++i) {
    table::write_embedx_w(row, layout, i,
                          clip_weight(table::read_embedx_w(row, layout, i) + dx[i], rule));
  }
}

}  // namespace gpubox::table::optimizer
