// What a client checks when it connects (RemoteHostTier::check_servers, the INFO reply): a server
// whose rows or rule differ from the trainer's config is refused at connect, naming what differs,
// never trained against silently.
#include <gtest/gtest.h>

#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

TEST(ServerHandshake, LayoutMismatchIsRefusedAtConnect) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto options = client_options(server->endpoint());
  options.config.mf_dim = 8;
  auto client = RemoteHostTier::connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("mf_dim 4"), std::string::npos)
      << client.status().to_string();
}

// fp16 and bf16 rows have the same stride: INFO's storage tells them apart, and the error names
// both.
TEST(ServerHandshake, SparseStorageMismatchIsRefusedAtConnect) {
  AccessorConfig fp16 = test_config();
  fp16.storage = SparseStorage::kFp16;
  FakeHostTier table(fp16);
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto options = client_options(server->endpoint());
  options.config.storage = SparseStorage::kBf16;
  auto client = RemoteHostTier::connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("sparse_storage fp16"), std::string::npos)
      << client.status().to_string();
  EXPECT_NE(client.status().message().find("sparse_storage bf16"), std::string::npos)
      << client.status().to_string();
  options.config.storage = SparseStorage::kFp16;
  EXPECT_TRUE(RemoteHostTier::connect(options).ok());
}

// The whole sparse rule is compared, not only its class: a trainer whose learning rate (or any
// field that changes training) is not the server's is refused naming the key, both values and
// the -o that fixes it, not left to train silently under the server's rule.
TEST(ServerHandshake, SparseRuleMismatchIsRefusedAtConnectNamingTheKey) {
  AccessorConfig served = test_config();
  served.optimizer.learning_rate = 0.05f;
  FakeHostTier table(served);
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto options = client_options(server->endpoint());
  options.config = served;
  options.config.optimizer.learning_rate = 0.1f;
  options.config.embedx_threshold = served.embedx_threshold + 1.0f;
  auto client = RemoteHostTier::connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), Status::Code::kInvalidArgument);
  const std::string key = "hyper_parameters.sparse_optimizer.learning_rate";
  for (const std::string& words :
       {key + " 0.0500000007 (this trainer: 0.100000001)",
        std::string("hyper_parameters.sparse_optimizer.embedx_threshold"),
        " -o " + key + "=0.0500000007",
        std::string("start the servers with the trainer's config")}) {
    EXPECT_NE(client.status().message().find(words), std::string::npos)
        << words << ": " << client.status().to_string();
  }
  // Every field agreeing (the server's rule given to the trainer): it connects.
  options.config = served;
  EXPECT_TRUE(RemoteHostTier::connect(options).ok());
}

// A server listed twice (as 127.0.0.1 and as localhost: one server under two names, its
// instance id the same) would take two shares of the keys; one started alone (shard 0 of 1) in
// a list of two writes saves that collide with the other's. Both are refused at connect naming
// the server and what to do (a duplicate list and a mix of 0/2 and 0/1 trained with exit 0).
TEST(ServerHandshake, AServerListedTwiceOrStartedAloneAmongSeveralIsRefused) {
  FakeHostTier table(test_config());
  auto alone = start_server(&table);
  ASSERT_TRUE(alone);
  const std::string endpoint = alone->endpoint();
  const std::string port = endpoint.substr(endpoint.rfind(':') + 1);
  auto twice = RemoteHostTier::connect(client_options(endpoint + ",localhost:" + port));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("is listed twice in the servers' list (positions 0 and "
                                          "1, as " +
                                          endpoint + " and localhost:" + port + ")"),
            std::string::npos)
      << twice.status().to_string();

  FakeHostTier table0(test_config());
  ServerOptions first;
  first.shard_id = 0;
  first.shard_num = 2;
  auto shard0 = start_server(&table0, first);
  ASSERT_TRUE(shard0);
  auto mixed = RemoteHostTier::connect(client_options(shard0->endpoint() + "," + endpoint));
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find(
                "server " + endpoint +
                " runs alone (shard 0 of 1: started without --shard_id/--shard_num) but is "
                "listed at position 1 of 2 endpoints"),
            std::string::npos)
      << mixed.status().to_string();
  // Alone, it serves.
  EXPECT_TRUE(RemoteHostTier::connect(client_options(endpoint)).ok());
}

}  // namespace
}  // namespace gpubox::table::server
