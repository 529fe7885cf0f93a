// gpubox_bench table: the in-process host tier (SparseTable) in rows/s — push of new rows,
// push of existing rows, pull — with 1 and 2 threads, against memcpy of the same bytes in the
// same run; then the RocksDB disk tier (memory budget of a tenth of the rows, pulls bringing
// rows back from disk).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
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

struct Workload {
  std::vector<uint64_t> keys;      // all keys, in insertion order
  std::vector<uint64_t> shuffled;  // the same keys in random order (pull/push order)
  std::vector<float> rows;         // one row per key
  int32_t stride = 0;
};

Workload make_workload(std::size_t n, const table::RowLayout& layout, uint64_t seed) {
  Workload w;
  w.stride = layout.stride();
  std::mt19937_64 rng(seed);
  w.keys.resize(n);
  for (auto& k : w.keys) k = rng();
  w.shuffled = w.keys;
  std::shuffle(w.shuffled.begin(), w.shuffled.end(), rng);
  w.rows.resize(n * w.stride);
  std::uniform_real_distribution<float> u(0.0f, 10.0f);
  for (auto& v : w.rows) v = u(rng);
  // Rows a save can load back: a whole slot number and the row's own embedx width (a load
  // refuses a record whose slot is not a whole number).
  for (std::size_t i = 0; i < n; ++i) {
    float* row = w.rows.data() + i * w.stride;
    row[layout.slot()] = static_cast<float>(rng() % 26);
    row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
    row[layout.mf_size()] = static_cast<float>(layout.mf_dim);
  }
  return w;
}

std::unique_ptr<SparseTable> open_or_die(const table::AccessorConfig& opt,
                                         const HostTableConfig& cfg) {
  auto t = SparseTable::open(opt, cfg);
  GPUBOX_EXPECTS(t.ok(), t.status().to_string());
  return std::move(t).value();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Runs op(begin, count) over [0, n) in batches; returns rows/s.
template <class Op>
double rows_per_second(std::size_t n, std::size_t batch, Op&& op) {
  Timer timer;
  for (std::size_t begin = 0; begin < n; begin += batch) {
    const Status st = op(begin, std::min(batch, n - begin));
    GPUBOX_EXPECTS(st.ok(), st.to_string());
  }
  return static_cast<double>(n) / timer.seconds();
}

struct TableFigures {
  double insert = 0, push = 0, pull = 0;
};

TableFigures measure_table(const Workload& w, std::size_t batch, int threads, int repeats,
                           const table::AccessorConfig& opt, HostTableConfig cfg) {
  cfg.threads = threads;
  const std::size_t n = w.keys.size();
  std::vector<float> out(batch * w.stride);
  std::vector<double> inserts, pushes, pulls;
  for (int r = 0; r < repeats; ++r) {
    auto t = open_or_die(opt, cfg);
    inserts.push_back(rows_per_second(n, batch, [&](std::size_t b, std::size_t m) {
      return t->push(w.keys.data() + b, m, w.rows.data() + b * w.stride);
    }));
    pushes.push_back(rows_per_second(n, batch, [&](std::size_t b, std::size_t m) {
      return t->push(w.shuffled.data() + b, m, w.rows.data() + b * w.stride);
    }));
    pulls.push_back(rows_per_second(n, batch, [&](std::size_t b, std::size_t m) {
      return t->pull(w.shuffled.data() + b, nullptr, m, out.data(), nullptr);
    }));
  }
  return {median(inserts), median(pushes), median(pulls)};
}

// The peer: memcpy of `rows`' bytes (one thread), bytes/s, best of `repeats` (a first run also
// faults the pages in).
double memcpy_bytes_per_second(const std::vector<float>& rows, int repeats) {
  std::vector<float> dst(rows.size());
  double memcpy_bps = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run also faults the pages in
    Timer timer;
    std::memcpy(dst.data(), rows.data(), rows.size() * sizeof(float));
    memcpy_bps = std::max(memcpy_bps, rows.size() * sizeof(float) / timer.seconds());
  }
  return memcpy_bps;
}

struct SaveFigures {
  double save = 0, load = 0, bytes = 0;
};

// Save and load of the whole in-memory table of `w` (checkpoint: full rows; 2 threads; POSIX
// env, fsync included) in `form`, in the folder `dir`_save: rows/s each way and the save's bytes.
SaveFigures measure_save(const Workload& w, const table::AccessorConfig& opt, HostTableConfig cfg,
                         const std::string& dir, table::SaveForm form) {
  const std::size_t n = w.keys.size();
  HostTableConfig scfg = cfg;
  scfg.threads = 2;
  auto t = open_or_die(opt, scfg);
  Status st = t->push(w.keys.data(), n, w.rows.data());
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  const std::string path = dir + "_save";
  SaveFigures f;
  Timer timer;
  st = t->save(path, table::SaveKind::kCheckpoint, form);
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  f.save = n / timer.seconds();
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    f.bytes += static_cast<double>(entry.file_size());
  }
  auto loaded = open_or_die(opt, scfg);
  timer.reset();
  st = loaded->load(path);
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  f.load = n / timer.seconds();
  std::filesystem::remove_all(path);
  return f;
}

// What gpubox_bench table prints.
struct TableReport {
  std::size_t rows, batch, disk_rows, disk_budget;
  int row_floats;
  uint32_t shards;
  double row_bytes, cpu_share, memcpy_bps, memcpy_rows;
  TableFigures one, two, disk;  // 1 and 2 threads in memory; the disk tier's
  SaveFigures binary, text;
};

void print_table_json(const TableReport& r) {
  std::printf(
      "{\"bench\":\"table\",\"rows\":%zu,\"batch\":%zu,\"row_floats\":%d,\"shards\":%u,"
      "\"cpu_share_1t\":%.2f,\"memcpy_GBps\":%.3f,\"memcpy_rows_per_s\":%.0f,"
      "\"t1\":{\"insert_rows_per_s\":%.0f,\"push_rows_per_s\":%.0f,\"pull_rows_per_s\":%.0f},"
      "\"t2\":{\"insert_rows_per_s\":%.0f,\"push_rows_per_s\":%.0f,\"pull_rows_per_s\":%.0f},"
      "\"disk\":{\"rows\":%zu,\"memory_row_budget\":%zu,\"insert_rows_per_s\":%.0f,"
      "\"push_rows_per_s\":%.0f,\"pull_rows_per_s\":%.0f},"
      "\"checkpoint_binary\":{\"bytes\":%.0f,\"save_rows_per_s\":%.0f,\"load_rows_per_s\":%.0f},"
      "\"checkpoint_text\":{\"bytes\":%.0f,\"save_rows_per_s\":%.0f,\"load_rows_per_s\":%.0f}}\n",
      r.rows, r.batch, r.row_floats, r.shards, r.cpu_share, r.memcpy_bps / 1e9, r.memcpy_rows,
      r.one.insert, r.one.push, r.one.pull, r.two.insert, r.two.push, r.two.pull, r.disk_rows,
      r.disk_budget, r.disk.insert, r.disk.push, r.disk.pull, r.binary.bytes, r.binary.save,
      r.binary.load, r.text.bytes, r.text.save, r.text.load);
}

void print_table_text(const TableReport& r) {
  std::printf("table: %zu rows of %d floats (%.0f B), batch %zu, %u shards\n", r.rows, r.row_floats,
              r.row_bytes, r.batch, r.shards);
  std::printf("  cpu share of the 1-thread runs: %.2f (1.00 = an idle core)\n", r.cpu_share);
  std::printf("  memcpy (1 thread)      %8.2f GB/s = %6.1f M rows/s\n", r.memcpy_bps / 1e9,
              r.memcpy_rows / 1e6);
  auto line = [&](const char* name, const TableFigures& f) {
    std::printf(
        "  %-22s insert %6.2f  push %6.2f  pull %6.2f M rows/s  (pull = %.1f%% of memcpy)\n", name,
        f.insert / 1e6, f.push / 1e6, f.pull / 1e6, 100.0 * f.pull / r.memcpy_rows);
  };
  line("in-memory, 1 thread", r.one);
  line("in-memory, 2 threads", r.two);
  if (r.disk_rows > 0) {
    std::printf("  disk tier: %zu rows, memory budget %zu rows, 2 threads\n", r.disk_rows,
                r.disk_budget);
    line("rocksdb tier", r.disk);
  }
  for (const auto& [name, f] :
       {std::make_pair("binary", r.binary), std::make_pair("text", r.text)}) {
    std::printf(
        "  checkpoint %-6s %7.1f MB  save %6.2f M rows/s (%6.1f MB/s)  load %6.2f M rows/s\n", name,
        f.bytes / 1e6, f.save / 1e6, f.save * f.bytes / r.rows / 1e6, f.load / 1e6);
  }
}

int table_main(const BenchArgs& args) {
  args.expect_only(
      {"rows", "batch", "mf_dim", "shards", "repeats", "disk_rows", "disk_dir", "json"});
  const std::size_t n = static_cast<std::size_t>(args.get_int("rows", 1000000));
  const std::size_t batch = static_cast<std::size_t>(args.get_int("batch", 65536));
  const int repeats = static_cast<int>(args.get_int("repeats", 3));
  const std::size_t disk_rows = static_cast<std::size_t>(args.get_int("disk_rows", n / 4));
  const bool json = args.has("json");
  GPUBOX_EXPECTS(n > 0 && batch > 0 && repeats > 0, "--rows, --batch and --repeats must be > 0");

  table::AccessorConfig opt;
  opt.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  opt.mf_dim = static_cast<int32_t>(args.get_int("mf_dim", 8));
  const table::RowLayout layout = table::RowLayout::make(opt.optimizer.kind, opt.mf_dim);
  HostTableConfig cfg;
  cfg.shards = static_cast<uint32_t>(args.get_int("shards", 64));
  const Workload w = make_workload(n, layout, 1);
  TableReport r{};
  r.rows = n;
  r.batch = batch;
  r.row_floats = layout.stride();
  r.shards = cfg.shards;
  r.row_bytes = sizeof(float) * layout.stride();
  r.memcpy_bps = memcpy_bytes_per_second(w.rows, repeats);
  // CPU seconds per wall second of the 1-thread runs: near 1 on an idle machine; far below 1
  // means other processes held the cores and every figure below is low by about that factor.
  const double cpu0 = process_cpu_seconds();
  Timer wall;
  r.one = measure_table(w, batch, 1, repeats, opt, cfg);
  r.cpu_share = (process_cpu_seconds() - cpu0) / wall.seconds();
  r.two = measure_table(w, batch, 2, repeats, opt, cfg);

  // Disk tier: a memory budget of a tenth of the rows; pushes spill, pulls come back from disk.
  r.disk_rows = disk_rows;
  r.disk_budget = std::max<std::size_t>(disk_rows / 10, cfg.shards);
  const std::string dir =
      args.get("disk_dir", "/tmp") + "/gpubox_bench_table_" + std::to_string(::getpid());
  if (disk_rows > 0) {
    HostTableConfig dcfg = cfg;
    dcfg.rocksdb_path = dir;
    dcfg.memory_row_budget = r.disk_budget;
    Workload dw = make_workload(disk_rows, layout, 2);
    r.disk = measure_table(dw, std::min(batch, disk_rows), 2, 1, opt, dcfg);
    std::filesystem::remove_all(dir);
  }
  r.binary = measure_save(w, opt, cfg, dir, table::SaveForm::kBinary);
  r.text = measure_save(w, opt, cfg, dir, table::SaveForm::kText);
  r.memcpy_rows = r.memcpy_bps / r.row_bytes;
  if (json) {
    print_table_json(r);
  } else {
    print_table_text(r);
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("table",
                     "--rows N [--batch B] [--mf_dim D] [--shards S] [--repeats R] "
                     "[--disk_rows M] [--disk_dir DIR] [--json]",
                     table_main);

}  // namespace
}  // namespace gpubox::bench
