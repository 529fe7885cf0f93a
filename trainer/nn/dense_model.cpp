#include "trainer/nn/dense_model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/enum_names.hpp"
#include "common/error.hpp"
#include "common/logging.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"

namespace gpubox::trainer {

namespace {
// Row stride of an activation matrix with `cols` columns: a multiple of 8 elements (16 bytes of
// bf16), so every row starts where tensor-core GEMMs want it; a single column stays dense.
int64_t activation_ld(int64_t cols) { return cols == 1 ? 1 : (cols + 7) / 8 * 8; }

ElementType element_type(DensePrecision precision) {
  return precision == DensePrecision::kBf16 ? ElementType::kBf16 : ElementType::kF32;
}

// dcn: vector cross layers beside the MLP; dcn_v2: matrix layers or DCN-Mix, stacked or
// parallel.
CrossSpec cross_spec(const DenseModelConfig& config, int input_dim) {
  CrossSpec spec;
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

const char* cross_kind_text(CrossKind kind) {
  switch (kind) {
    case CrossKind::kVector:
      return "vector";
    case CrossKind::kMixture:
      return "mixture";
    case CrossKind::kMatrix:
      break;
  }
  return "matrix";
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
  const bool has_mlp = config.kind != ModelKind::kWide && config.kind != ModelKind::kFm &&
                       config.kind != ModelKind::kFfm && !(autoint && config.fc_sizes.empty());
  const bool dcn = config.kind == ModelKind::kDcnV2 || config.kind == ModelKind::kDcn;
  const bool dlrm = config.kind == ModelKind::kDlrm;
  const bool xdeepfm = config.kind == ModelKind::kXdeepfm;
  const bool deepfefm = config.kind == ModelKind::kDeepFefm;
  // fat_deepffm: like deepfefm, its part builds the DNN's input and runs in fp32.
  const bool fat_deepffm = config.kind == ModelKind::kFatDeepffm;
  if (precision_ == DensePrecision::kBf16 &&
      (dcn || xdeepfm || deepfefm || autoint || fat_deepffm)) {
    // The cross network's (the CIN's, the FEFM's, the attention's) GEMMs and elementwise products
    // are fp32 (CrossNet, XdeepfmPart, DeepfefmPart, AutointPart), and the MLP reads either its
    // output (stacked) or the same input rows: one precision for both.
    precision_ = DensePrecision::kFp32;
    if (card.local_index() == 0) {
      GPUBOX_LOG(WARNING) << "hyper_parameters.dense_precision is bf16, but "
                          << name_of(kModelKindNames, config.kind) << "'s "
                          << (xdeepfm       ? "CIN"
                              : deepfefm    ? "field-embedded FM"
                              : autoint     ? "attention"
                              : fat_deepffm ? "attention and field-aware pairs"
                                            : "cross network")
                          << " computes in fp32: the dense net runs in fp32";
    }
  }
  if (precision_ == DensePrecision::kBf16 && (!has_mlp || blas_.bf16() == Bf16Support::kNone)) {
    precision_ = DensePrecision::kFp32;
    if (has_mlp && card.local_index() == 0) {
      GPUBOX_LOG(WARNING) << "hyper_parameters.dense_precision is bf16, but this card ("
                          << blas_.isa() << ") has no bf16 GEMMs in hardware (AVX512-BF16 or AMX "
                          << "on a CPU, sm_80 or newer on a GPU): the dense net runs in fp32";
    }
  }
  activation_type_ = element_type(precision_);
  // dlrm: the pool writes the slots alone; the dense features go to the bottom MLP (DlrmPart),
  // and the fc layers read its output R.
  // xdeepfm: the same; the fc layers read its fields' embeddings, dense features included.
  // deepfefm: the same; the fc layers read DeepfefmPart's input (embeddings, dense terms, pairs).
  // autoint: the same (its fields' embeddings, when fc_sizes is set).
  const int input_dim =
      pool_.out_dim() +
      (dlrm || xdeepfm || deepfefm || autoint || fat_deepffm ? 0 : config.dense_dim);
  x0_ld_ = activation_ld(input_dim);
  if (dlrm) {
    dlrm_ = std::make_unique<DlrmPart>(card, params_, blas_, pool_, config, activation_type_);
  }
  if (xdeepfm) xdeepfm_ = std::make_unique<XdeepfmPart>(card, params_, pool_, config);
  if (deepfefm) deepfefm_ = std::make_unique<DeepfefmPart>(card, params_, pool_, config);
  if (autoint) autoint_ = std::make_unique<AutointPart>(card, params_, pool_, config);
  if (fat_deepffm) {
    fat_deepffm_ = std::make_unique<FatDeepffmPart>(card, params_, blas_, pool_, config);
  }
  const int64_t first_ld = dlrm_          ? dlrm_->top_ld()
                           : xdeepfm_     ? xdeepfm_->dnn_ld()
                           : deepfefm_    ? deepfefm_->dnn_ld()
                           : autoint_     ? autoint_->dnn_ld()
                           : fat_deepffm_ ? fat_deepffm_->dnn_ld()
                                          : x0_ld_;
  if (dcn) cross_ = std::make_unique<CrossNet>(card, params_, cross_spec(config, input_dim));
  // stacked dcn_v2: the first layer reads the cross network's output, and its input gradient is
  // wanted for every column (the cross network's backward takes it, still scaled).
  const bool stacked = dcn && !cross_->parallel();
  if (has_mlp) {
    const std::size_t count = config.fc_sizes.size() + 1;
    layers_.reserve(count);
    int in = dlrm_          ? dlrm_->top_in()
             : xdeepfm_     ? xdeepfm_->dnn_in()
             : deepfefm_    ? deepfefm_->dnn_in()
             : autoint_     ? autoint_->dnn_in()
             : fat_deepffm_ ? fat_deepffm_->dnn_in()
                            : input_dim;
    for (std::size_t l = 0; l < count; ++l) {
      const bool last = l + 1 == count;
      LinearGemmSpec spec;
      spec.name = "fc_" + std::to_string(l);
      spec.in = in;
      spec.out = last ? 1 : config.fc_sizes[l];
      spec.input = activation_type_;
      spec.output = last ? ElementType::kF32 : activation_type_;  // the logit is fp32
      spec.dx = l == 0 ? ElementType::kF32 : activation_type_;    // the pooled gradient too
      spec.relu = !last;
      spec.input_is_relu = l > 0;
      // The first layer's input gradient is wanted for the pooled slots only (every column of
      // the cross network's output, or of dlrm's R).
      // xdeepfm: its fields' embeddings (not the cvm columns behind them).
      spec.dx_cols = l == 0 && !stacked && !dlrm ? pool_.out_dim() : in;
      if (l == 0 && xdeepfm) spec.dx_cols = xdeepfm_->embedding_cols();
      if (l == 0 && deepfefm) spec.dx_cols = deepfefm_->embedding_cols();
      if (l == 0 && autoint) spec.dx_cols = autoint_->embedding_cols();
      if (l == 0 && fat_deepffm) spec.dx_cols = fat_deepffm_->embedding_cols();
      spec.x_ld = l == 0 ? first_ld : activation_ld(in);
      spec.y_ld = activation_ld(spec.out);
      spec.dz_ld = activation_ld(spec.out);
      spec.dx_ld = l == 0 ? (stacked || dlrm || xdeepfm || deepfefm || autoint || fat_deepffm
                                 ? first_ld
                                 : pool_.out_dim())
                          : activation_ld(in);
      layers_.emplace_back(params_, blas_, spec);
      in = spec.out;
    }
  }
  // flen: the MLP over the pooled slots (the dnn's input rows) and its bi-interaction beside it.
  if (config.kind == ModelKind::kFlen) {
    flen_ = std::make_unique<FlenPart>(card, params_, pool_, config.flen_groups);
  }
  // dnn, dcn, dlrm and flen have no first-order term; autoint has it with use_wide; fat_deepffm's
  // is its part's (the attended field-aware vectors summed).
  if (config.kind != ModelKind::kDnn && !dcn && !dlrm && !flen_ && !fat_deepffm &&
      (!autoint || config.attn_use_wide)) {
    wide_ = std::make_unique<WidePart>(params_, pool_, config.dense_dim);
  }
  if (config.kind == ModelKind::kDeepFm || config.kind == ModelKind::kFm) {
    fm_ = std::make_unique<FmPart>(pool_);
  }
  if (config.kind == ModelKind::kFfm) {
    ffm_ = std::make_unique<FfmPart>(params_, pool_, config.dense_dim);
  }
  if (!has_mlp) wide_bias_ = params_.add("wide.bias", 1, ParamInit::kZero);
  if (activation_type_ == ElementType::kBf16) params_.keep_bf16_copy();
  params_.finalize(config.seed);
  hidden_.resize(layers_.size());
  for (auto* buffer : {&x0_, &dz_a_, &dz_b_}) *buffer = card.make_buffer<char>(0);
  for (auto& buffer : hidden_) buffer = card.make_buffer<char>(0);
  for (auto* buffer : {&logits_, &preds_, &dlogits_, &d_pooled_, &ones_}) {
    *buffer = card.make_buffer<float>(0);
  }
  loss_partials_ = card.make_buffer<double>(0);
  status_ = card.make_buffer<DenseStepStatus>(1);
  host_status_ = device::pinned_buffer<DenseStepStatus>(1);
}

double DenseModel::flops_per_example() const {
  double macs = 0.0;
  for (const Linear& layer : layers_) {
    // forward X W and weight gradient X^T dZ over every input, input gradient dZ W^T over
    // dx_cols of them.
    macs += static_cast<double>(layer.out()) * (2.0 * layer.in() + layer.spec().dx_cols);
  }
  return 2.0 * macs + (cross_ ? cross_->flops_per_example() : 0.0) +
         (dlrm_ ? dlrm_->flops_per_example() : 0.0) +
         (xdeepfm_ ? xdeepfm_->flops_per_example() : 0.0) +
         (deepfefm_ ? deepfefm_->flops_per_example() : 0.0) +
         (ffm_ ? ffm_->flops_per_example() : 0.0) +
         (autoint_ ? autoint_->flops_per_example() : 0.0) +
         (flen_ ? flen_->flops_per_example() : 0.0) +
         (fat_deepffm_ ? fat_deepffm_->flops_per_example() : 0.0);
}

void DenseModel::reserve(int64_t batch) {
  GPUBOX_EXPECTS(batch >= 0, "negative batch ", batch);
  const auto n = static_cast<std::size_t>(batch);
  const std::size_t act = element_bytes(activation_type_);
  x0_.resize_discard(n * x0_ld_ * act);
  std::size_t widest_dz = 0;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const LinearGemmSpec& spec = layers_[l].spec();
    hidden_[l].resize_discard(n * spec.y_ld * element_bytes(spec.output));
    widest_dz = std::max<std::size_t>(widest_dz, spec.dz_ld);
    layers_[l].prepare(batch);
  }
  if (cross_) cross_->reserve(batch);
  if (dlrm_) dlrm_->reserve(batch);
  if (xdeepfm_) xdeepfm_->reserve(batch);
  if (deepfefm_) deepfefm_->reserve(batch);
  if (autoint_) autoint_->reserve(batch);
  if (flen_) flen_->reserve(batch);
  if (fat_deepffm_) fat_deepffm_->reserve(batch);
  dz_a_.resize_discard(n * widest_dz * act);
  dz_b_.resize_discard(n * widest_dz * act);
  if (layers_.empty()) {
    logits_.resize_discard(n);
    if (ones_.size() < n) {
      ones_ = device::to_device(std::vector<float>(n, 1.0f), card_->memory(), card_->stream());
    }
  }
  preds_.resize_discard(n);
  dlogits_.resize_discard(n);
  d_pooled_.resize_discard(n * pool_.out_dim());
  loss_partials_.resize_discard(SigmoidLogLoss::loss_partials(n));
  if (reported_batch_ < 0 && (!layers_.empty() || autoint_) && batch > 0) {
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
  }
  if (cross_) {
    out << "\n  cross " << cross_->layers() << " x " << cross_->dim() << "x" << cross_->dim() << " "
        << cross_kind_text(cross_->kind())
        << (cross_->rank() > 0 ? " rank " + std::to_string(cross_->rank()) : std::string())
        << (cross_->experts() > 0 ? " experts " + std::to_string(cross_->experts()) : std::string())
        << (cross_->parallel() ? ", parallel" : ", stacked")
        << ": sgemm + elementwise (fp32, batch " << batch << ")";
  }
  if (dlrm_) out << dlrm_->kernel_report(batch);
  if (xdeepfm_) out << xdeepfm_->kernel_report(batch);
  if (deepfefm_) out << deepfefm_->kernel_report(batch);
  if (autoint_) out << autoint_->kernel_report(batch);
  if (flen_) out << flen_->kernel_report(batch);
  if (fat_deepffm_) out << fat_deepffm_->kernel_report(batch);
  return out.str();
}

void DenseModel::forward(const DenseBatchView& batch) {
  GPUBOX_EXPECTS(batch.batch >= 0 && batch.sparse.batch == batch.batch,
                 "batch size mismatch: dense part ", batch.batch, ", sparse part ",
                 batch.sparse.batch);
  reserve(batch.batch);  // no-op when the step already did
  const device::Stream& stream = card_->stream();
  const int64_t n = batch.batch;
  pool_.forward(stream, batch.sparse, batch.dense,
                dlrm_ || xdeepfm_ || deepfefm_ || autoint_ || fat_deepffm_ ? 0 : config_.dense_dim,
                input_rows());
  if (layers_.empty()) {
    // wide, fm, ffm: logits = bias (a rank-1 broadcast), the wide and (f)fm parts add the rest.
    blas_.sgemm(Transpose::kNo, Transpose::kNo, n, 1, 1, 1.0f, ones_.data(), 1,
                params_.values(wide_bias_), 1, 0.0f, logits_.data(), 1);
  }
  if (cross_) cross_->forward(blas_, params_, x0_floats(), n);
  if (dlrm_) dlrm_->forward(stream, params_, input_rows(), batch.dense, n);
  if (xdeepfm_) xdeepfm_->forward(blas_, params_, input_rows(), batch.dense, n);
  if (deepfefm_) {
    deepfefm_->forward(stream, params_, input_rows(), batch.dense, wide_->weight_block(), n);
  }
  if (autoint_) {
    autoint_->forward(blas_, params_, input_rows(), batch.dense, n, !layers_.empty());
  }
  if (fat_deepffm_) fat_deepffm_->forward(stream, params_, input_rows(), batch.dense, n);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].forward(params_, layer_input(l), hidden_[l].data(), n);
  }
  if (xdeepfm_) xdeepfm_->add_logits(blas_, params_, n, logits());
  if (deepfefm_) deepfefm_->add_logits(stream, n, logits());
  if (autoint_) autoint_->add_logits(blas_, params_, n, logits());
  if (fat_deepffm_) fat_deepffm_->add_logits(stream, n, logits());
  if (cross_ && cross_->parallel()) cross_->add_logits(blas_, params_, n, logits());
  if (wide_) wide_->forward(stream, params_, input_rows(), batch.dense, n, logits());
  if (fm_) fm_->forward(stream, input_rows(), n, logits());
  if (flen_) flen_->forward(blas_, params_, input_rows(), n, logits());
  if (ffm_) ffm_->forward(stream, params_, input_rows(), batch.dense, n, logits());
}

void DenseModel::predict(const DenseBatchView& batch) {
  predict_async(batch);
  card_->stream().synchronize();
}

void DenseModel::predict_async(const DenseBatchView& batch) {
  forward(batch);
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
  GPUBOX_EXPECTS((layers_.empty() && !autoint_) || n == 0 ||
                     (scales.dense > 0.0f && std::isfinite(scales.dense)),
                 "the dense gradient scale must be positive, got ", scales.dense);
  forward(batch);
  const device::Stream& stream = card_->stream();
  // dZ of the logit layer = scale * dlogits: the MLP's gradients carry the dense scale
  // (layers.hpp), so every parameter gradient comes straight out of a GEMM or its epilogue.
  void* dz = dz_a_.data();
  void* spare = dz_b_.data();
  // The pooled gradient is handed on with the dense scale multiplied back out.
  const float unscale = n > 0 ? 1.0f / scales.dense : 0.0f;
  SigmoidLogLoss::forward_backward_async(
      stream, logits(), batch.labels, n, preds_.data(), dlogits_.data(),
      SigmoidLogLoss::ScaledGrad{layers_.empty() ? nullptr : dz, activation_type_, scales.dense},
      &status_.data()->loss, loss_partials_.data(), params_.loss_slot(), stop_vote ? 1.0f : 0.0f);
  for (std::size_t l = layers_.size(); l-- > 0;) {
    layers_[l].backward_weights(params_, layer_input(l), dz, n);
    if (l > 0) {
      layers_[l].backward_data(params_, dz, layer_input(l), &layers_[l - 1], 1.0f, spare, n);
      std::swap(dz, spare);
    } else if (cross_ && !cross_->parallel()) {
      // stacked: dL/dx_L, still scaled, into the cross network, which hands on the pooled part.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f, cross_->output_grad(),
                               n);
      cross_->backward(blas_, params_, x0_floats(), n, unscale, d_pooled_.data(), pool_.out_dim(),
                       /*accumulate=*/false);
    } else if (dlrm_) {
      // dR, still scaled, into the interaction and the bottom MLP, which hand on the pooled part.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f, dlrm_->top_input_grad(),
                               n);
      dlrm_->backward(stream, params_, input_rows(), n, unscale, d_pooled_.data());
    } else if (xdeepfm_) {
      // dL/d(the fields' embeddings), still scaled, into the CIN's backward, which adds its own
      // and hands on the pooled part.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f,
                               xdeepfm_->dnn_input_grad(), n);
      xdeepfm_->backward(blas_, params_, batch.dense, dlogits_.data(), scales.dense, n, unscale,
                         d_pooled_.data());
    } else if (deepfefm_) {
      // The same for the FEFM: dL/d(its DNN input), still scaled, into its backward.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f,
                               deepfefm_->dnn_input_grad(), n);
      deepfefm_->backward(stream, params_, batch.dense, dlogits_.data(), scales.dense, n, unscale,
                          d_pooled_.data());
    } else if (autoint_) {
      // The same: dL/d(the fields' embeddings), still scaled, into the attention's backward.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f,
                               autoint_->dnn_input_grad(), n);
    } else if (fat_deepffm_) {
      // The same: dL/d(the pairs' products), still scaled, into CEN's backward.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, 1.0f,
                               fat_deepffm_->dnn_input_grad(), n);
      fat_deepffm_->backward(stream, params_, batch.dense, dlogits_.data(), scales.dense, n,
                             unscale, d_pooled_.data());
    } else {
      // The pooled gradient, with the dense scale multiplied back out.
      layers_[0].backward_data(params_, dz, layer_input(0), nullptr, unscale, d_pooled_.data(), n);
    }
  }
  if (cross_ && cross_->parallel()) {
    cross_->backward_from_logits(blas_, params_, dlogits_.data(), scales.dense, n);
    cross_->backward(blas_, params_, x0_floats(), n, unscale, d_pooled_.data(), pool_.out_dim(),
                     /*accumulate=*/true);
  }
  if (cross_ && config_.cross_l2 > 0.0f && n > 0) {
    // The penalty l2 * |w|^2 rides on every instance's loss, so that the mean over the global
    // batch carries it once (the scale is 1 / global batch: the cards' terms sum to one).
    cross_->add_l2_gradient(stream, params_,
                            2.0f * config_.cross_l2 * static_cast<float>(n) * scales.dense);
  }
  if (layers_.empty()) {
    // wide, fm, ffm, autoint without fc_sizes: d bias = scale * sum of dz; the pooled gradient
    // is the other parts'.
    blas_.sgemv(Transpose::kYes, n, 1, scales.dense, dlogits_.data(), 1, ones_.data(), 0.0f,
                params_.grads(wide_bias_));
    if (!autoint_) device::memset_bytes_async(d_pooled_.data(), 0, d_pooled_.bytes(), stream);
  }
  if (autoint_) {
    // After the DNN's backward (it wrote dnn_input_grad()): overwrites d_pooled.
    autoint_->backward(blas_, params_, batch.dense, dlogits_.data(), scales.dense, n,
                       !layers_.empty(), unscale, d_pooled_.data());
  }
  if (wide_) {
    wide_->backward(blas_, params_, batch.dense, dlogits_.data(), n, scales.dense,
                    d_pooled_.data());
  }
  if (deepfefm_) {  // the DNN reads x_d w_d too: its share of wide.dense_w's gradient
    deepfefm_->add_dense_w_grad(stream, params_, batch.dense, wide_->weight_block(), n);
  }
  if (fm_) fm_->backward(stream, input_rows(), dlogits_.data(), n, d_pooled_.data());
  if (flen_) flen_->backward(blas_, params_, dlogits_.data(), n, scales.dense, d_pooled_.data());
  if (ffm_) {
    ffm_->backward(stream, params_, input_rows(), batch.dense, dlogits_.data(), n, scales.dense,
                   d_pooled_.data());
  }
  pool_.backward(stream, batch.sparse, d_pooled_.data(), batch.labels, scales.sparse, push);
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
  if (bad >= params_.size()) {  // the loss slot: the loss summed over the cards
    GPUBOX_FAIL("pass ", pass, ", batch ", batch_index,
                ": the loss is not finite on at least one card (this card's: ", status.loss,
                "; diverged: lower the learning rate or check the input for huge dense values)");
  }
  GPUBOX_FAIL("pass ", pass, ", batch ", batch_index, ": gradient of ", params_.describe(bad),
              " is ", status.bad_value, " (diverged: lower the learning rate)");
}

}  // namespace gpubox::trainer
