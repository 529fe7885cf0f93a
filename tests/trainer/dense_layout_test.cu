// The dense parameters' layout of every network (block names, sizes and order, and the initial
// values they get from the seed), pinned: a save records the flat buffer, so a model saved by an
// earlier build loads into this one only while the layout stays as it was. The expected strings
// were taken from the build before DenseModel built its field part through a table; a change
// here breaks every saved model of that network.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

struct LayoutCase {
  const char* name;
  ModelKind kind;
  bool use_cvm;
  const char* expected;  // layout() of the model built from small_config(kind, use_cvm)
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

DenseModelConfig small_config(const LayoutCase& c) {
  DenseModelConfig cfg;
  cfg.kind = c.kind;
  cfg.slots = 3;
  cfg.mf_dim = 4;
  cfg.dense_dim = 2;
  cfg.fc_sizes = {4, 3};
  cfg.seed = 5;
  cfg.use_cvm = c.use_cvm;
  cfg.cross_layers = 2;
  cfg.bot_layer_sizes = {4, 1 + cfg.mf_dim};
  cfg.cin_layer_sizes = {3, 2};
  cfg.attn_layer_sizes = {4, 6};
  if (c.kind == ModelKind::kFfm || c.kind == ModelKind::kFatDeepffm) {
    cfg.mf_dim = (cfg.slots + cfg.dense_dim) * 2;
  }
  if (c.kind == ModelKind::kFlen) {
    cfg.slots = 5;
    cfg.flen_groups = {2, 1, 2};
  }
  const std::string name = c.name;
  if (name == "dcn_v2_parallel_mix") {
    cfg.dcn_structure = DcnStructure::kParallel;
    cfg.cross_rank = 2;
    cfg.cross_experts = 2;
  }
  if (name == "autoint_no_dnn") cfg.fc_sizes.clear();
  if (name == "autoint_no_wide") cfg.attn_use_wide = false;
  return cfg;
}

// "name[count] ... | <FNV-1a of the initial values, rounded>".
std::string layout(const DenseParameters& params) {
  std::ostringstream out;
  for (const ParamBlock& b : params.blocks()) out << b.name << "[" << b.count << "] ";
  uint64_t hash = 1469598103934665603ull;
  for (float v : params.values_to_host()) {
    // Rounded to 1e-4, so that another libm's last bit in the seeded normal does not count.
    const auto rounded = static_cast<uint64_t>(std::llround(static_cast<double>(v) * 1e4));
    hash = (hash ^ rounded) * 1099511628211ull;
  }
  out << "| " << std::hex << std::setw(16) << std::setfill('0') << hash;
  return out.str();
}

class DenseLayoutTest : public ::testing::TestWithParam<LayoutCase>, protected testing::OneCard {};

TEST_P(DenseLayoutTest, BlocksAndInitialValuesAsSaved) {
  DenseModel model(card_, small_config(GetParam()));
  EXPECT_EQ(layout(model.parameters()), GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(
    Networks, DenseLayoutTest,
    ::testing::Values(
        LayoutCase{
            "dnn", ModelKind::kDnn, false,
            "fc_0.w[68] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] | f8821209fd0e6dc0"},
        LayoutCase{"wide_deep", ModelKind::kWideDeep, true,
                   "fc_0.w[92] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] wide.dense_w[2] "
                   "| e723243e795c2c57"},
        LayoutCase{"wide", ModelKind::kWide, false,
                   "wide.dense_w[2] wide.bias[1] | 1d68be8548ce35d9"},
        LayoutCase{"deepfm", ModelKind::kDeepFm, false,
                   "fc_0.w[68] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] wide.dense_w[2] "
                   "| 1a5f625752a1cd40"},
        LayoutCase{"fm", ModelKind::kFm, false, "wide.dense_w[2] wide.bias[1] | 1d68be8548ce35d9"},
        LayoutCase{
            "dcn", ModelKind::kDcn, false,
            "cross_0.w[17] cross_0.b[17] cross_1.w[17] cross_1.b[17] cross_out.w[17] fc_0.w[68] "
            "fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] | cad700ebc90c2f57"},
        LayoutCase{"dcn_v2", ModelKind::kDcnV2, false,
                   "cross_0.w[289] cross_0.b[17] cross_1.w[289] cross_1.b[17] fc_0.w[68] fc_0.b[4] "
                   "fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] | e1b46fa8d653c859"},
        LayoutCase{
            "dcn_v2_parallel_mix", ModelKind::kDcnV2, false,
            "cross_0.v[68] cross_0.c[8] cross_0.u[68] cross_0.b[17] cross_1.v[68] cross_1.c[8] "
            "cross_1.u[68] cross_1.b[17] cross_gate.w[34] cross_gate.b[2] cross_out.w[17] "
            "fc_0.w[68] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] | 0c92ef4f4c7095a3"},
        LayoutCase{"dlrm", ModelKind::kDlrm, false,
                   "bot_0.w[8] bot_0.b[4] bot_1.w[20] bot_1.b[5] fc_0.w[44] fc_0.b[4] fc_1.w[12] "
                   "fc_1.b[3] fc_2.w[3] fc_2.b[1] | 5d98cbb2e31110e7"},
        LayoutCase{"dlrm_cvm", ModelKind::kDlrm, true,
                   "bot_0.w[8] bot_0.b[4] bot_1.w[20] bot_1.b[5] fc_0.w[68] fc_0.b[4] fc_1.w[12] "
                   "fc_1.b[3] fc_2.w[3] fc_2.b[1] | 93e04828c27d3463"},
        LayoutCase{"xdeepfm", ModelKind::kXdeepfm, true,
                   "cin_0.w[75] cin_1.w[30] cin_out.w[5] xdeepfm.dense_w[8] fc_0.w[104] fc_0.b[4] "
                   "fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] wide.dense_w[2] | 37b9c3873a4f1682"},
        LayoutCase{"ffm", ModelKind::kFfm, false,
                   "wide.dense_w[2] ffm.dense_v[20] wide.bias[1] | 41ac52e44eb9ac2e"},
        LayoutCase{"deepfefm", ModelKind::kDeepFefm, true,
                   "deepfefm.field_w[160] deepfefm.dense_v[8] fc_0.w[120] fc_0.b[4] fc_1.w[12] "
                   "fc_1.b[3] fc_2.w[3] fc_2.b[1] wide.dense_w[2] | 6e4fe4211a3e6f50"},
        LayoutCase{"autoint", ModelKind::kAutoint, false,
                   "autoint_0.w[64] autoint_0.ln_gamma[4] autoint_0.ln_beta[4] autoint_1.w[96] "
                   "autoint_1.ln_gamma[6] autoint_1.ln_beta[6] autoint_out.w[30] "
                   "autoint.dense_w[8] fc_0.w[80] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] "
                   "fc_2.b[1] wide.dense_w[2] | 7e57eb59e3719d11"},
        LayoutCase{"autoint_no_dnn", ModelKind::kAutoint, false,
                   "autoint_0.w[64] autoint_0.ln_gamma[4] autoint_0.ln_beta[4] autoint_1.w[96] "
                   "autoint_1.ln_gamma[6] autoint_1.ln_beta[6] autoint_out.w[30] "
                   "autoint.dense_w[8] wide.dense_w[2] wide.bias[1] | 55ca7da98bd0a6ca"},
        LayoutCase{
            "autoint_no_wide", ModelKind::kAutoint, true,
            "autoint_0.w[64] autoint_0.ln_gamma[4] autoint_0.ln_beta[4] autoint_1.w[96] "
            "autoint_1.ln_gamma[6] autoint_1.ln_beta[6] autoint_out.w[30] autoint.dense_w[8] "
            "fc_0.w[104] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] | 34d73c0b52a351ef"},
        LayoutCase{"flen", ModelKind::kFlen, false,
                   "fc_0.w[108] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] "
                   "flen.kernel_mf[3] flen.fc_w[25] flen.fc_b[5] flen.out_w[5] | 79eda0d5f929c641"},
        LayoutCase{
            "fat_deepffm", ModelKind::kFatDeepffm, true,
            "cen.fc_0.w[625] cen.fc_0.b[25] cen.fc_1.w[625] cen.fc_1.b[25] fat_deepffm.dense_w[20] "
            "fc_0.w[104] fc_0.b[4] fc_1.w[12] fc_1.b[3] fc_2.w[3] fc_2.b[1] | 1efcee2a2b0e2433"}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gpubox::trainer
