// Plain options of the dense model and its optimizer (host-only; no device headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config_enums.hpp"

namespace gpubox::trainer {

// hyper_parameters.model: dnn, wide_deep, wide, deepfm, dcn_v2, fm, dcn, dlrm, xdeepfm, ffm or
// autoint (config_enums.hpp says what each is).
using ModelKind = config::ModelKind;
using config::kModelKindNames;

// hyper_parameters.dense_precision: fp32 or bf16 (config_enums.hpp says what each computes in).
using DensePrecision = config::DensePrecision;
using config::kDensePrecisionNames;

// hyper_parameters.dlrm_output: logit or softmax2 (config_enums.hpp).
using DlrmOutput = config::DlrmOutput;
using config::kDlrmOutputNames;

// hyper_parameters.dcn_structure: stacked or parallel (config_enums.hpp).
using DcnStructure = config::DcnStructure;
using config::kDcnStructureNames;

// The least probability a dropout mask keeps a unit with: DropoutMask holds it as a 32-bit
// threshold (a multiple of 2^-32), at 2^-20 at least 4096 of them, so the keep it draws is within
// 1.3e-4 relative of the one its scale 1/keep assumes (flen's (1-p)^3 at p 0.999, 4 of them, kept
// units 7% under-scaled). check_dnn_dropout refuses a rate whose hidden keep is below it.
inline constexpr double kMinDropoutKeep = 1.0 / 1048576.0;

// PaddleRec's Dropouts a hidden unit of `kind`'s DNN passes: after the Linear and the ReLU, flen's
// after its batch norm too (not built).
inline int dropouts_per_hidden_unit(ModelKind kind) { return kind == ModelKind::kFlen ? 3 : 2; }

// A hidden unit's keep (1-p)^dropouts, by products as MlpDropout builds it.
inline double dropout_hidden_keep(double p, int dropouts) {
  double keep = 1.0;
  for (int d = 0; d < dropouts; ++d) keep *= 1.0 - p;
  return keep;
}

struct DenseModelConfig {
  ModelKind kind = ModelKind::kDnn;
  int slots = 26;  // sparse slots
  int mf_dim = 8;  // embedx width (pull record = show, click, embed_w, embedx_w[mf_dim]; kFfm:
                   // one factor per field, (slots + dense_dim) x k)
  // Per slot (data order) when slots differ in embedx width (hyper_parameters.slot_dims; mf_dim
  // is then the records', the widest width class's); empty: every slot mf_dim wide.
  std::vector<int> slot_dims;
  bool use_cvm = false;  // adds log(show+1), log(click+1)-log(show+1) per slot
  int dense_dim = 13;    // dense features per instance
  std::vector<int> fc_sizes{512, 256, 128, 32};  // hidden layers (ReLU); a 1-wide output follows
  // hyper_parameters.dnn_batch_norm: a batch norm after every hidden layer's ReLU (Linear -> ReLU
  // -> BatchNorm1D, PaddleRec's MLPLayer; kDlrm: in the bottom MLP too); batch_norm.hpp.
  bool batch_norm = false;
  // hyper_parameters.dlrm_output (any network with an MLP; the config lets dlrm alone ask):
  // kSoftmax2 makes the MLP's last layer 2 wide, ReLU'd and (with batch_norm) normalised like the
  // hidden ones, its outputs u the two classes' logits: prediction softmax(u)[1] =
  // sigmoid(u1 - u0), loss the cross entropy (DenseModel).
  DlrmOutput dlrm_output = DlrmOutput::kLogit;
  // hyper_parameters.dnn_dropout: PaddleRec's Dropout(p) after every Linear and every ReLU of the
  // MLP's hidden layers (a hidden unit kept with probability (1-p)^2; flen's (1-p)^3, its net's
  // third after a batch norm), after deepfefm's and fat_deepffm's 1-wide DNN output and flen's
  // bi-interaction's layer; in training only (dropout.hpp). 0: none. Not with batch_norm.
  // fat_deepffm at p > 0 also learns PaddleRec's second, undropped bias (kFatDeepffmBiasBlock).
  float dnn_dropout = 0.0f;
  // The PS modes' trainer (PADDLE_TRAINER_ID), mixed into the dropout masks' seed: their threads'
  // cards are ranked 0.. on every trainer, and equal ranks would draw equal masks. 0 elsewhere (the
  // gpubox mode's ranks are global): the masks of the seed itself (dropout_trainer_seed).
  int dropout_trainer = 0;
  uint64_t seed = 0;  // initial weights: identical on every card for the same seed
  // Asked for; bf16 runs only where the card has bf16 GEMMs (DenseModel says which it uses).
  DensePrecision precision = DensePrecision::kFp32;
  // kDcnV2 and kDcn: cross layers. kDcnV2 only: their rank (0 = full), where the MLP meets
  // them (kDcn is always parallel) and DCN-Mix's experts per layer (0: no mixture; k >= 1: a
  // gated mixture of k experts of rank cross_rank).
  int cross_layers = 3;
  int cross_rank = 0;
  DcnStructure dcn_structure = DcnStructure::kStacked;
  int cross_experts = 0;
  // kDcnV2 and kDcn: the L2 penalty cross_l2 * sum of the cross weights' squares, per instance
  // (so the mean loss carries it once), as a gradient term.
  float cross_l2 = 0.0f;
  // kDlrm only: the bottom MLP's layers over the dense features; the last is as wide as a slot's
  // embedding (embed_w + mf_dim). The top MLP is fc_sizes.
  std::vector<int> bot_layer_sizes{512, 256, 64, 16};
  // kXdeepfm only: the CIN's feature maps per layer (xdeepfm_part.hpp). Its DNN is fc_sizes.
  std::vector<int> cin_layer_sizes{128, 32};
  // kAutoint only (autoint_part.hpp): the interacting layers' widths, their heads, the residual
  // projection, the 1 / sqrt(head width) scaling of the scores, and the first-order term (the wide
  // part). Its DNN is fc_sizes; empty: none (PaddleRec's fc_sizes: []).
  std::vector<int> attn_layer_sizes{64, 64, 64};
  int attn_heads = 2;
  bool attn_residual = true;
  bool attn_scaling = true;
  bool attn_use_wide = true;
  // kFlen only (flen_part.hpp): consecutive sparse slots per field group. Its DNN is fc_sizes.
  std::vector<int> flen_groups{13, 3, 6};
};

// hyper_parameters.optimizer.class: Adam, SGD or Adagrad.
using DenseOptimizerKind = config::DenseOptimizerKind;
using config::kDenseOptimizerKindNames;

// fat_deepffm's second bias (PaddleRec's FAT_DeepFFMLayer.bias): logit = drop(w.h + b) +
// first-order + bias, added after the DNN's dropped output and never dropped. Built only with
// dropout (dnn_dropout > 0): at p = 0 it would be a second bias on the sum w.h + b, redundant with
// b, so the net keeps its one bias and today's layout. A save keeps it in a dense block of this
// name (dense_state.hpp); an export folds it into b (evaluation has no dropout).
inline constexpr const char* kFatDeepffmBiasBlock = "fat_deepffm.bias";

// Where that bias lies in a model's flat dense parameters (DenseModel::undropped_bias), which it
// ends: [0, before) is the layout of the same net without it (at p = 0), whose last value is the
// DNN output's bias b (the export adds the bias to it), and `at` >= before.
struct UndroppedBias {
  std::size_t at = 0;      // its value's index
  std::size_t before = 0;  // the flat size without it
};

struct DenseOptimizerConfig {
  DenseOptimizerKind kind = DenseOptimizerKind::kAdam;
  float learning_rate = 0.001f;
  float beta1 = 0.9f;                // adam
  float beta2 = 0.999f;              // adam
  float epsilon = 1e-8f;             // adam, adagrad
  float initial_accumulator = 0.0f;  // adagrad: the squared-gradient sum's start
};

}  // namespace gpubox::trainer
