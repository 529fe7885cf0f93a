// The field networks that build the MLP's input from the slots' pooled embeddings and the dense
// features themselves (dlrm's bottom MLP and dot interaction, xdeepfm's CIN, deepfefm's
// field-embedded FM, autoint's attention, fat_deepffm's CEN and field-aware pairs) behind one
// interface, so DenseModel builds and drives whichever the config names through one table
// (find_field_part) instead of a branch per network.
//
// A FieldPart forwards each hook to its network's own part (dlrm_part.hpp, xdeepfm_part.hpp,
// deepfefm_part.hpp, autoint_part.hpp, fat_deepffm_part.hpp), which owns the parameters and
// buffers. DenseModel calls the hooks in this order in one step:
//   forward (the MLP's input rows, from the pooled slots and the dense features)
//   -> the MLP's forward -> add_logits
//   -> the MLP's backward, which writes dnn_input_grad() (scaled by the dense scale)
//   -> backward (the part's gradients; overwrites the pooled gradient)
//   -> the wide part's backward -> add_wide_grads.
// With one of these networks the pool writes the slots alone (no dense features: the part reads
// them), and the MLP's first layer reads dnn_input() (in bf16, for a part that computes in fp32:
// its bf16 copy, FieldPartKind::fp32_part).
//
// Thread-safety: one card's thread only, as the parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "heterps/device/card.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/dense_parameters.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

// What a part's hooks read in one step (non-owning; valid for the step).
struct FieldStep {
  const device::Stream& stream;
  const Blas& blas;
  DenseParameters& params;
  InputRows pooled;    // the first layer's input rows: the pooled slots
  const float* dense;  // [batch x dense_dim]
  int64_t batch;
  bool with_dnn;       // the MLP exists (autoint without fc_sizes has none)
  std::size_t wide_w;  // the wide part's weight block (deepfefm's DNN reads it too)
  bool training;       // batch norm: the batch's statistics (else the running ones)
};

// What backward reads and writes: the unscaled d loss / d logit, the dense scale, its inverse
// (the pooled gradient is handed on unscaled) and the pooled gradient [batch x pool out_dim].
struct FieldGrads {
  const float* dlogits;
  float scale;
  float unscale;
  float* d_pooled;
};

class FieldPart {
 public:
  virtual ~FieldPart() = default;

  // The MLP's first layer: its input width, the row stride of dnn_input(), and the columns whose
  // gradient it writes into dnn_input_grad() (the fields' embeddings; dlrm: all of R).
  virtual int dnn_in() const = 0;
  virtual int64_t dnn_ld() const = 0;
  virtual int dnn_dx_cols() const = 0;
  virtual const void* dnn_input() const = 0;
  virtual float* dnn_input_grad() = 0;

  virtual double flops_per_example() const = 0;
  virtual std::string kernel_report(int64_t batch) const = 0;
  virtual void reserve(int64_t batch) = 0;

  // Enqueued on step.stream, in the order of the file comment.
  virtual void forward(const FieldStep& step) = 0;
  virtual void add_logits(const FieldStep& step, float* logits) = 0;
  virtual void backward(const FieldStep& step, const FieldGrads& grads) = 0;
  virtual void add_wide_grads(const FieldStep& /*step*/) {}
};

// What a part is built from (the model's; they outlive the part). Parameters are registered in
// `params` at construction, so the part is built where its blocks belong in the flat layout.
struct FieldPartArgs {
  device::Card& card;
  DenseParameters& params;
  Blas& blas;
  const SlotSumPool& pool;
  const DenseModelConfig& config;
  ElementType activation;  // of the MLP's input rows and hidden outputs
};

// One row of the table: a network with a field part.
struct FieldPartKind {
  ModelKind kind;
  // What of it computes in fp32 whatever the precision, over fp32 pooled rows into fp32 DNN input
  // rows (with a dense_precision of bf16 the MLP reads their bf16 copy, said at start); nullptr:
  // it runs in the MLP's precision.
  const char* fp32_part;
  std::unique_ptr<FieldPart> (*make)(const FieldPartArgs& args);
};

// The row of `kind`; nullptr for networks without a field part (their MLP reads the pool's rows).
const FieldPartKind* find_field_part(ModelKind kind);

}  // namespace gpubox::trainer
