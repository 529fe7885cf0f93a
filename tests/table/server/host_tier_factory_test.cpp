// The host-tier factory and the host-tier keys: every setting of the config reaches the tier it
// builds. The key table's defaults are the structs' defaults; each key, set to a non-default
// value, arrives in its field; the in-process table is opened with that table config (disk tier
// included) and the remote client with those endpoints, token and timeouts (a loopback server
// that requires the token accepts it and refuses a client without it).
#include "table/server/host_tier_factory.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_config.hpp"
#include "table/sparse_table.hpp"

namespace gpubox::table {
namespace {

namespace fs = std::filesystem;

HostTierConfig from_overrides(const std::vector<std::string>& overrides) {
  auto doc = config::ConfigDocument::parse("runner:\n  epochs: 1\n", ".", overrides, "test");
  EXPECT_TRUE(doc.ok()) << doc.status().to_string();
  return host_tier_config_from(*doc);
}

TEST(HostTierConfigFrom, DefaultsAreTheStructDefaults) {
  const HostTierConfig got = from_overrides({});
  const HostTableConfig table;
  const RemoteTierConfig remote;
  EXPECT_EQ(got.table.shards, table.shards);
  EXPECT_EQ(got.table.save_form, table.save_form);
  EXPECT_EQ(got.table.rocksdb_path, table.rocksdb_path);
  EXPECT_EQ(got.table.memory_row_budget, table.memory_row_budget);
  EXPECT_EQ(got.table.memory_budget_bytes, table.memory_budget_bytes);
  EXPECT_EQ(got.table.cold_after_days, table.cold_after_days);
  EXPECT_EQ(got.remote.endpoints, "");  // from the launcher, never the config
  EXPECT_EQ(got.remote.auth_token, "");
  EXPECT_EQ(got.remote.deadline_s, remote.deadline_s);
  EXPECT_EQ(got.remote.connect_timeout_s, remote.connect_timeout_s);
  EXPECT_EQ(got.remote.connections_per_endpoint, remote.connections_per_endpoint);
}

TEST(HostTierConfigFrom, EveryKeyReachesItsField) {
  const HostTierConfig got = from_overrides(
      {"runner.host_table_shards=5", "runner.save_form=text", "runner.rocksdb_path=/tmp/disk",
       "runner.host_memory_row_budget=1234", "runner.host_memory_mb=3", "runner.cold_after_days=9",
       "runner.server_timeout_s=7.5", "runner.server_connect_timeout_s=0.25",
       "runner.server_connections=3"});
  EXPECT_EQ(got.table.shards, 5u);
  EXPECT_EQ(got.table.save_form, SaveForm::kText);
  EXPECT_EQ(got.table.rocksdb_path, "/tmp/disk");
  EXPECT_EQ(got.table.memory_row_budget, 1234u);
  EXPECT_EQ(got.table.memory_budget_bytes, uint64_t{3} << 20);
  EXPECT_EQ(got.table.cold_after_days, 9);
  EXPECT_EQ(got.remote.deadline_s, 7.5);
  EXPECT_EQ(got.remote.connect_timeout_s, 0.25);
  EXPECT_EQ(got.remote.connections_per_endpoint, 3);
}

TEST(HostTierConfigFrom, OutOfRangeValuesAreErrorsNamingTheKey) {
  for (const std::string bad :
       {"runner.host_table_shards=0", "runner.server_connections=0", "runner.save_form=csv",
        "runner.server_timeout_s=0", "runner.server_timeout_s=0.5"}) {
    auto doc = config::ConfigDocument::parse("runner:\n  epochs: 1\n", ".", {bad}, "test");
    ASSERT_FALSE(doc.ok()) << bad;
    EXPECT_NE(doc.status().message().find(bad.substr(0, bad.find('='))), std::string::npos)
        << doc.status().to_string();
  }
}

AccessorConfig accessor() {
  AccessorConfig cfg;
  cfg.optimizer.kind = SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  cfg.seed = 3;
  return cfg;
}

TEST(MakeHostTier, InProcessTableGetsTheTableConfigAndItsDiskTier) {
  const fs::path disk =
      fs::temp_directory_path() / ("gpubox_factory_" + std::to_string(::getpid()));
  fs::remove_all(disk);
  HostTierConfig config =
      from_overrides({"runner.host_table_shards=3", "runner.save_form=text",
                      "runner.rocksdb_path=" + disk.string(), "runner.host_memory_row_budget=6",
                      "runner.cold_after_days=2"});
  auto tier = make_host_tier(accessor(), config);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  auto* table = dynamic_cast<SparseTable*>(tier->get());
  ASSERT_NE(table, nullptr) << "no endpoints: the in-process table";
  EXPECT_EQ(table->table_config().shards, 3u);
  EXPECT_EQ(table->table_config().save_form, SaveForm::kText);
  EXPECT_EQ(table->table_config().rocksdb_path, disk.string());
  EXPECT_EQ(table->table_config().memory_row_budget, 6u);
  EXPECT_EQ(table->table_config().cold_after_days, 2);
  EXPECT_EQ(table->config().seed, 3u);
  // The disk tier works: over the memory budget, rows go to disk and come back unchanged.
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 64; ++k) keys.push_back(k * 7919);
  std::vector<float> rows(keys.size() * table->layout().stride());
  ASSERT_TRUE(table->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  auto stats = table->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->rows_on_disk, 0u);
  EXPECT_LE(stats->rows_in_memory, 6u + 3u);  // each shard keeps max(1, budget / shards)
  std::vector<float> again(rows.size());
  ASSERT_TRUE(table->pull(keys.data(), nullptr, keys.size(), again.data(), nullptr).ok());
  EXPECT_EQ(rows, again);
  // A second table on the same folder (a second server given the same --rocksdb_dir) is refused
  // naming both spellings of the folder and why (RocksDB's lock error said neither).
  auto second = make_host_tier(accessor(), config);
  ASSERT_FALSE(second.ok());
  const std::string what = second.status().message();
  EXPECT_NE(what.find("(runner.rocksdb_path or gpubox_server --rocksdb_dir '" + disk.string()),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("another process has this folder open"), std::string::npos) << what;
  tier->reset();
  fs::remove_all(disk);
}

TEST(MakeHostTier, RemoteClientGetsTheEndpointsTokenAndTimeouts) {
  auto table = SparseTable::open(accessor(), HostTableConfig{});
  ASSERT_TRUE(table.ok());
  server::ServerOptions server_options;
  server_options.port = 0;
  server_options.auth_token = "s3cret-0123456789abcdef0123456789ab";
  auto server = server::Server::start(table->get(), server_options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  HostTierConfig config =
      from_overrides({"runner.server_timeout_s=1.5", "runner.server_connect_timeout_s=0.2",
                      "runner.server_connections=3"});
  config.remote.endpoints = (*server)->endpoint();
  config.remote.auth_token = "s3cret-0123456789abcdef0123456789ab";
  auto tier = make_host_tier(accessor(), config);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  auto* remote = dynamic_cast<server::RemoteHostTier*>(tier->get());
  ASSERT_NE(remote, nullptr) << "endpoints given: the remote tier";
  EXPECT_EQ(remote->options().endpoints, (*server)->endpoint());
  EXPECT_EQ(remote->options().auth_token, "s3cret-0123456789abcdef0123456789ab");
  EXPECT_EQ(remote->options().deadline_s, 1.5);
  EXPECT_EQ(remote->options().connect_timeout_s, 0.2);
  EXPECT_EQ(remote->options().connections_per_endpoint, 3);
  EXPECT_EQ(remote->config().seed, 3u);
  uint64_t key = 42;
  std::vector<float> row(remote->layout().stride());
  EXPECT_TRUE(remote->pull(&key, nullptr, 1, row.data(), nullptr).ok());

  // Without the token the server refuses the client: the error names the servers.
  config.remote.auth_token.clear();
  auto refused = make_host_tier(accessor(), config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find((*server)->endpoint()), std::string::npos)
      << refused.status().to_string();
  tier->reset();
  (*server)->stop();
  (*server)->wait();
}

// A PaddleRec model folder's config that names no sparse rule: its rows take its Adam
// (sparse_config_from: its learning_rate for both parts, its beta1, beta2 and epsilon).
constexpr const char* kPaddleRecAdam = R"(workspace: "models/rank/xdeepfm"
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
  sparse_inputs_slots: 27
  sparse_feature_number: 1000001
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128, 32]
  layer_sizes_dnn: [512, 256, 128]
  layer_sizes_cin: [128, 32]
)";

AccessorConfig paddlerec_rows(const std::vector<std::string>& overrides) {
  auto doc = config::ConfigDocument::parse(kPaddleRecAdam, "/base", overrides, "p.yaml");
  EXPECT_TRUE(doc.ok()) << doc.status().to_string();
  auto rows = sparse_config_from(*doc);
  EXPECT_TRUE(rows.ok()) << rows.status().to_string();
  return rows.ok() ? *rows : AccessorConfig{};
}

// The message of make_host_tier's refusal of a trainer whose rows are `trainer` by a server whose
// rows are `served` ("" when it connects).
std::string refusal(const AccessorConfig& served, const AccessorConfig& trainer) {
  auto table = SparseTable::open(served, HostTableConfig{});
  EXPECT_TRUE(table.ok());
  server::ServerOptions server_options;
  server_options.port = 0;
  auto server = server::Server::start(table->get(), server_options);
  EXPECT_TRUE(server.ok()) << server.status().to_string();
  HostTierConfig config = from_overrides({"runner.server_timeout_s=2"});
  config.remote.endpoints = (*server)->endpoint();
  std::string what;
  if (auto tier = make_host_tier(trainer, config); !tier.ok()) what = tier.status().message();
  (*server)->stop();
  (*server)->wait();
  return what;
}

// A trainer of a PaddleRec config at another optimizer learning rate than its servers' is refused
// naming the key that gives it the servers' rule: hyper_parameters.optimizer.learning_rate. Not
// hyper_parameters.sparse_optimizer.learning_rate: setting that leaves PaddleRec's rule (the rows
// become adagrad's) and the next connect is refused on the class. With the key it names, it
// connects; servers whose rule no key of PaddleRec's gives (an embedx_threshold of their own)
// are named, and the trainer told only to start them with its config.
TEST(MakeHostTier, APaddleRecTrainerAtAnotherLearningRateIsToldItsOptimizersKey) {
  const AccessorConfig served = paddlerec_rows({"hyper_parameters.optimizer.learning_rate=0.002"});
  ASSERT_TRUE(served.rule_from_paddlerec_optimizer);
  ASSERT_EQ(served.optimizer.kind, SparseOptimizerKind::kAdam);
  const std::string refused = refusal(served, paddlerec_rows({}));
  for (const std::string words :
       {"hyper_parameters.sparse_optimizer.learning_rate 0.00200000009 (this trainer: "
        "0.00100000005); hyper_parameters.sparse_optimizer.mf_learning_rate 0.00200000009",
        "run the trainer with the servers' values: -o "
        "hyper_parameters.optimizer.learning_rate=0.00200000009 (PaddleRec's optimizer"}) {
    EXPECT_NE(refused.find(words), std::string::npos) << words << "\n" << refused;
  }
  EXPECT_EQ(refused.find("-o hyper_parameters.sparse_optimizer"), std::string::npos) << refused;
  EXPECT_EQ(refusal(served, paddlerec_rows({"hyper_parameters.optimizer.learning_rate="
                                            "0.00200000009"})),
            "");
  AccessorConfig own_threshold = served;
  own_threshold.embedx_threshold = 5.0f;
  const std::string no_key =
      refusal(own_threshold, paddlerec_rows({"hyper_parameters.optimizer.learning_rate=0.002"}));
  EXPECT_NE(no_key.find("hyper_parameters.sparse_optimizer.embedx_threshold 5 (this trainer: 0)"),
            std::string::npos)
      << no_key;
  EXPECT_NE(no_key.find("start the servers with the trainer's config"), std::string::npos)
      << no_key;
  EXPECT_EQ(no_key.find(" -o hyper_parameters"), std::string::npos) << no_key;
}

// New rows start at values hashed from their key and the accessor's seed (runner.seed ^
// hyper_parameters.sparse_optimizer.seed): a trainer of another seed than its servers' is refused
// naming both seeds, and each of the overrides it is told gives it the servers' seed (and
// connects).
TEST(MakeHostTier, ATrainerOfAnotherSeedIsRefusedAndToldTheOverridesThatGiveItTheServers) {
  const AccessorConfig served =
      paddlerec_rows({"runner.seed=5", "hyper_parameters.sparse_optimizer.seed=3"});
  ASSERT_EQ(served.seed, 6u);
  const std::string refused = refusal(served, paddlerec_rows({"runner.seed=9"}));
  for (const std::string words :
       {"creates new rows from seed 6 (runner.seed ^ hyper_parameters.sparse_optimizer.seed of its "
        "config), this trainer from 9",
        "-o runner.seed=6 -o hyper_parameters.sparse_optimizer.seed=0"}) {
    EXPECT_NE(refused.find(words), std::string::npos) << words << "\n" << refused;
  }
  EXPECT_EQ(refusal(served,
                    paddlerec_rows({"runner.seed=6", "hyper_parameters.sparse_optimizer.seed=0"})),
            "");
  // The trainer's runner.seed kept: the sparse seed is the servers' xor it (6 ^ 9).
  EXPECT_EQ(refusal(served,
                    paddlerec_rows({"runner.seed=9", "hyper_parameters.sparse_optimizer.seed=15"})),
            "");
}

}  // namespace
}  // namespace gpubox::table
