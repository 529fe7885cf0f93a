// xdeepfm, deepfefm, autoint and fat_deepffm in bf16 (GPUBOX_BF16_EMULATION where the CPU has no
// bf16 GEMMs): the CIN, FEFM and attention parts compute in fp32 over fp32 rows, the MLP over a
// bf16 copy of their DNN input rows, its input gradient handed back to the part in fp32 (as dcn's
// MLP beside its cross network). Each network against the fp32 model from the same weights (whose
// gradients the networks' own tests check against float64 references), over n instances and over
// one; an empty batch gives zero gradients; the kernel report says what reads what.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <ostream>
#include <random>
#include <string>

#include "common/enum_names.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

struct FieldCase {
  ModelKind kind;
  bool use_cvm;
};

void PrintTo(const FieldCase& c, std::ostream* os) {
  *os << name_of(kModelKindNames, c.kind) << (c.use_cvm ? ", cvm" : ", no cvm");
}

class FieldBf16Test : public ::testing::TestWithParam<FieldCase>, protected testing::OneCard {
 protected:
  // 3 slots, 2 dense features, an MLP of 16 and 8; each network's part as small.
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = GetParam().kind;
    cfg.use_cvm = GetParam().use_cvm;
    cfg.slots = 3;
    cfg.mf_dim = 4;
    cfg.dense_dim = 2;
    cfg.fc_sizes = {16, 8};
    cfg.seed = 37;
    cfg.cin_layer_sizes = {4, 3};   // xdeepfm
    cfg.attn_layer_sizes = {4, 6};  // autoint
    cfg.attn_heads = 2;
    if (cfg.kind == ModelKind::kFatDeepffm) cfg.mf_dim = (cfg.slots + cfg.dense_dim) * 3;
    return cfg;
  }
  // `cfg` built in bf16, emulated where the CPU has no bf16 GEMMs.
  DenseModel& bf16_model(DenseModelConfig cfg) {
    cfg.precision = DensePrecision::kBf16;
    setenv("GPUBOX_BF16_EMULATION", "1", 1);
    model_ = std::make_unique<DenseModel>(card_, cfg);
    unsetenv("GPUBOX_BF16_EMULATION");
    return *model_;
  }
  std::unique_ptr<DenseModel> model_;
};

// The dense gradients' bound is looser than dcn's 0.05: xdeepfm's and deepfefm's part gradients
// are batch sums of products with the MLP's input gradient (bf16 operands), which cancel; over
// seeds 1-8 at batch 64 their relative L2 error ran 0.002-0.067 (autoint's and fat_deepffm's
// below 0.006). A skipped or unconverted copy is off by order 1.
TEST_P(FieldBf16Test, MlpInBf16BesideTheFp32PartStaysNearFp32) {
  for (const int64_t batch : {int64_t{64}, int64_t{1}}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    testing::expect_bf16_near_fp32(card_, config(), 41, 0.1, 0.05, batch);
  }
}

// Steps of 64, 1 and 65 instances on the same two models: each step's bf16 copy of the part's
// rows is of its own batch, whatever the buffer held or how large it already was (each step's
// bits equal a fresh model's; a step after another's rows is order 1 off fp32).
TEST_P(FieldBf16Test, StepsOfOtherBatchSizesOnOneModelStayNearFp32) {
  testing::expect_bf16_steps_near_fp32(card_, config(), 41, 0.1, 0.05, {64, 1, 65});
}

TEST_P(FieldBf16Test, AnEmptyBatchGivesZeroGradients) {
  DenseModel& model = bf16_model(config());
  std::mt19937_64 rng(5);
  const testing::HostBatch h = testing::make_field_batch(0, config(), rng);
  const testing::CardBatch empty(card_, h, config().slots);
  EXPECT_EQ(model.forward_backward(empty.view, GradScales{}, nullptr), 0.0);
  for (float g : model.parameters().grads_to_host()) ASSERT_EQ(g, 0.0f);
}

// The MLP's layers in bf16, and after the part's fp32 lines one saying the MLP reads its rows
// rounded; in fp32 nothing is said of bf16.
TEST_P(FieldBf16Test, TheKernelReportSaysTheMlpReadsTheRowsRounded) {
  const std::string kRounded = "\n  MLP input: the part's fp32 rows rounded to bf16";
  DenseModel& model = bf16_model(config());
  ASSERT_EQ(model.precision(), DensePrecision::kBf16);
  model.reserve(8);
  const std::string report = model.kernel_report(8);
  const std::size_t rounded = report.find(kRounded);
  ASSERT_NE(rounded, std::string::npos) << report;
  const std::size_t end = rounded + kRounded.size();  // a line of its own
  EXPECT_TRUE(end == report.size() || report[end] == '\n') << report;
  EXPECT_NE(report.find("(fp32"), std::string::npos) << report;
  const std::size_t at = report.find("fc_0");
  ASSERT_NE(at, std::string::npos) << report;
  EXPECT_NE(report.substr(at, report.find('\n', at) - at).find(", bf16"), std::string::npos)
      << report;
  DenseModel fp32(card_, config());
  fp32.reserve(8);
  const std::string fp32_report = fp32.kernel_report(8);
  EXPECT_EQ(fp32_report.find(", bf16"), std::string::npos) << fp32_report;
  EXPECT_EQ(fp32_report.find(kRounded), std::string::npos) << fp32_report;
}

INSTANTIATE_TEST_SUITE_P(
    Networks, FieldBf16Test,
    ::testing::Values(FieldCase{ModelKind::kXdeepfm, false}, FieldCase{ModelKind::kXdeepfm, true},
                      FieldCase{ModelKind::kDeepFefm, false}, FieldCase{ModelKind::kDeepFefm, true},
                      FieldCase{ModelKind::kAutoint, false}, FieldCase{ModelKind::kAutoint, true},
                      FieldCase{ModelKind::kFatDeepffm, false},
                      FieldCase{ModelKind::kFatDeepffm, true}));

}  // namespace
}  // namespace gpubox::trainer
