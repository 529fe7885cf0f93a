// The failed-AUTH backoff (auth_backoff.hpp) on a clock of the test's own: which peer addresses
// count as one host, the delays against their formula, the slots a refused proof leaves, and what a
// full table forgets.
#include "table/server/auth_backoff.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace gpubox::table::server {
namespace {

using Clock = AuthBackoff::Clock;

const Clock::time_point kStart = Clock::time_point(std::chrono::hours(1000));

Clock::time_point at_s(double s) {
  return kStart + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double seconds_after(Clock::time_point t, Clock::time_point since) {
  return std::chrono::duration<double>(t - since).count();
}

// Whether a proof from `address` arriving at `now` waits (takes no slot: `latest` is `now`).
bool slowed(AuthBackoff& backoff, const std::string& address, Clock::time_point now) {
  return backoff.reserve_check(address, now, now).at > now;
}

// The k-th distinct IPv4 host of 10/8 (k < 2^24).
std::string ipv4_host(std::size_t k) {
  return "10." + std::to_string((k >> 16) & 255) + "." + std::to_string((k >> 8) & 255) + "." +
         std::to_string(k & 255);
}

TEST(AuthBackoff, APeerCountsUnderItsHostNotItsAddress) {
  struct Case {
    const char* failing;
    std::vector<const char*> same_host, other_hosts;
  };
  const std::vector<Case> cases{
      {"10.1.2.3", {"::ffff:10.1.2.3"}, {"10.1.2.4", "::ffff:10.1.2.4"}},
      {"::ffff:10.1.2.3", {"10.1.2.3"}, {"10.1.2.4"}},
      {"127.0.0.1", {"127.0.0.2", "127.9.9.9", "::1", "::ffff:127.0.0.3"}, {"10.1.2.3"}},
      {"2001:db8:1:2::1",
       {"2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff"},
       {"2001:db8:1:3::1", "2001:db8:2:2::1"}},
      {"fe80::1%eth0", {"fe80::2%eth0"}, {"fe80::1%eth1"}},
      {"?", {}, {"10.1.2.3", "127.0.0.1"}},  // an address the server could not read: itself
  };
  for (const Case& c : cases) {
    AuthBackoff backoff(1.0, 8.0);
    EXPECT_EQ(backoff.failed(c.failing, at_s(0), nullptr), 1u) << c.failing;
    EXPECT_TRUE(slowed(backoff, c.failing, at_s(0.5))) << c.failing;
    for (const char* peer : c.same_host) {
      EXPECT_TRUE(slowed(backoff, peer, at_s(0.5))) << peer << " after " << c.failing;
      EXPECT_EQ(backoff.failed(peer, at_s(0.5), nullptr), 2u) << peer << " after " << c.failing;
      EXPECT_EQ(backoff.failed(c.failing, at_s(0.5), nullptr), 3u) << c.failing;
      backoff.succeeded(peer, {});  // a right proof of the host halves it for all its addresses:
      EXPECT_TRUE(slowed(backoff, c.failing, at_s(0.5))) << c.failing << " after " << peer;
      backoff.succeeded(c.failing, {});  // 3 -> 1 -> 0: forgotten
      EXPECT_FALSE(slowed(backoff, c.failing, at_s(0.5))) << c.failing << " after " << peer;
      EXPECT_EQ(backoff.failed(c.failing, at_s(0), nullptr), 1u) << c.failing;
    }
    for (const char* peer : c.other_hosts) {
      EXPECT_FALSE(slowed(backoff, peer, at_s(0.5))) << peer << " after " << c.failing;
      EXPECT_EQ(backoff.failed(peer, at_s(0.5), nullptr), 1u) << peer << " after " << c.failing;
      backoff.succeeded(peer, {});
      EXPECT_TRUE(slowed(backoff, c.failing, at_s(0.5))) << c.failing << " after " << peer;
    }
  }
}

// The slots against the formula base * 2^(k-1), at most max: one check per slot, however many
// proofs arrive at once.
TEST(AuthBackoff, ChecksAreSpacedByTheDoublingDelayUpToTheMax) {
  const double base = 0.25, max = 3.0;
  for (uint64_t k = 1; k <= 70; k = k < 8 ? k + 1 : k * 3) {
    AuthBackoff backoff(base, max);
    double delay_s = -1;
    for (uint64_t i = 1; i <= k; ++i) {
      EXPECT_EQ(backoff.failed("10.0.0.1", at_s(0), &delay_s), i);
    }
    const double expected = std::min(max, base * std::pow(2.0, static_cast<double>(k - 1)));
    EXPECT_NEAR(delay_s, expected, 1e-9) << k;
    // Three proofs at once: the first at the delay, the next each a delay later.
    for (int proof = 0; proof < 3; ++proof) {
      EXPECT_NEAR(seconds_after(backoff.reserve_check("10.0.0.1", at_s(0)).at, kStart),
                  expected * (proof + 1), 1e-6)
          << k << " failures, proof " << proof;
    }
    // An hour and a bit without failures: forgotten.
    EXPECT_EQ(backoff.reserve_check("10.0.0.1", at_s(3601)).at, at_s(3601)) << k;
  }
  AuthBackoff none(0, 0);  // base 0: never slowed
  none.failed("10.0.0.1", at_s(0), nullptr);
  EXPECT_FALSE(slowed(none, "10.0.0.1", at_s(0)));
}

// A proof that cannot wait for its slot (refused: past its connection's --auth_timeout_s) leaves
// the slot to the next proof: a flood of refused connections cannot push a host's next check
// (a right proof's) ever later.
TEST(AuthBackoff, AProofRefusedForItsWaitTakesNoSlot) {
  AuthBackoff backoff(10.0, 10.0);
  backoff.failed("10.0.0.1", at_s(0), nullptr);  // the next check at 10 s
  for (int refused = 0; refused < 100; ++refused) {
    EXPECT_EQ(backoff.reserve_check("10.0.0.1", at_s(1), at_s(5)).at, at_s(10)) << refused;
  }
  EXPECT_EQ(backoff.reserve_check("10.0.0.1", at_s(1), at_s(11)).at, at_s(10));
  EXPECT_EQ(backoff.reserve_check("10.0.0.1", at_s(1), at_s(25)).at, at_s(20));  // the next slot
}

// A right proof halves its host's failures rather than forgetting them: a guesser beside a busy
// trainer on one host is not reset by each of the trainer's connections.
TEST(AuthBackoff, ARightProofHalvesTheHostsFailures) {
  AuthBackoff backoff(1.0, 1000.0);
  for (uint64_t i = 1; i <= 8; ++i) backoff.failed("10.0.0.1", at_s(0), nullptr);
  backoff.succeeded("10.0.0.2", {});  // another host: nothing
  backoff.succeeded("10.0.0.1", {});  // 8 -> 4
  double delay_s = 0;
  EXPECT_EQ(backoff.failed("10.0.0.1", at_s(0), &delay_s), 5u);
  EXPECT_DOUBLE_EQ(delay_s, 16.0);
  backoff.succeeded("10.0.0.1", {});  // 5 -> 2
  EXPECT_EQ(backoff.failed("10.0.0.1", at_s(0), nullptr), 3u);
  backoff.succeeded("10.0.0.1", {});  // 3 -> 1: still slowed
  EXPECT_TRUE(slowed(backoff, "10.0.0.1", at_s(1)));
  backoff.succeeded("10.0.0.1", {});  // 1 -> 0: forgotten
  EXPECT_FALSE(slowed(backoff, "10.0.0.1", at_s(1)));
  EXPECT_EQ(backoff.failed("10.0.0.1", at_s(1), nullptr), 1u);
}

// A table filled by hosts still backing off forgets none of them: two more hosts X and Y failing
// in turn used to evict each other (the newest had the fewest failures) and guess unslowed. Now
// the one without room counts on the shared overflow entry, and both are slowed throughout.
TEST(AuthBackoff, TwoHostsCannotTakeTurnsEvictingEachOtherFromAFullTable) {
  AuthBackoff backoff(0.1, 30.0);
  for (std::size_t k = 0; k + 1 < AuthBackoff::kMaxHosts; ++k) {
    backoff.failed(ipv4_host(k), at_s(0), nullptr);
    backoff.failed(ipv4_host(k), at_s(0), nullptr);
  }
  // Each guess comes as soon as the last was checked; a guess is unslowed when it is checked no
  // later than its host's previous one.
  const std::string hosts[2] = {"192.0.2.1", "198.51.100.1"};
  Clock::time_point last_check[2] = {};
  Clock::time_point now = at_s(0);
  int unslowed = 0;
  for (int guess = 0; guess < 1000; ++guess) {
    const int h = guess % 2;
    const Clock::time_point at = backoff.reserve_check(hosts[h], now).at;
    if (guess >= 2 && at <= last_check[h]) ++unslowed;
    last_check[h] = now = at;
    backoff.failed(hosts[h], now, nullptr);
  }
  EXPECT_EQ(unslowed, 0) << "of 998 guesses in turn";
  EXPECT_GT(seconds_after(now, kStart), 900.0) << "1000 guesses, most 30 s apart";
}

// A host that failed often and then paused keeps its backoff through a flood of hosts failing
// once each, however many: the full table forgets the flood's own that no longer back off, the
// longest quiet first.
TEST(AuthBackoff, AFloodOfNewHostsCannotResetAHostThatFailedOften) {
  AuthBackoff backoff(1.0, 60.0);
  const std::string guesser = "2001:db8:1:2::7";
  for (uint64_t i = 1; i <= 10; ++i) EXPECT_EQ(backoff.failed(guesser, at_s(0), nullptr), i);
  const std::size_t flood = AuthBackoff::kMaxHosts + 100;
  for (std::size_t k = 0; k < flood; ++k) {
    backoff.failed(ipv4_host(k), at_s(1 + 0.001 * static_cast<double>(k)), nullptr);
  }
  const Clock::time_point after = at_s(30);
  EXPECT_TRUE(slowed(backoff, "2001:db8:1:2::8", after)) << "the flood reset the guesser's backoff";
  EXPECT_EQ(backoff.failed(guesser, after, nullptr), 11u);
  // Of the flood, the first ones (the longest quiet) were forgotten: the table held kMaxHosts.
  // kMaxHosts - 1 of the flood were remembered beside the guesser, the latest of them.
  const std::size_t kept_from = flood - (AuthBackoff::kMaxHosts - 1);
  EXPECT_EQ(backoff.failed(ipv4_host(kept_from - 1), after, nullptr), 1u);  // forgotten
  EXPECT_EQ(backoff.failed(ipv4_host(flood - 1), after, nullptr), 2u);      // remembered
}

// A full table forgets a host whose last failure is over an hour old before any other, however
// many failures it had.
TEST(AuthBackoff, AFullTableForgetsAHostQuietForAnHourFirst) {
  AuthBackoff backoff(1.0, 60.0);
  for (uint64_t i = 1; i <= 5; ++i) backoff.failed("10.255.0.1", at_s(0), nullptr);
  for (std::size_t k = 0; k + 1 < AuthBackoff::kMaxHosts; ++k) {
    backoff.failed(ipv4_host(k), at_s(1800), nullptr);
  }
  backoff.failed("10.255.0.2", at_s(3700), nullptr);  // makes room: the hour-old host goes
  for (std::size_t k = 0; k + 1 < AuthBackoff::kMaxHosts; k += 511) {
    EXPECT_EQ(backoff.failed(ipv4_host(k), at_s(3700), nullptr), 2u) << ipv4_host(k);
  }
  EXPECT_EQ(backoff.failed("10.255.0.1", at_s(3700), nullptr), 1u);
}

// An attack that filled the table (every host failing 9 times, then 9 more hosts on the overflow)
// and stopped: once the table's hosts no longer back off, hosts that never failed are checked at
// once. The overflow used to slow every new host while the table stayed full: 20 trainer hosts got
// 3 proofs checked in a minute, ten minutes after the attack.
TEST(AuthBackoff, AFullTableOfHostsNoLongerBackingOffDoesNotSlowANewHost) {
  AuthBackoff backoff(1.0, 60.0);
  for (std::size_t k = 0; k < AuthBackoff::kMaxHosts + 9; ++k) {
    for (int i = 0; i < 9; ++i) backoff.failed(ipv4_host(k), at_s(0), nullptr);
  }
  // While the attack's hosts back off, a new host shares the overflow's backoff, and is told so.
  const AuthBackoff::Check during = backoff.reserve_check("192.0.2.9", at_s(1), at_s(1));
  EXPECT_TRUE(during.shared);
  EXPECT_GT(during.at, at_s(1));
  EXPECT_NE(AuthBackoff::cause("192.0.2.9", during).find("full table"), std::string::npos);
  EXPECT_EQ(AuthBackoff::cause("192.0.2.9", {}), "host 192.0.2.9");
  int slowed_proofs = 0;
  for (int second = 0; second < 60; ++second) {
    for (int trainer = 0; trainer < 20; ++trainer) {
      const Clock::time_point now = at_s(600 + second);
      const AuthBackoff::Check check = backoff.reserve_check(
          "2001:db8:" + std::to_string(trainer + 1) + "::1", now, now + std::chrono::seconds(10));
      if (check.at > now || check.shared) ++slowed_proofs;
      backoff.succeeded("2001:db8:" + std::to_string(trainer + 1) + "::1", check);
    }
  }
  EXPECT_EQ(slowed_proofs, 0) << "of 1200 right proofs from 20 hosts that never failed";
  // The attack's own hosts are still remembered: one more failure is their 10th.
  EXPECT_EQ(backoff.failed(ipv4_host(7), at_s(700), nullptr), 10u);
}

// A right proof through the overflow gives back the slot it took and halves the overflow's
// failures: trainers beside an ongoing attack do not push each other's checks later.
TEST(AuthBackoff, ARightProofThroughTheOverflowGivesBackItsSlot) {
  AuthBackoff backoff(10.0, 10.0);
  for (std::size_t k = 0; k < AuthBackoff::kMaxHosts; ++k) {
    backoff.failed(ipv4_host(k), at_s(0), nullptr);  // each backs off until 10 s
  }
  for (int i = 0; i < 4; ++i) backoff.failed("192.0.2.1", at_s(0), nullptr);  // the overflow
  const AuthBackoff::Check first = backoff.reserve_check("192.0.2.2", at_s(1));
  ASSERT_TRUE(first.shared);
  EXPECT_EQ(first.at, at_s(10));
  backoff.succeeded("192.0.2.2", first);
  const AuthBackoff::Check second = backoff.reserve_check("192.0.2.3", at_s(1));
  EXPECT_TRUE(second.shared);
  EXPECT_EQ(second.at, at_s(10)) << "the right proof pushed the next check";
  // A wrong one is not given back: the next check is a slot later.
  EXPECT_EQ(backoff.reserve_check("192.0.2.4", at_s(1)).at, at_s(20));
  // Halved twice (4 -> 2 -> 1): the next failure through the overflow is its 2nd.
  backoff.succeeded("192.0.2.3", second);
  EXPECT_EQ(backoff.failed("192.0.2.5", at_s(2), nullptr), 2u);
}

}  // namespace
}  // namespace gpubox::table::server
