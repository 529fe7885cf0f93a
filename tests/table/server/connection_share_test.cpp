// The connection cap's fair share (connection_share.hpp) on snapshots: who gives a slot to a new
// connection, against hand-built cases and, on seeded random snapshots, against a brute-force
// oracle of what may give one.
#include "table/server/connection_share.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace gpubox::table::server {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

const Clock::time_point kNow = Clock::time_point(std::chrono::hours(1000));
constexpr Clock::duration kLongIdle = seconds(75);

HeldConnection conn(const char* address, uint64_t client, double idle_s, bool bound = true) {
  HeldConnection c;
  c.address = address;
  c.bound = bound;
  c.client_id = client;
  c.idle = idle_s >= 0;
  c.idle_since = kNow - std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(idle_s >= 0 ? idle_s : 0));
  return c;
}
const double kInCall = -1;

ShareVictim pick(const std::vector<HeldConnection>& held, const char* address, uint64_t client,
                 bool bound = true) {
  return fair_share_victim(held, Newcomer{address, bound, client}, kNow, kLongIdle);
}

TEST(ConnectionShare, ManyIdsOfTwoEachGiveTheirIdlestToANewClient) {
  std::vector<HeldConnection> held;
  for (uint64_t id = 100; id < 104; ++id) {
    held.push_back(conn("127.0.0.1", id, 1.0 + static_cast<double>(id % 3)));
    held.push_back(conn("127.0.0.1", id, 0.5));
  }
  const ShareVictim at_accept = pick(held, "127.0.0.1", 0, /*bound=*/false);
  ASSERT_TRUE(at_accept.found());
  const ShareVictim victim = pick(held, "127.0.0.1", 7);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(held[victim.index].client_id, 101u);  // ties: the connection idle longest (3 s)
  EXPECT_NE(victim.why.find("client 101 holds 2 connections against 0 of client 7"),
            std::string::npos)
      << victim.why;
  // A client holding one already gets nothing from holders of two idle briefly (no ping-pong)...
  held.push_back(conn("127.0.0.1", 7, 0.1));
  EXPECT_FALSE(pick(held, "127.0.0.1", 7).found());
  // ... but does from one whose connection has been idle long.
  held[0].idle_since = kNow - kLongIdle;
  const ShareVictim idle = pick(held, "127.0.0.1", 7);
  ASSERT_TRUE(idle.found());
  EXPECT_EQ(idle.index, 0u);
}

TEST(ConnectionShare, AConnectionInACallIsNeverTaken) {
  std::vector<HeldConnection> held;
  for (int i = 0; i < 5; ++i) held.push_back(conn("127.0.0.1", 100, kInCall));
  EXPECT_FALSE(pick(held, "127.0.0.1", 7).found());
  held.push_back(conn("127.0.0.1", 100, 0.01));
  const ShareVictim victim = pick(held, "127.0.0.1", 7);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(victim.index, 5u);
  // A holder with none idle is passed over for the next.
  held.push_back(conn("127.0.0.1", 200, 0.2));
  held.push_back(conn("127.0.0.1", 200, 0.3));
  held.push_back(conn("127.0.0.1", 200, 0.4));
  held[5].idle = false;
  EXPECT_EQ(pick(held, "127.0.0.1", 7).index, 8u);
}

TEST(ConnectionShare, AnAddressHoldingMoreGivesFirstWhateverItsIdsHold) {
  std::vector<HeldConnection> held;
  for (uint64_t id = 100; id < 108; ++id) held.push_back(conn("127.0.0.2", id, 0.1 * id));
  held.push_back(conn("127.0.0.1", 1, 50));  // a trainer's, idle longer
  const ShareVictim victim = pick(held, "127.0.0.3", 9);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(held[victim.index].address, "127.0.0.2");
  EXPECT_EQ(held[victim.index].client_id, 107u);  // all hold one there: the idlest
  EXPECT_NE(victim.why.find("address 127.0.0.2 holds 8 connections against 0 of 127.0.0.3"),
            std::string::npos)
      << victim.why;
  // From the spreading address itself, ids of one each give nothing to a newcomer of theirs.
  EXPECT_FALSE(pick(held, "127.0.0.2", 9).found());
}

TEST(ConnectionShare, UnboundConnectionsOfAnAddressAreOneHolder) {
  std::vector<HeldConnection> held;
  for (int i = 0; i < 3; ++i) held.push_back(conn("127.0.0.1", 0, 0.1 * i, /*bound=*/false));
  const ShareVictim victim = pick(held, "127.0.0.1", 5);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(victim.index, 2u);
  EXPECT_NE(victim.why.find("the unbound connections of 127.0.0.1 holds 3"), std::string::npos)
      << victim.why;
  EXPECT_FALSE(pick({}, "127.0.0.1", 5).found());
}

TEST(ConnectionShare, ANewcomersOwnConnectionsNeverGiveItASlot) {
  std::vector<HeldConnection> held;
  for (int i = 0; i < 6; ++i) held.push_back(conn("127.0.0.1", 5, 1000));
  held.push_back(conn("127.0.0.1", 6, 1000));
  EXPECT_FALSE(pick(held, "127.0.0.1", 5).found());
  EXPECT_TRUE(pick(held, "127.0.0.1", 6).found());  // and its own gives to another
}

// Seeded random snapshots: a victim is found exactly when some idle connection's address or
// holder qualifies (holds two more than the newcomer's side, or one more with its idlest idle
// long), and it is then idle, not the newcomer's, and the idlest of a qualifying side.
TEST(ConnectionShare, RandomSnapshotsAgreeWithABruteForceOracle) {
  std::mt19937_64 rng(20261129);
  const char* addresses[] = {"10.0.0.1", "10.0.0.2", "10.0.0.3"};
  for (int round = 0; round < 2000; ++round) {
    std::vector<HeldConnection> held(rng() % 12);
    for (auto& c : held) {
      c = conn(addresses[rng() % 3], 1 + rng() % 4,
               rng() % 4 == 0 ? kInCall : static_cast<double>(rng() % 150), rng() % 5 != 0);
    }
    const Newcomer newcomer{addresses[rng() % 3], rng() % 3 != 0, 1 + rng() % 4};
    const auto side = [&](const HeldConnection& c, bool by_address) {
      return by_address ? std::string(c.address)
             : c.bound  ? std::to_string(c.client_id)
                        : "u" + std::string(c.address);
    };
    const std::string own_address = newcomer.address.data();
    const std::string own_client = newcomer.bound ? std::to_string(newcomer.client_id) : "-";
    // Per side: count and idlest.
    std::map<std::string, std::pair<std::size_t, Clock::time_point>> tally[2];
    for (const auto& c : held) {
      for (int by = 0; by < 2; ++by) {
        auto& t = tally[by][side(c, by == 1)];
        if (t.first == 0) t.second = Clock::time_point::max();
        ++t.first;
        if (c.idle) t.second = std::min(t.second, c.idle_since);
      }
    }
    const auto qualifies = [&](const HeldConnection& c, bool by_address) {
      const std::string s = side(c, by_address);
      if (s == (by_address ? own_address : own_client)) return false;
      const auto own = tally[by_address ? 1 : 0].find(by_address ? own_address : own_client);
      const std::size_t mine = own == tally[by_address ? 1 : 0].end() ? 0 : own->second.first;
      const auto& t = tally[by_address ? 1 : 0].at(s);
      if (t.second == Clock::time_point::max()) return false;
      return t.first >= mine + 2 || (t.first >= mine + 1 && kNow - t.second >= kLongIdle);
    };
    bool any = false;
    for (const auto& c : held) any = any || (c.idle && (qualifies(c, true) || qualifies(c, false)));
    const ShareVictim victim = fair_share_victim(held, newcomer, kNow, kLongIdle);
    ASSERT_EQ(victim.found(), any) << "round " << round;
    if (!victim.found()) continue;
    const HeldConnection& v = held[victim.index];
    ASSERT_TRUE(v.idle) << "round " << round;
    ASSERT_TRUE(qualifies(v, true) || qualifies(v, false)) << "round " << round;
    if (!qualifies(v, true)) {  // chosen by its client: the idlest of that client
      EXPECT_EQ(v.idle_since, tally[0].at(side(v, false)).second) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace gpubox::table::server
