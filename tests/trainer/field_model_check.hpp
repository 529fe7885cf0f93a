// The float64 gradient check of the field networks (autoint, deepfefm, dlrm, ffm, xdeepfm; the
// pattern of dense_model_test): a random batch of pulled records, every dense parameter set random,
// one forward_backward, and its loss, predictions, dense gradients and pushed gradients compared
// with a float64 reference logit and central differences of its summed log loss.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/gemm_fallback.hpp"

namespace gpubox::trainer::testing {

struct HostBatch {
  std::vector<float> records;  // show, click, embed_w, embedx_w[mf_dim] per occurrence
  std::vector<uint32_t> offsets;
  std::vector<float> dense;
  std::vector<float> labels;
  int64_t batch = 0;
};

// 0 to 2 occurrences per (slot, instance), values in [-0.6, 0.6], dense in [-1.2, 1.2].
inline HostBatch make_field_batch(int64_t batch, const DenseModelConfig& cfg,
                                  std::mt19937_64& rng) {
  HostBatch h;
  h.batch = batch;
  h.offsets.push_back(0);
  std::uniform_int_distribution<int> count(0, 2), shows(0, 4);
  std::uniform_real_distribution<float> value(-0.6f, 0.6f);
  for (int s = 0; s < cfg.slots; ++s) {
    for (int64_t i = 0; i < batch; ++i) {
      const int n = count(rng);
      for (int j = 0; j < n; ++j) {
        const int show = shows(rng);
        h.records.push_back(static_cast<float>(show));
        h.records.push_back(static_cast<float>(std::uniform_int_distribution<int>(0, show)(rng)));
        for (int k = 0; k < 1 + cfg.mf_dim; ++k) h.records.push_back(value(rng));
      }
      h.offsets.push_back(h.offsets.back() + n);
    }
  }
  for (int64_t i = 0; i < batch * cfg.dense_dim; ++i) h.dense.push_back(2 * value(rng));
  for (int64_t i = 0; i < batch; ++i) h.labels.push_back(static_cast<float>(rng() % 2));
  return h;
}

// A parameter block's values by name, from the flat float64 copy.
struct NamedParams {
  const std::vector<ParamBlock>& blocks;
  const std::vector<double>& w;
  const ParamBlock& block(const std::string& name) const {
    for (const ParamBlock& b : blocks) {
      if (b.name == name) return b;
    }
    throw std::runtime_error("no parameter block " + name);
  }
  bool has(const std::string& name) const {
    return std::any_of(blocks.begin(), blocks.end(),
                       [&](const ParamBlock& b) { return b.name == name; });
  }
  double operator()(const std::string& name, std::size_t k) const {
    const ParamBlock& b = block(name);
    EXPECT_LT(k, b.count) << name;
    return w[b.offset + k];
  }
  // y = x W + b (W row-major [in x out]), ReLU'd when asked: the model's fc_<l> layers.
  std::vector<double> linear(const std::string& name, const std::vector<double>& x,
                             bool relu) const {
    const std::size_t out = block(name + ".b").count;
    EXPECT_EQ(block(name + ".w").count, x.size() * out) << name;
    std::vector<double> y(out);
    for (std::size_t c = 0; c < out; ++c) {
      double z = (*this)(name + ".b", c);
      for (std::size_t r = 0; r < x.size(); ++r) z += x[r] * (*this)(name + ".w", r * out + c);
      y[c] = relu ? std::max(z, 0.0) : z;
    }
    return y;
  }
};

// Instance i's pooled record sums per slot (show, click, embed_w, embedx_w...).
inline std::vector<std::vector<double>> pooled_slots(const HostBatch& h,
                                                     const DenseModelConfig& cfg, int64_t i,
                                                     const std::vector<double>& rec) {
  const int pull = 3 + cfg.mf_dim;
  std::vector<std::vector<double>> slots;
  for (int s = 0; s < cfg.slots; ++s) {
    std::vector<double> sum(pull, 0.0);
    for (uint32_t j = h.offsets[s * h.batch + i]; j < h.offsets[s * h.batch + i + 1]; ++j) {
      for (int k = 0; k < pull; ++k) sum[k] += rec[j * pull + k];
    }
    slots.push_back(sum);
  }
  return slots;
}

// The reference's logit of the batch's instance i from the parameters and the records (float64).
using ReferenceLogit = std::function<double(const HostBatch& h, int64_t i, const NamedParams& p,
                                            const std::vector<double>& rec)>;

inline double central(std::vector<double>& v, std::size_t k, const std::function<double()>& f) {
  const double saved = v[k], eps = 1e-6;
  v[k] = saved + eps;
  const double plus = f();
  v[k] = saved - eps;
  const double minus = f();
  v[k] = saved;
  return (plus - minus) / (2 * eps);
}

// A HostBatch on the card, and the model's view of it (valid while this lives).
struct CardBatch {
  CardBatch(device::Card& card, const HostBatch& h, int slots)
      : records(device::to_device(h.records, card.memory(), card.stream())),
        offsets(device::to_device(h.offsets, card.memory(), card.stream())),
        dense(device::to_device(h.dense, card.memory(), card.stream())),
        labels(device::to_device(h.labels, card.memory(), card.stream())),
        view{SlotBatchView{records.data(), offsets.data(), h.batch, slots}, dense.data(),
             labels.data(), h.batch} {}
  device::device_buffer<float> records;
  device::device_buffer<uint32_t> offsets;
  device::device_buffer<float> dense;
  device::device_buffer<float> labels;
  DenseBatchView view;
};

// Sets every parameter random in [-0.5, 0.5] (seeded by `seed`), runs one forward_backward of a
// `batch`-instance batch with the dense scale 1/batch and checks everything against `logit` (with
// `only_block`: the loss, the predictions and that block's gradients, not the others nor the
// pushed ones); returns how many gradients it compared.
inline std::size_t check_against_reference(device::Card& card, DenseModel& model, uint64_t seed,
                                           const ReferenceLogit& logit, int64_t batch = 6,
                                           const std::string& only_block = {}) {
  const DenseModelConfig& cfg = model.config();
  std::mt19937_64 rng(seed);
  const HostBatch h = make_field_batch(batch, cfg, rng);
  std::vector<float> w = model.parameters().values_to_host();
  std::uniform_real_distribution<float> value(-0.5f, 0.5f);
  for (float& x : w) x = value(rng);
  model.parameters().set_values(w);
  const CardBatch on_card(card, h, cfg.slots);
  const DenseBatchView& view = on_card.view;
  auto push = card.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  const double n = static_cast<double>(h.batch);
  const double loss =
      model.forward_backward(view, GradScales{1.0f / static_cast<float>(batch), 1.0f}, push.data());
  const std::vector<float> preds = device::to_host(model.predictions(), h.batch, card.stream());
  const std::vector<float> grads = model.parameters().grads_to_host();
  const std::vector<float> pushed = device::to_host(push);

  std::vector<double> wd(w.begin(), w.end()), rec(h.records.begin(), h.records.end());
  const NamedParams params{model.parameters().blocks(), wd};
  const auto loss_of = [&] {
    double sum = 0;
    for (int64_t i = 0; i < h.batch; ++i) {
      const double z = logit(h, i, params, rec), y = h.labels[i];
      sum += std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::fabs(z)));
    }
    return sum;
  };
  EXPECT_NEAR(loss, loss_of(), 1e-5 * loss);
  for (int64_t i = 0; i < h.batch; ++i) {
    EXPECT_NEAR(preds[i], 1 / (1 + std::exp(-logit(h, i, params, rec))), 1e-5) << "instance " << i;
  }
  std::size_t checked = 0;
  for (const ParamBlock& b : model.parameters().blocks()) {
    if (!only_block.empty() && b.name != only_block) continue;
    for (std::size_t k = 0; k < b.count; ++k, ++checked) {
      EXPECT_NEAR(grads[b.offset + k] * n, central(wd, b.offset + k, loss_of),
                  1e-4 + 1e-3 * std::fabs(grads[b.offset + k] * n))
          << b.name << "[" << k << "]";
    }
  }
  if (!only_block.empty()) return checked;
  const int pull = model.pool().pull_dim();
  for (std::size_t j = 0; j < h.offsets.back(); ++j) {
    for (int k = 2; k < pull; ++k, ++checked) {  // embed_w and embedx_w; show, click: counters
      EXPECT_NEAR(pushed[j * pull + k], central(rec, j * pull + k, loss_of),
                  1e-4 + 1e-3 * std::fabs(pushed[j * pull + k]))
          << "occurrence " << j << " field " << k;
    }
  }
  return checked;
}

// One model through batches of 6, 1, 9 and 0 instances in turn, each checked as above: its
// workspaces resized between calls (up and down) hold no state of the call before; the empty
// batch has loss 0 and every dense gradient 0. Returns how many gradients it compared.
inline std::size_t check_batch_sizes(device::Card& card, DenseModel& model, uint64_t seed,
                                     const ReferenceLogit& logit) {
  std::size_t checked = 0;
  for (const int64_t batch : {6, 1, 9}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    checked += check_against_reference(card, model, seed + batch, logit, batch);
  }
  const DenseModelConfig& cfg = model.config();
  const std::vector<uint32_t> offsets(1, 0);
  auto empty_offsets = device::to_device(offsets, card.memory(), card.stream());
  const DenseBatchView empty{SlotBatchView{nullptr, empty_offsets.data(), 0, cfg.slots}, nullptr,
                             nullptr, 0};
  EXPECT_EQ(model.forward_backward(empty, GradScales{}, nullptr), 0.0);
  for (float g : model.parameters().grads_to_host()) EXPECT_EQ(g, 0.0f);
  return checked;
}

// What building `cfg`'s model on `card` refuses it with: the gpubox::Error's message, or "" (and
// a test failure) when the model was built.
inline std::string refusal(device::Card& card, const DenseModelConfig& cfg) {
  try {
    DenseModel model(card, cfg);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the model was built";
  return "";
}

// Why the tests that count a step's launches skip under GPUBOX_FORCE_GEMM_FALLBACK=1 (gpu_check's
// item 3b): their counts are those of cuBLASLt's fused epilogues, and the fallback adds launches
// (a bias kernel, a bias GEMM, a mask kernel) to every layer GEMM it takes.
inline constexpr char kCountsAssumeFusedGemms[] =
    "GPUBOX_FORCE_GEMM_FALLBACK=1: the launch counts assume cuBLASLt's fused epilogues";

// The card launches (kernels, GEMMs/GEMVs, memsets) of one forward_backward of a seeded
// `batch`-instance batch, counted on its second run (the first sizes the model's workspaces),
// which must also allocate nothing and wait only for the loss it returns.
inline uint64_t step_launches(device::Card& card, DenseModel& model, int64_t batch, uint64_t seed) {
  const DenseModelConfig& cfg = model.config();
  std::mt19937_64 rng(seed);
  const HostBatch h = make_field_batch(batch, cfg, rng);
  const CardBatch on_card(card, h, cfg.slots);
  const DenseBatchView& view = on_card.view;
  auto push = card.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  const GradScales scales{1.0f / static_cast<float>(batch), 1.0f};
  model.forward_backward(view, scales, push.data());
  const device::DeviceCounts before = card.counts();
  model.forward_backward(view, scales, push.data());
  const device::DeviceCounts step = card.counts() - before;
  EXPECT_EQ(step.allocations, 0u) << "batch " << batch << ": the second step allocated";
  // forward_backward returns the loss: one wait, and no other.
  EXPECT_EQ(step.host_syncs, 1u) << "batch " << batch << ": the second step's waits";
  return step.launches;
}

// bf16 against fp32 from the same weights (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs):
// `cfg` built twice, then on the same two models one forward_backward each of a seeded batch of
// each size in `batches` (> 0), in order; predictions within `preds_bound`, and every dense and
// pushed gradient as a whole within their relative L2 bounds. With several steps, each step's
// bf16 results also equal, bit for bit, those of a fresh bf16 model from the same weights on the
// same batch: a later step reads nothing an earlier one left (a stale or short bf16 copy).
inline void expect_bf16_steps_near_fp32(device::Card& card, DenseModelConfig cfg, uint64_t seed,
                                        double grads_bound, double push_bound,
                                        const std::vector<int64_t>& batches,
                                        double preds_bound = 2e-2) {
  DenseModel fp32(card, cfg);
  cfg.precision = DensePrecision::kBf16;
  const std::vector<float> weights = fp32.parameters().values_to_host();
  const auto make_bf16 = [&] {
    setenv("GPUBOX_BF16_EMULATION", "1", 1);
    auto model = std::make_unique<DenseModel>(card, cfg);
    unsetenv("GPUBOX_BF16_EMULATION");
    model->parameters().set_values(weights);
    return model;
  };
  const std::unique_ptr<DenseModel> bf16 = make_bf16();
  ASSERT_EQ(bf16->precision(), DensePrecision::kBf16);
  std::mt19937_64 rng(seed);
  const auto relative_error = [](const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < b.size(); ++k) {
      diff += (a[k] - b[k]) * static_cast<double>(a[k] - b[k]);
      norm += b[k] * static_cast<double>(b[k]);
    }
    return std::sqrt(diff / norm);
  };
  for (const int64_t batch : batches) {
    SCOPED_TRACE("step of batch " + std::to_string(batch));
    const HostBatch h = make_field_batch(batch, cfg, rng);
    const CardBatch on_card(card, h, cfg.slots);
    struct Out {
      std::vector<float> preds, grads, push;
    };
    const auto run = [&](DenseModel& model) {
      auto push = card.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
      model.forward_backward(on_card.view, GradScales{1.0f / static_cast<float>(batch), 1.0f},
                             push.data());
      return Out{device::to_host(model.predictions(), h.batch, card.stream()),
                 model.parameters().grads_to_host(), device::to_host(push)};
    };
    const Out want = run(fp32), got = run(*bf16);
    if (batches.size() > 1) {  // the step's bits are a fresh model's: nothing read from before
      const Out fresh = run(*make_bf16());
      EXPECT_EQ(got.preds, fresh.preds);
      EXPECT_EQ(got.grads, fresh.grads);
      EXPECT_EQ(got.push, fresh.push);
    }
    for (int64_t i = 0; i < h.batch; ++i) {
      EXPECT_NEAR(got.preds[i], want.preds[i], preds_bound) << i;
    }
    ASSERT_EQ(got.grads.size(), want.grads.size());
    EXPECT_LT(relative_error(got.grads, want.grads), grads_bound);
    EXPECT_LT(relative_error(got.push, want.push), push_bound);
  }
}

// The same for one step of `batch` instances on fresh models.
inline void expect_bf16_near_fp32(device::Card& card, DenseModelConfig cfg, uint64_t seed,
                                  double grads_bound, double push_bound, int64_t batch = 64,
                                  double preds_bound = 2e-2) {
  expect_bf16_steps_near_fp32(card, std::move(cfg), seed, grads_bound, push_bound, {batch},
                              preds_bound);
}

}  // namespace gpubox::trainer::testing
