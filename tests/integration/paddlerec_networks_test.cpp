// PaddleRec model folders' configs, their runner and hyper_parameters unchanged (issue 32, items
// 1 and 2): each trains the network its folder names (dlrm, xdeepfm, deepfefm, autoint, flen),
// its PaddleRec keys checked against the values GPUBox's knobs end with in the TrainerConfig
// gpubox_train runs; the keys its network would need and GPUBox does not build refused by name;
// and the rule a model folder's config steps its embedding rows under (its Adam, said at start).
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
#include "tests/integration/paddlerec_keys_test_util.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer {
namespace {

using paddlerec_test::contains;
using paddlerec_test::error_of;
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

// dlrm's config.yaml (its runner and hyper_parameters, unchanged): the network its folder names,
// bot_layer_sizes, top_layer_sizes as fc_sizes and the logit, num_field as its sparse fields.
constexpr const char* kDlrm = R"(workspace: "models/rank/dlrm"
runner:
  train_data_dir: "data/sample_data/train"
  train_reader_path: "criteo_reader"
  use_gpu: False
  use_xpu: False
  use_auc: True
  train_batch_size: 2
  epochs: 3
  print_interval: 2
  model_save_path: "output_model_dlrm"
  infer_batch_size: 2
  infer_reader_path: "criteo_reader"
  test_data_dir: "data/sample_data/train"
  infer_load_path: "output_model_dlrm"
  infer_start_epoch: 0
  infer_end_epoch: 3
  sync_mode: "async"
  split_file_list: False
  thread_num: 1
  num_workers: 0
  inference: False
  save_inference_feed_varnames: ["C1","C2","dense_input"]
  save_inference_fetch_varnames: ["sigmoid_0.tmp_0"]
hyper_parameters:
  optimizer:
    class: SGD
    learning_rate: 0.1
    strategy: async
  sparse_inputs_slots: 27
  dense_input_dim: 13
  bot_layer_sizes: [512, 256, 64, 16]
  sparse_feature_number: 1000001
  sparse_feature_dim: 16
  top_layer_sizes: [512, 256, 2]
  num_field: 26
)";

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

// autoint's config.yaml (its runner and hyper_parameters, unchanged): the network its folder
// names, embedding_dim as the embedding (sparse_feature_dim one more), its interacting layers,
// fc_sizes [] (no DNN); feature_number, use_sparse and distributed_embedding change nothing.
constexpr const char* kAutoint = R"(workspace: "models/rank/autoint"
runner:
  train_data_dir: "data/sample_data/train"
  train_reader_path: "criteo_reader" # importlib format
  use_gpu: True
  use_xpu: False   # Enable this option only if you have an xpu device
  use_auc: True
  train_batch_size: 2
  epochs: 3
  print_interval: 2
  # model_init_path: "output_model_deepfm/2" # init model
  model_save_path: "output_model_autoint"
  test_data_dir: "data/sample_data/train"
  infer_reader_path: "criteo_reader" # importlib format
  infer_batch_size: 2
  infer_load_path: "output_model_autoint"
  infer_start_epoch: 0
  infer_end_epoch: 3
  # use fleet
  use_fleet: False
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
    strategy: async
  feature_number: 1000001
  embedding_dim: 16
  fc_sizes: [] #[256, 128]
  use_residual: True
  scaling: True
  use_wide: True
  use_sparse: True
  head_num: 2
  num_field: 39
  attn_layer_sizes: [64,64,64]
  distributed_embedding: 0
)";

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

// The start line a config's embedding rows' rule gives (table::paddlerec_rows_rule_note).
std::string rows_note(const std::string& yaml, const std::vector<std::string>& o = {}) {
  StatusOr<config::ConfigDocument> doc = config::ConfigDocument::parse(yaml, "/base", o, "p.yaml");
  return doc.ok() ? table::paddlerec_rows_rule_note(*doc) : doc.status().message();
}

// A PaddleRec model folder's config that names no sparse rule steps its embedding rows under its
// Adam, as PaddleRec's trainer and Paddle's parameter server do (not silently under Paddle's
// parameter-server adagrad, which memorises a small data set in two epochs), and says so at
// start; a rule named by any of its keys, a config outside a model folder and dlrm's SGD keep
// hyper_parameters.sparse_optimizer.*, the last said at start too.
TEST(PaddleRecKeys, EmbeddingRowsStepUnderThePaddleRecConfigsAdam) {
  const StatusOr<TrainerConfig> c = parse(
      kAutoint,
      {"hyper_parameters.optimizer.learning_rate=0.002", "hyper_parameters.optimizer.beta1=0.8"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const table::SparseOptimizerConfig& o = c->sparse.optimizer;
  EXPECT_EQ(o.kind, table::SparseOptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.002f);
  EXPECT_FLOAT_EQ(o.mf_learning_rate, 0.002f);
  EXPECT_FLOAT_EQ(o.beta1_decay_rate, 0.8f);
  EXPECT_FLOAT_EQ(o.beta2_decay_rate, 0.999f);
  EXPECT_FLOAT_EQ(o.ada_epsilon, 1e-8f);
  EXPECT_FLOAT_EQ(o.mf_initial_range, 0.0001f);  // GPUBox's start (the line says so)
  EXPECT_FLOAT_EQ(c->sparse.embedx_threshold, 0.0f);
  EXPECT_TRUE(contains(rows_note(kAutoint),
                       "p.yaml: the embedding rows step under PaddleRec's "
                       "hyper_parameters.optimizer.class (Adam at learning_rate 0.001)"))
      << rows_note(kAutoint);
  for (const std::string rule : {"hyper_parameters.sparse_optimizer.class=adagrad",
                                 "hyper_parameters.sparse_optimizer.learning_rate=0.05",
                                 "hyper_parameters.sparse_optimizer.mf_learning_rate=0.05",
                                 "hyper_parameters.sparse_optimizer.embedx_threshold=10",
                                 "table_parameters.t.accessor.embedx_threshold=10"}) {
    const StatusOr<TrainerConfig> own = parse(kAutoint, {rule});
    ASSERT_TRUE(own.ok()) << rule << ": " << own.status().to_string();
    EXPECT_EQ(own->sparse.optimizer.kind, table::SparseOptimizerKind::kAdagrad) << rule;
    EXPECT_FLOAT_EQ(own->sparse.optimizer.mf_learning_rate, 0.05f) << rule;
    EXPECT_FLOAT_EQ(own->sparse.embedx_threshold, 10.0f) << rule;
    EXPECT_EQ(rows_note(kAutoint, {rule}), "") << rule;
  }
  // Outside a model folder the same keys are GPUBox's own: its dense optimizer only.
  std::string own_config = kAutoint;
  own_config.erase(0, own_config.find('\n') + 1);  // the workspace line
  const std::vector<std::string> as_autoint = {"hyper_parameters.model=autoint"};
  const StatusOr<TrainerConfig> gpubox = parse(own_config, as_autoint);
  ASSERT_TRUE(gpubox.ok()) << gpubox.status().to_string();
  EXPECT_EQ(gpubox->hyper.model, ModelKind::kAutoint);
  EXPECT_EQ(gpubox->sparse.optimizer.kind, table::SparseOptimizerKind::kAdagrad);
  EXPECT_FLOAT_EQ(gpubox->sparse.embedx_threshold, 10.0f);
  EXPECT_EQ(rows_note(own_config, as_autoint), "");
  // dlrm's SGD with GPUBox's one-logit output (its folder's network, with PaddleRec's output,
  // trains Adam: DlrmTrainsItsNetsAdam): a step on a row that scales with the batch, which the
  // per-key rule does not mirror; the rows keep the sparse rule, and the start line says so.
  const std::vector<std::string> logit = {"hyper_parameters.dlrm_output=logit"};
  const StatusOr<TrainerConfig> dlrm = parse(kDlrm, logit);
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->hyper.optimizer.kind, config::DenseOptimizerKind::kSgd);
  EXPECT_EQ(dlrm->sparse.optimizer.kind, table::SparseOptimizerKind::kAdagrad);
  EXPECT_TRUE(contains(rows_note(kDlrm, logit),
                       "p.yaml: the embedding rows step under "
                       "hyper_parameters.sparse_optimizer.*"))
      << rows_note(kDlrm, logit);
  EXPECT_TRUE(contains(rows_note(kDlrm, logit),
                       "not under PaddleRec's hyper_parameters.optimizer.class "
                       "(SGD at learning_rate"))
      << rows_note(kDlrm, logit);
}

// PaddleRec's dlrm net steps every parameter with Adam at its learning rate whatever class says
// (static_model.py, dygraph_model.py). So does GPUBox's dlrm with PaddleRec's output layer (its
// folder's default: top_layer_sizes ends in 2), the rows too (per row with its sync_mode async, as
// Paddle's parameter server; and with sync_mode gpubox, as PSGPU), and the start line says class
// has no effect; with the one-logit output (which diverges under Adam at 0.1 on the folder's
// batches of 2) GPUBox follows the class and says so.
TEST(PaddleRecKeys, DlrmTrainsItsNetsAdam) {
  const auto note = [](const std::vector<std::string>& o) {
    StatusOr<config::ConfigDocument> doc =
        config::ConfigDocument::parse(kDlrm, "/base", o, "p.yaml");
    return doc.ok() ? config::dense_optimizer_note(*doc) : doc.status().message();
  };
  EXPECT_TRUE(contains(note({}),
                       "hyper_parameters.optimizer.class: SGD has no effect here: PaddleRec's dlrm "
                       "network steps every parameter"))
      << note({});
  const std::vector<std::string> logit = {"hyper_parameters.dlrm_output=logit"};
  EXPECT_TRUE(contains(note(logit),
                       "hyper_parameters.optimizer.class: SGD as written, though PaddleRec's dlrm "
                       "network steps every parameter"))
      << note(logit);
  EXPECT_TRUE(contains(note(logit), "-o hyper_parameters.dlrm_output=softmax2")) << note(logit);
  // The output layer top_layer_sizes chose is said at start, unless the config set it.
  const auto output_note = [](const std::vector<std::string>& o) {
    StatusOr<config::ConfigDocument> doc =
        config::ConfigDocument::parse(kDlrm, "/base", o, "p.yaml");
    return doc.ok() ? dlrm_output_note(*doc) : doc.status().message();
  };
  EXPECT_TRUE(contains(output_note({}),
                       "hyper_parameters.dlrm_output: softmax2, PaddleRec's dlrm folder's output "
                       "layer for its hyper_parameters.top_layer_sizes' last entry 2 (2 wide, "
                       "ReLU'd and batch-normalised"))
      << output_note({});
  EXPECT_TRUE(contains(note({}),
                       "softmax2, this folder's default for top_layer_sizes' last 2): "
                       "Adam at 0.1 for the dense net (the embedding rows: the line"))
      << note({});
  const std::vector<std::string> asked = {"hyper_parameters.dlrm_output=softmax2"};
  EXPECT_TRUE(contains(note(asked), "softmax2, as the config sets it): Adam")) << note(asked);
  // A sparse rule's own keys keep the rows under it: the rows' line says so, not the dense one.
  const std::vector<std::string> adagrad = {"hyper_parameters.sparse_optimizer.class=adagrad"};
  EXPECT_FALSE(contains(note(adagrad), "and the rows")) << note(adagrad);
  EXPECT_TRUE(contains(rows_note(kDlrm, adagrad),
                       "p.yaml: the embedding rows step under hyper_parameters.sparse_optimizer.* "
                       "as this config sets them (class adagrad), not under the optimizer "
                       "PaddleRec's dlrm network steps every parameter with whatever "
                       "hyper_parameters.optimizer.class says (Adam at learning_rate 0.1)"))
      << rows_note(kDlrm, adagrad);
  EXPECT_EQ(output_note(logit), "");
  EXPECT_EQ(output_note({"hyper_parameters.dlrm_output=softmax2"}), "");
  EXPECT_EQ(output_note({"hyper_parameters.top_layer_sizes=[64, 1]"}), "");
  const StatusOr<TrainerConfig> sgd = parse(kDlrm, logit);
  ASSERT_TRUE(sgd.ok()) << sgd.status().to_string();
  EXPECT_EQ(sgd->hyper.optimizer.kind, config::DenseOptimizerKind::kSgd);
  const std::vector<std::string> adam = {"hyper_parameters.optimizer.class=Adam"};
  EXPECT_EQ(note(adam), "");
  EXPECT_EQ(note({"hyper_parameters.model=dlrm"}), note({}));  // the folder still says it
  // The folder's config as it is, and with class Adam, train the same: Adam, the rows too.
  for (const std::vector<std::string>& o : {std::vector<std::string>{}, adam}) {
    const StatusOr<TrainerConfig> dlrm = parse(kDlrm, o);
    ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
    EXPECT_EQ(dlrm->hyper.optimizer.kind, config::DenseOptimizerKind::kAdam);
    EXPECT_EQ(dlrm->model_keys.at("hyper_parameters.optimizer.class"), "Adam");
    EXPECT_EQ(dlrm->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam);
    EXPECT_TRUE(contains(rows_note(kDlrm, o), "(Adam at learning_rate 0.1)"))
        << rows_note(kDlrm, o);
  }
  const StatusOr<TrainerConfig> dlrm = parse(kDlrm, adam);
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->hyper.optimizer.kind, config::DenseOptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(dlrm->hyper.optimizer.learning_rate, 0.1f);
  EXPECT_EQ(dlrm->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(dlrm->sparse.optimizer.learning_rate, 0.1f);
  EXPECT_FLOAT_EQ(dlrm->sparse.optimizer.mf_learning_rate, 0.1f);
  EXPECT_EQ(dlrm->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerRow);
  EXPECT_TRUE(contains(rows_note(kDlrm, adam), "(Adam at learning_rate 0.1)"));
  EXPECT_TRUE(contains(rows_note(kDlrm, adam), "adam_bias_correction per_row"));
  const StatusOr<TrainerConfig> cards = parse(kDlrm, {adam[0], "runner.sync_mode=gpubox"});
  ASSERT_TRUE(cards.ok()) << cards.status().to_string();
  EXPECT_EQ(cards->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerRow);
  EXPECT_TRUE(contains(rows_note(kDlrm, {adam[0], "runner.sync_mode=gpubox"}),
                       "PSGPU's SparseAdamOptimizer"));
}

// hyper_parameters.sparse_optimizer.adam_bias_correction: per_row unless set, but per_table for
// a PaddleRec config whose rows take its Adam and that names no runner.sync_mode (Paddle's
// training without a parameter server); per_table refused where no table step exists (the
// parameter-server modes) and for a rule without moments; asked for, the gpubox schedule has it.
TEST(PaddleRecKeys, AdamBiasCorrectionFollowsPaddlesModeAndIsRefusedWhereUndefined) {
  const std::string key = "hyper_parameters.sparse_optimizer.adam_bias_correction";
  const StatusOr<TrainerConfig> autoint = parse(kAutoint);
  ASSERT_TRUE(autoint.ok()) << autoint.status().to_string();
  EXPECT_EQ(autoint->runner.sync_mode, config::SyncMode::kGpubox);
  EXPECT_EQ(autoint->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerTable);
  const StatusOr<TrainerConfig> as_set = parse(kAutoint, {key + "=per_row"});
  ASSERT_TRUE(as_set.ok()) << as_set.status().to_string();
  EXPECT_EQ(as_set->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerRow);
  // GPUBox's own rule keeps per_row unless asked, also as adam.
  std::string own_config = kAutoint;
  own_config.erase(0, own_config.find('\n') + 1);  // the workspace line
  for (const std::vector<std::string>& o :
       {std::vector<std::string>{"hyper_parameters.model=autoint"},
        {"hyper_parameters.model=autoint", "hyper_parameters.sparse_optimizer.class=adam"}}) {
    const StatusOr<TrainerConfig> own = parse(own_config, o);
    ASSERT_TRUE(own.ok()) << own.status().to_string();
    EXPECT_EQ(own->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerRow);
  }
  const StatusOr<TrainerConfig> asked = parse(
      own_config, {"hyper_parameters.model=autoint",
                   "hyper_parameters.sparse_optimizer.class=shared_adam", key + "=per_table"});
  ASSERT_TRUE(asked.ok()) << asked.status().to_string();
  EXPECT_EQ(asked->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerTable);
  for (const char* mode : {"async", "sync", "geo"}) {
    const std::string sync_mode = std::string("runner.sync_mode=") + mode;
    const StatusOr<TrainerConfig> ps = parse(kAutoint, {sync_mode});
    ASSERT_TRUE(ps.ok()) << mode << ": " << ps.status().to_string();
    EXPECT_EQ(ps->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerRow) << mode;
    const std::string refused = error_of(kAutoint, {sync_mode, key + "=per_table"});
    EXPECT_TRUE(contains(refused, "per_table counts the table's steps, which runner.sync_mode " +
                                      std::string(mode) + " does not have"))
        << refused;
  }
  const StatusOr<TrainerConfig> psgpu = parse(kAutoint, {"runner.sync_mode=gpubox"});
  ASSERT_TRUE(psgpu.ok()) << psgpu.status().to_string();
  EXPECT_EQ(psgpu->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerRow);
  const StatusOr<TrainerConfig> psgpu_asked =
      parse(kAutoint, {"runner.sync_mode=gpubox", key + "=per_table"});
  ASSERT_TRUE(psgpu_asked.ok()) << psgpu_asked.status().to_string();
  EXPECT_EQ(psgpu_asked->sparse.optimizer.bias_correction, table::AdamBiasCorrection::kPerTable);
  const std::string adagrad =
      error_of(kAutoint, {"hyper_parameters.sparse_optimizer.class=adagrad", key + "=per_table"});
  EXPECT_TRUE(contains(adagrad, "rows step under adagrad")) << adagrad;
}

// A save records the correction the rows use, derived or set (a resume compares it): a run
// derived per_table is not resumed as per_row by naming sync_mode gpubox, and setting the value
// it derived is no difference.
TEST(PaddleRecKeys, ASaveRecordsTheAdamBiasCorrectionUsed) {
  const std::string key = "hyper_parameters.sparse_optimizer.adam_bias_correction";
  const auto recorded = [&](const std::vector<std::string>& o) {
    const StatusOr<TrainerConfig> c = parse(kAutoint, o);
    return c.ok() ? c->model_keys.at(key) : c.status().message();
  };
  EXPECT_EQ(recorded({}), "per_table");
  EXPECT_EQ(recorded({key + "=per_table"}), "per_table");
  EXPECT_EQ(recorded({"runner.sync_mode=gpubox"}), "per_row");
  EXPECT_EQ(recorded({"runner.sync_mode=gpubox", key + "=per_table"}), "per_table");
  EXPECT_EQ(recorded({key + "=per_row"}), "per_row");
}

}  // namespace
}  // namespace gpubox::trainer
