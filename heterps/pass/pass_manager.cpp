#include "heterps/pass/pass_manager.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <future>
#include <mutex>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/sparse/card_store.hpp"

namespace gpubox::pass {
namespace {

using sparse::row_index_t;

// Card bytes a pass boundary holds per resident key on top of the store: eviction lists every
// key (8 bytes), its row index (4) and its score (4); a rehash saves (key, row) pairs (12); the
// begin_pass lookup holds the pass's keys and their rows (12); the write-back list holds the
// dirty keys and rows (12). These phases run one after another, so the largest one counts.
constexpr std::size_t kWorkingBytesPerKey = sizeof(uint64_t) + sizeof(row_index_t) + sizeof(float);
// Card bytes per row staged in a chunk (at most one page of rows): the staged key (8), the
// store's and the table's per-position scratch (row index 4 + 4, created flag 1 + 1, key and
// position of a miss 8 + 8), rounded up; scratch grows by half again when it grows, hence 3/2.
constexpr std::size_t kStagingBytesPerRow = 40;
// Fixed card bytes of a store beside its per-row memory (side slots, flags, miss counters).
constexpr std::size_t kStoreFixedBytes = 4096;
const std::vector<uint64_t> kNoKeys;

// Runs `work(begin, end)` over [0, n) in chunks of `chunk`, up to `in_flight` chunks at once,
// and `finish(begin, end)` for each chunk in order on the calling thread as it completes.
// Returns the first error; chunks after a failed one are not finished.
template <class Work, class Finish>
Status pipelined_chunks(std::size_t n, std::size_t chunk, int in_flight, Work work, Finish finish) {
  chunk = std::max<std::size_t>(chunk, 1);
  std::vector<std::future<Status>> window;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t begin = 0; begin < n; begin += chunk)
    ranges.emplace_back(begin, std::min(n, begin + chunk));
  std::size_t next_launch = 0;
  Status first_error;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    while (next_launch < ranges.size() &&
           next_launch < i + static_cast<std::size_t>(std::max(1, in_flight))) {
      auto [b, e] = ranges[next_launch];
      window.push_back(
          std::async(std::launch::async, [&work, b = b, e = e] { return work(b, e); }));
      ++next_launch;
    }
    Status st = window[i].get();
    if (!st.ok() && first_error.ok()) first_error = st;
    if (first_error.ok()) finish(ranges[i].first, ranges[i].second);
  }
  return first_error;
}

// A set of row indices to test listed rows against. Pool indices are dense: a byte per index up
// to the largest listed one, one look-up each. Handles that carry a width class in their top
// bits would not be: a sorted list then (a binary search each), so the set never takes more than
// a few bytes per row.
class RowMarks {
 public:
  // `end`: one past the largest index that will be tested; `expected`: about how many will be.
  RowMarks(row_index_t end, std::size_t expected)
      : dense_(end <= 4 * expected + (std::size_t{1} << 20)) {
    if (dense_) bytes_.assign(end, 0);
  }
  void mark(row_index_t row) {
    if (row == sparse::kInvalidRow) return;
    if (!dense_) {
      sorted_.push_back(row);
    } else if (row < bytes_.size()) {
      bytes_[row] = 1;
    }
  }
  // After the last mark(), before the first has().
  void seal() {
    std::sort(sorted_.begin(), sorted_.end());
    sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
  }
  bool has(row_index_t row) const {
    return dense_ ? row < bytes_.size() && bytes_[row] != 0
                  : std::binary_search(sorted_.begin(), sorted_.end(), row);
  }

 private:
  bool dense_;
  std::vector<uint8_t> bytes_;
  std::vector<row_index_t> sorted_;
};

void throw_host_error(const Status& st, const std::string& what) {
  if (!st.ok()) GPUBOX_FAIL(what, ": ", st.to_string());
}

// Pulls the rows of `n` keys (created with their slots when new; read with HostTier::peek,
// creating nothing, when `access` is kEvaluate) into `rows`, in batches of host_batch_keys with up
// to pulls_in_flight requests at once, and runs `finish(begin, end)` for each batch in order as
// it arrives. Returns the rows the host tier created (kEvaluate: the keys it does not hold);
// throws naming `what` when it fails.
template <class Finish>
std::size_t pull_rows(table::HostTier& host, const PassManagerOptions& options, PassAccess access,
                      const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                      Finish finish, const std::string& what) {
  const std::size_t stride = static_cast<std::size_t>(host.layout().stride());
  const std::size_t batch = std::max<std::size_t>(options.host_batch_keys, 1);
  std::vector<std::size_t> created(n == 0 ? 0 : (n + batch - 1) / batch, 0);
  const Status st = pipelined_chunks(
      n, batch, options.pulls_in_flight,
      [&](std::size_t b, std::size_t e) {
        float* out = rows + b * stride;
        return access == PassAccess::kEvaluate
                   ? host.peek(keys + b, slots + b, e - b, out, &created[b / batch])
                   : host.pull(keys + b, slots + b, e - b, out, &created[b / batch]);
      },
      finish);
  throw_host_error(st, what);
  return std::accumulate(created.begin(), created.end(), std::size_t{0});
}

}  // namespace

double CardTierPlan::bytes_per_key() const {
  return static_cast<double>(total_bytes()) / static_cast<double>(std::max<std::size_t>(rows, 1));
}

std::string CardTierPlan::to_string() const {
  const auto class_bytes = [this] {
    if (class_row_bytes.empty()) return std::string();
    std::string text = "; a pool per embedx width, row bytes";
    for (const auto& [width, bytes] : class_row_bytes) {
      text += " " + std::to_string(width) + ": " + std::to_string(bytes);
    }
    return text;
  };
  std::ostringstream out;
  const double mib = 1.0 / (1 << 20);
  if (rows == 0) {
    out << "card tier: no budget (runner.card_memory_mb = 0); per key up to " << bytes_per_key()
        << " bytes (row " << row_bytes << ", table " << table_bytes << ", index " << index_bytes
        << ", pass working set " << working_bytes << "), rows in pages of " << page_rows
        << class_bytes();
    return out.str();
  }
  out.setf(std::ios::fixed);
  out.precision(1);
  out << "card tier per card: " << rows << " rows in " << total_bytes() * mib << " MiB (rows "
      << row_page_bytes * mib << ", table " << table_bytes * mib << ", index " << index_bytes * mib
      << ", pass working set " << working_bytes * mib << "), " << bytes_per_key()
      << " bytes per key (row " << row_bytes << "), pages of " << page_rows << " rows"
      << class_bytes();
  return out.str();
}

PassManager::PassManager(device::CardSet& cards, std::vector<sparse::CardSparseStore*> stores,
                         table::HostTier& host, const PassManagerOptions& options)
    : cards_(cards), stores_(std::move(stores)), host_(host), options_(options) {
  GPUBOX_EXPECTS(static_cast<int>(stores_.size()) == cards_.num_local_cards(),
                 "pass manager: ", stores_.size(), " stores for ", cards_.num_local_cards(),
                 " cards");
  for (auto* store : stores_) {
    GPUBOX_EXPECTS(store != nullptr, "pass manager: null store");
    GPUBOX_EXPECTS(store->layout().stride() == host_.layout().stride(),
                   "pass manager: card rows have ", store->layout().stride(),
                   " floats but host-tier rows have ", host_.layout().stride());
  }
  row_budget_ = options_.card_row_budget;
  if (options_.card_memory_bytes > 0) {
    // The most rows whose footprint fits (the footprint grows with the rows).
    std::size_t fits = 0;
    std::size_t too_many =
        options_.card_memory_bytes / std::max<std::size_t>(1, plan_for(1).row_bytes) + 1;
    while (too_many - fits > 1) {
      const std::size_t mid = fits + (too_many - fits) / 2;
      (plan_for(mid).total_bytes() <= options_.card_memory_bytes ? fits : too_many) = mid;
    }
    row_budget_ = row_budget_ == 0 ? fits : std::min(row_budget_, fits);
    GPUBOX_EXPECTS(row_budget_ > 0, "card memory budget of ", options_.card_memory_bytes,
                   " bytes holds no row (", plan_for(1).total_bytes(),
                   " bytes for one: ", plan_for(1).to_string(), ")");
  }
  plan_ = plan_for(row_budget_);
  if (row_budget_ > 0) {
    // Size every store for the budget once: its table never grows, its index never moves.
    cards_.run_on_cards([&](device::Card& card) {
      stores_[card.local_index()]->reserve_capacity(row_budget_, card.stream());
    });
  }
}

CardTierPlan PassManager::plan_for(std::size_t rows) const {
  const sparse::CardSparseStore& store = *stores_.front();
  CardTierPlan plan;
  plan.rows = rows;
  plan.row_bytes = store.bytes_per_row();
  plan.page_rows = store.page_rows();
  // Without a budget: one key, with its table share at the worst power-of-two fill.
  const std::size_t keys = std::max<std::size_t>(rows, 1);
  const std::size_t pages = (keys + plan.page_rows - 1) / plan.page_rows;
  const double load = store.table().options().max_load_factor;
  plan.row_page_bytes = rows == 0 ? plan.row_bytes : pages * store.page_bytes();
  // Width classes: the rows are planned at the widest class's bytes (any mix fits), and every
  // pool may hold one partly used page more (a pool's pages hold ceil(rows / page rows) pages
  // after compact_pool); every pool indexes up to `rows`.
  const int32_t pools = store.pool_count();
  for (int32_t p = 0; pools > 1 && p < pools; ++p) {
    plan.class_row_bytes.emplace_back(store.classes().dims[p], store.bytes_per_row(p));
    if (rows > 0) plan.row_page_bytes += store.page_bytes(p);
  }
  // Slots: the power of two the table takes for the budget (or its initial size, if larger).
  plan.table_bytes =
      rows == 0 ? static_cast<std::size_t>(std::ceil(2.0 * sizeof(sparse::detail::Slot) / load))
                : std::max(sparse::CardHashTable::slot_capacity_for(rows, load),
                           store.table().capacity()) *
                      sizeof(sparse::detail::Slot);
  // Free list entry and dirty flag per pooled row, a page table pointer per page.
  for (int32_t p = 0; p < pools; ++p) {
    if (rows == 0 && p + 1 < pools) continue;  // one key: one pool's entry (the widest's page)
    const std::size_t pool_page_rows = store.page_rows(p);
    const std::size_t pool_pages = (keys + pool_page_rows - 1) / pool_page_rows;
    const std::size_t pooled = rows == 0 ? 1 : pool_pages * pool_page_rows;
    plan.index_bytes +=
        pooled * (sizeof(row_index_t) + 1) + (rows == 0 ? 0 : pool_pages * sizeof(float*));
  }
  const std::size_t staged = plan.page_rows;  // write-back gathers, inserts stage, at most a page
  plan.working_bytes = keys * kWorkingBytesPerKey +
                       (rows == 0 ? 0
                                  : staged * plan.row_bytes + 3 * staged * kStagingBytesPerRow / 2 +
                                        kStoreFixedBytes);
  return plan;
}

PassStats PassManager::begin_pass(const std::vector<uint64_t>& keys,
                                  const std::vector<int32_t>& slots, const StagedRows* staged,
                                  PassAccess access) {
  GPUBOX_EXPECTS(!in_pass_, "begin_pass called twice without end_pass");
  // Rows staged ahead were pulled (created when new): only a training pass may use them.
  GPUBOX_EXPECTS(staged == nullptr || access == PassAccess::kTrain,
                 "begin_pass: an evaluation pass takes no staged rows");
  access_ = access;
  borrowed_.assign(stores_.size(), {});
  GPUBOX_EXPECTS(slots.empty() || slots.size() == keys.size(), "begin_pass: ", keys.size(),
                 " keys but ", slots.size(), " slots");
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  const auto num_cards = static_cast<std::size_t>(cards_.num_local_cards());
  GPUBOX_EXPECTS(staged == nullptr || staged->fetched,
                 "begin_pass: the staged rows were never fetched (a failed staging hands none)");
  GPUBOX_EXPECTS(staged == nullptr ||
                     (staged->owned.size() == num_cards && staged->card_end.size() == num_cards &&
                      staged->rows.size() == staged->keys.size() * stride),
                 "begin_pass: the staged rows were made for other cards or rows");
  Timer timer;
  // What the cards did for this pass during the previous one (prepare_next_pass), if it is still
  // true of them: made for these staged rows, and no other change of the keys since.
  std::vector<NextPassCard> next = std::move(next_);
  next_.clear();
  const uint64_t generation = key_generation_++;
  const auto early_of = [&](int c) -> NextPassCard* {
    if (staged == nullptr || static_cast<std::size_t>(c) >= next.size()) return nullptr;
    NextPassCard& card = next[static_cast<std::size_t>(c)];
    const bool looked_up = card.phase != NextPassCard::Phase::kOff &&
                           card.phase != NextPassCard::Phase::kWaiting &&
                           card.phase != NextPassCard::Phase::kLookup;
    return card.staged == staged && card.generation == generation && looked_up ? &card : nullptr;
  };
  // With a staging, the split by owner card was done ahead.
  std::vector<OwnedKeys> partitioned;
  if (staged == nullptr) partitioned = partition_by_owner(keys, slots);
  const std::vector<OwnedKeys>& owned = staged ? staged->owned : partitioned;
  PassStats stats;
  stats.pass_id = next_pass_id_;
  std::mutex stats_mu;
  // The slowest card's phases, for the log line.
  double lookup_s = 0, evict_s = 0, insert_s = 0, pull_s = 0;
  std::size_t early_cards = 0;
  // Replicated: every card misses the same keys; card 0 pulls their rows once and the other cards
  // insert its copy, so the host tier is read once per row, not once per card. A failing card
  // wakes the waiting ones (on_failure).
  std::promise<std::vector<float>> card0_rows;
  std::shared_future<std::vector<float>> card0_rows_ready = card0_rows.get_future().share();
  std::once_flag card0_rows_set;
  const bool share_rows = replicated() && cards_.num_local_cards() > 1;
  cards_.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        const std::vector<uint64_t>& mine = owned[c].keys;
        const std::size_t n = mine.size();
        if (replicated() && row_budget_ > 0 && n > row_budget_) fail_table_over_budget(n);
        if (row_budget_ > 0 && n > row_budget_) {
          GPUBOX_FAIL("pass ", next_pass_id_, " does not fit on card ", card.rank(), ": it needs ",
                      n, " rows (", plan_for(n).total_bytes(), " bytes) but the card budget is ",
                      row_budget_, " rows (", plan_.total_bytes(),
                      " bytes). Use smaller passes (fewer files per pass) or more cards, or raise "
                      "runner.card_memory_mb.");
        }
        Timer phase;
        std::vector<row_index_t> hit_rows;
        OwnedKeys missing;              // the keys not on the card (not known with `early`)
        std::size_t missing_count = 0;  // how many
        OwnedKeys to_pull;
        std::vector<uint32_t> used;  // offsets in this card's staged keys of the missing ones
        // Replicated: the rows were staged once, in card 0's range.
        const int range = replicated() ? 0 : c;
        const std::size_t first = staged && range > 0 ? staged->card_end[range - 1] : 0;
        const std::size_t end = staged ? staged->card_end[range] : 0;
        NextPassCard* early = early_of(c);
        std::size_t early_missing = 0;
        if (early != nullptr) {
          // Looked up during the previous pass (the keys found then are still here: only rows
          // outside this pass were evicted since), some staged rows inserted then.
          hit_rows = std::move(early->hit_rows);
          early_missing = early->missing;
          missing_count = early->missing - early->inserted;
          used.assign(early->used.begin() + static_cast<std::ptrdiff_t>(early->inserted),
                      early->used.end());
          to_pull = std::move(early->to_pull);
        } else {
          missing = missing_on_card(c, owned[c], &hit_rows);
          missing_count = missing.keys.size();
          // The missing rows staged ahead are inserted from the staging (both lists are sorted:
          // one walk); only the others are pulled.
          std::size_t at = first;
          for (std::size_t i = 0; i < missing.keys.size(); ++i) {
            const uint64_t key = missing.keys[i];
            while (at < end && staged->keys[at] < key) ++at;
            if (at < end && staged->keys[at] == key) {
              used.push_back(static_cast<uint32_t>(at - first));
            } else {
              to_pull.keys.push_back(key);
              to_pull.slots.push_back(missing.slots[i]);
            }
          }
        }
        const double lookup = phase.seconds();
        phase.reset();
        // Make room: evict rows this pass does not need, lowest score first.
        uint64_t evicted = 0;
        const std::size_t resident = stores_[c]->size();
        if (row_budget_ > 0 && resident + missing_count > row_budget_) {
          // A replica is the whole table: nothing may leave it.
          if (replicated()) fail_table_over_budget(resident + missing_count);
          if (early != nullptr && early->outside_gone) {
            // Only rows of the previous pass are left to choose from (clean: end_pass wrote
            // back all but this pass's keys): their scores alone, no listing of the table.
            evicted = evict_among(c, *early->current_keys, early->spare_at, early->spare_rows,
                                  resident + missing_count - row_budget_);
          } else {
            evicted = evict(c, hit_rows, resident + missing_count - row_budget_);
          }
        }
        if (row_budget_ > 0 && stores_[c]->pool_count() > 1) fit_pools(c, missing);
        hit_rows = {};
        const double evicting = phase.seconds();
        phase.reset();
        stores_[c]->reserve(missing_count, card.stream());
        if (used.size() == end - first) {
          // Every staged row is missing (the staging skips the keys on the cards): inserted
          // straight from the staging, without a copy.
          insert_to_card(c, staged ? staged->keys.data() + first : nullptr,
                         staged ? staged->rows.data() + first * stride : nullptr, used.size());
        } else {
          // Some staged keys are on the card after all (placed there since the staging started):
          // the others are gathered.
          std::vector<uint64_t> staged_keys(used.size());
          std::vector<float> staged_rows(used.size() * stride);
          for (std::size_t u = 0; u < used.size(); ++u) {
            const std::size_t at = first + used[u];
            staged_keys[u] = staged->keys[at];
            std::copy_n(staged->rows.data() + at * stride, stride, staged_rows.data() + u * stride);
          }
          insert_to_card(c, staged_keys.data(), staged_rows.data(), staged_keys.size());
        }
        const double inserting = phase.seconds();
        phase.reset();
        std::size_t created = 0;
        if (share_rows && c > 0) {
          const std::vector<float>& rows = card0_rows_ready.get();  // rethrows a card's failure
          GPUBOX_EXPECTS(rows.size() == to_pull.keys.size() * stride, "begin_pass: card ",
                         card.rank(), " misses other rows than card 0's replica");
          insert_to_card(c, to_pull.keys.data(), rows.data(), to_pull.keys.size());
        } else {
          std::vector<float> pulled;
          created = pull_to_card(c, to_pull, share_rows ? &pulled : nullptr);
          if (share_rows) {
            std::call_once(card0_rows_set, [&] { card0_rows.set_value(std::move(pulled)); });
          }
        }
        if (access == PassAccess::kEvaluate) borrowed_[c] = missing.keys;

        const double pulling = phase.seconds();
        std::lock_guard<std::mutex> lock(stats_mu);
        lookup_s = std::max(lookup_s, lookup);
        evict_s = std::max(evict_s, evicting);
        insert_s = std::max(insert_s, inserting);
        pull_s = std::max(pull_s, pulling);
        stats.keys_in_pass += n;
        stats.hits += n - (early != nullptr ? early_missing : missing_count);
        stats.pulled += to_pull.keys.size();
        stats.prefetched += used.size();
        stats.created += access == PassAccess::kTrain ? created : 0;
        stats.evicted += evicted;
        if (static_cast<std::size_t>(c) < next.size()) {
          // The card's work during the previous pass, used here or not (a failed staging, an
          // evaluation pass between): its evictions and chunks happened all the same.
          const NextPassCard& work = next[static_cast<std::size_t>(c)];
          stats.evicted += work.evicted;
          stats.early_evicted += work.evicted;
          stats.early_chunks += work.chunks;
          stats.early_host_syncs += work.counts.host_syncs;
          stats.early_allocations += work.counts.allocations;
          stats.early_launches += work.counts.launches;
          stats.early_seconds = std::max(stats.early_seconds, work.seconds);
        }
        if (early != nullptr) {
          ++early_cards;
          stats.prefetched += early->inserted;
          stats.early_inserted += early->inserted;
        }
        stats.rows_on_cards += stores_[c]->size();
      },
      [&](const std::string& why) {
        if (!share_rows) return;
        std::call_once(card0_rows_set, [&] {
          card0_rows.set_exception(std::make_exception_ptr(std::runtime_error(why)));
        });
      });
  // A staged row the host tier created is missing on every card (it was new), so it was used.
  if (staged != nullptr) stats.created += staged->created;
  stats.begin_seconds = timer.seconds();
  GPUBOX_LOG(INFO) << "begin_pass " << stats.pass_id << ": " << stats.begin_seconds
                   << " s; slowest card: looking up " << lookup_s << " s, evicting " << evict_s
                   << " s, inserting staged rows " << insert_s << " s, pulling " << pull_s << " s";
  if (stats.early_chunks > 0) {
    GPUBOX_LOG(INFO) << "begin_pass " << stats.pass_id << ": " << early_cards << " of " << num_cards
                     << " card(s) used their look-up of its keys during the previous pass; the "
                        "cards evicted "
                     << stats.early_evicted << " rows and inserted " << stats.early_inserted
                     << " staged rows then, in " << stats.early_chunks
                     << " chunks between steps (slowest card " << stats.early_seconds << " s; "
                     << stats.early_host_syncs << " host syncs, " << stats.early_allocations
                     << " allocations, " << stats.early_launches << " launches)";
  }
  current_ = stats;
  in_pass_ = true;
  ++next_pass_id_;
  return current_;
}

StagedRows PassManager::stage_rows(const std::vector<uint64_t>& keys,
                                   const std::vector<int32_t>& slots,
                                   const std::vector<uint64_t>& exclude) const {
  StagedRows staged = plan_staging(keys, slots, exclude);
  fetch_staged(&staged);
  return staged;
}

StagedRows PassManager::plan_staging(const std::vector<uint64_t>& keys,
                                     const std::vector<int32_t>& slots,
                                     const std::vector<uint64_t>& exclude) const {
  GPUBOX_EXPECTS(slots.empty() || slots.size() == keys.size(), "stage_rows: ", keys.size(),
                 " keys but ", slots.size(), " slots");
  GPUBOX_EXPECTS(std::is_sorted(exclude.begin(), exclude.end()),
                 "stage_rows: the excluded keys are not sorted");
  Timer timer;
  StagedRows staged;
  staged.owned = partition_by_owner(keys, slots);
  for (std::size_t c = 0; c < staged.owned.size(); ++c) {
    const OwnedKeys& card = staged.owned[c];
    // Replicated: every card's keys are card 0's, staged once (begin_pass reads card 0's range).
    // Both lists sorted: one walk through `exclude` per card instead of a search per key.
    auto skip = exclude.begin();
    for (std::size_t i = 0; i < (c == 0 || !replicated() ? card.keys.size() : 0); ++i) {
      skip = std::lower_bound(skip, exclude.end(), card.keys[i]);
      if (skip != exclude.end() && *skip == card.keys[i]) continue;
      staged.keys.push_back(card.keys[i]);
    }
    // The card work keeps offsets in a card's range in 32 bits.
    GPUBOX_EXPECTS(staged.keys.size() - (c > 0 ? staged.card_end.back() : 0) <= UINT32_MAX,
                   "stage_rows: over 2^32 keys staged for one card");
    staged.card_end.push_back(staged.keys.size());
  }
  staged.seconds = timer.seconds();
  return staged;
}

void PassManager::fetch_staged(StagedRows* staged) const {
  Timer timer;
  // The staged keys' slots, from their cards' lists (both sorted: one walk per card).
  std::vector<int32_t> staged_slots;
  staged_slots.reserve(staged->keys.size());
  for (std::size_t c = 0; c < staged->card_end.size(); ++c) {
    const OwnedKeys& card = staged->owned[c];
    std::size_t i = 0;
    for (std::size_t k = c > 0 ? staged->card_end[c - 1] : 0; k < staged->card_end[c]; ++k) {
      while (card.keys[i] != staged->keys[k]) ++i;
      staged_slots.push_back(card.slots[i]);
    }
  }
  const std::size_t n = staged->keys.size();
  std::vector<float> rows(n * static_cast<std::size_t>(host_.layout().stride()));
  staged->created = pull_rows(
      host_, options_, PassAccess::kTrain, staged->keys.data(), staged_slots.data(), n, rows.data(),
      [](std::size_t, std::size_t) {}, "staging " + std::to_string(n) + " rows of a coming pass");
  staged->rows = std::move(rows);
  staged->seconds += timer.seconds();
  staged->fetched = true;
}

std::vector<uint64_t> PassManager::resident_keys() const {
  const auto num_cards = static_cast<std::size_t>(cards_.num_local_cards());
  std::vector<std::vector<uint64_t>> per_card(num_cards);
  cards_.run_on_cards([&](device::Card& card) {
    const int c = card.local_index();
    if (replicated() && c > 0) return;
    const device::Stream& stream = card.stream();
    device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
    device::device_buffer<row_index_t> d_rows(0, card.memory(), stream);
    const std::size_t count =
        stores_[c]->list_entries(/*dirty_only=*/false, d_keys, d_rows, stream);
    per_card[c] = device::to_host(d_keys.data(), count, stream);
  });
  std::vector<uint64_t> keys = std::move(per_card.front());
  for (std::size_t c = 1; c < num_cards; ++c)
    keys.insert(keys.end(), per_card[c].begin(), per_card[c].end());
  return keys;
}

std::vector<OwnedKeys> PassManager::partition_by_owner(const std::vector<uint64_t>& keys,
                                                       const std::vector<int32_t>& slots) const {
  const int num_cards = cards_.num_local_cards();
  const int total_cards = cards_.total_cards();
  const int first_rank = cards_.trainer_id() * num_cards;
  std::vector<OwnedKeys> owned(static_cast<std::size_t>(replicated() ? 1 : num_cards));
  // The trainer's keys come ascending and distinct (its data sets give them so): taken in order.
  // Others are put in order first, stably: a repeated key keeps the slot of its first occurrence.
  const bool ascending = std::adjacent_find(keys.begin(), keys.end(), [](uint64_t a, uint64_t b) {
                           return a >= b;
                         }) == keys.end();
  std::vector<std::size_t> order(ascending ? 0 : keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  const auto at = [&](std::size_t k) { return ascending ? k : order[k]; };
  if (!ascending) {
    const std::size_t distinct = static_cast<std::size_t>(
        std::unique(order.begin(), order.end(),
                    [&](std::size_t a, std::size_t b) { return keys[a] == keys[b]; }) -
        order.begin());
    order.resize(distinct);
  }
  const std::size_t count = ascending ? keys.size() : order.size();
  if (owned.size() == 1) {  // one list: no regrowth copies
    owned[0].keys.reserve(count);
    owned[0].slots.reserve(count);
  }
  for (std::size_t k = 0; k < count; ++k) {
    const uint64_t key = keys[at(k)];
    if (key == 0) continue;
    // The job-wide owner (heter_comm.hpp); with several trainers the caller (CardTier) gives
    // only keys owned here. Replicated: every card's (card 0's list, copied below).
    const int owner = replicated() ? 0 : owner_card(key, total_cards) - first_rank;
    GPUBOX_EXPECTS(owner >= 0 && owner < num_cards, "pass manager: key ", key, " is owned by card ",
                   owner + first_rank, ", not by one of trainer ", cards_.trainer_id(), "'s");
    OwnedKeys& owner_keys = owned[owner];
    owner_keys.keys.push_back(key);  // sorted per card: eviction tests membership by binary search
    owner_keys.slots.push_back(slots.empty() ? 0 : slots[at(k)]);
  }
  if (replicated()) owned.resize(static_cast<std::size_t>(num_cards), owned.front());
  return owned;
}

OwnedKeys PassManager::missing_on_card(int c, const OwnedKeys& mine,
                                       std::vector<row_index_t>* hit_rows) {
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const std::size_t n = mine.keys.size();
  // 12 bytes per pass key on the card, freed before eviction.
  auto d_keys = device::to_device(mine.keys, card.memory(), stream);
  auto d_rows = card.make_buffer<row_index_t>(n);
  store.lookup_or_create(d_keys.data(), nullptr, n, d_rows.data(), /*create_missing=*/false,
                         nullptr, stream);
  const std::vector<row_index_t> found = device::to_host(d_rows);
  OwnedKeys missing;
  hit_rows->clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i] == sparse::kInvalidRow) {
      missing.keys.push_back(mine.keys[i]);
      missing.slots.push_back(mine.slots[i]);
    } else {
      hit_rows->push_back(found[i]);
    }
  }
  return missing;
}

std::size_t PassManager::pull_to_card(int c, const OwnedKeys& missing, std::vector<float>* keep) {
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  const std::size_t n = missing.keys.size();
  // Inserted batch by batch as the requests complete.
  std::vector<float> rows(n * stride);
  const std::size_t created = pull_rows(
      host_, options_, access_, missing.keys.data(), missing.slots.data(), n, rows.data(),
      [&](std::size_t b, std::size_t e) {
        insert_to_card(c, missing.keys.data() + b, rows.data() + b * stride, e - b);
      },
      "begin_pass: pulling " + std::to_string(n) + " keys of card " +
          std::to_string(cards_.card(c).rank()) + " from the host tier");
  if (keep != nullptr) *keep = std::move(rows);
  return created;
}

void PassManager::insert_to_card(int c, const uint64_t* keys, const float* rows, std::size_t n) {
  if (n == 0) return;
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  const std::size_t stage_limit = std::min(store.page_rows(), options_.host_batch_keys);
  device::device_buffer<uint64_t> staged_keys(0, card.memory(), stream);
  device::device_buffer<float> staged_rows(0, card.memory(), stream);
  for (std::size_t from = 0; from < n; from += stage_limit) {
    const std::size_t count = std::min(n, from + stage_limit) - from;
    staged_keys.resize_discard(count);
    staged_rows.resize_discard(count * stride);
    device::copy_async(staged_keys.data(), keys + from, count, stream);
    device::copy_async(staged_rows.data(), rows + from * stride, count * stride, stream);
    store.insert_rows(staged_keys.data(), staged_rows.data(), count, stream);
  }
}

std::size_t PassManager::fit_pools(int c, const OwnedKeys& missing) {
  sparse::CardSparseStore& store = *stores_[c];
  const auto page_bytes_after_insert = [&] {
    std::vector<std::size_t> need(static_cast<std::size_t>(store.pool_count()), 0);
    for (const int32_t slot : missing.slots) {
      const int32_t pool = store.pool_of_slot(slot);
      if (pool >= 0) ++need[static_cast<std::size_t>(pool)];
    }
    std::size_t bytes = 0;
    for (int32_t p = 0; p < store.pool_count(); ++p) {
      const sparse::RowPool& pool = store.pool(p);
      const std::size_t wanted = need[static_cast<std::size_t>(p)];
      const std::size_t lacking = wanted > pool.free_count() ? wanted - pool.free_count() : 0;
      bytes +=
          (pool.pages() + (lacking + pool.page_rows() - 1) / pool.page_rows()) * pool.page_bytes();
    }
    return bytes;
  };
  if (page_bytes_after_insert() <= plan_.row_page_bytes) return 0;
  // With at most row_budget_ rows in all, compacted pools hold at most the plan's pages.
  std::size_t freed = 0;
  for (int32_t p = 0; p < store.pool_count(); ++p) {
    freed += store.compact_pool(p, cards_.card(c).stream());
  }
  const std::size_t bytes = page_bytes_after_insert();
  GPUBOX_EXPECTS(bytes <= plan_.row_page_bytes, "card ", cards_.card(c).rank(),
                 ": the row pools would hold ", bytes,
                 " bytes of pages after compaction, the plan ", plan_.row_page_bytes);
  return freed;
}

uint64_t PassManager::evict(int c, const std::vector<row_index_t>& pass_rows, std::size_t excess) {
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  // Keys, row indices and scores only (16 bytes per resident key), on the host for the choice.
  std::vector<uint64_t> keys;
  std::vector<row_index_t> rows;
  std::vector<float> scores;
  {
    device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
    device::device_buffer<row_index_t> d_rows(0, card.memory(), stream);
    const std::size_t count = store.list_entries(/*dirty_only=*/false, d_keys, d_rows, stream);
    device::device_buffer<float> d_scores(count, card.memory(), stream);
    store.row_scores(d_rows.data(), count, d_scores.data(), stream);
    keys = device::to_host(d_keys.data(), count, stream);
    rows = device::to_host(d_rows.data(), count, stream);
    scores = device::to_host(d_scores.data(), count, stream);
  }
  // The pass's rows, marked by row index: one look-up per resident key instead of a binary
  // search over the pass's keys (n log p: most of the choice at 10^7 rows a card).
  row_index_t row_end = 0;
  for (row_index_t row : rows) row_end = std::max<row_index_t>(row_end, row + 1);
  RowMarks in_pass(row_end, rows.size());
  for (row_index_t row : pass_rows) in_pass.mark(row);
  if (kept_dirty_ > 0) {
    // Rows the last end_pass kept dirty (its `keep`) stay too, whatever this pass holds: their
    // newest value is only here.
    device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
    device::device_buffer<row_index_t> d_rows(0, card.memory(), stream);
    const std::size_t count = store.list_entries(/*dirty_only=*/true, d_keys, d_rows, stream);
    d_keys.release();
    for (row_index_t row : device::to_host(d_rows.data(), count, stream)) in_pass.mark(row);
  }
  in_pass.seal();
  std::vector<Candidate> candidates;
  candidates.reserve(keys.size() - std::min(keys.size(), pass_rows.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!in_pass.has(rows[i])) candidates.push_back({scores[i], keys[i]});
  }
  rows = {};
  return evict_lowest(c, candidates, excess);
}

uint64_t PassManager::evict_among(int c, const std::vector<uint64_t>& keys,
                                  const std::vector<uint32_t>& at,
                                  const std::vector<row_index_t>& rows, std::size_t excess) {
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  std::vector<Candidate> candidates;
  candidates.reserve(rows.size());
  // The scores a page of rows at a time (card memory stays within the plan).
  const std::size_t page = stores_[c]->page_rows();
  device::device_buffer<row_index_t> d_rows(0, card.memory(), stream);
  device::device_buffer<float> d_scores(0, card.memory(), stream);
  device::device_buffer<uint8_t> d_dirty(0, card.memory(), stream);
  for (std::size_t b = 0; b < rows.size(); b += page) {
    const std::size_t n = std::min(rows.size(), b + page) - b;
    d_rows.resize_discard(n);
    d_scores.resize_discard(n);
    d_dirty.resize_discard(n);
    device::copy_async(d_rows.data(), rows.data() + b, n, stream);
    stores_[c]->row_scores(d_rows.data(), n, d_scores.data(), stream);
    stores_[c]->row_dirty(d_rows.data(), n, d_dirty.data(), stream);
    const std::vector<float> scores = device::to_host(d_scores.data(), n, stream);
    const std::vector<uint8_t> dirty = device::to_host(d_dirty.data(), n, stream);
    for (std::size_t i = 0; i < n; ++i) {
      // A dirty row (kept by a `keep` wider than this pass's keys) stays: only here.
      if (dirty[i] == 0) candidates.push_back({scores[i], keys[at[b + i]]});
    }
  }
  return evict_lowest(c, candidates, excess);
}

uint64_t PassManager::evict_lowest(int c, std::vector<Candidate>& candidates, std::size_t excess) {
  GPUBOX_EXPECTS(candidates.size() >= excess, "card ", cards_.card(c).rank(), ": cannot evict ",
                 excess, " rows, only ", candidates.size(),
                 " are outside the pass and clean (the last end_pass kept ", kept_dirty_,
                 " rows dirty)");
  // The `excess` lowest (score, key) form a set fixed by that total order; their order among
  // themselves does not matter, so a selection (linear) rather than a partial sort (n log k:
  // minutes at 10^7 rows a card on the cpu backend), over the (score, key) pairs side by side.
  std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(excess),
                   candidates.end(), [](const Candidate& a, const Candidate& b) {
                     return a.score != b.score ? a.score < b.score : a.key < b.key;
                   });
  // end_pass wrote every dirty row back but those it kept (spared by the callers) and
  // begin_pass needs !in_pass_, so every victim is clean: it leaves the card without a
  // write-back and nothing is lost. Its row goes to the free list, where the rows pulled next
  // take it.
  std::vector<uint64_t> victims(excess);
  for (std::size_t i = 0; i < excess; ++i) victims[i] = candidates[i].key;
  return erase_from_card(c, victims);
}

uint64_t PassManager::erase_from_card(int c, const std::vector<uint64_t>& keys) {
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const std::size_t chunk = store.page_rows();
  device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
  uint64_t removed = 0;
  for (std::size_t b = 0; b < keys.size(); b += chunk) {
    const std::size_t count = std::min(keys.size(), b + chunk) - b;
    d_keys.resize_discard(count);
    device::copy_async(d_keys.data(), keys.data() + b, count, stream);
    removed += store.erase(d_keys.data(), count, stream);
  }
  return removed;
}

uint64_t PassManager::write_back(int c, double* gather_seconds, const std::vector<uint64_t>& keep,
                                 uint64_t* kept) {
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  if (replicated() && c > 0) {
    // The replicas are identical (heter_comm.hpp): card 0's write-back covers this one.
    store.clear_dirty(stream);
    stream.synchronize();
    return 0;
  }
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  // The dirty rows' keys and indices (12 bytes each), then the rows a batch at a time: a batch is
  // gathered off the card (a page at a time: the card never holds a second copy of the rows)
  // while the batches before it are pushed, at most pulls_in_flight at once, so the host holds
  // pulls_in_flight + 1 batches of rows, not a copy of every dirty row (785 MB for a pass of
  // 10.9 M rows).
  device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
  device::device_buffer<row_index_t> d_rows(0, card.memory(), stream);
  std::size_t count = store.list_entries(/*dirty_only=*/true, d_keys, d_rows, stream);
  if (count == 0) return 0;
  std::vector<uint64_t> keys = device::to_host(d_keys.data(), count, stream);
  d_keys.release();
  if (!keep.empty()) {
    // The rows of `keep` stay dirty: marked by row index, then the others listed again (and
    // only they are marked clean below).
    std::vector<row_index_t> rows = device::to_host(d_rows.data(), count, stream);
    d_rows.release();
    const row_index_t row_end = *std::max_element(rows.begin(), rows.end()) + 1;
    RowMarks kept_row(row_end, count);
    {
      // The keep keys looked up a page at a time (card memory stays within the plan).
      const std::size_t chunk = store.page_rows();
      device::device_buffer<uint64_t> d_keep(0, card.memory(), stream);
      device::device_buffer<row_index_t> d_found(0, card.memory(), stream);
      std::vector<row_index_t> found;
      for (std::size_t b = 0; b < keep.size(); b += chunk) {
        const std::size_t n = std::min(keep.size(), b + chunk) - b;
        d_keep.resize_discard(n);
        d_found.resize_discard(n);
        device::copy_async(d_keep.data(), keep.data() + b, n, stream);
        store.lookup_or_create(d_keep.data(), nullptr, n, d_found.data(),
                               /*create_missing=*/false, nullptr, stream);
        found = device::to_host(d_found.data(), n, stream);
        for (row_index_t row : found) kept_row.mark(row);
      }
    }
    kept_row.seal();
    std::size_t pushed = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (kept_row.has(rows[i])) continue;
      keys[pushed] = keys[i];
      rows[pushed] = rows[i];
      ++pushed;
    }
    *kept = count - pushed;
    count = pushed;
    keys.resize(count);
    rows.resize(count);
    d_rows = device::to_device(rows, card.memory(), stream);
  }
  const std::size_t batch = std::max<std::size_t>(options_.host_batch_keys, 1);
  const auto in_flight = static_cast<std::size_t>(std::max(1, options_.pulls_in_flight));
  struct Push {
    std::vector<float> rows;
    std::future<Status> done;
  };
  std::deque<Push> window;
  Status st;
  // Waits for the oldest push; keeps the first error.
  auto retire = [&] {
    const Status pushed = window.front().done.get();
    if (!pushed.ok() && st.ok()) st = pushed;
    window.pop_front();
  };
  device::device_buffer<float> staged(0, card.memory(), stream);
  const std::size_t page = store.page_rows();
  for (std::size_t b = 0; b < count && st.ok(); b += batch) {
    const std::size_t n = std::min(count, b + batch) - b;
    if (window.size() == in_flight) retire();
    Timer gather;
    std::vector<float> rows(n * stride);
    for (std::size_t p = 0; p < n; p += page) {
      const std::size_t m = std::min(n, p + page) - p;
      staged.resize_discard(m * stride);
      store.gather_rows(d_rows.data() + b + p, m, staged.data(), stream);
      device::copy_async(rows.data() + p * stride, staged.data(), m * stride, stream);
      stream.synchronize();
    }
    *gather_seconds += gather.seconds();
    const float* data = rows.data();
    window.push_back(
        Push{std::move(rows), std::async(std::launch::async, [this, &keys, b, n, data] {
               return host_.push(keys.data() + b, n, data);
             })});
  }
  while (!window.empty()) retire();
  // On failure the rows stay dirty on the card: a retried end_pass/sync writes them again.
  throw_host_error(st, "writing back " + std::to_string(count) + " dirty rows of card " +
                           std::to_string(card.rank()) + " to the host tier");
  if (keep.empty()) {
    store.clear_dirty(stream);
  } else {
    store.clear_dirty(d_rows.data(), count, stream);
  }
  stream.synchronize();
  return count;
}

void PassManager::fail_table_over_budget(std::size_t rows) const {
  GPUBOX_FAIL(
      "Collective mode holds the whole embedding table on every card, and it has grown "
      "to ",
      rows, " rows (", plan_for(rows).total_bytes(),
      " bytes of card memory per card) but the card budget holds ", row_budget_, " rows (",
      plan_.total_bytes(),
      " bytes). Raise runner.card_memory_mb, or use runner.sync_mode: gpubox, which "
      "shards the table over the cards.");
}

uint64_t PassManager::sync() { return write_back_all({}); }

uint64_t PassManager::write_back_all(const std::vector<uint64_t>& keep) {
  std::vector<uint64_t> written(cards_.num_local_cards(), 0);
  std::vector<uint64_t> kept(written.size(), 0);
  std::vector<double> gathering(written.size(), 0);
  cards_.run_on_cards([&](device::Card& card) {
    const int c = card.local_index();
    written[c] = write_back(c, &gathering[c], keep, &kept[c]);
  });
  gather_seconds_ = *std::max_element(gathering.begin(), gathering.end());
  kept_dirty_ = std::accumulate(kept.begin(), kept.end(), uint64_t{0});
  return std::accumulate(written.begin(), written.end(), uint64_t{0});
}

PassStats PassManager::end_pass(const std::vector<uint64_t>& keep) {
  GPUBOX_EXPECTS(std::is_sorted(keep.begin(), keep.end()),
                 "end_pass: the kept keys are not sorted");
  GPUBOX_EXPECTS(in_pass_, "end_pass called without begin_pass");
  Timer timer;
  if (access_ == PassAccess::kEvaluate) {
    ++key_generation_;
    // The borrowed rows are clean (an evaluation pass only pulls): they leave without a
    // write-back, and the host tier never saw them.
    cards_.run_on_cards([&](device::Card& card) {
      const int c = card.local_index();
      erase_from_card(c, borrowed_[c]);
      borrowed_[c] = {};
    });
  }
  // Replicated: every replica's flags are cleared by card 0's write-back; nothing is kept.
  current_.written_back +=
      write_back_all(access_ == PassAccess::kTrain && !replicated() ? keep : kNoKeys);
  current_.kept_dirty = kept_dirty_;
  uint64_t rows = 0;
  for (auto* store : stores_) rows += store->size();
  current_.rows_on_cards = rows;
  current_.end_seconds = timer.seconds();
  GPUBOX_LOG(INFO) << "end_pass " << current_.pass_id << ": " << current_.written_back
                   << " rows written back, " << current_.kept_dirty
                   << " kept dirty on the cards for the next pass, in " << current_.end_seconds
                   << " s; the slowest card gathered its rows off the card in " << gather_seconds_
                   << " s, the rest waited for the host tier";
  in_pass_ = false;
  return current_;
}

void PassManager::expect_next_pass(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                                   const std::function<StagingProgress()>& poll) {
  next_.clear();
  if (!poll || current_keys == nullptr || options_.next_pass_chunk_keys == 0 || replicated() ||
      stores_.front()->pool_count() > 1 || !in_pass_ || access_ != PassAccess::kTrain) {
    return;
  }
  // The rows of the current pass the next one lacks are kept as 32-bit offsets in its keys.
  GPUBOX_EXPECTS(current_keys->size() <= UINT32_MAX, "expect_next_pass: ", current_keys->size(),
                 " keys in the training pass, over 2^32");
  next_.resize(stores_.size());
  for (std::size_t c = 0; c < next_.size(); ++c) {
    device::Card& card = cards_.card(static_cast<int>(c));
    NextPassCard& next = next_[c];
    next.phase = NextPassCard::Phase::kWaiting;
    next.poll = poll;  // a copy per card thread
    next.current_keys = current_keys;
    next.generation = key_generation_;
    next.d_keys = device::device_buffer<uint64_t>(0, card.memory(), card.stream());
    next.d_rows = device::device_buffer<row_index_t>(0, card.memory(), card.stream());
    next.d_floats = device::device_buffer<float>(0, card.memory(), card.stream());
    next.d_flags = device::device_buffer<uint8_t>(0, card.memory(), card.stream());
  }
}

void PassManager::forget_next_pass() {
  ++key_generation_;
  next_.clear();
}

bool PassManager::prepare_next_pass(int c) {
  using Phase = NextPassCard::Phase;
  if (static_cast<std::size_t>(c) >= next_.size()) return false;
  NextPassCard& next = next_[static_cast<std::size_t>(c)];
  if (next.phase == Phase::kOff || next.phase == Phase::kDone) return false;
  if (next.generation != key_generation_) {
    next.phase = Phase::kOff;
    return false;
  }
  if (next.phase == Phase::kWaiting) {
    // The keys are enough to start: look-ups and evictions need no staged row.
    const StagedRows* staged = next.poll().staged;
    if (staged == nullptr) return false;
    const std::size_t n = staged->owned.size() == stores_.size() ? staged->owned[c].keys.size() : 0;
    // Several trainers staged nothing: begin_pass does it all. A pass over the budget fails
    // there with its numbers.
    if (staged->owned.size() != stores_.size() || (row_budget_ > 0 && n > row_budget_)) {
      next.phase = Phase::kOff;
      return false;
    }
    next.staged = staged;
    next.at = 0;
    next.staged_at = c > 0 ? staged->card_end[c - 1] : 0;
    // The next pass's rows found on the card are marked as they are found, in case room must be
    // made (a byte per pool row; dropped at once if not).
    if (row_budget_ > 0) next.marks.assign(stores_[c]->pool(0).capacity(), 0);
    next.phase = Phase::kLookup;
  }
  if (next.phase == Phase::kInsert && !next.rows_ready) {
    // Looked up and room made; the inserts wait for the fetch (for ever when it failed: its
    // begin_pass then gets no staged rows and does the rest, exact as the rows evicted were
    // clean).
    if (!next.poll().rows_ready) return false;
    next.rows_ready = true;
    next.poll = nullptr;
  }
  device::Card& card = cards_.card(c);
  const device::DeviceCounts before = card.counts();
  Timer timer;
  try {
    next_chunk(c, next);
  } catch (const std::exception& e) {
    // The work is optional: what it did so far leaves the card exact (victims were clean,
    // inserted rows are the host tier's copies), so begin_pass does the whole job instead of
    // the pass failing. A device fault that persists fails the next step.
    GPUBOX_LOG(WARNING) << "card " << card.rank() << ": the next pass's card work stopped ("
                        << e.what() << "); begin_pass of the next pass does it all";
    next.phase = Phase::kOff;
  }
  if (next.phase == Phase::kDone || next.phase == Phase::kOff) {
    next.d_keys.release();
    next.d_rows.release();
    next.d_floats.release();
    next.d_flags.release();
  }
  next.counts += card.counts() - before;
  next.seconds += timer.seconds();
  ++next.chunks;
  return next.phase != Phase::kDone && next.phase != Phase::kOff;
}

void PassManager::next_chunk(int c, NextPassCard& next) {
  using Phase = NextPassCard::Phase;
  switch (next.phase) {
    case Phase::kLookup:
      next_lookup(c, next);
      break;
    case Phase::kMark:
      next_mark(c, next);
      break;
    case Phase::kList:
      next_list(c, next);
      break;
    case Phase::kErase:
      next_erase(c, next);
      break;
    case Phase::kInsert:
      next_insert(c, next);
      break;
    default:
      break;
  }
}

void PassManager::next_lookup(int c, NextPassCard& next) {
  sparse::CardSparseStore& store = *stores_[c];
  const device::Stream& stream = cards_.card(c).stream();
  const StagedRows& staged = *next.staged;
  const OwnedKeys& mine = staged.owned[c];
  const std::size_t first = c > 0 ? staged.card_end[c - 1] : 0;
  const std::size_t end = staged.card_end[c];
  const std::size_t n = std::min(options_.next_pass_chunk_keys, mine.keys.size() - next.at);
  if (n > 0) {
    next.d_keys.resize_discard(n);
    next.d_rows.resize_discard(n);
    device::copy_async(next.d_keys.data(), mine.keys.data() + next.at, n, stream);
    store.lookup_or_create(next.d_keys.data(), nullptr, n, next.d_rows.data(),
                           /*create_missing=*/false, nullptr, stream);
    const std::vector<row_index_t> found = device::to_host(next.d_rows.data(), n, stream);
    // As begin_pass splits them: hits, missing keys staged (both lists sorted: one walk), the
    // rest.
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = next.at + i;
      if (found[i] != sparse::kInvalidRow) {
        next.hit_rows.push_back(found[i]);
        if (found[i] < next.marks.size()) next.marks[found[i]] = 1;
        continue;
      }
      ++next.missing;
      while (next.staged_at < end && staged.keys[next.staged_at] < mine.keys[k]) ++next.staged_at;
      if (next.staged_at < end && staged.keys[next.staged_at] == mine.keys[k]) {
        next.used.push_back(static_cast<uint32_t>(next.staged_at - first));
      } else {
        next.to_pull.keys.push_back(mine.keys[k]);
        next.to_pull.slots.push_back(mine.slots[k]);
      }
    }
    next.at += n;
  }
  if (next.at == mine.keys.size()) next_plan(c, next);
}

void PassManager::next_plan(int c, NextPassCard& next) {
  next.at = 0;
  const std::size_t resident = stores_[c]->size();
  if (row_budget_ > 0 && resident + next.missing > row_budget_) {
    // Room to make: the rows of the next pass are marked (by row index: one pool, handles are
    // dense indices); the current pass's are marked next.
    next.phase = NextPassCard::Phase::kMark;
  } else {
    next.marks = {};
    next.phase = NextPassCard::Phase::kInsert;
  }
}

void PassManager::next_mark(int c, NextPassCard& next) {
  sparse::CardSparseStore& store = *stores_[c];
  const device::Stream& stream = cards_.card(c).stream();
  // A window of the training pass's keys (shared, every card's): this card's among them, about
  // a chunk of them (the window spans a chunk per local card).
  const std::vector<uint64_t>& keys = *next.current_keys;
  const std::size_t window =
      options_.next_pass_chunk_keys * static_cast<std::size_t>(cards_.num_local_cards());
  const std::size_t stop = std::min(keys.size(), next.at + window);
  const int total_cards = cards_.total_cards();
  const int first_rank = cards_.trainer_id() * cards_.num_local_cards();
  std::vector<uint64_t> mine;
  std::vector<uint32_t> offsets;
  for (std::size_t k = next.at; k < stop; ++k) {
    if (keys[k] == 0 || owner_card(keys[k], total_cards) - first_rank != c) continue;
    mine.push_back(keys[k]);
    offsets.push_back(static_cast<uint32_t>(k));
  }
  next.at = stop;
  const std::size_t n = mine.size();
  if (n > 0) {
    next.d_keys.resize_discard(n);
    next.d_rows.resize_discard(n);
    device::copy_async(next.d_keys.data(), mine.data(), n, stream);
    store.lookup_or_create(next.d_keys.data(), nullptr, n, next.d_rows.data(),
                           /*create_missing=*/false, nullptr, stream);
    const std::vector<row_index_t> rows = device::to_host(next.d_rows.data(), n, stream);
    for (std::size_t i = 0; i < n; ++i) {
      const row_index_t row = rows[i];
      // Every key of the training pass is on the card (begin_pass placed it; nothing evicts it).
      GPUBOX_EXPECTS(row != sparse::kInvalidRow && row < next.marks.size(), "card ",
                     cards_.card(c).rank(), ": a key of the training pass is not on the card");
      if (next.marks[row] == 0) {  // not a row of the next pass
        next.spare_at.push_back(offsets[i]);
        next.spare_rows.push_back(row);
      }
      next.marks[row] = 1;
    }
  }
  if (next.at == keys.size()) {
    // Every row has its mark and nothing inserts until kInsert: the room to make is fixed now.
    const std::size_t resident = store.size();
    next.lacking =
        resident + next.missing > row_budget_ ? resident + next.missing - row_budget_ : 0;
    next.at = 0;
    next.phase = NextPassCard::Phase::kList;
  }
}

void PassManager::next_list(int c, NextPassCard& next) {
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  // Slots are cheaper than keys (most are empty): 8 a key of the chunk.
  const std::size_t slots = store.table().capacity();
  const std::size_t end = std::min(slots, next.at + 8 * options_.next_pass_chunk_keys);
  const std::size_t count =
      store.list_entries_range(next.at, end, next.d_keys, next.d_rows, stream);
  next.d_floats.resize_discard(count);
  next.d_flags.resize_discard(count);
  store.row_scores(next.d_rows.data(), count, next.d_floats.data(), stream);
  store.row_dirty(next.d_rows.data(), count, next.d_flags.data(), stream);
  const std::vector<uint64_t> keys = device::to_host(next.d_keys.data(), count, stream);
  const std::vector<row_index_t> rows = device::to_host(next.d_rows.data(), count, stream);
  const std::vector<float> scores = device::to_host(next.d_floats.data(), count, stream);
  const std::vector<uint8_t> dirty = device::to_host(next.d_flags.data(), count, stream);
  // The lowest (score, key) first, as evict() chooses: as many as the next pass lacks room for,
  // or every candidate (begin_pass evicts the rest among the rows of this pass it does not use).
  // Chosen as the listing goes: a max-heap of the `lacking` lowest so far, so the work of a chunk
  // is bounded by its size (heapified once, when it first fills) and the host holds no more
  // candidates than will leave.
  auto& heap = next.candidates;
  for (std::size_t i = 0; i < count; ++i) {
    // Unmarked: in neither pass, so unused until begin_pass, and clean when end_pass kept only
    // the training pass's rows dirty (the trainer's `keep`); a dirty one (a wider `keep`) stays:
    // its newest value is only here. Nothing inserts between next_mark and here, so every row
    // has a mark; one past them is not a candidate either.
    if (rows[i] >= next.marks.size() || next.marks[rows[i]] != 0 || dirty[i] != 0) continue;
    if (next.lacking == 0) {  // nothing has to leave: every candidate stays
      next.passed_over = true;
      continue;
    }
    const std::pair<float, uint64_t> candidate(scores[i], keys[i]);
    if (heap.size() < next.lacking) {
      heap.push_back(candidate);
      if (heap.size() == next.lacking) std::make_heap(heap.begin(), heap.end());
      continue;
    }
    next.passed_over = true;
    if (candidate < heap.front()) {
      std::pop_heap(heap.begin(), heap.end());
      heap.back() = candidate;
      std::push_heap(heap.begin(), heap.end());
    }
  }
  next.at = end;
  if (next.at < slots) return;
  next.evicts_all_outside = !next.passed_over;
  next.marks = {};
  next.at = 0;
  next.phase = NextPassCard::Phase::kErase;
}

void PassManager::next_erase(int c, NextPassCard& next) {
  device::Card& card = cards_.card(c);
  // The victims are the candidates left in the heap (their order does not matter).
  const std::size_t n = std::min(options_.next_pass_chunk_keys, next.candidates.size() - next.at);
  if (n > 0) {
    std::vector<uint64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = next.candidates[next.at + i].second;
    next.d_keys.resize_discard(n);
    device::copy_async(next.d_keys.data(), keys.data(), n, card.stream());
    next.evicted += stores_[c]->erase(next.d_keys.data(), n, card.stream());
  }
  next.at += n;
  if (next.at == next.candidates.size()) {
    next.candidates = {};
    next.at = 0;
    next.outside_gone = next.evicts_all_outside;
    next.phase = NextPassCard::Phase::kInsert;
  }
}

void PassManager::next_insert(int c, NextPassCard& next) {
  sparse::CardSparseStore& store = *stores_[c];
  const device::Stream& stream = cards_.card(c).stream();
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  const std::size_t first = c > 0 ? next.staged->card_end[c - 1] : 0;
  const std::size_t room =
      row_budget_ > 0 ? row_budget_ - std::min(row_budget_, store.size()) : next.used.size();
  const std::size_t n =
      std::min({options_.next_pass_chunk_keys, room, next.used.size() - next.inserted});
  // The staged rows of this chunk, packed (host), then on the card a page at a time (the plan's
  // staging room, as insert_to_card).
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  for (std::size_t from = 0; from < n; from += store.page_rows()) {
    const std::size_t m = std::min(n - from, store.page_rows());
    keys.resize(m);
    rows.resize(m * stride);
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t at = first + next.used[next.inserted + i];
      keys[i] = next.staged->keys[at];
      std::copy_n(next.staged->rows.data() + at * stride, stride, rows.data() + i * stride);
    }
    next.d_keys.resize_discard(m);
    next.d_floats.resize_discard(m * stride);
    next.d_rows.resize_discard(m);
    device::copy_async(next.d_keys.data(), keys.data(), m, stream);
    device::copy_async(next.d_floats.data(), rows.data(), m * stride, stream);
    store.insert_rows(next.d_keys.data(), next.d_floats.data(), m, stream);
    // Their rows are the next pass's too: begin_pass spares them if it still evicts.
    store.lookup_or_create(next.d_keys.data(), nullptr, m, next.d_rows.data(),
                           /*create_missing=*/false, nullptr, stream);
    const std::vector<row_index_t> inserted = device::to_host(next.d_rows.data(), m, stream);
    next.hit_rows.insert(next.hit_rows.end(), inserted.begin(), inserted.end());
    next.inserted += m;
  }
  // No room left (begin_pass evicts rows of this pass first) or every staged row in.
  if (n == 0 || next.inserted == next.used.size()) next.phase = NextPassCard::Phase::kDone;
}

}  // namespace gpubox::pass
