// Clipping by global norm (hyper_parameters.optimizer.clip_by_norm, trainer/nn/gradient_clip.hpp)
// through the trainer, on simulated cards: one step of a small dnn under SGD (dense and sparse,
// show_scale off), whose update is linear in the gradient, so the step's gradients are read off
// two unclipped runs (learning rates lr and 2 lr: w0 - lr g and w0 - 2 lr g) and the clipped
// step checked against a float64 reference built from them:
//   global norm^2 = sum of the dense gradients^2 (the mean loss's) + sum over keys of
//                   (the key's merged push gradient / global batch)^2,
//   factor        = clip / max(clip, global norm),
//   clipped run   = w0 - factor lr g, dense parameters and embedding rows alike.
// Above the clip the update shrinks by exactly that factor; under it the run is the unclipped one
// bit for bit; 2 and 3 cards (sharded: the sparse squares all-reduced over the owners) and
// Collective mode (replicated) clip as one card does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "tests/integration/trainer_rows.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using testing::cards_env;
using testing::Rows;

constexpr int kLines = 96;  // one step: the whole file is one global batch
constexpr double kLr = 0.05;

// The trained parameters of a run: the dense values and the embedding rows, flattened in key order
// (every run holds the same keys: the same batch).
struct Model {
  std::vector<double> dense;
  std::vector<double> sparse;
};

class GradientClip : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_clip_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::GeneratorOptions gen;
    gen.slots = 6;
    gen.dense = 3;
    gen.vocab = 2;  // every key many times in the batch and on every card: large merged sums
    gen.seed = 7;
    gen.lines = kLines;
    gen.files = 1;
    gen.out_dir = (root_ / "train").string();
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
    gen.vocab = 300;  // a planted model's lines for the dcn_v2 folder's training
    gen.lines = 4000;
    gen.out_dir = (root_ / "folder_data").string();
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // One pass (one step of kLines over `cards`, or steps of `batch` a card) at learning rate `lr`
  // everywhere, then `extra`.
  static Model run(int cards, double lr, const std::vector<std::string>& extra, int batch = 0) {
    const std::string rate = std::to_string(lr);
    std::vector<std::string> more = {"hyper_parameters.optimizer.class=SGD",
                                     "hyper_parameters.optimizer.learning_rate=" + rate,
                                     "hyper_parameters.sparse_optimizer.class=sgd",
                                     "hyper_parameters.sparse_optimizer.learning_rate=" + rate,
                                     "hyper_parameters.sparse_optimizer.mf_learning_rate=" + rate,
                                     "hyper_parameters.sparse_optimizer.show_scale=false",
                                     "hyper_parameters.sparse_optimizer.mf_initial_range=0.3"};
    more.insert(more.end(), extra.begin(), extra.end());
    const TrainerConfig cfg = testing::load_test_config(testing::small_dnn_overrides(
        (root_ / "train").string(), batch > 0 ? batch : kLines / cards, more));
    Trainer trainer(cfg, cards_env(cards));
    trainer.train_pass(data_files((root_ / "train").string()));
    Model m;
    for (float v : trainer.dense_values(0)) m.dense.push_back(v);
    for (int c = 1; c < cards; ++c) {
      EXPECT_EQ(trainer.dense_values(c), trainer.dense_values(0)) << "card " << c;
    }
    for (const auto& [key, row] : testing::host_rows(trainer)) {
      for (float v : row) m.sparse.push_back(v);
    }
    return m;
  }

  static std::string clip(double c) {
    return "hyper_parameters.optimizer.clip_by_norm=" + std::to_string(c);
  }

  static fs::path root_;
};
fs::path GradientClip::root_;

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// The unclipped step's gradients (float64, from runs at lr and 2 lr): dense g = (w_lr - w_2lr) /
// lr; a row's weights the same, its other fields (show, click, ...) equal in both (0).
struct Reference {
  Model w0;    // 2 w_lr - w_2lr: the start
  Model step;  // w_lr - w0 = -lr g
  double dense_squares = 0;
  double sparse_squares = 0;  // of the merged push gradients / the global batch
  double factor(double clip, bool with_sparse = true) const {
    const double norm = std::sqrt(dense_squares + (with_sparse ? sparse_squares : 0.0));
    return clip / std::max(clip, norm);
  }
};

Reference reference(const Model& at_lr, const Model& at_2lr) {
  Reference r;
  EXPECT_EQ(at_lr.sparse.size(), at_2lr.sparse.size());
  const auto part = [&](const std::vector<double>& a, const std::vector<double>& b,
                        std::vector<double>* w0, std::vector<double>* step, double scale) {
    double squares = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double g = (a[i] - b[i]) / kLr;
      w0->push_back(2 * a[i] - b[i]);
      step->push_back(-kLr * g);
      squares += (g * scale) * (g * scale);
    }
    return squares;
  };
  r.dense_squares = part(at_lr.dense, at_2lr.dense, &r.w0.dense, &r.step.dense, 1.0);
  r.sparse_squares = part(at_lr.sparse, at_2lr.sparse, &r.w0.sparse, &r.step.sparse, 1.0 / kLines);
  return r;
}

// The factor a run's step is of the reference step, per part (least squares), and the largest
// departure from that factor times the reference step, relative to the step's largest entry.
struct Fit {
  double factor;
  double worst;
};
Fit fit(const std::vector<double>& run, const std::vector<double>& w0,
        const std::vector<double>& step, double factor) {
  const std::vector<double> moved = minus(run, w0);
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < step.size(); ++i) {
    worst = std::max(worst, std::abs(moved[i] - factor * step[i]));
    largest = std::max(largest, std::abs(step[i]));
  }
  return Fit{dot(moved, step) / dot(step, step), worst / largest};
}

// Above the clip: dense parameters and embedding rows both move by factor x the unclipped step,
// the factor of the float64 norm over both parts. The sparse part is a sizable share of the norm
// (checked: without it the factor would be another), so a norm that left it out fails.
TEST_F(GradientClip, AboveTheClipBothPartsStepByTheFloat64Factor) {
  const Reference ref = reference(run(1, kLr, {}), run(1, 2 * kLr, {}));
  ASSERT_GT(ref.sparse_squares, 0.0);
  ASSERT_GT(ref.dense_squares, 0.0);
  const double norm = std::sqrt(ref.dense_squares + ref.sparse_squares);
  const double clip_norm = norm / 3;
  const double factor = ref.factor(clip_norm);
  ASSERT_NEAR(factor, 1.0 / 3, 1e-9);
  // The test can tell a norm without the sparse part (the first step's rows step embed_w only:
  // their embedx parts are made by this push): its factor is 10 tolerances away from this one.
  ASSERT_GT(ref.factor(clip_norm, /*with_sparse=*/false) - factor, 10 * 2e-4 * factor);
  const Model clipped = run(1, kLr, {clip(clip_norm)});
  for (const auto& [name, got, w0, step] :
       {std::make_tuple("dense", &clipped.dense, &ref.w0.dense, &ref.step.dense),
        std::make_tuple("sparse", &clipped.sparse, &ref.w0.sparse, &ref.step.sparse)}) {
    const Fit f = fit(*got, *w0, *step, factor);
    EXPECT_NEAR(f.factor, factor, 2e-4 * factor) << name;
    EXPECT_LT(f.worst, 2e-3) << name << ": the clipped step is not factor x the unclipped one";
  }
}

// At or under the clip the factor is exactly 1: the run is the unclipped one, bit for bit.
TEST_F(GradientClip, UnderTheClipTheRunIsTheUnclippedOneBitForBit) {
  const Model plain = run(1, kLr, {});
  const Reference ref = reference(plain, run(1, 2 * kLr, {}));
  const double norm = std::sqrt(ref.dense_squares + ref.sparse_squares);
  const Model under = run(1, kLr, {clip(norm * 1.5)});
  EXPECT_EQ(under.dense, plain.dense);
  EXPECT_EQ(under.sparse, plain.sparse);
  const Model off = run(1, kLr, {clip(0)});
  EXPECT_EQ(off.dense, plain.dense);
  EXPECT_EQ(off.sparse, plain.sparse);
}

// Several cards split the batch: the dense gradients are all-reduced, each owner sums the squares
// of its keys' merged gradients and the sums are all-reduced (sharded), or every card merges every
// key (Collective mode): the same factor as one card's, so the same model up to summation order.
// The trainer's steps run padded (fixed sizes, one step graph); GPUBOX_PADDED_STEPS=0 runs the
// unpadded sparse push (HeterComm::push_pulled's own path) with the same clip.
TEST_F(GradientClip, SeveralCardsAndCollectiveModeClipAsOneCard) {
  const Reference ref = reference(run(1, kLr, {}), run(1, 2 * kLr, {}));
  const double clip_norm = std::sqrt(ref.dense_squares + ref.sparse_squares) / 3;
  const Model one = run(1, kLr, {clip(clip_norm)});
  const std::vector<double> one_dense = minus(one.dense, ref.w0.dense);
  const std::vector<double> one_sparse = minus(one.sparse, ref.w0.sparse);
  struct Case {
    int cards;
    bool collective;
    bool padded;
  };
  for (const Case& c : {Case{2, false, true}, Case{3, false, true}, Case{2, true, true},
                        Case{3, false, false}, Case{2, true, false}, Case{1, false, false}}) {
    if (!device::testing::missing_cards(c.cards).empty()) continue;
    gpubox::testing::ScopedEnv padded("GPUBOX_PADDED_STEPS", c.padded ? "1" : "0");
    const Model many = run(
        c.cards, kLr,
        {clip(clip_norm), std::string("runner.use_fleet=") + (c.collective ? "true" : "false")});
    const std::string what = std::to_string(c.cards) + " cards" +
                             (c.collective ? ", Collective mode" : "") +
                             (c.padded ? "" : ", unpadded");
    const Fit dense = fit(many.dense, ref.w0.dense, one_dense, 1.0);
    const Fit sparse = fit(many.sparse, ref.w0.sparse, one_sparse, 1.0);
    EXPECT_NEAR(dense.factor, 1.0, 1e-4) << what;
    EXPECT_NEAR(sparse.factor, 1.0, 1e-4) << what;
    EXPECT_LT(dense.worst, 1e-3) << what;
    EXPECT_LT(sparse.worst, 1e-3) << what;
  }
}

// A pass of several steps with a short last batch (global batches of 40 over the 96 lines: 40, 40,
// 16), the trainer's steps as step graphs (a composed graph per batch shape, replayed): a clip
// over every step's norm is the unclipped run bit for bit; a clip that acts on every step equals
// the same steps run eagerly (GPUBOX_STEP_GRAPHS=0) bit for bit, so each replayed graph reads its
// own step's inputs (the dense squares, 1 / global batch, the factor on the card), the short
// batch's too; 2 cards and Collective mode (20 lines a card) clip as one card does, padded and
// not. (The float64 reference of a step of each size: heter_comm_clip_test.)
TEST_F(GradientClip, AShortLastBatchReplaysItsGraphsAsTheEagerSteps) {
  constexpr int kBatch = 40;
  const Model plain = run(1, kLr, {}, kBatch);
  const Model above = run(1, kLr, {clip(1e6)}, kBatch);
  EXPECT_EQ(above.dense, plain.dense);
  EXPECT_EQ(above.sparse, plain.sparse);
  // The first step's norm (one step of kLines) sets the scale of a clip that acts on every step.
  const Reference ref = reference(run(1, kLr, {}), run(1, 2 * kLr, {}));
  const double clip_norm = std::sqrt(ref.dense_squares + ref.sparse_squares) / 4;
  const Model graphs = run(1, kLr, {clip(clip_norm)}, kBatch);
  const Model eager = [&] {
    gpubox::testing::ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
    return run(1, kLr, {clip(clip_norm)}, kBatch);
  }();
  EXPECT_EQ(graphs.dense, eager.dense);
  EXPECT_EQ(graphs.sparse, eager.sparse);
  const Fit acts = fit(graphs.dense, plain.dense, minus(plain.dense, ref.w0.dense), 1.0);
  EXPECT_GT(acts.worst, 1e-3) << "the clip did not act";
  const std::vector<double> one_dense = minus(graphs.dense, ref.w0.dense);
  const std::vector<double> one_sparse = minus(graphs.sparse, ref.w0.sparse);
  for (const bool collective : {false, true}) {
    for (const bool padded : {true, false}) {
      if (!device::testing::missing_cards(2).empty()) continue;
      gpubox::testing::ScopedEnv padding("GPUBOX_PADDED_STEPS", padded ? "1" : "0");
      const Model two =
          run(2, kLr,
              {clip(clip_norm), std::string("runner.use_fleet=") + (collective ? "true" : "false")},
              kBatch / 2);
      const std::string what = std::string("2 cards") + (collective ? ", Collective mode" : "") +
                               (padded ? "" : ", unpadded");
      const Fit dense = fit(two.dense, ref.w0.dense, one_dense, 1.0);
      const Fit sparse = fit(two.sparse, ref.w0.sparse, one_sparse, 1.0);
      EXPECT_NEAR(dense.factor, 1.0, 1e-4) << what;
      EXPECT_NEAR(sparse.factor, 1.0, 1e-4) << what;
      EXPECT_LT(dense.worst, 1e-3) << what;
      EXPECT_LT(sparse.worst, 1e-3) << what;
    }
  }
}

// PaddleRec's dcn_v2 folder (its config.yaml, shrunk to the generated data) trains with its
// trainer's clip, 10 unless set; a clip that acts (0.05: the step's norm is above it) trains
// another model than no clip, and still learns.
TEST_F(GradientClip, ADcnV2FolderConfigTrainsWithItsClip) {
  const fs::path folder = root_ / "PaddleRec" / "models" / "rank" / "dcn_v2";
  fs::create_directories(folder);
  std::ofstream(folder / "config.yaml") << R"(runner:
  train_batch_size: 32
  epochs: 1
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.01
    strategy: async
  sparse_inputs_slots: 7
  sparse_feature_dim: 9
  dense_input_dim: 3
  is_Stacked: True
  use_low_rank_mixture: True
  low_rank: 8
  num_experts: 4
  fc_sizes: [32, 16]
  cross_num: 2
  l2_reg_cross: 0.00003
  dnn_use_bn: False
  clip_by_norm: 10.0
)";
  const auto train = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {
        "runner.train_data_dir=" + (root_ / "folder_data").string(), "runner.shuffle=false",
        "runner.metrics_path=", "runner.model_save_path="};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto cfg = load_trainer_config((folder / "config.yaml").string(), overrides);
    throw_if_error(cfg.status());
    Trainer trainer(*cfg, cards_env(device::testing::cards_here(2)));
    const auto files = data_files((root_ / "folder_data").string());
    PassReport report;
    for (int pass = 0; pass < 3; ++pass) report = trainer.train_pass(files);
    return std::make_pair(cfg->hyper.clip_by_norm,
                          std::make_pair(report.metrics.auc, trainer.dense_values(0)));
  };
  const auto folder_default = train({});
  EXPECT_EQ(folder_default.first, 10.0);
  const auto acting = train({clip(0.05)});
  const auto off = train({clip(0)});
  for (const auto* run : {&folder_default, &acting, &off}) {
    EXPECT_GT(run->second.first, 0.6) << "clip " << run->first << ": the training AUC";
  }
  EXPECT_NE(acting.second.second, off.second.second) << "a clip of 0.05 did not act";
}

}  // namespace
}  // namespace gpubox::trainer
