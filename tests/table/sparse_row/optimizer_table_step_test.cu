// adam_bias_correction: per_table (table/sparse_row/optimizer.hpp: TableAdamStep), run on a card
// through parallel_for, against the float64 reference (adam_reference.hpp) of Paddle's adam op with
// lazy_mode (phi's SparseAdamFunctor on a SelectedRows gradient: one beta1_pow / beta2_pow for
// the table, starting at beta1 / beta2 and multiplied once per step; only the batch's rows
// change; epsilon times sqrt(1 - beta2_pow)). Rows join the batches at different steps and skip
// steps, so a row's own step count and the table's differ: the per_row reference on the same
// pushes must end elsewhere, or the test could not tell the two apart.
#include <gtest/gtest.h>

#include <cmath>
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

// ---- float64 reference --------------------------------------------------------------------

using reference::RefPart;
using reference::RefTablePowers;

struct RefRow {
  RefPart embed, embedx;
  bool has_embedx = false;
};

// One adam step of `p` at learning rate `lr` on gradient `g`: per_table with `table`, per_row
// (the row's powers, epsilon unscaled) without; unbounded (the default bounds, +-10, are
// far from where 30 steps of 0.05 take a weight).
void ref_adam(bool shared, RefPart& p, const std::vector<double>& g, double lr,
              const AccessorConfig& cfg, const RefTablePowers* table) {
  reference::ref_adam_step(shared, p, g, lr, cfg, table, [](double w) { return w; });
}

RefPart ref_part(bool shared, const float* w, int dim, const AccessorConfig& cfg) {
  RefPart p;
  p.w.assign(w, w + dim);
  p.m.assign(shared ? 1 : dim, 0.0);
  p.v.assign(shared ? 1 : dim, 0.0);
  p.beta1_pow = cfg.optimizer.beta1_decay_rate;
  p.beta2_pow = cfg.optimizer.beta2_decay_rate;
  return p;
}

// One push of a row that is in the batch: the embed step, then the embedx step, or its creation
// (embedx_threshold 0: at the row's first push, that push's embedx gradient not applied).
void ref_push(bool shared, RefRow& row, const std::vector<double>& push, const float* created_w,
              int mf_dim, const AccessorConfig& cfg, const RefTablePowers* table) {
  const double scale = push[0] > 1 ? push[0] : 1;  // show_scale
  ref_adam(shared, row.embed, {push[2] / scale}, cfg.optimizer.learning_rate, cfg, table);
  if (!row.has_embedx) {
    row.has_embedx = true;
    row.embedx = ref_part(shared, created_w, mf_dim, cfg);
    return;
  }
  std::vector<double> g(push.begin() + 3, push.end());
  for (double& gi : g) gi /= scale;
  ref_adam(shared, row.embedx, g, cfg.optimizer.mf_learning_rate, cfg, table);
}

// ---- the card side ------------------------------------------------------------------------

struct AdvanceTable {
  TableAdamStep* step;
  float beta1, beta2;
  GPUBOX_HD void operator()(std::size_t) const { advance_table_adam(*step, beta1, beta2); }
};

// Applies the pushes of the rows in the batch (present[r] != 0) with the table's step.
struct ApplyBatch {
  float* rows;
  const float* pushes;
  const uint64_t* keys;
  const uint8_t* present;
  const TableAdamStep* table;
  RowLayout layout;
  AccessorConfig cfg;
  GPUBOX_HD void operator()(std::size_t r) const {
    if (present[r] == 0) return;
    apply_push(rows + r * layout.stride(), layout, cfg, keys[r], pushes + r * layout.push_dim(),
               table);
  }
};

AccessorConfig table_step_config(SparseOptimizerKind kind, int mf_dim) {
  AccessorConfig cfg;
  cfg.optimizer.kind = kind;
  cfg.optimizer.bias_correction = config::AdamBiasCorrection::kPerTable;
  cfg.mf_dim = mf_dim;
  cfg.optimizer.learning_rate = 0.05f;
  cfg.optimizer.mf_learning_rate = 0.03f;
  cfg.optimizer.initial_range = 0.01f;
  cfg.optimizer.mf_initial_range = 0.02f;
  cfg.optimizer.beta1_decay_rate = 0.8f;  // far from 1, so that t's powers differ step by step
  cfg.optimizer.beta2_decay_rate = 0.9f;
  cfg.optimizer.ada_epsilon = 1e-2f;  // large, so that its scaling by sqrt(1 - b2^t) shows
  cfg.embedx_threshold = 0.0f;
  cfg.seed = 77;
  return cfg;
}

struct Case {
  SparseOptimizerKind kind;
  int mf_dim;
  const char* name;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class TableStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(TableStepTest, LazyAdamMatchesFloat64Reference) {
  const Case c = GetParam();
  const bool shared = c.kind == SparseOptimizerKind::kSharedAdam;
  const AccessorConfig cfg = table_step_config(c.kind, c.mf_dim);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const int stride = layout.stride(), push_dim = layout.push_dim();
  constexpr int kRows = 17;
  constexpr int kSteps = 30;
  constexpr int kLateRow = 1, kLateStep = 20;  // in no batch before step 20

  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  std::mt19937_64 rng(static_cast<uint64_t>(c.kind) * 31 + c.mf_dim);
  std::vector<uint64_t> keys(kRows);
  for (auto& k : keys) k = rng();
  std::vector<float> host_rows(static_cast<std::size_t>(kRows) * stride);
  for (int r = 0; r < kRows; ++r) {
    table::init_row(host_rows.data() + r * stride, layout, cfg, keys[r], r % 5);
  }
  // The embedx values a row gets at creation (a seeded function of the key): from a copy of
  // the row with its embedx part created on the host.
  std::vector<std::vector<float>> created(kRows);
  for (int r = 0; r < kRows; ++r) {
    std::vector<float> copy(host_rows.begin() + r * stride, host_rows.begin() + (r + 1) * stride);
    table::create_embedx(copy.data(), layout, cfg, keys[r]);
    for (int i = 0; i < c.mf_dim; ++i)
      created[r].push_back(table::read_embedx_w(copy.data(), layout, i));
  }
  std::vector<RefRow> per_table(kRows), per_row(kRows);
  for (int r = 0; r < kRows; ++r) {
    const float w = table::read_embed_w(host_rows.data() + r * stride, layout);
    per_table[r].embed = per_row[r].embed = ref_part(shared, &w, 1, cfg);
  }
  auto rows = device::to_device(host_rows, card.memory(), card.stream());
  auto dev_keys = device::to_device(keys, card.memory(), card.stream());
  auto step = device::to_device(std::vector<TableAdamStep>(1), card.memory(), card.stream());
  auto pushes = card.make_buffer<float>(static_cast<std::size_t>(kRows) * push_dim);
  auto present = card.make_buffer<uint8_t>(kRows);

  RefTablePowers table{cfg.optimizer.beta1_decay_rate, cfg.optimizer.beta2_decay_rate};
  std::uniform_real_distribution<double> grad(-1.0, 1.0);
  for (int t = 0; t < kSteps; ++t) {
    std::vector<float> host_push(static_cast<std::size_t>(kRows) * push_dim);
    std::vector<uint8_t> in_batch(kRows);
    for (int r = 0; r < kRows; ++r) {
      in_batch[r] = r == kLateRow ? t >= kLateStep : (r == 0 || rng() % 2 == 0);
      float* p = host_push.data() + r * push_dim;
      p[0] = static_cast<float>(1 + rng() % 3);
      p[1] = 0.0f;
      for (int d = 2; d < push_dim; ++d) p[d] = static_cast<float>(grad(rng));
    }
    device::copy_async(pushes.data(), host_push.data(), host_push.size(), card.stream());
    device::copy_async(present.data(), in_batch.data(), in_batch.size(), card.stream());
    device::parallel_for(
        card.stream(), 1,
        AdvanceTable{step.data(), cfg.optimizer.beta1_decay_rate, cfg.optimizer.beta2_decay_rate});
    device::parallel_for(card.stream(), kRows,
                         ApplyBatch{rows.data(), pushes.data(), dev_keys.data(), present.data(),
                                    step.data(), layout, cfg});
    for (int r = 0; r < kRows; ++r) {
      if (in_batch[r] == 0) continue;
      const std::vector<double> push(host_push.begin() + r * push_dim,
                                     host_push.begin() + (r + 1) * push_dim);
      ref_push(shared, per_table[r], push, created[r].data(), c.mf_dim, cfg, &table);
      ref_push(shared, per_row[r], push, created[r].data(), c.mf_dim, cfg, nullptr);
    }
    table.beta1_pow *= cfg.optimizer.beta1_decay_rate;  // every step, as the op's Beta1PowOut
    table.beta2_pow *= cfg.optimizer.beta2_decay_rate;
  }

  host_rows = device::to_host(rows);
  EXPECT_EQ(device::to_host(step)[0].steps, kSteps);
  double late_gap = 0;  // how far per_row would have put the late row
  for (int r = 0; r < kRows; ++r) {
    const float* row = host_rows.data() + r * stride;
    const std::string what = "row " + std::to_string(r);
    EXPECT_NEAR(table::read_embed_w(row, layout), per_table[r].embed.w[0], 2e-5) << what;
    ASSERT_EQ(row[layout.mf_size()] > 0.0f, per_table[r].has_embedx) << what;
    for (int i = 0; per_table[r].has_embedx && i < c.mf_dim; ++i) {
      EXPECT_NEAR(table::read_embedx_w(row, layout, i), per_table[r].embedx.w[i], 2e-5)
          << what << " embedx " << i;
    }
    // The row's own powers are not per_table's: they stay at their start.
    // (embed_w's state, one dim in either kind: [gsum, g2sum, beta1_pow, beta2_pow])
    EXPECT_EQ(row[RowLayout::kEmbedState + 2], cfg.optimizer.beta1_decay_rate) << what;
    if (r == kLateRow) late_gap = std::fabs(per_table[r].embed.w[0] - per_row[r].embed.w[0]);
  }
  // The late row's first step: per_row corrects it as a first step (lr_t = lr * sqrt(1 - b2) /
  // (1 - b1), 0.0791 here), per_table as the table's 21st (about lr): the references part.
  EXPECT_GT(late_gap, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TableStepTest,
                         ::testing::Values(Case{SparseOptimizerKind::kAdam, 8, "adam_dim8"},
                                           Case{SparseOptimizerKind::kAdam, 1, "adam_dim1"},
                                           Case{SparseOptimizerKind::kSharedAdam, 5, "shared5"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TableStep, CorrectionsOfFirstAndLateSteps) {
  TableAdamStep step;
  advance_table_adam(step, 0.9f, 0.999f);
  EXPECT_EQ(step.steps, 1);
  // Paddle's accumulators start at beta1, beta2: the first step's correction is b^1's.
  EXPECT_NEAR(step.lr_scale, std::sqrt(1 - 0.999f) / (1 - 0.9f), 1e-6);
  EXPECT_NEAR(step.eps_scale, std::sqrt(1 - 0.999f), 1e-7);
  step.steps = 1000000;  // a long run: both powers underflow towards 0, no NaN
  advance_table_adam(step, 0.9f, 0.999f);
  EXPECT_EQ(step.steps, 1000001);
  EXPECT_FLOAT_EQ(step.lr_scale, 1.0f);
  EXPECT_FLOAT_EQ(step.eps_scale, 1.0f);
}

}  // namespace
}  // namespace gpubox::table::optimizer
