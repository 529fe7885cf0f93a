#include "heterps/pass/pass_staging.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "common/timer.hpp"

namespace gpubox::pass {

StagedRows plan_staging(const PassCards& cards, const std::vector<uint64_t>& keys,
                        const std::vector<int32_t>& slots, const std::vector<uint64_t>& exclude) {
  GPUBOX_EXPECTS(slots.empty() || slots.size() == keys.size(), "stage_rows: ", keys.size(),
                 " keys but ", slots.size(), " slots");
  GPUBOX_EXPECTS(std::is_sorted(exclude.begin(), exclude.end()),
                 "stage_rows: the excluded keys are not sorted");
  Timer timer;
  StagedRows staged;
  staged.owned = cards.partition_by_owner(keys, slots);
  for (std::size_t c = 0; c < staged.owned.size(); ++c) {
    const OwnedKeys& card = staged.owned[c];
    // Replicated: every card's keys are card 0's, staged once (begin_pass reads card 0's range).
    // Both lists sorted: one walk through `exclude` per card instead of a search per key.
    auto skip = exclude.begin();
    for (std::size_t i = 0; i < (c == 0 || !cards.replicated() ? card.keys.size() : 0); ++i) {
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

void fetch_staged(const PassCards& cards, StagedRows* staged) {
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
  std::vector<float> rows(n * cards.stride());
  staged->created = cards.pull_rows(
      cards.staging_calls(), PassAccess::kTrain, staged->keys.data(), staged_slots.data(), n,
      rows.data(), [](std::size_t, std::size_t) {},
      "staging " + std::to_string(n) + " rows of a coming pass");
  staged->rows = std::move(rows);
  staged->seconds += timer.seconds();
  staged->fetched = true;
}

}  // namespace gpubox::pass
