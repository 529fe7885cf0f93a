// Every in-process collective for 1, 2, 3, 4 and 8 simulated cards against host references,
// with seeded random sizes including 0 and empty peers, repeated to shake out races.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/memory.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace gpubox::comm {
namespace {

using comm_test::CardGroup;

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> out(n);
  for (auto& v : out) {
    if constexpr (std::is_floating_point_v<T>) {
      v = static_cast<T>(std::uniform_real_distribution<double>(-1.0, 1.0)(rng));
    } else {
      v = static_cast<T>(rng());  // the full range, so integer sums wrap
    }
  }
  return out;
}

template <class T>
struct TypeTag {
  using type = T;
};
// Integers sum in their unsigned twin (wrapping), floating point in its own type.
template <class T>
auto sum_type() {
  if constexpr (std::is_integral_v<T>) {
    return TypeTag<std::make_unsigned_t<T>>{};
  } else {
    return TypeTag<T>{};
  }
}

// The contract: element i is summed in rank order (integers wrap), identically on all ranks.
template <class T>
std::vector<T> rank_order_sum(const std::vector<std::vector<T>>& inputs) {
  using Acc = typename decltype(sum_type<T>())::type;
  std::vector<T> out(inputs[0].size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    Acc acc = static_cast<Acc>(inputs[0][i]);
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      acc = static_cast<Acc>(acc + static_cast<Acc>(inputs[k][i]));
    }
    out[i] = static_cast<T>(acc);
  }
  return out;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::vector<std::size_t> reduce_sizes(int ranks, std::size_t element, std::mt19937_64& rng) {
  // Chunk edges (a cache line is 16 floats / 64 bytes); the edges of a 512-element block (whole
  // blocks run fixed-length loops, the tail a run-time one): at 2+ ranks, ranks * 512 - 1 gives
  // every chunk but the last one whole block and the last a 511-element tail, ranks * 512 whole
  // blocks only, ranks * 512 + 1 a whole block plus a tail (1 rank copies with memcpy, no
  // blocks); several blocks per chunk; both sides of the one-phase / two-phase switch (256 KiB;
  // 3+ ranks, two always take one phase); a size of 1 MiB; random sizes.
  const std::size_t switch_at = (std::size_t{256} << 10) / element;
  std::vector<std::size_t> sizes = {0,
                                    1,
                                    2,
                                    15,
                                    16,
                                    17,
                                    63,
                                    64,
                                    65,
                                    static_cast<std::size_t>(ranks) * 16 + 1,
                                    static_cast<std::size_t>(ranks) * 512 - 1,
                                    static_cast<std::size_t>(ranks) * 512,
                                    static_cast<std::size_t>(ranks) * 512 + 1,
                                    4097,
                                    switch_at,
                                    switch_at + 1,
                                    (std::size_t{1} << 20) / element + 17};
  for (int i = 0; i < 6; ++i) sizes.push_back(rng() % 5000);
  return sizes;
}

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { GPUBOX_REQUIRE_CARDS(GetParam()); }
  int ranks() const { return GetParam(); }

  // Every size through one group (its slots reused across sizes): a group per size cost a
  // communicator's setup each (about half a second with NCCL on a GPU: 23 sizes made each test
  // 12 s, and the lease's per-binary limit ended comm_test inside AllReduceSumInt32Wraps).
  template <class T>
  void check_all_reduce(bool in_place) {
    std::mt19937_64 rng(1000 + ranks() * 10 + (in_place ? 1 : 0));
    CardGroup cg(ranks());
    for (std::size_t n : reduce_sizes(ranks(), sizeof(T), rng)) {
      SCOPED_TRACE(::testing::Message() << n << " elements of " << sizeof(T) << " bytes");
      std::vector<std::vector<T>> inputs(static_cast<std::size_t>(ranks()));
      for (auto& input : inputs) input = random_values<T>(n, rng);
      const std::vector<T> want = rank_order_sum(inputs);
      std::vector<std::vector<T>> got(static_cast<std::size_t>(ranks()));
      cg.run([&](device::Card& card, Communicator& comm) {
        auto send = device::to_device(inputs[comm.rank()], card.memory(), card.stream());
        if (in_place) {
          comm.all_reduce_sum(send.data(), send.data(), n, card.stream());
          got[comm.rank()] = device::to_host(send);
        } else {
          auto recv = card.make_buffer<T>(n);
          comm.all_reduce_sum(send.data(), recv.data(), n, card.stream());
          got[comm.rank()] = device::to_host(recv);
          // The send buffer is not touched.
          GPUBOX_EXPECTS(bitwise_equal(device::to_host(send), inputs[comm.rank()]),
                         "all_reduce_sum changed its send buffer");
        }
      });
      for (int r = 0; r < ranks(); ++r) {
        ASSERT_TRUE(bitwise_equal(got[r], want))
            << "rank " << r << " of " << ranks() << ", n=" << n << (in_place ? ", in place" : "");
      }
    }
  }

  template <class T>
  void check_all_to_all_v(int iterations, std::size_t max_count) {
    const int ranks = this->ranks();
    std::mt19937_64 rng(2000 + ranks);
    // counts[it][src * ranks + dst], drawn up front so every rank sees the same plan.
    std::vector<std::vector<std::size_t>> counts(static_cast<std::size_t>(iterations));
    for (int it = 0; it < iterations; ++it) {
      auto& c = counts[it];
      c.resize(static_cast<std::size_t>(ranks) * ranks);
      const int shape = it % 5;  // 0: all empty, 1: one sender only, else random with empty peers
      const int only_sender = static_cast<int>(rng() % ranks);
      const std::size_t cap = 1 + rng() % max_count;
      for (int src = 0; src < ranks; ++src) {
        for (int dst = 0; dst < ranks; ++dst) {
          std::size_t n = rng() % 4 == 0 ? 0 : rng() % (cap + 1);
          if (shape == 0 || (shape == 1 && src != only_sender)) n = 0;
          c[src * ranks + dst] = n;
        }
      }
    }
    // Element j sent from src to dst encodes (src, dst, j, iteration) so any misplacement shows.
    auto value = [](int it, int src, int dst, std::size_t j) {
      const uint64_t code = (static_cast<uint64_t>(it) << 40) ^ (static_cast<uint64_t>(src) << 32) ^
                            (static_cast<uint64_t>(dst) << 24) ^ j;
      return static_cast<T>(code * 0x9E3779B97F4A7C15ULL >> 40);
    };
    CardGroup cg(ranks);
    cg.run([&](device::Card& card, Communicator& comm) {
      const int me = comm.rank();
      std::vector<std::size_t> send_counts(ranks), recv_counts(ranks);
      std::vector<T> host_send, want;
      auto send = card.make_buffer<T>(0);
      auto recv = card.make_buffer<T>(0);
      for (int it = 0; it < iterations; ++it) {
        const auto& c = counts[it];
        host_send.clear();
        want.clear();
        for (int dst = 0; dst < ranks; ++dst) {
          send_counts[dst] = c[me * ranks + dst];
          for (std::size_t j = 0; j < send_counts[dst]; ++j)
            host_send.push_back(value(it, me, dst, j));
        }
        for (int src = 0; src < ranks; ++src) {
          for (std::size_t j = 0; j < c[src * ranks + me]; ++j)
            want.push_back(value(it, src, me, j));
        }
        comm.exchange_counts(send_counts.data(), recv_counts.data(), card.stream());
        for (int src = 0; src < ranks; ++src) {
          GPUBOX_EXPECTS(recv_counts[src] == c[src * ranks + me], "iteration ", it, ": rank ", me,
                         " got count ", recv_counts[src], " from ", src);
        }
        send.resize_discard(host_send.size());
        recv.resize_discard(want.size());
        device::copy_async(send.data(), host_send.data(), host_send.size(), card.stream());
        comm.all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(),
                          card.stream());
        const auto got = device::to_host(recv);
        GPUBOX_EXPECTS(bitwise_equal(got, want), "iteration ", it, ": rank ", me, " received ",
                       got.size(), " elements that differ from the reference");
      }
    });
  }
};

TEST_P(CollectivesTest, AllReduceSumFloatIsRankOrderSumOnEveryRank) {
  check_all_reduce<float>(false);
}
TEST_P(CollectivesTest, AllReduceSumFloatInPlace) { check_all_reduce<float>(true); }
TEST_P(CollectivesTest, AllReduceSumDouble) { check_all_reduce<double>(false); }
TEST_P(CollectivesTest, AllReduceSumInt32Wraps) { check_all_reduce<int32_t>(false); }
TEST_P(CollectivesTest, AllReduceSumInt64InPlace) { check_all_reduce<int64_t>(true); }
TEST_P(CollectivesTest, AllReduceSumUInt64) { check_all_reduce<uint64_t>(false); }
TEST_P(CollectivesTest, AllReduceSumUInt8Wraps) { check_all_reduce<uint8_t>(false); }

TEST_P(CollectivesTest, AllToAllVRandomCountsWithEmptyPeersRepeated) {
  check_all_to_all_v<uint64_t>(200, 300);
}
TEST_P(CollectivesTest, AllToAllVElementSizes) {
  check_all_to_all_v<uint8_t>(20, 5000);
  check_all_to_all_v<float>(20, 2000);
  check_all_to_all_v<double>(10, 2000);
}

TEST_P(CollectivesTest, AllGatherRandomSizesAndInPlace) {
  const int ranks = this->ranks();
  std::mt19937_64 rng(3000 + ranks);
  CardGroup cg(ranks);
  std::vector<std::size_t> sizes = {0, 1, 17, 1000};
  for (int i = 0; i < 40; ++i) sizes.push_back(rng() % 700);
  std::vector<std::vector<std::vector<int64_t>>> inputs(sizes.size());
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    for (int r = 0; r < ranks; ++r) inputs[s].push_back(random_values<int64_t>(sizes[s], rng));
  }
  cg.run([&](device::Card& card, Communicator& comm) {
    const int me = comm.rank();
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      const std::size_t n = sizes[s];
      std::vector<int64_t> want;
      for (int r = 0; r < ranks; ++r)
        want.insert(want.end(), inputs[s][r].begin(), inputs[s][r].end());
      auto send = device::to_device(inputs[s][me], card.memory(), card.stream());
      auto recv = card.make_buffer<int64_t>(n * ranks);
      comm.all_gather(send.data(), recv.data(), n, card.stream());
      GPUBOX_EXPECTS(device::to_host(recv) == want, "all_gather n=", n, " rank ", me);
      // In place: this rank's block already sits at its place in recv.
      auto inplace = card.make_buffer<int64_t>(n * ranks);
      device::memset_bytes_async(inplace.data(), 0xab, inplace.bytes(), card.stream());
      device::copy_async(inplace.data() + n * me, inputs[s][me].data(), n, card.stream());
      comm.all_gather(inplace.data() + n * me, inplace.data(), n, card.stream());
      GPUBOX_EXPECTS(device::to_host(inplace) == want, "in-place all_gather n=", n, " rank ", me);
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const int ranks = this->ranks();
  std::mt19937_64 rng(4000 + ranks);
  CardGroup cg(ranks);
  struct Round {
    int root;
    std::vector<double> payload;
  };
  std::vector<Round> rounds;
  for (int i = 0; i < 60; ++i) {
    const std::size_t n = i < 3 ? static_cast<std::size_t>(i) : rng() % 3000;
    rounds.push_back({static_cast<int>(rng() % ranks), random_values<double>(n, rng)});
  }
  cg.run([&](device::Card& card, Communicator& comm) {
    for (std::size_t i = 0; i < rounds.size(); ++i) {
      const auto& round = rounds[i];
      const std::size_t n = round.payload.size();
      std::vector<double> start(n, -static_cast<double>(comm.rank() + 1));
      auto buffer = device::to_device(comm.rank() == round.root ? round.payload : start,
                                      card.memory(), card.stream());
      comm.broadcast(buffer.data(), n, round.root, card.stream());
      GPUBOX_EXPECTS(device::to_host(buffer) == round.payload, "broadcast round ", i, " root ",
                     round.root, " rank ", comm.rank());
    }
  });
}

TEST_P(CollectivesTest, BarrierSeparatesPhases) {
  const int ranks = this->ranks();
  CardGroup cg(ranks);
  std::atomic<int> arrived{0};
  cg.run([&](device::Card& card, Communicator& comm) {
    for (int it = 1; it <= 200; ++it) {
      arrived.fetch_add(1);
      comm.barrier(card.stream());
      // Nobody may pass before all arrived, nor start the next round before all checked.
      const int seen = arrived.load();
      comm.barrier(card.stream());
      GPUBOX_EXPECTS(seen == it * ranks, "rank ", comm.rank(), " saw ", seen, " arrivals in round ",
                     it);
    }
  });
}

TEST_P(CollectivesTest, MixedCollectiveSequenceRepeated) {
  // The same seeded sequence of different collectives on every rank: slots and rendezvous
  // rounds are reused across kinds without stale state leaking between them.
  const int ranks = this->ranks();
  CardGroup cg(ranks);
  cg.run([&](device::Card& card, Communicator& comm) {
    std::mt19937_64 plan(77);  // same plan on every rank
    const int me = comm.rank();
    auto a = card.make_buffer<int64_t>(0);
    auto b = card.make_buffer<int64_t>(0);
    std::vector<std::size_t> send_counts(ranks), recv_counts(ranks);
    for (int it = 0; it < 300; ++it) {
      const std::size_t n = plan() % 64;
      switch (plan() % 4) {
        case 0: {  // all_reduce of (rank + 1) * i: sum = i * ranks * (ranks + 1) / 2
          std::vector<int64_t> host(n);
          for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<int64_t>((me + 1) * i);
          a = device::to_device(host, card.memory(), card.stream());
          comm.all_reduce_sum(a.data(), a.data(), n, card.stream());
          const auto got = device::to_host(a);
          for (std::size_t i = 0; i < n; ++i) {
            GPUBOX_EXPECTS(got[i] == static_cast<int64_t>(i) * ranks * (ranks + 1) / 2, "it ", it);
          }
          break;
        }
        case 1: {  // all_to_all_v: n + src + dst elements of value src from each src
          for (int p = 0; p < ranks; ++p) send_counts[p] = (n + me + p) % 5 == 0 ? 0 : n + me + p;
          comm.exchange_counts(send_counts.data(), recv_counts.data(), card.stream());
          std::size_t total_send = 0, total_recv = 0;
          for (int p = 0; p < ranks; ++p)
            total_send += send_counts[p], total_recv += recv_counts[p];
          a = device::to_device(std::vector<int64_t>(total_send, me), card.memory(), card.stream());
          b.resize_discard(total_recv);
          comm.all_to_all_v(a.data(), send_counts.data(), b.data(), recv_counts.data(),
                            card.stream());
          const auto got = device::to_host(b);
          std::size_t at = 0;
          for (int p = 0; p < ranks; ++p) {
            const std::size_t want = (n + p + me) % 5 == 0 ? 0 : n + p + me;
            GPUBOX_EXPECTS(recv_counts[p] == want, "it ", it);
            for (std::size_t j = 0; j < want; ++j) GPUBOX_EXPECTS(got[at++] == p, "it ", it);
          }
          break;
        }
        case 2: {  // broadcast from a plan-chosen root
          const int root = static_cast<int>(plan() % ranks);
          a = device::to_device(std::vector<int64_t>(n, me), card.memory(), card.stream());
          comm.broadcast(a.data(), n, root, card.stream());
          GPUBOX_EXPECTS(device::to_host(a) == std::vector<int64_t>(n, root), "it ", it);
          break;
        }
        default: {
          a = device::to_device(std::vector<int64_t>(n, me * 1000 + it), card.memory(),
                                card.stream());
          b.resize_discard(n * ranks);
          comm.all_gather(a.data(), b.data(), n, card.stream());
          const auto got = device::to_host(b);
          for (int p = 0; p < ranks; ++p) {
            for (std::size_t j = 0; j < n; ++j)
              GPUBOX_EXPECTS(got[p * n + j] == p * 1000 + it, "it ", it);
          }
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(CommGroup, SizeAndRanks) {
  GPUBOX_REQUIRE_CARDS(3);
  CardGroup cg(3);
  EXPECT_EQ(cg.group->size(), 3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(cg.group->at(r).rank(), r);
    EXPECT_EQ(cg.group->at(r).size(), 3);
  }
  EXPECT_THROW(cg.group->at(3), Error);
  EXPECT_THROW(make_in_process_group(0), Error);
  EXPECT_FALSE(cg.group->aborted());
}

TEST(CommGroup, SeveralTrainersNeedARendezvousStore) {
  GPUBOX_IN_PROCESS_ONLY("the NCCL group's message differs");
  GPUBOX_REQUIRE_CARDS(2);
  // Trainer 0 of 2: four cards in all, two here; without a store the trainers cannot meet
  // (gloo_communicator_test.cpp runs the groups that have one).
  auto cards = device::CardSet::from_list("0,1", /*trainer_id=*/0, /*trainer_count=*/2);
  try {
    make_group(cards);
    FAIL() << "make_group accepted cards of several trainers without a rendezvous store";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 cards of several trainers (2 here) needs a rendezvous"),
              std::string::npos)
        << e.what();
  }
}

TEST(CommGroup, SizeOfAndNames) {
  EXPECT_EQ(size_of(DataType::kFloat32), 4u);
  EXPECT_EQ(size_of(DataType::kFloat64), 8u);
  EXPECT_EQ(size_of(DataType::kInt32), 4u);
  EXPECT_EQ(size_of(DataType::kInt64), 8u);
  EXPECT_EQ(size_of(DataType::kUInt64), 8u);
  EXPECT_EQ(size_of(DataType::kUInt8), 1u);
  EXPECT_STREQ(name_of(DataType::kInt32), "int32");
  static_assert(data_type_of<float>() == DataType::kFloat32);
  static_assert(data_type_of<double>() == DataType::kFloat64);
  static_assert(data_type_of<int32_t>() == DataType::kInt32);
  static_assert(data_type_of<int64_t>() == DataType::kInt64);
  static_assert(data_type_of<uint64_t>() == DataType::kUInt64);
  static_assert(data_type_of<uint8_t>() == DataType::kUInt8);
}

}  // namespace
}  // namespace gpubox::comm
