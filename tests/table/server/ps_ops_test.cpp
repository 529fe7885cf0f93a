// The parameter-server modes' ops on loopback (table/server/ps_protocol.hpp): PS_PUSH applies
// the accessor's rule (or a geo delta) exactly as the rule applied to a copy of the rows does,
// concurrent pushes of one key are not lost, a retried push is applied once, and DENSE reads,
// creates and adds with its bounds; both need the token on a server that has one.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <unordered_map>

#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

TEST(PsOps, RoundTripsAndRefusesMalformedRequests) {
  const std::vector<uint64_t> keys = {3, 5};
  const std::vector<int32_t> slots = {1, 2};
  const std::vector<float> values = {1, 0, 0.5f, 0.25f, 1, 1, -0.5f, 0.75f};
  std::vector<uint8_t> bytes;
  encode_ps_push_request(PsUpdateKind::kDelta, keys.data(), slots.data(), 2, values.data(), 4,
                         &bytes);
  auto push = decode_ps_push_request(bytes.data(), bytes.size());
  ASSERT_TRUE(push.ok()) << push.status().to_string();
  EXPECT_EQ(push->kind, PsUpdateKind::kDelta);
  EXPECT_EQ(push->keys, keys);
  EXPECT_EQ(push->slots, slots);
  EXPECT_EQ(push->values, values);
  // Truncated at every length, an unknown kind, a zero width: errors, never a crash.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode_ps_push_request(bytes.data(), n).ok()) << n;
  }
  std::vector<uint8_t> bad = bytes;
  bad[0] = 7;
  EXPECT_FALSE(decode_ps_push_request(bad.data(), bad.size()).ok());
  bad = bytes;
  bad[5] = bad[6] = bad[7] = bad[8] = 0;  // dim 0
  EXPECT_FALSE(decode_ps_push_request(bad.data(), bad.size()).ok());

  bytes.clear();
  encode_dense_request(DenseAction::kAdd, "dense", values.data(), values.size(), &bytes);
  auto dense = decode_dense_request(bytes.data(), bytes.size());
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->action, DenseAction::kAdd);
  EXPECT_EQ(dense->name, "dense");
  EXPECT_EQ(dense->values, values);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode_dense_request(bytes.data(), n).ok()) << n;
  }
  bytes.clear();
  encode_dense_request(DenseAction::kRead, std::string(kMaxDenseNameBytes + 1, 'x'), nullptr, 0,
                       &bytes);
  EXPECT_FALSE(decode_dense_request(bytes.data(), bytes.size()).ok());
  bytes.clear();
  encode_dense_request(DenseAction::kRead, "", nullptr, 0, &bytes);
  EXPECT_FALSE(decode_dense_request(bytes.data(), bytes.size()).ok());
  bytes.clear();
  encode_dense_request(DenseAction::kWrite, "dense", values.data(), values.size(), &bytes);
  ASSERT_TRUE(decode_dense_request(bytes.data(), bytes.size()).ok());
  bytes[0] = static_cast<uint8_t>(DenseAction::kWrite) + 1;  // no such action
  EXPECT_FALSE(decode_dense_request(bytes.data(), bytes.size()).ok());
}

// Seeded batches of gradients and deltas through two servers, against the rules applied to an
// oracle map of rows (created by init_row as the servers do).
TEST(PsOps, PushUpdatesApplyTheRuleAsTheOracleDoes) {
  const AccessorConfig cfg = test_config();
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  FakeHostTier table0(cfg), table1(cfg);
  ServerOptions s0, s1;
  s0.shard_num = s1.shard_num = 2;
  s1.shard_id = 1;
  auto server0 = start_server(&table0, s0);
  auto server1 = start_server(&table1, s1);
  ASSERT_TRUE(server0 && server1);
  auto client = connect_client(client_options(server0->endpoint() + "," + server1->endpoint()));
  ASSERT_TRUE(client);
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const auto dim = static_cast<std::size_t>(layout.push_dim());
  for (int round = 0; round < 20; ++round) {
    // Sizes 0, 1 and more; distinct keys per call, as trainers send them.
    const std::size_t n = round == 0 ? 0 : round == 1 ? 1 : 50 + rng() % 150;
    std::vector<uint64_t> keys;
    std::unordered_map<uint64_t, bool> seen;
    while (keys.size() < n) {
      const uint64_t key = 1 + rng() % 400;
      if (seen.emplace(key, true).second) keys.push_back(key);
    }
    std::vector<int32_t> slots(n, 3);
    std::vector<float> values(n * dim);
    for (std::size_t i = 0; i < n; ++i) {
      values[i * dim] = static_cast<float>(1 + rng() % 20);  // show
      values[i * dim + 1] = static_cast<float>(rng() % 2);   // click
      for (std::size_t f = 2; f < dim; ++f) values[i * dim + f] = value(rng);
    }
    const auto kind = round % 3 == 2 ? PsUpdateKind::kDelta : PsUpdateKind::kGradient;
    ASSERT_TRUE(client->push_updates(kind, keys.data(), slots.data(), n, values.data()).ok());
    for (std::size_t i = 0; i < n; ++i) {
      auto [it, fresh] = oracle.try_emplace(keys[i]);
      if (fresh) {
        it->second.resize(static_cast<std::size_t>(layout.stride()));
        init_row(it->second.data(), layout, cfg, keys[i], 3);
      }
      if (kind == PsUpdateKind::kGradient) {
        table::optimizer::apply_push(it->second.data(), layout, cfg, keys[i],
                                     values.data() + i * dim);
      } else {
        table::optimizer::apply_delta(it->second.data(), layout, cfg, keys[i],
                                      values.data() + i * dim);
      }
    }
  }
  std::vector<uint64_t> keys;
  for (const auto& [key, row] : oracle) keys.push_back(key);
  std::vector<float> rows(keys.size() * static_cast<std::size_t>(layout.stride()));
  ASSERT_TRUE(client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (int32_t f = 0; f < layout.stride(); ++f) {
      ASSERT_EQ(rows[i * static_cast<std::size_t>(layout.stride()) + static_cast<std::size_t>(f)],
                oracle[keys[i]][static_cast<std::size_t>(f)])
          << "key " << keys[i] << " field " << f;
    }
  }
  // A width that is not the table's, and a non-finite value: refused whole.
  const uint64_t key = keys[0];
  const int32_t slot = 3;
  std::vector<float> bad(dim, 0.0f);
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(client->push_updates(PsUpdateKind::kGradient, &key, &slot, 1, bad.data()).ok());
  Connection raw = raw_connection(server0->port());
  std::vector<uint8_t> payload;
  encode_ps_push_request(PsUpdateKind::kGradient, &key, &slot, 1, bad.data(),
                         static_cast<uint32_t>(dim - 1), &payload);
  EXPECT_EQ(raw_call(raw, Op::kPsPush, payload).code(), Status::Code::kInvalidArgument);
}

TEST(PsOps, ConcurrentGradientsOfOneKeyAreNotLost) {
  AccessorConfig cfg = test_config();
  cfg.optimizer.kind = SparseOptimizerKind::kSgd;
  FakeHostTier table(cfg);
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  RemoteHostTierOptions options = client_options(server->endpoint());
  options.config = cfg;
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  constexpr int kThreads = 4, kPushes = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto client = connect_client(options);
      ASSERT_TRUE(client);
      const uint64_t key = 42;
      const int32_t slot = 0;
      std::vector<float> push(static_cast<std::size_t>(layout.push_dim()), 0.0f);
      push[0] = 1.0f;  // one show each: every push is counted
      for (int i = 0; i < kPushes; ++i) {
        ASSERT_TRUE(
            client->push_updates(PsUpdateKind::kGradient, &key, &slot, 1, push.data()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  auto client = connect_client(options);
  const uint64_t key = 42;
  std::vector<float> row(static_cast<std::size_t>(layout.stride()));
  ASSERT_TRUE(client->pull(&key, nullptr, 1, row.data(), nullptr).ok());
  EXPECT_EQ(row[RowLayout::kShow], static_cast<float>(kThreads * kPushes));
  // The same request again (a client's retry keeps its id): applied once.
  const int32_t slot = 0;
  std::vector<float> push(static_cast<std::size_t>(layout.push_dim()), 0.0f);
  push[0] = 1.0f;
  std::vector<uint8_t> payload;
  encode_ps_push_request(PsUpdateKind::kGradient, &key, &slot, 1, push.data(),
                         static_cast<uint32_t>(push.size()), &payload);
  Connection raw = raw_connection(server->port());
  ASSERT_TRUE(raw_call(raw, Op::kPsPush, payload, /*request_id=*/77).ok());
  ASSERT_TRUE(raw_call(raw, Op::kPsPush, payload, /*request_id=*/77).ok());
  ASSERT_TRUE(client->pull(&key, nullptr, 1, row.data(), nullptr).ok());
  EXPECT_EQ(row[RowLayout::kShow], static_cast<float>(kThreads * kPushes + 1));
}

TEST(PsOps, DenseTablesReadAddAndKeepTheirBounds) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  // Without the token: refused like every other op.
  Connection raw = raw_connection(server->port());
  std::vector<uint8_t> payload;
  encode_dense_request(DenseAction::kRead, "dense", nullptr, 0, &payload);
  EXPECT_EQ(raw_call(raw, Op::kDense, payload).code(), Status::Code::kPermissionDenied);

  RemoteHostTierOptions options = client_options(server->endpoint());
  options.auth_token = kTestToken;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &values).ok());  // created
  std::vector<float> other = {9.0f, 9.0f, 9.0f};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &other).ok());  // read, not replaced
  EXPECT_EQ(other, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  std::vector<float> delta = {0.5f, -1.0f, 0.0f};
  ASSERT_TRUE(client->dense(DenseAction::kAdd, "dense", &delta).ok());
  EXPECT_EQ(delta, (std::vector<float>{1.5f, 1.0f, 3.0f}));
  std::vector<float> wrong_size = {1.0f};
  EXPECT_EQ(client->dense(DenseAction::kAdd, "dense", &wrong_size).code(),
            Status::Code::kInvalidArgument);
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
  EXPECT_EQ(client->dense(DenseAction::kAdd, "dense", &nan).code(), Status::Code::kInvalidArgument);
  std::vector<float> unknown = {1.0f};
  EXPECT_EQ(client->dense(DenseAction::kAdd, "never_read", &unknown).code(),
            Status::Code::kNotFound);
  // A write replaces the table whatever its size (a job's start over a previous job's table),
  // and creates a missing one; a non-finite write changes nothing.
  std::vector<float> written = {4.0f, 5.0f};
  ASSERT_TRUE(client->dense(DenseAction::kWrite, "dense", &written).ok());
  EXPECT_EQ(written, (std::vector<float>{4.0f, 5.0f}));
  std::vector<float> read_back = {0.0f, 0.0f};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read_back).ok());
  EXPECT_EQ(read_back, written);
  std::vector<float> nan_write = {std::numeric_limits<float>::infinity()};
  EXPECT_EQ(client->dense(DenseAction::kWrite, "dense", &nan_write).code(),
            Status::Code::kInvalidArgument);
  read_back = {0.0f, 0.0f};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read_back).ok());
  EXPECT_EQ(read_back, written);
  std::vector<float> fresh = {7.0f};
  ASSERT_TRUE(client->dense(DenseAction::kWrite, "written_first", &fresh).ok());
  std::vector<float> one = {1.0f};
  ASSERT_TRUE(client->dense(DenseAction::kAdd, "written_first", &one).ok());
  EXPECT_EQ(one, (std::vector<float>{8.0f}));
  // At most kMaxDenseTables tables ("dense" and "written_first" are two), written ones too.
  for (std::size_t i = 2; i < kMaxDenseTables; ++i) {
    std::vector<float> v = {0.0f};
    ASSERT_TRUE(client->dense(DenseAction::kRead, "t" + std::to_string(i), &v).ok()) << i;
  }
  std::vector<float> v = {0.0f};
  EXPECT_EQ(client->dense(DenseAction::kRead, "one_too_many", &v).code(),
            Status::Code::kResourceExhausted);
  EXPECT_EQ(client->dense(DenseAction::kWrite, "one_too_many", &v).code(),
            Status::Code::kResourceExhausted);
}

}  // namespace
}  // namespace gpubox::table::server
