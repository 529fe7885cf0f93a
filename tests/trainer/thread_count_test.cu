// The bits of a seeded step and the card's thread count (cpu backend: the OpenMP threads a card's
// kernels and GEMMs run on, Card::activate). The portable kernels and Blas::sgemv sum in orders
// fixed by the shapes: the same bits on 1, 2 and 3 threads. oneDNN's GEMMs partition by the
// thread count, and their bits change with it; under GPUBOX_REPRODUCIBLE_GEMMS=1 they run on one
// thread: then every network's forward_backward of a seeded batch from the same weights (loss,
// predictions, every dense and pushed gradient) has the same bits on cards of 1, 2 and 3 threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

// GPUBOX_REPRODUCIBLE_GEMMS=1 for the Blas made while this lives.
struct ReproducibleGemms {
  ReproducibleGemms() { setenv("GPUBOX_REPRODUCIBLE_GEMMS", "1", 1); }
  ~ReproducibleGemms() { unsetenv("GPUBOX_REPRODUCIBLE_GEMMS"); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first index where a and b differ, for the message.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return "sizes " + std::to_string(a.size()) + ", " + std::to_string(b.size());
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return "[" + std::to_string(i) + "]: " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
    }
  }
  return "none";
}

struct StepBits {
  std::vector<float> loss, preds, grads, push;
};

// One forward_backward of `cfg`'s model from `weights` on a card of `threads` threads.
StepBits step_on(const DenseModelConfig& cfg, const std::vector<float>& weights,
                 const testing::HostBatch& h, int threads) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  DenseModel model(card, cfg);
  model.parameters().set_values(weights);
  const testing::CardBatch on_card(card, h, cfg.slots);
  auto push = card.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  const auto scale = 1.0f / static_cast<float>(h.batch);
  const double loss = model.forward_backward(on_card.view, GradScales{scale, 1.0f}, push.data());
  return StepBits{{static_cast<float>(loss)},
                  device::to_host(model.predictions(), h.batch, card.stream()),
                  model.parameters().grads_to_host(),
                  device::to_host(push)};
}

struct Network {
  std::string name;
  DenseModelConfig cfg;
  int batch = 1536;
};

// Every network, at shapes where each sum over the batch (1536 instances) is long against its
// output. autoint's batch is 1537: on a card of one thread its attention runs over chunks of 8
// instances (autoint.cu attention_chunk; the last is 1), on cards of 2 and 3 threads over the
// whole batch, where its row kernels split 15,370 rows (30,740 softmax rows) over the threads.
// Those kernels take 4 rows at once (rows<4>, the rest rows<1>); over 1536 x 10 fields every
// split point would be a multiple of 4, over 1537 x 10 none is (7,685; 5,123 and 10,246; softmax
// 15,370; 10,246 and 20,493), so rows near them go through the other form than on one thread.
std::vector<Network> networks() {
  DenseModelConfig base;
  base.slots = 6;
  base.mf_dim = 8;
  base.dense_dim = 4;
  base.fc_sizes = {64, 32};
  base.seed = 7;
  const auto with = [&](const char* name, ModelKind kind, auto&& edit) {
    DenseModelConfig cfg = base;
    cfg.kind = kind;
    edit(cfg);
    return Network{name, cfg, kind == ModelKind::kAutoint ? 1537 : 1536};
  };
  const auto none = [](DenseModelConfig&) {};
  return {
      with("dnn", ModelKind::kDnn, [](DenseModelConfig& c) { c.use_cvm = true; }),
      with("wide_deep", ModelKind::kWideDeep, none),
      with("deepfm", ModelKind::kDeepFm, none),
      with("fm", ModelKind::kFm, none),
      with("dcn_v2", ModelKind::kDcnV2, [](DenseModelConfig& c) { c.cross_layers = 2; }),
      with("dcn", ModelKind::kDcn, [](DenseModelConfig& c) { c.cross_layers = 2; }),
      with("dlrm", ModelKind::kDlrm,
           [](DenseModelConfig& c) {
             c.bot_layer_sizes = {16, 9};
           }),
      with("xdeepfm", ModelKind::kXdeepfm,
           [](DenseModelConfig& c) {
             c.cin_layer_sizes = {8, 4};
           }),
      with("ffm", ModelKind::kFfm, [](DenseModelConfig& c) { c.mf_dim = 10 * 2; }),
      with("deepfefm", ModelKind::kDeepFefm, none),
      with("autoint", ModelKind::kAutoint,
           [](DenseModelConfig& c) {
             c.attn_layer_sizes = {8, 8};
           }),
      with("flen", ModelKind::kFlen,
           [](DenseModelConfig& c) {
             c.flen_groups = {2, 2, 2};
           }),
      with("fat_deepffm", ModelKind::kFatDeepffm, [](DenseModelConfig& c) { c.mf_dim = 10 * 2; }),
  };
}

// Seeded weights in [-0.5, 0.5) for `cfg`'s model.
std::vector<float> random_weights(const DenseModelConfig& cfg, std::mt19937_64& rng) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, 1);
  cards.card(0).activate();
  DenseModel model(cards.card(0), cfg);
  return testing::random_vector(model.parameters().values_to_host().size(), rng, -0.5f, 0.5f);
}

// Loss, predictions, dense and pushed gradients of `many` against `one`, bit for bit.
void expect_same_step(const StepBits& one, const StepBits& many, const std::string& what) {
  EXPECT_TRUE(same_bits(one.loss, many.loss)) << what << ": loss";
  EXPECT_TRUE(same_bits(one.preds, many.preds))
      << what << ": predictions " << first_difference(one.preds, many.preds);
  EXPECT_TRUE(same_bits(one.grads, many.grads))
      << what << ": dense gradients " << first_difference(one.grads, many.grads);
  EXPECT_TRUE(same_bits(one.push, many.push))
      << what << ": pushed gradients " << first_difference(one.push, many.push);
}

TEST(ThreadCount, UnderReproducibleGemmsEveryNetworksStepHasTheSameBitsOnOneTwoAndThreeThreads) {
  const ReproducibleGemms reproducible;
  for (const Network& net : networks()) {
    SCOPED_TRACE(net.name);
    std::mt19937_64 rng(11);
    const testing::HostBatch h = testing::make_field_batch(net.batch, net.cfg, rng);
    const std::vector<float> weights = random_weights(net.cfg, rng);
    const StepBits one = step_on(net.cfg, weights, h, 1);
    for (const int threads : {2, 3}) {
      expect_same_step(one, step_on(net.cfg, weights, h, threads),
                       std::to_string(threads) + " threads");
    }
  }
}

// autoint's attention at a batch of 50: on a card of one thread in chunks of 8 instances (six,
// then 2; autoint.cu attention_chunk), on a card of 7 threads in one chunk of the whole batch
// (as on any card of several threads; and 8 x 7 > 50 were such cards chunked per thread): the
// same bits, forward and backward.
TEST(ThreadCount, UnderReproducibleGemmsAutointsAttentionInChunksHasTheBitsOfOneChunk) {
  const ReproducibleGemms reproducible;
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kAutoint;
  cfg.slots = 6;
  cfg.mf_dim = 8;
  cfg.dense_dim = 4;
  cfg.fc_sizes = {16};
  cfg.attn_layer_sizes = {8, 8};
  cfg.seed = 7;
  std::mt19937_64 rng(5);
  const testing::HostBatch h = testing::make_field_batch(50, cfg, rng);
  const std::vector<float> weights = random_weights(cfg, rng);
  expect_same_step(step_on(cfg, weights, h, 1), step_on(cfg, weights, h, 7),
                   "chunks of 8 against one of 50");
}

struct BlasShape {
  bool gemv, trans;
  int64_t m, n, k;
};

// y of one sgemv (A [m x n]) or C of one sgemm (op(A) [m x k], stored [k x m] when `trans`; B
// [k x n]) on a card of `threads` threads, the operands seeded alike.
std::vector<float> blas_on(int threads, const BlasShape& s) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  std::mt19937_64 rng(3);
  const auto t = s.trans ? Transpose::kYes : Transpose::kNo;
  const auto on_card = [&](int64_t n) {
    return device::to_device(testing::random_vector(static_cast<std::size_t>(n), rng),
                             card.memory(), card.stream());
  };
  const auto a = on_card(s.m * (s.gemv ? s.n : s.k));
  const auto b = on_card(s.gemv ? (s.trans ? s.m : s.n) : s.k * s.n);
  auto c = on_card(s.gemv ? (s.trans ? s.n : s.m) : s.m * s.n);
  if (s.gemv) {
    blas.sgemv(t, s.m, s.n, 0.5f, a.data(), s.n, b.data(), 0.25f, c.data());
  } else {
    blas.sgemm(t, Transpose::kNo, s.m, s.n, s.k, 0.5f, a.data(), s.trans ? s.m : s.k, b.data(), s.n,
               0.25f, c.data(), s.n);
  }
  return device::to_host(c);
}

// Each call's result on 2 and 3 threads against 1 thread's, bit for bit.
void expect_same_bits_on_more_threads(const std::vector<BlasShape>& shapes) {
  for (const BlasShape& s : shapes) {
    const std::string what = std::string(s.gemv ? "sgemv" : "sgemm") + (s.trans ? " T " : " N ") +
                             std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                             std::to_string(s.k);
    const std::vector<float> one = blas_on(1, s);
    for (const int threads : {2, 3}) {
      const std::vector<float> many = blas_on(threads, s);
      EXPECT_TRUE(same_bits(one, many))
          << what << " on " << threads << " threads: " << first_difference(one, many);
    }
  }
}

// Short outputs over long sums (the wide part's dense gradient, bias-like sums over the batch,
// fat_deepffm's dense_w chunks), where oneDNN's gemv split the sum over its threads.
TEST(ThreadCount, SgemvHasTheSameBitsOnOneTwoAndThreeThreads) {
  expect_same_bits_on_more_threads({{true, true, 4096, 13, 0},
                                    {true, true, 64, 4563, 0},
                                    {true, true, 2048, 1, 0},
                                    {true, true, 1000, 300, 0},
                                    {true, false, 4096, 351, 0},
                                    {true, false, 13, 5000, 0}});
}

// Weight- and bias-gradient shapes (k long against m n) and others whose bits oneDNN changed
// between 1, 2 and 3 threads when this was written.
TEST(ThreadCount, UnderReproducibleGemmsSgemmHasTheSameBitsOnOneTwoAndThreeThreads) {
  const ReproducibleGemms reproducible;
  expect_same_bits_on_more_threads({{false, true, 13, 64, 4096},
                                    {false, true, 512, 256, 512},
                                    {false, true, 32, 1, 4096},
                                    {false, false, 1, 256, 1536},
                                    {false, false, 512, 13, 64},
                                    {false, false, 300, 300, 300}});
}

}  // namespace
}  // namespace gpubox::trainer
