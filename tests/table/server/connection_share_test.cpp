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

TEST(ConnectionShare, AnAddressHoldingMoreGivesFirstFromItsHolderHoldingTheMost) {
  std::vector<HeldConnection> held;
  for (uint64_t id = 100; id < 104; ++id) {  // 10.0.0.2: four ids of two each, idle briefly
    held.push_back(conn("10.0.0.2", id, 0.1 * static_cast<double>(id)));
    held.push_back(conn("10.0.0.2", id, 0.5));
  }
  for (int i = 0; i < 3; ++i) held.push_back(conn("10.0.0.1", 1, 50));  // a trainer, idle longer
  const ShareVictim victim = pick(held, "10.0.0.3", 9);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(held[victim.index].address, "10.0.0.2");
  EXPECT_EQ(held[victim.index].client_id, 103u);  // all hold two there: the idlest (10.3 s)
  EXPECT_NE(victim.why.find("address 10.0.0.2 holds 8 connections against 0 of 10.0.0.3; of "
                            "them client 103 holds 2 connections against 0 of client 9"),
            std::string::npos)
      << victim.why;
  // Ids of one connection each are indistinguishable from trainers: however many an address
  // holds, they give nothing. A newcomer from a third host (holding none) gets one of the pool of
  // the trainer holding three (by client, it holds the most).
  held.clear();
  for (uint64_t id = 100; id < 108; ++id) held.push_back(conn("10.0.0.2", id, 1000));
  EXPECT_FALSE(pick(held, "10.0.0.3", 9).found());
  for (int i = 0; i < 3; ++i) held.push_back(conn("10.0.0.1", 1, 1));
  const ShareVictim trainer = pick(held, "10.0.0.3", 9);
  ASSERT_TRUE(trainer.found());
  EXPECT_EQ(held[trainer.index].client_id, 1u);
  // But a new id of the host holding eight gets nothing from the trainer's host, which holds
  // fewer: else that host's ids would take its pool one by one, down to its last connection.
  EXPECT_FALSE(pick(held, "10.0.0.2", 9).found());
  EXPECT_FALSE(pick(held, "10.0.0.2", 0, /*bound=*/false).found());
  // Once the trainers' host holds as many as the newcomer's, their pools give again.
  for (int i = 0; i < 6; ++i) held.push_back(conn("10.0.0.1", 2, 0.5));
  const ShareVictim pooled = pick(held, "10.0.0.2", 9);
  ASSERT_TRUE(pooled.found());
  EXPECT_EQ(held[pooled.index].address, "10.0.0.1");
}

TEST(ConnectionShare, AClientsLastConnectionIsNeverTakenHoweverLongIdle) {
  std::vector<HeldConnection> held = {conn("10.0.0.1", 1, 1e6)};
  for (uint64_t id = 2; id < 9; ++id) held.push_back(conn("10.0.0.1", id, 1e6));
  EXPECT_FALSE(pick(held, "10.0.0.2", 50).found());
  EXPECT_FALSE(pick(held, "10.0.0.2", 50, /*bound=*/false).found());
  EXPECT_FALSE(pick(held, "10.0.0.1", 50).found());
  // Two idle long give one to a client holding one; never to one holding two.
  held.push_back(conn("10.0.0.1", 1, 1e6));
  held.push_back(conn("10.0.0.2", 50, 0));
  const ShareVictim victim = pick(held, "10.0.0.2", 50);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(held[victim.index].client_id, 1u);
  held.push_back(conn("10.0.0.2", 50, 0));
  EXPECT_FALSE(pick(held, "10.0.0.2", 50).found());
}

// Any local process picks among 127/8 (and ::1) freely: a fresh one of them counts as the
// trainers' own address, so it takes nothing from trainers there by address.
TEST(ConnectionShare, FreshLoopbackAddressesCountAsTheTrainersOwn) {
  std::vector<HeldConnection> held;
  for (uint64_t id = 1; id < 9; ++id) held.push_back(conn("127.0.0.1", id, 1e6));
  for (const char* fresh : {"127.0.0.9", "127.3.2.1", "::1", "::ffff:127.0.0.7"}) {
    EXPECT_FALSE(pick(held, fresh, 50).found()) << fresh;
    EXPECT_FALSE(pick(held, fresh, 50, /*bound=*/false).found()) << fresh;
  }
  // Pooled connections (two a trainer) give one each, by client, never by address.
  for (uint64_t id = 1; id < 9; ++id) held.push_back(conn("127.0.0.1", id, 1));
  const ShareVictim victim = pick(held, "127.0.0.9", 50);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(victim.why.find("address "), std::string::npos) << victim.why;
}

TEST(ConnectionShare, ShareAddressesGroupWhatOneHostPicksFreely) {
  EXPECT_EQ(share_address("127.0.0.1"), "loopback");
  EXPECT_EQ(share_address("127.255.0.3"), "loopback");
  EXPECT_EQ(share_address("::1"), "loopback");
  EXPECT_EQ(share_address("::ffff:127.0.0.2"), "loopback");
  EXPECT_EQ(share_address("::ffff:10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(share_address("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(share_address("128.0.0.1"), "128.0.0.1");
  EXPECT_EQ(share_address("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
  EXPECT_EQ(share_address("2001:db8:1:2::9"), "2001:db8:1:2::/64");
  EXPECT_EQ(share_address("2001:db8:1:3::9"), "2001:db8:1:3::/64");
  // Link-local: by its link's /64, the interface kept (Boost prints it so).
  EXPECT_EQ(share_address("fe80::1%eth0"), "fe80::/64%eth0");
  EXPECT_EQ(share_address("fe80::2:3:4:5%eth0"), "fe80::/64%eth0");
  EXPECT_EQ(share_address("fe80::1%eth1"), "fe80::/64%eth1");
  EXPECT_EQ(share_address("fe80::1"), "fe80::/64");
  EXPECT_EQ(share_address("::1%lo"), "loopback");
  EXPECT_EQ(share_address("10.1.2.3%eth0"), "10.1.2.3%eth0");  // unparsed: itself
  EXPECT_EQ(share_address("?"), "?");
  EXPECT_EQ(share_address(""), "");
}

TEST(ConnectionShare, UnboundConnectionsOfAnAddressAreOneHolder) {
  std::vector<HeldConnection> held;
  for (int i = 0; i < 3; ++i) held.push_back(conn("127.0.0.1", 0, 0.1 * i, /*bound=*/false));
  held.push_back(conn("127.0.0.2", 0, 0.05, /*bound=*/false));  // the same holder: loopback
  const ShareVictim victim = pick(held, "127.0.0.1", 5);
  ASSERT_TRUE(victim.found());
  EXPECT_EQ(victim.index, 2u);
  EXPECT_NE(victim.why.find("the unbound connections of loopback holds 4"), std::string::npos)
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

// Seeded random snapshots against a brute-force oracle (its own address grouping): a victim is
// found exactly when some holder but the newcomer's client has an idle connection and holds two
// connections more than the newcomer's client, or one more (and two at least) with its idlest idle
// long, counting only its connections at addresses holding at least as many as the newcomer's.
// When some other address is over the newcomer's (two more, or one more idle long) and has such a
// holder, the victim is at the one of them holding the most, of the qualifying holder holding the
// most there, its idlest there; else of the qualifying holder holding the most, its idlest at such
// an address.
TEST(ConnectionShare, RandomSnapshotsAgreeWithABruteForceOracle) {
  std::mt19937_64 rng(20261129);
  const char* addresses[] = {"10.0.0.1", "10.0.0.2",    "127.0.0.1",   "127.0.0.5",
                             "::1",      "2001:db8::1", "2001:db8::2", "2001:db8:0:1::1"};
  const int group_of[] = {0, 1, 2, 2, 2, 3, 3, 4};
  const auto group = [&](std::string_view address) {
    for (int a = 0; a < 8; ++a) {
      if (address == addresses[a]) return group_of[a];
    }
    return -1;
  };
  using Side = std::pair<int, std::string>;  // (group or -1 for a client, name)
  for (int round = 0; round < 3000; ++round) {
    std::vector<HeldConnection> held(rng() % 14);
    for (auto& c : held) {
      c = conn(addresses[rng() % 8], 1 + rng() % 4,
               rng() % 4 == 0 ? kInCall : static_cast<double>(rng() % 150), rng() % 5 != 0);
    }
    const Newcomer newcomer{addresses[rng() % 8], rng() % 3 != 0, 1 + rng() % 4};
    const auto holder = [&](const HeldConnection& c) {
      return c.bound ? std::to_string(c.client_id) : "u" + std::to_string(group(c.address));
    };
    const std::string own = newcomer.bound ? std::to_string(newcomer.client_id) : "-";
    const int own_group = group(newcomer.address);
    // Counts and idlest per address, holder, and holder at an address.
    std::map<Side, std::pair<std::size_t, Clock::time_point>> tally;
    const auto add = [&](const Side& side, const HeldConnection& c) {
      auto& t = tally.try_emplace(side, 0, Clock::time_point::max()).first->second;
      ++t.first;
      if (c.idle) t.second = std::min(t.second, c.idle_since);
    };
    for (const auto& c : held) {
      add({group(c.address), ""}, c);
      add({-1, holder(c)}, c);
      add({group(c.address), holder(c)}, c);
    }
    const auto count = [&](const Side& side) {
      const auto it = tally.find(side);
      return it == tally.end() ? std::size_t{0} : it->second.first;
    };
    const auto idlest = [&](const Side& side) { return tally.at(side).second; };
    // A holder's idlest connection at an address holding at least as many as the newcomer's.
    const auto idlest_givable = [&](const std::string& h) {
      Clock::time_point t = Clock::time_point::max();
      for (const auto& c : held) {
        if (holder(c) == h && c.idle && count({group(c.address), ""}) >= count({own_group, ""})) {
          t = std::min(t, c.idle_since);
        }
      }
      return t;
    };
    const auto long_idle = [&](Clock::time_point t) {
      return t != Clock::time_point::max() && kNow - t >= kLongIdle;
    };
    const std::size_t mine = count({-1, own}), at_mine = count({own_group, ""});
    // Whether `h`, its connection idle since `t`, gives one to the newcomer.
    const auto gives = [&](const std::string& h, Clock::time_point t) {
      const std::size_t n = count({-1, h});
      return h != own && t != Clock::time_point::max() && n >= 2 &&
             (n >= mine + 2 || (n >= mine + 1 && long_idle(t)));
    };
    std::size_t best_address = 0;
    bool any = false;
    for (const auto& c : held) {
      const int g = group(c.address);
      const std::size_t n = count({g, ""});
      any = any || gives(holder(c), idlest_givable(holder(c)));
      if (g == own_group || idlest({g, ""}) == Clock::time_point::max()) continue;
      if (!(n >= at_mine + 2 || (n >= at_mine + 1 && long_idle(idlest({g, ""}))))) continue;
      if (gives(holder(c), idlest({g, holder(c)}))) best_address = std::max(best_address, n);
    }
    const ShareVictim victim = fair_share_victim(held, newcomer, kNow, kLongIdle);
    ASSERT_EQ(victim.found(), any) << "round " << round;
    if (!victim.found()) continue;
    const HeldConnection& v = held[victim.index];
    const int g = group(v.address);
    const std::string h = holder(v);
    ASSERT_TRUE(v.idle) << "round " << round;
    if (best_address > 0) {  // by address: the most first, then its holder holding the most
      ASSERT_EQ(count({g, ""}), best_address) << "round " << round;
      ASSERT_TRUE(gives(h, idlest({g, h}))) << "round " << round;
      EXPECT_EQ(v.idle_since, idlest({g, h})) << "round " << round;
      for (const auto& c : held) {
        if (group(c.address) == g && gives(holder(c), idlest({g, holder(c)}))) {
          EXPECT_GE(count({g, h}), count({g, holder(c)})) << "round " << round;
        }
      }
      continue;
    }
    ASSERT_TRUE(gives(h, idlest_givable(h))) << "round " << round;
    EXPECT_EQ(v.idle_since, idlest_givable(h)) << "round " << round;
    for (const auto& c : held) {
      if (gives(holder(c), idlest_givable(holder(c)))) {
        EXPECT_GE(count({-1, h}), count({-1, holder(c)})) << "round " << round;
      }
    }
  }
}

}  // namespace
}  // namespace gpubox::table::server
