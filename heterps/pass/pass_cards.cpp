#include "heterps/pass/pass_cards.hpp"

#include <algorithm>
#include <numeric>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::pass {
namespace {

using card_table::row_index_t;

}  // namespace

void throw_host_error(const Status& st, const std::string& what) {
  if (!st.ok()) GPUBOX_FAIL(what, ": ", st.to_string());
}

CardTierShape PassCards::shape() const {
  return CardTierShape{stores_.front(), options_, cards_.num_local_cards(), cards_.total_cards()};
}

void PassCards::wait_between_steps(int c, const char* what) const {
  const device::Stream& stream = card(c).stream();
  if (card_wait_) {
    card_wait_(c, stream, what);
  } else {
    stream.synchronize();
  }
}

PassCards::PassCards(device::CardSet& cards, std::vector<card_table::CardSparseStore*> stores,
                     table::HostTier& host, const PassManagerOptions& options)
    : cards_(cards),
      stores_(std::move(stores)),
      host_(host),
      options_(options),
      kept_(stores_.size()),
      host_calls_((stores_.size() + 1) *
                  static_cast<std::size_t>(std::max(1, options.pulls_in_flight))),
      staging_calls_(static_cast<std::size_t>(std::max(1, options.pulls_in_flight)),
                     options.staging_nice) {
  GPUBOX_EXPECTS(static_cast<int>(stores_.size()) == cards_.num_local_cards(),
                 "pass manager: ", stores_.size(), " stores for ", cards_.num_local_cards(),
                 " cards");
  for (auto* store : stores_) {
    GPUBOX_EXPECTS(store != nullptr, "pass manager: null store");
    GPUBOX_EXPECTS(store->layout().stride() == host_.layout().stride(),
                   "pass manager: card rows have ", store->layout().stride(),
                   " floats but host-tier rows have ", host_.layout().stride());
  }
  row_budget_ = row_budget_for(shape());
  plan_ = plan_for(row_budget_);
  (void)plan_.host_table_bytes();  // a host budget too small for the pinned term fails now
  if (row_budget_ > 0) {
    // Size every store for the budget once: its table never grows, its index never moves.
    cards_.run_on_cards([&](device::Card& card) {
      stores_[card.local_index()]->reserve_capacity(row_budget_, card.stream());
    });
  }
}

CardPassBuffers& PassCards::kept(int c) const {
  CardPassBuffers& kept = kept_[static_cast<std::size_t>(c)];
  if (kept.made) return kept;
  device::Card& card = cards_.card(c);
  device::CardMemory& memory = card.memory();
  const device::Stream& stream = card.stream();
  kept.listed_keys = device::device_buffer<uint64_t>(0, memory, stream);
  kept.listed_rows = device::device_buffer<row_index_t>(0, memory, stream);
  // Under a row budget the listing is sized once, for the budget's rows (the table holds no
  // more). Without one it grows with the table.
  if (row_budget_ > 0) {
    kept.listed_keys.reserve(row_budget_);
    kept.listed_rows.reserve(row_budget_);
  }
  // The pages on both backends (the cpu backend's write-back stages only under
  // GPUBOX_DEVICE_CHECK=defer; the card's memory counts the same either way).
  const std::size_t page = store(c).page_rows();
  kept.page_keys = device::device_buffer<uint64_t>(keep_rows(page), memory, stream);
  kept.page_rows = device::device_buffer<row_index_t>(keep_rows(page), memory, stream);
  kept.staged = device::device_buffer<float>(page_rows_kept(page) * stride(), memory, stream);
  kept.made = true;
  return kept;
}

std::size_t PassCards::kept_page_bytes() const {
  std::size_t most = 0;
  for (const CardPassBuffers& kept : kept_) {
    most = std::max(most, allocated_bytes(kept.page_keys.capacity() * sizeof(uint64_t)) +
                              allocated_bytes(kept.page_rows.capacity() * sizeof(row_index_t)) +
                              allocated_bytes(kept.staged.capacity() * sizeof(float)));
  }
  return most;
}

std::vector<uint64_t> PassCards::resident_keys() const {
  const auto num_cards = static_cast<std::size_t>(cards_.num_local_cards());
  std::vector<std::vector<uint64_t>> per_card(num_cards);
  cards_.run_on_cards([&](device::Card& card) {
    const int c = card.local_index();
    if (replicated() && c > 0) return;
    const device::Stream& stream = card.stream();
    // Between begin_pass and the steps (PassManager::resident_keys): the listing is free.
    CardPassBuffers& lent = kept(c);
    const std::size_t count =
        stores_[c]->list_entries(/*dirty_only=*/false, lent.listed_keys, lent.listed_rows, stream);
    per_card[c] = device::to_host(lent.listed_keys.data(), count, stream);
  });
  std::vector<uint64_t> keys = std::move(per_card.front());
  for (std::size_t c = 1; c < num_cards; ++c)
    keys.insert(keys.end(), per_card[c].begin(), per_card[c].end());
  return keys;
}

std::vector<OwnedKeys> PassCards::partition_by_owner(const std::vector<uint64_t>& keys,
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

OwnedKeys PassCards::missing_on_card(int c, const OwnedKeys& mine,
                                     std::vector<row_index_t>* hit_rows) const {
  card_table::CardSparseStore& store = *stores_[c];
  const device::Stream& stream = cards_.card(c).stream();
  const std::size_t n = mine.keys.size();
  // 12 bytes per pass key on the card, in the kept listing (eviction reuses it).
  device::device_buffer<uint64_t>& d_keys = kept(c).listed_keys;
  device::device_buffer<row_index_t>& d_rows = kept(c).listed_rows;
  d_keys.resize_discard(n);
  d_rows.resize_discard(n);
  if (n > 0) device::copy_async(d_keys.data(), mine.keys.data(), n, stream);
  store.lookup_or_create(d_keys.data(), nullptr, n, d_rows.data(), /*create_missing=*/false,
                         nullptr, stream);
  const std::vector<row_index_t> found = device::to_host(d_rows.data(), n, stream);
  OwnedKeys missing;
  hit_rows->clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i] == card_table::kInvalidRow) {
      missing.keys.push_back(mine.keys[i]);
      missing.slots.push_back(mine.slots[i]);
    } else {
      hit_rows->push_back(found[i]);
    }
  }
  return missing;
}

std::size_t PassCards::pull_rows(HostCallWorkers& workers, PassAccess access, const uint64_t* keys,
                                 const int32_t* slots, std::size_t n, float* rows,
                                 const std::function<void(std::size_t, std::size_t)>& finish,
                                 const std::string& what) const {
  const std::size_t stride = this->stride();
  const std::size_t batch = std::max<std::size_t>(options_.host_batch_keys, 1);
  std::vector<std::size_t> created(n == 0 ? 0 : (n + batch - 1) / batch, 0);
  const Status st = pipelined_chunks(
      workers, n, batch, options_.pulls_in_flight,
      [&](std::size_t b, std::size_t e) {
        float* out = rows + b * stride;
        return access == PassAccess::kEvaluate
                   ? host_.peek(keys + b, slots + b, e - b, out, &created[b / batch])
                   : host_.pull(keys + b, slots + b, e - b, out, &created[b / batch]);
      },
      finish);
  throw_host_error(st, what);
  return std::accumulate(created.begin(), created.end(), std::size_t{0});
}

std::size_t PassCards::pull_to_card(int c, const OwnedKeys& missing, PassAccess access,
                                    std::vector<float>* keep) const {
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  const std::size_t n = missing.keys.size();
  // Inserted batch by batch as the requests complete.
  std::vector<float> rows(n * stride);
  const std::size_t created = pull_rows(
      host_calls_, access, missing.keys.data(), missing.slots.data(), n, rows.data(),
      [&](std::size_t b, std::size_t e) {
        insert_to_card(c, missing.keys.data() + b, rows.data() + b * stride, e - b);
      },
      "begin_pass: pulling " + std::to_string(n) + " keys of card " +
          std::to_string(cards_.card(c).rank()) + " from the host tier");
  if (keep != nullptr) *keep = std::move(rows);
  return created;
}

void PassCards::insert_to_card(int c, const uint64_t* keys, const float* rows,
                               std::size_t n) const {
  if (n == 0) return;
  card_table::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const std::size_t stride = static_cast<std::size_t>(host_.layout().stride());
  // The kept listing when it stages more rows at once than the kept pages (page_rows_kept rows;
  // with width classes the pages alone), else the pages: nothing allocated either way, and one
  // wait per insert (its count's readback). The stream orders each upload after the insert
  // before it read the room.
  CardPassBuffers& lent = kept(c);
  const KeptRoom room =
      kept_room(lent, store.pool_count() == 1 ? rows_staged_in_listing(lent, stride) : 0,
                page_rows_kept(store.page_rows()));
  const std::size_t stage_limit =
      std::min(room.entries, std::max<std::size_t>(options_.host_batch_keys, 1));
  // In the listing: the keys first, then their records, in the listed keys' room (8 bytes an
  // entry: the records start 8-byte aligned), and the keys' rows in the listed rows' room (so
  // the store's scratch does not grow to the chunk). In the pages: the records in the staging
  // page, the rows in the store's scratch (grouped by pool there with width classes).
  float* d_records =
      room.in_listing ? reinterpret_cast<float*>(room.keys + stage_limit) : lent.staged.data();
  row_index_t* d_rows = room.in_listing ? room.rows : nullptr;
  for (std::size_t from = 0; from < n; from += stage_limit) {
    const std::size_t count = std::min(n, from + stage_limit) - from;
    device::copy_async(room.keys, keys + from, count, stream);
    device::copy_async(d_records, rows + from * stride, count * stride, stream);
    store.insert_rows(room.keys, d_records, count, stream, d_rows);
  }
}

KeptRoom PassCards::kept_room(CardPassBuffers& lent, std::size_t listed, std::size_t paged) {
  if (listed > paged) return {lent.listed_keys.data(), lent.listed_rows.data(), listed, true};
  return {lent.page_keys.data(), lent.page_rows.data(), paged, false};
}

std::size_t PassCards::rows_staged_in_listing(const CardPassBuffers& lent, std::size_t stride) {
  const std::size_t bytes = lent.listed_keys.capacity() * sizeof(uint64_t);
  return std::min(bytes / (sizeof(uint64_t) + stride * sizeof(float)), lent.listed_rows.capacity());
}

uint64_t PassCards::erase_from_card(int c, const std::vector<uint64_t>& keys) const {
  card_table::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  // The kept listing's keys and rows when it holds more than a kept page (under a budget it
  // holds the budget's rows: every erase at once, one wait), else the page: no allocation.
  CardPassBuffers& lent = kept(c);
  const KeptRoom room =
      kept_room(lent, std::min(lent.listed_keys.capacity(), lent.listed_rows.capacity()),
                keep_rows(store.page_rows()));
  uint64_t removed = 0;
  for (std::size_t b = 0; b < keys.size(); b += room.entries) {
    const std::size_t count = std::min(keys.size(), b + room.entries) - b;
    device::copy_async(room.keys, keys.data() + b, count, stream);
    removed += store.erase(room.keys, count, stream, room.rows);
  }
  return removed;
}

}  // namespace gpubox::pass
