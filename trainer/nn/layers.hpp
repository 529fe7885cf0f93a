// The dense net's layers: small classes with forward and backward over card buffers. Batch-major:
// a batch of B instances with d features is a row-major [B x d] matrix. Layers hold their shape,
// their parameter block ids and (Linear) their GEMM plans; the model owns the activation buffers.
// GEMMs go through LinearGemms / Blas; everything else is parallel_for (portable .cu).
//
// Gradient convention: parameter gradients are written (overwritten, not accumulated). The MLP
// runs its backward on dZ already multiplied by the dense gradient scale (1 / global batch), so
// that every parameter gradient is a plain GEMM output or its bias-gradient epilogue; the first
// layer's input gradient multiplies the scale back out (alpha = 1 / scale), so the pooled
// gradient handed to the sparse side is the unscaled d(instance loss). Layers outside the MLP
// (WidePart) take dY unscaled and a `grad_scale`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/stream.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_parameters.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::trainer {

// Y[B x out] = X[B x in] W[in x out] + b (then ReLU for a hidden layer), W ~ N(0, 1/in), b = 0.
// The layer's three GEMMs with their element-wise work folded in (linear_gemms.hpp); W is read
// from the parameters' bf16 copy when the layer's input type is bf16.
class Linear {
 public:
  // Registers `spec.name`.w and .b in `params` (before params.finalize()) and makes the layer's
  // GEMMs on `blas`.
  Linear(DenseParameters& params, Blas& blas, const LinearGemmSpec& spec);
  int in() const { return gemms_.spec().in; }
  int out() const { return gemms_.spec().out; }
  const LinearGemmSpec& spec() const { return gemms_.spec(); }
  std::size_t weight_block() const { return w_; }
  std::size_t bias_block() const { return b_; }

  // Plans the GEMMs for `batch` rows (LinearGemms::prepare).
  void prepare(int64_t batch) { gemms_.prepare(batch); }
  // Y = act(X W + b).
  void forward(const DenseParameters& params, const void* x, void* y, int64_t batch);
  // dW = X^T dZ, db = 1^T dZ into params' gradients.
  void backward_weights(DenseParameters& params, const void* x, const void* dz, int64_t batch);
  // dX = alpha dZ W^T (first spec().dx_cols columns), masked by the ReLU of `producer` (the layer
  // whose output X is) when spec().input_is_relu.
  void backward_data(const DenseParameters& params, const void* dz, const void* x,
                     const Linear* producer, float alpha, void* dx, int64_t batch);
  std::string describe(int64_t batch) const { return gemms_.describe(batch); }

 private:
  const void* weights(const DenseParameters& params) const;

  std::size_t w_;
  std::size_t b_;
  LinearGemms gemms_;
};

// The pulled sparse features of a batch, as the sparse side delivers them (card memory,
// non-owning). Occurrence j (one key of one instance in one slot) has the pull record
// records[j * pull_dim .. +pull_dim) = (show, click, embed_w, embedx_w[mf_dim]). Occurrences are
// grouped slot-major: the ones of (slot s, instance i) are [offsets[s*B + i], offsets[s*B + i +
// 1]), so `offsets` has slots * B + 1 non-decreasing entries starting at 0.
struct SlotBatchView {
  const float* records = nullptr;
  const uint32_t* offsets = nullptr;
  int64_t batch = 0;
  int slots = 0;
};

// The first layer's input, written in place by the pool (the concat of pooled slots and dense
// features is never a separate buffer): row i = [pooled slots of instance i | its dense
// features], row stride `ld` elements, of type `type` (float, or bf16 rounded).
struct InputRows {
  void* data = nullptr;
  int64_t ld = 0;
  ElementType type = ElementType::kF32;
};

// Where each slot's block of pooled columns starts, for functors: slot s's block is
// [begin(s), begin(s) + width_of(s)). Uniform widths need no table (offsets null). Trivially
// copyable.
struct SlotBlocks {
  const int32_t* offsets = nullptr;  // slots + 1 ascending column offsets (card memory), or null
  int width = 0;                     // every slot's width when offsets is null
  GPUBOX_HD int64_t begin(int64_t s) const { return offsets ? offsets[s] : s * width; }
  GPUBOX_HD int width_of(int64_t s) const { return offsets ? offsets[s + 1] - offsets[s] : width; }
};

// Sum-pools each slot's records per instance. Output per slot (width(s) floats):
//   use_cvm: log(show+1), log(click+1) - log(show+1), embed_w, embedx_w[mf_dim(s)]
//   else:    embed_w, embedx_w[mf_dim(s)]
// (sums first, then the cvm transform, as Paddle's fused_seqpool_cvm). An instance with no key in
// a slot pools to zeros. Slots may differ in embedx width (hyper_parameters.slot_dims): the pull
// and push records then have the widest slot's width, and slot s reads and writes its first
// 3 + mf_dim(s) fields (the push's others are zero).
class SlotSumPool {
 public:
  // Every slot mf_dim wide.
  SlotSumPool(int slots, int mf_dim, bool use_cvm);
  // Slot s slot_dims[s] wide, in records record_mf_dim wide (at least the widest slot); the
  // block offsets live in `card`'s memory (the card must outlive the pool). Every slot
  // record_mf_dim wide makes the first form's pool.
  SlotSumPool(device::Card& card, const std::vector<int>& slot_dims, int record_mf_dim,
              bool use_cvm);
  int slots() const { return slots_; }
  // The records' embedx width (every slot's when uniform()).
  int mf_dim() const { return mf_dim_; }
  bool use_cvm() const { return use_cvm_; }
  int pull_dim() const { return 3 + mf_dim_; }
  int push_dim() const { return 3 + mf_dim_; }
  // Every slot's width when uniform(), else the width a slot of the records' width would have.
  int width() const { return (use_cvm_ ? 2 : 0) + 1 + mf_dim_; }
  bool uniform() const { return offsets_host_.empty(); }
  int slot_mf_dim(int s) const { return width_of(s) - width() + mf_dim_; }
  int width_of(int s) const {
    return uniform() ? width() : offsets_host_[s + 1] - offsets_host_[s];
  }
  SlotBlocks blocks() const {
    return SlotBlocks{uniform() ? nullptr : offsets_.data(), uniform() ? width() : 0};
  }
  // Column of embed_w inside a slot's block.
  int embed_w_column() const { return use_cvm_ ? 2 : 0; }
  int out_dim() const { return uniform() ? slots_ * width() : offsets_host_.back(); }

  // Writes each instance's row of `out`: columns [0, out_dim()) the pooled slots, then its
  // `dense_dim` dense features (`dense`: [B x dense_dim] floats). One launch.
  void forward(const device::Stream& stream, const SlotBatchView& in, const float* dense,
               int dense_dim, const InputRows& out) const;
  // Scatters d_pooled ([B x out_dim()] floats at row stride d_ld >= out_dim()) to every
  // occurrence as its push record: show = 1, click = labels[i], embed_g = scale * d(embed_w),
  // embedx_g[k] = scale * d(embedx_w[k]). The cvm features carry no gradient (show/click are
  // counters). push: [occurrences x push_dim()].
  void backward(const device::Stream& stream, const SlotBatchView& in, const float* d_pooled,
                int64_t d_ld, const float* labels, float scale, float* push) const;

 private:
  int slots_;
  int mf_dim_;
  bool use_cvm_;
  std::vector<int32_t> offsets_host_;       // empty when uniform
  device::device_buffer<int32_t> offsets_;  // offsets_host_ on the card
};

// The wide part of wide_deep (and deepfm's first-order term), added to the deep logit:
//   wide_i = sum of embed_w over instance i's keys (= sum over slots of the pooled embed_w)
//          + dense_i . w_dense
// w_dense starts at zero.
class WidePart {
 public:
  WidePart(DenseParameters& params, const SlotSumPool& pool, int dense_dim);
  std::size_t weight_block() const { return w_; }
  // logits[i] += wide_i; the pooled embed_w are read from the first layer's input rows.
  void forward(const device::Stream& stream, const DenseParameters& params, const InputRows& input,
               const float* dense, int64_t batch, float* logits) const;
  // d_pooled[i, embed_w of every slot] += dlogits[i] (row stride d_ld); dW = scale * dense^T
  // dlogits.
  void backward(const Blas& blas, DenseParameters& params, const float* dense, const float* dlogits,
                int64_t batch, float grad_scale, float* d_pooled, int64_t d_ld) const;

 private:
  SlotBlocks blocks_;
  int slots_;
  int embed_w_column_;
  int dense_dim_;
  std::size_t w_;
};

// deepfm's and fm's second-order term, added to the logit: a factorization machine over the
// slots, whose factors are the slots' pooled embeddings v_s (the embedx_w columns of slot s's
// block):
//   fm_i = sum_{s < t} <v_s, v_t> = 1/2 sum_k [(sum_s v_sk)^2 - sum_s v_sk^2]
// It has no parameters of its own: the embeddings are the sparse side's, trained through the
// pooled gradient. (The first-order term is the WidePart; deepfm's deep term the MLP.)
class FmPart {
 public:
  // Every slot must have one embedx width (pool.uniform()): the factors are dot products.
  explicit FmPart(const SlotSumPool& pool);
  // logits[i] += fm_i; the pooled embeddings are read from the first layer's input rows.
  void forward(const device::Stream& stream, const InputRows& input, int64_t batch,
               float* logits) const;
  // d_pooled[i, embedx_w[k] of slot s] += dlogits[i] * (sum_t v_tk - v_sk) (d_pooled:
  // [B x pool out_dim] floats at row stride d_ld, unscaled like the rest of the pooled gradient).
  void backward(const device::Stream& stream, const InputRows& input, const float* dlogits,
                int64_t batch, float* d_pooled, int64_t d_ld) const;

 private:
  int slots_;
  int width_;
  int embedx_column_;
  int mf_dim_;
};

// ffm's second-order term (a field-aware factorization machine, PaddleRec's ffm), added to the
// logit. Fields are the S sparse slots and then the D dense features (F = S + D). A field a
// holds one factor of k values toward each field b, V(a, b):
//   sparse slot a: columns b*k .. b*k + k of the slot's pooled embedx (so the rows' embedx is
//                  F*k wide, row_embedx_width);
//   dense feature d = a - S: x_d * dense_v[d, b] (dense_v: [D x F x k], this part's parameters,
//                  ~ N(0, 0.01/k), as PaddleRec's sparse factors; PaddleRec starts these at 1,
//                  which with many fields saturates the sigmoid).
//   ffm_i = sum_{a < b} <V(a, b), V(b, a)>
// The first-order terms and the bias are the WidePart's and the model's. fp32 (no MLP).
// Portable: parallel_for per instance (forward, pooled gradient) and per dense_v value (its
// gradient, summed over the batch in a fixed order: no atomics, bit-identical runs).
class FfmPart {
 public:
  // Registers ffm.dense_v in `params` (before params.finalize()). The pool's slots must be
  // uniform and mf_dim = (slots + dense_dim) * k for some k >= 1.
  FfmPart(DenseParameters& params, const SlotSumPool& pool, int dense_dim);
  int fields() const { return slots_ + dense_dim_; }
  int factor_dim() const { return k_; }
  // Multiply-adds x2 of one example's forward and backward (each pair: k forward, 2k backward,
  // and the dense features' factors their products).
  double flops_per_example() const;
  // logits[i] += ffm_i; the pooled embeddings are read from the first layer's input rows (fp32).
  void forward(const device::Stream& stream, const DenseParameters& params, const InputRows& input,
               const float* dense, int64_t batch, float* logits) const;
  // d_pooled[i, slot a's embedx column b*k + c] += dlogits[i] * V_i(b, a)[c] (unscaled, as the
  // rest of the pooled gradient) and d dense_v = grad_scale * sum_i dlogits[i] x_id V_i(b, a).
  void backward(const device::Stream& stream, DenseParameters& params, const InputRows& input,
                const float* dense, const float* dlogits, int64_t batch, float grad_scale,
                float* d_pooled) const;

 private:
  int slots_;
  int dense_dim_;
  int k_;
  int width_;
  int embedx_column_;
  std::size_t dense_v_;
};

// Which cross layer a CrossNet stacks.
enum class CrossKind {
  kMatrix,   // dcn_v2: x_{l+1} = x0 * (x_l W_l + b_l) + x_l, W_l full or low rank
  kVector,   // dcn (v1): x_{l+1} = x0 * (x_l . w_l) + b_l + x_l
  kMixture,  // dcn_v2 DCN-Mix: x_{l+1} = x0 * (sum_e p_e(x_l) E_e(x_l) + b_l) + x_l
};

// A cross network's shape. `rank`: kMatrix's (0 = full), kMixture's experts' (> 0); `experts`:
// kMixture's (>= 1).
struct CrossSpec {
  int dim = 0;
  int64_t ld = 0;  // row stride (elements) of x0 and of every [B x dim] buffer
  int layers = 1;
  CrossKind kind = CrossKind::kMatrix;
  int rank = 0;
  int experts = 0;
  bool parallel = false;
  // kMatrix and kMixture: the layers' GEMMs read bf16 operands (Blas::gemm_bf16; see CrossNet).
  // kVector ignores it (its per-layer product is a GEMV, kept fp32).
  bool bf16 = false;
};

// The cross networks of dcn_v2 (DCN-v2, Wang et al. 2021) and dcn (DCN, Wang et al. 2017) over
// the first layer's input rows x0 (the pooled slots and dense features, dim() = D columns; row
// vectors, * elementwise):
//   kMatrix:  x_{l+1} = x0 * (x_l W_l + b_l) + x_l. W_l is a [D x D] block (rank 0), or V_l U_l
//             with V_l [D x r] and U_l [r x D] (rank r: DCN-v2's low-rank W = U V^T written for
//             row vectors). W, V ~ N(0, 1/D), U ~ N(0, 1/r), b = 0.
//   kVector:  x_{l+1} = x0 * (x_l . w_l) + b_l + x_l, w_l and b_l [D] vectors (DCN's cross
//             layer); w ~ N(0, 1/D), b = 0.
//   kMixture: x_{l+1} = x0 * (sum_e p_e E_e + b_l) + x_l with experts e < E of rank r,
//             E_e = tanh(tanh(x_l V_le) C_le) U_le (V_le [D x r], C_le [r x r], U_le [r x D])
//             and the gate p = softmax(x_l G + g) over the experts (G [D x E], g [E]: one gate
//             for every layer, as PaddleRec's CrossNetMix). V ~ N(0, 1/D), C, U ~ N(0, 1/r),
//             G ~ N(0, 1/D), b = g = 0. The experts' V (and U) blocks sit side by side, so each
//             projection of all experts is one GEMM; the gate weighs tanh(.. C) before U, so the
//             mixture is one GEMM too (sum_e p_e a_e U_e = [p_1 a_1 | .. | p_E a_E] [U_1; ..]).
// stacked: the MLP reads output(); parallel: add_logits adds x_L . w_out to the MLP's logit,
// which is the logit layer over the concatenation [x_L | last hidden] (its bias is the MLP's),
// w_out ~ N(0, 1/D).
//
// Precision: fp32 by default, GEMMs the card's Blas::sgemm. With CrossSpec::bf16 (dcn_v2 with
// dense_precision bf16) the kMatrix and kMixture layers' GEMMs (x_l W_l; x_l V_l and low U_l;
// DCN-Mix's V, C, U and gate GEMMs; and their weight and input gradients) read bf16 operands: the
// parameters' bf16 copy (DenseParameters::keep_bf16_copy) and a bf16 rounding of each fp32
// activation or gradient they read, made just before; Blas::gemm_bf16 sums them in fp32 into
// fp32 outputs. The residual stream x_l, the element-wise work (x0 * (.) + b + x_l, tanh,
// softmax), every gradient written and the pooled gradient stay fp32. kVector's x_l . w_l is a
// GEMV (memory-bound: a bf16 copy of x_l would cost more traffic than it saves) and stays fp32.
// Elementwise work is parallel_for. Owns its
// activation buffers (what each layer's backward reads). Gradients follow the MLP's convention:
// backward takes dL/dx_L already multiplied by the dense scale and writes every parameter
// gradient from it; the pooled gradient it hands the sparse side is unscaled. The layers of
// each kind: cross_net.cu (kMatrix), cross_vector.cu, cross_mix.cu.
class CrossNet {
 public:
  // Registers the layers' blocks in `params` (before params.finalize()): cross_<l>.w (or .v and
  // .u; kMixture .v, .c, .u) and .b, cross_gate.w and .b for kMixture, cross_out.w when
  // parallel.
  CrossNet(device::Card& card, DenseParameters& params, const CrossSpec& spec);
  // kMatrix.
  CrossNet(device::Card& card, DenseParameters& params, int dim, int64_t ld, int layers, int rank,
           bool parallel);
  int dim() const { return dim_; }
  int layers() const { return layers_; }
  int rank() const { return rank_; }
  CrossKind kind() const { return kind_; }
  int experts() const { return experts_; }
  bool parallel() const { return parallel_; }
  int64_t ld() const { return ld_; }
  // The layers' GEMMs read bf16 operands (CrossSpec::bf16, never for kVector).
  bool gemms_bf16() const { return bf16_; }
  // The kernel report's line: layers, kind, rank, experts, structure and what the GEMMs compute in
  // (`emulated`: bf16 in fp32, GPUBOX_BF16_EMULATION=1).
  std::string describe(int64_t batch, bool emulated) const;
  // Multiply-adds of one example's forward and backward (x2: flops).
  double flops_per_example() const;
  // Sizes the buffers for batches of up to `batch` rows (allocates only when they grow).
  void reserve(int64_t batch);

  // x_1 .. x_L from x0 ([B x D], row stride ld()).
  void forward(const Blas& blas, const DenseParameters& params, const float* x0, int64_t batch);
  // x_L: [B x D] floats, row stride ld() (the stacked MLP's input).
  const float* output() const;
  // parallel: logits[i] += x_L[i] . w_out.
  void add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                  float* logits) const;
  // stacked: where the MLP's first layer writes scale * dL/dx_L ([B x D], row stride ld()).
  float* output_grad() { return g_.data(); }
  // parallel: d w_out = scale * x_L^T dlogits and output_grad() = scale * dlogits w_out^T, from
  // the unscaled dlogits; then backward.
  void backward_from_logits(const Blas& blas, DenseParameters& params, const float* dlogits,
                            float scale, int64_t batch);
  // From output_grad(): every cross parameter's gradient, and the pooled gradient
  // d_pooled[i, c] (+)= unscale * dL/dx0[i, c] for c < pooled_cols (d_pooled: [B x pooled_cols]
  // floats at row stride d_ld >= pooled_cols; written when !accumulate, added to when
  // accumulate). Uses output_grad() as scratch.
  void backward(const Blas& blas, DenseParameters& params, const float* x0, int64_t batch,
                float unscale, float* d_pooled, int pooled_cols, int64_t d_ld, bool accumulate);
  // After backward: grad += alpha * value for the cross layers' weights (W, V, U, C, w; not the
  // biases, the gate or w_out): the L2 penalty's term, alpha = 2 * l2 * (the penalty's weight).
  void add_l2_gradient(const device::Stream& stream, DenseParameters& params, float alpha) const;

 private:
  const float* layer_input(const float* x0, int l) const {
    return l == 0 ? x0 : xs_[static_cast<std::size_t>(l - 1)].data();
  }
  // A GEMM operand: fp32 rows (row stride ld) and, with bf16_, their bf16 rounding (same layout).
  struct Operand {
    const float* f32;
    const Bf16* bf16;
    int64_t ld;
    Operand at(int64_t offset) const {
      return {f32 + offset, bf16 != nullptr ? bf16 + offset : nullptr, ld};
    }
  };
  // Parameter block `block` as a matrix of row stride ld (its bf16 copy too with bf16_).
  Operand weight(const DenseParameters& params, std::size_t block, int64_t ld) const;
  // rows [n x cols], stride ld; with bf16_ first rounded into `copy` (enqueued on `stream`).
  Operand rounded(const device::Stream& stream, const float* rows, int64_t n, int cols, int64_t ld,
                  Bf16* copy) const;
  // rows already rounded into `copy` (by the forward's rounded()).
  Operand stored(const float* rows, const Bf16* copy, int64_t ld) const {
    return {rows, bf16_ ? copy : nullptr, ld};
  }
  // Layer `at`'s buffer of a per-layer bf16 list (in_bf16_, ...); nullptr without bf16_.
  static Bf16* copy_of(std::vector<device::device_buffer<Bf16>>& list, std::size_t at) {
    return at < list.size() ? list[at].data() : nullptr;
  }
  // C = op(A) op(B) + beta C: Blas::sgemm on the fp32 operands, or gemm_bf16 on the bf16 ones.
  void gemm(const Blas& blas, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k,
            const Operand& a, const Operand& b, float beta, float* c, int64_t ldc) const;

  // One layer of each kind; backward_* turns g_ from dL/dx_{l+1} into dL/dx_l and adds the
  // layer's share of dL/dx0 to dx0_ (the top layer writes it).
  void forward_matrix(const Blas& blas, const DenseParameters& params, const float* x0,
                      int64_t batch, int l);
  void backward_matrix(const Blas& blas, DenseParameters& params, const float* x0, int64_t batch,
                       int l);
  void add_vector_blocks(DenseParameters& params, int l);
  void forward_vector(const Blas& blas, const DenseParameters& params, const float* x0,
                      int64_t batch, int l);
  void backward_vector(const Blas& blas, DenseParameters& params, const float* x0, int64_t batch,
                       int l);
  void add_mixture_blocks(DenseParameters& params, int l);
  void forward_mixture(const Blas& blas, const DenseParameters& params, const float* x0,
                       int64_t batch, int l);
  void backward_mixture(const Blas& blas, DenseParameters& params, const float* x0, int64_t batch,
                        int l);
  // kMixture: dL/d(the experts' tanh(x_l V)) from dL/d(x0 * ...) (dpre_), through the gate too.
  void backward_mixture_gate(const Blas& blas, DenseParameters& params, const Operand& in,
                             int64_t batch, int l);

  int dim_;
  int64_t ld_;
  int layers_;
  int rank_;
  CrossKind kind_;
  int experts_;
  bool parallel_;
  bool bf16_;
  std::vector<std::size_t> w_;  // kMatrix rank 0: W_l; rank > 0, kMixture: V_l; kVector: w_l
  std::vector<std::size_t> u_;  // kMatrix rank > 0, kMixture: U_l
  std::vector<std::size_t> c_;  // kMixture: C_l ([E x r x r], expert-major)
  std::vector<std::size_t> b_;
  std::size_t gate_w_ = 0;                         // kMixture only
  std::size_t gate_b_ = 0;                         // kMixture only
  std::size_t w_out_ = 0;                          // parallel only
  std::vector<device::device_buffer<float>> xs_;   // x_1 .. x_L
  std::vector<device::device_buffer<float>> pre_;  // kMatrix, kMixture: the product's right side
  // kMatrix rank > 0: x_l V_l [B x r]; kVector: x_l . w_l [B]; kMixture: tanh(x_l V_l) [B x Er].
  std::vector<device::device_buffer<float>> low_;
  std::vector<device::device_buffer<float>> act_;   // kMixture: tanh(.. C) [B x Er]
  std::vector<device::device_buffer<float>> gate_;  // kMixture: p [B x E]
  std::vector<device::device_buffer<float>> mix_;   // kMixture: p_e tanh(.. C) [B x Er]
  device::device_buffer<float> g_;                  // dL/dx_l (scaled), walking down the layers
  device::device_buffer<float> dpre_;               // dL/d(the product's right side) [B x D]
  device::device_buffer<float> dx0_;                // the x0 * (...) terms' share of dL/dx0
  // kMatrix rank > 0: dL/d(x_l V_l); kVector: dL/d(x_l . w_l); kMixture: dL/d(mix), then
  // dL/d(tanh(..) C) [B x Er].
  device::device_buffer<float> dlow_;
  device::device_buffer<float> dlow2_;  // kMixture: dL/d(x_l V) [B x Er]
  device::device_buffer<float> dgate_;  // kMixture: dL/d(gate logits) [B x E]
  // bf16_ only (empty otherwise), the bf16 roundings the GEMMs read: per layer x_l; low_ (kMatrix
  // rank > 0: x_l V_l; kMixture: tanh(x_l V_l)); kMixture's mix_. Then dpre_, dlow_, dlow2_ and
  // dgate_'s, remade for each layer's backward.
  std::vector<device::device_buffer<Bf16>> in_bf16_, low_bf16_, mix_bf16_;
  device::device_buffer<Bf16> dpre_bf16_, dlow_bf16_, dlow2_bf16_, dgate_bf16_;
};

// pred = sigmoid(z); per-instance log loss computed stably from the logit
// (max(z,0) - y z + log1p(exp(-|z|))); dz = pred - y. A two-class softmax over u = [u0, u1]
// (DlrmOutput::kSoftmax2) is this loss of z = u1 - u0: softmax(u)[1] = sigmoid(u1 - u0), its
// cross entropy -log softmax(u)[y] the log loss of z, and d/du = (p - y) [-1, 1].
class SigmoidLogLoss {
 public:
  // Returns the sum of the batch's losses (synchronizes the stream). preds/dlogits may be
  // nullptr when not wanted.
  static double forward_backward(const device::Stream& stream, const float* logits,
                                 const float* labels, int64_t batch, float* preds, float* dlogits);
  // The same, with the loss summed on the card into *loss (card memory) in a fixed order
  // (device::reduce_into), and copied as a float to step_slots[0]: no host round trip;
  // step_slots[1] = stop_vote (DenseParameters::reduced_size).
  // `partials`: device::reduce_partials(batch) doubles of card memory. When dz.data is set it
  // receives dz.scale * dlogits in dz.type: the MLP's top gradient. With pair_ld > 0 the logits
  // are a two-class softmax's (pair_logits) and dz is [B x 2] at row stride pair_ld:
  // dz.scale * dlogits * [-1, 1], each 0 where relu_out (when set: [B x 2] of dz.type, the same
  // stride) is not above 0, the ReLU's backward.
  struct ScaledGrad {
    void* data = nullptr;
    ElementType type = ElementType::kF32;
    float scale = 1.0f;
    int64_t pair_ld = 0;
    const void* relu_out = nullptr;
  };
  static void forward_backward_async(const device::Stream& stream, const float* logits,
                                     const float* labels, int64_t batch, float* preds,
                                     float* dlogits, const ScaledGrad& dz, double* loss,
                                     double* partials, float* step_slots, float stop_vote = 0.0f);
  static void predict(const device::Stream& stream, const float* logits, int64_t batch,
                      float* preds);
  // logits[i] = u[i, 1] - u[i, 0] from a two-class softmax's [B x 2] inputs u (`type`, row
  // stride `ld`). Enqueued.
  static void pair_logits(const device::Stream& stream, const void* u, ElementType type, int64_t ld,
                          int64_t batch, float* logits);
  // Doubles of card memory forward_backward_async's `partials` needs for `batch` instances.
  static std::size_t loss_partials(std::size_t batch);
};

// Index of the first NaN/Inf among n floats, or n when all are finite (synchronizes).
std::size_t find_non_finite(const device::Stream& stream, const float* values, std::size_t n);
// The same on the card: *first_bad (card memory) = the index of the first NaN/Inf among n
// floats, or heter_comm::kNoVeto when all are finite (n < kNoVeto). Enqueued; no allocation.
void find_non_finite_async(const device::Stream& stream, const float* values, std::size_t n,
                           uint32_t* first_bad);
// *votes (card memory) = the all-reduced stop slot (DenseParameters::stop_slot), as a count.
// Enqueued.
void read_stop_votes_async(const device::Stream& stream, const float* stop_slot, uint32_t* votes);
// After it: *value_out (card memory) = values[*first_bad] when *first_bad < n (the value an error
// names, kept on the card: a check read steps later finds the buffer overwritten), else left
// alone. Enqueued.
void copy_non_finite_value_async(const device::Stream& stream, const float* values, std::size_t n,
                                 const uint32_t* first_bad, float* value_out);

}  // namespace gpubox::trainer
