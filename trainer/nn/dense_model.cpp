#include "trainer/nn/dense_model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/config/network_shape.hpp"
#include "common/enum_names.hpp"
#include "common/error.hpp"
#include "common/logging.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "trainer/nn/activation_layout.hpp"
#include "trainer/nn/bf16_speed.hpp"

namespace gpubox::trainer {

namespace {
ElementType element_type(DensePrecision precision) {
  return precision == DensePrecision::kBf16 ? ElementType::kBf16 : ElementType::kF32;
}

// dcn: vector cross layers beside the MLP; dcn_v2: matrix layers or DCN-Mix, stacked or
// parallel, their GEMMs reading bf16 operands in bf16 (`bf16`; CrossNet keeps dcn's fp32).
CrossSpec cross_spec(const DenseModelConfig& config, int input_dim, bool bf16) {
  CrossSpec spec;
  spec.bf16 = bf16;
  spec.dim = input_dim;
  spec.ld = activation_ld(input_dim);
  spec.layers = config.cross_layers;
  if (config.kind == ModelKind::kDcn) {
    spec.kind = CrossKind::kVector;
    spec.parallel = true;
    return spec;
  }
  spec.kind = config.cross_experts > 0 ? CrossKind::kMixture : CrossKind::kMatrix;
  spec.rank = config.cross_rank;
  spec.experts = config.cross_experts;
  spec.parallel = config.dcn_structure == DcnStructure::kParallel;
  return spec;
}
}  // namespace

DenseModel::DenseModel(device::Card& card, const DenseModelConfig& config)
    : card_(&card),
      config_(config),
      blas_(card),
      precision_(config.precision),
      params_(card),
      pool_(config.slot_dims.empty()
                ? SlotSumPool(config.slots, config.mf_dim, config.use_cvm)
                : SlotSumPool(card, config.slot_dims, config.mf_dim, config.use_cvm)) {
  GPUBOX_EXPECTS(
      config.slot_dims.empty() || static_cast<int>(config.slot_dims.size()) == config.slots,
      "dense model: ", config.slot_dims.size(), " slot widths for ", config.slots, " slots");
  GPUBOX_EXPECTS(config.dense_dim >= 0, "dense_input_dim must be >= 0, got ", config.dense_dim);
  // wide, fm and ffm: the first-order terms and a bias (+ the pairwise term), no MLP.
  // autoint: its DNN only with fc_sizes (PaddleRec's fc_sizes: [] has none).
  const bool autoint = config.kind == ModelKind::kAutoint;
  const bool has_mlp = gpubox::config::has_dnn(config.kind, config.fc_sizes.empty());
  const bool dcn = config.kind == ModelKind::kDcnV2 || config.kind == ModelKind::kDcn;
  // dlrm, xdeepfm, deepfefm, autoint, fat_deepffm: a field part builds the MLP's input
  // (field_part.hpp).
  const FieldPartKind* field = find_field_part(config.kind);
  fp32_part_ = field ? field->fp32_part : nullptr;
  choose_precision(fp32_part_, has_mlp);
  activation_type_ = element_type(precision_);
  // The cross network's rows (CrossNet; in bf16 dcn_v2's GEMMs read bf16 roundings of them) and
  // the CIN, FEFM and attention parts are fp32 over fp32 rows; in bf16 the MLP beside or after them
  // reads a bf16 copy of its input (mlp_reads_bf16_copy).
  x0_type_ = dcn || fp32_part_ ? ElementType::kF32 : activation_type_;
  // With a field part the pool writes the slots alone; the part reads the dense features.
  const int input_dim = pool_.out_dim() + (field ? 0 : config.dense_dim);
  x0_ld_ = activation_ld(input_dim);
  d_pooled_ld_ = pool_.out_dim();
  if (field) {
    field_ = field->make(FieldPartArgs{card, params_, blas_, pool_, config, activation_type_});
  }
  if (dcn) {
    cross_ = std::make_unique<CrossNet>(
        card, params_, cross_spec(config, input_dim, activation_type_ == ElementType::kBf16));
  }
  if (has_mlp) add_mlp(input_dim);
  // flen: the MLP over the pooled slots (the dnn's input rows) and its bi-interaction beside it.
  if (config.kind == ModelKind::kFlen) {
    flen_ = std::make_unique<FlenPart>(card, params_, pool_, config.flen_groups);
  }
  // dnn, dcn, dlrm and flen have no first-order term; autoint has it with use_wide; fat_deepffm's
  // is its part's (the attended field-aware vectors summed).
  if (config.kind != ModelKind::kDnn && !dcn && config.kind != ModelKind::kDlrm && !flen_ &&
      config.kind != ModelKind::kFatDeepffm && (!autoint || config.attn_use_wide)) {
    wide_ = std::make_unique<WidePart>(params_, pool_, config.dense_dim);
  }
  if (config.kind == ModelKind::kDeepFm || config.kind == ModelKind::kFm) {
    fm_ = std::make_unique<FmPart>(pool_);
  }
  if (config.kind == ModelKind::kFfm) {
    ffm_ = std::make_unique<FfmPart>(params_, pool_, config.dense_dim);
  }
  GPUBOX_EXPECTS(d_pooled_ld_ == pool_.out_dim() || !(flen_ || ffm_ || field_),
                 "the pooled gradient's rows are padded, which flen's, ffm's and the field parts' "
                 "backward do not read");
  if (!has_mlp) wide_bias_ = params_.add("wide.bias", 1, ParamInit::kZero);
  add_dropout();
  add_undropped_bias();
  if (activation_type_ == ElementType::kBf16) params_.keep_bf16_copy();
  params_.finalize(config.seed);
  hidden_.resize(layers_.size());
  normed_.resize(norms_.size());
  for (auto* buffer : {&x0_, &dz_a_, &dz_b_}) *buffer = card.make_buffer<char>(0);
  mlp_input_bf16_ = card.make_buffer<Bf16>(0);
  for (auto& buffer : hidden_) buffer = card.make_buffer<char>(0);
  for (auto& buffer : normed_) buffer = card.make_buffer<char>(0);
  for (auto* buffer : {&logits_, &preds_, &dlogits_, &d_pooled_, &ones_}) {
    *buffer = card.make_buffer<float>(0);
  }
  loss_partials_ = card.make_buffer<double>(0);
  status_ = card.make_buffer<DenseStepStatus>(1);
  host_status_ = device::pinned_buffer<DenseStepStatus>(1);
}

// bf16 falls back to fp32 where there is no MLP or where the card has no bf16 GEMMs; card 0 says
// why, and, where bf16 runs beside a part that computes in fp32 (`fp32_part` names it), that the
// MLP reads the part's rows rounded; where bf16 runs in hardware, card 0 measures once whether
// its bf16 GEMMs outrun fp32's and warns when they do not (bf16_speed.hpp). The precision asked may
// come from hyper_parameters.dense_precision, an export's MANIFEST or gpubox_serve's --precision:
// the lines name none of them.
void DenseModel::choose_precision(const char* fp32_part, bool has_mlp) {
  if (precision_ != DensePrecision::kBf16) return;
  const bool say = card_->local_index() == 0;
  constexpr const char* kAsked = "the dense net was asked to compute in bf16, but ";
  if (!has_mlp) {
    // bf16 is the MLP's GEMMs; the first-order and pairwise terms are fp32.
    precision_ = DensePrecision::kFp32;
    if (say) {
      GPUBOX_LOG(WARNING) << kAsked << name_of(kModelKindNames, config_.kind)
                          << " has no MLP (bf16 is the MLP's GEMMs): the dense net runs in fp32";
    }
  } else if (blas_.bf16() == Bf16Support::kNone) {
    precision_ = DensePrecision::kFp32;
    if (say) {
      GPUBOX_LOG(WARNING) << kAsked << "this card (" << blas_.isa()
                          << ") has no bf16 GEMMs in hardware (AVX512-BF16 or AMX on a CPU, sm_80 "
                          << "or newer on a GPU): the dense net runs in fp32";
    }
  } else if (say && blas_.bf16() == Bf16Support::kHardware) {
    const std::string slower = bf16_speed_warning(bf16_gemm_speedup(blas_), blas_.isa());
    if (!slower.empty()) GPUBOX_LOG(WARNING) << "the dense net computes in bf16, but " << slower;
  }
  if (precision_ == DensePrecision::kBf16 && fp32_part && say) {
    // The CIN's (the FEFM's, the attention's) GEMMs and elementwise products are fp32
    // (XdeepfmPart, DeepfefmPart, AutointPart, FatDeepffmPart); the MLP reads a bf16 copy of the
    // part's rows and hands back an fp32 gradient, as beside the cross networks.
    GPUBOX_LOG(INFO) << "the dense net computes in bf16: " << name_of(kModelKindNames, config_.kind)
                     << "'s " << fp32_part << " computes in fp32; the MLP reads its rows rounded "
                     << "to bf16";
  }
}

// The fc layers and the logit layer, over the first layer's input rows (`input_dim` columns), the
// stacked cross network's output or the field part's rows.
void DenseModel::add_mlp(int input_dim) {
  const int64_t first_ld = field_ ? field_->dnn_ld() : x0_ld_;
  // stacked dcn_v2: the first layer reads the cross network's output, and its input gradient is
  // wanted for every column (the cross network's backward takes it, still scaled).
  const bool stacked = cross_ && !cross_->parallel();
  const std::size_t count = config_.fc_sizes.size() + 1;
  const bool two_class_output = config_.dlrm_output == DlrmOutput::kSoftmax2;
  layers_.reserve(count);
  int in = field_ ? field_->dnn_in() : input_dim;
  for (std::size_t l = 0; l < count; ++l) {
    const bool last = l + 1 == count;
    LinearGemmSpec spec;
    spec.name = "fc_" + std::to_string(l);
    spec.in = in;
    // A two-class output is a hidden layer of 2 (ReLU, its norm): PaddleRec's MLPLayer.
    const bool logit = last && !two_class_output;
    spec.out = last ? (two_class_output ? 2 : 1) : config_.fc_sizes[l];
    spec.input = activation_type_;
    spec.output = logit ? ElementType::kF32 : activation_type_;  // the logit is fp32
    spec.dx = l == 0 ? ElementType::kF32 : activation_type_;     // the pooled gradient too
    spec.relu = !logit;
    spec.input_is_relu = l > 0 && !config_.batch_norm;  // a norm's output is not masked
    // Dropout rewrites a hidden output after its forward (add_dropout), the next layer's input.
    spec.output_rewritten = !last && config_.dnn_dropout != 0.0f;
    spec.input_rewritten = spec.input_is_relu && config_.dnn_dropout != 0.0f;
    // The first layer's input gradient is wanted for the pooled slots only (every column of
    // the cross network's output); with a field part, for the columns it hands back (its fields'
    // embeddings, not the cvm columns behind them; dlrm: all of R).
    spec.dx_cols = l == 0 && !stacked ? pool_.out_dim() : in;
    if (l == 0 && field_) spec.dx_cols = field_->dnn_dx_cols();
    if (l == 0) first_dx_wanted_ = spec.dx_cols;
    if (l == 0 && !stacked && !field_ && config_.kind != ModelKind::kFlen) {
      // Straight into d_pooled_, over the columns the GEMM runs fastest (the dense features'
      // first few beside the pooled ones: computed, not read); d_pooled_'s rows hold them. Every
      // part that reads or adds to d_pooled_ here takes its stride (flen's does not).
      spec.dx_cols = fast_dx_cols(spec.dx_cols, in);
      d_pooled_ld_ = spec.dx_cols;
    }
    spec.x_ld = l == 0 ? first_ld : activation_ld(in);
    spec.y_ld = activation_ld(spec.out);
    spec.dz_ld = activation_ld(spec.out);
    spec.dx_ld = l == 0 ? (stacked || field_ ? first_ld : d_pooled_ld_) : activation_ld(in);
    layers_.emplace_back(params_, blas_, spec);
    if (!logit) add_norm(spec);
    in = spec.out;
  }
}

// PaddleRec's DNNs drop every hidden layer's output; deepfefm's and fat_deepffm's their 1-wide
// output too (their DNN's last Linear is followed by the Dropout as well); flen's a third time
// after its batch norm (not built: three Dropouts on one ReLU output) and its bi-interaction's
// ReLU'd layer (after a batch norm not built either; FlenPart applies the side mask).
void DenseModel::add_dropout() {
  GPUBOX_EXPECTS(config_.dnn_dropout == 0.0f || !config_.batch_norm,
                 "hyper_parameters.dnn_dropout with hyper_parameters.dnn_batch_norm is not built "
                 "(the normalised output is no ReLU output: its mask would have to be kept)");
  MlpDropoutShape shape;
  shape.hidden = layers_.empty() ? 0 : static_cast<int>(layers_.size()) - 1;
  shape.hidden_dropouts = dropouts_per_hidden_unit(config_.kind);
  shape.output = !layers_.empty() && !two_class() &&
                 (config_.kind == ModelKind::kDeepFefm || config_.kind == ModelKind::kFatDeepffm);
  shape.side = flen_ != nullptr;
  dropout_ = std::make_unique<MlpDropout>(
      *card_, config_.dnn_dropout, dropout_trainer_seed(config_.seed, config_.dropout_trainer),
      shape);
}

// Registered last of the trained blocks, so that the net's layout at p = 0 is its prefix (the save
// keeps it apart, the export folds it: UndroppedBias).
void DenseModel::add_undropped_bias() {
  if (config_.kind != ModelKind::kFatDeepffm || !dropout_->drops_output()) return;
  // The export adds this bias to the last value of the layout without it: the DNN output's bias.
  const std::size_t before = params_.size();
  GPUBOX_EXPECTS(params_.blocks().at(layers_.back().bias_block()).offset + 1 == before,
                 "fat_deepffm's layout must end with the DNN output's bias before ",
                 kFatDeepffmBiasBlock, " (the export folds it there)");
  undropped_bias_ = params_.add(kFatDeepffmBiasBlock, 1, ParamInit::kZero);
  undropped_bias_before_ = before;
}

std::optional<UndroppedBias> DenseModel::undropped_bias() const {
  if (undropped_bias_ == kNoBlock) return std::nullopt;
  return UndroppedBias{params_.blocks().at(undropped_bias_).offset, undropped_bias_before_};
}

void DenseModel::add_norm(const LinearGemmSpec& layer) {
  if (!config_.batch_norm) return;
  BatchNormSpec norm;
  norm.name = layer.name + ".bn";
  norm.cols = layer.out;
  norm.x_ld = norm.y_ld = norm.grad_ld = layer.y_ld;
  norm.type = layer.output;
  norms_.emplace_back(*card_, params_, norm);
}

double DenseModel::flops_per_example() const {
  double macs = 0.0;
  for (const Linear& layer : layers_) {
    // forward X W and weight gradient X^T dZ over every input, input gradient dZ W^T over the
    // dX columns read (the first layer's GEMM may compute a few more: not the model's work).
    const int dx_cols = &layer == &layers_.front() ? first_dx_wanted_ : layer.spec().dx_cols;
    macs += static_cast<double>(layer.out()) * (2.0 * layer.in() + dx_cols);
  }
  return 2.0 * macs + (cross_ ? cross_->flops_per_example() : 0.0) +
         (field_ ? field_->flops_per_example() : 0.0) + (ffm_ ? ffm_->flops_per_example() : 0.0) +
         (flen_ ? flen_->flops_per_example() : 0.0);
}

void DenseModel::reserve(int64_t batch) {
  GPUBOX_EXPECTS(batch >= 0, "negative batch ", batch);
  const auto n = static_cast<std::size_t>(batch);
  const std::size_t act = element_bytes(activation_type_);
  x0_.resize_discard(n * x0_ld_ * element_bytes(x0_type_));
  if (mlp_reads_bf16_copy()) mlp_input_bf16_.resize_discard(n * mlp_copy_rows().ld);
  std::size_t widest_dz = 0;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const LinearGemmSpec& spec = layers_[l].spec();
    hidden_[l].resize_discard(n * spec.y_ld * element_bytes(spec.output));
    if (l < normed_.size()) normed_[l].resize_discard(n * spec.y_ld * act);
    widest_dz = std::max<std::size_t>(widest_dz, spec.dz_ld);
    layers_[l].prepare(batch);
  }
  if (cross_) cross_->reserve(batch);
  if (field_) field_->reserve(batch);
  if (flen_) flen_->reserve(batch);
  dz_a_.resize_discard(n * widest_dz * act);
  dz_b_.resize_discard(n * widest_dz * act);
  if (two_class()) logits_.resize_discard(n);
  if (layers_.empty()) logits_.resize_discard(n);
  if (layers_.empty() || undropped_bias_ != kNoBlock) {
    if (ones_.size() < n) {
      ones_ = device::to_device(std::vector<float>(n, 1.0f), card_->memory(), card_->stream());
    }
  }
  preds_.resize_discard(n);
  dlogits_.resize_discard(n);
  d_pooled_.resize_discard(n * static_cast<std::size_t>(d_pooled_ld_));
  loss_partials_.resize_discard(SigmoidLogLoss::loss_partials(n));
  if (reported_batch_ < 0 && (!layers_.empty() || field_) && batch > 0) {
    reported_batch_ = batch;
    if (card_->local_index() == 0) {
      GPUBOX_LOG(INFO) << "dense net kernels (batch " << batch << "):\n" << kernel_report(batch);
    }
  }
}

std::string DenseModel::kernel_report(int64_t batch) const {
  std::ostringstream out;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    out << (l ? "\n" : "") << "  " << layers_[l].spec().name << " " << layers_[l].in() << "x"
        << layers_[l].out() << ": " << layers_[l].describe(batch);
    if (l < norms_.size()) out << "\n  " << norms_[l].describe();
  }
  // A line of its own: the part's report ends with whatever line it writes last.
  const auto mlp_input = [&](const char* rows) {
    if (mlp_reads_bf16_copy()) out << "\n  MLP input: " << rows << " rounded to bf16";
  };
  if (cross_) {
    out << "\n  cross " << cross_->describe(batch, blas_.bf16() == Bf16Support::kEmulated);
    mlp_input(cross_->parallel() ? "the cross net's fp32 input rows"
                                 : "the cross net's fp32 output");
  }
  if (field_) {
    out << field_->kernel_report(batch);
    mlp_input("the part's fp32 rows");
  }
  if (flen_) out << flen_->kernel_report(batch);
  if (dropout_->on()) {
    // mask(0): the first hidden layer's, else the output's (keep 1-p, as the side layer's).
    const float keep = 1.0f / dropout_->mask(0).scale;
    const bool hidden = dropout_->hidden() > 0;
    const char* first = hidden                     ? "hidden units"
                        : dropout_->drops_output() ? "the output"
                                                   : "the bi-interaction's layer";
    out << "\n  dropout " << config_.dnn_dropout << ": " << first << " kept with probability "
        << keep << (hidden && dropout_->drops_output() ? ", the output too" : "")
        << (undropped_bias_ != kNoBlock
                ? ", then the undropped " + std::string(kFatDeepffmBiasBlock)
                : std::string());
    if (hidden && dropout_->drops_side()) {
      out << ", the bi-interaction's layer with " << 1.0f - config_.dnn_dropout;
    }
    out << " (in place after each forward, training only; masks hashed per step)";
  }
  return out.str();
}

void DenseModel::forward(const DenseBatchView& batch, bool training) {
  GPUBOX_EXPECTS(batch.batch >= 0 && batch.sparse.batch == batch.batch,
                 "batch size mismatch: dense part ", batch.batch, ", sparse part ",
                 batch.sparse.batch);
  reserve(batch.batch);  // no-op when the step already did
  const device::Stream& stream = card_->stream();
  const int64_t n = batch.batch;
  if (training) dropout_->begin_step(stream);  // a new mask every training step, replays too
  pool_.forward(stream, batch.sparse, batch.dense, field_ ? 0 : config_.dense_dim, input_rows());
  if (layers_.empty()) {
    // wide, fm, ffm: logits = bias (a rank-1 broadcast), the wide and (f)fm parts add the rest.
    blas_.sgemm(Transpose::kNo, Transpose::kNo, n, 1, 1, 1.0f, ones_.data(), 1,
                params_.values(wide_bias_), 1, 0.0f, logits_.data(), 1);
  }
  if (cross_) cross_->forward(blas_, params_, x0_floats(), n);
  if (field_) field_->forward(field_step(batch, training));
  if (mlp_reads_bf16_copy()) {
    // The rows the MLP reads in fp32, rounded once; only their written columns are read, the
    // copy's padding is zero.
    const MlpCopyRows rows = mlp_copy_rows();
    to_bf16_rows_async(stream, rows.data, n, rows.cols, rows.ld, mlp_input_bf16_.data());
  }
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].forward(params_, layer_input(l), hidden_[l].data(), n);
    if (training && l + 1 < layers_.size()) {
      const LinearGemmSpec& spec = layers_[l].spec();
      dropout_->hidden_forward(stream, l, hidden_[l].data(), spec.output, n, spec.out, spec.y_ld);
    }
    if (l >= norms_.size()) continue;
    if (training) {
      norms_[l].forward_train(stream, params_, hidden_[l].data(), normed_[l].data(), n);
    } else {
      norms_[l].forward_infer(stream, params_, hidden_[l].data(), normed_[l].data(), n);
    }
  }
  if (two_class()) {
    const std::size_t top = layers_.size() - 1;
    SigmoidLogLoss::pair_logits(stream,
                                top < normed_.size() ? normed_[top].data() : hidden_[top].data(),
                                activation_type_, layers_[top].spec().y_ld, n, logits_.data());
  }
  if (training) dropout_->output_forward(stream, logits(), n);  // the DNN's output alone
  if (undropped_bias_ != kNoBlock) {
    // logits += bias, after the output's dropout (a rank-1 update, as the bias of wide and fm).
    blas_.sgemm(Transpose::kNo, Transpose::kNo, n, 1, 1, 1.0f, ones_.data(), 1,
                params_.values(undropped_bias_), 1, 1.0f, logits(), 1);
  }
  if (field_) field_->add_logits(field_step(batch, training), logits());
  if (cross_ && cross_->parallel()) cross_->add_logits(blas_, params_, n, logits());
  if (wide_) wide_->forward(stream, params_, input_rows(), batch.dense, n, logits());
  if (fm_) fm_->forward(stream, input_rows(), n, logits());
  if (flen_)
    flen_->forward(blas_, params_, input_rows(), n, training ? dropout_.get() : nullptr, logits());
  if (ffm_) ffm_->forward(stream, params_, input_rows(), batch.dense, n, logits());
}

FieldStep DenseModel::field_step(const DenseBatchView& batch, bool training) {
  return FieldStep{
      card_->stream(), blas_,       params_,          input_rows(),
      batch.dense,     batch.batch, !layers_.empty(), wide_ ? wide_->weight_block() : 0,
      training};
}

DenseModel::MlpCopyRows DenseModel::mlp_copy_rows() const {
  if (field_) {
    return MlpCopyRows{static_cast<const float*>(field_->dnn_input()), field_->dnn_in(),
                       field_->dnn_ld()};
  }
  // parallel: x0; stacked: the cross output, same stride.
  return MlpCopyRows{cross_->parallel() ? x0_floats() : cross_->output(), cross_->dim(), x0_ld_};
}

void DenseModel::predict(const DenseBatchView& batch) {
  predict_async(batch);
  card_->stream().synchronize();
}

void DenseModel::predict_async(const DenseBatchView& batch) {
  forward(batch, /*training=*/false);
  SigmoidLogLoss::predict(card_->stream(), logits(), batch.batch, preds_.data());
}

double DenseModel::forward_backward(const DenseBatchView& batch, const GradScales& scales,
                                    float* push) {
  forward_backward_async(batch, scales, push);
  device::copy_async(host_status_.data(), status_.data(), 1, card_->stream());
  card_->stream().synchronize();
  return host_status_[0].loss;
}

void DenseModel::forward_backward_async(const DenseBatchView& batch, const GradScales& scales,
                                        float* push, bool stop_vote) {
  const int64_t n = batch.batch;
  GPUBOX_EXPECTS((layers_.empty() && !field_) || n == 0 ||
                     (scales.dense > 0.0f && std::isfinite(scales.dense)),
                 "the dense gradient scale must be positive, got ", scales.dense);
  forward(batch, /*training=*/true);
  const device::Stream& stream = card_->stream();
  // dZ of the logit layer = scale * dlogits: the MLP's gradients carry the dense scale
  // (layers.hpp), so every parameter gradient comes straight out of a GEMM or its epilogue.
  void* dz = dz_a_.data();
  void* spare = dz_b_.data();
  // The pooled gradient is handed on with the dense scale multiplied back out.
  const float unscale = n > 0 ? 1.0f / scales.dense : 0.0f;
  const float share = static_cast<float>(n) * scales.dense;
  SigmoidLogLoss::ScaledGrad top{layers_.empty() ? nullptr : dz, activation_type_, scales.dense};
  const bool normed_pair = two_class() && !norms_.empty();
  if (two_class()) {
    // dL/du of the two outputs: with a norm, of its output (into spare; the norm takes it to
    // dz), else of the ReLU's, masked by it into dz.
    top.pair_ld = layers_.back().spec().dz_ld;
    if (normed_pair) top.data = spare;
    if (!normed_pair) top.relu_out = hidden_.back().data();
  }
  SigmoidLogLoss::forward_backward_async(
      stream, logits(), batch.labels, n, preds_.data(), dlogits_.data(), top, &status_.data()->loss,
      loss_partials_.data(), params_.loss_slot(), stop_vote ? 1.0f : 0.0f);
  if (normed_pair)
    norms_.back().backward(stream, params_, hidden_.back().data(), spare, dz, n, share);
  dropout_->output_backward(stream, dz, activation_type_, n);
  backward_layers(dz, spare, n, unscale, share);
  backward_parts(batch, scales, unscale, push);
}

void DenseModel::backward_layers(void* dz, void* spare, int64_t n, float unscale, float share) {
  for (std::size_t l = layers_.size(); l-- > 0;) {
    layers_[l].backward_weights(params_, layer_input(l), dz, n);
    if (l > 0) {
      backward_hidden(l, dz, spare, n, share);
    } else if (cross_ && !cross_->parallel()) {
      // stacked: dL/dx_L, still scaled, into the cross network, which hands on the pooled part.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f, cross_->output_grad(),
                               n);
      cross_->backward(blas_, params_, x0_floats(), n, unscale, d_pooled_.data(), pool_.out_dim(),
                       d_pooled_ld_, /*accumulate=*/false);
    } else if (field_) {
      // dL/d(the field part's DNN input), still scaled, into the part's backward below.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f, field_->dnn_input_grad(),
                               n);
    } else {
      // The pooled gradient, with the dense scale multiplied back out.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, unscale, d_pooled_.data(), n);
    }
  }
}

void DenseModel::backward_parts(const DenseBatchView& batch, const GradScales& scales,
                                float unscale, float* push) {
  const int64_t n = batch.batch;
  const device::Stream& stream = card_->stream();
  if (field_) {
    // After the DNN's backward (it wrote dnn_input_grad(); autoint may have none): the part's
    // gradients, and the pooled part, which it overwrites.
    field_->backward(field_step(batch, true),
                     FieldGrads{dlogits_.data(), scales.dense, unscale, d_pooled_.data()});
  }
  if (cross_ && cross_->parallel()) {
    cross_->backward_from_logits(blas_, params_, dlogits_.data(), scales.dense, n);
    cross_->backward(blas_, params_, x0_floats(), n, unscale, d_pooled_.data(), pool_.out_dim(),
                     d_pooled_ld_, /*accumulate=*/true);
  }
  if (cross_ && config_.cross_l2 > 0.0f && n > 0) {
    // The penalty l2 * |w|^2 rides on every instance's loss, so that the mean over the global
    // batch carries it once (the scale is 1 / global batch: the cards' terms sum to one).
    cross_->add_l2_gradient(stream, params_,
                            2.0f * config_.cross_l2 * static_cast<float>(n) * scales.dense);
  }
  if (layers_.empty()) {
    // wide, fm, ffm, autoint without fc_sizes: d bias = scale * sum of dz; the pooled gradient
    // is the other parts' (autoint's wrote it above).
    blas_.sgemv(Transpose::kYes, n, 1, scales.dense, dlogits_.data(), 1, ones_.data(), 0.0f,
                params_.grads(wide_bias_));
    if (!field_) device::memset_bytes_async(d_pooled_.data(), 0, d_pooled_.bytes(), stream);
  }
  if (undropped_bias_ != kNoBlock) {
    // Undropped: d bias = scale * sum of the unmasked dlogits.
    blas_.sgemv(Transpose::kYes, n, 1, scales.dense, dlogits_.data(), 1, ones_.data(), 0.0f,
                params_.grads(undropped_bias_));
  }
  if (wide_) {
    wide_->backward(blas_, params_, batch.dense, dlogits_.data(), n, scales.dense, d_pooled_.data(),
                    d_pooled_ld_);
  }
  if (field_) field_->add_wide_grads(field_step(batch, true));  // deepfefm's DNN reads wide.dense_w
  if (fm_) fm_->backward(stream, input_rows(), dlogits_.data(), n, d_pooled_.data(), d_pooled_ld_);
  if (flen_) {
    flen_->backward(blas_, params_, dlogits_.data(), n, scales.dense, *dropout_, d_pooled_.data());
  }
  if (ffm_) {
    ffm_->backward(stream, params_, input_rows(), batch.dense, dlogits_.data(), n, scales.dense,
                   d_pooled_.data());
  }
  pool_.backward(stream, batch.sparse, d_pooled_.data(), d_pooled_ld_, batch.labels, scales.sparse,
                 push);
}

void DenseModel::backward_hidden(std::size_t l, void*& dz, void*& spare, int64_t batch,
                                 float share) {
  if (norms_.empty()) {
    // Dropout: the ReLU mask of the dropped output is the dropout's mask too; 1/q is alpha.
    layers_[l].backward_data(params_, dz, layer_input(l), &layers_[l - 1],
                             dropout_->hidden_grad_scale(l - 1), spare, batch);
    std::swap(dz, spare);
    return;
  }
  // The gradient of the norm's output, then through the norm and the ReLU into layer l - 1's dZ.
  layers_[l].backward_data(params_, dz, layer_input(l), nullptr, 1.0f, spare, batch);
  norms_[l - 1].backward(card_->stream(), params_, hidden_[l - 1].data(), spare, dz, batch, share);
}

void DenseModel::check_finite_async() {
  mark_non_finite_async(params_.reduced_size());
  read_stop_votes_async(card_->stream(), params_.stop_slot(), &status_.data()->stop_votes);
}

void DenseModel::mark_non_finite_async(std::size_t n) {
  const device::Stream& stream = card_->stream();
  find_non_finite_async(stream, params_.grads().data(), n, &status_.data()->first_non_finite);
  copy_non_finite_value_async(stream, params_.grads().data(), n, &status_.data()->first_non_finite,
                              &status_.data()->bad_value);
}

void DenseModel::check_finite(double loss, int64_t pass, int64_t batch_index) {
  if (!std::isfinite(loss)) {
    GPUBOX_FAIL("pass ", pass, ", batch ", batch_index, ": the loss is ", loss,
                " (diverged: lower the learning rate or check the input for huge dense values)");
  }
  const device::Stream& stream = card_->stream();
  mark_non_finite_async(params_.size());
  device::copy_async(host_status_.data(), status_.data(), 1, stream);
  stream.synchronize();
  DenseStepStatus status = host_status_[0];
  status.loss = loss;
  throw_if_non_finite(status, pass, batch_index);
}

void DenseModel::throw_if_non_finite(const DenseStepStatus& status, int64_t pass,
                                     int64_t batch_index) const {
  const uint32_t bad = status.first_non_finite;
  if (bad == heter_comm::kNoVeto) return;
  if (bad == heter_comm::kNonFiniteNorm) {  // HeterComm::push_pulled's, with the clip
    GPUBOX_FAIL("pass ", pass, ", batch ", batch_index,
                ": the global gradient norm of hyper_parameters.optimizer.clip_by_norm is not "
                "finite: a sparse (embedding) gradient is NaN or inf (diverged: lower the "
                "learning rate)");
  }
  if (bad >= params_.size()) {  // the loss slot: the loss summed over the cards
    GPUBOX_FAIL("pass ", pass, ", batch ", batch_index,
                ": the loss is not finite on at least one card (this card's: ", status.loss,
                "; diverged: lower the learning rate or check the input for huge dense values)");
  }
  GPUBOX_FAIL("pass ", pass, ", batch ", batch_index, ": gradient of ", params_.describe(bad),
              " is ", status.bad_value, " (diverged: lower the learning rate)");
}

}  // namespace gpubox::trainer
