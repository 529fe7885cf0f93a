// What the card tier's plan (CardTierPlan, pass_types.hpp) is made from, and the plan itself:
// one card's store (every card's is alike: its layout, pages and table), the pass manager's
// options and the cards. PassCards plans from its own first store; a caller with no host tier
// yet plans from a store of its own the same way (tier_owner::CardTier::plan_ahead: the trainer
// counts the plan's pinned host memory in runner.host_memory_mb before the host table opens).
// Host code (the store's host API).
#pragma once

#include <cstddef>

#include "heterps/card_table/card_store.hpp"
#include "heterps/pass/pass_types.hpp"

namespace gpubox::pass {

// A view of what a plan is made from. The store is borrowed.
struct CardTierShape {
  const card_table::CardSparseStore* store = nullptr;
  PassManagerOptions options;
  int local_cards = 1;
  int total_cards = 1;
  // Floats per record (the host tier's rows have as many: PassCards checks).
  std::size_t stride() const { return static_cast<std::size_t>(store->record_stride()); }
  bool replicated() const { return options.placement == heter_comm::Placement::kReplicated; }
};

// The footprint of `rows` rows per card (0: none; monotone in rows).
CardTierPlan plan_for(const CardTierShape& shape, std::size_t rows);
// Rows per card the options' budgets allow: card_row_budget and the most rows whose footprint
// fits card_memory_bytes, the smaller (0: neither set). Throws when card_memory_bytes holds no
// row.
std::size_t row_budget_for(const CardTierShape& shape);
// The card bytes of the kept page buffers (CardPassBuffers, pass_cards.hpp, all but the
// listing): CardTierPlan::kept_bytes.
std::size_t kept_bytes_for(const CardTierShape& shape);

}  // namespace gpubox::pass
