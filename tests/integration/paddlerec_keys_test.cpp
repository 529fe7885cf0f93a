// PaddleRec's names for GPUBox's knobs (issue 32, item 1), each checked against the value the
// knob ends with in the TrainerConfig gpubox_train runs (the sparse rule, the dataset, the
// network), not against the document alone: slot_dnn's keys and its table_parameters, dcn_v2's
// low_rank, DCN-Mix and l2_reg_cross, dcn's and dcn_v2's own configs unchanged,
// logistic_regression's reg and num_field, init_model_path, 1/0 for true/false; the
// keys with no effect listed with why; the keys that would change the model and are not built
// refused by name; PaddleRec's names known to "did you mean".
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "table/sparse_config.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer {
namespace {

StatusOr<TrainerConfig> parse(const std::string& yaml, const std::vector<std::string>& o = {}) {
  return parse_trainer_config(yaml, "/base", o, "p.yaml");
}

std::string error_of(const std::string& yaml, const std::vector<std::string>& o = {}) {
  const StatusOr<TrainerConfig> c = parse(yaml, o);
  return c.ok() ? "(loaded)" : c.status().message();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// slot_dnn's config_online.yaml, its values changed from GPUBox's defaults where they equal
// them, so that each mapping is seen to apply.
constexpr const char* kSlotDnn = R"(runner:
  use_gpu: 0
  init_model_path: "output_model/3"
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 5e-6
    adam_lazy_mode: True
  dict_dim : 1000000
  emb_dim : 13
  sparse_feature_dim: 13
  slot_num: 300
  layer_sizes: [512, 256, 128]
table_parameters:
  embedding:
    table_class: "MemorySparseTable"
    shard_num: 10
    accessor:
      accessor_class: "SparseAccessor"
      fea_dim: 15
      embedx_dim: 12
      embedx_threshold: 7
      embed_sgd_param:
        name: "SparseAdamSGDRule"
        adam:
          learning_rate: 0.07
          initial_range: 0.002
          weight_bounds: [-9.0, 8.0]
          beta1_decay_rate: 0.8
      embedx_sgd_param:
        name: "SparseAdamSGDRule"
        adam:
          learning_rate: 0.03
          initial_range: 0.0003
          weight_bounds: [-7.0, 6.0]
          beta1_decay_rate: 0.8
      ctr_accessor_param:
        nonclk_coeff: 0.2
        click_coeff: 2.0
        base_threshold: 1.5
        delta_threshold: 0.25
        delta_keep_days: 16.0
        show_click_decay_rate: 0.97
        delete_threshold: 0.7
        delete_after_unseen_days: 20.0
        ssd_unseenday_threshold: 1
)";

TEST(PaddleRecKeys, SlotDnnKeysAndItsTableSetGpuboxsKnobs) {
  const StatusOr<TrainerConfig> c = parse(kSlotDnn);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->runner.model_init_path, "output_model/3");  // from the working directory
  EXPECT_EQ(c->hyper.fc_sizes, (std::vector<int>{512, 256, 128}));
  EXPECT_EQ(c->sparse.mf_dim, 12);
  EXPECT_EQ(c->dataset.slots.size(), 300u);  // slot_num sparse slots: sparse_inputs_slots 301
  EXPECT_EQ(c->host_tier.table.shards, 10u);
  const table::SparseOptimizerConfig& o = c->sparse.optimizer;
  EXPECT_EQ(o.kind, table::SparseOptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.07f);
  EXPECT_FLOAT_EQ(o.initial_range, 0.002f);
  EXPECT_FLOAT_EQ(o.min_bound, -9.0f);
  EXPECT_FLOAT_EQ(o.max_bound, 8.0f);
  EXPECT_FLOAT_EQ(o.mf_learning_rate, 0.03f);
  EXPECT_FLOAT_EQ(o.mf_initial_range, 0.0003f);
  EXPECT_FLOAT_EQ(o.mf_min_bound, -7.0f);
  EXPECT_FLOAT_EQ(o.mf_max_bound, 6.0f);
  EXPECT_FLOAT_EQ(o.beta1_decay_rate, 0.8f);
  EXPECT_FLOAT_EQ(c->sparse.embedx_threshold, 7.0f);
  EXPECT_FLOAT_EQ(c->sparse.nonclk_coeff, 0.2f);
  EXPECT_FLOAT_EQ(c->sparse.clk_coeff, 2.0f);
  EXPECT_FLOAT_EQ(c->sparse.show_click_decay_rate, 0.97f);
  EXPECT_FLOAT_EQ(c->sparse.delete_threshold, 0.7f);
  EXPECT_FLOAT_EQ(c->sparse.delete_after_unseen_days, 20.0f);
}

TEST(PaddleRecKeys, KeysWithNoEffectAreListedWithWhy) {
  auto doc = config::ConfigDocument::parse(kSlotDnn, "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  const std::string note = doc->no_effect_note();
  for (const char* key :
       {"hyper_parameters.optimizer.adam_lazy_mode: Paddle's Adam lazy_mode",
        "hyper_parameters.dict_dim: PaddleRec slot_dnn's embedding table size",
        "table_parameters.embedding.table_class: PaddleRec's table kind",
        "table_parameters.embedding.accessor.accessor_class: PaddleRec's row accessor",
        "table_parameters.embedding.accessor.fea_dim: PaddleRec's pulled width",
        "table_parameters.embedding.accessor.ctr_accessor_param.base_threshold: PaddleRec's save",
        "table_parameters.embedding.accessor.ctr_accessor_param.delta_keep_days: PaddleRec's save",
        "table_parameters.embedding.accessor.ctr_accessor_param.ssd_unseenday_threshold: "}) {
    EXPECT_TRUE(contains(note, "\n  " + std::string(key))) << key << "\n" << note;
  }
  // Leaves that set a knob are not listed as having no effect.
  EXPECT_FALSE(contains(note, "embedx_threshold")) << note;
  EXPECT_FALSE(contains(note, "shard_num")) << note;
}

TEST(PaddleRecKeys, IntegersForBoolsAsYamlUsersWriteThem) {
  const StatusOr<TrainerConfig> c =
      parse("runner:\n  use_gpu: 0\n  shuffle: 0\n", {"runner.strict_parse=1"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->runner.shuffle);
  EXPECT_TRUE(c->dataset.strict_parse);
  const StatusOr<TrainerConfig> on = parse("runner:\n  shuffle: 1\n");
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->runner.shuffle);
  EXPECT_TRUE(contains(error_of("runner:\n  shuffle: 2\n"),
                       "p.yaml:2: runner.shuffle: expected true or false, got '2'"));
}

TEST(PaddleRecKeys, DcnV2LowRankAndLrRegAndNumField) {
  // low_rank is the DCN-Mix experts' rank: before or after use_low_rank_mixture in the file.
  for (const char* yaml : {"hyper_parameters:\n  low_rank: 32\n  use_low_rank_mixture: 1\n",
                           "hyper_parameters:\n  use_low_rank_mixture: 1\n  low_rank: 32\n"}) {
    const StatusOr<TrainerConfig> mix = parse(yaml);
    ASSERT_TRUE(mix.ok()) << mix.status().to_string();
    EXPECT_EQ(mix->hyper.cross_rank, 32) << yaml;
  }
  // An override of cross_rank wins over the file's low_rank, and the last of two overrides wins,
  // whichever of the two names each uses.
  const std::string mix_file = "hyper_parameters:\n  use_low_rank_mixture: 1\n  low_rank: 32\n";
  const std::string rank = "hyper_parameters.cross_rank=16";
  const std::string low = "hyper_parameters.low_rank=8";
  for (const auto& [overrides, want] : std::vector<std::pair<std::vector<std::string>, int>>{
           {{rank}, 16}, {{low, rank}, 16}, {{rank, low}, 8}, {{low}, 8}}) {
    const StatusOr<TrainerConfig> c = parse(mix_file, overrides);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->hyper.cross_rank, want) << overrides.front() << " first of " << overrides.size();
  }
  const StatusOr<TrainerConfig> dcn = parse("hyper_parameters:\n  low_rank: 32\n  cross_num: 2\n");
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.cross_rank, 0);  // PaddleRec's CrossNetV2: full rank
  EXPECT_EQ(dcn->hyper.cross_layers, 2);
  // logistic_regression's config.yaml: L1 on the weights, 39 fields = 13 dense + 26 slots.
  const StatusOr<TrainerConfig> lr =
      parse("hyper_parameters:\n  sparse_feature_number: 1086460\n  num_field: 39\n  reg: 0.001\n");
  ASSERT_TRUE(lr.ok()) << lr.status().to_string();
  EXPECT_FLOAT_EQ(lr->sparse.optimizer.l1_decay, 0.001f);
  EXPECT_FLOAT_EQ(lr->sparse.optimizer.weight_decay, 0.0f);  // L1 is not L2
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  num_field: 40\n"),
                       "hyper_parameters.num_field: 40 fields, but dense_input_dim (13) and the "
                       "26 sparse slots of sparse_inputs_slots make 39 per line"));
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

TEST(PaddleRecKeys, DlrmConfigTrainsDlrm) {
  const StatusOr<TrainerConfig> c = parse(kDlrm);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hyper.model, ModelKind::kDlrm);
  EXPECT_EQ(c->hyper.bot_layer_sizes, (std::vector<int>{512, 256, 64, 16}));
  EXPECT_EQ(c->hyper.fc_sizes, (std::vector<int>{512, 256}));
  EXPECT_EQ(c->mf_dim(), 15);  // embed_w + 15 embedx values: the bottom output's 16
  EXPECT_EQ(c->dataset.dense_dim, 13);
  EXPECT_EQ(c->num_sparse_slots(), 26);
  EXPECT_EQ(c->model_keys.at("hyper_parameters.bot_layer_sizes"), "[512, 256, 64, 16]");

  const std::string kTop = "hyper_parameters.top_layer_sizes=";
  EXPECT_TRUE(contains(error_of(kDlrm, {kTop + "[512, 256, 3]"}),
                       "top_layer_sizes: its last entry is the output layer, which GPUBox builds "
                       "as one logit"));
  const StatusOr<TrainerConfig> one = parse(kDlrm, {kTop + "[64, 1]"});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->hyper.fc_sizes, (std::vector<int>{64}));
  // The interaction's vectors: the bottom output and every slot's embedding, one width.
  const std::string narrow = error_of(kDlrm, {"hyper_parameters.sparse_feature_dim=9"});
  EXPECT_TRUE(contains(narrow,
                       "p.yaml: dlrm's dot interaction needs the bottom MLP's output (the "
                       "last of hyper_parameters.bot_layer_sizes: 16) as wide as every "
                       "slot's embedding (hyper_parameters.sparse_feature_dim: 9)"))
      << narrow;
  EXPECT_TRUE(contains(error_of(kDlrm, {"hyper_parameters.slot_dims={3: 7}"}),
                       "hyper_parameters.slot_dims gives slot 3 8"));
  EXPECT_TRUE(contains(error_of(kDlrm, {"hyper_parameters.dense_input_dim=0"}),
                       "dlrm's bottom MLP reads the dense features"));
  EXPECT_TRUE(contains(error_of(kDlrm, {"hyper_parameters.num_field=27"}),
                       "and 26 sparse fields (its dlrm)"));
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

TEST(PaddleRecKeys, XdeepfmConfigTrainsXdeepfm) {
  const StatusOr<TrainerConfig> c = parse(kXdeepfm);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hyper.model, ModelKind::kXdeepfm);
  const DenseModelConfig model = c->dense_model_config();
  EXPECT_EQ(model.cin_layer_sizes, (std::vector<int>{128, 32}));
  EXPECT_EQ(model.fc_sizes, (std::vector<int>{512, 256, 128}));  // layer_sizes_dnn, as its net
  EXPECT_EQ(c->mf_dim(), 8);  // embed_w (its first-order weight) + 8 field values
  EXPECT_EQ(c->dataset.dense_dim, 13);
  EXPECT_EQ(c->num_sparse_slots(), 26);
  EXPECT_EQ(c->model_keys.at("hyper_parameters.layer_sizes_cin"), "[128, 32]");
  // Without layer_sizes_dnn its DNN is fc_sizes; another network refuses layer_sizes_dnn.
  const StatusOr<TrainerConfig> fc = parse(kXdeepfm, {"hyper_parameters.layer_sizes_dnn=[]"});
  ASSERT_TRUE(fc.ok()) << fc.status().to_string();
  EXPECT_EQ(fc->hyper.fc_sizes, (std::vector<int>{512, 256, 128, 32}));
  EXPECT_TRUE(contains(error_of(kXdeepfm, {"hyper_parameters.model=dnn"}),
                       "p.yaml: hyper_parameters.layer_sizes_dnn is xdeepfm's, flen's and "
                       "fat_deepffm's DNN, but the model is dnn, which reads "
                       "hyper_parameters.fc_sizes"));
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

TEST(PaddleRecKeys, DeepFefmConfigTrainsDeepFefm) {
  const StatusOr<TrainerConfig> c = parse(kDeepFefm);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hyper.model, ModelKind::kDeepFefm);
  const DenseModelConfig model = c->dense_model_config();
  EXPECT_EQ(model.kind, ModelKind::kDeepFefm);
  EXPECT_EQ(model.fc_sizes, (std::vector<int>{512, 256, 128, 32}));
  EXPECT_EQ(c->mf_dim(), 8);  // embed_w (its first-order weight) + 8 embedding values
  EXPECT_EQ(c->dataset.dense_dim, 13);
  EXPECT_EQ(c->num_sparse_slots(), 26);
  // Its fields' pair matrices are k x k: slots of several widths are refused naming the key.
  EXPECT_TRUE(contains(error_of(kDeepFefm, {"hyper_parameters.slot_dims={1: 4}"}),
                       "deepfefm's fields share one width"));
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

TEST(PaddleRecKeys, AutointConfigTrainsAutoint) {
  const StatusOr<TrainerConfig> c = parse(kAutoint);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hyper.model, ModelKind::kAutoint);
  const DenseModelConfig model = c->dense_model_config();
  EXPECT_EQ(model.attn_layer_sizes, (std::vector<int>{64, 64, 64}));
  EXPECT_EQ(model.attn_heads, 2);
  EXPECT_TRUE(model.attn_residual && model.attn_scaling && model.attn_use_wide);
  EXPECT_TRUE(model.fc_sizes.empty());
  EXPECT_EQ(c->mf_dim(), 16);  // embedding_dim; embed_w (its feature_bias) comes first
  EXPECT_EQ(c->dataset.dense_dim, 13);
  EXPECT_EQ(c->num_sparse_slots(), 26);
  // config_bigdata.yaml's switches: a DNN over the fields and no first-order term.
  const StatusOr<TrainerConfig> big =
      parse(kAutoint, {"hyper_parameters.fc_sizes=[400, 400, 400]",
                       "hyper_parameters.use_wide=False", "hyper_parameters.scaling=0"});
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_EQ(big->dense_model_config().fc_sizes, (std::vector<int>{400, 400, 400}));
  EXPECT_FALSE(big->dense_model_config().attn_use_wide);
  EXPECT_FALSE(big->dense_model_config().attn_scaling);
  // Heads that do not divide a layer, and fc_sizes [] for a network whose DNN needs a layer.
  EXPECT_TRUE(contains(error_of(kAutoint, {"hyper_parameters.head_num=3"}),
                       "p.yaml: hyper_parameters.attn_layer_sizes has 64, which head_num 3 does "
                       "not divide"));
  EXPECT_TRUE(contains(error_of(kAutoint, {"hyper_parameters.model=dnn"}),
                       "p.yaml: hyper_parameters.fc_sizes is [], but dnn needs a hidden layer in "
                       "its dnn (only autoint takes [] for no dnn)"));
}

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
  // dlrm's SGD: a step on a row that scales with the batch, which the per-key rule does not
  // mirror; the rows keep the sparse rule, and the start line says so.
  const StatusOr<TrainerConfig> dlrm = parse(kDlrm);
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->sparse.optimizer.kind, table::SparseOptimizerKind::kAdagrad);
  EXPECT_TRUE(contains(rows_note(kDlrm),
                       "p.yaml: the embedding rows step under "
                       "hyper_parameters.sparse_optimizer.*"))
      << rows_note(kDlrm);
  EXPECT_TRUE(contains(rows_note(kDlrm),
                       "not under PaddleRec's hyper_parameters.optimizer.class "
                       "(SGD at learning_rate"))
      << rows_note(kDlrm);
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

TEST(PaddleRecKeys, FlenConfigTrainsFlen) {
  const StatusOr<TrainerConfig> c = parse(kFlen);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hyper.model, ModelKind::kFlen);
  const DenseModelConfig model = c->dense_model_config();
  EXPECT_EQ(model.flen_groups, (std::vector<int>{13, 3, 6}));
  EXPECT_EQ(model.fc_sizes, (std::vector<int>{64, 32}));
  EXPECT_EQ(c->mf_dim() + 1, 32);  // embed_w and embedx: the key's 32 values
  EXPECT_EQ(c->dataset.data_format, dataset::DataFormat::kAvazu);
  EXPECT_EQ(c->dataset.dense_dim, 0);
  EXPECT_EQ(c->num_sparse_slots(), 22);
  EXPECT_EQ(c->hyper.optimizer.kind, config::DenseOptimizerKind::kAdagrad);
  EXPECT_FLOAT_EQ(c->hyper.optimizer.epsilon, 1e-6f);
  EXPECT_FLOAT_EQ(c->hyper.optimizer.initial_accumulator, 1e-3f);
  // A save records the epsilon used (a resume compares it), not the key's Adam default.
  EXPECT_EQ(c->model_keys.at("hyper_parameters.optimizer.epsilon"), "1e-06");
  // Another network set knowingly on flen's folder: a field-aware one's rows as the table part
  // (gpubox_server) counts the fields differ from the avazu data's, refused naming both.
  const std::string ffm_on_flen =
      error_of(kFlen, {"hyper_parameters.model=ffm", "hyper_parameters.sparse_feature_dim=3",
                       "hyper_parameters.layer_sizes_dnn=[]"});
  EXPECT_TRUE(
      contains(ffm_on_flen,
               "p.yaml: ffm's rows are 68 values wide as the table part (and gpubox_server) "
               "reads this config, but the data's 22 fields"))
      << ffm_on_flen;
  // A format the config names is read as that format: slots counted with the label (21 here),
  // which flen's groups then do not cover.
  EXPECT_TRUE(contains(error_of(kFlen, {"runner.data_format=slot"}),
                       "field_group_sizes group 22 slots, but the data has 21 sparse slots"));
  // The groups must be as many as sparse_num_field says and cover the fields.
  EXPECT_TRUE(contains(error_of(kFlen, {"hyper_parameters.sparse_num_field=2"}),
                       "p.yaml: flen's hyper_parameters.sparse_num_field is 2 field groups, but "
                       "hyper_parameters.field_group_sizes lists 3"));
  EXPECT_TRUE(contains(error_of(kFlen, {"hyper_parameters.field_group_sizes=[13, 3, 5]"}),
                       "field_group_sizes group 21 slots, but the data has 22 sparse slots"));
  EXPECT_TRUE(contains(error_of(kFlen, {"hyper_parameters.model=dnn"}),
                       "layer_sizes_dnn is xdeepfm's, flen's and fat_deepffm's DNN"))
      << error_of(kFlen, {"hyper_parameters.model=dnn"});
}

TEST(PaddleRecKeys, ASpellingAndItsKeyMustAgree) {
  EXPECT_TRUE(parse("hyper_parameters:\n  emb_dim: 9\n  sparse_feature_dim: 9\n").ok());
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  emb_dim: 9\n  sparse_feature_dim: 11\n"),
                       "p.yaml:3: hyper_parameters.sparse_feature_dim is 11, set already on line "
                       "2 by hyper_parameters.emb_dim to 9"));
  EXPECT_TRUE(
      contains(error_of("hyper_parameters:\n  sparse_feature_dim: 11\n  emb_dim: 9\n"),
               "p.yaml:3: hyper_parameters.emb_dim sets hyper_parameters.sparse_feature_dim "
               "to 9, set already on line 2 to 11"));
  // The table's embedx_dim against sparse_feature_dim; the two parts' rules against each other.
  const std::string table = "table_parameters:\n  t:\n    accessor:\n";
  EXPECT_TRUE(
      parse("hyper_parameters:\n  sparse_feature_dim: 9\n" + table + "      embedx_dim: 8\n").ok());
  EXPECT_TRUE(contains(
      error_of("hyper_parameters:\n  sparse_feature_dim: 9\n" + table + "      embedx_dim: 4\n"),
      "table_parameters.t.accessor.embedx_dim sets hyper_parameters.sparse_feature_dim to 5, "
      "set already on line 2 to 9"));
  EXPECT_TRUE(
      contains(error_of(table + "      embed_sgd_param:\n        name: SparseAdamSGDRule\n"
                                "      embedx_sgd_param:\n        name: SparseAdaGradSGDRule\n"),
               "sets hyper_parameters.sparse_optimizer.class to adagrad, set already on "
               "line 5 by table_parameters.t.accessor.embed_sgd_param.name to adam"));
}

TEST(PaddleRecKeys, TableSettingsGpuboxDoesNotBuildAreRefusedByName) {
  const std::string table = "table_parameters:\n  t:\n    accessor:\n";
  EXPECT_TRUE(contains(
      error_of(table + "      embed_sgd_param:\n        name: StdAdaGradSGDRule\n"),
      "p.yaml:5: table_parameters.t.accessor.embed_sgd_param.name: StdAdaGradSGDRule (a g2sum "
      "per dimension) is not built"));
  EXPECT_TRUE(contains(error_of(table + "      embedx_dim: 8\n  u:\n    shard_num: 2\n"),
                       "p.yaml:5: table_parameters.u: a second table: GPUBox has one sparse "
                       "table (table_parameters.t)"));
  EXPECT_TRUE(contains(error_of(table + "      cvm_param: 1\n"),
                       "p.yaml:4: table_parameters.t.accessor.cvm_param: not a PaddleRec table "
                       "setting GPUBox knows"));
  // An override reaches a leaf as the file does.
  const StatusOr<TrainerConfig> c =
      parse("runner:\n  epochs: 1\n", {"table_parameters.t.accessor.embedx_threshold=4"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FLOAT_EQ(c->sparse.embedx_threshold, 4.0f);
}

// PaddleRec's models/rank/dcn/config.yaml and models/rank/dcn_v2/config.yaml, unchanged (the
// runner part is dcn's; dcn_v2's differs in its epochs and output names only).
constexpr const char* kDcnRunner = R"(runner:
  train_data_dir: "./data/sample_data"
  train_reader_path: "reader" # importlib format
  use_gpu: False
  use_auc: True
  train_batch_size: 8
  epochs: 10
  print_interval: 1
  #model_init_path: "output_model/0" # init model
  model_save_path: "output_model_deepCross"
  test_data_dir: "./data/sample_data"
  infer_reader_path: "reader" # importlib format
  infer_batch_size: 8
  infer_load_path: "output_model_deepCross"
  infer_start_epoch: 0
  infer_end_epoch: 10


# hyper parameters of user-defined network
)";
constexpr const char* kDcnHyper = R"(hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.0001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1000001
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128] #, 32]
  distributed_embedding: 0

# sparse_inputs_slots + dense_input_dim

  cross_num: 2
  l2_reg_cross: 0.00005
  dnn_use_bn: False
  clip_by_norm: 100.0
  is_sparse: False
  # cat_feat_num: "{workspace}/data/sample_data/cat_feature_num.txt"
)";
constexpr const char* kDcnV2Hyper = R"(hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001 # 0.0001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1100001
  sparse_feature_dim: 40 # 10  40
  dense_input_dim: 13
  is_Stacked: True
  use_low_rank_mixture: True # False  True
  low_rank:  256 #32
  num_experts: 4
  fc_sizes: [768, 768] # [768, 768]  [500, 500, 500]
  distributed_embedding: 0

# sparse_inputs_slots + dense_input_dim

  cross_num: 2 #3 4
  l2_reg_cross: 0.00003
  dnn_use_bn: False
  clip_by_norm: 10.0
)";

// A config at <tmp>/PaddleRec/models/rank/<folder>/config.yaml: the folder names the network.
StatusOr<TrainerConfig> load_in_folder(const std::string& folder, const std::string& text) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "paddlerec_keys" / "models/rank" / folder;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.yaml") << text;
  return load_trainer_config((dir / "config.yaml").string());
}

TEST(PaddleRecKeys, DcnAndDcnV2ConfigsLoadUnchangedAndBuildTheirNetworks) {
  const StatusOr<TrainerConfig> dcn = load_in_folder("dcn", std::string(kDcnRunner) + kDcnHyper);
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.model, ModelKind::kDcn);
  const DenseModelConfig v1 = dcn->dense_model_config();
  EXPECT_EQ(v1.cross_layers, 2);
  EXPECT_FLOAT_EQ(v1.cross_l2, 0.00005f);
  EXPECT_EQ(v1.cross_experts, 0);
  EXPECT_EQ(v1.fc_sizes, (std::vector<int>{512, 256, 128}));
  // clip_by_norm and is_sparse change nothing in PaddleRec's dcn either: listed with why.
  auto doc =
      config::ConfigDocument::parse(std::string(kDcnRunner) + kDcnHyper, "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  const std::string note = doc->no_effect_note();
  EXPECT_TRUE(contains(note,
                       "hyper_parameters.clip_by_norm: PaddleRec's dcn hands it to its network, "
                       "which keeps it unused, and dcn_v2 reads it unused"))
      << note;
  EXPECT_TRUE(contains(note, "hyper_parameters.is_sparse: ")) << note;

  const StatusOr<TrainerConfig> v2 =
      load_in_folder("dcn_v2", std::string(kDcnRunner) + kDcnV2Hyper);
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  EXPECT_EQ(v2->hyper.model, ModelKind::kDcnV2);
  const DenseModelConfig mix = v2->dense_model_config();
  EXPECT_EQ(mix.cross_experts, 4);
  EXPECT_EQ(mix.cross_rank, 256);
  EXPECT_EQ(mix.cross_layers, 2);
  EXPECT_EQ(mix.dcn_structure, DcnStructure::kStacked);
  EXPECT_FLOAT_EQ(mix.cross_l2, 0.00003f);
  // use_low_rank_mixture: False trains plain cross layers, whatever num_experts says.
  const StatusOr<TrainerConfig> plain =
      parse("hyper_parameters:\n  model: dcn_v2\n  use_low_rank_mixture: 0\n  num_experts: 4\n");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->dense_model_config().cross_experts, 0);
}

TEST(PaddleRecKeys, DcnMixWithoutARankIsRefused) {
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  model: dcn_v2\n  use_low_rank_mixture: "
                                "True\n"),
                       "p.yaml: hyper_parameters.cross_mixture (PaddleRec's use_low_rank_mixture) "
                       "is true, but the experts' rank hyper_parameters.cross_rank (PaddleRec's "
                       "low_rank) is 0"));
  // dcn's vector layers have no rank nor mixture: set for it, they are refused, not dropped.
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  model: dcn\n  cross_rank: 8\n"),
                       "p.yaml: hyper_parameters.model is dcn (DCN v1: vector cross layers), "
                       "but hyper_parameters.cross_rank (PaddleRec's low_rank) is 8"));
  EXPECT_TRUE(
      contains(error_of("hyper_parameters:\n  model: dcn\n  cross_mixture: true\n"),
               "hyper_parameters.cross_mixture (PaddleRec's use_low_rank_mixture) is true"));
  // dcn is parallel whatever dcn_structure (dcn_v2's) says.
  const StatusOr<TrainerConfig> dcn =
      parse("hyper_parameters:\n  model: dcn\n  dcn_structure: stacked\n");
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
}

// PaddleRec dcn_v2 builds full-rank cross layers (CrossNetV2) unless use_low_rank_mixture is
// true, whatever low_rank says: trained low-rank, its config would have been another network.
TEST(PaddleRecKeys, LowRankWithoutTheMixtureHasNoEffectAndIsListed) {
  const std::string yaml =
      "hyper_parameters:\n  model: dcn_v2\n  use_low_rank_mixture: False\n  low_rank: 32\n";
  auto doc = config::ConfigDocument::parse(yaml, "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  EXPECT_EQ(doc->get_int("hyper_parameters.cross_rank"), 0);
  EXPECT_TRUE(contains(doc->no_effect_note(),
                       "hyper_parameters.low_rank: PaddleRec dcn_v2's rank of the DCN-Mix experts "
                       "(its plain cross layers are full rank); it applies with "
                       "hyper_parameters.cross_mixture true only"))
      << doc->no_effect_note();
  // An override turning the mixture on makes the file's low_rank apply; one of low_rank itself
  // applies with the mixture only, and replaces the file's.
  auto on = config::ConfigDocument::parse(yaml, "/base", {"hyper_parameters.cross_mixture=true"},
                                          "p.yaml");
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  EXPECT_EQ(on->get_int("hyper_parameters.cross_rank"), 32);
  EXPECT_EQ(on->no_effect_note(), "");
  auto both = config::ConfigDocument::parse(
      yaml, "/base", {"hyper_parameters.use_low_rank_mixture=1", "hyper_parameters.low_rank=8"},
      "p.yaml");
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_EQ(both->get_int("hyper_parameters.cross_rank"), 8);
  auto off =
      config::ConfigDocument::parse(yaml, "/base", {"hyper_parameters.low_rank=8"}, "p.yaml");
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  EXPECT_EQ(off->get_int("hyper_parameters.cross_rank"), 0);
  // Overrides apply in order, the last one of cross_rank winning however it is named.
  for (const char* mixture :
       {"hyper_parameters.cross_mixture=true", "hyper_parameters.cross_mixture=false"}) {
    auto later = config::ConfigDocument::parse(
        yaml, "/base", {mixture, "hyper_parameters.low_rank=8", "hyper_parameters.cross_rank=4"},
        "p.yaml");
    ASSERT_TRUE(later.ok()) << later.status().to_string();
    EXPECT_EQ(later->get_int("hyper_parameters.cross_rank"), 4) << mixture;
  }
  auto last_alias = config::ConfigDocument::parse(
      yaml, "/base",
      {"hyper_parameters.cross_mixture=true", "hyper_parameters.cross_rank=4",
       "hyper_parameters.low_rank=8"},
      "p.yaml");
  ASSERT_TRUE(last_alias.ok()) << last_alias.status().to_string();
  EXPECT_EQ(last_alias->get_int("hyper_parameters.cross_rank"), 8);
  // Set beside cross_rank, the mixture's low_rank is still the one key set twice.
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  cross_rank: 4\n  low_rank: 8\n"
                                "  use_low_rank_mixture: 1\n"),
                       "p.yaml:3: hyper_parameters.low_rank sets hyper_parameters.cross_rank to "
                       "8, set already on line 2"));
}

// PaddleRec's dcn and dcn_v2 read dnn_use_bn and clip_by_norm and use neither (their net.py,
// static_model.py, dygraph_model.py): on or off, accepted and listed with why.
TEST(PaddleRecKeys, KeysPaddleRecsNetworksIgnoreAreAcceptedOnOrOff) {
  auto doc = config::ConfigDocument::parse(
      "hyper_parameters:\n  dnn_use_bn: True\n  clip_by_norm: 10.0\n", "/base", {}, "p.yaml");
  ASSERT_TRUE(doc.ok()) << doc.status().to_string();
  const std::string note = doc->no_effect_note();
  EXPECT_TRUE(contains(note, "hyper_parameters.dnn_use_bn: PaddleRec's dcn and dcn_v2 read it"))
      << note;
  EXPECT_TRUE(contains(note,
                       "hyper_parameters.clip_by_norm: PaddleRec's dcn hands it to its "
                       "network, which keeps it unused"))
      << note;
  EXPECT_TRUE(parse("runner:\n  epochs: 1\n", {"hyper_parameters.dnn_use_bn=1"}).ok());
}

// wide_deep's benchmark.yaml asks for PaddleRec's DataLoader: read as InmemoryDataset (GPUBox
// reads the files itself), not refused, and not streamed.
TEST(PaddleRecKeys, DataLoaderReaderTypeReadsAsInMemory) {
  const StatusOr<TrainerConfig> c = parse("runner:\n  reader_type: \"DataLoader\"\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->runner.reader_type, config::ReaderType::kDataLoader);
  EXPECT_NE(c->runner.reader_type, config::ReaderType::kQueueDataset);
  EXPECT_TRUE(
      contains(error_of("runner:\n  reader_type: RecDataset\n"),
               "expected one of InmemoryDataset|QueueDataset|DataLoader, got 'RecDataset'"));
}

TEST(PaddleRecKeys, DidYouMeanKnowsPaddleRecsNames) {
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  low_rnk: 4\n"),
                       "unknown key 'hyper_parameters.low_rnk' (did you mean "
                       "'hyper_parameters.low_rank'?)"));
  EXPECT_TRUE(contains(error_of("runner:\n  init_modle_path: x\n"),
                       "(did you mean 'runner.init_model_path'"));
  EXPECT_TRUE(contains(error_of("hyper_parameters:\n  optimizer:\n    adam_lazy_mod: 1\n"),
                       "(did you mean 'hyper_parameters.optimizer.adam_lazy_mode'"));
}

}  // namespace
}  // namespace gpubox::trainer
