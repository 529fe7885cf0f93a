// HeterComm's planned steps at the pass's fixed sizes (see PaddedSteps in
// detail/heter_comm_impl.cuh): the sparse half of a training step as two step graphs, "sparse
// pull" and "sparse push" (issue 31, item 3), in both placements.
//
// The sizes: the batch padded to the pass's largest (its occurrence count read on the card), the
// exchanges in blocks of `block` keys per pair of cards, each key block led by its live count.
//
//   pull   local dedup over the padded batch (dead positions sort last, under a sentinel owner,
//          and form no segment) -> each live unique key to its owner's block, each block's live
//          count in its first word -> all_to_all (block + 1 keys per pair) -> the owner looks up
//          the live slots, counts the misses, plans the merge over the live slots -> the step's
//          check into the card's check words -> the owner fills the records of every slot (dead:
//          zeros) -> all_to_all (block records per pair) -> each live occurrence's record.
//   push   the live occurrences' push records summed per unique key into its slot -> all_to_all
//          -> merged on the owner over the live slots -> one optimizer step per live merged key.
//
// Replicated placement (Collective mode): a card's one block holds all its live unique keys
// (every card is every key's owner), so all_gather stands in for each all_to_all: every card
// receives every card's block, in rank order, the layout a sharded owner receives. Every card
// looks up, merges and updates every slot on its replica (as the unpadded replicated step does);
// its pull records come from its own block's rows, so none travel back (1 collective on pull,
// 1 on push).
//
// Lookup (HeterComm::pull_only: an evaluation's step, which pushes nothing): the pull without the
// owner merge plan, as a third graph, "sparse lookup". Sharded, the same exchanges; replicated,
// none: a card looks its own block up in its own replica (the block it would have received from
// itself), so the step runs no collective. The records are the pull's, bit for bit.
//
// Sums follow the unpadded path's order exactly (the live keys keep their relative order in
// every sort, and segments are summed by the same rule), so a padded step's rows and records
// are bit-identical to an unpadded planned step's. What the host does per step (stats and the
// check's tag from the plan, the slot's event) stays outside the graphs; the check's copy into
// its pinned slot is a kernel after the pull's graph (the slot chosen on the card: a caller's
// composed step holds it, see device::ComposedStep). Inside a composed step (the trainer's whole
// step as one graph) neither half makes a graph of its own: their work goes into the caller's.
#include <algorithm>
#include <cuda/atomic>
#include <tuple>

#include "heterps/heter_comm/detail/heter_comm_impl.cuh"

namespace gpubox::heter_comm {
namespace {

// Sender: each live unique key u into its owner's block (slot owner * block + j, its key at word
// 1 + j of the owner's key block), each owner block's live count into its first word; u's slot,
// or a discard row past the blocks (slots + u) for a unique index past the live count or a key
// past its block (a plan that does not describe the batch: its late check fails the step; a plan
// entry past the block is refused before the step).
struct SendBlockKeys {
  const uint64_t* unique_keys;
  const position_t* owner_begin;  // partitions + 1
  uint32_t partitions;
  std::size_t block;
  std::size_t uniques;  // the bound: unique indices [0, uniques)
  uint64_t* send_keys;
  position_t* unique_slot;
  GPUBOX_HD void operator()(std::size_t item) const {
    if (item < partitions) {
      const uint64_t count = owner_begin[item + 1] - owner_begin[item];
      send_keys[item * (block + 1)] = count < block ? count : block;
    }
    if (item >= uniques) return;
    const std::size_t discard = partitions * block + item;
    if (item >= owner_begin[partitions]) {
      unique_slot[item] = static_cast<position_t>(discard);
      return;
    }
    const uint64_t key = unique_keys[item];
    const uint32_t owner =
        partitions > 1 ? static_cast<uint32_t>(owner_card(key, static_cast<int>(partitions))) : 0u;
    const std::size_t j = item - owner_begin[owner];
    if (j >= block) {
      unique_slot[item] = static_cast<position_t>(discard);
      return;
    }
    send_keys[owner * (block + 1) + 1 + j] = key;
    unique_slot[item] = static_cast<position_t>(owner * block + j);
  }
};

// Owner: received slot q = src * block + j holds a key while j < source src's count; its key
// (0 when dead) and row (kInvalidRow when dead or missing); the live misses counted.
struct FindBlockKeys {
  card_table::CardStoreRef store;
  const uint64_t* recv_keys;  // [src][count, keys...]
  std::size_t block;
  uint64_t* keys;
  row_index_t* rows;
  unsigned long long* misses;
  GPUBOX_HD void operator()(std::size_t q) const {
    const uint64_t* from = recv_keys + q / block * (block + 1);
    const std::size_t j = q % block;
#if !GPUBOX_ON_DEVICE
    // The cpu runs a block's slots in order: the hash line of the live key kPrefetchDistance
    // ahead is fetched while this one is looked up (each find was a cache miss). Both bounds:
    // a slot past the block is another source's count, whatever this source's count says.
    if (j + card_table::detail::kPrefetchDistance < block &&
        j + card_table::detail::kPrefetchDistance < from[0]) {
      store.prefetch_find(from[1 + j + card_table::detail::kPrefetchDistance]);
    }
#endif
    if (j >= from[0]) {
      keys[q] = 0;
      rows[q] = card_table::kInvalidRow;
      return;
    }
    const uint64_t key = from[1 + j];
    keys[q] = key;
    const row_index_t row = store.find(key);
    rows[q] = row;
    if (row == card_table::kInvalidRow) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(*misses).fetch_add(
          1, cuda::memory_order_relaxed);
    }
  }
};

// The padded step's check words (see kCheckHead): the live misses, the first missing live slot
// (as a received position: slot_base + its slot) and its key, the live merged keys (0 without a
// merge plan: a lookup), the card's own count row.
struct WriteBlockCheck {
  const unsigned long long* misses;
  const row_index_t* rows;
  const uint64_t* keys;
  detail::LiveSlots live;
  std::size_t slots;
  const position_t* merged;     // null: no merge plan (a lookup pushes nothing)
  std::size_t slot_base;        // the received position of slot 0
  const position_t* own_begin;  // row_size + 1 entries
  std::size_t row_size;
  uint64_t* words;
  GPUBOX_HD void operator()(std::size_t) const {
    const uint64_t missing = *misses;
    words[0] = missing;
    words[1] = slots;
    words[2] = 0;
    if (missing > 0) {  // the error path: one thread finds the first
      for (std::size_t q = 0; q < slots; ++q) {
        if (!live(q) || rows[q] != card_table::kInvalidRow) continue;
        words[1] = slot_base + q;
        words[2] = keys[q];
        break;
      }
    }
    words[3] = merged != nullptr ? *merged : 0;
    for (std::size_t c = 0; c < row_size; ++c) {
      words[kCheckHead + c] = own_begin[c + 1] - own_begin[c];
    }
  }
};

// out[i] = the record of live occurrence i's unique key, by its slot (a discard slot reads zeros).
struct ScatterBlockRecords {
  const float* records;  // by slot
  const position_t* occurrence_unique;
  const position_t* unique_slot;
  const uint64_t* n;  // live occurrences, on the card
  std::size_t slots;
  float* out;
  int32_t dim;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t i = item / static_cast<std::size_t>(dim);
    if (i >= *n) return;
    const std::size_t f = item % static_cast<std::size_t>(dim);
    const std::size_t slot = unique_slot[occurrence_unique[i]];
    out[item] = slot < slots ? records[slot * dim + f] : 0.0f;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: the same items occurrence by occurrence, one division a range instead of one an item.
  void run_range(std::size_t begin, std::size_t end) const {
    const std::size_t live = *n;
    const auto width = static_cast<std::size_t>(dim);
    std::size_t f = begin % width;
    for (std::size_t i = begin / width, item = begin; item < end && i < live; ++i, f = 0) {
      const std::size_t slot = unique_slot[occurrence_unique[i]];
      const std::size_t stop = std::min(end, item + (width - f));
      if (slot < slots) {
        const float* row = records + slot * width;
        for (; item < stop; ++item, ++f) out[item] = row[f];
      } else {
        for (; item < stop; ++item) out[item] = 0.0f;
      }
    }
  }
#endif
};

// The graph of `cache` (most recently used first, at most kPullGraphs) captured for `key`, moved
// to the front; made (empty, named `name`) when none is.
template <class Key>
PaddedSteps::Cached<Key>& cached_graph(
    std::vector<std::unique_ptr<PaddedSteps::Cached<Key>>>& cache, const Key& key,
    const char* name) {
  std::size_t at = 0;
  while (at < cache.size() && !(cache[at]->key == key)) ++at;
  if (at == cache.size()) {
    cache.insert(cache.begin(), std::make_unique<PaddedSteps::Cached<Key>>(name));
    cache.front()->key = key;
    if (cache.size() > PaddedSteps::kPullGraphs) cache.pop_back();
  } else {
    std::rotate(cache.begin(), cache.begin() + static_cast<std::ptrdiff_t>(at),
                cache.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return *cache.front();
}

}  // namespace

bool HeterComm::Impl::pull_is_padded(std::size_t n) const {
  if (!padded_.enabled() || planned_ == nullptr || planned_n_ == nullptr) return false;
  // Every card of the step takes the padded path or none does (their exchanges differ): a batch
  // past the pass's reserved largest fails here, on its card, naming it (the group is aborted).
  GPUBOX_EXPECTS(n <= padded_.occurrences, "HeterComm on card ", comm_->rank(),
                 ": a planned step of ", n, " key occurrences, past the pass's largest batch (",
                 padded_.occurrences,
                 " in reserve_steps): the pass's step plan does not describe the batch");
  return true;
}

void HeterComm::Impl::reserve_padded(const StepBounds& bounds) {
  PaddedSteps& p = padded_;
  // The pass's sizes (a smaller pass runs smaller padded steps; the buffers keep their room).
  p.block = 0;
  if (!pads(bounds)) return;
  p.occurrences = bounds.occurrences;
  p.block = bounds.pair_block;
  const std::size_t cards = static_cast<std::size_t>(total_cards_);
  const std::size_t slots = p.slots(total_cards_);
  const std::size_t block = p.block;
  const std::size_t occurrences = p.occurrences;
  const auto pull_dim = static_cast<std::size_t>(layout_.pull_dim());
  const auto push_dim = static_cast<std::size_t>(layout_.push_dim());
  // Per peer: what this card's blocks cost it (replicated: its one block goes to every card, and
  // no pull records travel).
  p.key_counts.assign(cards, block + 1);
  p.record_counts.assign(cards, replicated_ ? 0 : block * pull_dim);
  p.push_counts.assign(cards, block * push_dim);
  // The records' buffers, by what each holds (the discard rows: one per unique index, see
  // SendBlockKeys). Sharded: recv_records holds the owner's pull records of every slot, then the
  // push records received; send_records the pull records received back, then the push records by
  // slot. Replicated: recv_records holds the pull records of the card's own block, then every
  // card's push block (all-gathered); send_records only the push records of its one block.
  const std::size_t recv_records = replicated_ ? std::max(block * pull_dim, slots * push_dim)
                                               : slots * std::max(pull_dim, push_dim);
  const std::size_t send_records =
      replicated_ ? (block + occurrences) * push_dim
                  : std::max(slots * pull_dim, (slots + occurrences) * push_dim);
  const device::Stream& stream = card_->stream();
  const auto zeroed = [&](auto& buffer, std::size_t count) {
    if (buffer.size() < count) {
      buffer.resize_discard(count);
      device::memset_bytes_async(buffer.data(), 0, buffer.bytes(), stream);
    }
  };
  zeroed(p.send_keys, (replicated_ ? 1 : cards) * (block + 1));
  zeroed(p.recv_keys, cards * (block + 1));
  zeroed(p.keys, slots);
  zeroed(p.rows, slots);
  grow(clip_partials_, device::reduce_partials(slots));  // clip_merged's, over the slots
  zeroed(p.recv_records, recv_records);
  zeroed(p.send_records, send_records);
  zeroed(p.merged_records, slots * push_dim);
  zeroed(p.merged_rows, slots);
  zeroed(p.unique_slot, occurrences);
  // The plans and reductions over every position and slot (run_padded, run_unique_sorted and
  // the reducer resize within these: a captured step allocates nothing).
  local_.reserve(p.occurrences);
  owner_merge_.reserve(slots, /*sorting=*/total_cards_ > 1);
  reducer_.reserve(std::max(p.occurrences, slots), layout_.push_dim());
}

template <class Cached, class Work>
void HeterComm::Impl::run_graph(Cached& cached, const device::Stream& stream, Work&& work) {
  // Inside a caller's composed step (the trainer's whole step as one graph): no graph of its own,
  // the work into the caller's capture, or nothing when the caller's graph replays it.
  if (!options_.step_graphs || device::ComposedStep::open_on(stream) != nullptr) {
    if (device::ComposedStep::enqueues(stream)) work();
    return;
  }
  const device::DeviceCounts counts = card_->counts();
  const uint64_t generation = counts.allocations + counts.frees;
  // A capture bakes in the buffers (the memory generation: a card allocation or free since may
  // have moved one, the store's table or pools included) and the padded sizes.
  if (!cached.graph.ready() || cached.generation != generation ||
      cached.occurrences != padded_.occurrences || cached.block != padded_.block) {
    cached.graph.capture(stream, std::forward<Work>(work));
    cached.generation = generation;
    cached.occurrences = padded_.occurrences;
    cached.block = padded_.block;
  }
  cached.graph.replay(stream);
}

std::pair<std::size_t, std::size_t> HeterComm::Impl::padded_counts(const uint64_t* planned) {
  // This card's row (what it sends) and column (what it receives as the owner); replicated, each
  // card's one entry (its unique count, which every card receives).
  const std::size_t cards = static_cast<std::size_t>(total_cards_);
  const std::size_t me = static_cast<std::size_t>(comm_->rank());
  const std::size_t row_size = replicated_ ? 1 : cards;
  std::copy(planned, planned + cards * row_size, host_counts_.data());
  // A plan entry past the block would send its keys past the block to discard rows, and the late
  // check, comparing the card's counts with this plan, would pass: zeros pulled, gradients lost.
  // Every card holds the same plan, so all fail this step alike.
  const uint64_t widest =
      *std::max_element(host_counts_.data(), host_counts_.data() + cards * row_size);
  GPUBOX_EXPECTS(widest <= padded_.block, "card ", comm_->rank(), ": a step plan sends ", widest,
                 " keys from one card to ", replicated_ ? "every card" : "one owner",
                 ", over the pass's block of ", padded_.block, " (reserve_steps' pair_block)");
  std::size_t unique = 0;
  std::size_t received = 0;
  for (std::size_t c = 0; c < cards; ++c) {
    if (replicated_) {
      received += host_counts_[c];
    } else {
      unique += host_counts_[me * cards + c];
      received += host_counts_[c * cards + me];
    }
  }
  if (replicated_) unique = host_counts_[me];
  return {unique, received};
}

HeterComm::Impl::PaddedStart HeterComm::Impl::begin_padded_step(std::size_t n) {
  PaddedStart start{std::exchange(planned_n_, nullptr), 0, 0};
  const uint64_t* planned = std::exchange(planned_, nullptr);
  pulled_ = false;
  padded_pulled_ = false;
  last_check_ = nullptr;
  step_planned_ = true;
  begin_step();
  std::tie(start.unique, start.received) = padded_counts(planned);
  last_.pull_calls = 1;
  last_.keys_in = n;
  last_.unique_keys_sent = start.unique;
  return start;
}

void HeterComm::Impl::pull_padded(const uint64_t* keys, std::size_t n, float* out_pull,
                                  const device::Stream& stream) {
  PaddedSteps& p = padded_;
  const PaddedStart start = begin_padded_step(n);
  const uint64_t* n_on_card = start.n_on_card;  // named: lambdas below capture it
  last_.owner_lookups = start.received;
  count_bytes(p.key_counts.data(), sizeof(uint64_t));
  count_bytes(p.record_counts.data(), sizeof(float));
  merged_ = p.slots(total_cards_);
  merged_on_card_ = owner_merge_.live_count_on_card();  // written by the graph
  padded_n_ = n;
  guarded([&] {
    const auto slot = checks_.begin(RetireCheck{this});  // may retire a check 4 steps old
    run_graph(cached_graph(p.pulls, PaddedSteps::PullKey{keys, n_on_card, out_pull}, "sparse pull"),
              stream, [&] { enqueue_padded_pull(keys, n_on_card, out_pull, stream); });
    last_check_ = &commit_padded_check(*slot.tag, stream, /*merge_late=*/true);
  });
  finish_step();
  pulled_ = true;
  padded_pulled_ = true;
}

void HeterComm::Impl::enqueue_padded_pull(const uint64_t* keys, const uint64_t* n_on_card,
                                          float* out_pull, const device::Stream& stream) {
  PaddedSteps& p = padded_;
  const std::size_t slots = p.slots(total_cards_);
  const auto dim = static_cast<int32_t>(layout_.pull_dim());
  // Replicated: one block, every key's (the local dedup groups by no owner).
  const auto partitions = static_cast<uint32_t>(local_.partitions());
  // The local dedup and owner plan over the padded batch; each live unique key into its block.
  local_.run_padded(keys, p.occurrences, detail::LiveSlots{n_on_card, p.occurrences, 1}, stream);
  device::parallel_for(
      stream, std::max<std::size_t>(p.occurrences, partitions),
      SendBlockKeys{local_.unique_keys(), local_.owner_begin(), partitions, p.block, p.occurrences,
                    p.send_keys.data(), p.unique_slot.data()});
  if (replicated_) {
    comm_->all_gather(p.send_keys.data(), p.recv_keys.data(), p.block + 1, stream);
  } else {
    comm_->all_to_all_v(p.send_keys.data(), p.key_counts.data(), p.recv_keys.data(),
                        p.key_counts.data(), stream);
  }
  // Owner: the live slots' rows, the misses, the merge plan over the live slots, the check.
  device::memset_bytes_async(p.misses.data(), 0, sizeof(unsigned long long), stream);
  device::parallel_for(stream, slots,
                       FindBlockKeys{store_->ref(), p.recv_keys.data(), p.block, p.keys.data(),
                                     p.rows.data(), p.misses.data()});
  const detail::LiveSlots live{p.recv_keys.data(), p.block, p.block + 1};
  if (total_cards_ == 1) {
    // A single card receives its own live keys in one block, unique and ascending: each is its
    // own merged key.
    owner_merge_.run_unique_sorted(p.keys.data(), slots, stream);
    owner_merge_.write_live_count(live, slots, stream);
  } else {
    owner_merge_.run_padded(p.keys.data(), slots, live, stream);
  }
  device::parallel_for(
      stream, 1,
      WriteBlockCheck{p.misses.data(), p.rows.data(), p.keys.data(), live, slots, merged_on_card_,
                      0, local_.owner_begin(), partitions, check_words_.data()});
  if (replicated_) {
    // This card's own block of slots holds its batch's unique keys: their records come from its
    // replica, nothing travels back (dead slots read zeros; unique_slot past the block: zeros).
    const std::size_t own = static_cast<std::size_t>(comm_->rank()) * p.block;
    device::parallel_for(
        stream, p.block * static_cast<std::size_t>(dim),
        FillPullRecords{store_->ref(), p.rows.data() + own, p.block, p.recv_records.data(), dim});
    device::parallel_for(
        stream, p.occurrences * static_cast<std::size_t>(dim),
        ScatterBlockRecords{p.recv_records.data(), local_.occurrence_unique(), p.unique_slot.data(),
                            n_on_card, p.block, out_pull, dim});
    return;
  }
  // Records back along the keys' route, then to every live occurrence.
  device::parallel_for(
      stream, slots * static_cast<std::size_t>(dim),
      FillPullRecords{store_->ref(), p.rows.data(), slots, p.recv_records.data(), dim});
  comm_->all_to_all_v(p.recv_records.data(), p.record_counts.data(), p.send_records.data(),
                      p.record_counts.data(), stream);
  device::parallel_for(stream, p.occurrences * static_cast<std::size_t>(dim),
                       ScatterBlockRecords{p.send_records.data(), local_.occurrence_unique(),
                                           p.unique_slot.data(), n_on_card, slots, out_pull, dim});
}

void HeterComm::Impl::push_padded(const float* grads, uint32_t* veto, NormClipState* clip,
                                  const device::Stream& stream) {
  PaddedSteps& p = padded_;
  begin_step();
  last_.push_calls = 1;
  last_.keys_in = padded_n_;
  count_bytes(p.push_counts.data(), sizeof(float));
  if (!p.push || !(p.push->key == PaddedSteps::PushKey{grads, veto, clip})) {
    p.push = std::make_unique<PaddedSteps::Cached<PaddedSteps::PushKey>>("sparse push");
    p.push->key = PaddedSteps::PushKey{grads, veto, clip};
  }
  run_graph(*p.push, stream, [&] { enqueue_padded_push(grads, veto, clip, stream); });
  if (last_check_ != nullptr) last_check_->pushed = true;
  finish_step();
}

void HeterComm::Impl::enqueue_padded_push(const float* grads, uint32_t* veto, NormClipState* clip,
                                          const device::Stream& stream) {
  PaddedSteps& p = padded_;
  const std::size_t slots = p.slots(total_cards_);
  const int32_t dim = layout_.push_dim();
  // Each unique key's sum into its slot (past the live count: into its own discard row).
  reducer_.run(local_.unique_start(), p.occurrences, p.occurrences, dim,
               OrderedRecords<float>{grads, local_.sorted_positions(), dim},
               RecordRows<float>{p.send_records.data(), p.unique_slot.data(), dim}, stream);
  if (replicated_) {
    comm_->all_gather(p.send_records.data(), p.recv_records.data(),
                      p.block * static_cast<std::size_t>(dim), stream);
  } else {
    comm_->all_to_all_v(p.send_records.data(), p.push_counts.data(), p.recv_records.data(),
                        p.push_counts.data(), stream);
  }
  // The owner: summed per merged key over the live slots, in source-rank order; one step each.
  reducer_.run(owner_merge_.unique_start(), slots, slots, dim,
               OrderedRecords<float>{p.recv_records.data(), owner_merge_.sorted_positions(), dim},
               RecordRows<float>{p.merged_records.data(), nullptr, dim}, stream);
  device::parallel_for(stream, slots,
                       GatherMerged<row_index_t>{p.rows.data(), owner_merge_.sorted_positions(),
                                                 owner_merge_.unique_start(), p.merged_rows.data(),
                                                 merged_on_card_});
  if (clip != nullptr)
    clip_merged(p.merged_records.data(), p.merged_rows.data(), slots, clip, veto, stream);
  const table::optimizer::TableAdamStep* table_step = advance_table_step(veto, stream);
  device::parallel_for(
      stream, slots,
      ApplyUpdates{store_->ref(), p.merged_rows.data(), owner_merge_.unique_keys(),
                   p.merged_records.data(), config_, veto, slots, merged_on_card_, table_step});
}

void HeterComm::Impl::pull_only(const uint64_t* keys, std::size_t n, float* out_pull,
                                const device::Stream& stream) {
  if (pull_is_padded(n)) {
    lookup_padded(keys, n, out_pull, stream);
    return;
  }
  pull(keys, nullptr, n, out_pull, stream);
  pulled_ = false;  // nothing of it is pushed (pull_only's contract)
}

void HeterComm::Impl::lookup_padded(const uint64_t* keys, std::size_t n, float* out_pull,
                                    const device::Stream& stream) {
  PaddedSteps& p = padded_;
  // pulled_ stays false (begin_padded_step): push_pulled is refused, no merge plan was made.
  const PaddedStart start = begin_padded_step(n);
  const uint64_t* n_on_card = start.n_on_card;  // named: lambdas below capture it
  // Replicated: the card looks up its own keys only, and nothing travels.
  last_.owner_lookups = replicated_ ? start.unique : start.received;
  if (!replicated_) {
    count_bytes(p.key_counts.data(), sizeof(uint64_t));
    count_bytes(p.record_counts.data(), sizeof(float));
  }
  padded_n_ = n;
  guarded([&] {
    const auto slot = checks_.begin(RetireCheck{this});  // may retire a check 4 steps old
    run_graph(
        cached_graph(p.lookups, PaddedSteps::PullKey{keys, n_on_card, out_pull}, "sparse lookup"),
        stream, [&] { enqueue_padded_lookup(keys, n_on_card, out_pull, stream); });
    commit_padded_check(*slot.tag, stream, /*merge_late=*/false);
  });
  finish_step();
}

StepCheck& HeterComm::Impl::commit_padded_check(StepCheck& tag, const device::Stream& stream,
                                                bool merge_late) {
  // Into the slot the card's counter names (so a composed step's graph holds it too).
  checks_.copy_on_card(stream, {{check_words_.data(), 0, check_words_.bytes()}});
  const std::size_t me = static_cast<std::size_t>(comm_->rank());
  const std::size_t row_size = replicated_ ? 1 : static_cast<std::size_t>(total_cards_);
  tag.pass = comm_->pass();
  tag.step = comm_->step();
  tag.planned_row.assign(host_counts_.data() + me * row_size,
                         host_counts_.data() + (me + 1) * row_size);
  tag.recv_offsets.clear();
  tag.pushed = false;
  tag.merge_late = merge_late;
  tag.block = padded_.block;
  checks_.commit(stream);
  return tag;
}

void HeterComm::Impl::enqueue_padded_lookup(const uint64_t* keys, const uint64_t* n_on_card,
                                            float* out_pull, const device::Stream& stream) {
  PaddedSteps& p = padded_;
  const auto dim = static_cast<int32_t>(layout_.pull_dim());
  const auto partitions = static_cast<uint32_t>(local_.partitions());
  // As enqueue_padded_pull: the local dedup and owner plan, each live unique key into its block.
  local_.run_padded(keys, p.occurrences, detail::LiveSlots{n_on_card, p.occurrences, 1}, stream);
  device::parallel_for(
      stream, std::max<std::size_t>(p.occurrences, partitions),
      SendBlockKeys{local_.unique_keys(), local_.owner_begin(), partitions, p.block, p.occurrences,
                    p.send_keys.data(), p.unique_slot.data()});
  // Replicated: the card's own block ([count, keys...], what the all_gather would deliver at its
  // rank) is all it looks up; its slots sit at rank * block of a training step's received ones
  // (a missing key's error names the requesting card by that). Sharded: the owners' lookups.
  const std::size_t slots = replicated_ ? p.block : p.slots(total_cards_);
  const uint64_t* blocks = replicated_ ? p.send_keys.data() : p.recv_keys.data();
  const std::size_t slot_base = replicated_ ? static_cast<std::size_t>(comm_->rank()) * p.block : 0;
  if (!replicated_) {
    comm_->all_to_all_v(p.send_keys.data(), p.key_counts.data(), p.recv_keys.data(),
                        p.key_counts.data(), stream);
  }
  device::memset_bytes_async(p.misses.data(), 0, sizeof(unsigned long long), stream);
  device::parallel_for(
      stream, slots,
      FindBlockKeys{store_->ref(), blocks, p.block, p.keys.data(), p.rows.data(), p.misses.data()});
  device::parallel_for(stream, 1,
                       WriteBlockCheck{p.misses.data(), p.rows.data(), p.keys.data(),
                                       detail::LiveSlots{blocks, p.block, p.block + 1}, slots,
                                       /*merged=*/nullptr, slot_base, local_.owner_begin(),
                                       partitions, check_words_.data()});
  device::parallel_for(
      stream, slots * static_cast<std::size_t>(dim),
      FillPullRecords{store_->ref(), p.rows.data(), slots, p.recv_records.data(), dim});
  const float* records = p.recv_records.data();
  if (!replicated_) {  // back along the keys' route
    comm_->all_to_all_v(p.recv_records.data(), p.record_counts.data(), p.send_records.data(),
                        p.record_counts.data(), stream);
    records = p.send_records.data();
  }
  device::parallel_for(stream, p.occurrences * static_cast<std::size_t>(dim),
                       ScatterBlockRecords{records, local_.occurrence_unique(),
                                           p.unique_slot.data(), n_on_card, slots, out_pull, dim});
}

}  // namespace gpubox::heter_comm
