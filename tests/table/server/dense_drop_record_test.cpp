// The record of dropped ranged DENSE writes (ps_store.hpp: a dropped write's later ranges are
// refused, naming why): bounded, and fair. A process spread over many client ids, of one host
// (one address, or many loopback addresses) or of the trainer's own, cannot push a trainer's
// record out while it holds more records than the trainer: what is forgotten is the oldest of the
// client holding the most at the host (share_address) holding the most. (Ids of one record each
// at the trainer's own host tie with it, and the oldest of them goes first: nothing tells such ids
// from a trainer's.) Driven on PsStore itself (dense_store_driver.hpp), with its clock given, so
// thousands of drops take milliseconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "tests/table/server/dense_store_driver.hpp"

namespace gpubox::table::server {
namespace {

class DropRecord : public testing::DenseStoreDriver {
 protected:
  // `clients` clients from first_client on at `address` each get `each` writes dropped (expired,
  // a batch of clients at a time under the server's held-write limit of a host; a batch's writes
  // one after the other).
  void drop_writes(uint64_t first_client, std::size_t clients, std::size_t each,
                   const std::string& address) {
    drop_writes(first_client, clients, each, [&](std::size_t) { return address; });
  }
  // The same with client first_client + c at address_of(c) (a batch of clients at a time under the
  // held-write limit of a host).
  void drop_writes(uint64_t first_client, std::size_t clients, std::size_t each,
                   const std::function<std::string(std::size_t)>& address_of) {
    constexpr std::size_t kBatch = kMaxHeldDenseWritesPerHost;
    for (std::size_t begun = 0; begun < clients; begun += kBatch) {
      const std::size_t end = std::min(clients, begun + kBatch);
      for (uint64_t write = 1; write <= each; ++write) {
        for (std::size_t c = begun; c < end; ++c) {
          ASSERT_TRUE(first_range(first_client + c, address_of(c), write).ok()) << c;
        }
        ASSERT_EQ(expire(), end - begun);
      }
    }
  }
  // Whether a later range of `client`'s write `write` is refused as dropped (the record holds).
  bool remembered(uint64_t client, const std::string& address, uint64_t write) {
    const Status st = range(client, address, write, 4);
    if (st.ok()) return false;  // forgotten: it began a new held write
    EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.to_string();
    EXPECT_NE(st.message().find("write " + std::to_string(write) + " was dropped: no range of it"),
              std::string::npos)
        << st.to_string();
    return true;
  }
};

TEST_F(DropRecord, AClientSpreadOverManyIdsOfAnotherAddressCannotPushATrainersRecordOut) {
  ASSERT_TRUE(first_range(1, "10.0.0.1", 7).ok());
  ASSERT_EQ(expire(), 1u);
  // Three times the record's size, one drop per client id.
  constexpr std::size_t kIds = 3 * PsStore::kMaxDroppedRecords;
  drop_writes(1000, kIds, 1, "10.0.0.2");
  EXPECT_TRUE(remembered(1, "10.0.0.1", 7));
  // The record stays bounded: the spreading address's oldest records went, its newest stay.
  EXPECT_TRUE(remembered(1000 + kIds - 1, "10.0.0.2", 1));
  EXPECT_TRUE(remembered(1000 + kIds - (PsStore::kMaxDroppedRecords - 1), "10.0.0.2", 1));
  EXPECT_FALSE(remembered(1000 + kIds - PsStore::kMaxDroppedRecords, "10.0.0.2", 1));
  EXPECT_FALSE(remembered(1000, "10.0.0.2", 1));
}

// A local process spreading its client ids over loopback addresses, one record each (127.0.x.y and
// ::ffff:127.1.x.y: any local process picks among 127/8 freely), is one host (share_address): it
// keeps no more records than from one address, and a trainer's record of another host outlives
// it. (Counted by raw address, each of its addresses held one record, as the trainer's did, and
// the trainer's, oldest, went first.)
TEST_F(DropRecord, AProcessSpreadOverLoopbackAddressesIsOneHost) {
  ASSERT_TRUE(first_range(1, "10.0.0.1", 7).ok());
  ASSERT_EQ(expire(), 1u);
  const auto spread = [](std::size_t c) {
    const std::string host = std::to_string(c / 250) + "." + std::to_string(2 + c % 250);
    return c % 2 == 0 ? "127.0." + host : "::ffff:127.1." + host;
  };
  constexpr std::size_t kIds = 3 * PsStore::kMaxDroppedRecords;
  drop_writes(1000, kIds, 1, spread);
  EXPECT_TRUE(remembered(1, "10.0.0.1", 7));
  EXPECT_TRUE(remembered(1000 + kIds - 1, spread(kIds - 1), 1));
  const std::size_t kept = PsStore::kMaxDroppedRecords - 1;  // the trainer's is the other one
  EXPECT_TRUE(remembered(1000 + kIds - kept, spread(kIds - kept), 1));
  EXPECT_FALSE(remembered(1000 + kIds - kept - 1, spread(kIds - kept - 1), 1));
}

TEST_F(DropRecord, SpreadOverAFewAddressesOrHoldingMoreAtTheTrainersOwnItGivesFirst) {
  ASSERT_TRUE(first_range(1, "10.0.0.1", 7).ok());
  ASSERT_TRUE(first_range(2, "10.0.0.9", 3).ok());
  ASSERT_EQ(expire(), 2u);
  // Four addresses of a thousand records each (one an id), and at the trainer's own address
  // eight ids dropping forty writes each (sixteen remembered each).
  for (int a = 0; a < 4; ++a) {
    drop_writes(10000 * (a + 1), PsStore::kMaxDroppedRecords, 1, "10.0.1." + std::to_string(a));
  }
  drop_writes(90000, 8, 40, "10.0.0.1");
  drop_writes(50000, PsStore::kMaxDroppedRecords, 1, "10.0.1.9");
  EXPECT_TRUE(remembered(1, "10.0.0.1", 7));
  EXPECT_TRUE(remembered(2, "10.0.0.9", 3));
}

TEST_F(DropRecord, OneClientKeepsItsOwnNewestSixteen) {
  ASSERT_TRUE(first_range(1, "10.0.0.1", 1000).ok());
  ASSERT_EQ(expire(), 1u);
  const std::size_t kOwn = PsStore::kMaxDroppedPerClient + 5;
  for (uint64_t write = 1; write <= kOwn; ++write) {
    ASSERT_TRUE(first_range(2, "10.0.0.1", write).ok());
    ASSERT_EQ(expire(), 1u);
  }
  EXPECT_TRUE(remembered(1, "10.0.0.1", 1000));  // another client's record: never its to push
  // Newest first: a forgotten write's range begins a held write, which could drop another.
  for (uint64_t write = kOwn; write >= 1; --write) {
    EXPECT_EQ(remembered(2, "10.0.0.1", write), write > kOwn - PsStore::kMaxDroppedPerClient)
        << write;
  }
}

}  // namespace
}  // namespace gpubox::table::server
