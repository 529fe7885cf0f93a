// The dense part of the CTR model on one card: slot sum-pool, written with the dense features
// into the first layer's input rows -> MLP (ReLU) -> one logit (+ the wide part for wide_deep;
// + the wide part and the FM term for deepfm; the wide part and a bias alone for wide, plus the FM
// term for fm, the field-aware term for ffm (no MLP); for dcn_v2
// a cross network before the MLP (stacked) or beside it (parallel), for dcn a vector cross network
// beside it; for dlrm a bottom MLP over the dense features and the dot interaction before it:
// dlrm_part.hpp; for xdeepfm the wide part, the MLP over the fields' embeddings and a CIN over
// them: xdeepfm_part.hpp; for deepfefm the wide part, a field-embedded FM and the MLP over the
// embeddings and its pairs' values: deepfefm_part.hpp; for autoint the wide part, self-attention
// layers over the fields' embeddings and the MLP over them when fc_sizes is set:
// autoint_part.hpp; for flen the MLP and a field-wise bi-interaction beside it: flen_part.hpp)
// -> sigmoid, log loss (with DenseModelConfig::dlrm_output softmax2, PaddleRec dlrm's output
// layer: the MLP's last layer 2 wide, ReLU'd and normalised like a hidden one, a two-class softmax,
// which is the sigmoid of u1 - u0 and its log loss). Owns its layers (each one's GEMMs with bias,
// ReLU and the ReLU backward folded in: linear_gemms.hpp), its parameters (one flat buffer,
// DenseParameters) and its activation buffers; it does not own the batch (views into the sparse
// side's buffers) nor the optimizer.
// With config.batch_norm every hidden layer of the MLP is Linear -> ReLU -> BatchNorm1D
// (batch_norm.hpp): forward_backward normalises with the batch's statistics, predict with the
// running ones, which are statistic blocks of the parameters (saved, loaded and served with them).
// With config.dnn_dropout every hidden layer's ReLU output is dropped in place in training
// (forward_backward), never in predict; the next layer's input-gradient GEMM masks by it with
// alpha 1/q (dropout.hpp).
// fat_deepffm: an attention over ffm's field-aware vectors, their sum into the logit and the MLP
// over its pairs' products (fat_deepffm_part.hpp).
//
// Precision (DenseModelConfig::precision, hyper_parameters.dense_precision): with bf16, the
// first layer's input, the hidden activations, the MLP's gradients dZ and the weights' GEMM
// copy are bf16; every GEMM accumulates in fp32, and the logit, the loss, the pooled gradient
// handed to the sparse side, the parameter gradients, the master weights and the optimizer are
// fp32. No loss scaling: bf16 has fp32's exponent range, so the small gradients that fp16
// training must scale up to keep from flushing to zero are representable as they are (what
// bf16 loses is mantissa, which no scale factor restores). bf16 runs where the card's GEMM
// library has it in hardware (Blas::bf16); elsewhere the model says so and runs fp32. dcn and
// dcn_v2: the cross network's rows (x0, x_l) and element-wise work stay fp32; dcn_v2's cross GEMMs
// read bf16 roundings of their operands and the weights' bf16 copy (CrossNet), dcn's GEMV stays
// fp32; the MLP reads their (stacked: the cross output's) bf16 copy. So do the CIN, FEFM and
// attention parts (xdeepfm, deepfefm, autoint, fat_deepffm): fp32 over the fp32 pooled rows, the
// MLP over a bf16 copy of their DNN input rows, its input gradient handed back in fp32.
//
// One step on a card (simplest form, with comm = the card's communicator):
//   loss = model.forward_backward(batch, scales, push);   // grads into parameters().grads()
//   comm.all_reduce_sum(grads, grads, n, stream);           // one call: the flat gradient buffer
//   model.check_finite(loss, pass, step);                   // throws naming pass, batch, parameter
//   optimizer.step(model.parameters());                     // identical on every card
// The training step (CardWorker) uses the *_async forms instead: the loss and the finite
// verdict stay on the card (step_status()), the all-reduce covers the loss slot too
// (DenseParameters::reduced_size), the verdict vetoes the step's sparse and dense updates on the
// card, and the host reads it a few steps late, without waiting (CardWorker).
//
// Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/batch_norm.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/dense_parameters.hpp"
#include "trainer/nn/dropout.hpp"
#include "trainer/nn/field_part.hpp"
#include "trainer/nn/flen_part.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

// A batch as the model sees it (card memory, non-owning).
struct DenseBatchView {
  SlotBatchView sparse;           // pull records + per-slot offsets
  const float* dense = nullptr;   // [batch x dense_dim]
  const float* labels = nullptr;  // [batch], 0 or 1
  int64_t batch = 0;
};

// What the training step computes on the card and reads back a few steps later (one pinned
// copy into the step's late-readback slot): the card's batch loss, the index of the first
// non-finite value among the all-reduced gradients and loss slot (heter_comm::kNoVeto when all
// are finite; heter_comm::kNonFiniteNorm when they are but the clip's global norm, with the sparse
// gradients, is not: HeterComm::push_pulled writes it) and that value (the error names it; the
// gradient buffer holds a later step's by the time the host reads this), and how many cards of the
// job voted to stop after this step (the all-reduced stop slot).
struct DenseStepStatus {
  double loss = 0;
  uint32_t first_non_finite = 0;
  float bad_value = 0;
  uint32_t stop_votes = 0;
};

struct GradScales {
  // Dense parameter gradients = dense * d(sum of the batch's losses). 1 / (global batch over all
  // cards) makes the all-reduced sum the gradient of the mean loss, so N cards with the global
  // batch split among them step exactly like one card with the whole batch.
  float dense = 1.0f;
  // Sparse push gradients = sparse * d(instance loss): 1 gives each occurrence its own
  // instance's gradient (the per-key optimizers are tuned for that scale).
  float sparse = 1.0f;
};

class DenseModel {
 public:
  DenseModel(device::Card& card, const DenseModelConfig& config);
  DenseModel(const DenseModel&) = delete;
  DenseModel& operator=(const DenseModel&) = delete;

  const DenseModelConfig& config() const { return config_; }
  // What the GEMMs compute in: config().precision, or fp32 where the net or card has no bf16.
  DensePrecision precision() const { return precision_; }
  const SlotSumPool& pool() const { return pool_; }
  int input_dim() const { return pool_.out_dim() + config_.dense_dim; }
  DenseParameters& parameters() { return params_; }
  const DenseParameters& parameters() const { return params_; }
  // Multiply-adds x2 of one example's forward + backward: every layer's forward, weight-gradient
  // and input-gradient GEMM, the first layer's only for its pooled inputs (the sparse push needs
  // them; the dense features need no gradient). Elementwise work is not counted.
  double flops_per_example() const;

  // Sizes every activation buffer for batches of up to `batch` instances and plans the layers'
  // GEMMs for `batch`, so the steps' forward and backward allocate nothing (device rule 1: call
  // it before the step's first collective). The first call logs the kernel report (card 0).
  void reserve(int64_t batch);
  // Which kernels each layer runs for batches of `batch` (after reserve), one line per layer.
  std::string kernel_report(int64_t batch) const;

  // Predictions (sigmoid) of the batch into predictions(); predict synchronizes the card
  // stream, predict_async only enqueues.
  void predict(const DenseBatchView& batch);
  void predict_async(const DenseBatchView& batch);
  // Forward and backward. Writes the dense gradients (parameters().grads()), the push records
  // (`push`: occurrences x pool().push_dim() floats, card memory) and predictions(); returns the
  // sum of the batch's log losses (synchronizes the card stream).
  double forward_backward(const DenseBatchView& batch, const GradScales& scales, float* push);
  // The same, enqueued: the loss goes to step_status()->loss and, as a float, to the
  // parameters' loss slot (all-reduced with the gradients); `stop_vote` (1: this card asks the
  // run to stop) to their stop slot.
  void forward_backward_async(const DenseBatchView& batch, const GradScales& scales, float* push,
                              bool stop_vote = false);
  // After the all-reduce of parameters().reduced_size() floats: step_status()->first_non_finite
  // = the first non-finite index among them, kNoVeto when none, and ->bad_value = its value;
  // step_status()->stop_votes = the cards that voted to stop. Enqueued.
  void check_finite_async();
  // The step status on the card (loss, verdict); the veto word HeterComm::push_pulled takes is
  // &step_status()->first_non_finite.
  DenseStepStatus* step_status() { return status_.data(); }
  // Dropout's training steps taken (hyper_parameters.dnn_dropout; dropout.hpp): the next
  // forward_backward draws the masks of step `steps` + 1. Enqueued; no-op without dropout. A mask
  // is a function of (seed, card rank, layer, step): the same step draws the same mask.
  void set_dropout_steps(uint64_t steps) { dropout_->set_steps(card_->stream(), steps); }
  const MlpDropout& dropout() const { return *dropout_; }
  // fat_deepffm with dropout: where its undropped bias lies (kFatDeepffmBiasBlock); nullopt for
  // every other net and at p = 0.
  std::optional<UndroppedBias> undropped_bias() const;
  // Predictions of the last predict/forward_backward, [batch] floats in card memory.
  const float* predictions() const { return preds_.data(); }

  // Throws gpubox::Error naming pass, batch and the first non-finite value (the loss, or the
  // parameter whose gradient is NaN/Inf) so a diverging run stops before anything is written.
  // One check over the flat gradient buffer, read back through a pinned word (synchronizes).
  void check_finite(double loss, int64_t pass, int64_t batch_index);
  // Throws the same error for a verdict read back by the training step (`status`: the host copy
  // of step_status()). Returns when the status says every value was finite.
  void throw_if_non_finite(const DenseStepStatus& status, int64_t pass, int64_t batch_index) const;

 private:
  // Construction steps: what the GEMMs compute in, and the fc layers (registered in params_).
  void choose_precision(const char* fp32_part, bool has_mlp);
  void add_mlp(int input_dim);
  // The MLP's dropout (config_.dnn_dropout), after the layers are registered.
  void add_dropout();
  // fat_deepffm's undropped bias (kFatDeepffmBiasBlock), after the dropout: with its output's.
  void add_undropped_bias();
  // A batch norm after hidden layer l (config_.batch_norm).
  void add_norm(const LinearGemmSpec& layer);
  // `training`: batch norms with the batch's statistics (forward_backward), else the running ones.
  void forward(const DenseBatchView& batch, bool training);
  // The MLP's backward from hidden layer l's input gradient to layer l - 1's dZ, through its ReLU
  // (and batch norm): into `dz`, using `spare`.
  void backward_hidden(std::size_t l, void*& dz, void*& spare, int64_t batch, float share);
  // The MLP's backward from the logit layer's dZ (in `dz`; `spare` the other buffer) down to its
  // input: into the stacked cross network, the field part's DNN input gradient, or the pooled
  // gradient (times `unscale`, the dense scale multiplied back out).
  void backward_layers(void* dz, void* spare, int64_t n, float unscale, float share);
  // After the MLP's backward: the parts beside it (field, cross, wide, fm, flen, ffm, the bias of
  // a network without hidden layers), then the pool's backward into `push`.
  void backward_parts(const DenseBatchView& batch, const GradScales& scales, float unscale,
                      float* push);
  // What the field part's hooks read for `batch`.
  FieldStep field_step(const DenseBatchView& batch, bool training);
  // step_status()'s verdict and value over the first n gradient floats. Enqueued.
  void mark_non_finite_async(std::size_t n);
  // The pooled rows (and dense features): the first layer's input but for dcn in bf16.
  InputRows input_rows() { return InputRows{x0_.data(), x0_ld_, x0_type_}; }
  // The pooled rows as floats (dcn, dcn_v2: the cross network's x0, fp32 in every precision).
  const float* x0_floats() const { return reinterpret_cast<const float*>(x0_.data()); }
  // dcn, dcn_v2 and the fp32 field parts (xdeepfm, deepfefm, autoint, fat_deepffm) in bf16: the
  // MLP's first layer reads a bf16 copy of its fp32 input.
  bool mlp_reads_bf16_copy() const {
    return (cross_ || fp32_part_) && activation_type_ == ElementType::kBf16;
  }
  // The fp32 rows that copy rounds: [batch x cols], row stride ld (also the copy's).
  struct MlpCopyRows {
    const float* data;
    int cols;
    int64_t ld;
  };
  MlpCopyRows mlp_copy_rows() const;
  // Layer l's input: the first layer's input rows (stacked dcn_v2: the cross network's output;
  // a field part's rows: dlrm's R, xdeepfm's fields' embeddings ...; their bf16 copy for dcn and
  // the fp32 field parts in bf16), or the previous layer's output.
  const void* layer_input(std::size_t l) const {
    if (l > 0) return norms_.empty() ? hidden_[l - 1].data() : normed_[l - 1].data();
    if (mlp_reads_bf16_copy()) return mlp_input_bf16_.data();
    if (cross_ && !cross_->parallel()) return cross_->output();
    if (field_) return field_->dnn_input();
    return x0_.data();
  }
  // PaddleRec's two-class output layer (DenseModelConfig::dlrm_output) on the MLP.
  bool two_class() const {
    return config_.dlrm_output == DlrmOutput::kSoftmax2 && !layers_.empty();
  }
  // The logit column: the last linear layer's output (fp32), or logits_ for wide, fm and ffm and
  // the two-class output's u1 - u0.
  float* logits() {
    return layers_.empty() || two_class() ? logits_.data()
                                          : reinterpret_cast<float*>(hidden_.back().data());
  }

  device::Card* card_;
  DenseModelConfig config_;
  Blas blas_;
  DensePrecision precision_;
  ElementType activation_type_;  // of the MLP's input, its hidden outputs and dZ
  ElementType x0_type_;          // of x0: activation_type_, fp32 where a cross network reads it
  DenseParameters params_;
  SlotSumPool pool_;
  std::vector<Linear> layers_;
  std::vector<BatchNorm> norms_;  // config_.batch_norm: one per hidden layer
  std::unique_ptr<WidePart> wide_;
  std::unique_ptr<FmPart> fm_;       // kDeepFm and kFm only
  std::unique_ptr<CrossNet> cross_;  // kDcnV2 and kDcn only
  // kDlrm, kXdeepfm, kDeepFefm, kAutoint, kFatDeepffm: the MLP's input (field_part.hpp).
  std::unique_ptr<FieldPart> field_;
  const char* fp32_part_ = nullptr;      // FieldPartKind::fp32_part of field_'s network
  std::unique_ptr<FfmPart> ffm_;         // kFfm only
  std::unique_ptr<FlenPart> flen_;       // kFlen only
  std::unique_ptr<MlpDropout> dropout_;  // off unless config_.dnn_dropout > 0
  std::size_t wide_bias_ = 0;            // kWide, kFm, kFfm and autoint without fc_sizes
  static constexpr std::size_t kNoBlock = static_cast<std::size_t>(-1);
  std::size_t undropped_bias_ = kNoBlock;  // fat_deepffm with dropout: add_undropped_bias
  std::size_t undropped_bias_before_ = 0;  // the flat size before it
  int64_t x0_ld_ = 0;                      // row stride of the first layer's input (elements)
  int64_t reported_batch_ = -1;  // the batch whose kernel report was logged (-1: none yet)

  // Activations (raw bytes): x0 = the pooled rows and dense features (x0_type_), one output per
  // linear layer (the last is the fp32 logit column), and the MLP's gradients dZ ping-ponging
  // between layers (activation_type_).
  device::device_buffer<char> x0_;
  device::device_buffer<Bf16> mlp_input_bf16_;  // [B x mlp_copy_rows().ld]: mlp_reads_bf16_copy()
  std::vector<device::device_buffer<char>> hidden_;
  std::vector<device::device_buffer<char>> normed_;  // the norms' outputs (activation type)
  device::device_buffer<char> dz_a_;
  device::device_buffer<char> dz_b_;
  device::device_buffer<float> logits_;  // kWide, kFm and kFfm, and two_class() only
  device::device_buffer<float> preds_;
  device::device_buffer<float> dlogits_;   // unscaled d loss / d logit (the wide part's input)
  device::device_buffer<float> d_pooled_;  // [B x pool out_dim]: the sparse side's gradient
  // d_pooled_'s row stride: the pool's out_dim, or the first layer's dX columns where it computes
  // more of them (fast_dx_cols) straight into d_pooled_ (add_mlp).
  int64_t d_pooled_ld_ = 0;
  int first_dx_wanted_ = 0;  // the first layer's dX columns read (its spec may compute more)
  device::device_buffer<float> ones_;  // kWide, kFm, kFfm, the undropped bias: its broadcast
  device::device_buffer<double> loss_partials_;         // reduce_into's partials for the loss
  device::device_buffer<DenseStepStatus> status_;       // 1 element
  device::pinned_buffer<DenseStepStatus> host_status_;  // for the synchronous forms
};

}  // namespace gpubox::trainer
