// InMemoryDataset::load_into_memory: the file list planned into read items (whole files, or byte
// ranges of large regular files), read by thread_num workers, their counts merged in file order.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <utility>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "dataset/format_detect.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/input_reader.hpp"
#include "dataset/line_reader.hpp"
#include "dataset/memory_source.hpp"
#include "dataset/parallel.hpp"
#include "dataset/pass_data_cache.hpp"
#include "dataset/pipe_command.hpp"

namespace gpubox::dataset {
namespace {

// One unit of reading work: a whole file, or a byte range of a regular file.
struct ReadItem {
  std::size_t file = 0;
  bool whole = true;
  bool first_of_file = true;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct ReadResult {
  InstanceBlock block;
  LoadStats stats;
  Status status;
  bool strict_failure = false;  // strict_parse stopped at a malformed line: errors.back()
};

std::vector<ReadItem> plan_reads(const std::vector<std::string>& files, bool piped,
                                 std::uint64_t split_bytes) {
  std::vector<ReadItem> items;
  for (std::size_t f = 0; f < files.size(); ++f) {
    struct stat st {};
    const bool split = !piped && ::stat(files[f].c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                       static_cast<std::uint64_t>(st.st_size) > split_bytes;
    if (!split) {
      items.push_back(ReadItem{f, true, true, 0, 0});
      continue;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    for (std::uint64_t begin = 0; begin < size; begin += split_bytes) {
      items.push_back(ReadItem{f, false, begin == 0, begin, std::min(size, begin + split_bytes)});
    }
  }
  return items;
}

// Bytes of a regular file; 0 when unknown (the input may be piped and decompressed anyway).
std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)
             ? static_cast<std::uint64_t>(st.st_size)
             : 0;
}
// A file list of memory sources (memory_source.hpp): their blocks in list order, as files read
// whole would give them, and the load's counts.
Status read_memory_sources(const std::vector<std::string>& files, const DatasetConfig& config,
                           std::vector<SharedInstanceBlock>* loaded, LoadStats* stats_out) {
  Timer timer;
  LoadStats stats;
  for (const std::string& name : files) {
    if (!is_memory_source(name)) {
      return Status::InvalidArgument("a file list mixes in-memory data sets and files ('" + name +
                                     "')");
    }
    const MemorySource source = find_memory_source(name);
    const InstanceBlock& block = *source.block;
    if (block.num_slots != static_cast<int>(config.slots.size()) ||
        block.dense_dim != config.dense_dim) {
      return Status::InvalidArgument(
          "in-memory data set '" + name + "' has " + std::to_string(block.num_slots) +
          " slots and " + std::to_string(block.dense_dim) + " dense values, the config " +
          std::to_string(config.slots.size()) + " and " + std::to_string(config.dense_dim));
    }
    const auto differs =
        std::mismatch(source.slot_names.begin(), source.slot_names.end(), config.slots.begin());
    if (differs.first != source.slot_names.end()) {
      const auto at = static_cast<std::size_t>(differs.first - source.slot_names.begin());
      return Status::InvalidArgument(
          "in-memory data set '" + name + "' was built under other slots: slot " +
          std::to_string(at + 1) + " is '" + *differs.first + "' there, '" + *differs.second +
          "' in the config (its keys would be read as another slot's): build it under this "
          "config (Dataset.from_frame(data, config))");
    }
    ++stats.files;
    stats.lines += block.size();
    stats.instances += block.size();
    for (const float label : block.labels) stats.positives += label > 0.5f ? 1 : 0;
    loaded->push_back(source.block);  // immutable: shared, not copied
  }
  stats.seconds = timer.seconds();
  *stats_out = std::move(stats);
  return Status::OK();
}

// The format of a file read as several byte ranges is chosen once, from its first lines.
struct FileFormat {
  int candidate = -1;
  FormatNote note;
  Status status;
};

// The formats of the files `items` read as several ranges (thread_num at a time); the other
// files' entries stay unset (each range of a whole file chooses its own).
std::vector<FileFormat> choose_range_formats(const std::vector<std::string>& files,
                                             const std::vector<ReadItem>& items,
                                             const DatasetConfig& config,
                                             const std::shared_ptr<const SlotIndex>& slots) {
  std::vector<FileFormat> file_formats(files.size());
  std::vector<std::size_t> split_files;
  for (const ReadItem& item : items) {
    if (!item.whole && item.first_of_file) split_files.push_back(item.file);
  }
  parallel_tasks(config.thread_num, split_files.size(), [&](std::size_t k) {
    const std::size_t f = split_files[k];
    StatusOr<std::vector<std::string>> sample = format_sample(files[f], config.max_line_bytes);
    if (!sample.ok()) {
      file_formats[f].status = sample.status();
      return;
    }
    FormatChooser chooser(config, slots);
    file_formats[f].candidate =
        static_cast<int>(chooser.choose(files[f], *sample, &file_formats[f].note));
  });
  return file_formats;
}

// What every reader of one load shares (read only).
struct ReadPlan {
  const std::vector<std::string>& files;
  const std::vector<ReadItem>& items;
  const std::vector<FileFormat>& file_formats;
  const DatasetConfig& config;
  const std::string& pipe_command;  // with its arguments; "" when the files are read directly
};

// Reads item `i` of `plan` into `*result` with `chooser`, while keep_going(); false when it
// failed (an I/O error, a failing pipe_command, a strict parse).
bool read_item(const ReadPlan& plan, std::size_t i, FormatChooser& chooser,
               const std::function<bool()>& keep_going, ReadResult* result) {
  const ReadItem& item = plan.items[i];
  const DatasetConfig& config = plan.config;
  const std::string& path = plan.files[item.file];
  const FileFormat& format = plan.file_formats[item.file];
  result->block = InstanceBlock(static_cast<int>(config.slots.size()), config.dense_dim);
  LoadStats& stats = result->stats;
  stats.files = item.first_of_file ? 1 : 0;
  if (!item.whole && !format.status.ok()) {
    result->status = format.status;
    return false;
  }
  StatusOr<std::unique_ptr<LineReader>> opened =
      item.whole ? LineReader::open(path, plan.pipe_command, config.max_line_bytes)
                 : LineReader::open_range(path, item.begin, item.end, config.max_line_bytes);
  if (!opened.ok()) {
    result->status = opened.status();
    return false;
  }
  InputHooks hooks;
  if (plan.pipe_command.empty()) {
    hooks.expected_bytes = item.whole ? file_size(path) : item.end - item.begin;
  }
  if (!item.whole) {
    hooks.candidate = format.candidate;
    hooks.note = item.first_of_file ? &format.note : nullptr;
  }
  hooks.keep_going = keep_going;
  const InputOutcome outcome =
      read_input(**opened, chooser, config, path, &result->block, &stats, hooks);
  result->status =
      plan.pipe_command.empty() ? outcome.status : explain_pipe_failure(outcome.status, config);
  result->strict_failure = outcome.strict_failure;
  result->block.shrink_to_fit();
  return !outcome.strict_failure && outcome.status.ok();
}

// The items' counts merged in file order into `*merged` (line numbers of ranges become line
// numbers of their file), up to the first failure in item order, which is returned.
Status merge_results(const std::vector<ReadItem>& items, std::vector<ReadResult>& results,
                     const DatasetConfig& config, LoadStats* merged) {
  const std::size_t max_reported_errors = config.max_reported_errors;
  Status failure;
  std::uint64_t line_offset = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    ReadResult& result = results[i];
    if (items[i].first_of_file) line_offset = 0;
    for (ParseErrorRecord& e : result.stats.errors) e.line += line_offset;
    line_offset += result.stats.lines;
    if (failure.ok() && !result.status.ok()) failure = result.status;
    if (failure.ok() && result.strict_failure) {
      failure = Status::Corruption(result.stats.errors.back().to_string() + " (" +
                                   config.strict_parse_reason + ")");
    }
    merged->merge(result.stats, max_reported_errors);
    if (!failure.ok()) break;
  }
  return failure;
}

// The records of `files`, read in ranges on config.thread_num workers (*loaded, in the files'
// order; *merged their statistics), or the first failing range's error. A read that `stopped`
// cut short sets *was_stopped and returns nothing.
template <class Stopped>
Status read_files(const std::vector<std::string>& files, const DatasetConfig& config,
                  const std::string& pipe_command, const Stopped& stopped,
                  std::vector<SharedInstanceBlock>* loaded, LoadStats* merged, bool* was_stopped) {
  const std::vector<ReadItem> items = plan_reads(files, !pipe_command.empty(), config.split_bytes);
  std::vector<ReadResult> results(items.size());
  // One slot index for every parser of this load.
  const auto slots = std::make_shared<const SlotIndex>(config.slots);
  const std::vector<FileFormat> file_formats = choose_range_formats(files, items, config, slots);
  const ReadPlan plan{files, items, file_formats, config, pipe_command};
  // The lowest item index that failed; later items stop early, earlier ones run to the end so
  // that a failing line's number in its file is known.
  std::atomic<std::size_t> first_failure{std::numeric_limits<std::size_t>::max()};

  auto mark_failed = [&](std::size_t item) {
    std::size_t seen = first_failure.load();
    while (item < seen && !first_failure.compare_exchange_weak(seen, item)) {
    }
  };

  const int workers = config.thread_num;
  std::vector<std::unique_ptr<FormatChooser>> choosers(static_cast<std::size_t>(workers));
  std::atomic<std::size_t> next_item{0};
  run_workers(
      std::min<int>(workers, std::max<int>(1, static_cast<int>(items.size()))), [&](int worker) {
        auto& chooser = choosers[static_cast<std::size_t>(worker)];
        chooser = std::make_unique<FormatChooser>(config, slots);
        for (std::size_t i = next_item.fetch_add(1); i < items.size(); i = next_item.fetch_add(1)) {
          if (i > first_failure.load(std::memory_order_relaxed) || stopped()) break;
          const auto keep_going = [&] {
            return i <= first_failure.load(std::memory_order_relaxed) && !stopped();
          };
          if (!read_item(plan, i, *chooser, keep_going, &results[i])) mark_failed(i);
        }
      });

  if (stopped()) {
    *was_stopped = true;
    return Status::OK();
  }
  const Status failure = merge_results(items, results, config, merged);
  if (!failure.ok()) return failure;
  loaded->reserve(results.size());
  for (ReadResult& result : results) {
    loaded->push_back(std::make_shared<const InstanceBlock>(std::move(result.block)));
  }
  return Status::OK();
}

}  // namespace

bool InMemoryDataset::load_cached(const PassKey& key, const std::vector<FileIdentity>& identities) {
  Timer timer;
  PassDataCache::Served served;
  // The keys only for a data set that will hold just this load (note_load).
  if (!cache_->lookup(key, identities, /*with_unique_keys=*/order_.empty(), &served)) return false;
  stats_ = std::move(served.stats);
  stats_.cached_files = stats_.files;
  stats_.cached_instances = stats_.instances;
  stats_.cache_note.clear();
  note_load(&key, served.blocks, std::move(served.unique_keys));
  for (SharedInstanceBlock& block : served.blocks) {
    append_block(std::move(block), /*shared=*/true);
  }
  stats_.seconds = timer.seconds();
  return true;
}

Status InMemoryDataset::load_into_memory() {
  if (!files_.empty() && is_memory_source(files_.front())) {
    std::vector<SharedInstanceBlock> loaded;
    const Status read = read_memory_sources(files_, config_, &loaded, &stats_);
    if (!read.ok()) return read;
    note_load(nullptr, loaded, nullptr);
    for (SharedInstanceBlock& block : loaded) append_block(std::move(block), /*shared=*/false);
    return Status::OK();
  }
  Timer timer;
  const auto stopped = [this] {
    return stop_flag_ != nullptr && stop_flag_->load(std::memory_order_relaxed);
  };
  const auto aborted = [&] {
    stats_ = LoadStats{};
    stats_.seconds = timer.seconds();
    return Status::Aborted("reading stopped as asked (the run was asked to stop)");
  };
  const std::string pipe_command = pipe_command_line(config_);
  // A pipe_command's output is not kept (pass_data_cache.hpp says why).
  std::vector<FileIdentity> identities;
  PassKey key;
  bool cacheable =
      cache_ != nullptr && cache_->budget_bytes() > 0 && pipe_command.empty() && !files_.empty();
  if (cacheable) {
    key = {parse_fingerprint(config_), files_};
    cacheable = identify_files(files_, &identities);
    // A file gone: its list's entry would hold the budget for the rest of the run.
    if (!cacheable) cache_->forget(files_);
  }
  // A stop asked before the load stops a load from the cache too (as a read's items stop).
  if (cacheable && stopped()) return aborted();
  if (cacheable && load_cached(key, identities)) return Status::OK();
  std::vector<SharedInstanceBlock> loaded;
  LoadStats merged;
  bool was_stopped = false;
  const Status read =
      read_files(files_, config_, pipe_command, stopped, &loaded, &merged, &was_stopped);
  if (was_stopped) return aborted();
  merged.seconds = timer.seconds();
  stats_ = std::move(merged);
  if (!read.ok()) return read;
  // Kept only when no file changed while it was read (the records may mix its two versions).
  std::vector<FileIdentity> after;
  bool kept = false;  // its blocks shared with the cache
  if (cacheable && identify_files(files_, &after) && after == identities) {
    PassDataCache::Offered offered = cache_->offer(key, identities, loaded, stats_);
    stats_.cache_note = std::move(offered.note);
    kept = offered.kept;
  }
  note_load(kept ? &key : nullptr, loaded, nullptr);
  for (SharedInstanceBlock& block : loaded) append_block(std::move(block), kept);
  return Status::OK();
}

}  // namespace gpubox::dataset
