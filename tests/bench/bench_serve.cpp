// gpubox_bench serve: a bounded load generator for gpubox_serve on loopback. For every pair of
// --clients and --instances it runs that many client threads, each with one keep-alive
// connection sending POST /predict bodies of that many slot-text instances (consecutive lines
// of --data, cycling) back to back, for --seconds or --max_requests requests per pair,
// whichever comes first. Prints requests/s, instances/s and per-request latency p50/p99 as a
// Markdown table; any non-200 reply is counted and reported.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/bench/bench_command.hpp"
#include "tests/serving/http_client.hpp"

namespace gpubox::bench {
namespace {

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t at = std::min(values.size() - 1, static_cast<std::size_t>(q * values.size()));
  return values[at];
}

int serve_main(const BenchArgs& args) {
  args.expect_only({"port", "host", "data", "clients", "instances", "seconds", "max_requests"});
  const auto port = static_cast<uint16_t>(args.get_int("port", 29080));
  const std::string host = args.get("host", "127.0.0.1");
  const std::string data = args.get("data", "");
  const double seconds = args.get_double("seconds", 5.0);
  const long long max_requests = args.get_int("max_requests", 200000);
  const std::vector<long long> client_counts = args.get_int_list("clients", "1,8,64", 1, 4096);
  const std::vector<long long> instance_counts = args.get_int_list("instances", "1,64", 1, 1 << 20);
  if (data.empty()) {
    std::fprintf(stderr, "gpubox_bench serve: --data FILE (slot text lines) is required\n");
    return 2;
  }
  std::vector<std::string> lines;
  {
    std::ifstream in(data);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
  }
  if (lines.empty()) {
    std::fprintf(stderr, "gpubox_bench serve: no line in %s\n", data.c_str());
    return 2;
  }
  std::printf(
      "| clients | instances/request | requests | requests/s | instances/s | p50 ms | "
      "p99 ms | errors |\n|---|---|---|---|---|---|---|---|\n");
  // A failed request is no measurement: the first one's reason is kept, and any fails the run
  // (it exited 0 with a table of "0 requests, 53413 errors" when nothing listened on the port).
  std::mutex first_error_mu;
  std::string first_error;
  long long total_errors = 0;
  for (const long long clients : client_counts) {
    for (const long long instances : instance_counts) {
      // Bodies: instance windows over the data, one per client start offset.
      std::vector<std::string> bodies;
      for (std::size_t b = 0; b < 64; ++b) {
        std::string body;
        for (long long i = 0; i < instances; ++i) {
          body += lines[(b * static_cast<std::size_t>(instances) + static_cast<std::size_t>(i)) %
                        lines.size()];
          body += '\n';
        }
        bodies.push_back(std::move(body));
      }
      std::atomic<long long> sent{0};
      std::atomic<long long> errors{0};
      std::vector<std::vector<double>> latencies(static_cast<std::size_t>(clients));
      const auto start = std::chrono::steady_clock::now();
      const auto deadline = start + std::chrono::duration<double>(seconds);
      std::vector<std::thread> threads;
      for (long long c = 0; c < clients; ++c) {
        threads.emplace_back([&, c] {
          serving::testing::HttpClient client(port, host);
          std::size_t next = static_cast<std::size_t>(c);
          while (std::chrono::steady_clock::now() < deadline && sent.fetch_add(1) < max_requests) {
            const auto t0 = std::chrono::steady_clock::now();
            const auto reply = client.send(boost::beast::http::verb::post, "/predict",
                                           bodies[next++ % bodies.size()], "text/plain");
            const auto t1 = std::chrono::steady_clock::now();
            if (reply.status != 200) {
              if (errors.fetch_add(1) == 0) {
                const std::lock_guard<std::mutex> lock(first_error_mu);
                if (first_error.empty()) {
                  first_error = reply.status == 0 ? reply.error
                                                  : "HTTP " + std::to_string(reply.status) + ": " +
                                                        reply.body.substr(0, 200);
                }
              }
              continue;
            }
            latencies[static_cast<std::size_t>(c)].push_back(
                std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
        });
      }
      for (auto& t : threads) t.join();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::vector<double> all;
      for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
      const double ok = static_cast<double>(all.size());
      std::printf("| %lld | %lld | %zu | %.0f | %.0f | %.2f | %.2f | %lld |\n", clients, instances,
                  all.size(), ok / elapsed, ok * static_cast<double>(instances) / elapsed,
                  percentile(all, 0.50), percentile(all, 0.99), errors.load());
      std::fflush(stdout);
      total_errors += errors.load();
    }
  }
  if (total_errors > 0) {
    std::fprintf(stderr,
                 "gpubox_bench serve: %lld requests to %s:%u failed, so the table measures no "
                 "serving; the first: %s\n",
                 total_errors, host.c_str(), static_cast<unsigned>(port), first_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

GPUBOX_BENCH_COMMAND("serve",
                     "--port P --data FILE [--host 127.0.0.1] [--clients 1,8,64] "
                     "[--instances 1,64] [--seconds 5] [--max_requests 200000]",
                     serve_main);

}  // namespace gpubox::bench
