// PaddleRec model folders' configs, their runner and hyper_parameters unchanged (issue 32, items
// 1 and 2): each trains the network its folder names (dlrm, xdeepfm, deepfefm, autoint, flen),
// its PaddleRec keys checked against the values GPUBox's knobs end with in the TrainerConfig
// gpubox_train runs; the keys its network would need and GPUBox does not build refused by name.
// Each folder is a NetworkCase (its config, what GPUBox makes of it, the changes it refuses) under
// one test body.
#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/config_enums.hpp"
#include "common/config/network_shape.hpp"
#include "table/sparse_config.hpp"
#include "tests/integration/paddlerec_folder_configs.hpp"
#include "tests/integration/paddlerec_keys_test_util.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer {
namespace {

using paddlerec_test::contains;
using paddlerec_test::error_of;
using paddlerec_test::kAutoint;
using paddlerec_test::kDlrm;
using paddlerec_test::parse;

// A change of a folder's config that GPUBox refuses, and a part of the error that says why.
struct Refusal {
  std::vector<std::string> overrides;
  std::string message;
};

// A change of a folder's config that GPUBox takes, and what the config then holds.
struct Variant {
  std::vector<std::string> overrides;
  std::function<void(const TrainerConfig&)> check;
};

// A model folder's config.yaml and what GPUBox makes of it.
struct NetworkCase {
  NetworkCase(const char* folder, const char* yaml, ModelKind model)
      : folder(folder), yaml(yaml), model(model) {}
  const char* folder;  // models/rank/<folder>; the test's name
  const char* yaml;
  ModelKind model;
  int mf_dim = 0;  // TrainerConfig::mf_dim(): the embedding values after embed_w
  int dense_dim = 0;
  int sparse_slots = 0;
  std::function<void(const TrainerConfig&)> check;  // its network's own keys
  std::vector<Variant> variants;
  std::vector<Refusal> refusals;
};

void PrintTo(const NetworkCase& network, std::ostream* out) { *out << network.folder; }

std::string joined(const std::vector<std::string>& overrides) {
  std::string out;
  for (const std::string& o : overrides) out += (out.empty() ? "-o " : " -o ") + o;
  return out;
}

NetworkCase dlrm() {
  NetworkCase dlrm{"dlrm", kDlrm, ModelKind::kDlrm};
  dlrm.mf_dim = 15;  // embed_w + 15 embedx values: the bottom output's 16
  dlrm.dense_dim = 13;
  dlrm.sparse_slots = 26;
  dlrm.check = [](const TrainerConfig& c) {
    EXPECT_EQ(c.hyper.bot_layer_sizes, (std::vector<int>{512, 256, 64, 16}));
    EXPECT_EQ(c.hyper.fc_sizes, (std::vector<int>{512, 256}));
    EXPECT_EQ(c.model_keys.at("hyper_parameters.bot_layer_sizes"), "[512, 256, 64, 16]");
    // top_layer_sizes' last 2: its MLPLayer's two-class output, ReLU'd, normalised, softmax.
    EXPECT_EQ(c.hyper.dlrm_output, DlrmOutput::kSoftmax2);
    EXPECT_EQ(c.dense_model_config().dlrm_output, DlrmOutput::kSoftmax2);
    EXPECT_EQ(c.model_keys.at("hyper_parameters.dlrm_output"), "softmax2");
  };
  const auto logit = [](const TrainerConfig& c) {
    EXPECT_EQ(c.hyper.dlrm_output, DlrmOutput::kLogit);
    EXPECT_EQ(c.model_keys.at("hyper_parameters.dlrm_output"), "logit");
  };
  dlrm.variants = {{{"hyper_parameters.top_layer_sizes=[64, 1]"},
                    [logit](const TrainerConfig& c) {
                      EXPECT_EQ(c.hyper.fc_sizes, (std::vector<int>{64}));
                      logit(c);
                    }},
                   {{"hyper_parameters.top_layer_sizes=[64, 2]"},
                    [](const TrainerConfig& c) {
                      EXPECT_EQ(c.hyper.fc_sizes, (std::vector<int>{64}));
                      EXPECT_EQ(c.hyper.dlrm_output, DlrmOutput::kSoftmax2);
                    }},
                   {{"hyper_parameters.dlrm_output=logit"}, logit},
                   // Another network on the folder keeps its logit.
                   {{"hyper_parameters.model=dnn"}, logit}};
  dlrm.refusals = {
      {{"hyper_parameters.top_layer_sizes=[512, 256, 3]"},
       "top_layer_sizes: its last entry is the output layer, which GPUBox builds as PaddleRec's "
       "two-class softmax (2) or one logit (1)"},
      {{"hyper_parameters.top_layer_sizes=[64, 1]", "hyper_parameters.dlrm_output=softmax2"},
       "p.yaml: -o: hyper_parameters.dlrm_output: softmax2 builds a 2-wide output layer, but "
       "hyper_parameters.top_layer_sizes (-o) ends in 1"},
      {{"hyper_parameters.model=dnn", "hyper_parameters.dlrm_output=softmax2"},
       "p.yaml: hyper_parameters.dlrm_output=softmax2 is dlrm's output layer, but the network is "
       "dnn"},
      // The interaction's vectors: the bottom output and every slot's embedding, one width.
      {{"hyper_parameters.sparse_feature_dim=9"},
       "p.yaml: dlrm's dot interaction needs the bottom MLP's output (the last of "
       "hyper_parameters.bot_layer_sizes: 16) as wide as every slot's embedding "
       "(hyper_parameters.sparse_feature_dim: 9)"},
      {{"hyper_parameters.slot_dims={3: 7}"}, "hyper_parameters.slot_dims gives slot 3 8"},
      {{"hyper_parameters.dense_input_dim=0"}, "dlrm's bottom MLP reads the dense features"},
      {{"hyper_parameters.num_field=27"}, "and 26 sparse fields (its dlrm)"}};
  return dlrm;
}

// xdeepfm's config.yaml (its runner and hyper_parameters, unchanged): the network its folder
// names, layer_sizes_cin, and layer_sizes_dnn as its DNN (its net reads that, not fc_sizes).
constexpr const char* kXdeepfm = R"(workspace: "models/rank/xdeepfm"
runner:
  train_data_dir: "data/sample_data/train"
  train_reader_path: "criteo_reader" # importlib format
  use_gpu: False
  use_auc: True
  train_batch_size: 5
  epochs: 1
  print_interval: 2
  #model_init_path: "output_model/0" # init model
  model_save_path: "output_model_xdeepfm"
  test_data_dir: "data/sample_data/train"
  infer_reader_path: "criteo_reader" # importlib format
  infer_batch_size: 5
  infer_load_path: "output_model_xdeepfm"
  infer_start_epoch: 0
  infer_end_epoch: 1
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1000001
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128, 32]
  layer_sizes_dnn: [512, 256, 128]
  layer_sizes_cin: [128, 32]
  distributed_embedding: 0
)";

NetworkCase xdeepfm() {
  NetworkCase xdeepfm{"xdeepfm", kXdeepfm, ModelKind::kXdeepfm};
  xdeepfm.mf_dim = 8;  // embed_w (its first-order weight) + 8 field values
  xdeepfm.dense_dim = 13;
  xdeepfm.sparse_slots = 26;
  xdeepfm.check = [](const TrainerConfig& c) {
    const DenseModelConfig model = c.dense_model_config();
    EXPECT_EQ(model.cin_layer_sizes, (std::vector<int>{128, 32}));
    EXPECT_EQ(model.fc_sizes, (std::vector<int>{512, 256, 128}));  // layer_sizes_dnn, as its net
    EXPECT_EQ(c.model_keys.at("hyper_parameters.layer_sizes_cin"), "[128, 32]");
  };
  // Without layer_sizes_dnn its DNN is fc_sizes; another network refuses layer_sizes_dnn.
  xdeepfm.variants = {{{"hyper_parameters.layer_sizes_dnn=[]"}, [](const TrainerConfig& c) {
                         EXPECT_EQ(c.hyper.fc_sizes, (std::vector<int>{512, 256, 128, 32}));
                       }}};
  xdeepfm.refusals = {{{"hyper_parameters.model=dnn"},
                       "p.yaml: hyper_parameters.layer_sizes_dnn is xdeepfm's, flen's and "
                       "fat_deepffm's DNN, but the model is dnn, which reads "
                       "hyper_parameters.fc_sizes"}};
  return xdeepfm;
}

// deepfefm's config.yaml (its runner and hyper_parameters, unchanged but the batch): the network
// its folder names, with fc_sizes as its DNN and 39 fields of 8 (741 pair matrices).
constexpr const char* kDeepFefm = R"(workspace: "models/rank/deepfefm"
runner:
  train_data_dir: "data/sample_data/train"
  train_reader_path: "criteo_reader" # importlib format
  use_gpu: False
  use_auc: True
  train_batch_size: 16
  epochs: 2
  print_interval: 2
  #model_init_path: "output_model/0" # init model
  model_save_path: "output_model_deepfefm"
  test_data_dir: "data/sample_data/train"
  infer_reader_path: "criteo_reader" # importlib format
  infer_batch_size: 16
  infer_load_path: "output_model_deepfefm"
  infer_start_epoch: 0
  infer_end_epoch: 2
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1100005
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128, 32]
  distributed_embedding: 0
)";

NetworkCase deepfefm() {
  NetworkCase deepfefm{"deepfefm", kDeepFefm, ModelKind::kDeepFefm};
  deepfefm.mf_dim = 8;  // embed_w (its first-order weight) + 8 embedding values
  deepfefm.dense_dim = 13;
  deepfefm.sparse_slots = 26;
  deepfefm.check = [](const TrainerConfig& c) {
    const DenseModelConfig model = c.dense_model_config();
    EXPECT_EQ(model.kind, ModelKind::kDeepFefm);
    EXPECT_EQ(model.fc_sizes, (std::vector<int>{512, 256, 128, 32}));
  };
  // Its fields' pair matrices are k x k: slots of several widths are refused naming the key.
  deepfefm.refusals = {
      {{"hyper_parameters.slot_dims={1: 4}"}, "deepfefm's fields share one width"}};
  return deepfefm;
}

NetworkCase autoint() {
  NetworkCase autoint{"autoint", kAutoint, ModelKind::kAutoint};
  autoint.mf_dim = 16;  // embedding_dim; embed_w (its feature_bias) comes first
  autoint.dense_dim = 13;
  autoint.sparse_slots = 26;
  autoint.check = [](const TrainerConfig& c) {
    const DenseModelConfig model = c.dense_model_config();
    EXPECT_EQ(model.attn_layer_sizes, (std::vector<int>{64, 64, 64}));
    EXPECT_EQ(model.attn_heads, 2);
    EXPECT_TRUE(model.attn_residual && model.attn_scaling && model.attn_use_wide);
    EXPECT_TRUE(model.fc_sizes.empty());
  };
  // config_bigdata.yaml's switches: a DNN over the fields and no first-order term.
  autoint.variants = {
      {{"hyper_parameters.fc_sizes=[400, 400, 400]", "hyper_parameters.use_wide=False",
        "hyper_parameters.scaling=0"},
       [](const TrainerConfig& c) {
         EXPECT_EQ(c.dense_model_config().fc_sizes, (std::vector<int>{400, 400, 400}));
         EXPECT_FALSE(c.dense_model_config().attn_use_wide);
         EXPECT_FALSE(c.dense_model_config().attn_scaling);
       }}};
  // Heads that do not divide a layer, and fc_sizes [] for a network whose DNN needs a layer.
  autoint.refusals = {
      {{"hyper_parameters.head_num=3"},
       "p.yaml: hyper_parameters.attn_layer_sizes has 64, which head_num 3 does not divide"},
      {{"hyper_parameters.model=dnn"},
       "p.yaml: hyper_parameters.fc_sizes is [], but dnn needs a hidden layer in its dnn (only "
       "autoint takes [] for no dnn)"}};
  return autoint;
}

// flen's config.yaml (its runner and hyper_parameters, unchanged): the network its folder names,
// its reader's Avazu lines (sparse_inputs_slots 22 fields, the label not among them, no dense
// features), its groups (sparse_num_field 3: the net's 13 + 3 + 6), its DNN from layer_sizes_dnn,
// sparse_feature_dim 32 the key's whole embedding, its dense Adagrad with Paddle's epsilon.
constexpr const char* kFlen = R"(workspace: "models/rank/flen"
runner:
  train_data_dir: "./data/sample_data/train"
  train_reader_path: "avazu_reader" # importlib format
  use_gpu: False
  use_auc: True
  train_batch_size: 1 #512
  epochs: 1
  print_interval: 2
  #model_init_path: "output_model/0" # init model
  model_save_path: "output_model_flen"
  test_data_dir:  "./data/sample_data/train" #"../../../../data/test"
  infer_reader_path: "avazu_reader" # importlib format
  infer_batch_size: 3 #512
  infer_load_path: "output_model_flen"
  infer_start_epoch: 0
  infer_end_epoch: 1
hyper_parameters:
  optimizer:
    class: Adagrad
    learning_rate: 0.04
    strategy: async
  sparse_inputs_slots: 22
  sparse_feature_number: 20 #1544488
  sparse_num_field: 3
  sparse_feature_dim: 32
  layer_sizes_dnn: [64, 32]
  distributed_embedding: 0
)";

NetworkCase flen() {
  NetworkCase flen{"flen", kFlen, ModelKind::kFlen};
  flen.mf_dim = 31;  // embed_w and embedx: the key's 32 values
  flen.dense_dim = 0;
  flen.sparse_slots = 22;
  flen.check = [](const TrainerConfig& c) {
    const DenseModelConfig model = c.dense_model_config();
    EXPECT_EQ(model.flen_groups, (std::vector<int>{13, 3, 6}));
    EXPECT_EQ(model.fc_sizes, (std::vector<int>{64, 32}));
    EXPECT_EQ(c.dataset.data_format, dataset::DataFormat::kAvazu);
    EXPECT_EQ(c.hyper.optimizer.kind, config::DenseOptimizerKind::kAdagrad);
    EXPECT_FLOAT_EQ(c.hyper.optimizer.epsilon, 1e-6f);
    EXPECT_FLOAT_EQ(c.hyper.optimizer.initial_accumulator, 1e-3f);
    // A save records the epsilon used (a resume compares it), not the key's Adam default.
    EXPECT_EQ(c.model_keys.at("hyper_parameters.optimizer.epsilon"), "1e-06");
  };
  flen.refusals = {
      // Another network set knowingly on flen's folder: a field-aware one's rows as the table
      // part (gpubox_server) counts the fields differ from the avazu data's, refused naming both.
      {{"hyper_parameters.model=ffm", "hyper_parameters.sparse_feature_dim=3",
        "hyper_parameters.layer_sizes_dnn=[]"},
       "p.yaml: ffm's rows are 68 values wide as the table part (and gpubox_server) reads this "
       "config, but the data's 22 fields"},
      // A format the config names is read as that format: slots counted with the label (21
      // here), which flen's groups then do not cover.
      {{"runner.data_format=slot"},
       "field_group_sizes group 22 slots, but the data has 21 sparse slots"},
      // The groups must be as many as sparse_num_field says and cover the fields.
      {{"hyper_parameters.sparse_num_field=2"},
       "p.yaml: flen's hyper_parameters.sparse_num_field is 2 field groups, but "
       "hyper_parameters.field_group_sizes lists 3"},
      {{"hyper_parameters.field_group_sizes=[13, 3, 5]"},
       "field_group_sizes group 21 slots, but the data has 22 sparse slots"},
      {{"hyper_parameters.model=dnn"},
       "layer_sizes_dnn is xdeepfm's, flen's and fat_deepffm's DNN"}};
  return flen;
}

class PaddleRecNetwork : public ::testing::TestWithParam<NetworkCase> {};

TEST_P(PaddleRecNetwork, ConfigTrainsTheNetworkItsFolderNames) {
  const NetworkCase& network = GetParam();
  const StatusOr<TrainerConfig> c = parse(network.yaml);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hyper.model, network.model);
  EXPECT_EQ(c->mf_dim(), network.mf_dim);
  EXPECT_EQ(c->dataset.dense_dim, network.dense_dim);
  EXPECT_EQ(c->num_sparse_slots(), network.sparse_slots);
  if (network.check) network.check(c.value());
  for (const Variant& variant : network.variants) {
    SCOPED_TRACE(joined(variant.overrides));
    const StatusOr<TrainerConfig> changed = parse(network.yaml, variant.overrides);
    ASSERT_TRUE(changed.ok()) << changed.status().to_string();
    variant.check(changed.value());
  }
  for (const Refusal& refusal : network.refusals) {
    const std::string error = error_of(network.yaml, refusal.overrides);
    EXPECT_TRUE(contains(error, refusal.message))
        << joined(refusal.overrides) << ": " << error << "\nwanted: " << refusal.message;
  }
}

INSTANTIATE_TEST_SUITE_P(ModelFolders, PaddleRecNetwork,
                         ::testing::Values(dlrm(), xdeepfm(), deepfefm(), autoint(), flen()),
                         [](const ::testing::TestParamInfo<NetworkCase>& info) {
                           return std::string(info.param.folder);
                         });

}  // namespace
}  // namespace gpubox::trainer
