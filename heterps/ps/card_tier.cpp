#include "heterps/ps/card_tier.hpp"

#include "common/error.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "heterps/sparse/card_store.hpp"

namespace gpubox::ps {

CardTier::CardTier(device::CardSet& cards, comm::CommGroup& group, table::HostTier& host,
                   const table::AccessorConfig& accessor, const CardTierOptions& options)
    : cards_(cards), host_(host) {
  const int n = cards_.num_local_cards();
  GPUBOX_EXPECTS(group.size() == n, "card tier: a communicator group of ", group.size(),
                 " ranks for ", n, " cards");
  for (int c = 0; c < n; ++c) {
    device::Card& card = cards_.card(c);
    card.activate();
    stores_.push_back(std::make_unique<sparse::CardSparseStore>(card, accessor));
    heter_comm::HeterCommOptions comm_options;
    comm_options.missing_keys = options.missing_keys;
    comms_.push_back(
        std::make_unique<heter_comm::HeterComm>(card, *stores_.back(), group.at(c), comm_options));
  }
  std::vector<sparse::CardSparseStore*> stores;
  for (auto& store : stores_) stores.push_back(store.get());
  pass_manager_ = std::make_unique<pass::PassManager>(cards_, stores, host_, options.pass);
}

CardTier::~CardTier() = default;

pass::PassStats CardTier::begin_pass(const std::vector<uint64_t>& keys,
                                     const std::vector<int32_t>& slots, pass::PassAccess access) {
  return pass_manager_->begin_pass(keys, slots, access);
}

pass::PassStats CardTier::end_pass() { return pass_manager_->end_pass(); }

uint64_t CardTier::sync() { return pass_manager_->sync(); }

void CardTier::clear() {
  GPUBOX_EXPECTS(!pass_manager_->in_pass(), "card tier: clear() during a pass");
  cards_.run_on_cards([&](device::Card& card) {
    stores_[card.local_index()]->clear(card.stream());
    card.stream().synchronize();
  });
}

bool CardTier::in_pass() const { return pass_manager_->in_pass(); }
const pass::CardTierPlan& CardTier::plan() const { return pass_manager_->plan(); }
const pass::PassStats& CardTier::current() const { return pass_manager_->current(); }

void CardTier::pull(int card, const uint64_t* keys, std::size_t n, float* out_pull,
                    const device::Stream& stream) {
  comms_.at(card)->pull(keys, n, out_pull, stream);
}

void CardTier::push_pulled(int card, const float* grads, const device::Stream& stream,
                           const uint32_t* veto) {
  comms_.at(card)->push_pulled(grads, stream, veto);
}

const table::RowLayout& CardTier::layout() const { return host_.layout(); }
const heter_comm::HeterCommStats& CardTier::stats(int card) const {
  return comms_.at(card)->stats();
}
int CardTier::num_cards() const { return cards_.num_local_cards(); }
sparse::CardSparseStore& CardTier::store(int card) { return *stores_.at(card); }
heter_comm::HeterComm& CardTier::heter_comm(int card) { return *comms_.at(card); }

}  // namespace gpubox::ps
