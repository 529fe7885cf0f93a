// HostCallWorkers, CallWindow and pipelined_chunks (heterps/pass/host_call_workers.hpp): the pull
// of begin_pass and of a staging in chunks on threads made once, against a serial reference of
// the same chunks (what the thread-per-chunk version gave): the same rows, the same chunks
// finished in order, 0, 1, n and n+1 chunks, a chunk that fails or throws, a finish that
// throws. Host code alone; part of the pass_manager_test binary.
#include "heterps/pass/host_call_workers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/thread_priority.hpp"

namespace gpubox::pass {
namespace {

using Range = std::pair<std::size_t, std::size_t>;

// A row per key: what a pull of keys [b, e) writes (a value of the key alone).
float row_of(std::size_t key) { return static_cast<float>(key * 7 + 3); }

// What a run of pipelined_chunks did: the rows written, the chunks finished (in the order
// finish saw them), the most chunks running at once and any chunk still running at the end.
struct ChunkedPull {
  Status status;
  std::vector<float> rows;
  std::vector<Range> finished;
  int most_running = 0;
  int running_after = 0;
  std::vector<Range> started;
};

// pipelined_chunks over `n` keys; `fail` (a chunk's first key) makes that chunk fail with a
// Status, `throws` makes it throw.
ChunkedPull run_chunks(HostCallWorkers& workers, std::size_t n, std::size_t chunk, int in_flight,
                       std::size_t fail = SIZE_MAX, std::size_t throws = SIZE_MAX) {
  ChunkedPull run;
  run.rows.assign(n, -1.0f);
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::mutex started_mu;
  run.status = pipelined_chunks(
      workers, n, chunk, in_flight,
      [&](std::size_t b, std::size_t e) {
        {
          std::lock_guard<std::mutex> lock(started_mu);
          run.started.emplace_back(b, e);
        }
        const int now = ++running;
        for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // overlap the chunks
        Status st;
        if (b == throws) {
          --running;
          throw std::runtime_error("host tier down");
        }
        if (b == fail) {
          st = Status::Unavailable("server 2 refused");
        } else {
          for (std::size_t k = b; k < e; ++k) run.rows[k] = row_of(k);
        }
        --running;
        return st;
      },
      [&](std::size_t b, std::size_t e) { run.finished.emplace_back(b, e); });
  run.most_running = most.load();
  run.running_after = running.load();
  return run;
}

// The serial reference: chunk after chunk, each finished before the next.
std::vector<Range> chunks_of(std::size_t n, std::size_t chunk) {
  std::vector<Range> out;
  for (std::size_t b = 0; b < n; b += chunk) out.emplace_back(b, std::min(n, b + chunk));
  return out;
}

TEST(PipelinedChunks, SameRowsAndChunksAsSerialOnThreadsMadeOnce) {
  constexpr std::size_t kChunk = 5;
  constexpr int kInFlight = 3;
  HostCallWorkers workers(4);
  EXPECT_EQ(workers.threads(), 4u);
  const std::uint64_t threads_before = HostCallWorkers::threads_started();
  // 0 keys, 1 key (1 chunk), 1, 2, n (kInFlight) and n+1 chunks, the last chunk full or short.
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, kChunk, kChunk + 1, 2 * kChunk, kInFlight * kChunk,
        kInFlight * kChunk + 1, (kInFlight + 1) * kChunk, std::size_t{97}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const ChunkedPull run = run_chunks(workers, n, kChunk, kInFlight);
    ASSERT_TRUE(run.status.ok()) << run.status.to_string();
    for (std::size_t k = 0; k < n; ++k) ASSERT_EQ(run.rows[k], row_of(k)) << "key " << k;
    EXPECT_EQ(run.finished, chunks_of(n, kChunk));
    EXPECT_EQ(run.started.size(), run.finished.size());
    EXPECT_LE(run.most_running, kInFlight);
  }
  // Many chunks overlapped on the workers, no thread made for them.
  EXPECT_GT(run_chunks(workers, 200, kChunk, kInFlight).most_running, 1);
  EXPECT_EQ(HostCallWorkers::threads_started(), threads_before);
}

// in_flight below 1 is 1; a chunk of 0 keys is 1 key.
TEST(PipelinedChunks, DegenerateWindowAndChunk) {
  HostCallWorkers workers(2);
  const ChunkedPull one = run_chunks(workers, 4, 0, 0);
  ASSERT_TRUE(one.status.ok());
  EXPECT_EQ(one.finished, chunks_of(4, 1));
  EXPECT_EQ(one.most_running, 1);
}

// A chunk that fails: its Status, naming the chunk; the chunks before it finished, none after;
// nothing started beyond the window past it and nothing left running.
TEST(PipelinedChunks, AFailingChunkStopsThePullAndIsNamed) {
  HostCallWorkers workers(3);
  constexpr std::size_t kChunk = 4;
  constexpr int kInFlight = 2;
  for (const bool throwing : {false, true}) {
    SCOPED_TRACE(throwing ? "throws" : "fails");
    const std::size_t bad = 3 * kChunk;  // the fourth chunk of 10
    const ChunkedPull run = throwing ? run_chunks(workers, 40, kChunk, kInFlight, SIZE_MAX, bad)
                                     : run_chunks(workers, 40, kChunk, kInFlight, bad);
    ASSERT_FALSE(run.status.ok());
    EXPECT_EQ(run.status.code(), throwing ? Status::Code::kInternal : Status::Code::kUnavailable);
    const std::string expected =
        throwing ? "keys [12, 16) of 40: host tier down" : "keys [12, 16) of 40: server 2 refused";
    EXPECT_EQ(run.status.message(), expected);
    EXPECT_EQ(run.finished, chunks_of(bad, kChunk));
    EXPECT_LE(run.started.size(), 3u + kInFlight);
    EXPECT_EQ(run.running_after, 0);
  }
}

// A finish that throws: the throw reaches the caller once no chunk runs (they write its rows).
TEST(PipelinedChunks, AThrowingFinishWaitsForTheChunksInFlight) {
  HostCallWorkers workers(4);
  std::atomic<int> running{0};
  std::atomic<int> done{0};
  EXPECT_THROW(pipelined_chunks(
                   workers, 40, 4, 4,
                   [&](std::size_t, std::size_t) {
                     ++running;
                     std::this_thread::sleep_for(std::chrono::milliseconds(2));
                     --running;
                     ++done;
                     return Status::OK();
                   },
                   [](std::size_t b, std::size_t) {
                     if (b == 4) throw std::runtime_error("insert failed");
                   }),
               std::runtime_error);
  EXPECT_EQ(running.load(), 0);
  EXPECT_GE(done.load(), 2);
  EXPECT_LE(done.load(), 5);  // chunk 1, then at most the 4 after it started
}

// The workers run every call submitted before they go; a window waits for its calls.
TEST(HostCallWorkers, RunEveryCallBeforeTheyGo) {
  std::atomic<int> ran{0};
  {
    HostCallWorkers workers(2);
    CallWindow window(workers, 8);
    for (int i = 0; i < 8; ++i) {
      window.submit([&ran] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++ran;
        return Status::OK();
      });
    }
    EXPECT_TRUE(window.full());
    EXPECT_TRUE(window.retire().ok());
    EXPECT_GE(ran.load(), 1);
  }
  EXPECT_EQ(ran.load(), 8);
}

// A chunk out of memory is ResourceExhausted (as the host table's own parallel calls report it),
// not Internal, and names its chunk.
TEST(PipelinedChunks, AChunkOutOfMemoryIsResourceExhausted) {
  HostCallWorkers workers(2);
  const Status st = pipelined_chunks(
      workers, 10, 4, 2,
      [](std::size_t b, std::size_t) -> Status {
        if (b == 4) throw std::bad_alloc();
        return Status::OK();
      },
      [](std::size_t, std::size_t) {});
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(st.message(), "keys [4, 8) of 10: out of memory");
}

// No thread is an error, not a pool whose calls never run; each thread adds its nice (at most
// 19) to what it inherited, the caller's stays.
TEST(HostCallWorkers, NoThreadIsAnErrorAndEachThreadLowersItself) {
  EXPECT_THROW(HostCallWorkers(0), Error);
  const int caller = thread_nice();
  for (const int nice : {0, 3}) {
    HostCallWorkers workers(2, nice);
    std::vector<std::future<Status>> calls;
    std::mutex mu;
    std::vector<int> seen;
    for (int i = 0; i < 6; ++i) {
      calls.push_back(workers.submit([&] {
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(thread_nice());
        return Status::OK();
      }));
    }
    for (auto& call : calls) EXPECT_TRUE(call.get().ok());
    for (const int n : seen) EXPECT_EQ(n, std::min(19, caller + nice));
  }
  EXPECT_EQ(thread_nice(), caller);
}

}  // namespace
}  // namespace gpubox::pass
