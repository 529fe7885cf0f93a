// Stream order on the cpu backend: GPUBOX_DEVICE_CHECK=defer (heterps/device/deferred.hpp) makes
// the bugs that only a GPU shows (a missing wait, a wait for the wrong event, an event recorded
// before the write, the host reading a pinned readback before its event passed, a copy that
// overwrites what another stream has not read) give wrong values on the cpu, while correct code
// gives the same values as eagerly. And an event the host reads, recorded inside a capture, is
// refused where it is recorded (both backends).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/step_graph.hpp"

namespace gpubox::device {
namespace {

struct Triple {
  int* x;
  GPUBOX_HD void operator()(std::size_t i) const { x[i] *= 3; }
};

void expect_error_naming(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << part << " in " << e.what();
    }
  }
}

// ---- an event the host reads, recorded inside a capture (both backends) ------------------------

TEST(CapturedEvents, AHostReadEventIsRefusedWhereItIsRecordedNamingTheGraph) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const Stream& stream = card.stream();
  device_buffer<int> x = card.make_buffer<int>(4);
  memset_bytes_async(x.data(), 0, x.bytes(), stream);
  Event host_read(card.device(), nullptr, EventTiming::kOff, EventReader::kHost);
  Event timed(card.device(), nullptr, EventTiming::kOn);
  StepGraph graph("status graph");
  for (Event* event : {&host_read, &timed}) {
    expect_error_naming(
        [&] {
          graph.capture(stream, [&] {
            parallel_for(stream, 4, Triple{x.data()});
            event->record(stream);
          });
        },
        {"Event::record", "the host reads", "status graph"});
    EXPECT_FALSE(graph.ready());
    EXPECT_TRUE(event->ready());  // the refused record left the event as it was
  }
  // An event streams wait for may still be recorded inside; the host's read of it fails, naming
  // the graph it was recorded in.
  Event ordering(card.device(), nullptr);
  graph.capture(stream, [&] {
    parallel_for(stream, 4, Triple{x.data()});
    ordering.record(stream);
  });
  expect_error_naming([&] { (void)ordering.ready(); }, {"Event::ready", "status graph"});
  ordering.record(stream);  // eager: the host's again
  EXPECT_NO_THROW(ordering.synchronize());
  EXPECT_TRUE(ordering.ready());
}

TEST(CapturedEvents, LateReadbackCommitInsideACaptureFailsAtTheCommit) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const Stream& stream = card.stream();
  LateReadback<int, int> ring(card, 2, 4);
  device_buffer<int> x = card.make_buffer<int>(4);
  memset_bytes_async(x.data(), 0, x.bytes(), stream);
  const auto check = [](const int&, const int*) {};
  StepGraph graph("step with its status");
  expect_error_naming(
      [&] {
        graph.capture(stream, [&] {
          ring.begin(check);
          ring.copy_on_card(stream, {{x.data(), 0, x.bytes()}});  // into the card's slot
          ring.commit(stream);
        });
      },
      {"LateReadback::commit", "step with its status"});
  ring.discard();  // what a failed step does (CardWorker::guarded)
  // Outside the capture the same step commits and drains.
  ring.begin(check);
  ring.copy_on_card(stream, {{x.data(), 0, x.bytes()}});
  ring.commit(stream);
  ring.drain(check);
}

#if !defined(GPUBOX_BACKEND_CUDA)
// ---- deferred execution (cpu backend) ---------------------------------------------------------

// (Used by the cpu-only tests below: nvcc warns of what a build never references.)
struct Double {
  const int* in;
  int* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = 2 * in[i]; }
};

std::vector<int> iota_from(int first, std::size_t n) {
  std::vector<int> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = first + static_cast<int>(i);
  return v;
}
std::vector<int> doubled(std::vector<int> v) {
  for (int& x : v) x *= 2;
  return v;
}

// Runs fn(card) on a fresh card made with deferred execution as asked, then restores the mode.
template <class Fn>
void on_card(bool defer, uint64_t seed, Fn&& fn) {
  const bool was = deferred_execution_enabled();
  const uint64_t was_seed = deferred_execution_seed();
  set_deferred_execution(defer, seed);
  try {
    CardSet cards = CardSet::from_list("0,1");
    cards.card(0).activate();
    fn(cards);
  } catch (...) {
    set_deferred_execution(was, was_seed);
    throw;
  }
  set_deferred_execution(was, was_seed);
}

enum class Plant { kNone, kMissingWait, kWrongEvent, kRecordBeforeWrite };

// The next batch goes up on the copy stream while the compute stream doubles it: the compute
// stream orders its kernel after the upload as `plant` says. Returns what the kernel computed.
std::vector<int> upload_then_double(Card& card, const std::vector<int>& values, Plant plant) {
  const Stream& compute = card.stream();
  const Stream& copy = card.copy_stream();
  const std::size_t n = values.size();
  pinned_buffer<int> staging(n);
  std::copy(values.begin(), values.end(), staging.data());
  device_buffer<int> x = card.make_buffer<int>(n);
  device_buffer<int> y = card.make_buffer<int>(n);
  memset_bytes_async(x.data(), 0, x.bytes(), compute);
  Event before(card.device());
  Event after(card.device());
  // Both streams start from a zeroed x (the copy stream waits for the memset).
  before.record(compute);
  copy.wait(before);
  before.record(copy);
  if (plant == Plant::kRecordBeforeWrite) after.record(copy);
  copy_async(x.data(), staging.data(), n, copy);
  if (plant != Plant::kRecordBeforeWrite) after.record(copy);
  if (plant == Plant::kWrongEvent) {
    compute.wait(before);
  } else if (plant != Plant::kMissingWait) {
    compute.wait(after);
  }
  parallel_for(compute, n, Double{x.data(), y.data()});
  std::vector<int> out = to_host(y);  // waits for the compute stream only
  copy.synchronize();
  return out;
}

TEST(DeferredExecution, EachPlantedOrderingBugGivesWrongValuesOnlyUnderTheCheck) {
  const std::vector<int> values = iota_from(1, 3000);  // a parallel loop and a serial one
  for (Plant plant : {Plant::kMissingWait, Plant::kWrongEvent, Plant::kRecordBeforeWrite}) {
    SCOPED_TRACE(static_cast<int>(plant));
    on_card(false, 0, [&](CardSet& cards) {
      EXPECT_EQ(upload_then_double(cards.card(0), values, plant), doubled(values));
    });
    on_card(true, 0, [&](CardSet& cards) {
      EXPECT_EQ(upload_then_double(cards.card(0), values, plant),
                std::vector<int>(values.size(), 0));  // the kernel read x before the upload
    });
  }
  on_card(true, 0, [&](CardSet& cards) {
    EXPECT_EQ(upload_then_double(cards.card(0), values, Plant::kNone), doubled(values));
  });
}

TEST(DeferredExecution, SeededOrdersKeepCorrectCodeRightAndCatchTheMissingWait) {
  const std::vector<int> values = iota_from(7, 100);
  int caught = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    on_card(true, seed, [&](CardSet& cards) {
      EXPECT_EQ(upload_then_double(cards.card(0), values, Plant::kNone), doubled(values)) << seed;
      if (upload_then_double(cards.card(0), values, Plant::kMissingWait) != doubled(values))
        ++caught;
    });
  }
  EXPECT_GT(caught, 0);
  EXPECT_LT(caught, 16);  // the seeds vary the order: some run the upload ahead
}

// The host reads a pinned readback: after its event passed (right), or at once (the plant).
std::vector<int> read_back(Card& card, const std::vector<int>& values, bool wait_first) {
  const Stream& compute = card.stream();
  const std::size_t n = values.size();
  device_buffer<int> x = to_device(values, card.memory(), compute);
  device_buffer<int> y = card.make_buffer<int>(n);
  parallel_for(compute, n, Double{x.data(), y.data()});
  pinned_buffer<int> host(n);
  std::fill(host.data(), host.data() + n, 0);
  Event done(card.device(), nullptr, EventTiming::kOff, EventReader::kHost);
  copy_async(host.data(), y.data(), n, compute);
  done.record(compute);
  if (wait_first && !done.ready()) done.synchronize();
  std::vector<int> seen(host.data(), host.data() + n);
  compute.synchronize();
  return seen;
}

TEST(DeferredExecution, TheHostReadingAPinnedReadbackBeforeItsEventSeesStaleData) {
  const std::vector<int> values = iota_from(-5, 64);
  on_card(true, 0, [&](CardSet& cards) {
    EXPECT_EQ(read_back(cards.card(0), values, true), doubled(values));
    EXPECT_EQ(read_back(cards.card(0), values, false), std::vector<int>(values.size(), 0));
  });
  on_card(false, 0, [&](CardSet& cards) {
    EXPECT_EQ(read_back(cards.card(0), values, false), doubled(values));
  });
}

// The compute stream reads x; the copy stream then refills x with the next batch, after the
// read's event (right) or not (the plant); the host waits for the upload (to refill staging).
std::vector<int> refill_after_read(Card& card, const std::vector<int>& first,
                                   const std::vector<int>& second, bool wait_for_read) {
  const Stream& compute = card.stream();
  const Stream& copy = card.copy_stream();
  const std::size_t n = first.size();
  device_buffer<int> x = to_device(first, card.memory(), compute);
  device_buffer<int> y = card.make_buffer<int>(n);
  parallel_for(compute, n, Double{x.data(), y.data()});
  Event read(card.device());
  read.record(compute);
  pinned_buffer<int> staging(n);
  std::copy(second.begin(), second.end(), staging.data());
  if (wait_for_read) copy.wait(read);
  copy_async(x.data(), staging.data(), n, copy);
  copy.synchronize();
  return to_host(y);
}

TEST(DeferredExecution, ACopyOverwritingWhatAnotherStreamHasNotReadIsSeen) {
  const std::vector<int> first = iota_from(1, 32);
  const std::vector<int> second = iota_from(100, 32);
  on_card(true, 0, [&](CardSet& cards) {
    EXPECT_EQ(refill_after_read(cards.card(0), first, second, true), doubled(first));
    EXPECT_EQ(refill_after_read(cards.card(0), first, second, false), doubled(second));
  });
}

TEST(DeferredExecution, AWaitForAPeerCardsEventRunsThatStreamThroughTheRecordOnly) {
  on_card(true, 0, [&](CardSet& cards) {
    Card& a = cards.card(0);
    Card& b = cards.card(1);
    const std::vector<int> values = iota_from(3, 16);
    pinned_buffer<int> staging(16);
    std::copy(values.begin(), values.end(), staging.data());
    device_buffer<int> x = a.make_buffer<int>(16);
    device_buffer<int> later = a.make_buffer<int>(16);
    device_buffer<int> y = b.make_buffer<int>(16);
    memset_bytes_async(later.data(), 0, later.bytes(), a.stream());
    a.stream().synchronize();
    copy_async(x.data(), staging.data(), 16, a.stream());
    Event copied(a.device());
    copied.record(a.stream());
    copy_async(later.data(), staging.data(), 16, a.stream());  // after the record
    b.stream().wait(copied);
    parallel_for(b.stream(), 16, Double{x.data(), y.data()});
    b.stream().synchronize();
    // cpu: card memory is host memory, read here without a copy to see what has run.
    EXPECT_EQ(std::vector<int>(y.data(), y.data() + 16), doubled(values));
    EXPECT_EQ(std::vector<int>(later.data(), later.data() + 16), std::vector<int>(16, 0));
    EXPECT_FALSE(a.stream().ready());  // pending, then it runs (the card went on)
    EXPECT_TRUE(a.stream().ready());
    EXPECT_EQ(std::vector<int>(later.data(), later.data() + 16), values);
  });
}

// A poll lag of n: the n-th poll that finds a stream's work pending runs it (the ones before
// answer false and leave it), counted from the last time the stream's work ran, whatever ran it
// (a poll, a synchronize); stream and event polls count alike. The default lag is 1.
TEST(DeferredExecution, APollLagOfNRunsPendingWorkAtItsNthPollSinceTheStreamLastRan) {
  EXPECT_EQ(deferred_poll_lag(), 1u);
  EXPECT_THROW(set_deferred_poll_lag(0), Error);
  constexpr unsigned kLag = 3;
  set_deferred_poll_lag(kLag);
  struct Restore {
    ~Restore() { set_deferred_poll_lag(1); }
  } restore;
  on_card(true, 0, [&](CardSet& cards) {
    const Stream& stream = cards.card(0).stream();
    int ran = 0;
    // `polls` polls that find the work pending: only the last runs it; then the stream is idle.
    const auto expect_runs_at_poll = [&](unsigned polls, const std::function<bool()>& poll) {
      const int before = ran;
      for (unsigned i = 1; i <= polls; ++i) {
        EXPECT_FALSE(poll()) << "poll " << i;
        EXPECT_EQ(ran, before + (i == polls ? 1 : 0)) << "poll " << i << " of " << polls;
      }
      EXPECT_TRUE(poll());
      EXPECT_EQ(ran, before + 1);
    };
    const auto stream_poll = [&] { return stream.ready(); };
    enqueue(stream, "count", [&] { ++ran; });
    expect_runs_at_poll(kLag, stream_poll);
    // Polled once, then run by a synchronize: the next work is kLag polls behind again, not
    // kLag - 1 (the count restarts when the stream's work runs).
    enqueue(stream, "count", [&] { ++ran; });
    EXPECT_FALSE(stream.ready());
    stream.synchronize();
    EXPECT_EQ(ran, 2);
    enqueue(stream, "count", [&] { ++ran; });
    expect_runs_at_poll(kLag, stream_poll);
    // An event's polls count the same, and run the stream through its record only.
    enqueue(stream, "count", [&] { ++ran; });
    Event done(cards.card(0).device(), nullptr, EventTiming::kOff, EventReader::kHost);
    done.record(stream);
    enqueue(stream, "after the record", [&] { ran += 100; });
    expect_runs_at_poll(kLag, [&] { return done.ready(); });
    EXPECT_FALSE(stream.ready());  // the work after the record: a fresh count of kLag polls
    EXPECT_EQ(ran, 4);
    // A lag of 1 (the default): the first poll runs it.
    set_deferred_poll_lag(1);
    EXPECT_FALSE(stream.ready());
    EXPECT_EQ(ran, 104);
    EXPECT_TRUE(stream.ready());
  });
}

TEST(DeferredExecution, CorrectCodeKeepsCudasSemantics) {
  on_card(true, 0, [&](CardSet& cards) {
    Card& card = cards.card(0);
    const Stream& stream = card.stream();
    const std::vector<int> values = iota_from(1, 8);
    // A copy from pageable memory takes its source when enqueued.
    std::vector<int> source = values;
    device_buffer<int> x = card.make_buffer<int>(8);
    copy_async(x.data(), source.data(), 8, stream);
    std::fill(source.begin(), source.end(), -1);
    EXPECT_EQ(to_host(x), values);
    // A card free is ordered on its stream: work enqueued before it still reads the block.
    device_buffer<int> y = card.make_buffer<int>(8);
    {
      device_buffer<int> in = to_device(values, card.memory(), stream);
      parallel_for(stream, 8, Double{in.data(), y.data()});
    }
    EXPECT_EQ(to_host(y), doubled(values));
    // A replay is enqueued like any work, with the nodes of its capture.
    StepGraph graph("deferred graph");
    graph.capture(stream, [&] { parallel_for(stream, 8, Triple{x.data()}); });
    graph.replay(stream);
    graph.capture(stream, [&] { parallel_for(stream, 8, Double{x.data(), x.data()}); });
    EXPECT_FALSE(stream.ready());  // the replay was pending (it runs now, as captured first)
    std::vector<int> tripled = values;
    for (int& v : tripled) v *= 3;
    EXPECT_EQ(to_host(x), tripled);
    // Timed events: seconds_since needs both passed (CUDA's cudaErrorNotReady otherwise).
    Event begin(card.device(), nullptr, EventTiming::kOn);
    Event end(card.device(), nullptr, EventTiming::kOn);
    begin.record(stream);
    parallel_for(stream, 8, Triple{x.data()});
    end.record(stream);
    EXPECT_THROW((void)end.seconds_since(begin), Error);
    end.synchronize();
    EXPECT_GE(end.seconds_since(begin), 0.0);
  });
}

TEST(DeferredExecution, AnErrorInDeferredWorkSurfacesWhereItRunsNamingIt) {
  on_card(true, 0, [&](CardSet& cards) {
    const Stream& stream = cards.card(0).stream();
    enqueue(stream, "planted failure", [] { GPUBOX_FAIL("planted"); });
    expect_error_naming([&] { stream.synchronize(); },
                        {"deferred planted failure on card 0's compute stream", "planted"});
    stream.synchronize();  // the failed work does not run again
  });
}
#endif

}  // namespace
}  // namespace gpubox::device
