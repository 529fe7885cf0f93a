// gpubox_bench hashtable: CardHashTable insert / find-hit / find-miss throughput on the cpu
// backend (1 and 2 threads per card), next to absl::flat_hash_map<uint64_t, uint32_t> doing the
// same work in the same run (one thread), and the ratio.
//
// Workload: --keys distinct uniformly random 64-bit keys, inserted into an empty table in
// batches of --batch keys (both tables start empty and grow on their own), then looked up in a
// shuffled order (hits), then --keys absent keys (misses). A new key gets a row index (the
// card table takes it from its RowPool; the absl map gets a counter). Figures are the median of
// --repeats runs, in million operations per second.
#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "heterps/card_table/hash_table.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

using card_table::row_index_t;

struct Figures {
  double insert_mops = 0;
  double find_hit_mops = 0;
  double find_miss_mops = 0;
  double bytes_per_key = 0;
};

struct Workload {
  std::vector<uint64_t> keys;          // insert order
  std::vector<uint64_t> hit_order;     // the same keys, shuffled
  std::vector<uint64_t> missing_keys;  // none of them inserted
};

Workload make_workload(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Workload w;
  w.keys.resize(n);
  for (auto& k : w.keys) k = rng();
  std::sort(w.keys.begin(), w.keys.end());
  w.keys.erase(std::unique(w.keys.begin(), w.keys.end()), w.keys.end());
  while (w.keys.size() < n) w.keys.push_back(rng());  // 64-bit collisions: practically never
  std::shuffle(w.keys.begin(), w.keys.end(), rng);
  w.hit_order = w.keys;
  std::shuffle(w.hit_order.begin(), w.hit_order.end(), rng);
  std::vector<uint64_t> sorted = w.keys;
  std::sort(sorted.begin(), sorted.end());
  while (w.missing_keys.size() < n) {
    const uint64_t k = rng();
    if (!std::binary_search(sorted.begin(), sorted.end(), k)) w.missing_keys.push_back(k);
  }
  return w;
}

double mops(std::size_t ops, double seconds) { return static_cast<double>(ops) / seconds / 1e6; }

Figures run_card_table(const Workload& w, std::size_t batch, int threads, int repeats) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  const std::size_t n = w.keys.size();
  const device::Stream& stream = card.stream();
  auto keys = device::to_device(w.keys, card.memory(), stream);
  auto hits = device::to_device(w.hit_order, card.memory(), stream);
  auto misses = device::to_device(w.missing_keys, card.memory(), stream);
  auto rows = card.make_buffer<row_index_t>(n);
  std::vector<double> insert_s, hit_s, miss_s;
  Figures f;
  for (int r = 0; r < repeats; ++r) {
    card_table::CardHashTable table(card, card_table::HashTableOptions{});
    Timer timer;
    for (std::size_t first = 0; first < n; first += batch) {
      const std::size_t count = std::min(batch, n - first);
      table.insert(keys.data() + first, count, rows.data() + first, stream);
    }
    stream.synchronize();
    insert_s.push_back(timer.seconds());
    GPUBOX_EXPECTS(table.size() == n, "card table holds ", table.size(), " keys, expected ", n);

    timer.reset();
    table.find(hits.data(), n, rows.data(), stream);
    stream.synchronize();
    hit_s.push_back(timer.seconds());
    const auto found = device::to_host(rows);
    GPUBOX_EXPECTS(std::count(found.begin(), found.end(), card_table::kInvalidRow) == 0,
                   "a hit lookup missed");

    timer.reset();
    table.find(misses.data(), n, rows.data(), stream);
    stream.synchronize();
    miss_s.push_back(timer.seconds());
    const auto missed = device::to_host(rows);
    GPUBOX_EXPECTS(std::count(missed.begin(), missed.end(), card_table::kInvalidRow) ==
                       static_cast<std::ptrdiff_t>(n),
                   "a miss lookup hit");
    // Slots and the index-only pool (no row payload), i.e. what the absl map also holds.
    f.bytes_per_key = static_cast<double>(table.capacity() * sizeof(card_table::detail::Slot) +
                                          table.pool().memory_bytes()) /
                      static_cast<double>(n);
  }
  f.insert_mops = mops(n, median(insert_s));
  f.find_hit_mops = mops(n, median(hit_s));
  f.find_miss_mops = mops(n, median(miss_s));
  return f;
}

Figures run_absl(const Workload& w, std::size_t batch, int repeats) {
  const std::size_t n = w.keys.size();
  std::vector<row_index_t> rows(n);
  std::vector<double> insert_s, hit_s, miss_s;
  Figures f;
  for (int r = 0; r < repeats; ++r) {
    absl::flat_hash_map<uint64_t, row_index_t> map;
    row_index_t next_row = 0;
    Timer timer;
    for (std::size_t first = 0; first < n; first += batch) {
      const std::size_t end = std::min(n, first + batch);
      for (std::size_t i = first; i < end; ++i) {
        auto [it, inserted] = map.try_emplace(w.keys[i], next_row);
        next_row += inserted ? 1 : 0;
        rows[i] = it->second;
      }
    }
    insert_s.push_back(timer.seconds());
    GPUBOX_EXPECTS(map.size() == n, "absl map holds ", map.size(), " keys, expected ", n);

    timer.reset();
    for (std::size_t i = 0; i < n; ++i) {
      auto it = map.find(w.hit_order[i]);
      rows[i] = it == map.end() ? card_table::kInvalidRow : it->second;
    }
    hit_s.push_back(timer.seconds());
    GPUBOX_EXPECTS(std::count(rows.begin(), rows.end(), card_table::kInvalidRow) == 0,
                   "a hit lookup missed");

    timer.reset();
    for (std::size_t i = 0; i < n; ++i) {
      auto it = map.find(w.missing_keys[i]);
      rows[i] = it == map.end() ? card_table::kInvalidRow : it->second;
    }
    miss_s.push_back(timer.seconds());
    GPUBOX_EXPECTS(std::count(rows.begin(), rows.end(), card_table::kInvalidRow) ==
                       static_cast<std::ptrdiff_t>(n),
                   "a miss lookup hit");
    // Swiss table: one control byte plus one slot per bucket.
    f.bytes_per_key =
        static_cast<double>(map.capacity() * (sizeof(std::pair<uint64_t, row_index_t>) + 1)) /
        static_cast<double>(n);
  }
  f.insert_mops = mops(n, median(insert_s));
  f.find_hit_mops = mops(n, median(hit_s));
  f.find_miss_mops = mops(n, median(miss_s));
  return f;
}

int hashtable_main(const BenchArgs& args) {
  args.expect_only({"keys", "batch", "threads", "repeats", "seed", "json"});
  const long long keys = args.get_int("keys", 1 << 22);
  const long long batch = args.get_int("batch", 1 << 20);
  const int repeats = static_cast<int>(args.get_int("repeats", 3));
  GPUBOX_EXPECTS(keys >= 1 && keys <= (1LL << 31), "--keys must be in [1, 2^31], got ", keys);
  GPUBOX_EXPECTS(batch >= 1, "--batch must be >= 1, got ", batch);
  GPUBOX_EXPECTS(repeats >= 1, "--repeats must be >= 1, got ", repeats);
  std::vector<int> threads;
  for (const long long t : args.get_int_list("threads", "1,2", 1, 1024))
    threads.push_back(static_cast<int>(t));
  const bool json = args.has("json");

  const Workload w =
      make_workload(static_cast<std::size_t>(keys), static_cast<uint64_t>(args.get_int("seed", 1)));
  const Figures absl = run_absl(w, static_cast<std::size_t>(batch), repeats);
  std::vector<Figures> card(threads.size());
  for (std::size_t i = 0; i < threads.size(); ++i) {
    card[i] = run_card_table(w, static_cast<std::size_t>(batch), threads[i], repeats);
  }

  const double load = load_average();
  const int cores = device::hardware_threads();
  if (json) {
    std::printf(
        "{\"bench\":\"hashtable\",\"keys\":%lld,\"batch\":%lld,\"repeats\":%d,"
        "\"hardware_threads\":%d,\"loadavg_1m\":%.2f,",
        keys, batch, repeats, cores, load);
    std::printf(
        "\"absl_flat_hash_map\":{\"insert_mops\":%.2f,\"find_hit_mops\":%.2f,"
        "\"find_miss_mops\":%.2f,\"bytes_per_key\":%.1f},\"card_table\":[",
        absl.insert_mops, absl.find_hit_mops, absl.find_miss_mops, absl.bytes_per_key);
    for (std::size_t i = 0; i < threads.size(); ++i) {
      const Figures& f = card[i];
      std::printf(
          "%s{\"threads\":%d,\"insert_mops\":%.2f,\"find_hit_mops\":%.2f,"
          "\"find_miss_mops\":%.2f,\"bytes_per_key\":%.1f,\"insert_ratio\":%.2f,"
          "\"find_hit_ratio\":%.2f,\"find_miss_ratio\":%.2f}",
          i ? "," : "", threads[i], f.insert_mops, f.find_hit_mops, f.find_miss_mops,
          f.bytes_per_key, f.insert_mops / absl.insert_mops, f.find_hit_mops / absl.find_hit_mops,
          f.find_miss_mops / absl.find_miss_mops);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf(
      "hashtable: %lld keys, batches of %lld, median of %d runs (M ops/s; ratio = card "
      "table / absl)\n",
      keys, batch, repeats);
  std::printf("machine: %d hardware threads, 1-minute load average %.2f\n", cores, load);
  std::printf("%-26s %10s %10s %10s %10s\n", "", "insert", "find-hit", "find-miss", "bytes/key");
  std::printf("%-26s %10.2f %10.2f %10.2f %10.1f\n", "absl::flat_hash_map (1 thr)",
              absl.insert_mops, absl.find_hit_mops, absl.find_miss_mops, absl.bytes_per_key);
  for (std::size_t i = 0; i < threads.size(); ++i) {
    const Figures& f = card[i];
    char label[64];
    std::snprintf(label, sizeof label, "CardHashTable (%d thr)", threads[i]);
    std::printf("%-26s %10.2f %10.2f %10.2f %10.1f\n", label, f.insert_mops, f.find_hit_mops,
                f.find_miss_mops, f.bytes_per_key);
    std::snprintf(label, sizeof label, "  ratio (%d thr)", threads[i]);
    std::printf("%-26s %9.2fx %9.2fx %9.2fx\n", label, f.insert_mops / absl.insert_mops,
                f.find_hit_mops / absl.find_hit_mops, f.find_miss_mops / absl.find_miss_mops);
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("hashtable",
                     "--keys N [--batch B] [--threads 1,2] [--repeats R] [--seed S] [--json]",
                     hashtable_main);

}  // namespace
}  // namespace gpubox::bench
