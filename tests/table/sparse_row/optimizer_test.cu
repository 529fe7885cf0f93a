// Sparse optimizers: every optimizer's row update, run on a card through parallel_for, against
// a float64 reference written here from Paddle's rules (SparseNaiveSGDRule, SparseAdaGradSGDRule
// with its g2sum starting at 0, SparseAdamSGDRule, SparseSharedAdamSGDRule, the show-scaled
// gradient of heter_ps's rules and CtrCommonAccessor's update order) plus GPUBox's weight_decay
// and embed_threshold, over many steps with random pushes, clipped weights, decayed weights and
// both thresholds crossed mid-run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "table/sparse_row/optimizer.hpp"
#include "tests/table/sparse_row/adam_reference.hpp"

namespace gpubox::table::optimizer {
namespace {

using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

// ---- float64 reference: named fields, no RowLayout offsets --------------------------------

using reference::RefPart;

struct RefRow {
  double show = 0, click = 0, delta_score = 0, unseen_days = 0;
  RefPart embed;
  bool has_embedx = false;
  RefPart embedx;
  int clipped = 0;  // how many weight updates hit a bound (so the test proves bounds matter)
  int embed_steps_skipped = 0;  // pushes below embed_threshold
};

struct RefRule {
  double lr, initial_g2sum, lo, hi, weight_decay, l1_decay;
};

RefPart ref_new_part(SparseOptimizerKind kind, int dim, const AccessorConfig& cfg) {
  RefPart p;
  p.w.assign(dim, 0.0);
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      break;
    case SparseOptimizerKind::kAdagrad:
      p.v = {0.0};  // SparseAdaGradSGDRule::InitValueWork: g2sum = 0
      break;
    case SparseOptimizerKind::kAdam:
      p.m.assign(dim, 0.0);
      p.v.assign(dim, 0.0);
      p.beta1_pow = cfg.optimizer.beta1_decay_rate;
      p.beta2_pow = cfg.optimizer.beta2_decay_rate;
      break;
    case SparseOptimizerKind::kSharedAdam:
      p.m = {0.0};
      p.v = {0.0};
      p.beta1_pow = cfg.optimizer.beta1_decay_rate;
      p.beta2_pow = cfg.optimizer.beta2_decay_rate;
      break;
  }
  return p;
}

double ref_clip(double w, const RefRule& r, int* clipped) {
  if (w < r.lo || w > r.hi) ++*clipped;
  return std::min(std::max(w, r.lo), r.hi);
}

// One step of a part on the show-scaled pushed gradient `scaled` (push_g / show).
void ref_step(SparseOptimizerKind kind, RefPart& p, const std::vector<double>& scaled,
              const RefRule& r, const AccessorConfig& cfg, int* clipped) {
  const std::size_t dim = p.w.size();
  // L2 and L1 as weight_decay and l1_decay terms of the gradient, from the weights before this
  // step (Paddle's L1Decay: sign(0) = 0).
  std::vector<double> g(dim);
  for (std::size_t i = 0; i < dim; ++i) {
    const double sign = p.w[i] > 0 ? 1.0 : (p.w[i] < 0 ? -1.0 : 0.0);
    g[i] = scaled[i] + r.weight_decay * p.w[i] + r.l1_decay * sign;
  }
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      for (std::size_t i = 0; i < dim; ++i) p.w[i] = ref_clip(p.w[i] - r.lr * g[i], r, clipped);
      break;
    case SparseOptimizerKind::kAdagrad: {
      const double scale = std::sqrt(r.initial_g2sum / (r.initial_g2sum + p.v[0]));
      double sq = 0;
      for (std::size_t i = 0; i < dim; ++i) {
        p.w[i] = ref_clip(p.w[i] - r.lr * g[i] * scale, r, clipped);
        sq += g[i] * g[i];
      }
      p.v[0] += sq / dim;
      break;
    }
    case SparseOptimizerKind::kAdam:
    case SparseOptimizerKind::kSharedAdam:
      reference::ref_adam_step(kind == SparseOptimizerKind::kSharedAdam, p, g, r.lr, cfg, nullptr,
                               [&](double w) { return ref_clip(w, r, clipped); });
      break;
  }
}

// One push (show, click, embed_g, embedx_g[]) applied to the reference row, in
// CtrCommonAccessor's order: counters, embed step, then embedx step or creation.
void ref_push(RefRow& row, uint64_t key, const std::vector<double>& push, int mf_dim,
              const AccessorConfig& cfg) {
  const double show = push[0], click = push[1];
  row.show += show;
  row.click += click;
  row.delta_score += cfg.nonclk_coeff * (show - click) + cfg.clk_coeff * click;
  row.unseen_days = 0;
  const RefRule embed{cfg.optimizer.learning_rate, cfg.optimizer.initial_g2sum,
                      cfg.optimizer.min_bound,     cfg.optimizer.max_bound,
                      cfg.optimizer.weight_decay,  cfg.optimizer.l1_decay};
  const RefRule embedx{cfg.optimizer.mf_learning_rate, cfg.optimizer.mf_initial_g2sum,
                       cfg.optimizer.mf_min_bound,     cfg.optimizer.mf_max_bound,
                       cfg.optimizer.mf_weight_decay,  0.0};
  // Paddle's rules divide the merged gradient by the key's show in the batch (show 0: as is)
  // unless show_scale is off.
  const double scale = cfg.show_scale && show > 1 ? show : 1;
  const double score = cfg.nonclk_coeff * (row.show - row.click) + cfg.clk_coeff * row.click;
  if (cfg.embed_threshold <= 0 || score >= cfg.embed_threshold) {
    ref_step(cfg.optimizer.kind, row.embed, {push[2] / scale}, embed, cfg, &row.clipped);
  } else {
    ++row.embed_steps_skipped;
  }
  if (row.has_embedx) {
    std::vector<double> g(push.begin() + 3, push.end());
    for (double& gi : g) gi /= scale;
    ref_step(cfg.optimizer.kind, row.embedx, g, embedx, cfg, &row.clipped);
    return;
  }
  if (score >= cfg.embedx_threshold) {
    row.has_embedx = true;
    row.embedx = ref_new_part(cfg.optimizer.kind, mf_dim, cfg);
    for (int i = 0; i < mf_dim; ++i) {
      // The creation values are the accessor's seeded init (sparse_row.hpp), not an optimizer
      // output; the test only checks they land and stay in range.
      row.embedx.w[i] = table::detail::init_value(key, cfg.seed, static_cast<uint32_t>(i + 1),
                                                  cfg.optimizer.mf_initial_range);
    }
  }
}

// ---- the card side ------------------------------------------------------------------------

struct ApplyPushes {
  float* rows;
  const float* pushes;
  const uint64_t* keys;
  uint8_t* created;
  RowLayout layout;
  AccessorConfig cfg;
  GPUBOX_HD void operator()(std::size_t i) const {
    const bool made = apply_push(rows + i * layout.stride(), layout, cfg, keys[i],
                                 pushes + i * layout.push_dim());
    created[i] = made ? 1 : 0;
  }
};

void expect_near_rel(double got, double want, const std::string& what) {
  // float32 state vs float64 reference over a few dozen steps.
  const double tol = 2e-5 * std::max(1.0, std::fabs(want));
  EXPECT_NEAR(got, want, tol) << what;
}

void expect_part(const float* w, const float* state, const RefPart& p, SparseOptimizerKind kind,
                 const std::string& what) {
  const int dim = static_cast<int>(p.w.size());
  for (int i = 0; i < dim; ++i)
    expect_near_rel(w[i], p.w[i], what + " w[" + std::to_string(i) + "]");
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      break;
    case SparseOptimizerKind::kAdagrad:
      expect_near_rel(state[0], p.v[0], what + " g2sum");
      break;
    case SparseOptimizerKind::kAdam:
    case SparseOptimizerKind::kSharedAdam: {
      const int k = static_cast<int>(p.m.size());
      for (int i = 0; i < k; ++i) {
        expect_near_rel(state[i], p.m[i], what + " gsum[" + std::to_string(i) + "]");
        expect_near_rel(state[k + i], p.v[i], what + " g2sum[" + std::to_string(i) + "]");
      }
      expect_near_rel(state[2 * k], p.beta1_pow, what + " beta1_pow");
      expect_near_rel(state[2 * k + 1], p.beta2_pow, what + " beta2_pow");
      break;
    }
  }
}

struct Case {
  SparseOptimizerKind kind;
  int mf_dim;
  const char* name;
  bool show_scale = true;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SparseOptimizerTest : public ::testing::TestWithParam<Case> {};

AccessorConfig make_config(SparseOptimizerKind kind, int mf_dim, bool show_scale = true) {
  AccessorConfig cfg;
  cfg.optimizer.kind = kind;
  cfg.mf_dim = mf_dim;
  cfg.show_scale = show_scale;
  cfg.optimizer.learning_rate = 0.3f;
  cfg.optimizer.mf_learning_rate = 0.2f;
  cfg.optimizer.initial_g2sum = 2.0f;
  cfg.optimizer.mf_initial_g2sum = 3.0f;
  cfg.optimizer.initial_range = 0.01f;
  cfg.optimizer.mf_initial_range = 0.02f;
  // Tight bounds, so random pushes hit them within a few steps.
  cfg.optimizer.min_bound = -0.4f;
  cfg.optimizer.max_bound = 0.5f;
  cfg.optimizer.mf_min_bound = -0.3f;
  cfg.optimizer.mf_max_bound = 0.35f;
  cfg.optimizer.weight_decay = 0.4f;
  cfg.optimizer.mf_weight_decay = 0.7f;
  cfg.optimizer.l1_decay = 0.05f;
  cfg.nonclk_coeff = 0.1f;
  cfg.clk_coeff = 1.0f;
  cfg.embed_threshold = 0.95f;  // crossed after a few pushes (never hit exactly: no ties)
  cfg.embedx_threshold = 2.5f;  // crossed after a few pushes, at a different step per row
  cfg.seed = 1234;
  return cfg;
}

TEST_P(SparseOptimizerTest, RowUpdatesMatchFloat64Reference) {
  const Case c = GetParam();
  const AccessorConfig cfg = make_config(c.kind, c.mf_dim, c.show_scale);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const int stride = layout.stride();
  const int push_dim = layout.push_dim();
  constexpr int kRows = 64;
  constexpr int kSteps = 40;

  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();

  std::mt19937_64 rng(static_cast<uint64_t>(c.kind) * 101 + c.mf_dim);
  std::vector<uint64_t> keys(kRows);
  for (auto& k : keys) k = rng();
  keys[0] = ~0ULL;  // near 2^64
  keys[1] = 0;

  std::vector<float> host_rows(static_cast<std::size_t>(kRows) * stride);
  std::vector<RefRow> ref(kRows);
  for (int r = 0; r < kRows; ++r) {
    table::init_row(host_rows.data() + r * stride, layout, cfg, keys[r], r % 26);
    ref[r].embed = ref_new_part(cfg.optimizer.kind, 1, cfg);
    ref[r].embed.w[0] = host_rows[r * stride + RowLayout::kEmbedW];
    // A row back from the host tier after some unseen days: any push resets the count.
    host_rows[r * stride + RowLayout::kUnseenDays] = static_cast<float>(r % 4);
  }
  auto rows = device::to_device(host_rows, card.memory(), card.stream());
  auto dev_keys = device::to_device(keys, card.memory(), card.stream());
  auto pushes = card.make_buffer<float>(static_cast<std::size_t>(kRows) * push_dim);
  auto created = card.make_buffer<uint8_t>(kRows);

  std::uniform_real_distribution<double> grad(-1.5, 1.5);
  int creations = 0;
  int created_after_first_step = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> host_push(static_cast<std::size_t>(kRows) * push_dim);
    std::vector<std::vector<double>> ref_push_values(kRows);
    for (int r = 0; r < kRows; ++r) {
      // Merged pushes: show in [0, 3], click <= show, grads summed over occurrences.
      const int show = static_cast<int>(rng() % 4);
      const int click = show > 0 ? static_cast<int>(rng() % (show + 1)) : 0;
      float* p = host_push.data() + r * push_dim;
      p[0] = static_cast<float>(show);
      p[1] = static_cast<float>(click);
      for (int d = 2; d < push_dim; ++d) p[d] = static_cast<float>(grad(rng));
      ref_push_values[r].assign(p, p + push_dim);  // exactly the floats the card sees
    }
    device::copy_async(pushes.data(), host_push.data(), host_push.size(), card.stream());
    device::parallel_for(
        card.stream(), kRows,
        ApplyPushes{rows.data(), pushes.data(), dev_keys.data(), created.data(), layout, cfg});
    const std::vector<uint8_t> made = device::to_host(created);
    for (int r = 0; r < kRows; ++r) {
      const bool had = ref[r].has_embedx;
      ref_push(ref[r], keys[r], ref_push_values[r], cfg.mf_dim, cfg);
      const bool made_now = ref[r].has_embedx && !had;
      ASSERT_EQ(made[r] != 0, made_now) << "row " << r << " step " << step;
      creations += made_now;
      created_after_first_step += made_now && step > 0;
    }
  }

  host_rows = device::to_host(rows);
  int clipped = 0;
  int clipped_embedx_weights = 0;
  int embed_steps_skipped = 0;
  for (int r = 0; r < kRows; ++r) {
    const float* row = host_rows.data() + r * stride;
    const RefRow& want = ref[r];
    const std::string what = std::string(c.name) + " row " + std::to_string(r);
    clipped += want.clipped;
    embed_steps_skipped += want.embed_steps_skipped;
    EXPECT_EQ(row[RowLayout::kShow], want.show) << what;
    EXPECT_EQ(row[RowLayout::kClick], want.click) << what;
    expect_near_rel(row[RowLayout::kDeltaScore], want.delta_score, what + " delta_score");
    EXPECT_EQ(row[RowLayout::kUnseenDays], 0.0f) << what;
    EXPECT_EQ(row[layout.slot()], static_cast<float>(r % 26)) << what;
    expect_part(row + RowLayout::kEmbedW, row + RowLayout::kEmbedState, want.embed,
                cfg.optimizer.kind, what + " embed");
    ASSERT_EQ(row[layout.mf_size()] > 0.0f, want.has_embedx) << what;
    if (want.has_embedx) {
      EXPECT_EQ(row[layout.mf_size()], static_cast<float>(cfg.mf_dim)) << what;
      expect_part(row + layout.embedx_w(), row + layout.embedx_state(), want.embedx,
                  cfg.optimizer.kind, what + " embedx");
      for (int i = 0; i < cfg.mf_dim; ++i) {
        const float w = row[layout.embedx_w() + i];
        EXPECT_GE(w, cfg.optimizer.mf_min_bound) << what;
        EXPECT_LE(w, cfg.optimizer.mf_max_bound) << what;
        clipped_embedx_weights +=
            (w == cfg.optimizer.mf_min_bound || w == cfg.optimizer.mf_max_bound);
      }
    } else {
      for (int i = 0; i < cfg.mf_dim; ++i) EXPECT_EQ(row[layout.embedx_w() + i], 0.0f) << what;
    }
    EXPECT_GE(row[RowLayout::kEmbedW], cfg.optimizer.min_bound) << what;
    EXPECT_LE(row[RowLayout::kEmbedW], cfg.optimizer.max_bound) << what;
  }
  // The run must exercise what it claims to: bounds hit, creation crossed mid-run, and some rows
  // (show 0 pushes are common) still below the thresholds at some point.
  EXPECT_GT(clipped, 0);
  EXPECT_GT(embed_steps_skipped, 0);
  EXPECT_GT(created_after_first_step, 0);
  EXPECT_GT(creations, kRows / 2);
  if (cfg.optimizer.kind != SparseOptimizerKind::kAdagrad) {
    EXPECT_GT(clipped_embedx_weights, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, SparseOptimizerTest,
    ::testing::Values(Case{SparseOptimizerKind::kSgd, 8, "sgd"},
                      Case{SparseOptimizerKind::kAdagrad, 8, "adagrad"},
                      Case{SparseOptimizerKind::kAdam, 8, "adam"},
                      Case{SparseOptimizerKind::kSharedAdam, 8, "shared_adam"},
                      Case{SparseOptimizerKind::kSgd, 1, "sgd_dim1"},
                      Case{SparseOptimizerKind::kAdagrad, 1, "adagrad_dim1"},
                      Case{SparseOptimizerKind::kAdam, 1, "adam_dim1"},
                      Case{SparseOptimizerKind::kSharedAdam, 1, "shared_adam_dim1"},
                      Case{SparseOptimizerKind::kAdam, 17, "adam_dim17"},
                      Case{SparseOptimizerKind::kSharedAdam, 64, "shared_adam_dim64"},
                      Case{SparseOptimizerKind::kSgd, 8, "sgd_summed", false},
                      Case{SparseOptimizerKind::kAdagrad, 8, "adagrad_summed", false}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// A push on a row whose embedx does not exist yet never touches embedx weights, even with a
// large gradient, until the threshold is reached; the creating step applies no embedx gradient.
TEST(SparseOptimizer, EmbedxGradientIgnoredUntilCreated) {
  AccessorConfig cfg = make_config(SparseOptimizerKind::kAdagrad, 4);
  cfg.embedx_threshold = 1.0f;
  cfg.optimizer.mf_initial_range = 0.0f;  // created weights are exactly zero: any update would show
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  std::vector<float> row(layout.stride());
  table::init_row(row.data(), layout, cfg, 42, 3);
  std::vector<float> push = {1.0f, 0.0f, 0.5f, 9.0f, -9.0f, 9.0f, -9.0f};  // score 0.1
  EXPECT_FALSE(apply_push(row.data(), layout, cfg, 42, push.data()));
  EXPECT_EQ(row[layout.mf_size()], 0.0f);
  push[1] = 1.0f;  // a click: score 0.1 + 1.0 >= 1.0 -> created now, gradient not applied
  EXPECT_TRUE(apply_push(row.data(), layout, cfg, 42, push.data()));
  EXPECT_EQ(row[layout.mf_size()], 4.0f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(row[layout.embedx_w() + i], 0.0f);
  EXPECT_EQ(row[layout.embedx_state()], 0.0f);  // g2sum starts at 0, as in Paddle
  EXPECT_FALSE(apply_push(row.data(), layout, cfg, 42, push.data()));  // now it is updated
  const float step = cfg.optimizer.mf_learning_rate * 1.0f;            // g2sum still 0
  EXPECT_FLOAT_EQ(row[layout.embedx_w() + 0], std::max(-step * 9.0f, cfg.optimizer.mf_min_bound));
  EXPECT_FLOAT_EQ(row[layout.embedx_w() + 1], std::min(step * 9.0f, cfg.optimizer.mf_max_bound));
}

// Paddle's adagrad from a fresh row, by hand: g2sum starts at 0, so the first step is lr * g on
// the show-scaled gradient (GPUBox used to start g2sum at initial_g2sum: a first step of lr * g /
// sqrt(2)); the next one is lr * g * sqrt(initial_g2sum / (initial_g2sum + g_1^2)).
TEST(SparseOptimizer, AdagradStartsLikePaddle) {
  AccessorConfig cfg;  // the defaults: adagrad, lr 0.05, initial_g2sum 3, no L2
  cfg.mf_dim = 2;
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  std::vector<float> row(layout.stride());
  table::init_row(row.data(), layout, cfg, 7, 1);
  EXPECT_EQ(row[RowLayout::kEmbedState], 0.0f);
  std::vector<float> push = {4.0f, 1.0f, 2.0f, 0.0f, 0.0f};  // 4 occurrences summing to 2
  apply_push(row.data(), layout, cfg, 7, push.data());
  EXPECT_FLOAT_EQ(row[RowLayout::kEmbedW], -0.05f * 0.5f);
  EXPECT_FLOAT_EQ(row[RowLayout::kEmbedState], 0.25f);
  push = {1.0f, 0.0f, -1.0f, 0.0f, 0.0f};
  apply_push(row.data(), layout, cfg, 7, push.data());
  EXPECT_FLOAT_EQ(row[RowLayout::kEmbedW],
                  static_cast<float>(-0.025 + 0.05 * std::sqrt(3.0 / 3.25)));
  EXPECT_FLOAT_EQ(row[RowLayout::kEmbedState], 1.25f);
}

// Below embed_threshold a key's show and click are counted and embed_w stays as created; the push
// that brings the score to the threshold takes the first step, with weight_decay on it.
TEST(SparseOptimizer, EmbedThresholdCountsBeforeItLearns) {
  AccessorConfig cfg;
  cfg.optimizer.kind = SparseOptimizerKind::kSgd;
  cfg.mf_dim = 1;
  cfg.optimizer.learning_rate = 0.5f;
  cfg.optimizer.initial_range = 0.2f;  // a non-zero start, so weight_decay shows
  cfg.optimizer.weight_decay = 0.25f;
  cfg.embed_threshold = 0.25f;  // three shows without a click (score 0.1 each)
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  std::vector<float> row(layout.stride());
  table::init_row(row.data(), layout, cfg, 11, 2);
  const float w0 = row[RowLayout::kEmbedW];
  ASSERT_NE(w0, 0.0f);
  const std::vector<float> push = {1.0f, 0.0f, 0.8f, 0.0f};
  for (int i = 0; i < 2; ++i) {
    apply_push(row.data(), layout, cfg, 11, push.data());
    EXPECT_EQ(row[RowLayout::kEmbedW], w0) << "push " << i;
  }
  EXPECT_EQ(row[RowLayout::kShow], 2.0f);
  apply_push(row.data(), layout, cfg, 11, push.data());  // score 0.3
  EXPECT_FLOAT_EQ(row[RowLayout::kEmbedW], w0 - 0.5f * (0.8f + 0.25f * w0));
}

// The show/click score decides creation and must round on the card as on the host
// (show_click_score): for each (show, click) whose score a fused multiply-add (nvcc's default
// contraction, either way round) would round otherwise, embedx_threshold is set to each of those
// values in turn, so a contracted score lands on the other side of it; on every fresh row the
// card creates the embedx part exactly when the host does, with the host's delta_score bits.
TEST(SparseOptimizer, TheCardCreatesWhatTheHostDoesAtTheThreshold) {
  AccessorConfig cfg = make_config(SparseOptimizerKind::kSgd, 2);
  cfg.clk_coeff = 2.0f;
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const std::size_t stride = static_cast<std::size_t>(layout.stride());
  const std::size_t push_dim = static_cast<std::size_t>(layout.push_dim());
  std::vector<float> pushes;  // (show, click) of every pair, zero gradients
  std::vector<float> thresholds;
  for (int show = 0; show < 50; ++show) {
    for (int click = 0; click <= std::min(show, 4); ++click) {
      const float s = static_cast<float>(show), c = static_cast<float>(click);
      pushes.resize(pushes.size() + push_dim, 0.0f);
      pushes[pushes.size() - push_dim] = s;
      pushes[pushes.size() - push_dim + 1] = c;
      const float score = show_click_score(s, c, cfg);
      for (float fused : {std::fma(cfg.nonclk_coeff, s - c, cfg.clk_coeff * c),
                          std::fma(cfg.clk_coeff, c, cfg.nonclk_coeff * (s - c))}) {
        if (fused != score) thresholds.insert(thresholds.end(), {score, fused});
      }
    }
  }
  ASSERT_FALSE(thresholds.empty());
  const std::size_t n = pushes.size() / push_dim;
  std::vector<uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = 1000 + i;
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  auto d_pushes = device::to_device(pushes, card.memory(), card.stream());
  auto d_keys = device::to_device(keys, card.memory(), card.stream());
  auto created = card.make_buffer<uint8_t>(n);
  std::size_t creations = 0;
  for (float threshold : thresholds) {
    cfg.embedx_threshold = threshold;
    std::vector<float> host(n * stride);
    for (std::size_t i = 0; i < n; ++i) init_row(host.data() + i * stride, layout, cfg, keys[i], 1);
    auto rows = device::to_device(host, card.memory(), card.stream());
    device::parallel_for(
        card.stream(), n,
        ApplyPushes{rows.data(), d_pushes.data(), d_keys.data(), created.data(), layout, cfg});
    const std::vector<uint8_t> made = device::to_host(created);
    const std::vector<float> card_rows = device::to_host(rows);
    for (std::size_t i = 0; i < n; ++i) {
      float* row = host.data() + i * stride;
      const bool host_made = apply_push(row, layout, cfg, keys[i], pushes.data() + i * push_dim);
      ASSERT_EQ(made[i] != 0, host_made) << "show " << pushes[i * push_dim] << " click "
                                         << pushes[i * push_dim + 1] << " threshold " << threshold;
      ASSERT_EQ(card_rows[i * stride + RowLayout::kDeltaScore], row[RowLayout::kDeltaScore]);
      creations += host_made;
    }
  }
  EXPECT_GT(creations, 0u);  // the thresholds fall among the scores: some rows, not all
  EXPECT_LT(creations, n * thresholds.size());
}

// main's scalar adam (before the vector loop), verbatim but for the weights' storage: the
// oracle of the row loop below. A volatile read keeps it one weight at a time.
float oracle_clip_weight(float w, const PartRule& rule) {
  return w < rule.min_bound ? rule.min_bound : (w > rule.max_bound ? rule.max_bound : w);
}
float oracle_step_gradient(float push_g, float w, const PartRule& rule, float scale) {
  const float sign = w > 0.0f ? 1.0f : (w < 0.0f ? -1.0f : 0.0f);
  return push_g / scale + rule.weight_decay * w + rule.l1_decay * sign;
}
void oracle_adam(float* w, float* gsum, float* g2sum, const float* g, int32_t dim,
                 const PartRule& rule, float b1, float b2, float lr, float epsilon, float scale) {
  for (int32_t i = 0; i < dim; ++i) {
    volatile float read = w[i];
    const float wi = read;
    const float gi = oracle_step_gradient(g[i], wi, rule, scale);
    gsum[i] = b1 * gsum[i] + (1.0f - b1) * gi;
    g2sum[i] = b2 * g2sum[i] + (1.0f - b2) * gi * gi;
    w[i] = oracle_clip_weight(wi - lr * (gsum[i] / (sqrtf(g2sum[i]) + epsilon)), rule);
  }
}

// adam over a row's fp32 weights (update_part -> adam_fp32) is one loop that the cpu build
// vectorizes: this TU is built as heterps' ApplyUpdates is (-fno-math-errno -ffp-contract=off
// on cpu). It must give the bits of main's scalar loop (oracle_adam), for widths below, at and
// past a vector's, over steps that clip at each bound, cross zero and decay (L2 and, on a
// hand-made rule, L1's sign), with show-scaled gradients; weights start at -0.0f, +0.0f and a
// denormal, and the last steps push NaN, +-inf, -0.0f and denormal gradients into some lanes.
TEST(SparseOptimizer, AdamRowLoopMatchesMainsScalarLoop) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> grad(-2.0f, 2.0f);
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY, -0.0f, 1e-40f, -1e-41f};
  for (const int dim : {1, 3, 4, 5, 8, 9, 17, 64}) {
    AccessorConfig cfg = make_config(SparseOptimizerKind::kAdam, dim);
    const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
    PartRule rule = embedx_rule(cfg.optimizer);
    rule.l1_decay = 0.03f;
    std::vector<float> row(layout.stride(), 0.0f);
    float* state = row.data() + layout.embedx_state();
    state[2 * dim] = cfg.optimizer.beta1_decay_rate;
    state[2 * dim + 1] = cfg.optimizer.beta2_decay_rate;
    std::vector<float> w(dim, 0.0f), m(dim, 0.0f), v(dim, 0.0f), g(dim);
    for (int i = 0; i < dim; ++i) {
      w[i] = i % 3 == 0 ? -0.0f : (i % 3 == 1 ? 0.0f : 1e-40f);
      row[layout.embedx_w() + i] = w[i];
    }
    int at_min = 0, at_max = 0, zeros = 0;
    for (int step = 0; step < 34; ++step) {
      for (float& gi : g) gi = grad(rng);
      if (step >= 30) {
        for (int i = 0; i < dim; ++i) {
          if ((i + step) % 3 == 0) g[i] = specials[(i + step) % 6];
        }
      }
      const float scale = static_cast<float>(1 + step % 3);
      const float lr = adam_step_size(rule.learning_rate, state[2 * dim], state[2 * dim + 1]);
      for (int i = 0; i < dim; ++i) zeros += w[i] == 0.0f;
      update_part(SparseOptimizerKind::kAdam, PartWeights{row.data(), layout, true}, state,
                  g.data(), dim, rule, cfg.optimizer, scale, nullptr);
      oracle_adam(w.data(), m.data(), v.data(), g.data(), dim, rule, cfg.optimizer.beta1_decay_rate,
                  cfg.optimizer.beta2_decay_rate, lr, cfg.optimizer.ada_epsilon, scale);
      for (int i = 0; i < dim; ++i) {
        at_min += w[i] == rule.min_bound;
        at_max += w[i] == rule.max_bound;
      }
      const std::string what = "dim " + std::to_string(dim) + " step " + std::to_string(step);
      ASSERT_EQ(std::memcmp(row.data() + layout.embedx_w(), w.data(), dim * sizeof(float)), 0)
          << what << " w";
      ASSERT_EQ(std::memcmp(state, m.data(), dim * sizeof(float)), 0) << what << " gsum";
      ASSERT_EQ(std::memcmp(state + dim, v.data(), dim * sizeof(float)), 0) << what << " g2sum";
    }
    EXPECT_GT(at_min, 0) << "dim " << dim;
    EXPECT_GT(at_max, 0) << "dim " << dim;
    EXPECT_GT(zeros, 0) << "dim " << dim;  // sign(0) and sign(-0.0f)
  }
}

}  // namespace
}  // namespace gpubox::table::optimizer
