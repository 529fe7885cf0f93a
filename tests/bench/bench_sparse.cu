// gpubox_bench sparse: HeterComm pull + push throughput per card for Zipf keys, and the traffic
// of one step (keys and records through all_to_all_v, hash lookups, row bytes touched) that the
// H100 paper figures are computed from.
//
// A step is what a card does per training batch: pull the batch's keys (batch examples x slots,
// one key per slot), then push one record per occurrence. Keys follow a Zipf law over --keys
// distinct keys, so hot keys repeat inside a card and across cards. Warm-up steps create the
// rows (create on the fly), so the timed steps find every key on its owner. keys/s per card =
// (batch x slots) / (wall time of a step) with all cards stepping together.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

std::string sparse_card_list(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(i);
  return out;
}

table::SparseOptimizerKind parse_optimizer(const std::string& name) {
  if (name == "sgd") return table::SparseOptimizerKind::kSgd;
  if (name == "adagrad") return table::SparseOptimizerKind::kAdagrad;
  if (name == "adam") return table::SparseOptimizerKind::kAdam;
  if (name == "shared_adam") return table::SparseOptimizerKind::kSharedAdam;
  GPUBOX_FAIL("--optimizer must be sgd, adagrad, adam or shared_adam, got '", name, "'");
}

// Zipf(s) over [0, n): inverse CDF by binary search over the cumulative weights.
class ZipfKeys {
 public:
  ZipfKeys(std::size_t n, double s, uint64_t seed) : cdf_(n), rng_(seed) {
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) cdf_[i] = total += 1.0 / std::pow(double(i + 1), s);
    for (double& c : cdf_) c /= total;
  }
  uint64_t next() {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    const std::size_t rank = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return mix64(std::min(rank, cdf_.size() - 1) + 1);  // rank -> a spread-out 64-bit key
  }

 private:
  std::vector<double> cdf_;
  std::mt19937_64 rng_;
};

// CPU seconds used by the whole process so far (all card threads): on a shared, loaded machine
// this moves far less than wall time.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct CardBatches {
  std::vector<device::device_buffer<uint64_t>> keys;
  device::device_buffer<float> grads;
  device::device_buffer<float> pulled;
};

constexpr int kDistinctBatches = 8;  // cycled: enough variety, bounded setup time

// gpubox_bench sparse's flags, checked.
struct SparseSettings {
  int cards;
  long long batch, slots, universe;
  double zipf;
  int steps, warmup, mf_dim, threads;
  std::string optimizer_name;
  // push_pulled (the trainer's path when it pushes the keys it pulled) instead of push(keys).
  bool reuse_pull;
  bool json;
};

SparseSettings sparse_settings(const BenchArgs& args) {
  args.expect_only({"cards", "batch", "slots", "keys", "zipf", "steps", "warmup", "mf-dim",
                    "optimizer", "threads", "reuse-pull", "json"});
  SparseSettings s;
  s.cards = static_cast<int>(args.get_int("cards", 1));
  s.batch = args.get_int("batch", 512);
  s.slots = args.get_int("slots", 26);
  s.universe = args.get_int("keys", 1000000);
  s.zipf = args.get_double("zipf", 1.05);
  s.steps = static_cast<int>(args.get_int("steps", 50));
  s.warmup = static_cast<int>(args.get_int("warmup", 10));
  s.mf_dim = static_cast<int>(args.get_int("mf-dim", 8));
  s.threads = static_cast<int>(args.get_int("threads", 0));
  s.optimizer_name = args.get("optimizer", "adagrad");
  s.reuse_pull = args.has("reuse-pull");
  s.json = args.has("json");
  GPUBOX_EXPECTS(s.cards >= 1 && s.cards <= 64, "--cards must be in [1, 64], got ", s.cards);
  GPUBOX_EXPECTS(s.batch >= 0 && s.slots >= 1, "--batch must be >= 0 and --slots >= 1");
  GPUBOX_EXPECTS(s.universe >= 1, "--keys must be positive, got ", s.universe);
  GPUBOX_EXPECTS(s.steps >= 1 && s.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
  GPUBOX_EXPECTS(s.mf_dim >= 1, "--mf-dim must be positive, got ", s.mf_dim);
  return s;
}

// Card `c`'s kDistinctBatches batches of `keys_per_step` Zipf keys, one push record per key (a
// show, a click one time in eight, small gradients), and room for the pulled records.
CardBatches make_batches(device::Card& card, int c, const SparseSettings& settings,
                         std::size_t keys_per_step, const table::RowLayout& layout) {
  CardBatches data;
  ZipfKeys zipf_keys(static_cast<std::size_t>(settings.universe), settings.zipf, 1000 + c);
  std::mt19937_64 rng(77 + c);
  std::uniform_real_distribution<float> grad(-0.01f, 0.01f);
  for (int b = 0; b < kDistinctBatches; ++b) {
    std::vector<uint64_t> keys(keys_per_step);
    for (auto& k : keys) k = zipf_keys.next();
    data.keys.push_back(device::to_device(keys, card.memory(), card.stream()));
  }
  std::vector<float> grads(keys_per_step * layout.push_dim());
  for (std::size_t i = 0; i < keys_per_step; ++i) {
    float* g = grads.data() + i * layout.push_dim();
    g[0] = 1.0f;
    g[1] = (rng() % 8 == 0) ? 1.0f : 0.0f;
    for (int d = 2; d < layout.push_dim(); ++d) g[d] = grad(rng);
  }
  data.grads = device::to_device(grads, card.memory(), card.stream());
  data.pulled = card.make_buffer<float>(keys_per_step * layout.pull_dim());
  return data;
}

// What the timed steps of every card measured.
struct SparseTimes {
  explicit SparseTimes(int cards)
      : pull_seconds(cards, 0.0), push_seconds(cards, 0.0), before(cards), after(cards) {}
  std::vector<double> pull_seconds, push_seconds;         // per card, summed over the timed steps
  std::vector<heter_comm::HeterCommStats> before, after;  // per card, around the timed steps
  double wall_seconds = 0;                                // card 0's, barrier to barrier
  double cpu_seconds = 0;                                 // the process's, over the same span
};

// Card `c`'s warm-up steps, then its timed ones (between barriers of every card) on `comm`'s
// group: pull a batch's keys, then push their records.
void run_card_steps(device::Card& card, int c, heter_comm::HeterComm& hc, comm::Communicator& comm,
                    CardBatches& data, const SparseSettings& settings, SparseTimes* times) {
  auto step = [&](int s, bool timed) {
    const auto& keys = data.keys[s % kDistinctBatches];
    Timer t;
    hc.pull(keys.data(), keys.size(), data.pulled.data(), card.stream());
    const double pulled = t.seconds();
    if (settings.reuse_pull) {
      hc.push_pulled(data.grads.data(), card.stream());
    } else {
      hc.push(keys.data(), keys.size(), data.grads.data(), card.stream());
    }
    if (timed) {
      times->pull_seconds[c] += pulled;
      times->push_seconds[c] += t.seconds() - pulled;
    }
  };
  for (int s = 0; s < settings.warmup; ++s) step(s, false);
  times->before[c] = hc.stats();
  comm.barrier(card.stream());
  const double cpu_start = process_cpu_seconds();
  Timer wall;
  for (int s = 0; s < settings.steps; ++s) step(settings.warmup + s, true);
  comm.barrier(card.stream());
  if (c == 0) {
    times->wall_seconds = wall.seconds();
    times->cpu_seconds = process_cpu_seconds() - cpu_start;
  }
  times->after[c] = hc.stats();
}

// The figures printed, per card per step unless named otherwise.
struct SparseFigures {
  double unique, lookups, merged, bytes_sent, bytes_remote, created;
  double row_bytes, pull_lookups, row_traffic;
  double keys_per_sec, keys_per_cpu_sec, pull_ms, push_ms;
};

SparseFigures sparse_figures(const SparseSettings& settings, std::size_t keys_per_step,
                             const table::RowLayout& layout, const SparseTimes& times) {
  const int cards_n = settings.cards;
  const int steps = settings.steps;
  const bool reuse_pull = settings.reuse_pull;
  // Per-step, per-card averages of the traffic counters over the timed steps.
  const double per = 1.0 / (static_cast<double>(steps) * cards_n);
  auto avg = [&](uint64_t heter_comm::HeterCommStats::*field) {
    double sum = 0;
    for (int c = 0; c < cards_n; ++c) {
      sum += double(times.after[c].*field - times.before[c].*field);
    }
    return sum * per;
  };
  SparseFigures f;
  // Unique keys per step: counted by pull, and by push unless it reused the pull.
  f.unique = avg(&heter_comm::HeterCommStats::unique_keys_sent) / (reuse_pull ? 1 : 2);
  f.lookups = avg(&heter_comm::HeterCommStats::owner_lookups);
  f.merged = avg(&heter_comm::HeterCommStats::merged_updates);
  f.bytes_sent = avg(&heter_comm::HeterCommStats::bytes_sent);
  f.bytes_remote = avg(&heter_comm::HeterCommStats::bytes_sent_remote);
  f.created = avg(&heter_comm::HeterCommStats::created_on_pull) +
              avg(&heter_comm::HeterCommStats::created_on_push);
  f.row_bytes = sizeof(float) * layout.stride();
  // Card memory a step touches for rows: pull reads every looked-up row once, push reads and
  // writes every merged row once (the rest of the step is keys, positions and records).
  f.pull_lookups = reuse_pull ? f.lookups : f.lookups - f.merged;
  f.row_traffic = f.pull_lookups * f.row_bytes + 2 * f.merged * f.row_bytes;
  f.keys_per_sec = keys_per_step * steps / times.wall_seconds;
  // Keys of all cards per CPU-second of the whole process (pull + push).
  f.keys_per_cpu_sec = keys_per_step * steps * cards_n / times.cpu_seconds;
  f.pull_ms = median(times.pull_seconds) / steps * 1e3;
  f.push_ms = median(times.push_seconds) / steps * 1e3;
  return f;
}

void print_sparse(const SparseSettings& settings, std::size_t keys_per_step,
                  const SparseTimes& times, const SparseFigures& f, int threads_per_card) {
  const int steps = settings.steps;
  if (settings.json) {
    std::printf(
        "{\"bench\":\"sparse\",\"cards\":%d,\"batch\":%lld,\"slots\":%lld,\"keys_per_step\":%zu,"
        "\"universe\":%lld,\"zipf\":%.3f,\"optimizer\":\"%s\",\"mf_dim\":%d,\"steps\":%d,"
        "\"reuse_pull\":%s,"
        "\"threads_per_card\":%d,\"hardware_threads\":%d,\"keys_per_sec_per_card\":%.0f,"
        "\"keys_per_cpu_sec\":%.0f,\"cpu_ms_per_step\":%.4f,\"step_ms\":%.4f,\"pull_ms\":%.4f,"
        "\"push_ms\":%.4f,\"unique_keys_per_card\":%.1f,"
        "\"owner_lookups_per_card\":%.1f,\"merged_updates_per_card\":%.1f,"
        "\"a2a_bytes_per_card\":%.0f,\"a2a_remote_bytes_per_card\":%.0f,"
        "\"row_bytes_touched_per_card\":%.0f,\"row_stride_bytes\":%.0f,\"created_per_step\":%.2f}"
        "\n",
        settings.cards, settings.batch, settings.slots, keys_per_step, settings.universe,
        settings.zipf, settings.optimizer_name.c_str(), settings.mf_dim, steps,
        settings.reuse_pull ? "true" : "false", threads_per_card, device::hardware_threads(),
        f.keys_per_sec, f.keys_per_cpu_sec, times.cpu_seconds / steps * 1e3,
        times.wall_seconds / steps * 1e3, f.pull_ms, f.push_ms, f.unique, f.lookups, f.merged,
        f.bytes_sent, f.bytes_remote, f.row_traffic, f.row_bytes, f.created);
    return;
  }
  std::printf(
      "sparse: %d card(s), %lld examples x %lld slots = %zu keys per card per step, "
      "Zipf(%.2f) over %lld keys, %s, mf_dim %d, %d steps (%d warm-up), %d threads/card%s\n",
      settings.cards, settings.batch, settings.slots, keys_per_step, settings.zipf,
      settings.universe, settings.optimizer_name.c_str(), settings.mf_dim, steps, settings.warmup,
      threads_per_card, settings.reuse_pull ? ", push_pulled" : "");
  std::printf(
      "  pull+push        %12.0f keys/s per card   (%.3f ms/step: pull %.3f, push %.3f)\n"
      "  cpu cost         %12.0f keys per CPU-second, all cards (%.3f CPU-ms per step)\n",
      f.keys_per_sec, times.wall_seconds / steps * 1e3, f.pull_ms, f.push_ms, f.keys_per_cpu_sec,
      times.cpu_seconds / steps * 1e3);
  std::printf(
      "  per card per step: %.0f unique keys sent (of %zu), %.0f owner lookups "
      "(%.0f pull + %.0f push), %.0f merged updates\n",
      f.unique, keys_per_step, f.lookups, f.pull_lookups, f.lookups - f.pull_lookups, f.merged);
  std::printf(
      "  all_to_all_v bytes per card per step: %.0f (%.0f to other cards); row bytes "
      "touched %.0f (stride %.0f B); rows created per step %.2f\n",
      f.bytes_sent, f.bytes_remote, f.row_traffic, f.row_bytes, f.created);
}

int run_sparse(const BenchArgs& args) {
  const SparseSettings settings = sparse_settings(args);
  const int cards_n = settings.cards;
  table::AccessorConfig cfg;
  cfg.optimizer.kind = parse_optimizer(settings.optimizer_name);
  cfg.mf_dim = settings.mf_dim;
  const table::RowLayout layout = table::RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const std::size_t keys_per_step = static_cast<std::size_t>(settings.batch * settings.slots);

  device::CardSet cards =
      device::CardSet::from_list(sparse_card_list(cards_n), 0, 1, settings.threads);
  auto group = comm::make_group(cards);
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores(cards_n);
  std::vector<std::unique_ptr<heter_comm::HeterComm>> comms(cards_n);
  std::vector<CardBatches> data(cards_n);
  SparseTimes times(cards_n);
  cards.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        card_table::HashTableOptions table_options;
        table_options.initial_capacity =
            static_cast<std::size_t>(settings.universe / cards_n * 2 + 1024);
        stores[c] = std::make_unique<card_table::CardSparseStore>(card, cfg, table_options);
        comms[c] = std::make_unique<heter_comm::HeterComm>(card, *stores[c], group->at(c));
        data[c] = make_batches(card, c, settings, keys_per_step, layout);
        run_card_steps(card, c, *comms[c], group->at(c), data[c], settings, &times);
      },
      [&](const std::string& why) { group->abort(why); });
  print_sparse(settings, keys_per_step, times,
               sparse_figures(settings, keys_per_step, layout, times), cards.card(0).threads());
  comms.clear();
  stores.clear();
  return 0;
}

// --- hotkey: the push-record merge of one step on Zipf keys ---------------------------------

using heter_comm::position_t;

// HeterComm's local reduce reads push records in key order and writes one record per key.
using KeyOrderRecords = heter_comm::OrderedRecords<float>;
using StoreSums = heter_comm::RecordRows<float>;

// The loop SegmentReducer replaced: one thread per segment, every field, left to right.
struct OneThreadPerSegment {
  KeyOrderRecords source;
  const position_t* start;
  float* out;
  GPUBOX_HD void operator()(std::size_t u) const {
    float* sum = out + u * static_cast<std::size_t>(source.dim);
    for (int32_t f = 0; f < source.dim; ++f) sum[f] = source.value(start[u], f);
    for (position_t p = start[u] + 1; p < start[u + 1]; ++p) {
      for (int32_t f = 0; f < source.dim; ++f) sum[f] += source.value(p, f);
    }
  }
};

// Single-thread memcpy of `bytes` (the limit the reduction is compared with), GB/s.
double memcpy_limit_gbps(std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes);
  std::vector<double> times;
  for (int i = 0; i < 7; ++i) {
    Timer t;
    std::memcpy(dst.data(), src.data(), bytes);
    times.push_back(t.seconds());
  }
  return static_cast<double>(bytes) / median(times) / 1e9;
}

// One card's batch of push records on Zipf keys: their stable key order, one segment per
// distinct key (start: each segment's first position, then the end), `dim` random floats each.
struct HotkeyBatch {
  std::vector<position_t> order;
  std::vector<position_t> start;
  std::vector<float> records;
  position_t hottest = 0;  // the longest segment's occurrences
  std::size_t occurrences() const { return order.size(); }
  std::size_t segments() const { return start.size() - 1; }
};

HotkeyBatch make_hotkey_batch(long long occurrences, long long universe, double zipf, int dim) {
  ZipfKeys zipf_keys(static_cast<std::size_t>(universe), zipf, 42);
  std::vector<std::pair<uint64_t, position_t>> keyed(static_cast<std::size_t>(occurrences));
  for (std::size_t i = 0; i < keyed.size(); ++i) keyed[i] = {zipf_keys.next(), position_t(i)};
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  HotkeyBatch batch;
  batch.order.resize(keyed.size());
  for (std::size_t p = 0; p < keyed.size(); ++p) {
    batch.order[p] = keyed[p].second;
    if (p == 0 || keyed[p].first != keyed[p - 1].first) batch.start.push_back(position_t(p));
  }
  batch.start.push_back(position_t(keyed.size()));
  for (std::size_t u = 0; u + 1 < batch.start.size(); ++u)
    batch.hottest = std::max(batch.hottest, batch.start[u + 1] - batch.start[u]);
  batch.records.resize(keyed.size() * dim);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (float& v : batch.records) v = value(rng);
  return batch;
}

// Median seconds of the segment reducer's merge of `batch` (chunked) and of the loop it replaced,
// one thread per key (serial).
struct HotkeyTimes {
  double chunked;
  double serial;
};

HotkeyTimes time_hotkey_merges(const HotkeyBatch& batch, int dim, int repeats, device::Card& card) {
  const device::Stream& stream = card.stream();
  const std::size_t segments = batch.segments();
  auto d_order = device::to_device(batch.order, card.memory(), stream);
  auto d_start = device::to_device(batch.start, card.memory(), stream);
  auto d_records = device::to_device(batch.records, card.memory(), stream);
  auto d_out = card.make_buffer<float>(segments * dim);
  const KeyOrderRecords source{d_records.data(), d_order.data(), dim};
  heter_comm::SegmentReducer<float> reducer(card);
  auto reduce = [&] {
    reducer.run(d_start.data(), segments, batch.occurrences(), dim, source,
                StoreSums{d_out.data(), nullptr, dim}, stream);
  };
  auto one_thread = [&] {
    device::parallel_for(stream, segments,
                         OneThreadPerSegment{source, d_start.data(), d_out.data()});
  };
  // Alternating calls, so both see the same machine load; medians. The first round is a warm-up
  // (the reducer's scratch grows there).
  std::vector<double> reduce_times, one_thread_times;
  for (int r = 0; r <= repeats; ++r) {
    for (auto* times : {&reduce_times, &one_thread_times}) {
      Timer t;
      times == &reduce_times ? reduce() : one_thread();
      stream.synchronize();
      if (r > 0) times->push_back(t.seconds());
    }
  }
  return HotkeyTimes{median(reduce_times), median(one_thread_times)};
}

int run_hotkey(const BenchArgs& args) {
  args.expect_only({"occurrences", "keys", "zipf", "dim", "threads", "repeats", "json"});
  const long long occurrences = args.get_int("occurrences", 4096 * 26);
  const long long universe = args.get_int("keys", 1000000);
  const double zipf = args.get_double("zipf", 1.05);
  const int dim = static_cast<int>(args.get_int("dim", 11));
  const int threads = static_cast<int>(args.get_int("threads", 0));
  const int repeats = static_cast<int>(args.get_int("repeats", 20));
  GPUBOX_EXPECTS(occurrences >= 1 && occurrences < (1LL << 31), "--occurrences out of range");
  GPUBOX_EXPECTS(universe >= 1 && dim >= 1 && repeats >= 1,
                 "--keys, --dim, --repeats must be >= 1");

  const HotkeyBatch batch = make_hotkey_batch(occurrences, universe, zipf, dim);
  const std::size_t segments = batch.segments();
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  const HotkeyTimes times = time_hotkey_merges(batch, dim, repeats, card);
  const double chunked = times.chunked;
  const double serial = times.serial;
  // Bytes a reduction must move at least: every record and position read, every sum written.
  const double bytes = double(batch.occurrences()) * (dim + 1) * sizeof(float) +
                       double(segments) * (dim + 1) * sizeof(float);
  const double limit = memcpy_limit_gbps(static_cast<std::size_t>(bytes));
  const double chunked_gbps = bytes / chunked / 1e9;
  const double serial_gbps = bytes / serial / 1e9;
  if (args.has("json")) {
    std::printf(
        "{\"bench\":\"hotkey\",\"occurrences\":%zu,\"segments\":%zu,\"hottest\":%u,\"zipf\":%.3f,"
        "\"dim\":%d,\"threads_per_card\":%d,\"chunked_ms\":%.4f,\"one_thread_ms\":%.4f,"
        "\"chunked_gbps\":%.3f,\"one_thread_gbps\":%.3f,\"memcpy_gbps\":%.3f,"
        "\"chunked_fraction_of_memcpy\":%.4f}\n",
        batch.occurrences(), segments, batch.hottest, zipf, dim, card.threads(), chunked * 1e3,
        serial * 1e3, chunked_gbps, serial_gbps, limit, chunked_gbps / limit);
  } else {
    std::printf(
        "hotkey: %zu occurrences of %zu keys (Zipf %.2f over %lld, hottest %u), %d floats each, "
        "%d threads/card\n"
        "  segment reducer    %8.3f ms  %7.2f GB/s  (%.2f of memcpy %.2f GB/s)\n"
        "  one thread per key %8.3f ms  %7.2f GB/s  (the loop it replaced)\n",
        batch.occurrences(), segments, zipf, universe, batch.hottest, dim, card.threads(),
        chunked * 1e3, chunked_gbps, chunked_gbps / limit, limit, serial * 1e3, serial_gbps);
  }
  return 0;
}

}  // namespace

GPUBOX_BENCH_COMMAND(
    "hotkey",
    "[--occurrences N] [--keys K] [--zipf s] [--dim D] [--threads T] [--repeats R] [--json]  "
    "segmented push-record merge on Zipf keys vs one thread per key, GB/s vs memcpy",
    run_hotkey);

GPUBOX_BENCH_COMMAND(
    "sparse",
    "--cards C --batch B [--slots S] [--keys N] [--zipf s] [--steps N] "
    "[--optimizer adagrad] [--mf-dim D] [--reuse-pull] [--json]  HeterComm pull+push keys/s",
    run_sparse);

}  // namespace gpubox::bench
