// Clipping by global norm (NormClipState, heter_comm_types.hpp) in both push forms, push_pulled
// and the key-taking push, on 1-3 simulated cards, sharded and replicated, against a float64
// host reference over several steps: the factor every card writes is clip / max(clip, sqrt(dense
// squares + sum over the step's distinct keys of (sparse_scale x the key's push gradients summed
// over all cards)^2)), where a key's embedx gradients join only when its row held its embedx part
// before the step (the rows before each step read from the stores; embedx_threshold makes parts
// appear mid-run); both forms end with the same rows, bit for bit. The same through the planned
// steps (plan_next_step) at the pass's fixed sizes, replayed as step graphs over batches of varying
// size (an empty and a short one), with rows that hold their embedx part from the start. A NaN or
// inf sparse gradient makes the norm non-finite: every card's veto word then says kNonFiniteNorm
// and no row changes. A hot key's squares are those of its summed gradient times sparse_scale
// (the mean loss's gradient of its row, Paddle's), not of the g / show its step takes, and its
// step is the factor times the unclipped one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Batch;
using cluster_test::BatchMaker;
using cluster_test::Cluster;
using cluster_test::same_bytes;
using cluster_test::store_rows;
using cluster_test::test_config;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;
using table::optimizer::PushRecord;
using Rows = std::map<uint64_t, std::vector<float>>;

struct ClipCase {
  int cards;
  bool replicated;
};

inline void PrintTo(const ClipCase& c, std::ostream* os) {
  *os << c.cards << " cards, " << (c.replicated ? "replicated" : "sharded");
}

// Which push a step takes: pull then push_pulled (the trainer's), or push with the keys again.
enum class Form { kPushPulled, kPush };
constexpr Form kForms[] = {Form::kPushPulled, Form::kPush};
const char* form_name(Form form) { return form == Form::kPush ? "push" : "push_pulled"; }

// A step's clip inputs, the same on every card; the veto word starts at veto_before.
struct ClipInputs {
  double dense_squares = 0;
  double scale = 1;
  double clip = 1;
  uint32_t veto_before = kNoVeto;
};

// What a card's state and veto word hold after its step.
struct CardClip {
  float factor = -1.0f;
  uint32_t veto = 0;
};

// One card's clip inputs for a step, its veto word set, both written on `card`'s stream.
void set_clip(device::Card& card, NormClipState* state, uint32_t* veto, const ClipInputs& in) {
  NormClipState host;
  host.squares = in.dense_squares;
  host.sparse_scale = static_cast<float>(in.scale);
  host.clip_norm = static_cast<float>(in.clip);
  host.factor = -1.0f;
  device::copy_async(state, &host, 1, card.stream());
  device::copy_async(veto, &in.veto_before, 1, card.stream());
  card.stream().synchronize();  // `host` is on this frame
}

// One step of every card's batch through `form`, clipped with `in`.
std::vector<CardClip> clipped_step(Cluster& cluster, const std::vector<Batch>& batches, Form form,
                                   const ClipInputs& in) {
  std::vector<CardClip> out(cluster.size());
  cluster.run([&](device::Card& card) {
    const int c = card.local_index();
    HeterComm& hc = cluster.heter_comm(c);
    const Batch& b = batches[c];
    auto keys = device::to_device(b.keys, card.memory(), card.stream());
    auto grads = device::to_device(b.grads, card.memory(), card.stream());
    auto state = card.make_buffer<NormClipState>(1);
    auto veto = card.make_buffer<uint32_t>(1);
    set_clip(card, state.data(), veto.data(), in);
    if (form == Form::kPushPulled) {
      auto pulled = card.make_buffer<float>(b.keys.size() * hc.pull_dim());
      hc.pull(keys.data(), b.keys.size(), pulled.data(), card.stream());
      hc.push_pulled(grads.data(), card.stream(), veto.data(), state.data());
    } else {
      hc.push(keys.data(), b.keys.size(), grads.data(), card.stream(), /*slots=*/nullptr,
              veto.data(), state.data());
    }
    out[c] = CardClip{device::to_host(state)[0].factor, device::to_host(veto)[0]};
  });
  return out;
}

// The reference factor of one step from every card's batch and the rows before it (by key, all
// cards' stores together: sharded, each key on its owner; replicated, every card's are equal).
double reference_factor(const std::vector<Batch>& batches, const Rows& rows_before,
                        const RowLayout& layout, const ClipInputs& in, bool with_sparse = true) {
  const int push_dim = layout.push_dim();
  std::map<uint64_t, std::vector<double>> merged;
  for (const Batch& b : batches) {
    for (std::size_t i = 0; i < b.keys.size(); ++i) {
      std::vector<double>& sum = merged[b.keys[i]];
      sum.resize(push_dim, 0.0);
      for (int f = 0; f < push_dim; ++f) sum[f] += b.grads[i * push_dim + f];
    }
  }
  double squares = in.dense_squares;
  for (const auto& [key, sum] : merged) {
    const auto row = rows_before.find(key);
    const bool embedx = row != rows_before.end() && row->second[layout.mf_size()] > 0.0f;
    const int end = embedx ? PushRecord::kEmbedxG + layout.mf_dim : PushRecord::kEmbedxG;
    for (int f = PushRecord::kEmbedG; f < end; ++f) {
      if (with_sparse) squares += (in.scale * sum[f]) * (in.scale * sum[f]);
    }
  }
  return in.clip / std::max(in.clip, std::sqrt(squares));
}

class HeterCommClip : public ::testing::TestWithParam<ClipCase> {
 protected:
  int cards() const { return GetParam().cards; }
  bool replicated() const { return GetParam().replicated; }

  // The case's cards over `cfg` (a new cluster, the last one dropped).
  Cluster& start(const AccessorConfig& cfg, MissingKeyPolicy missing = MissingKeyPolicy::kCreate) {
    layout_ = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
    HeterCommOptions options;
    options.missing_keys = missing;
    if (replicated()) options.placement = Placement::kReplicated;
    cluster_.reset();
    cluster_ = std::make_unique<Cluster>(cards(), cfg, options);
    return *cluster_;
  }
  void TearDown() override { cluster_.reset(); }

  // Every card's store, by card.
  std::vector<Rows> card_rows() {
    std::vector<Rows> rows(cards());
    for (int c = 0; c < cards(); ++c) rows[c] = store_rows(*cluster_, c, layout_);
    return rows;
  }
  // Every row of the cluster by key (replicas are equal).
  Rows all_rows() {
    Rows all;
    for (const Rows& card : card_rows()) all.insert(card.begin(), card.end());
    return all;
  }

  // The rows of `rows` that `card` holds (its owned keys, or all replicated) inserted into its
  // store, as begin_pass would. On the card's thread.
  void place(device::Card& card, const Rows& rows) {
    const int c = card.local_index();
    std::vector<uint64_t> keys;
    std::vector<float> values;
    for (const auto& [k, row] : rows) {
      if (!replicated() && owner_card(k, cards()) != c) continue;
      keys.push_back(k);
      values.insert(values.end(), row.begin(), row.end());
    }
    auto dk = device::to_device(keys, card.memory(), card.stream());
    auto dr = device::to_device(values, card.memory(), card.stream());
    cluster_->store(c).insert_rows(dk.data(), dr.data(), keys.size(), card.stream());
    card.stream().synchronize();  // `keys` and `values` are on this frame
  }

  // Six steps through `form` from an empty table (kCreate), a clip above then under the norm by
  // turns, each step's factor checked against the reference. Whether a row held its embedx part
  // before a step (so that rule was exercised).
  bool checks_factors_over_steps(Form form);

  RowLayout layout_;
  std::unique_ptr<Cluster> cluster_;
};

bool HeterCommClip::checks_factors_over_steps(Form form) {
  BatchMaker maker(/*seed=*/31, layout_.push_dim());
  bool embedx_counted = false;
  for (int step = 0; step < 6; ++step) {
    std::vector<Batch> batches;
    for (int c = 0; c < cards(); ++c) batches.push_back(maker.make(c == 1 ? 0 : 150));
    const Rows before = all_rows();
    for (const auto& [key, row] : before) embedx_counted |= row[layout_.mf_size()] > 0.0f;
    // A clip the step's norm is above (a third of the norm at step 0's scale), then under it.
    const ClipInputs in{0.01, 1.0 / 64, step % 2 == 0 ? 0.05 : 1e6};
    const double want = reference_factor(batches, before, layout_, in);
    if (step == 0) {
      EXPECT_LT(want, 1.0) << "the step's norm must be above the clip";
      EXPECT_GT(reference_factor(batches, before, layout_, in, /*with_sparse=*/false) - want, 1e-2);
    }
    const std::vector<CardClip> got = clipped_step(*cluster_, batches, form, in);
    for (int c = 0; c < cards(); ++c) {
      EXPECT_NEAR(got[c].factor, want, 1e-5 * want) << "step " << step << ", card " << c;
      EXPECT_EQ(got[c].factor, got[0].factor) << "step " << step << ", card " << c;
      EXPECT_EQ(got[c].veto, kNoVeto) << "a finite norm vetoed step " << step << ", card " << c;
      if (in.clip > 1e5) {
        EXPECT_EQ(got[c].factor, 1.0f) << "step " << step;
      }
    }
  }
  return embedx_counted;
}

// Mutations caught: push not clipping (its factor stays -1, its rows step unclipped); the
// squares counting an embedx part made by the step, or missing the sparse_scale.
TEST_P(HeterCommClip, BothFormsWriteTheFloat64FactorOfDenseAndMergedSparseSquares) {
  GPUBOX_REQUIRE_CARDS(cards());
  std::vector<std::vector<Rows>> rows_after;
  for (Form form : kForms) {
    SCOPED_TRACE(form_name(form));
    start(test_config(SparseOptimizerKind::kSgd));
    EXPECT_TRUE(checks_factors_over_steps(form))
        << "no row held an embedx part before a step: that rule is untested";
    rows_after.push_back(card_rows());
  }
  for (int c = 0; c < cards(); ++c) {
    ASSERT_EQ(rows_after[1][c].size(), rows_after[0][c].size()) << "card " << c;
    for (const auto& [key, row] : rows_after[0][c]) {
      EXPECT_TRUE(same_bytes(rows_after[1][c].at(key), row))
          << "card " << c << ": key " << key << " differs between push and push_pulled";
    }
  }
}

// A NaN, then an inf, in one sparse gradient of one card, in either form: the global norm is not
// finite, so every card's veto word says kNonFiniteNorm (a word that already held the dense
// check's veto keeps it) and no row changes, on any card. Mutations caught: ClipFactor not
// writing the veto (rows take NaN, the words stay kNoVeto); push not passing the veto to its
// updates (its rows take NaN).
TEST_P(HeterCommClip, ANonFiniteSparseGradientVetoesTheStepOnEveryCard) {
  GPUBOX_REQUIRE_CARDS(cards());
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  // Step 0 creates the rows (finite); steps 1-3 push the same keys: a NaN, an inf, then a NaN
  // under a dense verdict that already vetoed the step (index 5).
  struct Poison {
    float value;
    uint32_t veto_before;
  };
  const std::vector<Poison> steps = {{0.0f, kNoVeto}, {kNan, kNoVeto}, {kInf, kNoVeto}, {kNan, 5u}};
  for (Form form : kForms) {
    SCOPED_TRACE(form_name(form));
    start(test_config(SparseOptimizerKind::kSgd));
    BatchMaker maker(/*seed=*/37, layout_.push_dim());
    std::vector<Batch> batches;
    for (int c = 0; c < cards(); ++c) batches.push_back(maker.make(120));
    for (std::size_t step = 0; step < steps.size(); ++step) {
      const std::vector<Rows> before = card_rows();
      std::vector<Batch> poisoned = batches;
      if (step > 0)
        poisoned[0].grads[3 * layout_.push_dim() + PushRecord::kEmbedG] = steps[step].value;
      const ClipInputs in{0.01, 1.0 / 64, 0.05, steps[step].veto_before};
      const std::vector<CardClip> got = clipped_step(*cluster_, poisoned, form, in);
      const uint32_t want = step == 0                            ? kNoVeto
                            : steps[step].veto_before != kNoVeto ? steps[step].veto_before
                                                                 : kNonFiniteNorm;
      const std::vector<Rows> after = card_rows();
      for (int c = 0; c < cards(); ++c) {
        EXPECT_EQ(got[c].veto, want) << "step " << step << ", card " << c;
        if (step == 0) continue;
        ASSERT_EQ(after[c].size(), before[c].size()) << "step " << step << ", card " << c;
        for (const auto& [key, row] : after[c]) {
          EXPECT_TRUE(same_bytes(row, before[c].at(key)))
              << "step " << step << ", card " << c << ": key " << key << " changed";
        }
      }
    }
  }
}

// A pass of planned steps: every card's batches, the rows placed before it (every key of the
// pass, half with their embedx part), each step's plan and the pass's bounds, as the trainer
// computes them.
struct PlannedPass {
  static constexpr int kSteps = 6;
  std::vector<std::vector<Batch>> batches;  // [step][card]
  Rows placed;
  std::size_t plan_row = 0;                  // sharded: cards; replicated: 1
  std::vector<std::vector<uint64_t>> plans;  // [step][src * plan_row + dst]
  StepBounds bounds;
};

// The plans and bounds of `pass`'s batches.
void plan_pass(PlannedPass& pass, int cards, bool replicated) {
  pass.plan_row = replicated ? 1 : static_cast<std::size_t>(cards);
  const std::size_t row = pass.plan_row;
  pass.plans.assign(PlannedPass::kSteps, std::vector<uint64_t>(cards * row, 0));
  StepBounds& bounds = pass.bounds;
  for (int s = 0; s < PlannedPass::kSteps; ++s) {
    std::vector<std::size_t> received(cards, 0);
    for (int c = 0; c < cards; ++c) {
      const Batch& b = pass.batches[s][c];
      const std::set<uint64_t> distinct(b.keys.begin(), b.keys.end());
      for (uint64_t k : distinct) {
        const int dst = replicated ? 0 : owner_card(k, cards);
        ++pass.plans[s][c * row + dst];
        for (int o = 0; o < cards; ++o) {
          if (replicated || o == dst) ++received[o];
        }
      }
      bounds.occurrences = std::max(bounds.occurrences, b.keys.size());
      bounds.unique = std::max(bounds.unique, distinct.size());
      bounds.block = std::max(bounds.block, distinct.size());
      for (std::size_t d = 0; d < row; ++d) {
        bounds.pair_block = std::max<std::size_t>(bounds.pair_block, pass.plans[s][c * row + d]);
      }
    }
    for (int o = 0; o < cards; ++o) bounds.received = std::max(bounds.received, received[o]);
  }
}

// Batches of every size (card 0's empty at step 2, a short step before the last), the last
// step's with a NaN gradient on card 0; every key placed, half with their embedx part.
PlannedPass draw_planned_pass(int cards, bool replicated, const AccessorConfig& cfg,
                              const RowLayout& layout) {
  PlannedPass pass;
  const int push_dim = layout.push_dim();
  BatchMaker maker(/*seed=*/41, push_dim);
  std::set<uint64_t> known;
  pass.batches.resize(PlannedPass::kSteps);
  for (int s = 0; s < PlannedPass::kSteps; ++s) {
    for (int c = 0; c < cards; ++c) {
      const std::size_t n = s == PlannedPass::kSteps - 2 ? 17
                            : (s == 2 && c == 0)         ? 0
                                                         : 60 + 45 * ((s + c) % 3);
      pass.batches[s].push_back(maker.make(n));
      known.insert(pass.batches[s][c].keys.begin(), pass.batches[s][c].keys.end());
    }
  }
  pass.batches[PlannedPass::kSteps - 1][0].grads[2 * push_dim + PushRecord::kEmbedG] =
      std::numeric_limits<float>::quiet_NaN();
  for (uint64_t k : known) {
    std::vector<float> row(layout.stride());
    table::init_row(row.data(), layout, cfg, k, 1);
    if (mix64(k) & 1) table::create_embedx(row.data(), layout, cfg, k);
    pass.placed[k] = row;
  }
  plan_pass(pass, cards, replicated);
  return pass;
}

ClipInputs planned_clip(int step) {
  return ClipInputs{0.004, 1.0 / 128, step % 2 == 0 ? 0.02 : 1e6};
}

// One card's planned pass (kFail, the trainer's): its rows placed, the pass reserved, then every
// step planned with the card's occurrence count on the card and clipped with planned_clip, the
// same buffers throughout. out[step][card]: what the state and veto word held after it; padded:
// whether the card ran the pass's steps padded.
void run_planned_card(device::Card& card, Cluster& cluster, const PlannedPass& pass,
                      std::vector<std::vector<CardClip>>& out, bool* padded) {
  const int c = card.local_index();
  const device::Stream& stream = card.stream();
  HeterComm& hc = cluster.heter_comm(c);
  hc.reserve_steps(pass.bounds);
  *padded = hc.pads_planned_steps();
  const std::size_t most = std::max<std::size_t>(pass.bounds.occurrences, 1);
  auto keys = card.make_buffer<uint64_t>(most);
  auto grads = card.make_buffer<float>(most * hc.push_dim());
  auto pulled = card.make_buffer<float>(most * hc.pull_dim());
  auto n_on_card = card.make_buffer<uint64_t>(1);
  auto state = card.make_buffer<NormClipState>(1);
  auto veto = card.make_buffer<uint32_t>(1);
  stream.synchronize();
  for (int s = 0; s < PlannedPass::kSteps; ++s) {
    const Batch& b = pass.batches[s][c];
    const uint64_t n = b.keys.size();
    if (n > 0) {
      device::copy_async(keys.data(), b.keys.data(), n, stream);
      device::copy_async(grads.data(), b.grads.data(), b.grads.size(), stream);
    }
    device::copy_async(n_on_card.data(), &n, 1, stream);
    set_clip(card, state.data(), veto.data(), planned_clip(s));
    cluster.comm(c).set_step(0, s);
    hc.plan_next_step({pass.plans[s].data(), pass.plan_row}, n_on_card.data());
    hc.pull(keys.data(), n, pulled.data(), stream);
    hc.push_pulled(grads.data(), stream, veto.data(), state.data());
    out[s][c] = CardClip{device::to_host(state)[0].factor, device::to_host(veto)[0]};
  }
  cluster.comm(c).set_step(-1, -1);
  hc.drain_checks();
}

// The planned steps (plan_next_step with the card's occurrence count, MissingKeyPolicy::kFail: the
// trainer's) at the pass's fixed sizes, as step graphs captured once and replayed over batches of
// every size (one card's empty, a short last step), with the same NormClipState and veto buffers
// throughout: the factor of every step as the float64 reference's, where half the rows hold their
// embedx part from the start (its squares count from step 0) and no part appears during the run
// (embedx_threshold out of reach), so the rows before every step are the placed ones. The last
// step's NaN gradient vetoes it on every card.
TEST_P(HeterCommClip, PlannedPaddedStepsWriteTheFloat64FactorAndVetoANaN) {
  GPUBOX_REQUIRE_CARDS(cards());
  AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  cfg.embedx_threshold = 1e9f;
  Cluster& cluster = start(cfg, MissingKeyPolicy::kFail);
  const PlannedPass pass = draw_planned_pass(cards(), replicated(), cfg, layout_);
  std::vector<std::vector<CardClip>> got(PlannedPass::kSteps, std::vector<CardClip>(cards()));
  std::vector<char> padded(cards(), 0);
  cluster.run([&](device::Card& card) {
    place(card, pass.placed);
    bool card_padded = false;
    run_planned_card(card, cluster, pass, got, &card_padded);
    padded[card.local_index()] = card_padded;
  });
  for (int c = 0; c < cards(); ++c) ASSERT_TRUE(padded[c]) << "card " << c << " ran unpadded steps";
  bool embedx_counted = false;
  for (const auto& [key, row] : pass.placed) embedx_counted |= row[layout_.mf_size()] > 0.0f;
  ASSERT_TRUE(embedx_counted);
  for (int s = 0; s < PlannedPass::kSteps - 1; ++s) {
    const double want = reference_factor(pass.batches[s], pass.placed, layout_, planned_clip(s));
    if (s == 0) {
      ASSERT_LT(want, 1.0) << "the step's norm must be above the clip";
    }
    for (int c = 0; c < cards(); ++c) {
      EXPECT_NEAR(got[s][c].factor, want, 1e-5 * want) << "step " << s << ", card " << c;
      EXPECT_EQ(got[s][c].factor, got[s][0].factor) << "step " << s << ", card " << c;
      EXPECT_EQ(got[s][c].veto, kNoVeto) << "step " << s << ", card " << c;
    }
  }
  for (int c = 0; c < cards(); ++c) {
    EXPECT_EQ(got[PlannedPass::kSteps - 1][c].veto, kNonFiniteNorm) << "the NaN step, card " << c;
  }
}

// Each card's batch of 41 instances: key kHot 40 times, kCold once (show 1 each; embed_g 0.5 +
// 0.01 card for kHot, -0.3 for kCold; embedx_g 0.2, which no part steps).
constexpr uint64_t kHot = 7;
constexpr uint64_t kCold = 11;
constexpr int kInstances = 41;
std::vector<Batch> hot_key_batches(int cards, int push_dim) {
  std::vector<Batch> batches(cards);
  for (int c = 0; c < cards; ++c) {
    for (int i = 0; i < kInstances; ++i) {
      const bool hot = i + 1 < kInstances;
      batches[c].keys.push_back(hot ? kHot : kCold);
      std::vector<float> record(push_dim, 0.2f);
      record[PushRecord::kShow] = 1.0f;
      record[PushRecord::kClick] = 0.0f;
      record[PushRecord::kEmbedG] = hot ? 0.5f + 0.01f * static_cast<float>(c) : -0.3f;
      batches[c].grads.insert(batches[c].grads.end(), record.begin(), record.end());
    }
  }
  return batches;
}

// Which gradient the norm sees (docs/user-guide.md, "clip by global norm"): Paddle's
// ClipGradByGlobalNorm on dcn_v2's nn.Embedding takes the mean loss's gradient of each row, the
// key's per-instance gradients summed over its occurrences / the global batch, so a hot key's
// squares are (sparse_scale x its sum)^2, not (its sum / show)^2, the g / show that show_scale
// steps; and the factor scales that sum before the step divides it by show, so a hot key's SGD
// step is the factor times its unclipped one. Float64 reference, both forms. Mutations caught:
// MergedSquares dividing by the merged show (the factor is the g / show norm's, 0.08 off);
// ScaleMerged not scaling (the rows step unclipped).
TEST_P(HeterCommClip, AHotKeyJoinsTheNormAsItsMeanLossGradientAndStepsByTheFactor) {
  GPUBOX_REQUIRE_CARDS(cards());
  AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  cfg.embedx_threshold = 1e9f;  // embed_w alone steps: one weight a key to check
  ASSERT_TRUE(cfg.show_scale);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const std::vector<Batch> batches = hot_key_batches(cards(), layout.push_dim());
  Rows placed;
  for (uint64_t k : {kHot, kCold}) {
    placed[k].resize(layout.stride());
    table::init_row(placed[k].data(), layout, cfg, k, 1);
  }
  // Per key over all cards: the summed embed_g and the show.
  std::map<uint64_t, double> sum;
  std::map<uint64_t, double> show;
  for (const Batch& b : batches) {
    for (std::size_t i = 0; i < b.keys.size(); ++i) {
      sum[b.keys[i]] += b.grads[i * layout.push_dim() + PushRecord::kEmbedG];
      show[b.keys[i]] += 1.0;
    }
  }
  const ClipInputs in{1e-4, 1.0 / (kInstances * cards()), 0.25};
  const double want = reference_factor(batches, placed, layout, in);
  double show_scaled = in.dense_squares;
  for (const auto& [key, g] : sum) show_scaled += (g / show[key]) * (g / show[key]);
  ASSERT_LT(want, 1.0) << "the step's norm must be above the clip";
  ASSERT_GT(std::fabs(in.clip / std::sqrt(show_scaled) - want), 0.05)
      << "the batch must tell the two norms apart";
  for (Form form : kForms) {
    SCOPED_TRACE(form_name(form));
    Cluster& cluster = start(cfg, MissingKeyPolicy::kFail);
    cluster.run([&](device::Card& card) { place(card, placed); });
    const std::vector<CardClip> got = clipped_step(cluster, batches, form, in);
    const Rows after = all_rows();
    for (int c = 0; c < cards(); ++c) {
      EXPECT_NEAR(got[c].factor, want, 1e-5 * want) << "card " << c;
      EXPECT_EQ(got[c].veto, kNoVeto) << "card " << c;
    }
    for (uint64_t k : {kHot, kCold}) {
      const double step = static_cast<double>(placed[k][RowLayout::kEmbedW]) -
                          static_cast<double>(after.at(k)[RowLayout::kEmbedW]);
      const double unclipped = cfg.optimizer.learning_rate * sum[k] / show[k];
      EXPECT_NEAR(step / unclipped, want, 1e-4) << "key " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, HeterCommClip,
                         ::testing::Values(ClipCase{1, false}, ClipCase{2, false},
                                           ClipCase{3, false}, ClipCase{3, true}),
                         [](const ::testing::TestParamInfo<ClipCase>& info) {
                           return std::to_string(info.param.cards) + "cards" +
                                  (info.param.replicated ? "Replicated" : "Sharded");
                         });

}  // namespace
}  // namespace gpubox::heter_comm
