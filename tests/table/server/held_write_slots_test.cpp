// The slots of held ranged DENSE writes across hosts (ps_store.hpp: PsStore::dense), driven on
// PsStore with peers named by address (dense_store_driver.hpp): other hosts need no network of
// the test's own, as loopback cannot give them (every loopback address is one host). The server's
// limit, kMaxHeldDenseWrites, counts the writes of every host: at it, a new write takes the
// slowest write of the clients holding the most on the server, whatever their host, and is
// refused when none holds enough more; at a host's own limit, kMaxHeldDenseWritesPerHost, only a
// client of that host (counted by share_address) gives its slot.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tests/table/server/dense_store_driver.hpp"

namespace gpubox::table::server {
namespace {

class HeldWriteSlots : public testing::DenseStoreDriver {
 protected:
  // Clients first_client .. first_client + clients - 1 at address_of(c) begin writes 1..each.
  void hold(uint64_t first_client, std::size_t clients, std::size_t each,
            const std::function<std::string(uint64_t)>& address_of) {
    for (uint64_t c = first_client; c < first_client + clients; ++c) {
      for (uint64_t w = 1; w <= each; ++w) {
        const Status st = first_range(c, address_of(c), w);
        ASSERT_TRUE(st.ok()) << "client " << c << " write " << w << ": " << st.to_string();
      }
    }
  }
  void hold(uint64_t first_client, std::size_t clients, std::size_t each,
            const std::string& address) {
    hold(first_client, clients, each, [&](uint64_t) { return address; });
  }
  // The last range (4 of 8) of a held write: it commits; of a dropped one: refused, naming why.
  Status last_range(uint64_t client, const std::string& address, uint64_t write) {
    return range(client, address, write, 4);
  }
  // Expects `client`'s write `write` dropped for a new one, `why` in the refusal of its last range.
  void expect_dropped(uint64_t client, const std::string& address, uint64_t write,
                      const std::string& why) {
    const Status st = last_range(client, address, write);
    EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.to_string();
    EXPECT_NE(st.message().find("write " + std::to_string(write) +
                                " was dropped: its slot went to a write of another client (" + why),
              std::string::npos)
        << st.to_string();
  }
};

constexpr const char* kHostA = "10.0.0.1";
constexpr const char* kHostB = "10.0.0.2";
constexpr const char* kHostC = "10.0.0.3";

// Two hosts at their shares (host A's clients holding 2 each, host B's 4) leave the server one
// slot short of its limit: a write of host C takes it, dropping nothing; the next takes the
// slowest write of a client holding the most on the server (B's, though A's began first).
TEST_F(HeldWriteSlots, AtTheServersLimitANewHostTakesFromTheClientsHoldingTheMostOnAnyHost) {
  static_assert(kMaxHeldDenseWrites == 2 * kMaxHeldDenseWritesPerHost);
  hold(100, kMaxHeldDenseWritesPerHost / 2, 2, kHostA);
  hold(200, kMaxHeldDenseWritesPerHost / kMaxStagedDenseWrites - 1, kMaxStagedDenseWrites, kHostB);
  hold(299, 1, kMaxStagedDenseWrites - 1, kHostB);
  ASSERT_EQ(store_.held_writes(), kMaxHeldDenseWrites - 1);
  // Client 200's write 1 moves faster than its other writes: its write 2 is the slowest of B's.
  ASSERT_TRUE(range(200, kHostB, 1, 4, 2).ok());
  ASSERT_TRUE(first_range(300, kHostC, 1).ok());
  EXPECT_EQ(store_.held_writes(), kMaxHeldDenseWrites);  // the limit's last slot: nothing dropped
  ASSERT_TRUE(first_range(301, kHostC, 1).ok());
  EXPECT_EQ(store_.held_writes(), kMaxHeldDenseWrites);
  expect_dropped(200, kHostB, 2,
                 "the slowest of a client holding 4 of them, the most, against the new write's "
                 "client's 0): this server already holds 64 ranged writes");
  // Every other write is held: the last ranges of host A's first, client 200's faster one and host
  // C's commit.
  EXPECT_TRUE(last_range(100, kHostA, 1).ok());
  EXPECT_TRUE(range(200, kHostB, 1, 6, 2).ok());
  EXPECT_TRUE(last_range(300, kHostC, 1).ok());
  EXPECT_TRUE(last_range(301, kHostC, 1).ok());
  EXPECT_EQ(store_.held_writes(), kMaxHeldDenseWrites - 4);
}

// At the server's limit with every client holding one moving write, a new client holding none
// is refused naming the server's limit (nothing dropped); once the writes received no range for a
// quarter of max_idle, one of a client holding one more gives its slot.
TEST_F(HeldWriteSlots, AtTheServersLimitNoClientHoldingOneMoreGivesAMovingWrite) {
  hold(100, kMaxHeldDenseWritesPerHost, 1, kHostA);
  hold(200, kMaxHeldDenseWritesPerHost, 1, kHostB);
  ASSERT_EQ(store_.held_writes(), kMaxHeldDenseWrites);
  const Status refused = first_range(300, kHostC, 1);
  EXPECT_EQ(refused.code(), Status::Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("from 10.0.0.3: this server already holds 64 ranged writes of "
                                   "its clients (at most 4 a client, 32 a host), and no other "
                                   "client holds more of them than this one's 0"),
            std::string::npos)
      << refused.to_string();
  EXPECT_EQ(store_.held_writes(), kMaxHeldDenseWrites);
  now_ += kMaxIdle / 4;
  ASSERT_TRUE(first_range(300, kHostC, 1).ok());
  EXPECT_EQ(store_.held_writes(), kMaxHeldDenseWrites);
  expect_dropped(100, kHostA, 1, "the slowest of a client holding 1 of them");
  EXPECT_TRUE(last_range(200, kHostB, 1).ok());
}

// At its host's limit (the server far from its own), a new client of host A takes a slot of A's
// clients, holding 2 each, not of host B's holding 4: counted by share address, A's clients
// spread over one IPv6 /64 are one host.
TEST_F(HeldWriteSlots, AtAHostsLimitOnlyAClientOfThatHostGivesItsSlot) {
  const auto in_a = [](uint64_t c) { return "2001:db8:0:1::" + std::to_string(c); };
  hold(200, 4, kMaxStagedDenseWrites, kHostB);
  hold(100, kMaxHeldDenseWritesPerHost / 2, 2, in_a);
  ASSERT_EQ(store_.held_writes(), kMaxHeldDenseWritesPerHost + 4 * kMaxStagedDenseWrites);
  ASSERT_TRUE(first_range(120, in_a(120), 1).ok());
  EXPECT_EQ(store_.held_writes(), kMaxHeldDenseWritesPerHost + 4 * kMaxStagedDenseWrites);
  expect_dropped(100, in_a(100), 1,
                 "the slowest of a client holding 2 of them, the most, against the new write's "
                 "client's 0): peer 2001:db8:0:1::120 (host 2001:db8:0:1::/64) already holds 32");
  EXPECT_TRUE(last_range(200, kHostB, 1).ok());
  EXPECT_TRUE(last_range(120, in_a(120), 1).ok());
}

}  // namespace
}  // namespace gpubox::table::server
