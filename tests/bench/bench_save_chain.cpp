// gpubox_bench save-chain: a save chain's delta on a host table of --rows rows. Each repeat saves
// a base, runs --shrinks shrinks, writes back --delta_rows rows changed (as a pass's write-back
// does) and saves a delta; then loads the chain into a fresh table: the base, then the delta onto
// the table holding it. Each call is timed alone; medians and min/max over --repeats.
// Peers in the same run: the base's save and load of every row (a delta holds few rows; what
// it costs beyond them is its three files a shard, and the replay below), and the live table's
// shrinks, which the delta's load replays in one pass over every row the table holds.
// Every loaded table is checked against the live one (row count; model record and unseen days of
// the touched keys, kSampleKeys others and a few never written): a load that went wrong fails
// the run rather than give a figure.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "table/io/fault_env.hpp"
#include "table/io/save_dir.hpp"
#include "table/row_codec.hpp"
#include "table/sparse_table.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

using table::RowLayout;
using table::SaveKind;
using table::SparseTable;

constexpr std::size_t kPushBatch = 65536;
// Keys checked after each load beside the touched ones, drawn from the whole table.
constexpr std::size_t kSampleKeys = 1000;

struct ChainOptions {
  std::size_t rows = 0, delta_rows = 0;
  int shrinks = 0, repeats = 0;
  table::AccessorConfig opt;
  table::HostTableConfig cfg;
  std::string dir;                    // scratch folder of the saves
  table::io::FileEnv* env = nullptr;  // the saves' file system (null: the table's, POSIX)
};

// Key i of the table: scattered over 64 bits, as a job's hashed feature keys are.
uint64_t key_of(std::size_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }

// `m` distinct keys of the table's `rows`, ascending.
std::vector<uint64_t> distinct_keys(std::size_t rows, std::size_t m, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> draw(0, rows - 1);
  std::vector<std::size_t> picks;
  while (picks.size() < m) {
    for (std::size_t j = picks.size(); j < m; ++j) picks.push_back(draw(rng));
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  }
  std::vector<uint64_t> keys(m);
  std::transform(picks.begin(), picks.end(), keys.begin(), key_of);
  return keys;
}

// A trained row: values in [0, 10), a whole slot, embedx of the full width; show in [20, 100)
// and click a fifth of it, a score far above delete_threshold through a run's shrinks, so that
// the deltas hold the rows touched and no deletions by score.
void fill_row(std::mt19937_64& rng, const RowLayout& layout, float* row) {
  std::uniform_real_distribution<float> value(0.0f, 10.0f);
  std::uniform_real_distribution<float> show(20.0f, 100.0f);
  for (int32_t f = 0; f < layout.stride(); ++f) row[f] = value(rng);
  row[RowLayout::kShow] = show(rng);
  row[RowLayout::kClick] = 0.2f * row[RowLayout::kShow];
  row[RowLayout::kUnseenDays] = 0.0f;
  row[layout.slot()] = static_cast<float>(rng() % 26);
  row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
  row[layout.mf_size()] = static_cast<float>(layout.mf_dim);
}

std::unique_ptr<SparseTable> open_table(const ChainOptions& o) {
  auto t = SparseTable::open(o.opt, o.cfg);
  GPUBOX_EXPECTS(t.ok(), t.status().to_string());
  return std::move(t).value();
}

// The live table: keys key_of(0 .. rows), pushed in batches.
std::unique_ptr<SparseTable> filled_table(const ChainOptions& o) {
  auto t = open_table(o);
  const int32_t stride = t->layout().stride();
  std::mt19937_64 rng(1);
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  for (std::size_t b = 0; b < o.rows; b += kPushBatch) {
    const std::size_t m = std::min(kPushBatch, o.rows - b);
    keys.resize(m);
    rows.resize(m * stride);
    for (std::size_t j = 0; j < m; ++j) {
      keys[j] = key_of(b + j);
      fill_row(rng, t->layout(), rows.data() + j * stride);
    }
    const Status st = t->push(keys.data(), m, rows.data());
    GPUBOX_EXPECTS(st.ok(), "fill: ", st.to_string());
  }
  return t;
}

// Writes `keys`' rows back changed (counts up, embed_w moved, seen today).
void touch(SparseTable& t, const std::vector<uint64_t>& keys) {
  const int32_t stride = t.layout().stride();
  std::vector<float> rows(keys.size() * stride);
  Status st = t.peek(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  GPUBOX_EXPECTS(st.ok(), "touch: ", st.to_string());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    float* row = rows.data() + i * stride;
    row[RowLayout::kShow] += 1.0f;
    row[RowLayout::kClick] += 0.25f;
    row[RowLayout::kEmbedW] += 0.01f;
    row[RowLayout::kUnseenDays] = 0.0f;
  }
  st = t.push(keys.data(), keys.size(), rows.data());
  GPUBOX_EXPECTS(st.ok(), "touch: ", st.to_string());
}

// A save folder: its bytes and files (MANIFEST included), and its MANIFEST's rows, deletions,
// mode and every_row.
struct SaveSize {
  uint64_t bytes = 0, files = 0, rows = 0, deleted = 0;
  std::string mode;
  bool every_row = false;
};

SaveSize size_of(const std::string& path) {
  SaveSize s;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    s.bytes += entry.file_size();
    ++s.files;
  }
  auto manifest = table::io::read_manifest(table::io::FileEnv::posix(), path, "sparse");
  GPUBOX_EXPECTS(manifest.ok(), manifest.status().to_string());
  for (const auto& file : manifest->files) {
    if (file.name.rfind("part-", 0) == 0) s.rows += file.records;
    if (file.name.rfind("delete-", 0) == 0) s.deleted += file.records;
  }
  s.mode = manifest->properties["mode"];
  s.every_row = manifest->properties.count("every_row") > 0;
  return s;
}

// What a base or delta save keeps of `key` in `t`: its model record and unseen days; `held`
// false when `t` does not hold it.
struct SavedRow {
  bool held = false;
  std::vector<float> values;
};

SavedRow saved_row(SparseTable& t, uint64_t key) {
  const RowLayout& layout = t.layout();
  std::vector<float> row(layout.stride());
  std::size_t unknown = 0;
  const Status st = t.peek(&key, nullptr, 1, row.data(), &unknown);
  GPUBOX_EXPECTS(st.ok(), "check: ", st.to_string());
  SavedRow out;
  out.held = unknown == 0;
  out.values.resize(table::record_floats(table::RecordKind::kModel, layout));
  table::row_to_record(table::RecordKind::kModel, layout, row.data(), out.values.data());
  out.values.push_back(row[RowLayout::kUnseenDays]);
  return out;
}

// Fails the run unless `loaded` holds as many rows as `live` and the same saved values (bit for
// bit) for every one of `keys`.
void check_loaded(SparseTable& live, SparseTable& loaded, const std::vector<uint64_t>& keys,
                  const std::string& what) {
  auto live_rows = live.size();
  auto loaded_rows = loaded.size();
  GPUBOX_EXPECTS(live_rows.ok() && loaded_rows.ok(), what, ": size() failed");
  GPUBOX_EXPECTS(*live_rows == *loaded_rows, what, ": the loaded table holds ", *loaded_rows,
                 " rows, the live one ", *live_rows);
  for (uint64_t key : keys) {
    const SavedRow want = saved_row(live, key);
    const SavedRow got = saved_row(loaded, key);
    const bool same = want.held == got.held && std::memcmp(want.values.data(), got.values.data(),
                                                           want.values.size() * sizeof(float)) == 0;
    GPUBOX_EXPECTS(same, what, ": key ", key, " differs from the live table's (held: loaded ",
                   got.held, ", live ", want.held, ")");
  }
}

// One repeat's seconds, each of one call (shrinks: all of them).
struct RoundTimes {
  double base_save = 0, shrinks = 0, delta_save = 0, base_load = 0, delta_load = 0;
  double chain_load = 0;  // base_load + delta_load: the chain into a fresh table
};

// Saves a base at `base`, shrinks, touches `touched` and saves the delta at `delta`; checks the
// delta holds those rows alone.
void save_round(SparseTable& live, const ChainOptions& o, const std::vector<uint64_t>& touched,
                const std::string& base, const std::string& delta, RoundTimes* t) {
  Timer timer;
  Status st = live.save(base, SaveKind::kBase, o.env);
  t->base_save = timer.seconds();
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  timer.reset();
  for (int k = 0; k < o.shrinks; ++k) {
    const auto deleted = live.shrink();
    GPUBOX_EXPECTS(deleted.ok(), deleted.status().to_string());
  }
  t->shrinks = timer.seconds();
  touch(live, touched);
  timer.reset();
  st = live.save(delta, SaveKind::kDelta, o.env);
  t->delta_save = timer.seconds();
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  const SaveSize d = size_of(delta);
  GPUBOX_EXPECTS(!d.every_row && d.rows == touched.size(), delta, ": ", d.rows, " rows (every_row ",
                 d.every_row, "), not the ", touched.size(),
                 " touched: not the delta this bench times");
}

// Loads base then delta into a fresh table, each call timed, and checks it against `live`.
void load_round(SparseTable& live, const ChainOptions& o, std::vector<uint64_t> sample,
                const std::string& base, const std::string& delta, RoundTimes* t) {
  auto fresh = open_table(o);
  Timer timer;
  Status st = fresh->load(base);
  t->base_load = timer.seconds();
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  timer.reset();
  st = fresh->load(delta);
  t->delta_load = timer.seconds();
  GPUBOX_EXPECTS(st.ok(), st.to_string());
  t->chain_load = t->base_load + t->delta_load;
  for (uint64_t never : {uint64_t{0}, uint64_t{2}, ~uint64_t{0}}) sample.push_back(never);
  check_loaded(live, *fresh, sample, "the chain " + base + " + " + delta);
}

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread spread_of(const std::vector<RoundTimes>& rounds, double RoundTimes::*field) {
  std::vector<double> v;
  for (const RoundTimes& r : rounds) v.push_back(r.*field);
  return {median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

// What gpubox_bench save-chain prints.
struct ChainReport {
  const ChainOptions* o = nullptr;
  double load_start = 0, load_end = 0;  // load averages
  SaveSize base, delta;                 // the last repeat's
  Spread base_save, shrinks, delta_save, base_load, delta_load, chain_load;
};

ChainReport run_chain(const ChainOptions& o) {
  ChainReport r;
  r.o = &o;
  r.load_start = load_average();
  auto live = filled_table(o);
  std::mt19937_64 rng(2);
  std::vector<RoundTimes> rounds(o.repeats);
  for (int i = 0; i < o.repeats; ++i) {
    const std::string base = o.dir + "/base" + std::to_string(i);
    const std::string delta = o.dir + "/delta" + std::to_string(i);
    const std::vector<uint64_t> touched = distinct_keys(o.rows, o.delta_rows, rng);
    save_round(*live, o, touched, base, delta, &rounds[i]);
    std::vector<uint64_t> sample = distinct_keys(o.rows, std::min(kSampleKeys, o.rows), rng);
    sample.insert(sample.end(), touched.begin(), touched.end());
    load_round(*live, o, std::move(sample), base, delta, &rounds[i]);
    r.base = size_of(base);
    r.delta = size_of(delta);
    std::filesystem::remove_all(base);
    std::filesystem::remove_all(delta);
  }
  r.load_end = load_average();
  r.base_save = spread_of(rounds, &RoundTimes::base_save);
  r.shrinks = spread_of(rounds, &RoundTimes::shrinks);
  r.delta_save = spread_of(rounds, &RoundTimes::delta_save);
  r.base_load = spread_of(rounds, &RoundTimes::base_load);
  r.delta_load = spread_of(rounds, &RoundTimes::delta_load);
  r.chain_load = spread_of(rounds, &RoundTimes::chain_load);
  return r;
}

void print_chain_json(const ChainReport& r) {
  const ChainOptions& o = *r.o;
  std::printf(
      "{\"bench\":\"save-chain\",\"rows\":%zu,\"delta_rows\":%zu,\"shrinks\":%d,\"repeats\":%d,"
      "\"shards\":%u,\"threads\":%d,\"fsync\":%s,\"load_avg\":[%.2f,%.2f],"
      "\"base\":{\"bytes\":%llu,\"files\":%llu},\"delta\":{\"bytes\":%llu,\"files\":%llu,"
      "\"rows\":%llu,\"deleted\":%llu,\"mode\":\"%s\"}",
      o.rows, o.delta_rows, o.shrinks, o.repeats, o.cfg.shards, o.cfg.threads,
      o.env == nullptr ? "true" : "false", r.load_start, r.load_end,
      static_cast<unsigned long long>(r.base.bytes), static_cast<unsigned long long>(r.base.files),
      static_cast<unsigned long long>(r.delta.bytes),
      static_cast<unsigned long long>(r.delta.files), static_cast<unsigned long long>(r.delta.rows),
      static_cast<unsigned long long>(r.delta.deleted), r.delta.mode.c_str());
  const std::pair<const char*, Spread> spreads[] = {
      {"delta_save_s", r.delta_save}, {"chain_load_s", r.chain_load}, {"base_load_s", r.base_load},
      {"delta_load_s", r.delta_load}, {"base_save_s", r.base_save},   {"shrinks_s", r.shrinks}};
  for (const auto& [name, s] : spreads) {
    std::printf(",\"%s\":{\"median\":%.6f,\"min\":%.6f,\"max\":%.6f}", name, s.median, s.min,
                s.max);
  }
  std::printf("}\n");
}

void print_chain_text(const ChainReport& r) {
  const ChainOptions& o = *r.o;
  const double mb = 1e6;
  std::printf(
      "save-chain: %zu rows, %u shards, %d threads, saves %s; %d repeats of: base save, %d "
      "shrinks, %zu rows touched, delta save, chain load (load avg %.2f -> %.2f)\n",
      o.rows, o.cfg.shards, o.cfg.threads, o.env == nullptr ? "with fsync" : "without fsync",
      o.repeats, o.shrinks, o.delta_rows, r.load_start, r.load_end);
  std::printf("  base:  %10.3f MB in %llu files\n", r.base.bytes / mb,
              static_cast<unsigned long long>(r.base.files));
  std::printf("  delta: %10.3f MB in %llu files (%llu rows, %llu deletions, mode %s)\n",
              r.delta.bytes / mb, static_cast<unsigned long long>(r.delta.files),
              static_cast<unsigned long long>(r.delta.rows),
              static_cast<unsigned long long>(r.delta.deleted), r.delta.mode.c_str());
  std::printf("  %-38s %10s %10s %10s\n", "seconds", "median", "min", "max");
  const auto line = [](const char* name, const Spread& s, const std::string& note) {
    std::printf("  %-38s %10.4f %10.4f %10.4f%s%s\n", name, s.median, s.min, s.max,
                note.empty() ? "" : "  ", note.c_str());
  };
  const auto rate = [&](double rows, double bytes, double s) {
    char text[96];
    std::snprintf(text, sizeof(text), "(%.2f M rows/s, %.0f MB/s)", rows / s / 1e6, bytes / s / mb);
    return std::string(text);
  };
  line("delta save", r.delta_save, "");
  line("chain load (base, then delta)", r.chain_load, "");
  line("  base load into a fresh table", r.base_load,
       rate(static_cast<double>(r.base.rows), static_cast<double>(r.base.bytes),
            r.base_load.median));
  line("  delta load onto the base", r.delta_load, "");
  line("peer: base save", r.base_save,
       rate(static_cast<double>(r.base.rows), static_cast<double>(r.base.bytes),
            r.base_save.median));
  if (o.shrinks > 0) line("peer: the live table's shrinks", r.shrinks, "(the delta load replays)");
  std::printf("  delta load / base load: %.4f; delta save / base save: %.4f (medians)\n",
              r.delta_load.median / r.base_load.median, r.delta_save.median / r.base_save.median);
}

// Removes the scratch folder however the run ends.
struct ScratchFolder {
  std::string path;
  ~ScratchFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

int save_chain_main(const BenchArgs& args) {
  args.expect_only({"rows", "delta_rows", "shrinks", "repeats", "shards", "threads", "mf_dim",
                    "dir", "no_fsync", "json"});
  const long long rows = args.get_int("rows", 1000000);
  const long long delta_rows = args.get_int("delta_rows", 100);
  ChainOptions o;
  o.shrinks = static_cast<int>(args.get_int("shrinks", 0));
  o.repeats = static_cast<int>(args.get_int("repeats", 5));
  if (rows <= 0 || delta_rows < 0 || delta_rows > rows || o.shrinks < 0 || o.repeats <= 0) {
    throw BenchUsageError(
        "--rows and --repeats must be > 0, --shrinks >= 0 and --delta_rows in [0, rows]");
  }
  o.rows = static_cast<std::size_t>(rows);
  o.delta_rows = static_cast<std::size_t>(delta_rows);
  o.opt.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  o.opt.mf_dim = static_cast<int32_t>(args.get_int("mf_dim", 8));
  o.cfg.shards = static_cast<uint32_t>(args.get_int("shards", 64));
  o.cfg.threads = static_cast<int>(args.get_int("threads", 2));
  // Syncs skipped (the saves' CPU and page-cache cost alone): an env that forwards all but them.
  table::io::FaultInjectingEnv no_sync(table::io::FileEnv::posix(), /*real_syncs=*/false);
  if (args.has("no_fsync")) o.env = &no_sync;
  ScratchFolder scratch{args.get("dir", "/tmp") + "/gpubox_bench_save_chain_" +
                        std::to_string(::getpid())};
  std::filesystem::create_directory(scratch.path);  // in --dir, which must exist: nothing left
  o.dir = scratch.path;
  const ChainReport r = run_chain(o);
  if (args.has("json")) {
    print_chain_json(r);
  } else {
    print_chain_text(r);
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("save-chain",
                     "[--rows N] [--delta_rows M] [--shrinks K] [--repeats R] [--shards S] "
                     "[--threads T] [--mf_dim D] [--dir DIR] [--no_fsync] [--json]",
                     save_chain_main);

}  // namespace
}  // namespace gpubox::bench
