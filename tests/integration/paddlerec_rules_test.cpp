// The rules a PaddleRec model folder's config steps its parameters under (issue 32, item 1): its
// embedding rows under its Adam (said at start), dlrm's net under Adam whatever its class says,
// and Adam's bias correction per row or per table as Paddle's mode has it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/config_enums.hpp"
#include "common/config/network_shape.hpp"
#include "table/sparse_config.hpp"
#include "tests/integration/paddlerec_folder_configs.hpp"
#include "tests/integration/paddlerec_keys_test_util.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/network_choice.hpp"

namespace gpubox::trainer {
namespace {

using paddlerec_test::contains;
using paddlerec_test::error_of;
using paddlerec_test::kAutoint;
using paddlerec_test::kDlrm;
using paddlerec_test::parse;

// The start line a config's embedding rows' rule gives (table::paddlerec_rows_rule_note).
std::string rows_note(const std::string& yaml, const std::vector<std::string>& o = {}) {
  StatusOr<config::ConfigDocument> doc = config::ConfigDocument::parse(yaml, "/base", o, "p.yaml");
  if (!doc.ok()) return doc.status().message();
  StatusOr<table::AccessorConfig> rows = table::sparse_config_from(*doc);
  return rows.ok() ? table::paddlerec_rows_rule_note(*doc, *rows) : rows.status().message();
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
  // A decay is every rule's (a regularizer on the gradient): logistic_regression's `reg`, its
  // L1Decay beside its Adam, had switched the rows to adagrad.
  for (const std::string decay : {"hyper_parameters.sparse_optimizer.l1_decay=0.25",
                                  "hyper_parameters.sparse_optimizer.weight_decay=0.25"}) {
    const StatusOr<TrainerConfig> decayed = parse(kAutoint, {decay});
    ASSERT_TRUE(decayed.ok()) << decay << ": " << decayed.status().to_string();
    EXPECT_EQ(decayed->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam) << decay;
    EXPECT_FLOAT_EQ(decayed->sparse.optimizer.learning_rate, 0.001f) << decay;
    EXPECT_FLOAT_EQ(decayed->sparse.optimizer.l1_decay + decayed->sparse.optimizer.weight_decay,
                    0.25f)
        << decay;
  }
  // A table setting -o cannot take is refused naming the config, as every -o error is.
  const StatusOr<TrainerConfig> unknown = parse(kAutoint, {"table_parameters.t.foo=1"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message().rfind(
                "p.yaml: -o: table_parameters.t.foo: not a PaddleRec table setting", 0),
            0u)
      << unknown.status().message();
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

// deepfefm's folder keeps GPUBox's start ranges under its Adam (PaddleRec's net.py initialiser
// lowered GPUBox's held-out AUC, docs/bench/h164.md) and the start lines say so, with what else
// PaddleRec's net does that GPUBox's does not.
TEST(PaddleRecKeys, DeepfefmRowsKeepGPUBoxsRangesAndTheLinesSayWhy) {
  const std::string yaml = R"(workspace: "models/rank/deepfefm"
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
  sparse_inputs_slots: 27
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128, 32]
)";
  const StatusOr<TrainerConfig> c = parse(yaml);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->sparse.optimizer.kind, table::SparseOptimizerKind::kAdam);
  EXPECT_EQ(c->sparse.optimizer.initial_range, 0.0f);
  EXPECT_FLOAT_EQ(c->sparse.optimizer.mf_initial_range, 0.0001f);
  const std::string note = rows_note(yaml);
  EXPECT_TRUE(contains(note,
                       "not at deepfefm's net.py initialiser TruncatedNormal(0, 0.1 / "
                       "sqrt(sparse_feature_dim)) (at its std GPUBox's held-out AUC was 0.01-0.05 "
                       "lower after epoch 1"))
      << note;
  const std::string differences = differences_from_paddlerec(config::ModelKind::kDeepFefm, 0.2);
  EXPECT_TRUE(
      contains(differences, "the folder's 0.2 after every DNN Linear and ReLU and the DNN's"))
      << differences;
  EXPECT_TRUE(contains(differences, "sparse=False, so its Adam moves every row every step"))
      << differences;
}

}  // namespace
}  // namespace gpubox::trainer
