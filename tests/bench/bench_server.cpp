// gpubox_bench server: pull and push rows/s and per-batch latency (p50/p99) through
// RemoteHostTier over TCP, next to the in-process SparseTable's rows/s for the same batches,
// measured in the same run: the gap is what the network path (encode, loopback TCP, decode,
// scatter) costs.
//
// Without --endpoints a gpubox_server engine is started in-process on 127.0.0.1 over a fresh
// SparseTable. Keys are uniform over [1, --keys] and all exist before timing starts (populated by
// one pull), so pulls measure lookups, not row creation.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_table.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

using table::HostTier;

struct Figure {
  double rows_per_s = 0;
  double mb_per_s = 0;  // row payload only
  double p50_ms = 0;
  double p99_ms = 0;
  std::size_t batches = 0;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

enum class Phase { kPull, kPush };

// `clients` threads call pull or push of `batch` keys on their tier for `seconds`.
Figure measure(const std::vector<HostTier*>& tiers, Phase phase, std::size_t batch,
               uint64_t key_space, double seconds) {
  const std::size_t stride = tiers[0]->layout().stride();
  std::vector<std::vector<double>> latencies(tiers.size());
  std::vector<std::size_t> rows_done(tiers.size(), 0);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  std::string error;
  std::mutex error_mu;
  Timer wall;
  for (std::size_t c = 0; c < tiers.size(); ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(1234 + c);
      constexpr int kBatches = 8;  // pre-generated, cycled: no RNG inside the timed loop
      std::vector<std::vector<uint64_t>> keys(kBatches, std::vector<uint64_t>(batch));
      for (auto& b : keys) {
        for (auto& k : b) k = 1 + rng() % key_space;
      }
      std::vector<float> rows(batch * stride);
      Status st = tiers[c]->pull(keys[0].data(), nullptr, batch, rows.data(), nullptr);
      Timer timer;
      for (int i = 0; st.ok() && timer.seconds() < seconds; ++i) {
        const auto& k = keys[i % kBatches];
        Timer one;
        st = phase == Phase::kPull ? tiers[c]->pull(k.data(), nullptr, batch, rows.data(), nullptr)
                                   : tiers[c]->push(k.data(), batch, rows.data());
        latencies[c].push_back(one.seconds());
        rows_done[c] += batch;
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        error = st.to_string();
        failed = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  GPUBOX_EXPECTS(!failed.load(), "benchmark call failed: ", error);
  const double elapsed = wall.seconds();
  std::vector<double> all;
  std::size_t rows = 0;
  for (std::size_t c = 0; c < tiers.size(); ++c) {
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    rows += rows_done[c];
  }
  Figure f;
  f.rows_per_s = static_cast<double>(rows) / elapsed;
  f.mb_per_s = f.rows_per_s * static_cast<double>(stride * sizeof(float)) / 1e6;
  f.p50_ms = quantile(all, 0.50) * 1e3;
  f.p99_ms = quantile(all, 0.99) * 1e3;
  f.batches = all.size();
  return f;
}

// The ceiling of the network path: one TCP stream over loopback, 1 MiB writes, MB/s.
double loopback_tcp_mb_per_s(double seconds) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  GPUBOX_EXPECTS(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                     ::listen(listener, 1) == 0 &&
                     ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
                 "loopback listener failed");
  const int writer = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  GPUBOX_EXPECTS(::connect(writer, reinterpret_cast<sockaddr*>(&addr), len) == 0,
                 "loopback connect failed");
  const int reader = ::accept(listener, nullptr, nullptr);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    std::vector<char> block(1 << 20, 1);
    while (!stop.load()) {
      if (::send(writer, block.data(), block.size(), MSG_NOSIGNAL) <= 0) break;
    }
    ::shutdown(writer, SHUT_WR);
  });
  std::vector<char> buf(1 << 20);
  std::size_t bytes = 0;
  Timer timer;
  while (timer.seconds() < seconds) {
    const ssize_t k = ::recv(reader, buf.data(), buf.size(), 0);
    if (k <= 0) break;
    bytes += static_cast<std::size_t>(k);
  }
  const double elapsed = timer.seconds();
  stop = true;
  while (::recv(reader, buf.data(), buf.size(), 0) > 0) {
  }
  sender.join();
  ::close(reader);
  ::close(writer);
  ::close(listener);
  return static_cast<double>(bytes) / elapsed / 1e6;
}

void populate(HostTier* tier, uint64_t key_space) {
  const std::size_t chunk = 1 << 16;
  std::vector<uint64_t> keys(chunk);
  std::vector<float> rows(chunk * tier->layout().stride());
  for (uint64_t first = 1; first <= key_space; first += chunk) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<uint64_t>(chunk, key_space - first + 1));
    for (std::size_t i = 0; i < n; ++i) keys[i] = first + i;
    throw_if_error(tier->pull(keys.data(), nullptr, n, rows.data(), nullptr));
  }
}

std::string figure_json(const Figure& f) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "{\"rows_per_s\":%.0f,\"mb_per_s\":%.1f,\"p50_ms\":%.4f,\"p99_ms\":%.4f,"
                "\"batches\":%zu}",
                f.rows_per_s, f.mb_per_s, f.p50_ms, f.p99_ms, f.batches);
  return buf;
}

int run_server_bench(const BenchArgs& args) {
  args.expect_only({"endpoints", "clients", "seconds", "batch", "keys", "mf_dim", "threads",
                    "chunk", "in_flight", "connections", "auth_token", "json"});
  const int clients = static_cast<int>(args.get_int("clients", 2));
  const double seconds = args.get_double("seconds", 2.0);
  const auto batch = static_cast<std::size_t>(args.get_int("batch", 4096));
  const auto key_space = static_cast<uint64_t>(args.get_int("keys", 1 << 20));
  const int mf_dim = static_cast<int>(args.get_int("mf_dim", 8));
  const int server_threads = static_cast<int>(args.get_int("threads", 2));
  GPUBOX_EXPECTS(clients >= 1 && clients <= 256, "--clients must be in [1, 256]");
  GPUBOX_EXPECTS(seconds > 0, "--seconds must be positive");
  GPUBOX_EXPECTS(batch >= 1, "--batch must be positive");
  GPUBOX_EXPECTS(key_space >= 1, "--keys must be positive");

  table::AccessorConfig optimizer;
  optimizer.mf_dim = mf_dim;
  table::HostTableConfig table_config;
  table_config.shards = 64;
  // The in-process table: the server's table when it runs here, else a local peer.
  auto local = table::SparseTable::open(optimizer, table_config);
  throw_if_error(local.status());
  std::unique_ptr<table::server::Server> server;
  std::string endpoints = args.get("endpoints", "");
  const bool in_process = endpoints.empty();
  if (in_process) {
    table::server::ServerOptions so;
    so.threads = server_threads;
    so.auth_token = args.get("auth_token", "");  // so the clients' AUTH is measured too
    auto started = table::server::Server::start(local->get(), so);
    throw_if_error(started.status());
    server = std::move(*started);
    endpoints = server->endpoint();
  }

  std::vector<std::unique_ptr<table::server::RemoteHostTier>> remotes;
  std::vector<HostTier*> remote_tiers, table_tiers;
  for (int c = 0; c < clients; ++c) {
    table::server::RemoteHostTierOptions o;
    o.endpoints = endpoints;
    o.config = optimizer;
    o.chunk_rows = static_cast<std::size_t>(args.get_int("chunk", 4096));
    o.max_in_flight = static_cast<int>(args.get_int("in_flight", 4));
    o.connections_per_endpoint = static_cast<int>(args.get_int("connections", 2));
    o.auth_token = args.get("auth_token", "");
    auto remote = table::server::RemoteHostTier::connect(o);
    throw_if_error(remote.status());
    remote_tiers.push_back(remote->get());
    table_tiers.push_back(local->get());
    remotes.push_back(std::move(*remote));
  }

  populate(remote_tiers[0], key_space);
  if (!in_process) populate(local->get(), key_space);
  const Figure pull = measure(remote_tiers, Phase::kPull, batch, key_space, seconds);
  const Figure push = measure(remote_tiers, Phase::kPush, batch, key_space, seconds);
  const Figure table_pull = measure(table_tiers, Phase::kPull, batch, key_space, seconds);
  const Figure table_push = measure(table_tiers, Phase::kPush, batch, key_space, seconds);
  const double tcp_mb_per_s = loopback_tcp_mb_per_s(std::min(seconds, 1.0));
  const std::size_t row_bytes = (*local)->layout().stride() * sizeof(float);
  const unsigned hw = std::thread::hardware_concurrency();

  if (args.has("json")) {
    std::printf(
        "{\"bench\":\"server\",\"endpoints\":\"%s\",\"in_process_server\":%s,\"server_threads\":%d,"
        "\"clients\":%d,\"seconds\":%.2f,\"batch\":%zu,\"keys\":%llu,\"mf_dim\":%d,"
        "\"row_bytes\":%zu,\"hardware_threads\":%u,\"loopback_tcp_mb_per_s\":%.0f,\"pull\":%s,"
        "\"push\":%s,\"table_pull\":%s,"
        "\"table_push\":%s}\n",
        endpoints.c_str(), in_process ? "true" : "false", in_process ? server_threads : -1, clients,
        seconds, batch, static_cast<unsigned long long>(key_space), mf_dim, row_bytes, hw,
        tcp_mb_per_s, figure_json(pull).c_str(), figure_json(push).c_str(),
        figure_json(table_pull).c_str(), figure_json(table_push).c_str());
  } else {
    std::printf("server: %s (%s), %d clients, batch %zu, %llu keys, %zu-byte rows, %u hw threads\n",
                endpoints.c_str(), in_process ? "in-process server" : "remote", clients, batch,
                static_cast<unsigned long long>(key_space), row_bytes, hw);
    std::printf("  %-28s %12s %10s %10s %10s\n", "", "rows/s", "MB/s", "p50 ms", "p99 ms");
    const auto line = [](const char* name, const Figure& f) {
      std::printf("  %-28s %12.0f %10.1f %10.3f %10.3f\n", name, f.rows_per_s, f.mb_per_s, f.p50_ms,
                  f.p99_ms);
    };
    line("pull over TCP", pull);
    line("push over TCP", push);
    line("pull in-process SparseTable", table_pull);
    line("push in-process SparseTable", table_push);
    std::printf("  %-28s %12s %10.0f   (one stream, 1 MiB writes: the network path's ceiling)\n",
                "loopback TCP", "-", tcp_mb_per_s);
  }
  return 0;
}

}  // namespace

GPUBOX_BENCH_COMMAND("server",
                     "[--endpoints host:port,...] --clients C --seconds S --batch B [--keys K] "
                     "[--json]  gpubox_server pull/push rows/s and latency vs the in-process table",
                     run_server_bench);

}  // namespace gpubox::bench
