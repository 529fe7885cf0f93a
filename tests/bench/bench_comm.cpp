// gpubox_bench comm: in-process communicator bandwidth next to a single-thread memcpy measured in
// the same run, so the figures say how close the collectives come to the machine's copy speed.
// With --trainers T (cpu backend) the ranks are T trainers' cards (ranks / T each, as T
// processes would hold them, here threads of one process) in one Gloo group over loopback TCP,
// next to one TCP stream over loopback measured in the same run.
//
// algbw = bytes per rank / time. busbw follows nccl-tests: all_reduce moves 2(R-1)/R of the
// buffer per rank, all_to_all_v (R-1)/R of it (its self block is a local copy).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/comm/rendezvous_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

constexpr int kLatencyRounds = 200;
constexpr std::size_t kSmallCount = 1024;  // floats: a 4 KB all-reduce

struct Figure {
  double seconds = 0;  // median per call
  double algbw = 0;    // GB/s
  double busbw = 0;    // GB/s
};

double memcpy_gbps(std::size_t bytes, int iterations) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> times;
  for (int i = 0; i < iterations + 2; ++i) {
    Timer timer;
    std::memcpy(dst.data(), src.data(), bytes);
    if (i >= 2) times.push_back(timer.seconds());
    src[i % bytes] = static_cast<char>(dst[(i * 7) % bytes] + 1);  // keep the copies observable
  }
  return static_cast<double>(bytes) / median(times) / 1e9;
}

// One TCP stream over loopback: `bytes` sent by one thread and read by another, median GB/s.
double loopback_tcp_gbps(std::size_t bytes, int iterations) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  GPUBOX_EXPECTS(listener >= 0, "loopback bench: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  GPUBOX_EXPECTS(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     ::listen(listener, 1) == 0 &&
                     ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
                 "loopback bench: cannot listen on 127.0.0.1");
  const int sender = ::socket(AF_INET, SOCK_STREAM, 0);
  GPUBOX_EXPECTS(
      sender >= 0 && ::connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0,
      "loopback bench: cannot connect");
  const int receiver = ::accept(listener, nullptr, nullptr);
  GPUBOX_EXPECTS(receiver >= 0, "loopback bench: accept() failed");
  std::vector<char> out(bytes, 1), in(bytes);
  std::vector<double> times;
  for (int i = 0; i < iterations + 2; ++i) {
    Timer timer;
    std::thread send_thread([&] {
      for (std::size_t sent = 0; sent < bytes;) {
        const ssize_t n = ::send(sender, out.data() + sent, bytes - sent, 0);
        if (n <= 0) return;
        sent += static_cast<std::size_t>(n);
      }
    });
    std::size_t got = 0;
    while (got < bytes) {
      const ssize_t n = ::recv(receiver, in.data() + got, bytes - got, 0);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    send_thread.join();
    GPUBOX_EXPECTS(got == bytes, "loopback bench: the stream ended early");
    if (i >= 2) times.push_back(timer.seconds());
  }
  ::close(receiver);
  ::close(sender);
  ::close(listener);
  return static_cast<double>(bytes) / median(times) / 1e9;
}

std::string card_list(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(i);
  return out;
}

// Runs fn(t) for every trainer t, each on a thread of its own; once all ended, fails with the
// first error one of them threw.
template <class Fn>
void on_trainers(int trainers, Fn&& fn) {
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  std::string first;
  std::mutex mu;
  for (int t = 0; t < trainers; ++t) {
    threads.emplace_back([&, t] {
      try {
        fn(t);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed.exchange(true)) first = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (failed) GPUBOX_FAIL(first);
}

// Rank 0's seconds per timed call (between barriers), one per round.
struct CollectiveTimes {
  std::vector<double> reduce, a2a, barrier, small_reduce;
};

// Card `card`'s part (rank comm.rank() of `ranks`) in every timed collective, after two untimed
// rounds each: all_reduce_sum and an even all_to_all_v of `count` floats, `iterations` rounds
// each; a barrier and an all_reduce_sum of kSmallCount floats, kLatencyRounds rounds each.
void time_card_collectives(device::Card& card, comm::Communicator& comm, std::size_t count,
                           int ranks, int iterations, CollectiveTimes* times) {
  auto send = card.make_buffer<float>(std::max(count, kSmallCount));
  auto recv = card.make_buffer<float>(std::max(count, kSmallCount));
  device::memset_bytes_async(send.data(), 0, send.bytes(), card.stream());
  device::memset_bytes_async(recv.data(), 0, recv.bytes(), card.stream());
  std::vector<std::size_t> counts(ranks, count / ranks);
  auto timed = [&](std::vector<double>& out, auto&& op, int rounds = 0) {
    for (int i = 0; i < (rounds > 0 ? rounds : iterations) + 2; ++i) {
      comm.barrier(card.stream());
      Timer timer;
      op();
      comm.barrier(card.stream());
      if (comm.rank() == 0 && i >= 2) out.push_back(timer.seconds());
    }
  };
  timed(times->reduce,
        [&] { comm.all_reduce_sum(send.data(), recv.data(), count, card.stream()); });
  timed(times->a2a, [&] {
    comm.all_to_all_v(send.data(), counts.data(), recv.data(), counts.data(), card.stream());
  });
  // Latency: what a collective costs when there is (almost) nothing to move.
  timed(
      times->barrier, [&] { comm.barrier(card.stream()); }, kLatencyRounds);
  timed(
      times->small_reduce,
      [&] { comm.all_reduce_sum(send.data(), recv.data(), kSmallCount, card.stream()); },
      kLatencyRounds);
}

// What gpubox_bench comm prints.
struct CommReport {
  int ranks, trainers, iterations, threads;
  std::size_t bytes;             // per rank
  double memcpy_rate, tcp_rate;  // GB/s (tcp_rate 0 for one trainer)
  Figure reduce, a2a;
  double barrier_us, small_reduce_us;
};

CommReport comm_report(const CollectiveTimes& times, int ranks, std::size_t bytes) {
  auto figure = [&](const std::vector<double>& seconds, double bus_factor) {
    Figure f;
    f.seconds = median(seconds);
    f.algbw = static_cast<double>(bytes) / f.seconds / 1e9;
    f.busbw = f.algbw * bus_factor;
    return f;
  };
  CommReport r{};
  r.ranks = ranks;
  r.bytes = bytes;
  r.reduce = figure(times.reduce, 2.0 * (ranks - 1) / ranks);
  r.a2a = figure(times.a2a, static_cast<double>(ranks - 1) / ranks);
  // The timed span holds the op and one barrier; for the barrier line it is two barriers.
  r.barrier_us = median(times.barrier) / 2 * 1e6;
  r.small_reduce_us = median(times.small_reduce) * 1e6 - r.barrier_us;
  return r;
}

void print_comm_json(const CommReport& r) {
  std::printf(
      "{\"bench\":\"comm\",\"ranks\":%d,\"trainers\":%d,\"mb\":%.3f,\"iters\":%d,"
      "\"threads_per_card\":%d,\"hardware_threads\":%d,\"memcpy_gbps\":%.3f,"
      "\"loopback_tcp_gbps\":%.3f,"
      "\"all_reduce_sum\":{\"ms\":%.4f,\"algbw_gbps\":%.3f,\"busbw_gbps\":%.3f},"
      "\"all_to_all_v\":{\"ms\":%.4f,\"algbw_gbps\":%.3f,\"busbw_gbps\":%.3f},"
      "\"barrier_us\":%.2f,\"all_reduce_4kb_us\":%.2f}\n",
      r.ranks, r.trainers, r.bytes / 1e6, r.iterations, r.threads, device::hardware_threads(),
      r.memcpy_rate, r.tcp_rate, r.reduce.seconds * 1e3, r.reduce.algbw, r.reduce.busbw,
      r.a2a.seconds * 1e3, r.a2a.algbw, r.a2a.busbw, r.barrier_us, r.small_reduce_us);
}

void print_comm_text(const CommReport& r) {
  std::printf(
      "comm: %d ranks (%s), %.2f MB per rank, %d iterations (median), %d "
      "hardware threads\n",
      r.ranks,
      r.trainers > 1 ? (std::to_string(r.trainers) + " trainers' Gloo group, loopback TCP").c_str()
                     : "in-process",
      r.bytes / 1e6, r.iterations, device::hardware_threads());
  std::printf("  %-26s %10s %12s %12s\n", "", "ms/call", "algbw GB/s", "busbw GB/s");
  std::printf("  %-26s %10.3f %12.2f %12s\n", "memcpy (1 thread)", r.bytes / r.memcpy_rate / 1e6,
              r.memcpy_rate, "-");
  if (r.trainers > 1) {
    std::printf("  %-26s %10.3f %12.2f %12s\n", "loopback TCP (1 stream)",
                r.bytes / r.tcp_rate / 1e6, r.tcp_rate, "-");
  }
  std::printf("  %-26s %10.3f %12.2f %12.2f\n", "all_reduce_sum float32", r.reduce.seconds * 1e3,
              r.reduce.algbw, r.reduce.busbw);
  std::printf("  %-26s %10.3f %12.2f %12.2f\n", "all_to_all_v float32 (even)", r.a2a.seconds * 1e3,
              r.a2a.algbw, r.a2a.busbw);
  std::printf("  latency: barrier %.1f us, all_reduce_sum of 4 KB %.1f us\n", r.barrier_us,
              r.small_reduce_us);
}

int run_comm(const BenchArgs& args) {
  args.expect_only({"ranks", "mb", "iters", "json", "trainers"});
  const int ranks = static_cast<int>(args.get_int("ranks", 2));
  const int trainers = static_cast<int>(args.get_int("trainers", 1));
  const double mb = args.get_double("mb", 64);
  const int iterations = static_cast<int>(args.get_int("iters", 20));
  GPUBOX_EXPECTS(ranks >= 1 && ranks <= 64, "--ranks must be in [1, 64], got ", ranks);
  GPUBOX_EXPECTS(mb > 0, "--mb must be positive, got ", mb);
  GPUBOX_EXPECTS(iterations >= 1, "--iters must be positive, got ", iterations);
  GPUBOX_EXPECTS(trainers >= 1 && ranks % trainers == 0, "--trainers ", trainers,
                 " must divide --ranks ", ranks);
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_EXPECTS(trainers == 1, "--trainers > 1 measures the Gloo group of the cpu backend");
#endif
  const std::size_t count = static_cast<std::size_t>(mb * 1e6 / sizeof(float)) / ranks * ranks;
  const std::size_t bytes = count * sizeof(float);

  const double memcpy_rate = memcpy_gbps(bytes, iterations);
  const double tcp_rate = trainers > 1 ? loopback_tcp_gbps(bytes, iterations) : 0.0;

  // Trainer t's cards and group; with several trainers they meet in a fresh file store.
  const int per_trainer = ranks / trainers;
  const std::filesystem::path store_dir =
      std::filesystem::temp_directory_path() / ("gpubox_bench_comm_" + std::to_string(::getpid()));
  std::unique_ptr<comm::RendezvousStore> store;
  if (trainers > 1) {
    std::filesystem::remove_all(store_dir);
    store = comm::open_rendezvous_store("file://" + store_dir.string());
  }
  std::vector<std::unique_ptr<device::CardSet>> sets;
  std::vector<std::unique_ptr<comm::CommGroup>> groups(static_cast<std::size_t>(trainers));
  for (int t = 0; t < trainers; ++t) {
    sets.push_back(std::make_unique<device::CardSet>(
        device::CardSet::from_list(card_list(per_trainer), t, trainers)));
  }
  on_trainers(trainers, [&](int t) {
    groups[t] = comm::make_group(*sets[t], std::chrono::minutes(5), store.get());
  });
  CollectiveTimes times;
  on_trainers(trainers, [&](int t) {
    comm::CommGroup* group = groups[t].get();
    sets[t]->run_on_cards(
        [&](device::Card& card) {
          time_card_collectives(card, group->at(card.local_index()), count, ranks, iterations,
                                &times);
        },
        [&](const std::string& why) { group->abort(why); });
  });
  groups.clear();
  if (trainers > 1) std::filesystem::remove_all(store_dir);

  CommReport report = comm_report(times, ranks, bytes);
  report.trainers = trainers;
  report.iterations = iterations;
  report.threads = sets[0]->card(0).threads();
  report.memcpy_rate = memcpy_rate;
  report.tcp_rate = tcp_rate;
  if (args.has("json")) {
    print_comm_json(report);
  } else {
    print_comm_text(report);
  }
  return 0;
}

}  // namespace

GPUBOX_BENCH_COMMAND("comm",
                     "--ranks R --mb M [--iters N] [--trainers T] [--json]  collectives GB/s "
                     "(in-process; Gloo over loopback TCP with T > 1)",
                     run_comm);

}  // namespace gpubox::bench
