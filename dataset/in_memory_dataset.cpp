#include "dataset/in_memory_dataset.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/timer.hpp"
#include "dataset/format_detect.hpp"
#include "dataset/input_reader.hpp"
#include "dataset/line_reader.hpp"
#include "dataset/memory_source.hpp"
#include "dataset/parallel.hpp"
#include "dataset/pipe_command.hpp"

namespace gpubox::dataset {
namespace {

constexpr int kIndexBits = 40;
constexpr std::uint64_t kIndexMask = (std::uint64_t{1} << kIndexBits) - 1;

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

// Fisher-Yates driver: splitmix64 stream, Lemire's multiply-shift for the bound.
class ShuffleRng {
 public:
  explicit ShuffleRng(std::uint64_t seed) : state_(mix64(seed ^ 0x5851f42d4c957f2dULL)) {}
  std::uint64_t below(std::uint64_t bound) {
    state_ += 0x9e3779b97f4a7c15ULL;
    const unsigned __int128 product = static_cast<unsigned __int128>(mix64(state_)) * bound;
    return static_cast<std::uint64_t>(product >> 64);
  }

 private:
  std::uint64_t state_;
};

}  // namespace

InMemoryDataset::InMemoryDataset(DatasetConfig config) : config_(std::move(config)) {
  throw_if_error(validate(config_));
}

void InMemoryDataset::set_thread_num(int threads) {
  GPUBOX_EXPECTS(threads >= 1, "thread_num must be >= 1, got ", threads);
  config_.thread_num = threads;
}

void InMemoryDataset::set_batch_size(int batch_size) {
  GPUBOX_EXPECTS(batch_size >= 1, "batch_size must be >= 1, got ", batch_size);
  config_.batch_size = batch_size;
}

namespace {
// A file list of memory sources (memory_source.hpp): their blocks in list order, as files read
// whole would give them, and the load's counts.
Status read_memory_sources(const std::vector<std::string>& files, const DatasetConfig& config,
                           std::vector<InstanceBlock>* loaded, LoadStats* stats_out) {
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
    ++stats.files;
    stats.lines += block.size();
    stats.instances += block.size();
    for (const float label : block.labels) stats.positives += label > 0.5f ? 1 : 0;
    loaded->push_back(block);
  }
  stats.seconds = timer.seconds();
  *stats_out = std::move(stats);
  return Status::OK();
}

// A loaded block's instances after those of `blocks` (in `order`, as block id and index).
void append_block(InstanceBlock&& block, std::vector<InstanceBlock>* blocks,
                  std::vector<std::uint64_t>* order) {
  if (block.size() == 0) return;
  GPUBOX_EXPECTS(blocks->size() < (std::size_t{1} << (64 - kIndexBits)), "too many blocks");
  const auto block_id = static_cast<std::uint64_t>(blocks->size());
  for (std::size_t k = 0; k < block.size(); ++k) order->push_back((block_id << kIndexBits) | k);
  blocks->push_back(std::move(block));
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
                     std::size_t max_reported_errors, LoadStats* merged) {
  Status failure;
  std::uint64_t line_offset = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    ReadResult& result = results[i];
    if (items[i].first_of_file) line_offset = 0;
    for (ParseErrorRecord& e : result.stats.errors) e.line += line_offset;
    line_offset += result.stats.lines;
    if (failure.ok() && !result.status.ok()) failure = result.status;
    if (failure.ok() && result.strict_failure) {
      failure = Status::Corruption(result.stats.errors.back().to_string() + " (strict_parse)");
    }
    merged->merge(result.stats, max_reported_errors);
    if (!failure.ok()) break;
  }
  return failure;
}

}  // namespace

Status InMemoryDataset::load_into_memory() {
  if (!files_.empty() && is_memory_source(files_.front())) {
    std::vector<InstanceBlock> loaded;
    const Status read = read_memory_sources(files_, config_, &loaded, &stats_);
    if (!read.ok()) return read;
    for (InstanceBlock& block : loaded) append_block(std::move(block), &blocks_, &order_);
    return Status::OK();
  }
  Timer timer;
  const auto stopped = [this] {
    return stop_flag_ != nullptr && stop_flag_->load(std::memory_order_relaxed);
  };
  const std::string pipe_command = pipe_command_line(config_);
  const std::vector<ReadItem> items =
      plan_reads(files_, !pipe_command.empty(), config_.split_bytes);
  std::vector<ReadResult> results(items.size());
  // One slot index for every parser of this load.
  const auto slots = std::make_shared<const SlotIndex>(config_.slots);
  const std::vector<FileFormat> file_formats = choose_range_formats(files_, items, config_, slots);
  const ReadPlan plan{files_, items, file_formats, config_, pipe_command};
  // The lowest item index that failed; later items stop early, earlier ones run to the end so
  // that a failing line's number in its file is known.
  std::atomic<std::size_t> first_failure{std::numeric_limits<std::size_t>::max()};

  auto mark_failed = [&](std::size_t item) {
    std::size_t seen = first_failure.load();
    while (item < seen && !first_failure.compare_exchange_weak(seen, item)) {
    }
  };

  const int workers = config_.thread_num;
  std::vector<std::unique_ptr<FormatChooser>> choosers(static_cast<std::size_t>(workers));
  std::atomic<std::size_t> next_item{0};
  run_workers(
      std::min<int>(workers, std::max<int>(1, static_cast<int>(items.size()))), [&](int worker) {
        auto& chooser = choosers[static_cast<std::size_t>(worker)];
        chooser = std::make_unique<FormatChooser>(config_, slots);
        for (std::size_t i = next_item.fetch_add(1); i < items.size(); i = next_item.fetch_add(1)) {
          if (i > first_failure.load(std::memory_order_relaxed) || stopped()) break;
          const auto keep_going = [&] {
            return i <= first_failure.load(std::memory_order_relaxed) && !stopped();
          };
          if (!read_item(plan, i, *chooser, keep_going, &results[i])) mark_failed(i);
        }
      });

  if (stopped()) {
    stats_ = LoadStats{};
    stats_.seconds = timer.seconds();
    return Status::Aborted("reading stopped as asked (the run was asked to stop)");
  }
  LoadStats merged;
  const Status failure = merge_results(items, results, config_.max_reported_errors, &merged);
  merged.seconds = timer.seconds();
  stats_ = std::move(merged);
  if (!failure.ok()) return failure;
  for (ReadResult& result : results) append_block(std::move(result.block), &blocks_, &order_);
  return Status::OK();
}

void InMemoryDataset::local_shuffle(std::uint64_t seed) {
  ShuffleRng rng(seed);
  for (std::size_t i = order_.size(); i > 1; --i) {
    std::swap(order_[i - 1], order_[rng.below(i)]);
  }
}

void InMemoryDataset::release_memory() {
  std::vector<InstanceBlock>().swap(blocks_);
  std::vector<std::uint64_t>().swap(order_);
}

InMemoryDataset::Location InMemoryDataset::locate(std::size_t position) const {
  const std::uint64_t id = order_[position];
  return Location{static_cast<std::uint32_t>(id >> kIndexBits), id & kIndexMask};
}

InstanceRef InMemoryDataset::instance(std::size_t position) const {
  GPUBOX_EXPECTS(position < order_.size(), "instance ", position, " of ", order_.size());
  const Location at = locate(position);
  return blocks_[at.block].instance(at.index);
}

std::size_t batches_per_card(std::size_t n, std::size_t batch, int cards) {
  GPUBOX_EXPECTS(cards >= 1, "cards must be >= 1, got ", cards);
  const std::size_t round = batch * static_cast<std::size_t>(cards);
  return (n + round - 1) / round;
}

BatchSpan batch_span_of(std::size_t n, std::size_t batch, int card, int cards, std::size_t index) {
  const std::size_t rounds = batches_per_card(n, batch, cards);
  GPUBOX_EXPECTS(card >= 0 && card < cards, "card ", card, " of ", cards);
  GPUBOX_EXPECTS(index < rounds, "batch ", index, " of ", rounds, " per card");
  const std::size_t round_size = batch * static_cast<std::size_t>(cards);
  const std::size_t round_begin = index * round_size;
  const auto c = static_cast<std::size_t>(card);
  if (index + 1 < rounds) return BatchSpan{round_begin + c * batch, round_begin + (c + 1) * batch};
  // Last round: spread the remaining instances evenly.
  const std::size_t left = n - round_begin;
  const std::size_t base = left / static_cast<std::size_t>(cards);
  const std::size_t extra = left % static_cast<std::size_t>(cards);
  const std::size_t begin = round_begin + c * base + std::min(c, extra);
  return BatchSpan{begin, begin + base + (c < extra ? 1 : 0)};
}

std::size_t InMemoryDataset::num_batches_per_card(int cards) const {
  return batches_per_card(order_.size(), static_cast<std::size_t>(config_.batch_size), cards);
}

BatchSpan InMemoryDataset::batch_span(int card, int cards, std::size_t index) const {
  return batch_span_of(order_.size(), static_cast<std::size_t>(config_.batch_size), card, cards,
                       index);
}

void InMemoryDataset::fill_batch(int card, int cards, std::size_t index, Batch* batch) const {
  const BatchSpan span = batch_span(card, cards, index);
  const std::size_t n = span.size();
  const int num_slots = static_cast<int>(config_.slots.size());
  const std::size_t dense_dim = static_cast<std::size_t>(config_.dense_dim);
  // After a shuffle every instance is a handful of cache misses in several arrays; prefetching a
  // few instances ahead (rows first, then the keys their key_begin points to) overlaps them.
  constexpr std::size_t kRowAhead = 16;
  constexpr std::size_t kKeysAhead = 8;
  std::vector<Location> at(n);
  for (std::size_t i = 0; i < n; ++i) at[i] = locate(span.begin + i);
  auto prefetch_row = [&](std::size_t i) {
    const InstanceBlock& b = blocks_[at[i].block];
    const std::size_t k = at[i].index;
    __builtin_prefetch(b.key_begin.data() + k);
    __builtin_prefetch(b.slot_sizes.data() + k * static_cast<std::size_t>(num_slots));
    __builtin_prefetch(b.dense.data() + k * dense_dim);
    __builtin_prefetch(b.labels.data() + k);
  };
  auto prefetch_keys = [&](std::size_t i) {
    const InstanceBlock& b = blocks_[at[i].block];
    const std::size_t k = at[i].index;
    const char* first = reinterpret_cast<const char*>(b.keys.data() + b.key_begin[k]);
    const char* last = reinterpret_cast<const char*>(b.keys.data() + b.key_begin[k + 1]);
    for (const char* line = first; line < last; line += 64) __builtin_prefetch(line);
  };
  std::vector<InstanceRef> refs(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kRowAhead < n) prefetch_row(i + kRowAhead);
    if (i + kKeysAhead < n) prefetch_keys(i + kKeysAhead);
    refs[i] = blocks_[at[i].block].instance(at[i].index);
  }
  assemble_batch(refs.data(), n, num_slots, config_.dense_dim, batch);
}

void assemble_batch(const InstanceRef* instances, std::size_t n, int num_slots, int dense_dim,
                    Batch* batch) {
  const std::size_t dense_width = static_cast<std::size_t>(dense_dim);
  batch->num_slots = num_slots;
  batch->dense_dim = dense_dim;
  batch->labels.resize(n);
  batch->dense.resize(n * dense_width);
  batch->offsets.assign(static_cast<std::size_t>(num_slots) * n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    batch->labels[i] = instances[i].label;
    std::copy(instances[i].dense, instances[i].dense + dense_width,
              batch->dense.begin() + i * dense_width);
  }
  // offsets[s * n + i + 1] = end of slot s of instance i.
  std::uint32_t total = 0;
  for (int s = 0; s < num_slots; ++s) {
    for (std::size_t i = 0; i < n; ++i) {
      total += instances[i].slot_sizes[s];
      batch->offsets[static_cast<std::size_t>(s) * n + i + 1] = total;
    }
  }
  batch->keys.resize(total);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* key = instances[i].keys;
    for (int s = 0; s < num_slots; ++s) {
      const std::uint32_t count = instances[i].slot_sizes[s];
      std::copy(key, key + count,
                batch->keys.begin() + batch->offsets[static_cast<std::size_t>(s) * n + i]);
      key += count;
    }
  }
}

namespace {

// Distinct keys per partition: keys are scattered into `partitions` buckets by part_of(slot,
// key) (counting sort, parallel over instance chunks), then each bucket is deduplicated and
// sorted in parallel. Returns the keys bucket by bucket and the bucket bounds. With
// `slots_out`, also each returned key's slot position (its first occurrence in load order: the
// scatter keeps that order inside a bucket and the dedup keeps the first copy).
template <class PartOf>
std::pair<std::vector<std::uint64_t>, std::vector<std::size_t>> unique_by_partition(
    const std::vector<InstanceBlock>& blocks, std::size_t partitions, int workers, PartOf part_of,
    std::vector<std::int32_t>* slots_out = nullptr) {
  struct Chunk {
    std::size_t block, begin, end;
  };
  std::vector<Chunk> chunks;
  std::size_t total_instances = 0;
  for (const InstanceBlock& b : blocks) total_instances += b.size();
  const std::size_t target = std::max<std::size_t>(4096, total_instances / (4 * workers) + 1);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (std::size_t i = 0; i < blocks[b].size(); i += target) {
      chunks.push_back(Chunk{b, i, std::min(blocks[b].size(), i + target)});
    }
  }
  auto for_each_key = [&](const Chunk& c, auto&& visit) {
    const InstanceBlock& b = blocks[c.block];
    for (std::size_t i = c.begin; i < c.end; ++i) {
      const std::uint64_t* key = b.keys.data() + b.key_begin[i];
      const std::uint32_t* sizes = b.slot_sizes.data() + i * b.num_slots;
      for (int s = 0; s < b.num_slots; ++s) {
        for (std::uint32_t k = 0; k < sizes[s]; ++k, ++key) {
          if (*key != 0) visit(part_of(s, *key), s, *key);
        }
      }
    }
  };
  // Counting sort by partition.
  std::vector<std::size_t> counts(chunks.size() * partitions, 0);
  parallel_tasks(workers, chunks.size(), [&](std::size_t c) {
    std::size_t* count = counts.data() + c * partitions;
    for_each_key(chunks[c], [&](std::size_t p, int, std::uint64_t) { ++count[p]; });
  });
  std::vector<std::size_t> bucket_begin(partitions + 1, 0);
  std::vector<std::size_t> cursor(chunks.size() * partitions);
  std::size_t running = 0;
  for (std::size_t p = 0; p < partitions; ++p) {
    bucket_begin[p] = running;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      cursor[c * partitions + p] = running;
      running += counts[c * partitions + p];
    }
  }
  bucket_begin[partitions] = running;
  std::vector<std::uint64_t> scattered(running);
  std::vector<std::int32_t> scattered_slots(slots_out != nullptr ? running : 0);
  parallel_tasks(workers, chunks.size(), [&](std::size_t c) {
    std::size_t* at = cursor.data() + c * partitions;
    for_each_key(chunks[c], [&](std::size_t p, int slot, std::uint64_t key) {
      if (slots_out != nullptr) scattered_slots[at[p]] = slot;
      scattered[at[p]++] = key;
    });
  });
  // Deduplicate each bucket with an open-addressing set (keys repeat a lot in CTR data: far
  // cheaper than sorting every occurrence), compacting in place, then sort the distinct keys so
  // the order does not depend on thread timing.
  std::vector<std::size_t> unique_count(partitions, 0);
  parallel_tasks(workers, partitions, [&](std::size_t p) {
    std::uint64_t* bucket = scattered.data() + bucket_begin[p];
    std::int32_t* bucket_slots =
        slots_out != nullptr ? scattered_slots.data() + bucket_begin[p] : nullptr;
    const std::size_t n = bucket_begin[p + 1] - bucket_begin[p];
    std::size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    const std::size_t mask = capacity - 1;
    std::vector<std::uint64_t> table(capacity, 0);  // 0 = empty slot: key 0 was filtered out
    std::size_t kept = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint64_t key = bucket[k];
      for (std::size_t slot = mix64(key) & mask;; slot = (slot + 1) & mask) {
        if (table[slot] == key) break;
        if (table[slot] == 0) {
          table[slot] = key;
          if (bucket_slots != nullptr) bucket_slots[kept] = bucket_slots[k];
          bucket[kept++] = key;
          break;
        }
      }
    }
    if (bucket_slots == nullptr) {
      std::sort(bucket, bucket + kept);
    } else {
      std::vector<std::pair<std::uint64_t, std::int32_t>> pairs(kept);
      for (std::size_t k = 0; k < kept; ++k) pairs[k] = {bucket[k], bucket_slots[k]};
      std::sort(pairs.begin(), pairs.end());  // keys are distinct: ordered by key alone
      for (std::size_t k = 0; k < kept; ++k) std::tie(bucket[k], bucket_slots[k]) = pairs[k];
    }
    unique_count[p] = kept;
  });
  std::vector<std::size_t> out_begin(partitions + 1, 0);
  for (std::size_t p = 0; p < partitions; ++p) out_begin[p + 1] = out_begin[p] + unique_count[p];
  std::vector<std::uint64_t> out(out_begin[partitions]);
  if (slots_out != nullptr) slots_out->assign(out.size(), 0);
  parallel_tasks(workers, partitions, [&](std::size_t p) {
    const auto from = static_cast<std::ptrdiff_t>(bucket_begin[p]);
    const auto to = static_cast<std::ptrdiff_t>(out_begin[p]);
    std::copy_n(scattered.begin() + from, unique_count[p], out.begin() + to);
    if (slots_out != nullptr) {
      std::copy_n(scattered_slots.begin() + from, unique_count[p], slots_out->begin() + to);
    }
  });
  return {std::move(out), std::move(out_begin)};
}

// Buckets that are ranges of key values, so the buckets' sorted keys laid end to end are sorted
// (the pass's users need its keys sorted: one sort fewer than sorting them again). The ranges are
// cut at quantiles of a sample of the key occurrences, so each bucket gets about as many
// occurrences whatever the keys look like (hashed feasigns, small dense ids, slot-prefixed ids,
// an outlier near 2^64): each bucket's dedup table is sized by its occurrences and runs on one
// thread. The bounds change where work goes, never the result (the distinct keys sorted, each
// with its first occurrence's slot); a fixed bucket count keeps that independent of thread_num.
constexpr std::size_t kUniqueKeyBuckets = 256;
// Occurrences sampled (evenly spaced in load order) to cut the ranges.
constexpr std::size_t kBucketSample = 64 * kUniqueKeyBuckets;
struct KeyRangeBucket {
  // kUniqueKeyBuckets - 1 ascending bounds: bucket b holds bounds[b-1] <= key < bounds[b].
  std::array<std::uint64_t, kUniqueKeyBuckets - 1> bounds{};
  // How many bounds are <= key: a branchless binary search of 8 fixed steps (2^8 - 1 bounds),
  // run twice for every key occurrence of the pass.
  std::size_t operator()(int, std::uint64_t key) const {
    static_assert(kUniqueKeyBuckets == 256, "8 steps search 255 bounds");
    std::size_t at = 0;
    for (std::size_t step = kUniqueKeyBuckets / 2; step > 0; step /= 2) {
      at += bounds[at + step - 1] <= key ? step : 0;
    }
    return at;
  }
};
KeyRangeBucket key_range_buckets(const std::vector<InstanceBlock>& blocks) {
  std::size_t total = 0;
  for (const InstanceBlock& b : blocks) total += b.keys.size();
  std::vector<std::uint64_t> sample;
  if (total > 0) {
    const std::size_t stride = std::max<std::size_t>(1, total / kBucketSample);
    std::size_t next = stride / 2;
    std::size_t base = 0;
    for (const InstanceBlock& b : blocks) {
      for (; next < base + b.keys.size(); next += stride) {
        const std::uint64_t key = b.keys[next - base];
        if (key != 0) sample.push_back(key);  // key 0 is not a key (filtered out)
      }
      base += b.keys.size();
    }
  }
  std::sort(sample.begin(), sample.end());
  KeyRangeBucket out;
  // No sample (no key): every bound 2^64-1, so a key goes to bucket 0 (255 only for 2^64-1).
  out.bounds.fill(std::numeric_limits<std::uint64_t>::max());
  if (sample.empty()) return out;
  for (std::size_t b = 1; b < kUniqueKeyBuckets; ++b) {
    out.bounds[b - 1] = sample[b * sample.size() / kUniqueKeyBuckets];
  }
  return out;
}

}  // namespace

std::vector<std::uint64_t> InMemoryDataset::unique_keys() const {
  return unique_by_partition(blocks_, kUniqueKeyBuckets, config_.thread_num,
                             key_range_buckets(blocks_))
      .first;
}

UniqueKeys InMemoryDataset::unique_keys_and_slots() const {
  UniqueKeys out;
  std::vector<std::int32_t> positions;
  out.keys = unique_by_partition(blocks_, kUniqueKeyBuckets, config_.thread_num,
                                 key_range_buckets(blocks_), &positions)
                 .first;
  std::vector<std::int32_t> ids(config_.slots.size());
  for (std::size_t s = 0; s < ids.size(); ++s) ids[s] = slot_id(config_.slots, s);
  out.slots.resize(positions.size());
  for (std::size_t k = 0; k < positions.size(); ++k) {
    out.slots[k] = ids[static_cast<std::size_t>(positions[k])];
  }
  return out;
}

std::vector<std::size_t> InMemoryDataset::unique_keys_per_slot() const {
  const std::size_t num_slots = config_.slots.size();
  const auto bounds =
      unique_by_partition(blocks_, num_slots, config_.thread_num, [](int slot, std::uint64_t) {
        return static_cast<std::size_t>(slot);
      }).second;
  std::vector<std::size_t> counts(num_slots);
  for (std::size_t s = 0; s < num_slots; ++s) counts[s] = bounds[s + 1] - bounds[s];
  return counts;
}

std::size_t InMemoryDataset::memory_bytes() const {
  std::size_t bytes = order_.capacity() * sizeof(std::uint64_t);
  for (const InstanceBlock& b : blocks_) bytes += b.memory_bytes();
  return bytes;
}

}  // namespace gpubox::dataset
