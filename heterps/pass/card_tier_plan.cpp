// The card tier's footprint per card (CardTierPlan, pass_types.hpp) from the stores' real
// capacities, and the row budget a card memory budget allows.
#include "heterps/pass/card_tier_plan.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/pass/next_pass_work.hpp"
#include "heterps/pass/pass_cards.hpp"

namespace gpubox::pass {
namespace {

using card_table::row_index_t;

// Card bytes a pass boundary holds per resident key on top of the store: eviction lists every
// key (8 bytes), its row index (4) and its score (4); a rehash saves (key, row) pairs (12); the
// begin_pass lookup holds the pass's keys and their rows (12); the write-back list holds the
// dirty keys and rows (12). These phases run one after another, each in the same kept listing
// (CardPassBuffers, pass_cards.hpp: eviction ranks in the listed keys' room once they are read
// back, and a rehash of the pass boundary's or of the next pass's inserts saves its pairs there),
// so the listing is all of this room that is held, from pass to pass (12 of the 16 bytes; the
// rest is slack). It is held while the steps run too, but inside this room: the
// steps take no pass-boundary memory, and what runs before them (expect_next_pass's rehash for
// the next pass's inserts) or after them (begin_pass, end_pass) borrows it, so counting it again
// would count it twice. The next pass's chunks between the steps use scratch of their own
// (CardTierPlan::next_pass_bytes). Not counted: a rehash that an insert's probe overflow
// forces (rare, and it doubles the table past the plan with a warning). compact_pool (width
// classes, when a shift of widths needs the pools' free pages back) lists the rows it moves in
// the kept listing and copies each onto a free row of its pool (fit_pools).
constexpr std::size_t kWorkingBytesPerKey = sizeof(uint64_t) + sizeof(row_index_t) + sizeof(float);
// Card bytes per row staged in a chunk (at most keep_rows rows): the staged key (8), the
// store's and the table's per-position scratch (row index 4 + 4, created flag 1 + 1, key and
// position of a miss 8 + 8), rounded up; scratch grows by half again when it grows, hence 3/2.
constexpr std::size_t kStagingBytesPerRow = 40;
// Fixed card bytes of a store beside its per-row memory (side slots, flags, miss counters).
constexpr std::size_t kStoreFixedBytes = 4096;

// The kept pages (CardPassBuffers: the staging page, a page of keys and rows, at most
// PassCards::kKeptRows rows) are not phases: they are held from the first begin_pass on, beside
// whatever phase runs (the steps' own card memory is the trainer's, outside the plan), so the
// plan counts them once as kept_bytes, resident, beside the working set's per-position scratch of
// the store for an insert of up to keep_rows rows (the staged rows themselves are in kept_bytes).

// The most rows whose footprint fits shape.options.card_memory_bytes. The footprint grows with
// the rows: a bisection between a count that fits and one that does not.
std::size_t rows_fitting_memory(const CardTierShape& shape) {
  const std::size_t budget = shape.options.card_memory_bytes;
  std::size_t fits = 0;
  std::size_t too_many = budget / std::max<std::size_t>(1, plan_for(shape, 1).row_bytes) + 1;
  while (too_many - fits > 1) {
    const std::size_t mid = fits + (too_many - fits) / 2;
    (plan_for(shape, mid).total_bytes() <= budget ? fits : too_many) = mid;
  }
  return fits;
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
  const auto pinned = [&] {
    if (next_pass_pinned_bytes == 0) return;
    out << "; next pass's card work pins " << next_pass_pinned_bytes * mib
        << " MiB of host memory per card (";
    if (host_budget_bytes == 0) {
      out << "no host budget counts it: runner.host_memory_mb is 0, or gpubox_server's)";
      return;
    }
    out << "inside runner.host_memory_mb: " << cards << " card(s), " << pinned_host_bytes() * mib
        << " of its " << host_budget_bytes * mib << " MiB; the host table plans with the rest)";
  };
  if (rows == 0) {
    out << "card tier: no budget (runner.card_memory_mb = 0); per key up to " << bytes_per_key()
        << " bytes (row " << row_bytes << ", table " << table_bytes << ", index " << index_bytes
        << ", pass working set " << working_bytes << "), rows in pages of " << page_rows
        << class_bytes();
    pinned();
    return out.str();
  }
  out.setf(std::ios::fixed);
  out.precision(1);
  out << "card tier per card: " << rows << " rows in " << total_bytes() * mib << " MiB (rows "
      << row_page_bytes * mib << ", table " << table_bytes * mib << ", index " << index_bytes * mib
      << ", pass working set " << working_bytes * mib << ", kept pass-boundary buffers "
      << kept_bytes * mib << ", next pass's card work " << next_pass_bytes * mib << "), "
      << bytes_per_key() << " bytes per key (row " << row_bytes << "), pages of " << page_rows
      << " rows" << class_bytes();
  pinned();
  return out.str();
}

std::size_t CardTierPlan::host_table_bytes() const {
  if (host_budget_bytes == 0) return 0;
  const std::size_t need = pinned_host_bytes();
  // Nothing pinned: the budget is the table's alone, as without a card tier.
  if (need == 0) return host_budget_bytes;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const auto ceil_mib = [](std::size_t bytes) { return (bytes + kMiB - 1) / kMiB; };
  GPUBOX_EXPECTS(host_budget_bytes >= need && host_budget_bytes - need >= host_table_min_bytes,
                 "runner.host_memory_mb (", host_budget_bytes,
                 " bytes) leaves the host table less than the ", host_table_min_bytes,
                 " bytes it needs: the next pass's card work pins ", next_pass_pinned_bytes,
                 " bytes of host memory on each of ", cards, " card(s), ", need,
                 " bytes in all, counted in it. Raise runner.host_memory_mb to at least ",
                 ceil_mib(need) + ceil_mib(host_table_min_bytes),
                 " MiB, or lower runner.next_pass_chunk_keys (0, or runner.prefetch_passes: 0, "
                 "turns the work off)");
  return host_budget_bytes - need;
}

CardTierPlan plan_for(const CardTierShape& shape, std::size_t rows) {
  const card_table::CardSparseStore& store = *shape.store;
  CardTierPlan plan;
  plan.rows = rows;
  plan.row_bytes = store.bytes_per_row();
  plan.host_budget_bytes = shape.options.host_memory_bytes;
  plan.host_table_min_bytes = shape.options.host_table_min_bytes;
  plan.cards = shape.local_cards;
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
      rows == 0 ? static_cast<std::size_t>(std::ceil(2.0 * sizeof(card_table::detail::Slot) / load))
                : std::max(card_table::CardHashTable::slot_capacity_for(rows, load),
                           store.table().capacity()) *
                      sizeof(card_table::detail::Slot);
  // Free list entry and dirty flag per pooled row, a page table pointer per page.
  for (int32_t p = 0; p < pools; ++p) {
    if (rows == 0 && p + 1 < pools) continue;  // one key: one pool's entry (the widest's page)
    const std::size_t pool_page_rows = store.page_rows(p);
    const std::size_t pool_pages = (keys + pool_page_rows - 1) / pool_page_rows;
    const std::size_t pooled = rows == 0 ? 1 : pool_pages * pool_page_rows;
    plan.index_bytes +=
        pooled * (sizeof(row_index_t) + 1) + (rows == 0 ? 0 : pool_pages * sizeof(float*));
  }
  // Inserts stage their rows in the kept pages (kept_bytes), at most keep_rows at a time: the
  // store's per-position scratch of such a chunk is all the working set adds for them. With one
  // pool they stage in the listing instead when it holds more (PassCards::insert_to_card: keys,
  // records and rows there); the table's created flag a staged row (1 byte, grown by half again)
  // is then the only scratch that follows the chunk, at most half the listing's entries (8 of
  // 8 + 4 * stride bytes a row): under 1 byte a key, within the 4 of kWorkingBytesPerKey that
  // the listing leaves.
  const std::size_t staged = PassCards::keep_rows(plan.page_rows);
  plan.working_bytes = keys * kWorkingBytesPerKey +
                       (rows == 0 ? 0 : 3 * staged * kStagingBytesPerRow / 2 + kStoreFixedBytes);
  plan.kept_bytes = rows == 0 ? 0 : kept_bytes_for(shape);
  // The next pass's card work keeps its chunks' scratch beside the steps, from the first pass
  // that runs it on (its chunk bounded by the rows: next_pass_scratch_sizes): card bytes,
  // counted under a budget, and pinned host memory, counted with or without one but outside the
  // card's total. Under a budget the pinned term is more than the card's, as the list regions
  // pin 272 bytes a chunk key: up to about 49 MiB a card at the default chunk and rows of 14
  // floats (a chunk of 131072 keys, from 8.4 million rows up).
  if (next_pass_work_possible(shape)) {
    const NextPassScratchSizes sizes = next_pass_scratch_sizes(shape, rows);
    plan.next_pass_bytes = rows == 0 ? 0 : sizes.card_bytes();
    plan.next_pass_pinned_bytes = sizes.pinned_bytes();
  }
  return plan;
}

std::size_t kept_bytes_for(const CardTierShape& shape) {
  const std::size_t page = shape.store->page_rows();
  return PassCards::allocated_bytes(PassCards::page_rows_kept(page) * shape.stride() *
                                    sizeof(float)) +
         PassCards::allocated_bytes(PassCards::keep_rows(page) * sizeof(uint64_t)) +
         PassCards::allocated_bytes(PassCards::keep_rows(page) * sizeof(row_index_t));
}

std::size_t row_budget_for(const CardTierShape& shape) {
  std::size_t rows = shape.options.card_row_budget;
  if (shape.options.card_memory_bytes == 0) return rows;
  const std::size_t fits = rows_fitting_memory(shape);
  rows = rows == 0 ? fits : std::min(rows, fits);
  const std::size_t one = plan_for(shape, 1).total_bytes();
  GPUBOX_EXPECTS(rows > 0, "runner.card_memory_mb: a card budget of ",
                 shape.options.card_memory_bytes, " bytes holds no row: the card tier takes ", one,
                 " bytes before its first (", plan_for(shape, 1).to_string(),
                 "); raise it to at least ", (one >> 20) + 1, " MiB, or 0 for no budget");
  return rows;
}

void PassCards::fail_table_over_budget(std::size_t rows) const {
  GPUBOX_FAIL(
      "Collective mode holds the whole embedding table on every card, and it has grown "
      "to ",
      rows, " rows (", plan_for(rows).total_bytes(),
      " bytes of card memory per card) but the card budget holds ", row_budget_, " rows (",
      plan_.total_bytes(),
      " bytes). Raise runner.card_memory_mb, or use runner.sync_mode: gpubox, which "
      "shards the table over the cards.");
}

}  // namespace gpubox::pass
