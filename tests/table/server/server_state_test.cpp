// gpubox_server under abuse, in-process on loopback (issue #12, items 4-6 and 8): what it keeps
// and where it writes: the retry cache's key and bounds, paths that try to leave data_dir, the
// token that SHUTDOWN, SAVE and LOAD need, the loopback-only bind without one, non-finite rows
// refused whole, and servers that restart under a client.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

#include "table/server/model_path.hpp"
#include "table/server/request_window.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers
namespace fs = std::filesystem;

std::vector<uint8_t> push_payload(const std::vector<uint64_t>& keys, const std::vector<float>& rows,
                                  uint32_t stride) {
  std::vector<uint8_t> p;
  encode_push_request(keys.data(), keys.size(), rows.data(), stride, &p);
  return p;
}

// ---- 4. the retry cache ----------------------------------------------------------------------

TEST(Hardening, RetryCacheKeysOnOpAndPayload) {
  FakeHostTier table(test_config());
  TempDir dir("dedup");
  ServerOptions so;
  so.data_dir = dir.path().string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  Connection conn = raw_connection(server->port());
  const std::vector<uint64_t> keys{11, 12};
  const std::vector<float> rows(2 * stride, 0.25f);
  ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, rows, stride), 9, 5).ok());
  // A SAVE that reuses the PUSH's ids is another request: it is applied.
  std::vector<uint8_t> save;
  encode_save_request(SaveKind::kBase, "m", &save);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(raw_call(conn, Op::kSave, save, 9, 5, &reply).ok());
  EXPECT_TRUE(fs::exists(dir.path() / "m" / "fake-rows.bin"));
  auto generation = decode_u64_reply(reply.data(), reply.size());
  ASSERT_TRUE(generation.ok());
  EXPECT_EQ(*generation, model_generation((dir.path() / "m").string()));
  // So is a PUSH of other rows under the same ids.
  const std::vector<float> other(2 * stride, 0.75f);
  ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, other, stride), 9, 5).ok());
  EXPECT_EQ(table.push_calls.load(), 2u);
  // The very same PUSH again is a retry: answered from the cache, not applied.
  ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, other, stride), 9, 5).ok());
  EXPECT_EQ(table.push_calls.load(), 2u);
  EXPECT_EQ(server->counters().duplicate_requests, 1u);
}

TEST(Hardening, RetryCacheKeepsOnlySuccessesWithinItsBytes) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dedup_max_bytes = 100 * RequestWindow::kEntryOverheadBytes;
  so.dedup_max_client_bytes = so.dedup_max_bytes;  // one client may fill it (here: the bound)
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  Connection conn = raw_connection(server->port());
  // 2000 refused requests (wrong stride) are not remembered.
  const std::vector<uint64_t> keys{1};
  const std::vector<float> bad_rows(stride + 1, 1.0f);
  for (uint64_t id = 1; id <= 2000; ++id) {
    Status st = raw_call(conn, Op::kPush, push_payload(keys, bad_rows, stride + 1), id, 3);
    ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
  }
  EXPECT_EQ(server->counters().dedup_entries, 0u);
  // 1000 successful ones are remembered up to the byte bound.
  const std::vector<float> rows(stride, 1.0f);
  for (uint64_t id = 1; id <= 1000; ++id) {
    ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, rows, stride), 5000 + id, 3).ok());
  }
  const auto c = server->counters();
  EXPECT_LE(c.dedup_bytes, so.dedup_max_bytes);
  EXPECT_GE(c.dedup_entries, 50u);
  EXPECT_LE(c.dedup_entries, 100u);
}

// ---- 5. paths, token, bind -------------------------------------------------------------------

TEST(Hardening, SaveAndLoadPathsStayInsideDataDir) {
  FakeHostTier table(test_config());
  TempDir dir("paths");
  const fs::path data = dir.path() / "data";
  const fs::path outside = dir.path() / "outside";
  fs::create_directories(data);
  fs::create_directories(outside / "victim.tmp");  // a save would delete a stale <path>.tmp
  fs::create_symlink(outside, data / "link");
  ServerOptions so;
  so.data_dir = data.string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  for (const std::string& path :
       {(outside / "victim").string(), std::string("../outside/victim"), std::string("link/victim"),
        std::string("sub/../../x"), std::string("/etc/gpubox")}) {
    Status st = client->save(path, SaveKind::kBase);
    EXPECT_FALSE(st.ok()) << path;
    EXPECT_TRUE(st.code() == Status::Code::kPermissionDenied ||
                st.code() == Status::Code::kInvalidArgument)
        << st.to_string();
    EXPECT_FALSE(client->load(path).ok()) << path;
  }
  EXPECT_TRUE(fs::exists(outside / "victim.tmp"));
  EXPECT_FALSE(fs::exists(outside / "victim"));
  // Inside: relative, and absolute within data_dir.
  ASSERT_TRUE(client->save("day1", SaveKind::kBase).ok());
  EXPECT_TRUE(fs::exists(data / "day1" / "fake-rows.bin"));
  Status st = client->save((data / "day2").string(), SaveKind::kBase);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(client->load("day1").ok());
}

TEST(Hardening, WithATokenShutdownSaveAndLoadNeedIt) {
  FakeHostTier table(test_config());
  TempDir dir("token");
  ServerOptions so;
  so.auth_token = kTestToken;
  so.data_dir = dir.path().string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  std::vector<uint8_t> save;
  encode_save_request(SaveKind::kBase, "m", &save);
  std::vector<uint8_t> load;
  encode_path_request("m", &load);
  for (auto [op, payload] : {std::pair{Op::kShutdown, std::vector<uint8_t>{}},
                             std::pair{Op::kSave, save}, std::pair{Op::kLoad, load}}) {
    Connection conn = raw_connection(server->port());
    Status st = raw_call(conn, op, payload);
    EXPECT_EQ(st.code(), Status::Code::kPermissionDenied) << op_name(op) << ": " << st.to_string();
  }
  EXPECT_FALSE(server->stopped());
  EXPECT_FALSE(fs::exists(dir.path() / "m"));
  auto options = client_options(server->endpoint());
  options.auth_token = kTestToken;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  EXPECT_TRUE(client->save("m", SaveKind::kBase).ok());
  EXPECT_TRUE(client->shutdown_servers().ok());
  server->wait();
}

TEST(Hardening, WithoutATokenOnlyLoopbackMayBeBound) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.bind_address = "0.0.0.0";
  auto refused = Server::start(&table, so);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("loopback"), std::string::npos)
      << refused.status().to_string();
  so.auth_token = kTestToken;
  auto with_token = Server::start(&table, so);
  EXPECT_TRUE(with_token.ok()) << with_token.status().to_string();
  so.auth_token.clear();
  so.bind_address = "::1";
  auto v6 = Server::start(&table, so);  // loopback (where the machine has IPv6)
  if (!v6.ok()) {
    EXPECT_EQ(v6.status().code(), Status::Code::kUnavailable) << v6.status().to_string();
  }
}

// ---- 6. non-finite rows ----------------------------------------------------------------------

TEST(Hardening, NonFiniteRowsAreRefusedAndNothingOfTheRequestIsApplied) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  const uint32_t stride = static_cast<uint32_t>(client->layout().stride());
  std::vector<uint64_t> keys(200);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 100 + i;
  std::vector<float> rows(keys.size() * stride, 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  const uint64_t pushes = table.push_calls.load();
  Connection raw = raw_connection(server->port());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> next(keys.size() * stride, 1.5f);
    next[102 * stride + 4] = bad;  // key 202, field 4
    // The server refuses the whole request (one frame of 200 rows)...
    Status st = raw_call(raw, Op::kPush, push_payload(keys, next, stride));
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("key 202"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("none of this request's 200 rows"), std::string::npos)
        << st.to_string();
    // ...and the client refuses the whole call (several frames) before sending any.
    st = client->push(keys.data(), keys.size(), next.data());
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("key 202"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(table.push_calls.load(), pushes);
  std::vector<float> held;
  for (uint64_t k : keys) {
    ASSERT_TRUE(table.row(k, &held));
    EXPECT_EQ(held, std::vector<float>(stride, 0.5f)) << k;
  }
}

// ---- 8. restarts ------------------------------------------------------------------------------

// A client that pushed rows, and a server restarted on the same port with `table` (loaded from
// `loaded` when not empty).
struct RestartScene {
  FakeHostTier first{test_config()};
  FakeHostTier second{test_config()};
  std::unique_ptr<Server> server;
  std::unique_ptr<RemoteHostTier> client;
  ServerOptions options;
  std::vector<uint64_t> keys{5, 6, 7, 8};

  explicit RestartScene(const fs::path& data) {
    options.data_dir = data.string();
    options.port = gpubox::testing::port_below_ephemeral_range();  // restart() reuses it
    server = start_server(&first, options);
    client = connect_client(client_options(server->endpoint()));
  }
  Status push(float value) {
    std::vector<float> rows(keys.size() * client->layout().stride(), value);
    return client->push(keys.data(), keys.size(), rows.data());
  }
  Status pull() {
    std::vector<float> rows(keys.size() * client->layout().stride());
    return client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  }
  void restart(const std::string& load_from) {
    server.reset();
    options.loaded_model.clear();
    if (!load_from.empty()) {
      auto path = load_before_start(&second, options, load_from);
      ASSERT_TRUE(path.ok()) << path.status().to_string();
      options.loaded_model = *path;
    }
    server = start_server(&second, options);
    ASSERT_TRUE(server);
  }
};

TEST(Hardening, ServerRestartedEmptyIsAnErrorNamingTheEndpoint) {
  TempDir dir("restart_empty");
  RestartScene scene(dir.path());
  ASSERT_TRUE(scene.client);
  ASSERT_TRUE(scene.push(0.5f).ok());
  const uint64_t old_instance = scene.server->instance_id();
  EXPECT_EQ(scene.client->server_identity(0).instance_id, old_instance);
  scene.restart("");
  const std::string endpoint = scene.server->endpoint();
  for (int attempt = 0; attempt < 2; ++attempt) {  // every call fails until accepted
    Status st = scene.pull();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Status::Code::kAborted) << st.to_string();
    EXPECT_NE(st.message().find("server " + endpoint + " restarted"), std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find("now empty"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(scene.second.size(), 0u);  // nothing was recreated silently
  auto pending = scene.client->pending_restarts();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].where, endpoint);
  EXPECT_EQ(pending[0].before.instance_id, old_instance);
  EXPECT_EQ(pending[0].after.instance_id, scene.server->instance_id());
  EXPECT_EQ(pending[0].after.generation, 0u);
  // The trainer decides: accepted, calls proceed.
  scene.client->accept_restarts();
  EXPECT_TRUE(scene.client->pending_restarts().empty());
  EXPECT_TRUE(scene.pull().ok());
}

TEST(Hardening, ServerRestartedFromTheLastSaveIsErrorOnlyWhenRowsWereLost) {
  TempDir dir("restart_save");
  {  // saved, nothing pushed since, restarted from that save: nothing lost, carries on
    RestartScene scene(dir.path());
    ASSERT_TRUE(scene.client);
    ASSERT_TRUE(scene.push(0.5f).ok());
    ASSERT_TRUE(scene.client->save("ckpt", SaveKind::kCheckpoint).ok());
    scene.restart("ckpt");
    Status st = scene.pull();
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(scene.client->pending_restarts().empty());
  }
  {  // pushed after the save: those rows are gone
    RestartScene scene(dir.path());
    ASSERT_TRUE(scene.client);
    ASSERT_TRUE(scene.client->save("ckpt2", SaveKind::kCheckpoint).ok());
    ASSERT_TRUE(scene.push(0.75f).ok());
    scene.restart("ckpt2");
    Status st = scene.pull();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("now holding the save of generation"), std::string::npos)
        << st.to_string();
  }
  {  // restarted from another save than the client's last one
    RestartScene scene(dir.path());
    ASSERT_TRUE(scene.client);
    ASSERT_TRUE(scene.push(0.25f).ok());
    ASSERT_TRUE(scene.client->save("old", SaveKind::kCheckpoint).ok());
    ASSERT_TRUE(scene.push(0.5f).ok());
    ASSERT_TRUE(scene.client->save("new", SaveKind::kCheckpoint).ok());
    scene.restart("old");
    EXPECT_EQ(scene.pull().code(), Status::Code::kAborted);
  }
}

}  // namespace
}  // namespace gpubox::table::server
