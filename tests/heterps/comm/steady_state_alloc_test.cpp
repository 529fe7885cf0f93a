// The in-process collectives allocate nothing in steady state: this binary replaces the global
// operator new with a per-thread counter and checks that rank threads, after a warm-up round,
// run every collective many times without one heap allocation.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <vector>

#include "heterps/comm/communicator.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace {
thread_local std::size_t t_allocations = 0;
}  // namespace

void* operator new(std::size_t bytes) {
  ++t_allocations;
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace gpubox::comm {
namespace {

TEST(SteadyState, CollectivesDoNotAllocate) {
  GPUBOX_IN_PROCESS_ONLY("it counts the in-process implementation's heap allocations");
  for (int ranks : {1, 2, 3, 8}) {
    comm_test::CardGroup cg(ranks);
    std::vector<std::size_t> allocations(ranks, 0);
    cg.run([&](device::Card& card, Communicator& comm) {
      const std::size_t n = 100000;  // 400 KB: the two-phase all-reduce at 3+ ranks
      auto a = card.make_buffer<float>(n * ranks);
      auto b = card.make_buffer<float>(n * ranks);
      std::vector<std::size_t> counts(ranks, n / 3), recv_counts(ranks, 0);
      auto round = [&] {
        comm.all_reduce_sum(a.data(), b.data(), n, card.stream());
        comm.all_reduce_sum(a.data(), a.data(), 100, card.stream());
        comm.exchange_counts(counts.data(), recv_counts.data(), card.stream());
        comm.all_to_all_v(a.data(), counts.data(), b.data(), recv_counts.data(), card.stream());
        comm.all_gather(a.data(), b.data(), n, card.stream());
        comm.broadcast(a.data(), n, ranks - 1, card.stream());
        comm.barrier(card.stream());
      };
      round();  // warm-up: lazily created thread state may allocate once
      const std::size_t before = t_allocations;
      for (int i = 0; i < 50; ++i) round();
      allocations[comm.rank()] = t_allocations - before;
    });
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(allocations[r], 0u) << "rank " << r << " of " << ranks;
    }
  }
}

TEST(SteadyState, CounterSeesAllocations) {
  // The replacement is in effect (otherwise the test above could not fail).
  const std::size_t before = t_allocations;
  auto* p = new std::vector<int>(10);
  delete p;
  EXPECT_GE(t_allocations - before, 2u);
}

}  // namespace
}  // namespace gpubox::comm
