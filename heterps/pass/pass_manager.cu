#include <algorithm>
#include <future>
#include <mutex>
#include <numeric>
#include <sstream>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/timer.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "heterps/sparse/card_store.cuh"

namespace gpubox::pass {
namespace {

// Hash-table bytes per key on a card: a 16-byte slot at the table's 0.6 load bound, plus the
// free-list entry and the dirty flag of the row.
constexpr std::size_t kTableBytesPerKey = 16 * 10 / 6 + sizeof(uint32_t) + 1;

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

void throw_host_error(const Status& st, const std::string& what) {
  if (!st.ok()) GPUBOX_FAIL(what, ": ", st.to_string());
}

}  // namespace

std::string PassStats::to_string() const {
  std::ostringstream out;
  out << "keys: " << keys_in_pass << ", hits: " << hits << ", pulled: " << pulled
      << ", created: " << created << ", evicted: " << evicted << ", written_back: " << written_back
      << ", rows_on_cards: " << rows_on_cards << ", begin_pass: " << begin_seconds
      << " s, end_pass: " << end_seconds << " s";
  return out.str();
}

std::string PassStats::json_members() const {
  std::ostringstream out;
  out << "\"keys_in_pass\": " << keys_in_pass << ", \"hits\": " << hits
      << ", \"pulled\": " << pulled << ", \"created\": " << created << ", \"evicted\": " << evicted
      << ", \"written_back\": " << written_back << ", \"rows_on_cards\": " << rows_on_cards
      << ", \"begin_pass_seconds\": " << begin_seconds << ", \"end_pass_seconds\": " << end_seconds;
  return out.str();
}

PassManager::PassManager(device::CardSet& cards, std::vector<sparse::CardSparseStore*> stores,
                         table::HostTier& host, const PassManagerOptions& options)
    : cards_(cards), stores_(std::move(stores)), host_(host), options_(options) {
  GPUBOX_EXPECTS(static_cast<int>(stores_.size()) == cards_.num_local_cards(),
                 "pass manager: ", stores_.size(), " stores for ", cards_.num_local_cards(),
                 " cards");
  GPUBOX_EXPECTS(cards_.total_cards() == cards_.num_local_cards(),
                 "pass manager: several trainer processes are not supported yet (",
                 cards_.total_cards(), " cards in all, ", cards_.num_local_cards(), " here)");
  for (auto* store : stores_) {
    GPUBOX_EXPECTS(store != nullptr, "pass manager: null store");
    GPUBOX_EXPECTS(store->layout().stride() == host_.layout().stride(),
                   "pass manager: card rows have ", store->layout().stride(),
                   " floats but host-tier rows have ", host_.layout().stride());
  }
  row_budget_ = options_.card_row_budget;
  if (options_.card_memory_bytes > 0) {
    const std::size_t from_bytes = options_.card_memory_bytes / bytes_per_card_row();
    row_budget_ = row_budget_ == 0 ? from_bytes : std::min(row_budget_, from_bytes);
    GPUBOX_EXPECTS(row_budget_ > 0, "card memory budget of ", options_.card_memory_bytes,
                   " bytes holds no row (", bytes_per_card_row(), " bytes each)");
  }
}

std::size_t PassManager::bytes_per_card_row() const {
  return sizeof(float) * static_cast<std::size_t>(host_.layout().stride()) + kTableBytesPerKey;
}

PassStats PassManager::begin_pass(const std::vector<uint64_t>& keys,
                                  const std::vector<int32_t>* slots) {
  GPUBOX_EXPECTS(!in_pass_, "begin_pass called twice without end_pass");
  GPUBOX_EXPECTS(slots == nullptr || slots->size() == keys.size(), "begin_pass: ", keys.size(),
                 " keys but ", slots->size(), " slots");
  Timer timer;
  const int num_cards = cards_.num_local_cards();
  const int stride = host_.layout().stride();

  // Partition by owner card; drop key 0 ("no feature") and duplicates.
  std::vector<std::vector<uint64_t>> owned(num_cards);
  std::vector<std::vector<int32_t>> owned_slots(num_cards);
  {
    std::vector<std::size_t> order(keys.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
    for (std::size_t k = 0; k < order.size(); ++k) {
      const uint64_t key = keys[order[k]];
      if (key == 0 || (k > 0 && keys[order[k - 1]] == key)) continue;
      const int owner = owner_card(key, num_cards);
      owned[owner].push_back(key);  // sorted per card: eviction tests membership by binary search
      owned_slots[owner].push_back(slots ? (*slots)[order[k]] : 0);
    }
  }

  PassStats stats;
  stats.pass_id = next_pass_id_;
  std::mutex stats_mu;
  cards_.run_on_cards([&](device::Card& card) {
    const int c = card.local_index();
    sparse::CardSparseStore& store = *stores_[c];
    const device::Stream& stream = card.stream();
    const std::vector<uint64_t>& mine = owned[c];
    const std::size_t n = mine.size();
    if (row_budget_ > 0 && n > row_budget_) {
      GPUBOX_FAIL("pass ", next_pass_id_, " does not fit on card ", card.rank(), ": it needs ", n,
                  " rows (", n * bytes_per_card_row(), " bytes) but the card budget is ",
                  row_budget_, " rows (", row_budget_ * bytes_per_card_row(),
                  " bytes). Use smaller passes (fewer files per pass) or more cards, or raise "
                  "runner.card_memory_mb.");
    }

    // Which keys are already on the card?
    auto d_keys = device::to_device(mine, card.memory(), stream);
    auto d_rows_idx = card.make_buffer<sparse::row_index_t>(n);
    store.lookup_or_create(d_keys.data(), nullptr, n, d_rows_idx.data(), /*create_missing=*/false,
                           nullptr, stream);
    const std::vector<sparse::row_index_t> found = device::to_host(d_rows_idx);
    std::vector<uint64_t> missing;
    std::vector<int32_t> missing_slots;
    for (std::size_t i = 0; i < n; ++i) {
      if (found[i] == sparse::kInvalidRow) {
        missing.push_back(mine[i]);
        missing_slots.push_back(owned_slots[c][i]);
      }
    }

    // Make room: evict rows this pass does not need, lowest score first.
    uint64_t evicted = 0;
    const std::size_t resident = store.size();
    if (row_budget_ > 0 && resident + missing.size() > row_budget_) {
      const std::size_t excess = resident + missing.size() - row_budget_;
      device::device_buffer<uint64_t> all_keys(0, card.memory(), stream);
      device::device_buffer<float> all_rows(0, card.memory(), stream);
      const std::size_t count = store.collect_all(all_keys, all_rows, stream);
      const std::vector<uint64_t> h_keys = device::to_host(all_keys.data(), count, stream);
      const std::vector<float> h_rows = device::to_host(all_rows.data(), count * stride, stream);
      std::vector<std::size_t> candidates;
      for (std::size_t i = 0; i < count; ++i) {
        if (!std::binary_search(mine.begin(), mine.end(), h_keys[i])) candidates.push_back(i);
      }
      GPUBOX_EXPECTS(candidates.size() >= excess, "card ", card.rank(), ": cannot evict ", excess,
                     " rows, only ", candidates.size(), " are outside the pass");
      const auto& cfg = host_.config();
      std::partial_sort(candidates.begin(), candidates.begin() + excess, candidates.end(),
                        [&](std::size_t a, std::size_t b) {
                          const float sa = table::row_score(&h_rows[a * stride], cfg);
                          const float sb = table::row_score(&h_rows[b * stride], cfg);
                          return sa != sb ? sa < sb : h_keys[a] < h_keys[b];
                        });
      candidates.resize(excess);
      // end_pass wrote every dirty row back and begin_pass needs !in_pass_, so every row is
      // clean here: a victim leaves the card without a write-back and nothing is lost.
      std::vector<uint64_t> victims;
      for (std::size_t i : candidates) victims.push_back(h_keys[i]);
      auto d_victims = device::to_device(victims, card.memory(), stream);
      evicted = store.erase(d_victims.data(), victims.size(), stream);
    }

    // Pull what is missing: several host-tier requests in flight, inserted in order.
    std::vector<float> rows(missing.size() * stride);
    std::vector<std::size_t> created(
        missing.size() == 0
            ? 0
            : (missing.size() + options_.host_batch_keys - 1) / options_.host_batch_keys,
        0);
    store.reserve(missing.size(), stream);
    device::device_buffer<uint64_t> chunk_keys(0, card.memory(), stream);
    device::device_buffer<float> chunk_rows(0, card.memory(), stream);
    const Status st = pipelined_chunks(
        missing.size(), options_.host_batch_keys, options_.pulls_in_flight,
        [&](std::size_t b, std::size_t e) {
          return host_.pull(missing.data() + b, missing_slots.data() + b, e - b,
                            rows.data() + b * stride, &created[b / options_.host_batch_keys]);
        },
        [&](std::size_t b, std::size_t e) {
          chunk_keys.resize_discard(e - b);
          chunk_rows.resize_discard((e - b) * stride);
          device::copy_async(chunk_keys.data(), missing.data() + b, e - b, stream);
          device::copy_async(chunk_rows.data(), rows.data() + b * stride, (e - b) * stride, stream);
          store.insert_rows(chunk_keys.data(), chunk_rows.data(), e - b, stream);
        });
    throw_host_error(st, "begin_pass: pulling " + std::to_string(missing.size()) +
                             " keys of card " + std::to_string(card.rank()) +
                             " from the host tier");

    std::lock_guard<std::mutex> lock(stats_mu);
    stats.keys_in_pass += n;
    stats.hits += n - missing.size();
    stats.pulled += missing.size();
    stats.created += std::accumulate(created.begin(), created.end(), std::size_t{0});
    stats.evicted += evicted;
    stats.rows_on_cards += store.size();
  });
  stats.begin_seconds = timer.seconds();
  current_ = stats;
  in_pass_ = true;
  ++next_pass_id_;
  return current_;
}

uint64_t PassManager::write_back(int c) {
  sparse::CardSparseStore& store = *stores_[c];
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const int stride = host_.layout().stride();
  device::device_buffer<uint64_t> d_keys(0, card.memory(), stream);
  device::device_buffer<float> d_rows(0, card.memory(), stream);
  const std::size_t count = store.collect_dirty(d_keys, d_rows, stream);
  if (count == 0) return 0;
  const std::vector<uint64_t> keys = device::to_host(d_keys.data(), count, stream);
  const std::vector<float> rows = device::to_host(d_rows.data(), count * stride, stream);
  const Status st = pipelined_chunks(
      count, options_.host_batch_keys, options_.pulls_in_flight,
      [&](std::size_t b, std::size_t e) {
        return host_.push(keys.data() + b, e - b, rows.data() + b * stride);
      },
      [](std::size_t, std::size_t) {});
  // On failure the rows stay dirty on the card: a retried end_pass/sync writes them again.
  throw_host_error(st, "writing back " + std::to_string(count) + " dirty rows of card " +
                           std::to_string(card.rank()) + " to the host tier");
  store.clear_dirty(stream);
  stream.synchronize();
  return count;
}

uint64_t PassManager::sync() {
  std::vector<uint64_t> written(cards_.num_local_cards(), 0);
  cards_.run_on_cards(
      [&](device::Card& card) { written[card.local_index()] = write_back(card.local_index()); });
  return std::accumulate(written.begin(), written.end(), uint64_t{0});
}

PassStats PassManager::end_pass() {
  GPUBOX_EXPECTS(in_pass_, "end_pass called without begin_pass");
  Timer timer;
  current_.written_back += sync();
  uint64_t rows = 0;
  for (auto* store : stores_) rows += store->size();
  current_.rows_on_cards = rows;
  current_.end_seconds = timer.seconds();
  in_pass_ = false;
  return current_;
}

}  // namespace gpubox::pass
