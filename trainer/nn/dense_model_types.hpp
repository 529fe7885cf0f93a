// Plain options of the dense model and its optimizer (host-only; no device headers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpubox::trainer {

enum class ModelKind {
  kDnn,       // PaddleRec DNN: pooled slots + dense features -> MLP (ReLU) -> 1 logit
  kWideDeep,  // kDnn + wide part (sum of embed_w over the instance's keys + linear on dense)
  kWide,      // the wide part alone plus a bias: a logistic regression (the baseline wide_deep
              // must beat)
};

struct DenseModelConfig {
  ModelKind kind = ModelKind::kDnn;
  int slots = 26;        // sparse slots
  int mf_dim = 8;        // embedx width (pull record = show, click, embed_w, embedx_w[mf_dim])
  bool use_cvm = false;  // adds log(show+1), log(click+1)-log(show+1) per slot
  int dense_dim = 13;    // dense features per instance
  std::vector<int> fc_sizes{512, 256, 128, 32};  // hidden layers (ReLU); a 1-wide output follows
  uint64_t seed = 0;  // initial weights: identical on every card for the same seed
};

enum class DenseOptimizerKind { kAdam, kSgd };

struct DenseOptimizerConfig {
  DenseOptimizerKind kind = DenseOptimizerKind::kAdam;
  float learning_rate = 0.001f;
  float beta1 = 0.9f;     // adam
  float beta2 = 0.999f;   // adam
  float epsilon = 1e-8f;  // adam
};

const char* to_string(ModelKind kind);
const char* to_string(DenseOptimizerKind kind);

}  // namespace gpubox::trainer
