#include "trainer/nn/field_part.hpp"

#include <memory>
#include <string>
#include <utility>

#include "trainer/nn/autoint_part.hpp"
#include "trainer/nn/deepfefm_part.hpp"
#include "trainer/nn/dlrm_part.hpp"
#include "trainer/nn/fat_deepffm_part.hpp"
#include "trainer/nn/xdeepfm_part.hpp"

namespace gpubox::trainer {

namespace {

// The hooks every part has under the same name; the networks below add the ones that differ.
template <typename Part>
class FieldPartOf : public FieldPart {
 public:
  template <typename... Args>
  explicit FieldPartOf(Args&&... args) : part_(std::forward<Args>(args)...) {}

  int dnn_in() const override { return part_.dnn_in(); }
  int64_t dnn_ld() const override { return part_.dnn_ld(); }
  int dnn_dx_cols() const override { return part_.embedding_cols(); }
  const void* dnn_input() const override { return part_.dnn_input(); }
  float* dnn_input_grad() override { return part_.dnn_input_grad(); }
  double flops_per_example() const override { return part_.flops_per_example(); }
  std::string kernel_report(int64_t batch) const override { return part_.kernel_report(batch); }
  void reserve(int64_t batch) override { part_.reserve(batch); }

 protected:
  Part part_;
};

// dlrm: the top MLP reads R (top_in() columns) and hands back dR for all of them; no logit term.
class DlrmField final : public FieldPart {
 public:
  explicit DlrmField(const FieldPartArgs& a)
      : part_(a.card, a.params, a.blas, a.pool, a.config, a.activation) {}
  int dnn_in() const override { return part_.top_in(); }
  int64_t dnn_ld() const override { return part_.top_ld(); }
  int dnn_dx_cols() const override { return part_.top_in(); }
  const void* dnn_input() const override { return part_.top_input(); }
  float* dnn_input_grad() override { return part_.top_input_grad(); }
  double flops_per_example() const override { return part_.flops_per_example(); }
  std::string kernel_report(int64_t batch) const override { return part_.kernel_report(batch); }
  void reserve(int64_t batch) override { part_.reserve(batch); }

  void forward(const FieldStep& s) override {
    part_.forward(s.stream, s.params, s.pooled, s.dense, s.batch, s.training);
  }
  void add_logits(const FieldStep& /*s*/, float* /*logits*/) override {}
  void backward(const FieldStep& s, const FieldGrads& g) override {
    part_.backward(s.stream, s.params, s.pooled, s.batch, g.scale, g.unscale, g.d_pooled);
  }

 private:
  DlrmPart part_;
};

class XdeepfmField final : public FieldPartOf<XdeepfmPart> {
 public:
  explicit XdeepfmField(const FieldPartArgs& a)
      : FieldPartOf<XdeepfmPart>(a.card, a.params, a.pool, a.config) {}
  void forward(const FieldStep& s) override {
    part_.forward(s.blas, s.params, s.pooled, s.dense, s.batch);
  }
  void add_logits(const FieldStep& s, float* logits) override {
    part_.add_logits(s.blas, s.params, s.batch, logits);
  }
  void backward(const FieldStep& s, const FieldGrads& g) override {
    part_.backward(s.blas, s.params, s.dense, g.dlogits, g.scale, s.batch, g.unscale, g.d_pooled);
  }
};

// deepfefm: its DNN reads the dense features times the wide part's dense weights, so it takes
// that block in the forward and adds its share of the block's gradient after the wide part.
class DeepfefmField final : public FieldPartOf<DeepfefmPart> {
 public:
  explicit DeepfefmField(const FieldPartArgs& a)
      : FieldPartOf<DeepfefmPart>(a.card, a.params, a.pool, a.config) {}
  void forward(const FieldStep& s) override {
    part_.forward(s.stream, s.params, s.pooled, s.dense, s.wide_w, s.batch);
  }
  void add_logits(const FieldStep& s, float* logits) override {
    part_.add_logits(s.stream, s.batch, logits);
  }
  void backward(const FieldStep& s, const FieldGrads& g) override {
    part_.backward(s.stream, s.params, s.dense, g.dlogits, g.scale, s.batch, g.unscale, g.d_pooled);
  }
  void add_wide_grads(const FieldStep& s) override {
    part_.add_dense_w_grad(s.stream, s.params, s.dense, s.wide_w, s.batch);
  }
};

// autoint: its DNN is optional (fc_sizes), so forward and backward are told whether it runs.
class AutointField final : public FieldPartOf<AutointPart> {
 public:
  explicit AutointField(const FieldPartArgs& a)
      : FieldPartOf<AutointPart>(a.card, a.params, a.pool, a.config) {}
  void forward(const FieldStep& s) override {
    part_.forward(s.blas, s.params, s.pooled, s.dense, s.batch, s.with_dnn);
  }
  void add_logits(const FieldStep& s, float* logits) override {
    part_.add_logits(s.blas, s.params, s.batch, logits);
  }
  void backward(const FieldStep& s, const FieldGrads& g) override {
    part_.backward(s.blas, s.params, s.dense, g.dlogits, g.scale, s.batch, s.with_dnn, g.unscale,
                   g.d_pooled);
  }
};

class FatDeepffmField final : public FieldPartOf<FatDeepffmPart> {
 public:
  explicit FatDeepffmField(const FieldPartArgs& a)
      : FieldPartOf<FatDeepffmPart>(a.card, a.params, a.blas, a.pool, a.config) {}
  void forward(const FieldStep& s) override {
    part_.forward(s.stream, s.params, s.pooled, s.dense, s.batch);
  }
  void add_logits(const FieldStep& s, float* logits) override {
    part_.add_logits(s.stream, s.batch, logits);
  }
  void backward(const FieldStep& s, const FieldGrads& g) override {
    part_.backward(s.stream, s.params, s.dense, g.dlogits, g.scale, s.batch, g.unscale, g.d_pooled);
  }
};

template <typename Field>
std::unique_ptr<FieldPart> make(const FieldPartArgs& args) {
  return std::make_unique<Field>(args);
}

// The CIN's, the FEFM's, the attention's GEMMs and elementwise products are fp32 (XdeepfmPart,
// DeepfefmPart, AutointPart, FatDeepffmPart) over fp32 rows; in bf16 the MLP reads a bf16 copy of
// their DNN input rows. dlrm's bottom MLP and interaction run in the MLP's precision.
constexpr FieldPartKind kFieldParts[] = {
    {ModelKind::kDlrm, nullptr, make<DlrmField>},
    {ModelKind::kXdeepfm, "CIN", make<XdeepfmField>},
    {ModelKind::kDeepFefm, "field-embedded FM", make<DeepfefmField>},
    {ModelKind::kAutoint, "attention", make<AutointField>},
    {ModelKind::kFatDeepffm, "attention and field-aware pairs", make<FatDeepffmField>},
};

}  // namespace

const FieldPartKind* find_field_part(ModelKind kind) {
  for (const FieldPartKind& row : kFieldParts) {
    if (row.kind == kind) return &row;
  }
  return nullptr;
}

}  // namespace gpubox::trainer
