// gpubox_train's config from PaddleRec's model folders: the network a folder names (or its
// refusal), and what differs from PaddleRec's net, said at start; batch norm, the default of the
// dlrm folder and otherwise asked for; top_layer_sizes' two-class output in that folder only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config_document.hpp"
#include "table/sparse_config.hpp"
#include "tests/trainer/config_test_util.hpp"
#include "trainer/config/clip_by_norm.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/dnn_dropout.hpp"
#include "trainer/config/network_choice.hpp"

namespace gpubox::trainer {
namespace {

using config_test::ConfigTest;

// The networks PaddleRec's rank folders name, by the folder or, from elsewhere, by workspace.
void expect_rank_folders_name_their_networks(ConfigTest& test, const std::string& yaml) {
  auto wide_deep = test.load_in("PaddleRec/models/rank/wide_deep", yaml);
  ASSERT_TRUE(wide_deep.ok()) << wide_deep.status().to_string();
  EXPECT_EQ(wide_deep->hyper.model, config::ModelKind::kWideDeep);
  EXPECT_NE(wide_deep->hyper.model_source.find("the config's folder"), std::string::npos);
  EXPECT_EQ(wide_deep->model_keys.at("hyper_parameters.model"), "wide_deep");

  auto by_workspace = test.load_in("elsewhere", "workspace: \"models/rank/deepfm\"\n" + yaml);
  ASSERT_TRUE(by_workspace.ok()) << by_workspace.status().to_string();
  EXPECT_EQ(by_workspace->hyper.model, config::ModelKind::kDeepFm);
  EXPECT_EQ(by_workspace->hyper.model_source,
            "PaddleRec's model folder (workspace "
            "models/rank/deepfm)");

  auto fm = test.load_in("PaddleRec/models/rank/fm", yaml);
  ASSERT_TRUE(fm.ok()) << fm.status().to_string();
  EXPECT_EQ(fm->hyper.model, config::ModelKind::kFm);
  // dlrm's bottom output (bot_layer_sizes, [512, 256, 64, 16] by default) and embeddings meet.
  auto dlrm = test.load_in("PaddleRec/models/rank/dlrm",
                           yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n");
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  EXPECT_EQ(dlrm->hyper.model, config::ModelKind::kDlrm);

  auto xdeepfm = test.load_in("PaddleRec/models/rank/xdeepfm", yaml);
  ASSERT_TRUE(xdeepfm.ok()) << xdeepfm.status().to_string();
  EXPECT_EQ(xdeepfm->dense_model_config().kind, config::ModelKind::kXdeepfm);

  auto dcn = test.load_in("PaddleRec/models/rank/dcn", yaml);
  ASSERT_TRUE(dcn.ok()) << dcn.status().to_string();
  EXPECT_EQ(dcn->hyper.model, config::ModelKind::kDcn);
  EXPECT_EQ(dcn->dense_model_config().kind, config::ModelKind::kDcn);

  auto autoint = test.load_in("PaddleRec/models/rank/autoint", yaml);
  ASSERT_TRUE(autoint.ok()) << autoint.status().to_string();
  EXPECT_EQ(autoint->dense_model_config().kind, config::ModelKind::kAutoint);
}

// The field-aware folders' rows: ffm's and fat_deepffm's one factor (sparse_feature_dim - 1 = 8)
// per field, 26 slots and 13 dense features by default, from the trainer and from gpubox_server's
// loader (the table part) alike; deepfefm's one embedding per key.
void expect_field_aware_folders_rows(ConfigTest& test, const std::string& yaml) {
  auto ffm = test.load_in("PaddleRec/models/rank/ffm", yaml);
  ASSERT_TRUE(ffm.ok()) << ffm.status().to_string();
  EXPECT_EQ(ffm->hyper.model, config::ModelKind::kFfm);
  EXPECT_EQ(ffm->mf_dim(), (26 + 13) * 8);
  EXPECT_EQ(ffm->dense_model_config().mf_dim, (26 + 13) * 8);

  auto deepfefm = test.load_in("PaddleRec/models/rank/deepfefm", yaml);
  ASSERT_TRUE(deepfefm.ok()) << deepfefm.status().to_string();
  EXPECT_EQ(deepfefm->dense_model_config().kind, config::ModelKind::kDeepFefm);
  EXPECT_EQ(deepfefm->mf_dim(), 8);  // one embedding per key, as the dnn's

  auto fat = test.load_in("PaddleRec/models/rank/fat_deepffm", yaml);
  ASSERT_TRUE(fat.ok()) << fat.status().to_string();
  EXPECT_EQ(fat->dense_model_config().kind, config::ModelKind::kFatDeepffm);
  EXPECT_EQ(fat->mf_dim(), (26 + 13) * 8);
  EXPECT_EQ(fat->dense_model_config().mf_dim, (26 + 13) * 8);
  // gpubox_server's loader makes the same rows from the folder alone, for ffm's folder too;
  // another folder's network reads one factor per key, and the key, set, wins.
  for (const char* folder : {"fat_deepffm", "ffm"}) {
    auto rows = table::load_sparse_config(
        (test.dir() / "PaddleRec/models/rank" / folder / "config.yaml").string());
    ASSERT_TRUE(rows.ok()) << rows.status().to_string();
    EXPECT_EQ(rows->mf_dim, (26 + 13) * 8) << folder;
  }
  auto dnn_rows = table::load_sparse_config(
      (test.dir() / "PaddleRec/models/rank/fat_deepffm/config.yaml").string(),
      {"hyper_parameters.model=dnn"});
  ASSERT_TRUE(dnn_rows.ok()) << dnn_rows.status().to_string();
  EXPECT_EQ(dnn_rows->mf_dim, 8);
}

// What differs from PaddleRec's nets is said at start: a phrase of each network's note, and
// none for the dnn.
void expect_differences_from_paddlerec_said() {
  const std::pair<config::ModelKind, const char*> said[] = {
      {config::ModelKind::kDeepFefm, "quantised"},
      // dcn's shared cross weights and dlrm's batch norm and class-blind Adam (their net.py and
      // static_model.py).
      {config::ModelKind::kDcn, "share one weight vector"},
      {config::ModelKind::kDlrm,
       "the 2-wide output layer's too with hyper_parameters.dlrm_output softmax2"},
      {config::ModelKind::kDlrm, "whatever optimizer.class"},
      // dcn_v2's dense values without PaddleRec's Linear, its dropout drawn as one mask, its
      // non-lazy Adam.
      {config::ModelKind::kDcnV2, "draws one mask per hidden unit"},
      {config::ModelKind::kDcnV2, "no lazy_mode"},
      // deepfm's FM over the slots alone and its embeddings one narrower than PaddleRec's.
      {config::ModelKind::kDeepFm, "slots' embeddings only"},
      {config::ModelKind::kDeepFm, "sparse_feature_dim - 1"},
      {config::ModelKind::kFatDeepffm, "undropped bias"},
      // flen's three Dropouts a hidden unit and the one after its bi-interaction's layer.
      {config::ModelKind::kFlen, "kept with probability (1-p)^3"},
      {config::ModelKind::kFlen, "one of 1-p after the bi-interaction's layer's ReLU"},
      {config::ModelKind::kFatDeepffm, "drop(w.h + b) + first-order + bias"},
      {config::ModelKind::kAutoint, "never calls it"},
      {config::ModelKind::kFlen, "batch norm"}};
  for (const auto& [kind, phrase] : said) {
    EXPECT_NE(differences_from_paddlerec(kind, 0.5).find(phrase), std::string::npos) << phrase;
  }
  EXPECT_EQ(differences_from_paddlerec(config::ModelKind::kDnn, 0.0), "");
  // The dropout clause follows the rate trained: at 0 (-o hyper_parameters.dnn_dropout=0) none.
  for (const config::ModelKind kind : {config::ModelKind::kDcnV2, config::ModelKind::kDeepFefm,
                                       config::ModelKind::kFlen, config::ModelKind::kFatDeepffm}) {
    const std::string on = differences_from_paddlerec(kind, 0.5);
    const std::string off = differences_from_paddlerec(kind, 0.0);
    EXPECT_NE(on.find("its dropout (hyper_parameters.dnn_dropout"), std::string::npos) << on;
    EXPECT_EQ(on.find("no dropout"), std::string::npos) << on;
    EXPECT_NE(off.find("no dropout (hyper_parameters.dnn_dropout 0; PaddleRec's"),
              std::string::npos)
        << off;
    EXPECT_EQ(off.find("its dropout"), std::string::npos) << off;
    EXPECT_EQ(off.find("{dropout}"), std::string::npos) << off;
  }
  // fat_deepffm learns its second, undropped bias at p > 0 only.
  EXPECT_NE(differences_from_paddlerec(config::ModelKind::kFatDeepffm, 0.0).find("no second bias"),
            std::string::npos);
}

// flen's folder's groups must cover the config's 26 numbered slots; the folder of a network
// GPUBox does not build is refused unless the key is set; a folder of no network is the dnn.
void expect_folders_refused_unless_the_key_says(ConfigTest& test, const std::string& yaml) {
  auto flen = test.load_in("PaddleRec/models/rank/flen", yaml);
  ASSERT_FALSE(flen.ok());
  EXPECT_NE(flen.status().message().find("field_group_sizes group 22 slots, but the data has 26"),
            std::string::npos)
      << flen.status().to_string();
  flen = test.load_in("PaddleRec/models/rank/flen", yaml,
                      {"hyper_parameters.field_group_sizes=[13, 3, 10]"});
  ASSERT_TRUE(flen.ok()) << flen.status().to_string();
  EXPECT_EQ(flen->dense_model_config().kind, config::ModelKind::kFlen);

  auto difm = test.load_in("PaddleRec/models/rank/difm", yaml);
  ASSERT_FALSE(difm.ok());
  const std::string what = difm.status().message();
  EXPECT_NE(
      what.find("names PaddleRec's network 'difm', which GPUBox does not build (it builds "
                "dnn, wide_deep, wide, deepfm, dcn_v2, fm, dcn, dlrm, xdeepfm, ffm, deepfefm, "
                "autoint, flen, fat_deepffm)"),
      std::string::npos)
      << what;
  EXPECT_NE(what.find("-o hyper_parameters.model=dnn"), std::string::npos) << what;
  // Set knowingly, the key wins over the folder.
  auto knowingly = test.load_in("PaddleRec/models/rank/difm", yaml, {"hyper_parameters.model=dnn"});
  ASSERT_TRUE(knowingly.ok()) << knowingly.status().to_string();
  EXPECT_EQ(knowingly->hyper.model, config::ModelKind::kDnn);
  EXPECT_EQ(knowingly->hyper.model_source, "hyper_parameters.model");

  // A folder of another PaddleRec family (multitask, match, ...) or its workspace, and PaddleRec
  // 1.x's dotted workspace, trained the dnn by default (exit 0): refused, unless the key says
  // (the folders are beside PaddleRec/models/rank, made above: a checkout).
  for (const char* folder : {"PaddleRec/models/multitask/mmoe", "PaddleRec/models/match/dssm"}) {
    auto other = test.load_in(folder, yaml);
    ASSERT_FALSE(other.ok()) << folder;
    EXPECT_NE(other.status().message().find(std::string("names PaddleRec's network models/") +
                                            (folder + std::string("PaddleRec/models/").size()) +
                                            ", which GPUBox does not build"),
              std::string::npos)
        << other.status().to_string();
    EXPECT_TRUE(test.load_in(folder, yaml, {"hyper_parameters.model=dnn"}).ok()) << folder;
  }
  // A user's own models/demo/v1 (no models/rank beside it) is no PaddleRec folder: the default.
  auto own = test.load_in("mine/models/demo/v1", yaml);
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  EXPECT_EQ(own->hyper.model, config::ModelKind::kDnn);
  auto mmoe = test.load_in("plain", yaml, {"workspace=models/multitask/mmoe"});
  ASSERT_FALSE(mmoe.ok());
  EXPECT_NE(mmoe.status().message().find("workspace models/multitask/mmoe names PaddleRec's"),
            std::string::npos)
      << mmoe.status().to_string();
  auto dotted = test.load_in("plain", yaml, {"workspace=paddlerec.models.rank.din"});
  ASSERT_FALSE(dotted.ok());
  EXPECT_NE(dotted.status().message().find("names PaddleRec's network 'din'"), std::string::npos)
      << dotted.status().to_string();
  auto dotted_dnn = test.load_in("plain", yaml, {"workspace=paddlerec.models.rank.deepfm"});
  ASSERT_TRUE(dotted_dnn.ok()) << dotted_dnn.status().to_string();
  EXPECT_EQ(dotted_dnn->hyper.model, config::ModelKind::kDeepFm);

  auto plain = test.load_in("plain", yaml);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->hyper.model, config::ModelKind::kDnn);
  EXPECT_NE(plain->hyper.model_source.find("the default"), std::string::npos);

  // A model folder linked to, or copied out of the checkout (named by its net.py's first class),
  // trained the default dnn, its keys and reader unread: its own network, or refused.
  const std::filesystem::path linked = test.dir() / "my_link";
  std::filesystem::create_directories(test.dir() / "PaddleRec/models/rank/deepfm");
  std::filesystem::create_directory_symlink(test.dir() / "PaddleRec/models/rank/deepfm", linked);
  auto via_link = test.load_in("my_link", yaml);
  ASSERT_TRUE(via_link.ok()) << via_link.status().to_string();
  EXPECT_EQ(via_link->hyper.model, config::ModelKind::kDeepFm);
  std::filesystem::create_directories(test.dir() / "copied");
  std::ofstream(test.dir() / "copied/net.py")
      << "import paddle\n\nclass DCN_V2Layer(nn.Layer):\n    pass\nclass DNNLayer(nn.Layer):\n";
  auto copied = test.load_in("copied", yaml);
  ASSERT_TRUE(copied.ok()) << copied.status().to_string();
  EXPECT_EQ(copied->hyper.model, config::ModelKind::kDcnV2);
  EXPECT_NE(copied->hyper.model_source.find("its net.py's first class DCN_V2Layer"),
            std::string::npos)
      << copied->hyper.model_source;
  std::filesystem::create_directories(test.dir() / "unbuilt");
  std::ofstream(test.dir() / "unbuilt/net.py") << "class DIFM(nn.Layer):\n";
  auto unbuilt = test.load_in("unbuilt", yaml);
  ASSERT_FALSE(unbuilt.ok());
  EXPECT_NE(unbuilt.status().message().find("names PaddleRec's network 'net.py's DIFM', which "
                                            "GPUBox does not build"),
            std::string::npos)
      << unbuilt.status().to_string();
}

// A PaddleRec config has no hyper_parameters.model: the network is the one its model folder
// (workspace, else the models/rank/<name>/ folder it sits in) names, or a refusal naming it. Each
// helper's first failed ASSERT ends the test, as one body's would.
TEST_F(ConfigTest, APaddleRecModelFolderNamesTheNetworkOrIsRefused) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  ASSERT_NO_FATAL_FAILURE(expect_rank_folders_name_their_networks(*this, yaml));
  ASSERT_NO_FATAL_FAILURE(expect_field_aware_folders_rows(*this, yaml));
  expect_differences_from_paddlerec_said();
  ASSERT_NO_FATAL_FAILURE(expect_folders_refused_unless_the_key_says(*this, yaml));
}

// PaddleRec's dlrm folder turns batch norm on (its MLPLayer always normalises) and says so at
// start; other folders and GPUBox's own configs keep none unless they ask; geo and networks
// without hidden layers refuse it, naming the key.
TEST_F(ConfigTest, BatchNormIsPaddleRecDlrmsDefaultAndOtherwiseAskedFor) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  const auto load = [&](const std::string& folder, const std::string& text,
                        const std::vector<std::string>& overrides = {}) {
    return load_in(folder, text, overrides);
  };
  auto dlrm =
      load("PaddleRec/models/rank/dlrm", yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n");
  ASSERT_TRUE(dlrm.ok()) << dlrm.status().to_string();
  // Its MLPLayer always normalises: batch norm unless the key says otherwise; other folders and
  // GPUBox's configs keep none unless they ask.
  EXPECT_TRUE(dlrm->dense_model_config().batch_norm);
  auto dlrm_plain =
      load("PaddleRec/models/rank/dlrm", yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n",
           {"hyper_parameters.dnn_batch_norm=false"});
  ASSERT_TRUE(dlrm_plain.ok()) << dlrm_plain.status().to_string();
  EXPECT_FALSE(dlrm_plain->dense_model_config().batch_norm);
  auto wide_deep = load("PaddleRec/models/rank/wide_deep", yaml);
  ASSERT_TRUE(wide_deep.ok()) << wide_deep.status().to_string();
  EXPECT_FALSE(wide_deep->dense_model_config().batch_norm);
  auto dlrm_gpubox = load("elsewhere", yaml +
                                           "hyper_parameters:\n  model: dlrm\n  "
                                           "sparse_feature_dim: 16\n");
  ASSERT_TRUE(dlrm_gpubox.ok()) << dlrm_gpubox.status().to_string();
  EXPECT_FALSE(dlrm_gpubox->dense_model_config().batch_norm);
  auto dnn_bn = load("elsewhere", yaml, {"hyper_parameters.dnn_batch_norm=true"});
  ASSERT_TRUE(dnn_bn.ok()) << dnn_bn.status().to_string();
  EXPECT_TRUE(dnn_bn->dense_model_config().batch_norm);
  // geo's summed moves would overshoot the running statistics: refused, naming both keys.
  auto geo = load("PaddleRec/models/rank/dlrm",
                  yaml + "hyper_parameters:\n  sparse_feature_dim: 16\n", {"runner.sync_mode=geo"});
  ASSERT_FALSE(geo.ok());
  EXPECT_NE(geo.status().message().find("dnn_batch_norm is not built for runner.sync_mode geo"),
            std::string::npos)
      << geo.status().to_string();
  EXPECT_NE(geo.status().message().find("PaddleRec's dlrm folder"), std::string::npos);
  // A network without hidden layers refuses it, naming the key; autoint only without a dnn.
  for (const std::vector<std::string>& no_dnn :
       {std::vector<std::string>{"hyper_parameters.model=wide"},
        {"hyper_parameters.model=fm"},
        {"hyper_parameters.model=autoint", "hyper_parameters.fc_sizes=[]"}}) {
    std::vector<std::string> overrides = no_dnn;
    overrides.push_back("hyper_parameters.dnn_batch_norm=true");
    auto refused = load("elsewhere", yaml, overrides);
    ASSERT_FALSE(refused.ok()) << no_dnn[0];
    EXPECT_NE(refused.status().message().find("hyper_parameters.dnn_batch_norm=true normalises "
                                              "after every hidden layer"),
              std::string::npos)
        << refused.status().to_string();
  }
  // gpubox_train's start line says when the folder's default turned it on, and only then.
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    EXPECT_TRUE(doc.ok()) << doc.status().to_string();
    return doc.ok() ? dnn_batch_norm_note(*doc) : std::string();
  };
  EXPECT_NE(note("PaddleRec/models/rank/dlrm", {}).find("PaddleRec's dlrm folder's default"),
            std::string::npos);
  EXPECT_EQ(note("PaddleRec/models/rank/dlrm", {"hyper_parameters.dnn_batch_norm=true"}), "");
  EXPECT_EQ(note("elsewhere", {"hyper_parameters.model=dlrm"}), "");
  auto autoint_dnn = load("elsewhere", yaml,
                          {"hyper_parameters.model=autoint", "hyper_parameters.fc_sizes=[8]",
                           "hyper_parameters.dnn_batch_norm=true"});
  EXPECT_TRUE(autoint_dnn.ok()) << autoint_dnn.status().to_string();
}

// top_layer_sizes' last 2 picks PaddleRec's two-class output in its dlrm folder only (where the
// norm is on); elsewhere it means one logit, as before dlrm_output. The start line says whether
// the output is normalised, and softmax2 without the norm is warned of (both ReLU'd outputs can
// die), whether the folder or the key chose it.
TEST_F(ConfigTest, TopLayerSizesLast2IsTheTwoClassOutputInPaddleRecsDlrmFolderOnly) {
  const std::string yaml =
      "hyper_parameters:\n  optimizer:\n    class: SGD\n  sparse_feature_dim: 16\n"
      "  top_layer_sizes: [64, 2]\n";
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    return doc.ok() ? dlrm_output_note(*doc) : doc.status().to_string();
  };
  const std::string folder = "PaddleRec/models/rank/dlrm";
  auto paddlerec = load_in(folder, yaml);
  ASSERT_TRUE(paddlerec.ok()) << paddlerec.status().to_string();
  EXPECT_EQ(paddlerec->dense_model_config().dlrm_output, DlrmOutput::kSoftmax2);
  EXPECT_EQ(paddlerec->hyper.fc_sizes, std::vector<int>{64});
  EXPECT_EQ(paddlerec->hyper.optimizer.kind, DenseOptimizerKind::kAdam);  // its net's
  EXPECT_NE(note(folder, {}).find("ReLU'd and batch-normalised"), std::string::npos);
  EXPECT_EQ(dlrm_output_warning(*paddlerec), "");
  const std::vector<std::string> no_norm = {"hyper_parameters.dnn_batch_norm=false"};
  auto plain = load_in(folder, yaml, no_norm);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->hyper.dlrm_output, DlrmOutput::kSoftmax2);
  EXPECT_NE(note(folder, no_norm).find("not batch-normalised"), std::string::npos);
  EXPECT_NE(dlrm_output_warning(*plain).find("training stalls for good"), std::string::npos);
  // -o fc_sizes sets the hidden layers only: the file's top_layer_sizes width still chooses.
  auto resized = load_in(folder, yaml, {"hyper_parameters.fc_sizes=[32]"});
  ASSERT_TRUE(resized.ok()) << resized.status().to_string();
  EXPECT_EQ(resized->hyper.fc_sizes, std::vector<int>{32});
  EXPECT_EQ(resized->dense_model_config().dlrm_output, DlrmOutput::kSoftmax2);
  // Elsewhere: GPUBox's dlrm with one logit over the same hidden layers, no line, no warning.
  auto gpubox = load_in("elsewhere", yaml, {"hyper_parameters.model=dlrm"});
  ASSERT_TRUE(gpubox.ok()) << gpubox.status().to_string();
  EXPECT_EQ(gpubox->dense_model_config().dlrm_output, DlrmOutput::kLogit);
  EXPECT_EQ(gpubox->hyper.fc_sizes, std::vector<int>{64});
  EXPECT_EQ(gpubox->hyper.optimizer.kind, DenseOptimizerKind::kSgd);  // as written
  EXPECT_EQ(note("elsewhere", {"hyper_parameters.model=dlrm"}), "");
  EXPECT_EQ(dlrm_output_warning(*gpubox), "");
  // Asked for there, without the norm: built, and warned of.
  auto asked = load_in("elsewhere", yaml,
                       {"hyper_parameters.model=dlrm", "hyper_parameters.dlrm_output=softmax2"});
  ASSERT_TRUE(asked.ok()) << asked.status().to_string();
  EXPECT_EQ(asked->hyper.dlrm_output, DlrmOutput::kSoftmax2);
  EXPECT_NE(dlrm_output_warning(*asked).find("without hyper_parameters.dnn_batch_norm"),
            std::string::npos);
}

// hyper_parameters.dnn_dropout: PaddleRec's rate in the folders whose nets hard-code one (dcn_v2
// 0.5, deepfefm 0.2, fat_deepffm 0.5, flen 0.2; autoint's Dropout is never called), said at
// start; 0 elsewhere and whenever the key is set; outside [0, 0.999], for a network without a dnn
// and with dnn_batch_norm refused, naming the key.
TEST_F(ConfigTest, DropoutIsPaddleRecsFolderRateAndOtherwiseAskedFor) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  const auto rate = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto c = load_in(folder, yaml, overrides);
    EXPECT_TRUE(c.ok()) << folder << ": " << c.status().to_string();
    return c.ok() ? c->dense_model_config().dnn_dropout : -1.0f;
  };
  const std::vector<std::string> groups = {"hyper_parameters.field_group_sizes=[13, 3, 10]"};
  EXPECT_EQ(rate("PaddleRec/models/rank/dcn_v2", {}), 0.5f);
  EXPECT_EQ(rate("PaddleRec/models/rank/deepfefm", {}), 0.2f);
  EXPECT_EQ(rate("PaddleRec/models/rank/fat_deepffm", {}), 0.5f);
  EXPECT_EQ(rate("PaddleRec/models/rank/flen", groups), 0.2f);
  EXPECT_EQ(rate("PaddleRec/models/rank/autoint", {}), 0.0f);
  EXPECT_EQ(rate("PaddleRec/models/rank/wide_deep", {}), 0.0f);
  EXPECT_EQ(rate("elsewhere", {}), 0.0f);
  EXPECT_EQ(rate("PaddleRec/models/rank/dcn_v2", {"hyper_parameters.dnn_dropout=0"}), 0.0f);
  EXPECT_EQ(rate("elsewhere", {"hyper_parameters.dnn_dropout=0.3"}), 0.3f);
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    EXPECT_TRUE(doc.ok()) << doc.status().to_string();
    return doc.ok() ? dnn_dropout_note(*doc) : std::string();
  };
  EXPECT_NE(note("PaddleRec/models/rank/dcn_v2", {}).find("0.5, PaddleRec's dcn_v2 folder's"),
            std::string::npos)
      << note("PaddleRec/models/rank/dcn_v2", {});
  // flen's net drops a hidden unit three times (after its batch norm too) and its
  // bi-interaction's layer.
  const std::string flen = note("PaddleRec/models/rank/flen", groups);
  EXPECT_NE(flen.find("a hidden unit kept with probability 0.512"), std::string::npos) << flen;
  EXPECT_NE(flen.find("after the bi-interaction's layer"), std::string::npos) << flen;
  EXPECT_EQ(note("PaddleRec/models/rank/dcn_v2", {"hyper_parameters.dnn_dropout=0.5"}), "");
  EXPECT_EQ(note("elsewhere", {}), "");
  const auto refusal = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto c = load_in(folder, yaml, overrides);
    EXPECT_FALSE(c.ok()) << folder;
    return c.ok() ? std::string() : c.status().message();
  };
  for (const char* bad : {"hyper_parameters.dnn_dropout=1", "hyper_parameters.dnn_dropout=-0.1",
                          "hyper_parameters.dnn_dropout=0.9995"}) {
    EXPECT_NE(refusal("elsewhere", {bad}).find("hyper_parameters.dnn_dropout"), std::string::npos)
        << bad;
  }
  EXPECT_NE(refusal("elsewhere", {"hyper_parameters.dnn_dropout=0.9995"}).find("[0, 0.999]"),
            std::string::npos);
  EXPECT_EQ(rate("elsewhere", {"hyper_parameters.dnn_dropout=0.999"}), 0.999f);
  // flen's (1-p)^3 at least 2^-20 (the masks' 32-bit threshold): at most 0.990.
  const auto flen_at = [&](const char* p) {
    std::vector<std::string> overrides = groups;
    overrides.push_back(std::string("hyper_parameters.dnn_dropout=") + p);
    return overrides;
  };
  EXPECT_EQ(rate("PaddleRec/models/rank/flen", flen_at("0.99")), 0.99f);
  for (const char* p : {"0.991", "0.999"}) {
    const std::string flen_high = refusal("PaddleRec/models/rank/flen", flen_at(p));
    EXPECT_NE(flen_high.find("hyper_parameters.dnn_dropout is " + std::string(p) +
                             ", but flen's net drops a hidden unit 3 times"),
              std::string::npos)
        << flen_high;
    EXPECT_NE(flen_high.find("must be at most 0.9901 for flen"), std::string::npos) << flen_high;
  }
  EXPECT_NE(
      refusal("elsewhere", {"hyper_parameters.model=wide", "hyper_parameters.dnn_dropout=0.2"})
          .find("wide has no dnn"),
      std::string::npos);
  const std::string norm =
      refusal("PaddleRec/models/rank/dcn_v2",
              {"hyper_parameters.dnn_batch_norm=true", "hyper_parameters.dnn_dropout=0.5"});
  EXPECT_NE(norm.find("dnn_dropout=0 or hyper_parameters.dnn_batch_norm=false"), std::string::npos)
      << norm;
}

// The folder's rate is its net's: another network trained in the folder (dnn in dcn_v2's, fm or
// ffm in deepfefm's, wide in dcn_v2's) trains without dropout, as before the key, and is not
// refused; with dnn_batch_norm (dropout not built with it) the folder's rate gives way to 0, said.
TEST_F(ConfigTest, TheFoldersDropoutRateIsItsNetworksOnlyAndGivesWayToBatchNorm) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  const auto loaded = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto c = load_in(folder, yaml, overrides);
    EXPECT_TRUE(c.ok()) << folder << ": " << c.status().to_string();
    return c.ok() ? c->hyper.dnn_dropout : -1.0;
  };
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    EXPECT_TRUE(doc.ok()) << doc.status().to_string();
    return doc.ok() ? dnn_dropout_note(*doc) : std::string();
  };
  const std::string dcn_v2 = "PaddleRec/models/rank/dcn_v2";
  const std::string deepfefm = "PaddleRec/models/rank/deepfefm";
  EXPECT_EQ(loaded(dcn_v2, {"hyper_parameters.model=dnn"}), 0.0);
  EXPECT_EQ(note(dcn_v2, {"hyper_parameters.model=dnn"}), "");
  EXPECT_EQ(loaded(dcn_v2, {"hyper_parameters.model=wide"}), 0.0);
  EXPECT_EQ(loaded(deepfefm, {"hyper_parameters.model=fm"}), 0.0);
  EXPECT_EQ(loaded(deepfefm, {"hyper_parameters.model=ffm"}), 0.0);
  EXPECT_EQ(loaded(deepfefm, {"hyper_parameters.model=deepfefm"}), 0.2);
  const std::vector<std::string> flen_norm = {"hyper_parameters.field_group_sizes=[13, 3, 10]",
                                              "hyper_parameters.dnn_batch_norm=true"};
  EXPECT_EQ(loaded("PaddleRec/models/rank/flen", flen_norm), 0.0);
  const std::string said = note("PaddleRec/models/rank/flen", flen_norm);
  EXPECT_NE(said.find("hyper_parameters.dnn_dropout: 0, not PaddleRec's flen folder's 0.2"),
            std::string::npos)
      << said;
  EXPECT_EQ(loaded(dcn_v2, {"hyper_parameters.dnn_batch_norm=true"}), 0.0);
}

// hyper_parameters.optimizer.clip_by_norm: PaddleRec's dcn_v2 trainer's 10 in its folder for its
// network, said at start; 0 elsewhere, for another network in the folder and when set; in a
// parameter-server mode the folder's default is 0 (said) and a set value is refused.
TEST_F(ConfigTest, ClipByNormIsTheDcnV2FoldersTenAndBuiltInGpuboxModeOnly) {
  const std::string yaml = "runner:\n  train_batch_size: 8\n";
  const std::string key = "hyper_parameters.optimizer.clip_by_norm";
  const std::string dcn_v2 = "PaddleRec/models/rank/dcn_v2";
  const auto loaded = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto c = load_in(folder, yaml, overrides);
    EXPECT_TRUE(c.ok()) << folder << ": " << c.status().to_string();
    return c.ok() ? c->hyper.clip_by_norm : -1.0;
  };
  const auto note = [&](const std::string& folder, const std::vector<std::string>& overrides) {
    auto doc = config::ConfigDocument::load((dir_ / folder / "config.yaml").string(), overrides);
    EXPECT_TRUE(doc.ok()) << doc.status().to_string();
    return doc.ok() ? clip_by_norm_note(*doc) : std::string();
  };
  EXPECT_EQ(loaded(dcn_v2, {}), 10.0);
  // A save records the norm trained, and that the folder derived it (a resume of a save made
  // before the key, at 0, is told the -o that resumes it).
  auto folder = load_in(dcn_v2, yaml, {});
  ASSERT_TRUE(folder.ok());
  EXPECT_EQ(folder->model_keys.at(key), "10");
  EXPECT_EQ(folder->derived_model_keys.count(key), 1u);
  auto set = load_in(dcn_v2, yaml, {key + "=10"});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->derived_model_keys.count(key), 0u);
  EXPECT_EQ(loaded(dcn_v2, {"runner.use_fleet=true", "runner.use_gpu=true"}), 10.0);
  EXPECT_EQ(loaded(dcn_v2, {key + "=0"}), 0.0);
  EXPECT_EQ(loaded(dcn_v2, {key + "=2.5"}), 2.5);
  EXPECT_EQ(loaded(dcn_v2, {"hyper_parameters.model=dnn"}), 0.0);
  EXPECT_EQ(loaded("PaddleRec/models/rank/dcn", {}), 0.0);
  EXPECT_EQ(loaded("elsewhere", {}), 0.0);
  EXPECT_EQ(loaded("elsewhere", {key + "=5"}), 5.0);
  const std::string said = note(dcn_v2, {});
  EXPECT_NE(said.find(key + ": 10, PaddleRec's dcn_v2 trainer's default"), std::string::npos)
      << said;
  EXPECT_EQ(note(dcn_v2, {key + "=10"}), "");
  EXPECT_EQ(note(dcn_v2, {"hyper_parameters.model=dnn"}), "");
  EXPECT_EQ(note("elsewhere", {}), "");
  // The parameter-server modes do not build it: the folder's default gives way, said; set, refused.
  for (const char* mode : {"async", "sync", "geo"}) {
    const std::string ps = std::string("runner.sync_mode=") + mode;
    EXPECT_EQ(loaded(dcn_v2, {ps}), 0.0) << mode;
    EXPECT_NE(note(dcn_v2, {ps}).find(key + ": 0, not PaddleRec's dcn_v2 trainer's default"),
              std::string::npos)
        << note(dcn_v2, {ps});
    EXPECT_EQ(loaded(dcn_v2, {ps, key + "=0"}), 0.0) << mode;
    auto refused = load_in("elsewhere", yaml, {ps, key + "=1"});
    ASSERT_FALSE(refused.ok()) << mode;
    EXPECT_NE(refused.status().message().find(key + " is 1, but clipping by global norm is built "
                                                    "only in runner.sync_mode gpubox"),
              std::string::npos)
        << refused.status().message();
  }
  EXPECT_FALSE(load_in("elsewhere", yaml, {key + "=-1"}).ok());
}

}  // namespace
}  // namespace gpubox::trainer
