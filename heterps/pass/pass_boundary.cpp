#include "heterps/pass/pass_boundary.hpp"

#include <algorithm>
#include <exception>
#include <future>
#include <stdexcept>
#include <utility>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/thread_annotations.hpp"
#include "common/timer.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/pass/make_room.hpp"

namespace gpubox::pass {

using card_table::row_index_t;

namespace {

// Card c's range [first, end) of staged->keys (none without a staging). Replicated: the rows
// were staged once, in card 0's range.
std::pair<std::size_t, std::size_t> staged_range(const StagedRows* staged, int c, bool replicated) {
  if (staged == nullptr) return {0, 0};
  const auto range = static_cast<std::size_t>(replicated ? 0 : c);
  return {range > 0 ? staged->card_end[range - 1] : 0, staged->card_end[range]};
}

}  // namespace

// Replicated: every card misses the same keys; card 0 pulls their rows once and the other cards
// insert its copy, so the host tier is read once per row, not once per card. A failing card
// wakes the waiting ones (fail).
class PassBoundary::ReplicaRows {
 public:
  explicit ReplicaRows(bool shared) : shared_(shared), ready_(rows_.get_future().share()) {}
  bool shared() const { return shared_; }
  void publish(std::vector<float> rows) {
    std::call_once(set_, [&] { rows_.set_value(std::move(rows)); });
  }
  void fail(const std::string& why) {
    if (!shared_) return;
    std::call_once(set_,
                   [&] { rows_.set_exception(std::make_exception_ptr(std::runtime_error(why))); });
  }
  // Card 0's rows once published; rethrows a card's failure.
  const std::vector<float>& get() const { return ready_.get(); }

 private:
  bool shared_;
  std::promise<std::vector<float>> rows_;
  std::shared_future<std::vector<float>> ready_;
  std::once_flag set_;
};

struct PassBoundary::CardMisses {
  std::vector<row_index_t> hit_rows;  // rows of the keys on the card
  OwnedKeys missing;                  // the keys not on the card (not known with early work)
  std::size_t missing_total = 0;      // how many were missing when looked up
  std::size_t missing_count = 0;      // how many still are (less those inserted early)
  OwnedKeys to_pull;                  // missing and not staged
  std::vector<uint32_t> used;         // offsets in this card's staged keys of the missing ones
};

struct PassBoundary::CardBegin {
  std::size_t keys = 0, hits = 0, pulled = 0, prefetched = 0, created = 0;
  uint64_t evicted = 0;
  double lookup_s = 0, evict_s = 0, insert_s = 0, pull_s = 0;
};

void PassBoundary::check_begin(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                               const StagedRows* staged, PassAccess access) const {
  GPUBOX_EXPECTS(!in_pass_, "begin_pass called twice without end_pass");
  // Rows staged ahead were pulled (created when new): only a training pass may use them.
  GPUBOX_EXPECTS(staged == nullptr || access == PassAccess::kTrain,
                 "begin_pass: an evaluation pass takes no staged rows");
  GPUBOX_EXPECTS(slots.empty() || slots.size() == keys.size(), "begin_pass: ", keys.size(),
                 " keys but ", slots.size(), " slots");
  const std::size_t num_cards = cards_.num_cards();
  GPUBOX_EXPECTS(staged == nullptr || staged->fetched,
                 "begin_pass: the staged rows were never fetched (a failed staging hands none)");
  GPUBOX_EXPECTS(staged == nullptr ||
                     (staged->owned.size() == num_cards && staged->card_end.size() == num_cards &&
                      staged->rows.size() == staged->keys.size() * cards_.stride()),
                 "begin_pass: the staged rows were made for other cards or rows");
}

PassStats PassBoundary::begin_pass(const std::vector<uint64_t>& keys,
                                   const std::vector<int32_t>& slots, const StagedRows* staged,
                                   PassAccess access) {
  check_begin(keys, slots, staged, access);
  access_ = access;
  borrowed_.assign(cards_.num_cards(), {});
  Timer timer;
  // What the cards did for this pass during the previous one (prepare_next_pass), if it is still
  // true of them: made for these staged rows, and no other change of the keys since.
  const uint64_t generation = next_work_.generation();
  std::vector<NextPassCard> next = next_work_.take();
  // With a staging, the split by owner card was done ahead.
  std::vector<OwnedKeys> partitioned;
  if (staged == nullptr) partitioned = cards_.partition_by_owner(keys, slots);
  const std::vector<OwnedKeys>& owned = staged ? staged->owned : partitioned;
  PassStats stats;
  stats.pass_id = next_pass_id_;
  BeginTimes times;
  Mutex stats_mu;
  ReplicaRows replica(cards_.replicated() && cards_.num_cards() > 1);
  cards_.cards().run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        NextPassCard* work = static_cast<std::size_t>(c) < next.size()
                                 ? &next[static_cast<std::size_t>(c)]
                                 : nullptr;
        if (work != nullptr) next_work_.finish(c, *work);
        NextPassCard* early =
            staged != nullptr && work != nullptr && work->usable_for(staged, generation) ? work
                                                                                         : nullptr;
        const CardBegin done = begin_on_card(c, owned[c], staged, early, replica, access);
        // Its card and pinned scratch, kept for the next pass's work (no allocation then).
        if (work != nullptr) next_work_.keep_scratch(c, *work);
        MutexLock lock(stats_mu);
        add_card(done, work, early, &stats, &times);
        stats.rows_on_cards += cards_.store(c).size();
      },
      [&](const std::string& why) { replica.fail(why); });
  // A staged row the host tier created is missing on every card (it was new), so it was used.
  if (staged != nullptr) stats.created += staged->created;
  stats.begin_seconds = timer.seconds();
  log_begin(stats, times);
  current_ = stats;
  in_pass_ = true;
  ++next_pass_id_;
  return current_;
}

PassBoundary::CardBegin PassBoundary::begin_on_card(int c, const OwnedKeys& mine,
                                                    const StagedRows* staged, NextPassCard* early,
                                                    ReplicaRows& replica, PassAccess access) {
  CardBegin done;
  done.keys = mine.keys.size();
  check_fits(c, done.keys, access);
  Timer phase;
  // Rows on the card before this pass's inserts: none in the card's first pass.
  const bool card_was_empty = cards_.store(c).size() == 0;
  CardMisses misses = early != nullptr ? take_early(*early) : find_missing(c, mine, staged);
  // The next pass's card work sizes card c for about as many inserts as this pass brought new
  // keys, early or now (NextPassWork::expect). The first pass brought all of its keys: taken
  // whole, the guess would reserve the card's rows a second time (an out-of-memory where the
  // table would have grown by the next pass's new keys only); an eighth of them is noted.
  if (access == PassAccess::kTrain) {
    const std::size_t brought = misses.missing_total + (early != nullptr ? early->inserted : 0);
    next_work_.note_pass_missing(c, card_was_empty ? brought / 8 : brought);
  }
  done.lookup_s = phase.seconds();
  phase.reset();
  done.evicted = make_room(c, misses, early);
  if (cards_.row_budget() > 0 && cards_.store(c).pool_count() > 1) {
    fit_pools(cards_, c, misses.missing);
  }
  misses.hit_rows = {};
  done.evict_s = phase.seconds();
  phase.reset();
  // A rehash (a purge of the evictions' erased slots) saves its pairs in the kept listing.
  CardPassBuffers& lent = cards_.kept(c);
  cards_.store(c).reserve(misses.missing_count, cards_.card(c).stream(),
                          {&lent.listed_keys, &lent.listed_rows});
  insert_staged(c, staged, misses.used);
  done.insert_s = phase.seconds();
  phase.reset();
  const std::size_t created = pull_rest(c, misses.to_pull, replica, access);
  if (access == PassAccess::kEvaluate) borrowed_[c] = misses.missing.keys;
  done.pull_s = phase.seconds();
  done.hits = done.keys - misses.missing_total;
  done.pulled = misses.to_pull.keys.size();
  done.prefetched = misses.used.size();
  done.created = access == PassAccess::kTrain ? created : 0;
  return done;
}

void PassBoundary::check_fits(int c, std::size_t n, PassAccess access) const {
  const std::size_t budget = cards_.row_budget();
  if (budget == 0 || n <= budget) return;
  if (cards_.replicated()) cards_.fail_table_over_budget(n);
  // Named by what it is, not by this tier's count (which counts evaluations too, from 1: it
  // named "pass 5" for epoch 0's evaluation, and a pass for --mode infer's data).
  const bool training = access == PassAccess::kTrain;
  GPUBOX_FAIL(training ? "a training pass's keys do not" : "the evaluated data's keys do not",
              " fit on card ", cards_.card(c).rank(), ": they need ", n, " rows (",
              cards_.plan_for(n).total_bytes(), " bytes) but the card budget is ", budget,
              " rows (", cards_.plan().total_bytes(), " bytes). ",
              training ? "Use smaller passes (fewer files per pass) or more cards"
                       : "Evaluate smaller files (runner.test_data_dir, --infer_data_dir) or use "
                         "more cards",
              ", or raise runner.card_memory_mb.");
}

PassBoundary::CardMisses PassBoundary::find_missing(int c, const OwnedKeys& mine,
                                                    const StagedRows* staged) {
  CardMisses misses;
  misses.missing = cards_.missing_on_card(c, mine, &misses.hit_rows);
  misses.missing_total = misses.missing_count = misses.missing.keys.size();
  // The missing rows staged ahead are inserted from the staging (both lists are sorted: one
  // walk); only the others are pulled.
  const auto [first, end] = staged_range(staged, c, cards_.replicated());
  std::size_t at = first;
  for (std::size_t i = 0; i < misses.missing.keys.size(); ++i) {
    const uint64_t key = misses.missing.keys[i];
    while (at < end && staged->keys[at] < key) ++at;
    if (at < end && staged->keys[at] == key) {
      misses.used.push_back(static_cast<uint32_t>(at - first));
    } else {
      misses.to_pull.keys.push_back(key);
      misses.to_pull.slots.push_back(misses.missing.slots[i]);
    }
  }
  return misses;
}

PassBoundary::CardMisses PassBoundary::take_early(NextPassCard& early) {
  // Looked up during the previous pass (the keys found then are still here: only rows outside
  // this pass were evicted since), some staged rows inserted then.
  CardMisses misses;
  misses.hit_rows = std::move(early.hit_rows);
  misses.missing_total = early.missing;
  misses.missing_count = early.missing - early.inserted;
  misses.used.assign(early.used.begin() + static_cast<std::ptrdiff_t>(early.inserted),
                     early.used.end());
  misses.to_pull = std::move(early.to_pull);
  return misses;
}

uint64_t PassBoundary::make_room(int c, const CardMisses& misses, const NextPassCard* early) {
  const std::size_t budget = cards_.row_budget();
  const std::size_t resident = cards_.store(c).size();
  if (budget == 0 || resident + misses.missing_count <= budget) return 0;
  // A replica is the whole table: nothing may leave it.
  if (cards_.replicated()) cards_.fail_table_over_budget(resident + misses.missing_count);
  const std::size_t excess = resident + misses.missing_count - budget;
  if (early != nullptr && early->outside_gone) {
    // Only rows of the previous pass are left to choose from (clean: end_pass wrote back all
    // but this pass's keys): their ranks alone, no listing of the table.
    return evict_among(cards_, c, *early->current_keys, early->spare_at, early->spare_rows,
                       kept_dirty_, excess);
  }
  return evict_outside(cards_, c, misses.hit_rows, kept_dirty_, excess);
}

void PassBoundary::insert_staged(int c, const StagedRows* staged,
                                 const std::vector<uint32_t>& used) const {
  const std::size_t stride = cards_.stride();
  const auto [first, end] = staged_range(staged, c, cards_.replicated());
  if (used.size() == end - first) {
    // Every staged row is missing (the staging skips the keys on the cards): inserted straight
    // from the staging, without a copy.
    cards_.insert_to_card(c, staged ? staged->keys.data() + first : nullptr,
                          staged ? staged->rows.data() + first * stride : nullptr, used.size());
    return;
  }
  // Some staged keys are on the card after all (placed there since the staging started): the
  // others are gathered.
  std::vector<uint64_t> staged_keys(used.size());
  std::vector<float> staged_rows(used.size() * stride);
  for (std::size_t u = 0; u < used.size(); ++u) {
    const std::size_t at = first + used[u];
    staged_keys[u] = staged->keys[at];
    std::copy_n(staged->rows.data() + at * stride, stride, staged_rows.data() + u * stride);
  }
  cards_.insert_to_card(c, staged_keys.data(), staged_rows.data(), staged_keys.size());
}

std::size_t PassBoundary::pull_rest(int c, const OwnedKeys& to_pull, ReplicaRows& replica,
                                    PassAccess access) const {
  if (replica.shared() && c > 0) {
    const std::vector<float>& rows = replica.get();  // rethrows a card's failure
    GPUBOX_EXPECTS(rows.size() == to_pull.keys.size() * cards_.stride(), "begin_pass: card ",
                   cards_.card(c).rank(), " misses other rows than card 0's replica");
    cards_.insert_to_card(c, to_pull.keys.data(), rows.data(), to_pull.keys.size());
    return 0;
  }
  std::vector<float> pulled;
  const std::size_t created =
      cards_.pull_to_card(c, to_pull, access, replica.shared() ? &pulled : nullptr);
  if (replica.shared()) replica.publish(std::move(pulled));
  return created;
}

void PassBoundary::add_card(const CardBegin& done, const NextPassCard* work,
                            const NextPassCard* early, PassStats* stats, BeginTimes* times) {
  times->lookup = std::max(times->lookup, done.lookup_s);
  times->evict = std::max(times->evict, done.evict_s);
  times->insert = std::max(times->insert, done.insert_s);
  times->pull = std::max(times->pull, done.pull_s);
  stats->keys_in_pass += done.keys;
  stats->hits += done.hits;
  stats->pulled += done.pulled;
  stats->prefetched += done.prefetched;
  stats->created += done.created;
  stats->evicted += done.evicted;
  if (work != nullptr) {
    // The card's work during the previous pass, used here or not (a failed staging, an
    // evaluation pass between): its evictions and chunks happened all the same.
    stats->evicted += work->evicted;
    stats->early_evicted += work->evicted;
    stats->early_chunks += work->chunks;
    stats->early_host_syncs += work->counts.host_syncs;
    stats->early_allocations += work->counts.allocations;
    stats->early_launches += work->counts.launches;
    stats->early_seconds = std::max(stats->early_seconds, work->seconds);
  }
  if (early != nullptr) {
    ++times->early_cards;
    stats->prefetched += early->inserted;
    stats->early_inserted += early->inserted;
  }
}

void PassBoundary::log_begin(const PassStats& stats, const BeginTimes& times) const {
  GPUBOX_LOG(INFO) << "begin_pass " << stats.pass_id << ": " << stats.begin_seconds
                   << " s; slowest card: looking up " << times.lookup << " s, evicting "
                   << times.evict << " s, inserting staged rows " << times.insert << " s, pulling "
                   << times.pull << " s";
  if (stats.early_chunks == 0) return;
  GPUBOX_LOG(INFO) << "begin_pass " << stats.pass_id << ": " << times.early_cards << " of "
                   << cards_.num_cards()
                   << " card(s) used their look-up of its keys during the previous pass; the "
                      "cards evicted "
                   << stats.early_evicted << " rows and inserted " << stats.early_inserted
                   << " staged rows then, in " << stats.early_chunks
                   << " chunks between steps (slowest card " << stats.early_seconds << " s; "
                   << stats.early_host_syncs << " host syncs, " << stats.early_allocations
                   << " allocations, " << stats.early_launches << " launches)";
}

void PassBoundary::clear_cards() {
  GPUBOX_EXPECTS(!in_pass_, "clearing the cards during a pass");
  cards_.cards().run_on_cards([&](device::Card& card) {
    cards_.store(card.local_index()).clear(card.stream());
    card.stream().synchronize();
  });
  // make_room reads it as the dirty rows it must spare: none are left. The only reset besides
  // sync() (abandon_pass leaves it to this).
  kept_dirty_ = 0;
}

}  // namespace gpubox::pass
