// gpubox_bench dataset: InMemoryDataset load throughput (MB/s, instances/s) for several reader
// thread counts on slot-format files, next to `cat files > /dev/null` measured in the same run
// (the machine's read rate for the same bytes), plus the unique-key pass and the steps' reads of
// a shuffled pass through its index against the same pass copied into that order (store_in_order).
//
// Make the data first, e.g. `gpubox_data gen --out /tmp/gen --lines 2000000 --files 8 --seed 1`.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "dataset/data_files.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/line_reader.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {
namespace {

// CPU seconds (user + system) of this process so far: on a busy machine the wall clock says
// little, the CPU time per byte still says what parsing costs.
double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    if (!item.empty()) out.push_back(std::atoi(item.c_str()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// The steps' reads of a shuffled pass (fill_batch of every batch of one card, and the key runs
// the step plan walks), through the shuffle's index over the loaded blocks and after
// store_in_order copied them into that order, alternating, `repeat` shuffles; with the copy's
// own time. Medians of CPU seconds (the machine is shared).
void time_shuffled_batches(dataset::InMemoryDataset& ds, int batch_size, int repeat) {
  ds.set_batch_size(batch_size);
  std::vector<double> fill_index, fill_stored, runs_index, runs_stored, store;
  std::size_t keys = 0;
  auto read_pass = [&](std::vector<double>* fill, std::vector<double>* runs) {
    dataset::Batch batch;
    const std::size_t batches = ds.num_batches_per_card(1);
    double cpu = cpu_seconds();
    for (std::size_t b = 0; b < batches; ++b) {
      ds.fill_batch(0, 1, b, &batch);
      keys += batch.keys.size();
    }
    fill->push_back(cpu_seconds() - cpu);
    cpu = cpu_seconds();
    std::uint64_t sum = 0;
    for (std::size_t b = 0; b < batches; ++b) {
      const dataset::BatchSpan span = ds.batch_span(0, 1, b);
      ds.visit_key_runs(span.begin, span.end, [&sum](const std::uint64_t* k, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) sum += k[i];
      });
    }
    runs->push_back(cpu_seconds() - cpu);
    keys += sum & 1;  // kept
  };
  for (int r = 0; r < repeat; ++r) {
    ds.local_shuffle(static_cast<std::uint64_t>(r) + 1);
    read_pass(&fill_index, &runs_index);
    const double cpu = cpu_seconds();
    GPUBOX_EXPECTS(ds.store_in_order(), "store_in_order stopped");
    store.push_back(cpu_seconds() - cpu);
    read_pass(&fill_stored, &runs_stored);
  }
  std::printf(
      "shuffled pass of %zu, batch %d, CPU s (median of %d): fill_batch %.3f through the index, "
      "%.3f stored in order; key runs %.3f / %.3f; store_in_order %.3f (%zu keys)\n",
      ds.size(), batch_size, repeat, median(fill_index), median(fill_stored), median(runs_index),
      median(runs_stored), median(store), keys);
}

int run_dataset(const BenchArgs& args) {
  args.expect_only({"dir", "threads", "slots", "dense", "repeat", "batch"});
  const std::string dir = args.get("dir", "");
  GPUBOX_EXPECTS(!dir.empty(), "--dir DIR (slot-format files, e.g. from gpubox_data gen)");
  const std::vector<int> thread_counts = parse_list(args.get("threads", "1,2"));
  const int repeat = static_cast<int>(args.get_int("repeat", 1));
  StatusOr<dataset::DataFileList> listed = dataset::list_data_files(dir);
  throw_if_error(listed.status());
  const std::vector<std::string>& files = listed->files;
  GPUBOX_EXPECTS(!files.empty(), "no data files in ", dir);

  dataset::DatasetConfig config;
  config.slots = dataset::numbered_slots(static_cast<int>(args.get_int("slots", 26)) + 1);
  config.dense_dim = static_cast<int>(args.get_int("dense", 13));

  std::string cat = "cat";
  for (const std::string& f : files) cat += " " + dataset::shell_quote(f);
  cat += " > /dev/null";
  GPUBOX_EXPECTS(std::system(cat.c_str()) == 0, "cat failed");  // warm the page cache
  std::vector<double> cat_times;
  for (int r = 0; r < repeat; ++r) {
    Timer timer;
    GPUBOX_EXPECTS(std::system(cat.c_str()) == 0, "cat failed");
    cat_times.push_back(timer.seconds());
  }

  std::uint64_t bytes = 0;
  std::printf("files: %zu in %s\n", files.size(), dir.c_str());
  for (int threads : thread_counts) {
    std::vector<double> load_times, unique_times, load_cpu, unique_cpu;
    std::size_t instances = 0, unique = 0;
    for (int r = 0; r < repeat; ++r) {
      dataset::DatasetConfig c = config;
      c.thread_num = threads;
      dataset::InMemoryDataset ds(c);
      ds.set_filelist(files);
      Timer timer;
      double cpu = cpu_seconds();
      throw_if_error(ds.load_into_memory());
      load_times.push_back(timer.seconds());
      load_cpu.push_back(cpu_seconds() - cpu);
      bytes = ds.load_stats().bytes;
      instances = ds.size();
      GPUBOX_EXPECTS(ds.load_stats().skipped_lines() == 0, "unexpected malformed lines");
      if (r == 0 && threads == thread_counts.front()) {
        time_shuffled_batches(ds, static_cast<int>(args.get_int("batch", 512)), repeat);
      }
      timer.reset();
      cpu = cpu_seconds();
      unique = ds.unique_keys().size();
      unique_times.push_back(timer.seconds());
      unique_cpu.push_back(cpu_seconds() - cpu);
    }
    const double load = median(load_times);
    const double cpu = median(load_cpu);
    std::printf(
        "threads %d: load %.3f s, %.1f MB/s, %.0f instances/s; CPU %.3f s = %.1f MB per "
        "CPU-second; unique_keys %zu in %.3f s (CPU %.3f s)\n",
        threads, load, bytes / 1e6 / load, instances / load, cpu, bytes / 1e6 / cpu, unique,
        median(unique_times), median(unique_cpu));
  }
  const double cat_s = median(cat_times);
  std::printf("cat > /dev/null: %.3f s, %.1f MB/s for %.1f MB\n", cat_s, bytes / 1e6 / cat_s,
              bytes / 1e6);
  return 0;
}

}  // namespace
}  // namespace gpubox::bench

GPUBOX_BENCH_COMMAND(
    "dataset", "--dir DIR [--threads 1,2] [--slots 26] [--dense 13] [--repeat 1] [--batch 512]",
    gpubox::bench::run_dataset);
