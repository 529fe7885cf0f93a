// PaddleRec's names for GPUBox's knobs (issue 32, item 1), each checked against the value the
// knob ends with in the TrainerConfig gpubox_train runs (the sparse rule, the dataset, the
// network), not against the document alone: slot_dnn's keys and its table_parameters, dcn_v2's
// low_rank and l2_reg_cross, logistic_regression's reg and num_field, init_model_path, 1/0 for
// true/false; the keys with no effect listed with why; the keys that would change the model and
// are not built refused by name; PaddleRec's names known to "did you mean". The model folders'
// networks and their embedding rows' rule: paddlerec_networks_test.cpp; dcn's and dcn_v2's
// configs unchanged, DCN-Mix: paddlerec_dcn_test.cpp (the same binary).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "table/sparse_config.hpp"
#include "tests/integration/paddlerec_keys_test_util.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer {
namespace {

using paddlerec_test::contains;
using paddlerec_test::error_of;
using paddlerec_test::parse;

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
