// The Gloo communicator (cpu backend): T trainers x C cards, each trainer a CardSet and a
// GlooGroup of its own as in T processes, meeting through a file rendezvous store, here run as
// threads of one test process over loopback TCP. Checked against oracles: float64 sums (and
// every rank bit-identical), exact integer sums that wrap, what each peer sent (all-to-all-v,
// all-gather, broadcast, counts); a trainer that never joins or fails mid-collective ends every
// other rank with an error within the timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace gpubox::comm {
namespace {

using ::testing::HasSubstr;

// A fresh folder for one job's store, removed afterwards.
struct StoreDir {
  StoreDir() {
    static std::atomic<int> next{0};
    path = std::filesystem::temp_directory_path() /
           ("gpubox_gloo_test_" + std::to_string(::getpid()) + "_" + std::to_string(next++));
    std::filesystem::remove_all(path);
  }
  ~StoreDir() { std::filesystem::remove_all(path); }
  std::string url() const { return "file://" + path.string(); }
  std::filesystem::path path;
};

// T trainers x C cards. Building it connects every group (the trainers concurrently, as their
// processes would).
struct Job {
  Job(int trainers, int cards, std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : store(open_rendezvous_store(dir.url())) {
    for (int t = 0; t < trainers; ++t) {
      sets.push_back(std::make_unique<device::CardSet>(
          device::CardSet::from_list(comm_test::card_list(cards), t, trainers)));
    }
    groups.resize(static_cast<std::size_t>(trainers));
    on_trainers([&](int t) { groups[t] = make_group(*sets[t], timeout, store.get()); });
  }

  int trainers() const { return static_cast<int>(sets.size()); }

  // fn(t) on one thread per trainer; rethrows the first error after joining.
  void on_trainers(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    std::mutex mu;
    std::string first;
    for (int t = 0; t < trainers(); ++t) {
      threads.emplace_back([&, t] {
        try {
          fn(t);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (first.empty()) first = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    if (!first.empty()) throw Error(first);
  }

  // fn(card, comm) on every card of every trainer (a card that throws aborts its group).
  void run(const std::function<void(device::Card&, Communicator&)>& fn) {
    on_trainers([&](int t) {
      sets[t]->run_on_cards(
          [&](device::Card& card) { fn(card, groups[t]->at(card.local_index())); },
          [&](const std::string& why) { groups[t]->abort(why); });
    });
  }

  StoreDir dir;
  std::unique_ptr<RendezvousStore> store;
  std::vector<std::unique_ptr<device::CardSet>> sets;
  std::vector<std::unique_ptr<CommGroup>> groups;
};

struct Shape {
  int trainers;
  int cards;
};

class GlooTest : public ::testing::TestWithParam<Shape> {
 protected:
  int ranks() const { return GetParam().trainers * GetParam().cards; }
};

TEST_P(GlooTest, RanksAreGlobal) {
  Job job(GetParam().trainers, GetParam().cards);
  std::vector<int> seen(static_cast<std::size_t>(ranks()), 0);
  std::mutex mu;
  job.run([&](device::Card& card, Communicator& comm) {
    EXPECT_EQ(comm.size(), ranks());
    EXPECT_EQ(comm.rank(), card.rank());
    std::lock_guard<std::mutex> lock(mu);
    ++seen[comm.rank()];
  });
  for (int r = 0; r < ranks(); ++r) EXPECT_EQ(seen[r], 1) << "rank " << r;
}

TEST_P(GlooTest, AllReduceSumMatchesFloat64AndIsBitIdenticalEverywhere) {
  Job job(GetParam().trainers, GetParam().cards);
  const int n_ranks = ranks();
  std::mt19937_64 rng(77 + n_ranks);
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, static_cast<std::size_t>(n_ranks),
        static_cast<std::size_t>(n_ranks) + 1, std::size_t{5000}, std::size_t{300000}}) {
    for (bool in_place : {false, true}) {
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n_ranks));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (auto& input : inputs) {
        input.resize(n);
        for (auto& v : input) v = dist(rng);
      }
      std::vector<std::vector<float>> got(static_cast<std::size_t>(n_ranks));
      job.run([&](device::Card& card, Communicator& comm) {
        auto send = device::to_device(inputs[comm.rank()], card.memory(), card.stream());
        auto recv = card.make_buffer<float>(n);
        float* out = in_place ? send.data() : recv.data();
        comm.all_reduce_sum(send.data(), out, n, card.stream());
        comm.synchronize(card.stream(), "test");
        got[comm.rank()] = device::to_host(in_place ? send : recv);
        if (!in_place) {
          GPUBOX_EXPECTS(device::to_host(send) == inputs[comm.rank()],
                         "all_reduce_sum changed its send buffer");
        }
      });
      for (std::size_t i = 0; i < n; ++i) {
        double want = 0;
        for (const auto& input : inputs) want += input[i];
        ASSERT_NEAR(got[0][i], want, 1e-5) << "n=" << n << " element " << i;
      }
      for (int r = 1; r < n_ranks; ++r) {
        ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(got[r].data(), got[0].data(), n * sizeof(float)))
            << "rank " << r << " differs from rank 0, n=" << n;
      }
    }
  }
}

TEST_P(GlooTest, AllReduceSumIntegersWrapExactly) {
  Job job(GetParam().trainers, GetParam().cards);
  const int n_ranks = ranks();
  std::mt19937_64 rng(5);
  const std::size_t n = 1000;
  std::vector<std::vector<int32_t>> ints(static_cast<std::size_t>(n_ranks));
  std::vector<std::vector<uint8_t>> bytes(static_cast<std::size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      ints[r].push_back(static_cast<int32_t>(rng()));  // sums overflow: they must wrap
      bytes[r].push_back(static_cast<uint8_t>(rng()));
    }
  }
  std::vector<uint32_t> want_ints(n, 0);
  std::vector<uint8_t> want_bytes(n, 0);
  for (int r = 0; r < n_ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      want_ints[i] += static_cast<uint32_t>(ints[r][i]);
      want_bytes[i] = static_cast<uint8_t>(want_bytes[i] + bytes[r][i]);
    }
  }
  job.run([&](device::Card& card, Communicator& comm) {
    auto a = device::to_device(ints[comm.rank()], card.memory(), card.stream());
    auto b = device::to_device(bytes[comm.rank()], card.memory(), card.stream());
    comm.all_reduce_sum(a.data(), a.data(), n, card.stream());
    comm.all_reduce_sum(b.data(), b.data(), n, card.stream());
    comm.synchronize(card.stream(), "test");
    const auto got_ints = device::to_host(a);
    const auto got_bytes = device::to_host(b);
    for (std::size_t i = 0; i < n; ++i) {
      GPUBOX_EXPECTS(static_cast<uint32_t>(got_ints[i]) == want_ints[i], "int32 element ", i);
      GPUBOX_EXPECTS(got_bytes[i] == want_bytes[i], "uint8 element ", i);
    }
  });
}

TEST_P(GlooTest, AllToAllVWithEmptyPeersAndExchangeCounts) {
  Job job(GetParam().trainers, GetParam().cards);
  const int n_ranks = ranks();
  std::mt19937_64 rng(11 + n_ranks);
  constexpr int kIterations = 6;
  std::vector<std::vector<std::size_t>> counts(kIterations);  // [src * ranks + dst]
  for (int it = 0; it < kIterations; ++it) {
    for (int k = 0; k < n_ranks * n_ranks; ++k) {
      // Iteration 0: nothing moves; 1: only rank 0 sends; else random with empty peers.
      std::size_t c = rng() % 3 == 0 ? 0 : rng() % 200;
      if (it == 0 || (it == 1 && k / n_ranks != 0)) c = 0;
      counts[it].push_back(c);
    }
  }
  auto value = [](int it, int src, int dst, std::size_t j) {
    return (static_cast<uint64_t>(it) << 48) | (static_cast<uint64_t>(src) << 32) |
           (static_cast<uint64_t>(dst) << 16) | j;
  };
  job.run([&](device::Card& card, Communicator& comm) {
    const int me = comm.rank();
    std::vector<std::size_t> send_counts(n_ranks), recv_counts(n_ranks);
    for (int it = 0; it < kIterations; ++it) {
      std::vector<uint64_t> host_send, want;
      for (int dst = 0; dst < n_ranks; ++dst) {
        send_counts[dst] = counts[it][me * n_ranks + dst];
        for (std::size_t j = 0; j < send_counts[dst]; ++j)
          host_send.push_back(value(it, me, dst, j));
      }
      for (int src = 0; src < n_ranks; ++src) {
        for (std::size_t j = 0; j < counts[it][src * n_ranks + me]; ++j)
          want.push_back(value(it, src, me, j));
      }
      comm.exchange_counts(send_counts.data(), recv_counts.data(), card.stream());
      for (int src = 0; src < n_ranks; ++src) {
        GPUBOX_EXPECTS(recv_counts[src] == counts[it][src * n_ranks + me], "iteration ", it,
                       ": rank ", me, " got count ", recv_counts[src], " from ", src);
      }
      auto send = device::to_device(host_send, card.memory(), card.stream());
      auto recv = card.make_buffer<uint64_t>(want.size());
      comm.all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(),
                        card.stream());
      comm.synchronize(card.stream(), "test");
      GPUBOX_EXPECTS(device::to_host(recv) == want, "iteration ", it, ": rank ", me,
                     " received other elements than its peers sent");
    }
    // What crossed to other trainers' ranks: the counts themselves and the elements.
    const int cards = GetParam().cards;
    uint64_t crossed = 0;
    for (int it = 0; it < kIterations; ++it) {
      for (int dst = 0; dst < n_ranks; ++dst) {
        if (dst / cards != me / cards) {
          crossed += sizeof(uint64_t) * (1 + counts[it][me * n_ranks + dst]);
        }
      }
    }
    GPUBOX_EXPECTS(comm.bytes_to_other_processes() == crossed, "rank ", me, " counted ",
                   comm.bytes_to_other_processes(), " bytes to other trainers, sent ", crossed);
  });
}

TEST_P(GlooTest, AllGatherInPlaceAndBroadcastFromEveryRoot) {
  Job job(GetParam().trainers, GetParam().cards);
  const int n_ranks = ranks();
  job.run([&](device::Card& card, Communicator& comm) {
    const int me = comm.rank();
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{33}}) {
      for (bool in_place : {false, true}) {
        std::vector<double> mine(count);
        for (std::size_t j = 0; j < count; ++j) mine[j] = me * 1000.0 + j;
        auto recv = card.make_buffer<double>(count * n_ranks);
        auto send = device::to_device(mine, card.memory(), card.stream());
        double* block = recv.data() + static_cast<std::size_t>(me) * count;
        if (in_place) device::copy_async(block, send.data(), count, card.stream());
        comm.all_gather(in_place ? block : send.data(), recv.data(), count, card.stream());
        comm.synchronize(card.stream(), "test");
        const auto got = device::to_host(recv);
        for (int r = 0; r < n_ranks; ++r) {
          for (std::size_t j = 0; j < count; ++j) {
            GPUBOX_EXPECTS(got[r * count + j] == r * 1000.0 + j, "all_gather block ", r);
          }
        }
      }
    }
    for (int root = 0; root < n_ranks; ++root) {
      std::vector<int64_t> values(17, me == root ? 100 + root : -1);
      auto buffer = device::to_device(values, card.memory(), card.stream());
      comm.broadcast(buffer.data(), values.size(), root, card.stream());
      comm.barrier(card.stream());
      for (int64_t v : device::to_host(buffer)) {
        GPUBOX_EXPECTS(v == 100 + root, "broadcast from ", root, " gave ", v, " on ", me);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Shapes, GlooTest, ::testing::Values(Shape{2, 1}, Shape{2, 2}, Shape{3, 1}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.trainers) + "x" +
                                  std::to_string(info.param.cards);
                         });

// Rank r of trainer 0 failed in the second all-reduce: inside it (the closed socket or the
// timeout), or, when it came late, at its entry, its group aborted by the other local rank
// that had failed inside it first (the abort's reason is that rank's error).
::testing::Matcher<const std::string&> failed_in_all_reduce(int r) {
  return ::testing::AnyOf(
      HasSubstr("all_reduce_sum on card rank " + std::to_string(r)),
      HasSubstr("communicator aborted (rank " + std::to_string(r) + " in all_reduce_sum)"));
}

TEST(GlooFailure, TrainerThatNeverJoinsIsNamedWithinTheTimeout) {
  StoreDir dir;
  auto store = open_rendezvous_store(dir.url());
  // Trainer 0 of 2 alone: trainer 1's ranks (2, 3) never publish their addresses.
  auto cards = device::CardSet::from_list("0,1", 0, 2);
  const auto start = std::chrono::steady_clock::now();
  try {
    make_group(cards, std::chrono::milliseconds(500), store.get());
    FAIL() << "a group with a missing trainer was made";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("never set"));
    EXPECT_THAT(e.what(), HasSubstr("gloo/"));
    EXPECT_THAT(e.what(), HasSubstr("trainer r / 2"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// A trainer whose peer told its failure (gpubox_train's job/failed key, read by peer_failure)
// ends at once with it, where it waited the whole timeout; an address that does not resolve or
// is not this machine's is refused naming POD_IP (Gloo crashed on the first, no message).
TEST(GlooFailure, AToldFailureEndsTheWaitAndABadAddressIsNamed) {
  StoreDir dir;
  auto store = open_rendezvous_store(dir.url());
  auto cards = device::CardSet::from_list("0", 0, 2);
  int looks = 0;
  const PeerFailure told = [&looks] {
    return ++looks < 3 ? std::string() : std::string("trainer 1 of the job failed: its POD_IP");
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    make_group(cards, std::chrono::seconds(60), store.get(), "127.0.0.1", told);
    FAIL() << "a group with a failed trainer was made";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the Gloo group could not form: trainer 1 of the job failed: "
                                    "its POD_IP"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const std::string host : {"nohost.invalid", "192.0.2.1"}) {
    StoreDir other;
    auto other_store = open_rendezvous_store(other.url());
    try {
      make_group(cards, std::chrono::seconds(60), other_store.get(), host);
      FAIL() << host;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("this trainer's address '" + host + "' (POD_IP, or GPUBOX_POD_IP)"));
    }
  }
}

// Two trainers of 2 cards; trainer 1's card 0 (rank 2) fails between two all-reduces, every
// other rank enters the second one. Returns each rank's error.
std::vector<std::string> run_job_whose_rank_2_fails(std::chrono::milliseconds timeout) {
  Job job(2, 2, timeout);
  std::vector<std::string> errors(4);
  std::mutex mu;
  EXPECT_THROW(job.run([&](device::Card& card, Communicator& comm) {
    try {
      std::vector<float> values(64, 1.0f);
      auto buffer = device::to_device(values, card.memory(), card.stream());
      comm.all_reduce_sum(buffer.data(), buffer.data(), values.size(), card.stream());
      comm.synchronize(card.stream(), "step 0");
      if (comm.rank() == 2) GPUBOX_FAIL("injected failure on rank 2");
      comm.all_reduce_sum(buffer.data(), buffer.data(), values.size(), card.stream());
      comm.synchronize(card.stream(), "step 1");
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors[comm.rank()] = e.what();
      throw;
    }
  }),
               Error);
  return errors;
}

TEST(GlooFailure, FailingTrainerEndsEveryRankWithAnErrorWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> errors =
      run_job_whose_rank_2_fails(std::chrono::milliseconds(1500));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_THAT(errors[2], HasSubstr("injected failure"));
  // Trainer 0's ranks: their collective with the failed trainer ends (its timeout or a closed
  // socket); rank 3, trainer 1's other card, either sees its group's abort with the reason or,
  // already inside the collective, its timeout.
  for (int r : {0, 1}) EXPECT_THAT(errors[r], failed_in_all_reduce(r)) << "rank " << r;
  EXPECT_THAT(errors[3], ::testing::AnyOf(HasSubstr("injected failure on rank 2"),
                                          HasSubstr("all_reduce_sum on card rank 3")));
}

// The same failure under a long timeout: trainer 1's abort closes the connections of its ranks
// that are not inside a collective (rank 2, which failed), so trainer 0's ranks, waiting on rank
// 2 inside the all-reduce, fail at once on the closed connection instead of at the 20 s timeout
// (they timed out before: "Timed out waiting 1500ms", with the timeout above).
TEST(GlooFailure, AnAbortClosesItsConnectionsSoPeersFailAtOnce) {
  const std::vector<std::string> errors = run_job_whose_rank_2_fails(std::chrono::seconds(20));
  for (int r : {0, 1}) {
    EXPECT_THAT(errors[r], failed_in_all_reduce(r)) << "rank " << r;
    EXPECT_THAT(errors[r], HasSubstr(" by peer")) << "rank " << r;  // reset, or closed
    EXPECT_THAT(errors[r], ::testing::Not(HasSubstr("Timed out"))) << "rank " << r;
  }
}

// ---- the file store ----------------------------------------------------------------------

TEST(FileStore, SetGetWaitAndBounds) {
  StoreDir dir;
  auto store = open_rendezvous_store(dir.url());
  EXPECT_EQ(store->describe(), dir.url());
  store->set("a/b", {'x', 'y'});
  store->set("empty", {});
  EXPECT_EQ(store->get("a/b", std::chrono::milliseconds(0)), (std::vector<char>{'x', 'y'}));
  EXPECT_TRUE(store->get("empty", std::chrono::milliseconds(0)).empty());
  store->wait({"a/b", "empty"}, std::chrono::milliseconds(0));
  // A key set later by another thread is waited for.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store->set("late", {'1'});
  });
  EXPECT_EQ(store->get("late", std::chrono::seconds(10)), (std::vector<char>{'1'}));
  late.join();
  try {
    store->wait({"a/b", "missing/1", "missing/2"}, std::chrono::milliseconds(20));
    FAIL() << "waiting for unset keys returned";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 of 3 keys"));
    EXPECT_THAT(e.what(), HasSubstr("missing/1, missing/2"));
  }
  EXPECT_THROW(store->set("", {}), Error);
  EXPECT_THROW(store->set("bad key", {}), Error);
  EXPECT_THROW(store->set("../escape", {}), Error);
  EXPECT_THROW(store->set(std::string(201, 'k'), {}), Error);
  EXPECT_THROW(store->set("big", std::vector<char>(RendezvousStore::kMaxValueBytes + 1)), Error);
  store->set("big", std::vector<char>(RendezvousStore::kMaxValueBytes));
}

TEST(FileStore, UrlsAreChecked) {
  EXPECT_THROW(open_rendezvous_store("tcp://host:1"), Error);
  EXPECT_THROW(open_rendezvous_store("file://relative/dir"), Error);
  EXPECT_THROW(open_rendezvous_store("file://"), Error);
}

}  // namespace
}  // namespace gpubox::comm
