// PeerHeartbeat (heterps/comm/peer_heartbeat.hpp) over loopback, trainers as threads of one
// process meeting through a file store: a peer that ends without its goodbye is reported at once
// naming its id, pid and address; a peer that stays connected but silent is reported after the
// timeout (not before); a goodbye is never reported; a peer that never joins is named.
#include "heterps/comm/peer_heartbeat.hpp"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "heterps/comm/rendezvous_store.hpp"

namespace gpubox::comm {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

struct StoreDir {
  StoreDir() {
    static std::atomic<int> next{0};
    path = std::filesystem::temp_directory_path() /
           ("gpubox_heartbeat_test_" + std::to_string(::getpid()) + "_" + std::to_string(next++));
    std::filesystem::remove_all(path);
  }
  ~StoreDir() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

// What one trainer's heartbeat reported, and when.
struct Losses {
  void add(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    reasons.push_back(reason);
    at = Clock::now();
    cv.notify_all();
  }
  // The first reason within `limit`, or "".
  std::string wait(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, limit, [&] { return !reasons.empty(); });
    return reasons.empty() ? std::string() : reasons.front();
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return reasons.size();
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> reasons;
  Clock::time_point at;
};

HeartbeatOptions options(std::chrono::milliseconds timeout) {
  HeartbeatOptions o;
  o.timeout = timeout;
  o.join_timeout = std::chrono::seconds(20);
  return o;
}

// `n` trainers' heartbeats, joined concurrently (each constructor waits for the others).
std::vector<std::unique_ptr<PeerHeartbeat>> join_all(RendezvousStore& store, int n,
                                                     std::chrono::milliseconds timeout,
                                                     std::vector<Losses>& losses) {
  std::vector<std::unique_ptr<PeerHeartbeat>> beats(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      beats[t] = std::make_unique<PeerHeartbeat>(
          store, t, n, "127.0.0.1", options(timeout),
          [&losses, t](const std::string& reason) { losses[t].add(reason); });
    });
  }
  for (auto& thread : threads) thread.join();
  return beats;
}

TEST(PeerHeartbeat, AnExitWithoutGoodbyeIsReportedAtOnceNamingThePeer) {
  StoreDir dir;
  auto store = open_rendezvous_store("file://" + dir.path.string());
  std::vector<Losses> losses(3);
  auto beats = join_all(*store, 3, std::chrono::seconds(30), losses);
  EXPECT_THAT(beats[0]->describe(2),
              HasSubstr("trainer 2 (pid " + std::to_string(::getpid()) + " on "));
  const auto stopped = Clock::now();
  beats[2]->stop(false);  // as a process that died: its connections end, no goodbye
  for (int t : {0, 1}) {
    const std::string reason = losses[t].wait(std::chrono::seconds(10));
    EXPECT_THAT(reason, HasSubstr("lost trainer 2 (pid "));
    EXPECT_THAT(reason, HasSubstr("at 127.0.0.1)"));
    // Closed (FIN) or reset (RST), as the kernel ends the dead peer's socket.
    EXPECT_THAT(reason, HasSubstr("before it finished: its process exited or was killed"));
    // Far below the 30 s silence timeout: the closed connection says it.
    EXPECT_LT(losses[t].at - stopped, std::chrono::seconds(5)) << reason;
  }
  EXPECT_EQ(losses[2].count(), 0u);
}

TEST(PeerHeartbeat, AGoodbyeIsNeverALoss) {
  StoreDir dir;
  auto store = open_rendezvous_store("file://" + dir.path.string());
  std::vector<Losses> losses(2);
  auto beats = join_all(*store, 2, std::chrono::milliseconds(500), losses);
  // Beating: nothing is lost over several timeouts.
  EXPECT_EQ(losses[0].wait(std::chrono::milliseconds(1500)), "");
  beats[1]->stop(true);
  beats[1].reset();
  EXPECT_EQ(losses[0].wait(std::chrono::milliseconds(1500)), "");
  EXPECT_EQ(losses[1].count(), 0u);
}

// A peer that joined and then says nothing (its link is down, its machine stopped): a raw
// socket playing trainer 1.
TEST(PeerHeartbeat, ASilentPeerIsReportedAfterTheTimeoutNotBefore) {
  StoreDir dir;
  auto store = open_rendezvous_store("file://" + dir.path.string());
  const std::string fake = "127.0.0.1 1 4242 machine-b";
  store->set("heartbeat/1", std::vector<char>(fake.begin(), fake.end()));
  int silent = -1;
  std::thread peer([&] {
    const std::vector<char> raw = store->get("heartbeat/0", std::chrono::seconds(20));
    std::istringstream in(std::string(raw.begin(), raw.end()));
    std::string host;
    int port = 0;
    in >> host >> port;
    silent = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const char hello[8] = {'G', 'B', 'H', 'B', 0, 0, 0, 1};
    ASSERT_EQ(::send(silent, hello, sizeof(hello), 0), 8);
  });
  Losses losses;
  const auto timeout = std::chrono::milliseconds(800);
  // The silence counts from the mesh (join(), inside the constructor) or a later hello, never
  // from before the constructor: the loss is at least `timeout` after `before`, exactly, however
  // late this thread runs again.
  const auto before = Clock::now();
  PeerHeartbeat beat(*store, 0, 2, "127.0.0.1", options(timeout),
                     [&](const std::string& reason) { losses.add(reason); });
  peer.join();
  const auto joined = Clock::now();
  const std::string reason = losses.wait(std::chrono::seconds(10));
  EXPECT_THAT(reason, HasSubstr("lost trainer 1 (pid 4242 on machine-b, at 127.0.0.1)"));
  EXPECT_THAT(reason, HasSubstr("no heartbeat for "));
  EXPECT_THAT(reason, HasSubstr("the network between trainer 0 (at 127.0.0.1) and it is down"));
  EXPECT_GE(losses.at - before, timeout) << reason;
  EXPECT_LT(losses.at - joined, timeout + std::chrono::seconds(3)) << reason;
  beat.stop(false);
  ::close(silent);
  EXPECT_EQ(losses.count(), 1u);  // reported once
}

TEST(PeerHeartbeat, APeerThatNeverJoinsIsNamed) {
  StoreDir dir;
  auto store = open_rendezvous_store("file://" + dir.path.string());
  HeartbeatOptions o = options(std::chrono::seconds(1));
  o.join_timeout = std::chrono::milliseconds(300);
  try {
    PeerHeartbeat beat(*store, 0, 2, "127.0.0.1", o, nullptr);
    FAIL() << "joined without trainer 1";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("heartbeat/1"));
    EXPECT_THAT(e.what(), HasSubstr("never set"));
  }
}

}  // namespace
}  // namespace gpubox::comm
