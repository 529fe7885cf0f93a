// The communicator's failure paths: abort wakes every blocked rank with the reason, a timeout
// names the collective and the missing ranks, disagreeing ranks get a clear error, and nothing
// hangs or crashes when a rank dies at a random point.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/group_aborted.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/memory.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace gpubox::comm {
namespace {

using comm_test::CardGroup;
using ::testing::HasSubstr;

// What each rank threw (empty: returned normally).
struct RankErrors {
  explicit RankErrors(int ranks) : messages(static_cast<std::size_t>(ranks)) {}
  void record(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    messages[rank] = what;
  }
  std::mutex mu;
  std::vector<std::string> messages;
};

// Runs body(card, comm) on every rank and records what each rank threw; returns the message
// run_on_cards rethrew ("" when nothing failed).
template <class Body>
std::string run_recording(CardGroup& cg, RankErrors& errors, Body body) {
  try {
    cg.run([&](device::Card& card, Communicator& comm) {
      try {
        body(card, comm);
      } catch (const std::exception& e) {
        errors.record(comm.rank(), e.what());
        throw;
      }
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

enum class Blocked { kAllReduce, kAllToAllV, kAllGather, kBroadcast, kBarrier, kExchangeCounts };

const char* collective_name(Blocked kind);

// One collective of kind `kind` over small buffers.
void call_collective(Blocked kind, device::Card& card, Communicator& comm) {
  const int ranks = comm.size();
  auto buffer = card.make_buffer<float>(static_cast<std::size_t>(ranks) * 8);
  std::vector<std::size_t> counts(ranks, 1), recv_counts(ranks, 1);
  switch (kind) {
    case Blocked::kAllReduce:
      comm.all_reduce_sum(buffer.data(), buffer.data(), 8, card.stream());
      break;
    case Blocked::kAllToAllV: {
      auto recv = card.make_buffer<float>(ranks);
      comm.all_to_all_v(buffer.data(), counts.data(), recv.data(), recv_counts.data(),
                        card.stream());
      break;
    }
    case Blocked::kAllGather: {
      auto send = card.make_buffer<float>(8);
      comm.all_gather(send.data(), buffer.data(), 8, card.stream());
      break;
    }
    case Blocked::kBroadcast:
      comm.broadcast(buffer.data(), 8, 0, card.stream());
      break;
    case Blocked::kBarrier:
      comm.barrier(card.stream());
      break;
    case Blocked::kExchangeCounts:
      comm.exchange_counts(counts.data(), recv_counts.data(), card.stream());
      break;
  }
  // The bounded wait every caller makes before reusing or freeing buffers (device rule 6); on
  // NCCL the blocked ranks wait here, in-process inside the collective.
  comm.synchronize(card.stream(), collective_name(kind));
}

const char* collective_name(Blocked kind) {
  switch (kind) {
    case Blocked::kAllReduce:
      return "all_reduce_sum";
    case Blocked::kAllToAllV:
      return "all_to_all_v";
    case Blocked::kAllGather:
      return "all_gather";
    case Blocked::kBroadcast:
      return "broadcast";
    case Blocked::kBarrier:
      return "barrier";
    case Blocked::kExchangeCounts:
      return "exchange_counts";
  }
  return "?";
}

class AbortTest : public ::testing::TestWithParam<std::tuple<int, Blocked>> {};

TEST_P(AbortTest, FailingRankWakesEveryBlockedRankWithTheReason) {
  const auto [ranks, kind] = GetParam();
  GPUBOX_REQUIRE_CARDS(ranks);
  // A long timeout: only the abort can end the wait.
  CardGroup cg(ranks, std::chrono::minutes(5));
  RankErrors errors(ranks);
  const int failing = ranks - 1;
  const std::string rethrown =
      run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
        call_collective(kind, card, comm);  // one good round first
        if (comm.rank() == failing) {
          // Give the peers time to block in the collective.
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          GPUBOX_FAIL("planted failure 4711");
        }
        call_collective(kind, card, comm);
      });
  EXPECT_THAT(rethrown, HasSubstr("planted failure 4711"));
  EXPECT_TRUE(cg.group->aborted());
  for (int r = 0; r < ranks; ++r) {
    EXPECT_THAT(errors.messages[r], HasSubstr("planted failure 4711")) << "rank " << r;
    if (r != failing) {
      EXPECT_THAT(errors.messages[r], HasSubstr("communicator aborted")) << "rank " << r;
      EXPECT_THAT(errors.messages[r], HasSubstr(collective_name(kind))) << "rank " << r;
      EXPECT_THAT(errors.messages[r], ::testing::Not(HasSubstr("timed out"))) << "rank " << r;
    }
  }
  // The abort is permanent: later collectives fail at once with the same reason.
  RankErrors later(ranks);
  run_recording(cg, later,
                [&](device::Card& card, Communicator& comm) { comm.barrier(card.stream()); });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_THAT(later.messages[r], HasSubstr("planted failure 4711")) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndCollectives, AbortTest,
    ::testing::Combine(::testing::Values(2, 3, 4, 8),
                       ::testing::Values(Blocked::kAllReduce, Blocked::kAllToAllV,
                                         Blocked::kAllGather, Blocked::kBroadcast,
                                         Blocked::kBarrier, Blocked::kExchangeCounts)),
    [](const auto& info) {
      return std::to_string(std::get<0>(info.param)) + "ranks_" +
             collective_name(std::get<1>(info.param));
    });

// A rank woken by the abort for another card's failure only tells of it: run_on_cards marks it
// told (CardsFailed::Failure::told), by the abort's type and whose reason it was, through the
// step and stream contexts that wrap it on the card's thread. An abort for anything else (the
// group's timeout) is a failure of its own, and so is an error of another type, whatever its
// words (before, the trainer matched "card R: <R's error>" in the text).
TEST(CommFailure, AnAbortForAnotherCardsFailureIsMarkedTold) {
  GPUBOX_REQUIRE_CARDS(2);
  auto failures_of = [](CardGroup& cg,
                        const std::function<void(device::Card&, Communicator&)>& fn) {
    try {
      cg.run(fn);
    } catch (const device::CardsFailed& e) {
      return e.failures();
    }
    ADD_FAILURE() << "no card failed";
    return std::vector<device::CardsFailed::Failure>{};
  };
  {
    CardGroup cg(2, std::chrono::minutes(5));
    const auto failed = failures_of(cg, [](device::Card& card, Communicator& comm) {
      comm.set_step(1, 4);
      if (comm.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // rank 0 blocks first
        GPUBOX_FAIL("planted failure 4711");
      }
      call_collective(Blocked::kAllReduce, card, comm);
    });
    ASSERT_EQ(failed.size(), 2u);
    EXPECT_THAT(failed[0].message, HasSubstr("communicator aborted"));
    EXPECT_THAT(failed[0].message, HasSubstr("card 1: planted failure 4711"));
    EXPECT_TRUE(failed[0].told) << failed[0].message;
    EXPECT_FALSE(failed[1].told) << failed[1].message;
  }
  {
    // The words of such an abort, thrown as a plain error: not told.
    CardGroup cg(2, std::chrono::minutes(5));
    const auto failed = failures_of(cg, [](device::Card&, Communicator& comm) {
      if (comm.rank() == 1) GPUBOX_FAIL("planted failure 4711");
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      GPUBOX_FAIL("communicator aborted (rank 0 in all_reduce_sum): card 1: planted failure 4711");
    });
    ASSERT_EQ(failed.size(), 2u);
    EXPECT_FALSE(failed[0].told) << failed[0].message;
    EXPECT_FALSE(failed[1].told) << failed[1].message;
  }
  {
    // Rank 1 never comes: rank 0's abort is the group's timeout, which no card told.
    CardGroup cg(2, std::chrono::milliseconds(250));
    const auto failed = failures_of(cg, [](device::Card& card, Communicator& comm) {
      if (comm.rank() == 0) call_collective(Blocked::kBarrier, card, comm);
    });
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].rank, 0);
    EXPECT_FALSE(failed[0].told) << failed[0].message;
  }
}

TEST(CommFailure, AbortFromAnotherThreadWakesRanks) {
  GPUBOX_REQUIRE_CARDS(4);
  CardGroup cg(4, std::chrono::minutes(5));
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    cg.group->abort("operator pressed stop");
  });
  RankErrors errors(4);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    // Ranks 0-2 block (rank 3 never comes), so only the external abort can free them.
    if (comm.rank() != 3) comm.barrier(card.stream());
  });
  aborter.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(errors.messages[r], HasSubstr("operator pressed stop")) << "rank " << r;
  }
  EXPECT_EQ(errors.messages[3], "");
}

TEST(CommFailure, TimeoutNamesTheCollectiveAndTheMissingRanks) {
  GPUBOX_IN_PROCESS_ONLY("it names the ranks that had not arrived");
  for (int ranks : {2, 4, 8}) {
    CardGroup cg(ranks, std::chrono::milliseconds(250));
    RankErrors errors(ranks);
    const int arriving = std::max(1, ranks - 2);  // the last two (or the last of two) never come
    std::atomic<int> ready{0};
    const std::string rethrown =
        run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
          if (comm.rank() >= arriving) return;
          auto buffer = card.make_buffer<double>(4);
          // Enter together, so on a busy machine no arriving rank is late enough to be listed.
          ready.fetch_add(1);
          while (ready.load() < arriving) std::this_thread::yield();
          comm.broadcast(buffer.data(), 4, 0, card.stream());
        });
    const std::string missing = ranks == 2 ? "rank(s) 1 of 2"
                                           : "rank(s) " + std::to_string(ranks - 2) + ", " +
                                                 std::to_string(ranks - 1) + " of " +
                                                 std::to_string(ranks);
    EXPECT_THAT(rethrown, HasSubstr("broadcast timed out"));
    EXPECT_THAT(rethrown, HasSubstr(missing + " had not arrived"));
    for (int r = 0; r < arriving; ++r) {
      EXPECT_THAT(errors.messages[r], HasSubstr("broadcast timed out"))
          << ranks << " ranks, rank " << r;
    }
    EXPECT_TRUE(cg.group->aborted());
  }
}

TEST(CommFailure, DisagreeingCountsInAllToAllVFailEveryRank) {
  GPUBOX_IN_PROCESS_ONLY("NCCL cannot see a peer's counts");
  const int ranks = 3;
  CardGroup cg(ranks);
  RankErrors errors(ranks);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    std::vector<std::size_t> send_counts(ranks, 2), recv_counts(ranks, 2);
    if (comm.rank() == 0) recv_counts[2] = 3;  // rank 2 sends 2
    auto send = card.make_buffer<int32_t>(2 * ranks);
    auto recv = card.make_buffer<int32_t>(2 * ranks + 1);
    comm.all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(),
                      card.stream());
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_THAT(errors.messages[r],
                HasSubstr("all_to_all_v on rank 0: expects 3 elements from rank 2, which sends 2"))
        << "rank " << r;
  }
}

TEST(CommFailure, RankFindingAMismatchWaitsForPeersStillCopyingItsBuffers) {
  GPUBOX_IN_PROCESS_ONLY("NCCL cannot see a mismatch");
  // Rank 0 detects the mismatch at its first (self) block and aborts while its peers are still
  // copying large blocks out of its send buffer. Unwinding rank 0 frees that buffer, so it must
  // wait for them; were it not to, the peers would read freed (unmapped) memory.
  const int ranks = 8;
  const std::size_t block = 1 << 18;  // 1 MiB of floats per peer
  CardGroup cg(ranks);
  RankErrors errors(ranks);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    std::vector<std::size_t> send_counts(ranks, block), recv_counts(ranks, block);
    if (comm.rank() == 0) recv_counts[0] = block + 1;
    auto send = card.make_buffer<float>(block * ranks);
    auto recv = card.make_buffer<float>(block * ranks + 1);
    device::memset_bytes_async(send.data(), 0, send.bytes(), card.stream());
    comm.all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(),
                      card.stream());
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_THAT(errors.messages[r],
                HasSubstr("expects " + std::to_string(block + 1) + " elements from rank 0"))
        << "rank " << r;
  }
}

TEST(CommFailure, DisagreeingAllReduceCountsFailEveryRank) {
  GPUBOX_IN_PROCESS_ONLY("NCCL cannot see a mismatch");
  CardGroup cg(2);
  RankErrors errors(2);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    auto buffer = card.make_buffer<float>(10);
    comm.all_reduce_sum(buffer.data(), buffer.data(), comm.rank() == 0 ? 10 : 9, card.stream());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors.messages[r], HasSubstr("all_reduce_sum on rank")) << r;
    EXPECT_THAT(errors.messages[r], HasSubstr("count 9")) << r;
  }
}

TEST(CommFailure, DifferentCollectivesAreAMismatch) {
  GPUBOX_IN_PROCESS_ONLY("NCCL cannot see a mismatch");
  CardGroup cg(2);
  RankErrors errors(2);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    if (comm.rank() == 0) {
      comm.barrier(card.stream());
    } else {
      auto buffer = card.make_buffer<uint8_t>(2);
      comm.broadcast(buffer.data(), 1, 0, card.stream());
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_THAT(errors.messages[r], HasSubstr("collective mismatch")) << r;
}

TEST(CommFailure, BadArgumentFailsThatRankAndWakesPeers) {
  GPUBOX_IN_PROCESS_ONLY("its message");
  CardGroup cg(3, std::chrono::minutes(5));
  RankErrors errors(3);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    auto buffer = card.make_buffer<int64_t>(4);
    comm.broadcast(buffer.data(), 4, comm.rank() == 1 ? 7 : 0, card.stream());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(errors.messages[r],
                HasSubstr("broadcast on rank 1: root 7 is not in this group of 3"))
        << r;
  }
}

TEST(CommFailure, UnknownDataTypeIsRejectedBeforeAnyCopy) {
  GPUBOX_IN_PROCESS_ONLY("its message");
  CardGroup cg(3, std::chrono::minutes(5));
  RankErrors errors(3);
  run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
    auto buffer = card.make_buffer<float>(4);
    const auto type = comm.rank() == 2 ? static_cast<DataType>(42) : DataType::kFloat32;
    comm.all_reduce_sum(buffer.data(), buffer.data(), 4, type, card.stream());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(errors.messages[r], HasSubstr("all_reduce_sum on rank 2: unknown data type 42"))
        << r;
  }
}

TEST(CommFailure, RankDyingAtRandomPointsNeverHangsOrCrashes) {
  GPUBOX_REQUIRE_CARDS(2);
  const int max_ranks = device::visible_gpus() < 0 ? 8 : std::min(8, device::visible_gpus());
  // Ranks run a mix of collectives over buffers they own; one rank throws at a random step.
  // Every rank must end with an error carrying the reason, and no rank may free a buffer a
  // peer still copies from (the abort drains the data phase first; ASan/TSan builds check).
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 30; ++trial) {
    const int ranks = 2 + static_cast<int>(rng() % (max_ranks - 1));
    const int victim = static_cast<int>(rng() % ranks);
    const int fail_at = static_cast<int>(rng() % 40);
    CardGroup cg(ranks, std::chrono::minutes(5));
    RankErrors errors(ranks);
    run_recording(cg, errors, [&](device::Card& card, Communicator& comm) {
      std::vector<float> host(4096, 1.0f);
      for (int step = 0; step < 40; ++step) {
        if (comm.rank() == victim && step == fail_at) GPUBOX_FAIL("victim ", victim, " died");
        // Fresh buffers each step, freed on unwind: a premature free would be a use-after-free.
        auto send = device::to_device(host, card.memory(), card.stream());
        auto recv = card.make_buffer<float>(host.size());
        comm.all_reduce_sum(send.data(), recv.data(), host.size(), card.stream());
        std::vector<std::size_t> counts(ranks, 4096 / ranks);
        comm.all_to_all_v(send.data(), counts.data(), recv.data(), counts.data(), card.stream());
        // Device rule 1: the next step allocates, so the collectives must be done first.
        comm.synchronize(card.stream(), "step");
      }
    });
    for (int r = 0; r < ranks; ++r) {
      EXPECT_THAT(errors.messages[r], HasSubstr("victim " + std::to_string(victim) + " died"))
          << "trial " << trial << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace gpubox::comm
