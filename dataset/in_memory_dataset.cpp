#include "dataset/in_memory_dataset.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <tuple>
#include <utility>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "dataset/parallel.hpp"

namespace gpubox::dataset {
namespace {

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

void InMemoryDataset::local_shuffle(std::uint64_t seed) {
  ShuffleRng rng(seed);
  for (std::size_t i = order_.size(); i > 1; --i) {
    std::swap(order_[i - 1], order_[rng.below(i)]);
  }
}

bool InMemoryDataset::in_block_order() const {
  std::size_t p = 0;
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    const std::uint64_t first = static_cast<std::uint64_t>(b) << kIndexBits;
    for (std::size_t i = 0; i < blocks_[b]->size(); ++i, ++p) {
      if (p == order_.size() || order_[p] != (first | i)) return false;
    }
  }
  return p == order_.size();
}

void InMemoryDataset::release_memory() {
  std::vector<SharedInstanceBlock>().swap(blocks_);
  std::vector<std::uint64_t>().swap(order_);
  shared_bytes_ = 0;
  cache_load_.reset();
}

void InMemoryDataset::set_pass_cache(PassDataCache* cache) {
  // The load held keeps its keys, but offers none to a cache no longer set (it may be gone).
  if (cache != cache_ && cache_load_ != nullptr) cache_load_->cache = nullptr;
  cache_ = cache;
}

void InMemoryDataset::note_load(const PassKey* key, const std::vector<SharedInstanceBlock>& blocks,
                                std::shared_ptr<const UniqueKeys> unique_keys) {
  stats_.cached_unique_keys = false;
  // A second load appended (no instance before: still just this one), or a load not the cache's.
  if (key == nullptr || !order_.empty()) {
    cache_load_.reset();
    return;
  }
  auto load = std::make_unique<CacheLoad>();
  load->cache = cache_;
  load->key = *key;
  load->blocks = blocks;
  stats_.cached_unique_keys = unique_keys != nullptr;
  {
    MutexLock lock(load->mu);  // not shared yet; for the analysis
    load->unique_keys = std::move(unique_keys);
  }
  cache_load_ = std::move(load);
}

void InMemoryDataset::append_block(SharedInstanceBlock block, bool shared) {
  if (block->size() == 0) return;
  if (shared) shared_bytes_ += block->memory_bytes();
  GPUBOX_EXPECTS(blocks_.size() < (std::size_t{1} << (64 - kIndexBits)), "too many blocks");
  const auto block_id = static_cast<std::uint64_t>(blocks_.size());
  const std::size_t first = order_.size();
  order_.resize(first + block->size());
  for (std::size_t k = 0; k < block->size(); ++k) order_[first + k] = (block_id << kIndexBits) | k;
  blocks_.push_back(std::move(block));
}

InMemoryDataset::Location InMemoryDataset::locate(std::size_t position) const {
  const std::uint64_t id = order_[position];
  return Location{static_cast<std::uint32_t>(id >> kIndexBits),
                  id & ((std::uint64_t{1} << kIndexBits) - 1)};
}

InstanceRef InMemoryDataset::instance(std::size_t position) const {
  GPUBOX_EXPECTS(position < order_.size(), "instance ", position, " of ", order_.size());
  const Location at = locate(position);
  return blocks_[at.block]->instance(at.index);
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

namespace {
void prefetch_bytes(const std::uint64_t* first, std::uint64_t count) {
  // By offset: a pointer stepped past the end of the keys would be undefined.
  const char* bytes = reinterpret_cast<const char*>(first);
  const std::size_t size = count * sizeof(std::uint64_t);
  for (std::size_t offset = 0; offset < size; offset += 64) __builtin_prefetch(bytes + offset);
}
}  // namespace

void InMemoryDataset::prefetch_row(std::size_t position) const {
  const Location at = locate(position);
  const InstanceBlock& b = *blocks_[at.block];
  __builtin_prefetch(b.key_begin.data() + at.index);
  __builtin_prefetch(b.slot_sizes.data() + at.index * config_.slots.size());
  __builtin_prefetch(b.dense.data() + at.index * static_cast<std::size_t>(config_.dense_dim));
  __builtin_prefetch(b.labels.data() + at.index);
}

void InMemoryDataset::prefetch_key_begin(std::size_t position) const {
  const Location at = locate(position);
  __builtin_prefetch(blocks_[at.block]->key_begin.data() + at.index);
}

void InMemoryDataset::prefetch_keys(std::size_t position) const {
  const Location at = locate(position);
  const InstanceBlock& b = *blocks_[at.block];
  prefetch_bytes(b.keys.data() + b.key_begin[at.index],
                 b.key_begin[at.index + 1] - b.key_begin[at.index]);
}

// Rows a few positions ahead, then the keys their key_begin points to (the row's line is in by
// then).
template <class Visit>
void InMemoryDataset::visit_in_order(std::size_t begin, std::size_t end, Visit&& visit) const {
  for (std::size_t p = begin; p < end; ++p) {
    if (p + kRowAhead < end) prefetch_row(p + kRowAhead);
    if (p + kKeysAhead < end) prefetch_keys(p + kKeysAhead);
    const Location at = locate(p);
    visit(p, blocks_[at.block]->instance(at.index));
  }
}

void InMemoryDataset::fill_batch(int card, int cards, std::size_t index, Batch* batch) const {
  const BatchSpan span = batch_span(card, cards, index);
  std::vector<InstanceRef> refs(span.size());
  visit_in_order(span.begin, span.end,
                 [&](std::size_t p, const InstanceRef& ref) { refs[p - span.begin] = ref; });
  assemble_batch(refs.data(), refs.size(), static_cast<int>(config_.slots.size()),
                 config_.dense_dim, batch);
}

void InMemoryDataset::copy_in_order(std::size_t begin, std::size_t end, InstanceBlock* out) const {
  const std::size_t count = end - begin;
  const auto num_slots = static_cast<std::size_t>(config_.slots.size());
  const auto dense_dim = static_cast<std::size_t>(config_.dense_dim);
  // Every array sized once, exactly (memory_bytes() counts capacity), each instance's fields
  // copied to their place: its row first (where its keys start and come from), then its keys,
  // prefetched from where the rows said.
  out->labels.resize(count);
  out->dense.resize(count * dense_dim);
  out->slot_sizes.resize(count * num_slots);
  out->key_begin.resize(count + 1);
  out->key_begin[0] = 0;
  std::vector<const std::uint64_t*> keys_from(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (i + kRowAhead < count) prefetch_row(begin + i + kRowAhead);
    const Location at = locate(begin + i);
    const InstanceBlock& b = *blocks_[at.block];
    out->labels[i] = b.labels[at.index];
    std::copy_n(b.dense.data() + at.index * dense_dim, dense_dim,
                out->dense.data() + i * dense_dim);
    std::copy_n(b.slot_sizes.data() + at.index * num_slots, num_slots,
                out->slot_sizes.data() + i * num_slots);
    keys_from[i] = b.keys.data() + b.key_begin[at.index];
    out->key_begin[i + 1] = out->key_begin[i] + (b.key_begin[at.index + 1] - b.key_begin[at.index]);
  }
  out->keys.resize(out->key_begin[count]);
  for (std::size_t i = 0; i < count; ++i) {
    if (i + kKeysAhead < count) {
      const std::size_t ahead = i + kKeysAhead;
      prefetch_bytes(keys_from[ahead], out->key_begin[ahead + 1] - out->key_begin[ahead]);
    }
    std::copy_n(keys_from[i], out->key_begin[i + 1] - out->key_begin[i],
                out->keys.data() + out->key_begin[i]);
  }
}

bool InMemoryDataset::store_in_order() {
  const std::size_t n = order_.size();
  if (n == 0) return true;
  constexpr std::size_t kBlockInstances = std::size_t{1} << 16;  // one block a task
  const std::size_t blocks = (n + kBlockInstances - 1) / kBlockInstances;
  const int num_slots = static_cast<int>(config_.slots.size());
  std::vector<InstanceBlock> stored(blocks, InstanceBlock(num_slots, config_.dense_dim));
  std::atomic<bool> stopped{false};
  parallel_tasks(config_.thread_num, blocks, [&](std::size_t block) {
    if (stopped.load(std::memory_order_relaxed)) return;
    if (stop_flag_ != nullptr && stop_flag_->load(std::memory_order_relaxed)) {
      stopped.store(true, std::memory_order_relaxed);
      return;
    }
    const std::size_t begin = block * kBlockInstances;
    const std::size_t end = std::min(n, begin + kBlockInstances);
    copy_in_order(begin, end, &stored[block]);
  });
  if (stopped.load()) return false;  // `stored` freed, the current storage kept
  // New blocks: the old ones (perhaps the pass cache's, which they stay) are released.
  blocks_.clear();
  shared_bytes_ = 0;
  cache_load_.reset();  // first occurrences in the stored order now
  for (InstanceBlock& block : stored) {
    blocks_.push_back(std::make_shared<const InstanceBlock>(std::move(block)));
  }
  for (std::size_t p = 0; p < n; ++p) {
    order_[p] =
        (static_cast<std::uint64_t>(p / kBlockInstances) << kIndexBits) | (p % kBlockInstances);
  }
  return true;
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
  std::uint64_t* keys = batch->keys.data();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* key = instances[i].keys;
    for (int s = 0; s < num_slots; ++s) {
      const std::uint32_t count = instances[i].slot_sizes[s];
      std::uint64_t* out = keys + batch->offsets[static_cast<std::size_t>(s) * n + i];
      // Most slots hold one key: a store, not a call to memmove (13k calls a batch of 512 x 26
      // slots, 0.35% of a wide_deep run's CPU time).
      if (count == 1) {
        *out = *key;
      } else {
        std::copy(key, key + count, out);
      }
      key += count;
    }
  }
}

namespace {

// A run of instances of one block: the unit of work of the counting sort's passes.
struct InstanceChunk {
  std::size_t block, begin, end;
};

// The blocks' instances in chunks of about 1/4 of a worker's share (at least 4096 instances),
// none across a block boundary, in load order.
std::vector<InstanceChunk> instance_chunks(const std::vector<SharedInstanceBlock>& blocks,
                                           int workers) {
  std::vector<InstanceChunk> chunks;
  std::size_t total_instances = 0;
  for (const SharedInstanceBlock& b : blocks) total_instances += b->size();
  const std::size_t target = std::max<std::size_t>(4096, total_instances / (4 * workers) + 1);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (std::size_t i = 0; i < blocks[b]->size(); i += target) {
      chunks.push_back(InstanceChunk{b, i, std::min(blocks[b]->size(), i + target)});
    }
  }
  return chunks;
}

// visit(part_of(slot, key), slot, key) for every key of the chunk's instances but key 0, in
// load order.
template <class PartOf, class Visit>
void for_each_key(const InstanceBlock& b, const InstanceChunk& c, const PartOf& part_of,
                  Visit&& visit) {
  for (std::size_t i = c.begin; i < c.end; ++i) {
    const std::uint64_t* key = b.keys.data() + b.key_begin[i];
    const std::uint32_t* sizes = b.slot_sizes.data() + i * b.num_slots;
    for (int s = 0; s < b.num_slots; ++s) {
      for (std::uint32_t k = 0; k < sizes[s]; ++k, ++key) {
        if (*key != 0) visit(part_of(s, *key), s, *key);
      }
    }
  }
}

// Key occurrences bucket by bucket, one bucket a partition.
struct ScatteredKeys {
  std::vector<std::uint64_t> keys;
  std::vector<std::int32_t> slots;        // each key's slot position; empty unless asked for
  std::vector<std::size_t> bucket_begin;  // partitions + 1 bounds into `keys`
};

// Every key occurrence of the chunks (but key 0) scattered into the bucket of its partition, each
// bucket in load order: a counting sort, parallel over the chunks.
template <class PartOf>
ScatteredKeys scatter_by_partition(const std::vector<SharedInstanceBlock>& blocks,
                                   const std::vector<InstanceChunk>& chunks, std::size_t partitions,
                                   int workers, const PartOf& part_of, bool with_slots) {
  std::vector<std::size_t> counts(chunks.size() * partitions, 0);
  parallel_tasks(workers, chunks.size(), [&](std::size_t c) {
    std::size_t* count = counts.data() + c * partitions;
    for_each_key(*blocks[chunks[c].block], chunks[c], part_of,
                 [&](std::size_t p, int, std::uint64_t) { ++count[p]; });
  });
  ScatteredKeys out;
  out.bucket_begin.assign(partitions + 1, 0);
  std::vector<std::size_t> cursor(chunks.size() * partitions);
  std::size_t running = 0;
  for (std::size_t p = 0; p < partitions; ++p) {
    out.bucket_begin[p] = running;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      cursor[c * partitions + p] = running;
      running += counts[c * partitions + p];
    }
  }
  out.bucket_begin[partitions] = running;
  out.keys.resize(running);
  out.slots.resize(with_slots ? running : 0);
  parallel_tasks(workers, chunks.size(), [&](std::size_t c) {
    std::size_t* at = cursor.data() + c * partitions;
    for_each_key(*blocks[chunks[c].block], chunks[c], part_of,
                 [&](std::size_t p, int slot, std::uint64_t key) {
                   if (with_slots) out.slots[at[p]] = slot;
                   out.keys[at[p]++] = key;
                 });
  });
  return out;
}

// Keeps the first copy of each key of bucket[0, n) (with its slot position, when `bucket_slots`
// is given) at the front of the bucket, sorted by key; returns how many. An open-addressing set
// (keys repeat a lot in CTR data: far cheaper than sorting every occurrence), then a sort of the
// distinct keys so the order does not depend on thread timing.
std::size_t dedup_and_sort_bucket(std::uint64_t* bucket, std::int32_t* bucket_slots,
                                  std::size_t n) {
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
  return kept;
}

// Distinct keys per partition: keys are scattered into `partitions` buckets by part_of(slot,
// key) (counting sort, parallel over instance chunks), then each bucket is deduplicated and
// sorted in parallel. Returns the keys bucket by bucket and the bucket bounds. With
// `slots_out`, also each returned key's slot position (its first occurrence in load order: the
// scatter keeps that order inside a bucket and the dedup keeps the first copy).
template <class PartOf>
std::pair<std::vector<std::uint64_t>, std::vector<std::size_t>> unique_by_partition(
    const std::vector<SharedInstanceBlock>& blocks, std::size_t partitions, int workers,
    PartOf part_of, std::vector<std::int32_t>* slots_out = nullptr) {
  ScatteredKeys scattered = scatter_by_partition(
      blocks, instance_chunks(blocks, workers), partitions, workers, part_of, slots_out != nullptr);
  const std::vector<std::size_t>& bucket_begin = scattered.bucket_begin;
  std::vector<std::size_t> unique_count(partitions, 0);
  parallel_tasks(workers, partitions, [&](std::size_t p) {
    std::int32_t* bucket_slots =
        slots_out != nullptr ? scattered.slots.data() + bucket_begin[p] : nullptr;
    unique_count[p] = dedup_and_sort_bucket(scattered.keys.data() + bucket_begin[p], bucket_slots,
                                            bucket_begin[p + 1] - bucket_begin[p]);
  });
  std::vector<std::size_t> out_begin(partitions + 1, 0);
  for (std::size_t p = 0; p < partitions; ++p) out_begin[p + 1] = out_begin[p] + unique_count[p];
  std::vector<std::uint64_t> out(out_begin[partitions]);
  if (slots_out != nullptr) slots_out->assign(out.size(), 0);
  parallel_tasks(workers, partitions, [&](std::size_t p) {
    const auto from = static_cast<std::ptrdiff_t>(bucket_begin[p]);
    const auto to = static_cast<std::ptrdiff_t>(out_begin[p]);
    std::copy_n(scattered.keys.begin() + from, unique_count[p], out.begin() + to);
    if (slots_out != nullptr) {
      std::copy_n(scattered.slots.begin() + from, unique_count[p], slots_out->begin() + to);
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
KeyRangeBucket key_range_buckets(const std::vector<SharedInstanceBlock>& blocks) {
  std::size_t total = 0;
  for (const SharedInstanceBlock& b : blocks) total += b->keys.size();
  std::vector<std::uint64_t> sample;
  if (total > 0) {
    const std::size_t stride = std::max<std::size_t>(1, total / kBucketSample);
    std::size_t next = stride / 2;
    std::size_t base = 0;
    for (const SharedInstanceBlock& b : blocks) {
      for (; next < base + b->keys.size(); next += stride) {
        const std::uint64_t key = b->keys[next - base];
        if (key != 0) sample.push_back(key);  // key 0 is not a key (filtered out)
      }
      base += b->keys.size();
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
  if (cache_load_ != nullptr) {
    MutexLock lock(cache_load_->mu);
    if (cache_load_->unique_keys != nullptr) return cache_load_->unique_keys->keys;
  }
  return unique_by_partition(blocks_, kUniqueKeyBuckets, config_.thread_num,
                             key_range_buckets(blocks_))
      .first;
}

UniqueKeys InMemoryDataset::unique_keys_and_slots() const {
  if (cache_load_ == nullptr) return compute_unique_keys_and_slots();
  return *unique_keys_and_slots_shared();
}

std::shared_ptr<const UniqueKeys> InMemoryDataset::unique_keys_and_slots_shared() const {
  if (cache_load_ == nullptr) {
    return std::make_shared<const UniqueKeys>(compute_unique_keys_and_slots());
  }
  CacheLoad& load = *cache_load_;
  {
    MutexLock lock(load.mu);
    if (load.unique_keys != nullptr) return load.unique_keys;
  }
  auto computed = std::make_shared<const UniqueKeys>(compute_unique_keys_and_slots());
  {
    MutexLock lock(load.mu);
    // A concurrent call computed them first: one object.
    if (load.unique_keys != nullptr) return load.unique_keys;
    load.unique_keys = computed;
  }
  // Only to the cache the load came from, and only while it is set (set_pass_cache).
  if (load.cache != nullptr && load.cache == cache_) {
    load.cache->remember_unique_keys(load.key, load.blocks, computed);
  }
  return computed;
}

UniqueKeys InMemoryDataset::compute_unique_keys_and_slots() const {
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
  for (const SharedInstanceBlock& b : blocks_) bytes += b->memory_bytes();
  return bytes;
}

}  // namespace gpubox::dataset
