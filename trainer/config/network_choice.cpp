#include "trainer/config/network_choice.hpp"

namespace gpubox::trainer {

namespace {

// What each built network does otherwise than PaddleRec's, said on its start line.
constexpr char kDeepFefmDifferences[] =
    "a dense feature's field vector is its value times a learned vector (PaddleRec's net "
    "looks up a key quantised from the value); the dense features' first-order weights "
    "start at 0 (PaddleRec's at a truncated normal); its field vectors are "
    "sparse_feature_dim - 1 wide, the key's first-order weight in the same row "
    "(PaddleRec's sparse_feature_dim, the first-order weights a second table); {dropout}; "
    "no L2 decay "
    "(PaddleRec's 1e-6 on the embeddings and first-order weights, 1e-7 on "
    "the field-pair matrices and the DNN); its embedding rows step only when their key "
    "is in the batch (PaddleRec's tables are dense, sparse=False, so its Adam moves "
    "every row every step, lazy_mode notwithstanding)";

constexpr char kDeepFmDifferences[] =
    "its FM pairs the slots' embeddings only (PaddleRec's also pairs the dense features' "
    "learned vectors x_i v_i, with the slots and with each other); its embeddings are "
    "sparse_feature_dim - 1 wide, the key's first-order weight in the same row "
    "(PaddleRec's sparse_feature_dim wide, the first-order weights a second table); its "
    "dnn reads each slot's row and the dense values (PaddleRec's reads the 39 fields' "
    "vectors: x_i v_i, a linear function of x_i as the raw value is to the first layer)";

constexpr char kAutointDifferences[] =
    "a dense field's index and a sparse field's value are not read (PaddleRec's sample "
    "has 0 and 1 only); its dnn (fc_sizes) has a ReLU after every layer and, with "
    "hyper_parameters.dnn_batch_norm=true, a batch norm after it, where PaddleRec's "
    "normalises before the ReLU and has none after the first layer; the attention "
    "weights start at normals of Xavier's variance (PaddleRec's Xavier uniform), the "
    "logit's bias and the dense features' first-order weights at 0 (PaddleRec's output "
    "bias at N(0, 1), its feature_bias rows at N(0, 0.001^2)); PaddleRec's net registers a "
    "Dropout per DNN layer and never calls it: no dropout in its folder, as GPUBox's "
    "(hyper_parameters.dnn_dropout 0)";

constexpr char kDcnV2Differences[] =
    "its cross network's input x0 is the pooled slots and the dense values as they are "
    "(PaddleRec's passes the dense values through a Linear to dense_input_dim x "
    "sparse_feature_dim values first) and no L2 decay (neither is built: without them, "
    "and before dropout was built, the held-out AUC after epoch 2 was 0.0011 under "
    "Paddle's, the mean of 3 seeds at Paddle's step count, docs/bench/h164.md); {dropout}; "
    "l2_reg_cross is trained as "
    "cross_l2 "
    "(PaddleRec's dcn_v2 reads it and adds nothing); its DCN-Mix weights start at "
    "N(0, 1/width) (V, the gate) and N(0, 1/rank) (C, U), PaddleRec's at Xavier normals "
    "over the experts' stacked 3-D shapes (std sqrt(2 / (rank (width + experts))) for "
    "U and V, sqrt(2 / (rank (rank + experts))) for C: 11 to 28 times smaller); its "
    "embedding rows step only when their key is in the batch (PaddleRec's Adam has no "
    "lazy_mode: every row's moments decay and move it every step; GPUBox's card tier, as "
    "Paddle's PSGPU, steps the batch's rows only); its clip by global norm "
    "(hyper_parameters.optimizer.clip_by_norm, the folder's 10 as PaddleRec's trainer) is "
    "built in gpubox and Collective mode only (the parameter-server modes train without it)";

constexpr char kDcnDifferences[] =
    "its cross layers share one weight vector and one bias (PaddleRec's net reuses "
    "layer_w and layer_b in every layer; GPUBox's has one pair per layer, as the DCN "
    "paper); its cross L2 is the batch's sum of squares of x_l * w with coefficient 1 "
    "(l2_reg_cross read unused; GPUBox: cross_l2 * |w|^2 per instance); its cross "
    "weights and bias start at a normal truncated at 2 std of std 0.1 / "
    "sqrt(sparse_feature_dim) (GPUBox: weights N(0, 1/width), bias 0), its output "
    "layer's at N(0, 1/(fc_sizes' last + slots + dense)) (GPUBox: N(0, 1/fan_in) per "
    "part)";

constexpr char kDlrmDifferences[] =
    "its batch norm (hyper_parameters.dnn_batch_norm, on in PaddleRec's folder) "
    "follows the ReLU of every bottom layer and every top layer, as PaddleRec's, the "
    "2-wide output layer's too with hyper_parameters.dlrm_output softmax2 (PaddleRec's "
    "output, which its top_layer_sizes' last 2 selects; with logit GPUBox ends in one "
    "linear logit); PaddleRec's net steps every parameter with "
    "Adam (lazy_mode) at optimizer.learning_rate whatever optimizer.class says "
    "(static_model.py, dygraph_model.py), and so does GPUBox in its folder with "
    "softmax2 (elsewhere, and with logit, it follows optimizer.class: Adam at 0.1 "
    "diverges the one linear logit on the folder's batches of 2, and stalls the network "
    "without batch norm: held-out AUC 0.5); its weights "
    "start at normals truncated at "
    "2 std (GPUBox: untruncated, the same std), its embedding rows at a truncated "
    "N(0, 1)";

constexpr char kFlenDifferences[] =
    "{dropout}; batch norm only with "
    "hyper_parameters.dnn_batch_norm=true, then after the ReLU of every DNN layer as "
    "PaddleRec's, but not after the bi-interaction's layer; its weights start "
    "at normals of Xavier's variance (PaddleRec's Xavier uniform); the embeddings step "
    "under hyper_parameters.sparse_optimizer (PaddleRec's under its dense Adagrad)";

constexpr char kFatDeepffmDifferences[] =
    "a field's factor has sparse_feature_dim - 1 values (PaddleRec's sparse_feature_dim, "
    "ffm's rows); no L2 decay; {dropout}; CEN's and the DNN's weights start at "
    "N(0, 1/fan_in) (PaddleRec's CEN: "
    "Paddle's default), the embeddings by the sparse rule";

// The {dropout} of a network whose PaddleRec net drops its DNN: what GPUBox draws at
// hyper_parameters.dnn_dropout > 0 (`on`), and at 0 that it draws none (`off`).
struct DropoutClause {
  config::ModelKind model;
  const char* on;
  const char* off;
};
constexpr DropoutClause kDropoutClauses[] = {
    {config::ModelKind::kDeepFefm,
     "its dropout (hyper_parameters.dnn_dropout, the folder's 0.2 after every DNN Linear and "
     "ReLU and the DNN's output) draws one mask per hidden unit, kept with probability (1-p)^2, "
     "where PaddleRec's two Dropouts draw two of 1-p (the same distribution)",
     "no dropout (hyper_parameters.dnn_dropout 0; PaddleRec's 0.2 after every DNN Linear and "
     "ReLU, the output's too)"},
    {config::ModelKind::kDcnV2,
     "its dropout (hyper_parameters.dnn_dropout, the folder's 0.5 after every DNN Linear and "
     "ReLU) draws one mask per hidden unit, kept with probability (1-p)^2, where PaddleRec's "
     "two Dropouts draw two of 1-p (the same distribution)",
     "no dropout (hyper_parameters.dnn_dropout 0; PaddleRec's 0.5 after every DNN Linear and "
     "ReLU)"},
    {config::ModelKind::kFlen,
     "its dropout (hyper_parameters.dnn_dropout, the folder's 0.2) draws one mask per DNN hidden "
     "unit, kept with probability (1-p)^3, for PaddleRec's three Dropouts after the Linear, the "
     "ReLU and the batch norm (the norm not built: with hyper_parameters.dnn_batch_norm the "
     "folder's rate gives way to 0, and a rate set is refused), and one of 1-p after the "
     "bi-interaction's layer's ReLU, where PaddleRec's follows its batch norm",
     "no dropout (hyper_parameters.dnn_dropout 0; PaddleRec's 0.2 after its DNN's Linear, ReLU "
     "and batch norm and after the bi-interaction's layer)"},
    {config::ModelKind::kFatDeepffm,
     "its dropout (hyper_parameters.dnn_dropout, the folder's 0.5 after every DNN Linear and "
     "ReLU, the output's too) draws one mask per hidden unit, kept with probability (1-p)^2, "
     "drops the DNN's output with its bias, and adds PaddleRec's second, undropped bias "
     "(fat_deepffm.bias) after it: drop(w.h + b) + first-order + bias, as PaddleRec's logit",
     "no dropout (hyper_parameters.dnn_dropout 0; PaddleRec's 0.5 after every DNN Linear and "
     "ReLU, the output's too), and no second bias: undropped, PaddleRec's separate bias and the "
     "DNN's output bias are one sum, which the output bias stands for"}};

std::string with_dropout_clause(std::string text, config::ModelKind model, double dnn_dropout) {
  const std::string mark = "{dropout}";
  const std::size_t at = text.find(mark);
  if (at == std::string::npos) return text;
  for (const DropoutClause& clause : kDropoutClauses) {
    if (clause.model == model) {
      return text.replace(at, mark.size(), dnn_dropout > 0.0 ? clause.on : clause.off);
    }
  }
  return text;
}

std::string differences_text(config::ModelKind model) {
  switch (model) {
    case config::ModelKind::kDeepFefm:
      return kDeepFefmDifferences;
    case config::ModelKind::kDeepFm:
      return kDeepFmDifferences;
    case config::ModelKind::kAutoint:
      return kAutointDifferences;
    case config::ModelKind::kDcnV2:
      return kDcnV2Differences;
    case config::ModelKind::kDcn:
      return kDcnDifferences;
    case config::ModelKind::kDlrm:
      return kDlrmDifferences;
    case config::ModelKind::kFlen:
      return kFlenDifferences;
    case config::ModelKind::kFatDeepffm:
      return kFatDeepffmDifferences;
    default:
      return "";
  }
}

}  // namespace

std::string differences_from_paddlerec(config::ModelKind model, double dnn_dropout) {
  return with_dropout_clause(differences_text(model), model, dnn_dropout);
}

}  // namespace gpubox::trainer
