#include "table/server/server_config.hpp"

#include <gtest/gtest.h>

namespace gpubox::table::server {
namespace {

TEST(ServerConfig, ReadsTheShippedTrainerConfig) {
  SparseOptimizerConfig cfg;
  cfg.mf_dim = 99;
  cfg.kind = SparseOptimizerKind::kSgd;
  Status st = load_sparse_config_yaml(GPUBOX_SOURCE_DIR "/configs/config_gpubox.yaml", &cfg);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(cfg.mf_dim, 8);  // sparse_feature_dim 9 = 1 + mf_dim
  EXPECT_EQ(cfg.kind, SparseOptimizerKind::kAdagrad);
  EXPECT_FLOAT_EQ(cfg.mf_initial_range, 1e-4f);
}

TEST(ServerConfig, KeysOverrideDefaultsAndErrorsNameTheKey) {
  SparseOptimizerConfig cfg;
  Status st = parse_sparse_config_yaml(
      "hyper_parameters:\n  sparse_optimizer:\n    class: shared_adam\n    mf_dim: 16\n"
      "    seed: 12345678901\n    embedx_threshold: 2.5\n",
      "inline.yaml", &cfg);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(cfg.kind, SparseOptimizerKind::kSharedAdam);
  EXPECT_EQ(cfg.mf_dim, 16);  // no sparse_feature_dim: sparse_optimizer.mf_dim counts
  EXPECT_EQ(cfg.seed, 12345678901ULL);
  EXPECT_FLOAT_EQ(cfg.embedx_threshold, 2.5f);

  st = parse_sparse_config_yaml("hyper_parameters:\n  sparse_optimizer:\n    class: lamb\n",
                                "bad.yaml", &cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("bad.yaml"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("sparse_optimizer.class"), std::string::npos) << st.to_string();

  st = parse_sparse_config_yaml("hyper_parameters:\n  sparse_optimizer:\n    learning_rate: fast\n",
                                "bad.yaml", &cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("learning_rate"), std::string::npos) << st.to_string();

  st = parse_sparse_config_yaml("hyper_parameters: [1, 2\n", "broken.yaml", &cfg);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(load_sparse_config_yaml("/nonexistent/config.yaml", &cfg).ok());
}

TEST(ServerConfig, OptimizerNames) {
  EXPECT_EQ(parse_optimizer_kind("SGD").value(), SparseOptimizerKind::kSgd);
  EXPECT_EQ(parse_optimizer_kind("SparseAdaGradSGDRule").value(), SparseOptimizerKind::kAdagrad);
  EXPECT_EQ(parse_optimizer_kind("adam").value(), SparseOptimizerKind::kAdam);
  EXPECT_EQ(parse_optimizer_kind("shared_adam").value(), SparseOptimizerKind::kSharedAdam);
  EXPECT_FALSE(parse_optimizer_kind("").ok());
}

}  // namespace
}  // namespace gpubox::table::server
