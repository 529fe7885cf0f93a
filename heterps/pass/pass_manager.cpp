#include "heterps/pass/pass_manager.hpp"

#include <utility>

#include "common/error.hpp"
#include "heterps/pass/pass_staging.hpp"

namespace gpubox::pass {

PassManager::PassManager(device::CardSet& cards, std::vector<card_table::CardSparseStore*> stores,
                         table::HostTier& host, const PassManagerOptions& options)
    : cards_(cards, std::move(stores), host, options), next_(cards_), boundary_(cards_, next_) {}

PassStats PassManager::begin_pass(const std::vector<uint64_t>& keys,
                                  const std::vector<int32_t>& slots, const StagedRows* staged,
                                  PassAccess access) {
  return boundary_.begin_pass(keys, slots, staged, access);
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
  return pass::plan_staging(cards_, keys, slots, exclude);
}

void PassManager::fetch_staged(StagedRows* staged) const { pass::fetch_staged(cards_, staged); }

std::vector<uint64_t> PassManager::resident_keys() const { return cards_.resident_keys(); }

PassStats PassManager::end_pass(const std::vector<uint64_t>& keep) {
  return boundary_.end_pass(keep);
}

uint64_t PassManager::sync() { return boundary_.sync(); }

void PassManager::expect_next_pass(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                                   const std::function<StagingProgress()>& poll) {
  next_.expect(std::move(current_keys), poll,
               boundary_.in_pass() && boundary_.access() == PassAccess::kTrain,
               boundary_.current().pass_id);
}

bool PassManager::prepare_next_pass(int c) { return next_.prepare(c); }

void PassManager::clear_cards() {
  // Checked here as well as in PassBoundary::clear_cards: the next pass's work is forgotten
  // first, which a card thread may be doing during a pass.
  GPUBOX_EXPECTS(!boundary_.in_pass(), "clearing the cards during a pass");
  next_.forget();  // before the stores are emptied: nothing staged for them stays
  boundary_.clear_cards();
}

}  // namespace gpubox::pass
