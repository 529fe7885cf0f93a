#include "heterps/card_tier/card_tier.hpp"

#include <utility>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/profile_range.hpp"
#include "heterps/device/step_graph.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/pass/card_tier_plan.hpp"
#include "heterps/pass/next_pass_work.hpp"
#include "heterps/pass/pass_manager.hpp"

namespace gpubox::tier_owner {
namespace {

// The pass manager's options: `pass` with the tier's placement.
pass::PassManagerOptions pass_options(const CardTierOptions& options) {
  pass::PassManagerOptions pass_options = options.pass;
  pass_options.placement = options.placement;
  return pass_options;
}

// Card `card`'s store (the card active): rows by `accessor`, the options' eviction policy.
std::unique_ptr<card_table::CardSparseStore> make_store(device::Card& card,
                                                        const table::AccessorConfig& accessor,
                                                        const CardTierOptions& options) {
  return std::make_unique<card_table::CardSparseStore>(
      card, accessor, card_table::HashTableOptions{}, options.eviction);
}

}  // namespace

pass::CardTierPlan CardTier::plan_ahead(device::CardSet& cards,
                                        const table::AccessorConfig& accessor,
                                        const CardTierOptions& options) {
  device::Card& card = cards.card(0);
  card.activate();
  const auto store = make_store(card, accessor, options);
  const pass::CardTierShape shape{store.get(), pass_options(options), cards.num_local_cards(),
                                  cards.total_cards()};
  return pass::plan_for(shape, pass::row_budget_for(shape));
}

bool CardTier::pins_host_memory(const device::CardSet& cards, const table::AccessorConfig& accessor,
                                const CardTierOptions& options) {
  return pass::next_pass_work_possible(pass_options(options), table::width_classes(accessor).count,
                                       cards.num_local_cards(), cards.total_cards());
}

CardTier::CardTier(device::CardSet& cards, comm::CommGroup& group, table::HostTier& host,
                   const table::AccessorConfig& accessor, const CardTierOptions& options)
    : cards_(cards), group_(group), placement_(options.placement), host_(host) {
  const int n = cards_.num_local_cards();
  GPUBOX_EXPECTS(group.size() == n, "card tier: a communicator group of ", group.size(),
                 " ranks for ", n, " cards");
  for (int c = 0; c < n; ++c) {
    device::Card& card = cards_.card(c);
    card.activate();
    stores_.push_back(make_store(card, accessor, options));
    heter_comm::HeterCommOptions comm_options;
    comm_options.missing_keys = options.missing_keys;
    comm_options.placement = options.placement;
    comm_options.step_graphs = device::step_graphs_enabled();
    comm_options.padded_steps = heter_comm::padded_steps_enabled();
    comms_.push_back(
        std::make_unique<heter_comm::HeterComm>(card, *stores_.back(), group.at(c), comm_options));
  }
  std::vector<card_table::CardSparseStore*> stores;
  for (auto& store : stores_) stores.push_back(store.get());
  pass_manager_ = std::make_unique<pass::PassManager>(cards_, stores, host_, pass_options(options));
  // The next pass's card work waits between steps only on a fault or a repair, when the step's
  // collectives may be pending: bounded by the group's timeout, as the step's own waits.
  pass_manager_->set_card_wait([this](int c, const device::Stream& stream, const char* what) {
    group_.at(c).synchronize(stream, what);
  });
}

CardTier::~CardTier() = default;

pass::PassStats CardTier::begin_pass(const std::vector<uint64_t>& keys,
                                     const std::vector<int32_t>& slots,
                                     const pass::StagedRows* staged, pass::PassAccess access) {
  const device::ProfileRange range("begin_pass");
  if (cards_.total_cards() == cards_.num_local_cards()) {
    return pass_manager_->begin_pass(keys, slots, staged, access);
  }
  // Several trainers: the keys owned here come from every trainer's data, so rows staged from
  // this trainer's keys alone would not cover them (stage_rows stages nothing then).
  return begin_received_pass(exchange_keys(keys, slots), access);
}

pass::PassStats CardTier::begin_received_pass(const ReceivedKeys& received,
                                              pass::PassAccess access) {
  const device::ProfileRange range("begin_pass");
  return pass_manager_->begin_pass(received.keys, received.slots, nullptr, access);
}

pass::StagedRows CardTier::stage_rows(const std::vector<uint64_t>& keys,
                                      const std::vector<int32_t>& slots,
                                      const std::vector<uint64_t>& exclude) const {
  if (cards_.total_cards() != cards_.num_local_cards()) return {};
  return pass_manager_->stage_rows(keys, slots, exclude);
}

pass::StagedRows CardTier::plan_staging(const std::vector<uint64_t>& keys,
                                        const std::vector<int32_t>& slots,
                                        const std::vector<uint64_t>& exclude) const {
  if (cards_.total_cards() != cards_.num_local_cards()) return {};
  return pass_manager_->plan_staging(keys, slots, exclude);
}

void CardTier::fetch_staged(pass::StagedRows* staged) const {
  if (cards_.total_cards() != cards_.num_local_cards()) return;
  pass_manager_->fetch_staged(staged);
}

std::vector<uint64_t> CardTier::resident_keys() const {
  if (cards_.total_cards() != cards_.num_local_cards()) return {};
  return pass_manager_->resident_keys();
}

CardTier::ReceivedKeys CardTier::exchange_keys(const std::vector<uint64_t>& keys,
                                               const std::vector<int32_t>& slots) {
  GPUBOX_EXPECTS(slots.empty() || slots.size() == keys.size(), "begin_pass: ", keys.size(),
                 " keys but ", slots.size(), " slots");
  const int local = cards_.num_local_cards();
  const int total = cards_.total_cards();
  // What local card c sends: this trainer's keys whose owner has local index c (on any
  // trainer), grouped by owner rank. Each key leaves once; a key owned here goes card to itself.
  // Replicated: every key goes from local card c to every rank with local index c, so each
  // card receives every trainer's keys (begin_pass drops the repeats of the local cards).
  std::vector<std::vector<std::vector<uint64_t>>> send_keys(
      static_cast<std::size_t>(local), std::vector<std::vector<uint64_t>>(total));
  std::vector<std::vector<std::vector<int32_t>>> send_slots(
      static_cast<std::size_t>(local), std::vector<std::vector<int32_t>>(total));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == 0) continue;  // the padding key is never a row (pass_manager.hpp)
    const int32_t slot = slots.empty() ? 0 : slots[i];
    if (placement_ == heter_comm::Placement::kReplicated) {
      for (int rank = 0; rank < total; ++rank) {
        send_keys[rank % local][rank].push_back(keys[i]);
        send_slots[rank % local][rank].push_back(slot);
      }
      continue;
    }
    const int owner = owner_card(keys[i], total);
    send_keys[owner % local][owner].push_back(keys[i]);
    send_slots[owner % local][owner].push_back(slot);
  }
  std::vector<ReceivedKeys> received(static_cast<std::size_t>(local));
  cards_.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        comm::Communicator& comm = group_.at(c);
        const device::Stream& stream = card.stream();
        std::vector<std::size_t> send_counts(total), recv_counts(total);
        std::vector<uint64_t> flat_keys;
        std::vector<int32_t> flat_slots;
        for (int r = 0; r < total; ++r) {
          send_counts[r] = send_keys[c][r].size();
          flat_keys.insert(flat_keys.end(), send_keys[c][r].begin(), send_keys[c][r].end());
          flat_slots.insert(flat_slots.end(), send_slots[c][r].begin(), send_slots[c][r].end());
        }
        comm.exchange_counts(send_counts.data(), recv_counts.data(), stream);
        std::size_t incoming = 0;
        for (std::size_t n : recv_counts) incoming += n;
        auto d_send_keys = device::to_device(flat_keys, card.memory(), stream);
        auto d_send_slots = device::to_device(flat_slots, card.memory(), stream);
        auto d_recv_keys = card.make_buffer<uint64_t>(incoming);
        auto d_recv_slots = card.make_buffer<int32_t>(incoming);
        comm.all_to_all_v(d_send_keys.data(), send_counts.data(), d_recv_keys.data(),
                          recv_counts.data(), stream);
        comm.all_to_all_v(d_send_slots.data(), send_counts.data(), d_recv_slots.data(),
                          recv_counts.data(), stream);
        comm.synchronize(stream, "the pass's keys sent to their owner cards");
        // In peer order: the pass manager keeps a repeated key's first slot, the lowest trainer's.
        received[c].keys = device::to_host(d_recv_keys);
        received[c].slots = device::to_host(d_recv_slots);
      },
      [&](const std::string& why) { group_.abort(why); });
  ReceivedKeys owned;
  for (auto& part : received) {
    owned.keys.insert(owned.keys.end(), part.keys.begin(), part.keys.end());
    owned.slots.insert(owned.slots.end(), part.slots.begin(), part.slots.end());
  }
  return owned;
}

pass::PassStats CardTier::end_pass(const std::vector<uint64_t>& keep) {
  const device::ProfileRange range("end_pass");
  return pass_manager_->end_pass(keep);
}

uint64_t CardTier::sync() { return pass_manager_->sync(); }

void CardTier::expect_next_pass(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                                const std::function<pass::StagingProgress()>& poll) {
  if (cards_.total_cards() != cards_.num_local_cards()) return;
  pass_manager_->expect_next_pass(std::move(current_keys), poll);
}

bool CardTier::prepare_next_pass(int card) {
  const device::ProfileRange range("next pass card work");
  return pass_manager_->prepare_next_pass(card);
}

void CardTier::clear() {
  pass_manager_->clear_cards();  // not during a pass (PassManager::clear_cards checks)
}

void CardTier::abandon_pass() {
  pass_manager_->abandon_pass();
  clear();
}

bool CardTier::in_pass() const { return pass_manager_->in_pass(); }
uint64_t CardTier::kept_dirty() const { return pass_manager_->kept_dirty(); }
const pass::CardTierPlan& CardTier::plan() const { return pass_manager_->plan(); }
const pass::PassStats& CardTier::current() const { return pass_manager_->current(); }

void CardTier::pull(int card, const uint64_t* keys, std::size_t n, float* out_pull,
                    const device::Stream& stream, const heter_comm::PlannedCounts& planned,
                    const uint64_t* n_on_card) {
  const device::ProfileRange range("pull");
  if (planned.counts != nullptr) comms_.at(card)->plan_next_step(planned, n_on_card);
  comms_.at(card)->pull(keys, n, out_pull, stream);
}

void CardTier::pull_only(int card, const uint64_t* keys, std::size_t n, float* out_pull,
                         const device::Stream& stream, const heter_comm::PlannedCounts& planned,
                         const uint64_t* n_on_card) {
  const device::ProfileRange range("pull only");
  if (planned.counts != nullptr) comms_.at(card)->plan_next_step(planned, n_on_card);
  comms_.at(card)->pull_only(keys, n, out_pull, stream);
}

void CardTier::reserve_steps(int card, const heter_comm::StepBounds& bounds) {
  comms_.at(card)->reserve_steps(bounds);
}

void CardTier::push_pulled(int card, const float* grads, const device::Stream& stream,
                           uint32_t* veto, heter_comm::NormClipState* clip) {
  const device::ProfileRange range("push");
  comms_.at(card)->push_pulled(grads, stream, veto, clip);
}

void CardTier::drain_checks(int card) { comms_.at(card)->drain_checks(); }
void CardTier::plan_next_step(int card, const heter_comm::PlannedCounts& planned,
                              const uint64_t* n_on_card) {
  comms_.at(card)->plan_next_step(planned, n_on_card);
}

bool CardTier::pads_planned_steps(int card) const { return comms_.at(card)->pads_planned_steps(); }

const table::RowLayout& CardTier::layout() const { return host_.layout(); }
const heter_comm::HeterCommStats& CardTier::stats(int card) const {
  return comms_.at(card)->stats();
}
int CardTier::num_cards() const { return cards_.num_local_cards(); }
card_table::CardSparseStore& CardTier::store(int card) { return *stores_.at(card); }
heter_comm::HeterComm& CardTier::heter_comm(int card) { return *comms_.at(card); }

}  // namespace gpubox::tier_owner
