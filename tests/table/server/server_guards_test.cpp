// The pieces gpubox_server's hardening is built from, alone: where model paths may lead, the
// generation of a save, the client's book of server identities, the log throttle and the
// connection cap's default.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "table/server/connection_limits.hpp"
#include "table/server/model_path.hpp"
#include "table/server/server_identity.hpp"

namespace gpubox::table::server {
namespace {

namespace fs = std::filesystem;

class ModelPath : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gpubox_model_path_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "data" / "sub");
    fs::create_directories(root_ / "outside");
    fs::create_symlink(root_ / "outside", root_ / "data" / "out");
    fs::create_symlink(root_ / "data" / "sub", root_ / "data" / "in");
    fs::create_symlink(root_ / "outside" / "x", root_ / "data" / "staged.tmp");
    data_ = (root_ / "data").string();
  }
  void TearDown() override { fs::remove_all(root_); }
  StatusOr<std::string> resolve(const std::string& path, const std::string& sub = "") {
    return model_path_in_data_dir(data_, path, sub);
  }
  fs::path root_;
  std::string data_;
};

TEST_F(ModelPath, PathsBecomeRelativeToDataDir) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model/day1", "model/day1"},
      {"./model//day1/", "model/day1"},
      {(root_ / "data" / "abs").string(), "abs"},  // absolute, inside
      {(root_ / "data" / "abs" / "").string(), "abs"},
      // Lexical only: whether "in" or "out" are links is checked at every use, beneath the
      // data_dir descriptor (RootedEnv), where any link is refused.
      {"in/m", "in/m"},
      {"out/m", "out/m"},
  };
  for (const auto& [path, expect] : cases) {
    auto p = resolve(path);
    ASSERT_TRUE(p.ok()) << path << ": " << p.status().to_string();
    EXPECT_EQ(*p, expect) << path;
  }
  auto p = resolve("model", "server-1");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "model/server-1");
  p = model_path_in_data_dir(data_ + "/", (root_ / "data" / "m").string(), "");
  ASSERT_TRUE(p.ok()) << p.status().to_string();  // a trailing slash on data_dir
  EXPECT_EQ(*p, "m");
  // data_dir spelled through a link: an absolute path under either spelling is inside.
  fs::create_symlink(root_ / "data", root_ / "alias");
  p = model_path_in_data_dir((root_ / "alias").string(), (root_ / "data" / "m").string(), "");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(*p, "m");
}

TEST_F(ModelPath, PathsThatLeaveDataDirAreRefused) {
  for (const char* path : {"../outside/m", "a/../../outside", "..", "/etc/passwd", "/"}) {
    auto p = resolve(path);
    EXPECT_FALSE(p.ok()) << path << " -> " << (p.ok() ? *p : "");
  }
  EXPECT_EQ(resolve("../x").status().code(), Status::Code::kInvalidArgument);
  auto out = resolve((root_ / "outside" / "m").string());
  EXPECT_EQ(out.status().code(), Status::Code::kPermissionDenied);
  EXPECT_NE(out.status().message().find("outside the server's data_dir"), std::string::npos)
      << out.status().to_string();
  EXPECT_FALSE(resolve("").ok());
  EXPECT_FALSE(resolve(std::string("a\0b", 3)).ok());
}

TEST_F(ModelPath, DataDirItselfIsNamedAsSuch) {
  for (const std::string& path : {std::string("."), std::string("./"), data_, data_ + "/."}) {
    auto p = resolve(path);
    ASSERT_FALSE(p.ok()) << path;
    EXPECT_EQ(p.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(p.status().message().find("names the server's --data_dir itself"), std::string::npos)
        << p.status().to_string();
  }
}

TEST_F(ModelPath, GenerationFollowsContent) {
  const fs::path a = root_ / "data" / "a";
  fs::create_directories(a);
  std::ofstream(a / "MANIFEST") << "kind sparse\nfile part-0 10 100 abc\n";
  std::ofstream(a / "part-0") << "rows";
  const uint64_t g1 = model_generation(a.string());
  EXPECT_NE(g1, 0u);
  std::ofstream(a / "part-0") << "other rows: the MANIFEST (with its checksums) names the save";
  EXPECT_EQ(model_generation(a.string()), g1);
  std::ofstream(a / "MANIFEST") << "kind sparse\nfile part-0 10 100 abd\n";
  EXPECT_NE(model_generation(a.string()), g1);
  // No MANIFEST: every file counts, names included.
  const fs::path b = root_ / "data" / "b";
  fs::create_directories(b);
  std::ofstream(b / "rows.bin") << "x";
  const uint64_t g2 = model_generation(b.string());
  std::ofstream(b / "rows.bin") << "y";
  EXPECT_NE(model_generation(b.string()), g2);
  EXPECT_EQ(model_generation((root_ / "missing").string()), 1u);
}

ServerIdentity id(uint64_t instance, uint64_t generation = 0) { return {instance, generation}; }

TEST(ServerIdentityBook, LearnsThenChecksEveryReconnect) {
  ServerIdentityBook book({"127.0.0.1:1", "127.0.0.1:2"});
  ASSERT_TRUE(book.observe(0, id(10)).ok());
  ASSERT_TRUE(book.observe(1, id(20)).ok());
  EXPECT_TRUE(book.observe(0, id(10)).ok());
  EXPECT_TRUE(book.observe(0, id(10, 7)).ok());  // a LOAD by someone: same instance
  EXPECT_EQ(book.identity(0).generation, 7u);
  // Restarted with nothing written by this client: nothing lost (state as first seen).
  book.mutation_begins(1);
  book.mutation_ends(1);
  Status st = book.observe(1, id(21));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kAborted);
  EXPECT_NE(st.message().find("server 127.0.0.1:2 restarted"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("now empty"), std::string::npos);
  EXPECT_FALSE(book.observe(1, id(21)).ok());  // sticky
  auto pending = book.pending_restarts();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].endpoint, 1u);
  EXPECT_EQ(pending[0].before.instance_id, 20u);
  EXPECT_EQ(pending[0].after.instance_id, 21u);
  book.accept_restarts();
  EXPECT_TRUE(book.pending_restarts().empty());
  EXPECT_TRUE(book.observe(1, id(21)).ok());
  EXPECT_EQ(book.identity(1).instance_id, 21u);
}

TEST(ServerIdentityBook, RestartFromTheSyncedStateLosesNothing) {
  ServerIdentityBook book({"s:1"});
  ASSERT_TRUE(book.observe(0, id(1)).ok());
  EXPECT_TRUE(book.observe(0, id(2)).ok());  // never written: nothing to lose
  book.mutation_begins(0);
  book.mutation_ends(0);
  uint64_t token = book.sync_token(0);
  book.synced(0, token, 55);                      // a SAVE of generation 55
  EXPECT_TRUE(book.observe(0, id(3, 55)).ok());   // restarted with --load of that save
  EXPECT_FALSE(book.observe(0, id(4, 56)).ok());  // another save: not what this client had
  book.accept_restarts();
  // A mutation in flight while saving: the save cannot vouch for the state.
  book.mutation_begins(0);
  token = book.sync_token(0);
  book.mutation_ends(0);
  book.synced(0, token, 60);
  EXPECT_FALSE(book.observe(0, id(5, 60)).ok());
  book.accept_restarts();
  // A mutation after the save: lost by a restart from it.
  token = book.sync_token(0);
  book.synced(0, token, 70);
  book.mutation_begins(0);
  book.mutation_ends(0);
  Status st = book.observe(0, id(6, 70));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("now holding the save of generation"), std::string::npos)
      << st.message();
}

TEST(LogThrottle, OneLinePerIntervalAndCountsTheRest) {
  LogThrottle throttle(std::chrono::seconds(1));
  const auto t = LogThrottle::Clock::now();
  uint64_t held = 99;
  ASSERT_TRUE(throttle.allow(t, &held));
  EXPECT_EQ(held, 0u);
  for (int i = 0; i < 1000; ++i)
    EXPECT_FALSE(throttle.allow(t + std::chrono::milliseconds(i / 2), &held));
  ASSERT_TRUE(throttle.allow(t + std::chrono::seconds(1), &held));
  EXPECT_EQ(held, 1000u);
  EXPECT_FALSE(throttle.allow(t + std::chrono::milliseconds(1500), &held));
}

TEST(ConnectionLimits, DefaultCapLeavesDescriptorsFree) {
  EXPECT_EQ(default_max_connections(1024), 960u);
  EXPECT_EQ(default_max_connections(1u << 20), 1024u);
  EXPECT_EQ(default_max_connections(256), 192u);
  EXPECT_EQ(default_max_connections(64), 32u);
  EXPECT_EQ(default_max_connections(1), 1u);
  const OpenFilesLimit now = open_files_limit();
  EXPECT_GT(now.soft, 0u);
  EXPECT_LE(now.soft, now.hard);
}

// A socket option's int value (-1 when getsockopt fails).
int socket_option(int fd, int level, int name) {
  int value = -1;
  socklen_t len = sizeof(value);
  return ::getsockopt(fd, level, name, &value, &len) == 0 ? value : -1;
}

// enable_tcp_keepalive on the accepted end of a loopback TCP connection (what the server's
// accept loop calls it on): off before, then on with the given times and with the defaults (a
// half-open peer found after 60 + 10 * 6 s, under --idle_timeout_s); a socket that is not TCP
// refuses it, naming the option.
TEST(ConnectionLimits, TcpKeepaliveIsSetOnAnAcceptedLoopbackSocket) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  EXPECT_EQ(socket_option(accepted, SOL_SOCKET, SO_KEEPALIVE), 0);
  for (const TcpKeepalive& times : {TcpKeepalive{7, 3, 4}, TcpKeepalive{}}) {
    const Status st = enable_tcp_keepalive(accepted, times);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(socket_option(accepted, SOL_SOCKET, SO_KEEPALIVE), 1);
    EXPECT_EQ(socket_option(accepted, IPPROTO_TCP, TCP_KEEPIDLE), times.idle_s);
    EXPECT_EQ(socket_option(accepted, IPPROTO_TCP, TCP_KEEPINTVL), times.interval_s);
    EXPECT_EQ(socket_option(accepted, IPPROTO_TCP, TCP_KEEPCNT), times.probes);
  }
  const TcpKeepalive defaults;
  EXPECT_LT(defaults.idle_s + defaults.interval_s * defaults.probes, 300);
  for (const int fd : {accepted, client, listener}) ::close(fd);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const Status unix_socket = enable_tcp_keepalive(pair[0]);
  EXPECT_FALSE(unix_socket.ok());
  EXPECT_NE(unix_socket.message().find("TCP_KEEPIDLE"), std::string::npos)
      << unix_socket.to_string();
  for (const int fd : pair) ::close(fd);
}

}  // namespace
}  // namespace gpubox::table::server
