// device::StepGraph (heterps/device/step_graph.hpp): a captured sequence of kernels, memsets,
// card and pinned copies and a collective across 2 cards, replayed, equals the same sequence run
// eagerly bit for bit (once, and N replays against N eager runs of an in-place iteration); a
// capture runs nothing; every operation a captured step may not contain is refused naming
// itself and the graph (an event wait unless the event was recorded in the same capture); a graph's
// work is counted as graph launches and nodes, not as launches; an abort of the group returns
// while a graph holds its collective.
#include <gtest/gtest.h>
#include <thrust/fill.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/macros.hpp"
#include "heterps/comm/teardown_thread.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/step_graph.hpp"
#include "tests/common/hang_watchdog.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace gpubox::comm {
namespace {

using comm_test::CardGroup;

// y[i] = a nonlinear function of x[i], the rank and a step-dependent seed held on the card.
struct Mix {
  const float* x;
  float* y;
  const float* seed;  // card memory: read when the kernel runs
  float rank;
  GPUBOX_HD void operator()(std::size_t i) const {
    const float v = x[i] * 1.0001f + rank * 0.37f + *seed;
    y[i] = v - 0.5f * v * v / (1.0f + v * v) + static_cast<float>(i % 7) * 1e-3f;
  }
};
struct Scale {
  float* x;
  float factor;
  GPUBOX_HD void operator()(std::size_t i) const { x[i] = x[i] * factor + 0.25f; }
};
struct Bump {
  float* seed;
  GPUBOX_HD void operator()(std::size_t) const { *seed += 0.125f; }
};

constexpr std::size_t kN = 5000;  // above the serial loop limit: OpenMP loops too

// One card's buffers for the sequence.
struct Buffers {
  Buffers(device::Card& card, int rank)
      : x(card.make_buffer<float>(kN)),
        y(card.make_buffer<float>(kN)),
        z(card.make_buffer<float>(kN)),
        seed(card.make_buffer<float>(1)),
        upload(kN),
        readback(kN) {
    for (std::size_t i = 0; i < kN; ++i) upload[i] = std::sin(0.01f * i + rank);
    for (std::size_t i = 0; i < kN; ++i) readback[i] = -1.0f;
    const std::vector<float> zero(1, 0.0f);
    device::copy_async(seed.data(), zero.data(), 1, card.stream());
    card.stream().synchronize();
  }
  device::device_buffer<float> x, y, z, seed;
  device::pinned_buffer<float> upload, readback;
};

// The sequence: upload (pinned -> card), kernel, memset, card copy, all-reduce across the
// group, kernels, readback (card -> pinned). In place on x (an iteration) and seed.
void sequence(device::Card& card, Communicator& comm, Buffers& b) {
  const device::Stream& stream = card.stream();
  device::copy_async(b.z.data(), b.upload.data(), kN, stream);
  device::parallel_for(stream, kN,
                       Mix{b.z.data(), b.y.data(), b.seed.data(), static_cast<float>(comm.rank())});
  device::memset_bytes_async(b.z.data(), 0, 16 * sizeof(float), stream);
  device::copy_async(b.z.data() + 16, b.y.data() + 16, kN - 16, stream);
  comm.all_reduce_sum(b.z.data(), b.z.data(), kN, stream);
  device::parallel_for(stream, kN, Mix{b.z.data(), b.x.data(), b.seed.data(), 1.0f});
  device::parallel_for(stream, kN, Scale{b.x.data(), 0.5f});
  device::parallel_for(stream, 1, Bump{b.seed.data()});
  device::copy_async(b.readback.data(), b.x.data(), kN, stream);
}

std::vector<float> host_copy(const device::pinned_buffer<float>& p) {
  return std::vector<float>(p.data(), p.data() + p.size());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(StepGraph, ReplayEqualsEagerBitForBitAcrossTwoCards) {
  GPUBOX_REQUIRE_CARDS(2);
  CardGroup g(2);
  std::vector<std::vector<float>> eager(2), replayed(2), x_eager(2), x_replayed(2);
  g.run([&](device::Card& card, Communicator& comm) {
    const int r = card.local_index();
    Buffers a(card, comm.rank());
    sequence(card, comm, a);
    comm.synchronize(card.stream(), "eager");
    eager[r] = host_copy(a.readback);
    x_eager[r] = device::to_host(a.x);

    Buffers b(card, comm.rank());
    device::StepGraph graph("test sequence");
    graph.capture(card.stream(), [&] { sequence(card, comm, b); });
    // A capture records; it runs nothing.
    comm.synchronize(card.stream(), "after capture");
    EXPECT_EQ(b.readback[0], -1.0f) << "the capture ran the readback";
    EXPECT_EQ(device::to_host(b.seed)[0], 0.0f) << "the capture ran a kernel";
    graph.replay(card.stream());
    comm.synchronize(card.stream(), "replay");
    replayed[r] = host_copy(b.readback);
    x_replayed[r] = device::to_host(b.x);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(same_bits(eager[r], replayed[r])) << "card " << r;
    EXPECT_TRUE(same_bits(x_eager[r], x_replayed[r])) << "card " << r;
  }
  // The collective did run: the cards' inputs differ, their all-reduced sums (and all after
  // them) do not.
  EXPECT_TRUE(same_bits(eager[0], eager[1]));
  EXPECT_TRUE(same_bits(replayed[0], replayed[1]));
}

// The iteration (x and the seed updated in place) captured once and replayed N times equals N
// eager runs; each replay counts one graph launch of the capture's nodes and no launch.
TEST(StepGraph, NReplaysEqualNEagerRuns) {
  GPUBOX_REQUIRE_CARDS(2);
  CardGroup g(2);
  constexpr int kRuns = 5;
  std::vector<std::vector<float>> eager(2), replayed(2);
  std::vector<device::DeviceCounts> replay_counts(2), capture_counts(2);
  std::vector<uint64_t> nodes(2);
  g.run([&](device::Card& card, Communicator& comm) {
    const int r = card.local_index();
    Buffers a(card, comm.rank());
    for (int i = 0; i < kRuns; ++i) sequence(card, comm, a);
    comm.synchronize(card.stream(), "eager");
    eager[r] = device::to_host(a.x);

    Buffers b(card, comm.rank());
    device::StepGraph graph("iteration");
    const device::DeviceCounts before = card.counts();
    graph.capture(card.stream(), [&] { sequence(card, comm, b); });
    capture_counts[r] = card.counts() - before;
    nodes[r] = graph.nodes();
    const device::DeviceCounts start = card.counts();
    for (int i = 0; i < kRuns; ++i) graph.replay(card.stream());
    replay_counts[r] = card.counts() - start;
    comm.synchronize(card.stream(), "replays");
    replayed[r] = device::to_host(b.x);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(same_bits(eager[r], replayed[r])) << "card " << r;
    // 4 kernels + 1 memset, 3 copies (2 pinned, 1 card), 1 collective.
    EXPECT_EQ(nodes[r], 9u);
    EXPECT_EQ(capture_counts[r].launches, 0u) << "a capture counts into its graph";
    EXPECT_EQ(capture_counts[r].collectives, 0u);
    EXPECT_EQ(capture_counts[r].graph_launches, 0u);
    EXPECT_EQ(replay_counts[r].graph_launches, static_cast<uint64_t>(kRuns));
    EXPECT_EQ(replay_counts[r].graph_nodes, 9u * kRuns);
    EXPECT_EQ(replay_counts[r].launches, 0u);
    EXPECT_EQ(replay_counts[r].pinned_copies, 0u);
    EXPECT_EQ(replay_counts[r].collectives, 0u);
  }
}

TEST(StepGraph, ContentsCountWhatTheCaptureEnqueued) {
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator& comm) {
    Buffers b(card, 0);
    device::StepGraph graph("contents");
    const device::DeviceCounts start = card.counts();
    graph.capture(card.stream(), [&] { sequence(card, comm, b); });
    // The card counts the capture (graph_captures), not what it recorded.
    const device::DeviceCounts on_card = card.counts() - start;
    EXPECT_EQ(on_card.graph_captures, 1u);
    EXPECT_EQ(on_card.launches + on_card.collectives + on_card.pinned_copies, 0u);
    graph.replay(card.stream());
    graph.replay(card.stream());
    EXPECT_EQ((card.counts() - start).graph_captures, 1u) << "a replay is no capture";
    comm.synchronize(card.stream(), "contents");
    const device::DeviceCounts& c = graph.contents();
    EXPECT_EQ(c.launches, 5u);
    EXPECT_EQ(c.pinned_copies, 2u);
    EXPECT_EQ(c.card_copies, 1u);
    EXPECT_EQ(c.collectives, 1u);
    EXPECT_EQ(c.host_syncs + c.allocations + c.pageable_copies, 0u);
    EXPECT_TRUE(graph.ready());
  });
}

// Each forbidden operation, tried inside a capture: refused naming itself and the graph; the
// capture is abandoned (nothing to replay) and the stream runs eagerly again.
void expect_refused(device::Card& card, const char* operation,
                    const std::function<void()>& forbidden) {
  device::StepGraph graph("refusal graph");
  device::device_buffer<float> out = card.make_buffer<float>(1);
  const uint64_t captures = card.counts().graph_captures;
  try {
    graph.capture(card.stream(), [&] {
      device::memset_bytes_async(out.data(), 0, sizeof(float), card.stream());
      forbidden();
    });
    ADD_FAILURE() << operation << " was not refused while capturing";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(operation), std::string::npos) << message;
    EXPECT_NE(message.find("refusal graph"), std::string::npos) << message;
  }
  EXPECT_FALSE(graph.ready()) << operation;
  EXPECT_EQ(card.counts().graph_captures, captures) << operation << ": a failed capture counts";
  EXPECT_FALSE(graph.capturing()) << operation;
  EXPECT_EQ(card.stream().capturing(), nullptr) << operation;
  EXPECT_FALSE(device::detail::thread_capturing()) << operation;
  EXPECT_THROW(graph.replay(card.stream()), Error) << operation;
  card.stream().synchronize();  // eager again: allowed
}

TEST(StepGraph, RefusesHostWaitsAllocationsPageableCopiesAndThrustNamingThem) {
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator& comm) {
    const device::Stream& stream = card.stream();
    device::device_buffer<float> buffer = card.make_buffer<float>(64);
    device::Event event(card.device(), nullptr);
    std::vector<float> pageable(64, 1.0f);
    expect_refused(card, "Stream::synchronize", [&] { stream.synchronize(); });
    expect_refused(card, "Stream::ready", [&] { (void)stream.ready(); });
    expect_refused(card, "Event::synchronize", [&] { event.synchronize(); });
    expect_refused(card, "Communicator::synchronize",
                   [&] { comm.synchronize(stream, "inside a capture"); });
    expect_refused(card, "barrier", [&] { comm.barrier(stream); });
    std::size_t send = 0, recv = 0;
    expect_refused(card, "exchange_counts", [&] { comm.exchange_counts(&send, &recv, stream); });
    expect_refused(card, "CardMemory::allocate", [&] { (void)card.make_buffer<float>(16); });
    expect_refused(card, "allocate_pinned", [&] { device::pinned_buffer<float> p(16); });
    expect_refused(card, "pageable copy",
                   [&] { device::copy_async(buffer.data(), pageable.data(), 64, stream); });
    expect_refused(card, "pageable copy", [&] { (void)device::to_host(buffer); });
    expect_refused(card, "a Thrust call", [&] {
      thrust::fill(device::exec_policy(stream), buffer.data(), buffer.data() + 64, 0.0f);
    });
    expect_refused(card, "ScratchArena::allocate", [&] { (void)card.scratch().allocate(256); });
  });
}

// Stream::wait while capturing follows CUDA's rule: a wait for an event recorded in the same
// capture is an edge inside the graph (allowed, counted in the graph's contents, the replay
// equal to eager); a wait for an event recorded outside the capture, or in another capture, is
// refused naming Stream::wait and the graph; a stream outside the capture may not wait for an
// event recorded inside it (a fork); and the host may not read an event recorded in a capture.
TEST(StepGraph, EventWaitsInsideACaptureFollowCudasRule) {
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator&) {
    const device::Stream& stream = card.stream();
    device::Event eager(card.device(), nullptr);
    eager.record(stream);
    expect_refused(card, "Stream::wait", [&] { stream.wait(eager); });

    // Recorded and waited for inside one capture: held.
    device::device_buffer<float> x = card.make_buffer<float>(4);
    device::memset_bytes_async(x.data(), 0, x.bytes(), stream);
    device::Event inside(card.device(), nullptr);
    device::StepGraph graph("event graph");
    graph.capture(stream, [&] {
      device::parallel_for(stream, 4, Scale{x.data(), 2.0f});
      inside.record(stream);
      stream.wait(inside);
      device::parallel_for(stream, 4, Scale{x.data(), 2.0f});
    });
    EXPECT_EQ(graph.contents().stream_waits, 1u);
    EXPECT_EQ(graph.nodes(), 2u);
    graph.replay(stream);
    EXPECT_EQ(device::to_host(x), std::vector<float>(4, 0.75f));  // (0 * 2 + .25) * 2 + .25
    // The host cannot read it: replays do not mark it.
    try {
      (void)inside.ready();
      ADD_FAILURE() << "an event recorded in a capture was read by the host";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Event::ready"), std::string::npos) << e.what();
    }
    EXPECT_THROW(inside.synchronize(), Error);
    // Nor does a later capture hold it (another capture), nor a stream outside any capture.
    expect_refused(card, "Stream::wait", [&] { stream.wait(inside); });
    try {
      card.copy_stream().wait(inside);
      ADD_FAILURE() << "an eager stream waited for an event of an ended capture";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Stream::wait"), std::string::npos) << e.what();
    }
    // A stream outside the open capture waiting for an event recorded in it: a fork, refused.
    device::StepGraph forked("fork graph");
    try {
      forked.capture(stream, [&] {
        inside.record(stream);
        card.copy_stream().wait(inside);
      });
      ADD_FAILURE() << "a fork out of a capture was allowed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Stream::wait"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fork graph"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(forked.ready());
    // An eager record makes the event the host's again.
    inside.record(stream);
    EXPECT_TRUE(inside.ready());
    stream.wait(inside);
  });
}

// A free cannot throw (destructors): the capture fails at its end, naming it.
TEST(StepGraph, AFreeWhileCapturingFailsTheCapture) {
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator&) {
    device::device_buffer<float> made = card.make_buffer<float>(16);
    device::pinned_buffer<float> pinned(16);
    for (const char* operation : {"CardMemory::deallocate", "free_pinned"}) {
      device::StepGraph graph("free graph");
      try {
        graph.capture(card.stream(), [&] {
          if (std::string(operation) == "free_pinned") {
            pinned = device::pinned_buffer<float>();
          } else {
            made.release();
          }
        });
        ADD_FAILURE() << operation << " while capturing was not reported";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(operation), std::string::npos) << e.what();
      }
      EXPECT_FALSE(graph.ready());
      EXPECT_EQ(card.stream().capturing(), nullptr);
    }
  });
}

TEST(StepGraph, MisuseIsRefused) {
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator&) {
    device::StepGraph first("first"), second("second");
    EXPECT_THROW(first.replay(card.stream()), Error);  // nothing captured
    EXPECT_THROW(first.end_capture(), Error);          // not capturing
    first.begin_capture(card.stream());
    try {
      second.begin_capture(card.stream());
      ADD_FAILURE() << "a second capture on the same thread was allowed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("first"), std::string::npos) << e.what();
    }
    first.end_capture();
    EXPECT_TRUE(first.ready());
    EXPECT_EQ(first.nodes(), 0u);
    first.replay(card.stream());  // an empty graph replays
    // Replayed only on the stream it was captured on.
    device::Stream other(card.device(), nullptr);
    EXPECT_THROW(first.replay(other), Error);
  });
}

// A captured all_to_all_v keeps the counts of its capture (NCCL's captured sends do): the host
// arrays may change before a replay.
TEST(StepGraph, CapturedAllToAllKeepsItsCounts) {
  GPUBOX_REQUIRE_CARDS(2);
  CardGroup g(2);
  std::vector<std::vector<float>> received(2);
  g.run([&](device::Card& card, Communicator& comm) {
    const int r = card.local_index();
    const device::Stream& stream = card.stream();
    std::vector<float> host = {10.0f * r, 10.0f * r + 1, 10.0f * r + 2, 10.0f * r + 3};
    device::device_buffer<float> send = device::to_device(host, card.memory(), stream);
    device::device_buffer<float> recv = card.make_buffer<float>(4);
    device::memset_bytes_async(recv.data(), 0, recv.bytes(), stream);
    std::size_t send_counts[2] = {2, 2};
    std::size_t recv_counts[2] = {2, 2};
    device::StepGraph graph("all_to_all");
    graph.capture(stream, [&] {
      comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, stream);
    });
    send_counts[0] = send_counts[1] = recv_counts[0] = recv_counts[1] = 0;
    graph.replay(stream);
    comm.synchronize(stream, "replay");
    received[r] = device::to_host(recv);
  });
  EXPECT_EQ(received[0], (std::vector<float>{0, 1, 10, 11}));
  EXPECT_EQ(received[1], (std::vector<float>{2, 3, 12, 13}));
}

// A failure aborts the group while a step graph that captured the group's collective still lives
// (its owner, a HeterComm or a trainer's composed step, is destroyed only as the failure unwinds,
// after the abort): abort() returns at once, and the group is destroyed once the graph is gone.
// NCCL's ncclCommAbort waits until every graph holding one of the communicator's collectives is
// destroyed: called inside abort(), it waited for a graph its own thread had yet to destroy
// (heter_comm_padded_test's wrong plan hung on one GPU). The captured collective is an
// all_to_all_v to the card itself, as HeterComm's on one card: NCCL runs a 1-rank reduction as a
// plain copy that no graph ties to the communicator, but a send and a receive make a kernel plan
// that the graph holds (so this test hangs an abort that waits for the graph on 1 GPU too).
// Bounded: a wait that does not return fails naming it, and the graph is then destroyed so that
// the abort can finish; an abort that never finishes aborts the binary, naming it. Then the group
// is destroyed: its teardown (on 1 card abort() returns before the only ncclCommAbort begins) must
// end, not be handed to the exit registry as one still running after the destructor's bound.
TEST(StepGraph, AbortReturnsWhileAGraphHoldsTheGroupsCollective) {
  constexpr auto kLimit = std::chrono::seconds(10);
  constexpr std::size_t kWords = 64;
  CardGroup g(1, kLimit);
  std::size_t lingering_before = 0;  // teardowns still running, once the graph is destroyed
  g.run([&](device::Card& card, Communicator& comm) {
    const device::Stream& stream = card.stream();
    device::device_buffer<float> send = card.make_buffer<float>(kWords);
    device::device_buffer<float> recv = card.make_buffer<float>(kWords);
    device::memset_bytes_async(send.data(), 0, send.bytes(), stream);
    const std::size_t counts[1] = {kWords};  // everything to and from the card itself
    std::future<void> abort;
    {
      device::StepGraph graph("held collective");
      graph.capture(stream,
                    [&] { comm.all_to_all_v(send.data(), counts, recv.data(), counts, stream); });
      graph.replay(stream);
      comm.synchronize(stream, "the graph's replay");
      abort = std::async(std::launch::async, [&] { g.group->abort("card 0 failed its step"); });
      EXPECT_EQ(abort.wait_for(kLimit), std::future_status::ready)
          << "CommGroup::abort still waits after " << kLimit.count()
          << " s while a step graph holds the group's collective: the graph's owner destroys it "
             "only after abort() returns, so a failure would hang";
    }  // the graph is destroyed: an abort still waiting for it can finish
    lingering_before = TeardownThread::lingering();
    {
      const ::gpubox::testing::HangWatchdog watchdog(
          "CommGroup::abort to return once the step graph holding its collective is destroyed",
          std::chrono::seconds(20));
      abort.get();
    }
    EXPECT_TRUE(g.group->aborted());
    const std::string error = [&] {
      try {
        comm.all_to_all_v(send.data(), counts, recv.data(), counts, stream);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    }();
    EXPECT_NE(error.find("card 0 failed its step"), std::string::npos) << error;
    stream.synchronize();
  });
  {
    const ::gpubox::testing::HangWatchdog watchdog(
        "the aborted group's destructor, once no step graph holds its collective",
        std::chrono::seconds(20));
    g.group.reset();
  }
  EXPECT_EQ(TeardownThread::lingering(), lingering_before)
      << "the aborted group's teardown still runs after its destructor gave up on it";
}

}  // namespace
}  // namespace gpubox::comm
