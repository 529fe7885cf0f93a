// gpubox_bench disk: the host tier's RocksDB disk tier under a trainer's pass pattern, in rows/s.
// A job of --rows distinct keys, a memory budget of --budget_rows rows (or --budget_mb MiB, as
// runner.host_memory_mb plans it), and --passes passes of --pass_rows keys each drawn uniformly
// from the job (so later passes meet rows on disk and new keys alike). As the trainer with
// runner.prefetch_passes 1 does, pass p+1 is pulled (staged) before pass p's trained rows are
// pushed back (end_pass: every row of the pass, whole rows), so two passes are pinned at once.
// Reports pull and push rows/s per pass and overall, the rows moved between memory and disk
// (evicted, read back, written through; --no_write_through turns that off to compare), RocksDB's
// puts, deletes and bytes put, and the run's CPU seconds; limit: the same pulls and pushes with
// no budget (all in memory).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "table/sparse_table.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

using table::HostTableConfig;
using table::SparseTable;

// The keys of each pass: `pass_rows` draws from `rows` keys (mixed so shards and RocksDB see
// scattered 64-bit keys), deduplicated and sorted as a pass's key list is.
std::vector<std::vector<uint64_t>> make_passes(std::size_t rows, std::size_t pass_rows, int passes,
                                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> draw(0, rows - 1);
  std::vector<std::vector<uint64_t>> out(passes);
  for (auto& keys : out) {
    keys.resize(pass_rows);
    for (auto& k : keys) k = draw(rng) * 0x9E3779B97F4A7C15ull + 1;
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  return out;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct PassFigures {
  std::size_t keys = 0;
  double pull_s = 0, push_s = 0;
  uint64_t evicted = 0, read_back = 0, written_through = 0;
  // RocksDB writes: rows put, keys deleted, bytes put; evicted rows that were clean read-backs
  // (their disk copy kept, nothing written).
  uint64_t puts = 0, deletes = 0, put_bytes = 0, evicted_clean = 0;
  void add_writes(const SparseTable::DiskTraffic& before, const SparseTable::DiskTraffic& after) {
    puts += after.disk.puts - before.disk.puts;
    deletes += after.disk.deletes - before.disk.deletes;
    put_bytes += after.disk.put_bytes - before.disk.put_bytes;
    evicted_clean += after.rows_evicted_clean - before.rows_evicted_clean;
  }
};

// Pulls pass p+1 before pushing pass p (two passes in flight); returns per-pass figures (the
// pull of pass p and the push of pass p).
std::vector<PassFigures> run(const std::vector<std::vector<uint64_t>>& passes,
                             const table::AccessorConfig& opt, const HostTableConfig& cfg,
                             std::size_t batch) {
  auto opened = SparseTable::open(opt, cfg);
  GPUBOX_EXPECTS(opened.ok(), opened.status().to_string());
  auto t = std::move(opened).value();
  const int32_t stride = t->layout().stride();
  std::vector<PassFigures> figures(passes.size());
  std::vector<std::vector<float>> rows(passes.size());
  auto pull = [&](std::size_t p) {
    const auto& keys = passes[p];
    rows[p].assign(keys.size() * stride, 0.0f);
    const auto before = t->disk_traffic();
    Timer timer;
    for (std::size_t b = 0; b < keys.size(); b += batch) {
      const std::size_t m = std::min(batch, keys.size() - b);
      const Status st = t->pull(keys.data() + b, nullptr, m, rows[p].data() + b * stride, nullptr);
      GPUBOX_EXPECTS(st.ok(), st.to_string());
    }
    figures[p].pull_s = timer.seconds();
    figures[p].keys = keys.size();
    const auto after = t->disk_traffic();
    figures[p].evicted += after.rows_evicted - before.rows_evicted;
    figures[p].read_back += after.rows_read_back - before.rows_read_back;
    figures[p].add_writes(before, after);
  };
  auto push = [&](std::size_t p) {
    const auto& keys = passes[p];
    // "Training": every row changes (show and the embedding), as every row of a pass is dirty.
    for (std::size_t i = 0; i < keys.size(); ++i) {
      float* row = rows[p].data() + i * stride;
      row[table::RowLayout::kShow] += 1.0f;
      row[stride - 1] += 0.5f;
    }
    const auto before = t->disk_traffic();
    Timer timer;
    for (std::size_t b = 0; b < keys.size(); b += batch) {
      const std::size_t m = std::min(batch, keys.size() - b);
      const Status st = t->push(keys.data() + b, m, rows[p].data() + b * stride);
      GPUBOX_EXPECTS(st.ok(), st.to_string());
    }
    figures[p].push_s = timer.seconds();
    const auto after = t->disk_traffic();
    figures[p].evicted += after.rows_evicted - before.rows_evicted;
    figures[p].read_back += after.rows_read_back - before.rows_read_back;
    figures[p].written_through += after.rows_written_through - before.rows_written_through;
    figures[p].add_writes(before, after);
    rows[p].clear();
    rows[p].shrink_to_fit();
  };
  pull(0);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    if (p + 1 < passes.size()) pull(p + 1);
    push(p);
  }
  return figures;
}

// The passes' figures summed.
PassFigures totals(const std::vector<PassFigures>& f) {
  PassFigures t;
  for (const auto& p : f) {
    t.keys += p.keys;
    t.pull_s += p.pull_s;
    t.push_s += p.push_s;
    t.evicted += p.evicted;
    t.read_back += p.read_back;
    t.written_through += p.written_through;
    t.puts += p.puts;
    t.deletes += p.deletes;
    t.put_bytes += p.put_bytes;
    t.evicted_clean += p.evicted_clean;
  }
  return t;
}

// What gpubox_bench disk prints: the job, both runs pass by pass and in all, and the disk run's
// costs.
struct DiskReport {
  std::size_t rows, budget, pass_rows, batch;
  int passes;
  long long budget_mb;  // 0: the budget is `budget` rows
  uint32_t shards;
  int threads;
  std::vector<PassFigures> memory, disk;  // the run with no budget, the run on disk
  PassFigures mem_all, disk_all;
  uint64_t moved;      // rows moved to or from RocksDB
  double disk_rows_s;  // of them per second of pull and push
  double disk_cpu_s, disk_wall_s;
};

void print_disk_json(const DiskReport& r) {
  const PassFigures& mem_all = r.mem_all;
  const PassFigures& disk_all = r.disk_all;
  std::printf(
      "{\"bench\":\"disk\",\"rows\":%zu,\"budget_rows\":%zu,\"pass_rows\":%zu,\"passes\":%d,"
      "\"keys_pulled\":%zu,\"memory\":{\"pull_rows_per_s\":%.0f,\"push_rows_per_s\":%.0f},"
      "\"disk\":{\"pull_rows_per_s\":%.0f,\"push_rows_per_s\":%.0f,\"evicted\":%llu,"
      "\"read_back\":%llu,\"written_through\":%llu,\"evicted_clean\":%llu,\"puts\":%llu,"
      "\"deletes\":%llu,\"put_bytes\":%llu,\"disk_rows_per_s\":%.0f,\"cpu_s\":%.2f,"
      "\"wall_s\":%.2f}}\n",
      r.rows, r.budget, r.pass_rows, r.passes, disk_all.keys, mem_all.keys / mem_all.pull_s,
      mem_all.keys / mem_all.push_s, disk_all.keys / disk_all.pull_s,
      disk_all.keys / disk_all.push_s, static_cast<unsigned long long>(disk_all.evicted),
      static_cast<unsigned long long>(disk_all.read_back),
      static_cast<unsigned long long>(disk_all.written_through),
      static_cast<unsigned long long>(disk_all.evicted_clean),
      static_cast<unsigned long long>(disk_all.puts),
      static_cast<unsigned long long>(disk_all.deletes),
      static_cast<unsigned long long>(disk_all.put_bytes), r.disk_rows_s, r.disk_cpu_s,
      r.disk_wall_s);
}

void print_disk_text(const DiskReport& r) {
  const std::vector<PassFigures>& memory = r.memory;
  const std::vector<PassFigures>& disk = r.disk;
  const PassFigures& mem_all = r.mem_all;
  const PassFigures& disk_all = r.disk_all;
  std::printf(
      "disk: %zu keys in the job, budget %s, %d passes of %zu draws, %u shards, "
      "%d threads, batch %zu\n",
      r.rows,
      r.budget_mb > 0 ? (std::to_string(r.budget_mb) + " MiB").c_str()
                      : (std::to_string(r.budget) + " rows").c_str(),
      r.passes, r.pass_rows, r.shards, r.threads, r.batch);
  std::printf(
      "  pass  keys      pull rows/s  push rows/s  evicted    read back  written "
      "through  (in memory: pull / push rows/s)\n");
  for (std::size_t p = 0; p < disk.size(); ++p) {
    std::printf("  %-4zu  %-8zu  %11.0f  %11.0f  %-9llu  %-9llu  %-15llu  (%.0f / %.0f)\n", p,
                disk[p].keys, disk[p].keys / disk[p].pull_s, disk[p].keys / disk[p].push_s,
                static_cast<unsigned long long>(disk[p].evicted),
                static_cast<unsigned long long>(disk[p].read_back),
                static_cast<unsigned long long>(disk[p].written_through),
                memory[p].keys / memory[p].pull_s, memory[p].keys / memory[p].push_s);
  }
  std::printf(
      "  all   %-8zu  %11.0f  %11.0f  %-9llu  %-9llu  %-15llu  (%.0f / %.0f); disk rows "
      "moved %.0f rows/s\n",
      disk_all.keys, disk_all.keys / disk_all.pull_s, disk_all.keys / disk_all.push_s,
      static_cast<unsigned long long>(disk_all.evicted),
      static_cast<unsigned long long>(disk_all.read_back),
      static_cast<unsigned long long>(disk_all.written_through), mem_all.keys / mem_all.pull_s,
      mem_all.keys / mem_all.push_s, r.disk_rows_s);
  // CPU seconds (RocksDB's background threads included) are the figure to compare on a loaded
  // machine: wall time there depends on what else runs.
  std::printf("  disk run: %.1f s wall, %.1f CPU s (%.2f cores); %.0f disk rows moved per CPU s\n",
              r.disk_wall_s, r.disk_cpu_s, r.disk_cpu_s / r.disk_wall_s,
              static_cast<double>(r.moved) / r.disk_cpu_s);
  std::printf(
      "  RocksDB writes: %llu puts (%.1f MiB), %llu deletes; %llu of the evicted rows were read "
      "back unchanged and not written again\n",
      static_cast<unsigned long long>(disk_all.puts),
      static_cast<double>(disk_all.put_bytes) / (1 << 20),
      static_cast<unsigned long long>(disk_all.deletes),
      static_cast<unsigned long long>(disk_all.evicted_clean));
}

int disk_main(const BenchArgs& args) {
  args.expect_only({"rows", "budget_rows", "budget_mb", "pass_rows", "passes", "batch", "shards",
                    "threads", "no_write_through", "disk_dir", "json"});
  DiskReport r;
  r.rows = static_cast<std::size_t>(args.get_int("rows", 2000000));
  r.budget = static_cast<std::size_t>(args.get_int("budget_rows", r.rows / 10));
  r.pass_rows = static_cast<std::size_t>(args.get_int("pass_rows", r.rows / 8));
  r.passes = static_cast<int>(args.get_int("passes", 4));
  r.batch = static_cast<std::size_t>(args.get_int("batch", 65536));
  const bool json = args.has("json");
  GPUBOX_EXPECTS(r.rows > 0 && r.budget > 0 && r.pass_rows > 0 && r.passes > 0 && r.batch > 0,
                 "--rows, --budget_rows, --pass_rows, --passes and --batch must be > 0");

  table::AccessorConfig opt;
  opt.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  opt.mf_dim = 8;
  HostTableConfig cfg;
  cfg.shards = static_cast<uint32_t>(args.get_int("shards", 64));
  cfg.threads = static_cast<int>(args.get_int("threads", 2));
  const auto keys = make_passes(r.rows, r.pass_rows, r.passes, 7);

  r.memory = run(keys, opt, cfg, r.batch);
  const std::string dir =
      args.get("disk_dir", "/tmp") + "/gpubox_bench_disk_" + std::to_string(::getpid());
  cfg.rocksdb_path = dir;
  cfg.write_through = !args.has("no_write_through");
  // --budget_mb: a byte budget as runner.host_memory_mb gives (the plan sizes rows and RocksDB's
  // memory from it); else --budget_rows rows.
  r.budget_mb = args.get_int("budget_mb", 0);
  if (r.budget_mb > 0) {
    cfg.memory_budget_bytes = static_cast<uint64_t>(r.budget_mb) << 20;
  } else {
    cfg.memory_row_budget = r.budget;
  }
  const double cpu0 = process_cpu_seconds();
  Timer disk_wall;
  r.disk = run(keys, opt, cfg, r.batch);
  r.disk_cpu_s = process_cpu_seconds() - cpu0;
  r.disk_wall_s = disk_wall.seconds();
  std::filesystem::remove_all(dir);

  r.shards = cfg.shards;
  r.threads = cfg.threads;
  r.mem_all = totals(r.memory);
  r.disk_all = totals(r.disk);
  // Disk rows/s: rows moved to or from RocksDB per second of pull and push.
  r.moved = r.disk_all.evicted + r.disk_all.read_back + r.disk_all.written_through;
  r.disk_rows_s = static_cast<double>(r.moved) / (r.disk_all.pull_s + r.disk_all.push_s);
  if (json) {
    print_disk_json(r);
  } else {
    print_disk_text(r);
  }
  return 0;
}

GPUBOX_BENCH_COMMAND(
    "disk",
    "[--rows N] [--budget_rows B | --budget_mb M] [--pass_rows P] [--passes K] [--batch B] "
    "[--shards S] [--threads T] [--disk_dir DIR] [--json]",
    disk_main);

}  // namespace
}  // namespace gpubox::bench
