// CardTier: the one owner of the card tier (the role of Paddle's PSGPUWrapper). It owns every
// local card's sparse store (CardSparseStore), its HeterComm and the pass manager between them
// and the host tier, and is what a schedule talks to: gpubox_train's pass loop today, other
// schedules (sync/async/geo, collective) and trainers later.
//
//   pass boundaries (controlling thread, no card thread running steps):
//     begin_pass(keys, slots) -> the pass's rows on their owner cards (pulled from the host
//                                tier, created there with the key's slot when new)
//     begin_pass(keys, slots, &staged) -> the same, inserting the rows staged ahead
//     end_pass(keep) / sync() -> dirty rows back to the host tier
//     clear()                 -> every card's store emptied (after a model load)
//     abandon_pass()          -> the open pass given up unwritten, the stores emptied
//   between two steps (card thread `c`):
//     prepare_next_pass(c)    -> a chunk of the next pass's card work (after expect_next_pass)
//   a step (card thread `c`, collective over the cards):
//   any thread, also during steps:
//     stage_rows(keys, slots, exclude) -> a coming pass's host-tier rows, fetched ahead
//                                         (runner.prefetch_passes; pass_manager.hpp)
//     pull(c, ...) -> records of every key occurrence; push_pulled(c, ...) -> one optimizer
//     step per key (HeterComm, heterps/heter_comm/heter_comm.hpp)
//
// The cards, their communicator group and the host tier are borrowed (the schedule builds the
// host tier with table::make_host_tier and shares the communicator with its dense part) and must
// outlive the CardTier. Every row follows the accessor config given here; the host tier must
// hold the same layout (checked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "heterps/card_table/eviction_policy.hpp"
#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "heterps/pass/pass_types.hpp"
#include "table/host_tier.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox {
namespace comm {
class CommGroup;
}
namespace card_table {
class CardSparseStore;
}
namespace heter_comm {
class HeterComm;
}
namespace pass {
class PassManager;
}

namespace tier_owner {

struct CardTierOptions {
  pass::PassManagerOptions pass;  // card budget (runner.card_memory_mb), host batching
  // begin_pass places every key of a pass on its owner (with its slot) before the pass's steps,
  // so a key an owner lacks during a step is a bug: the step fails naming it (kFail).
  heter_comm::MissingKeyPolicy missing_keys = heter_comm::MissingKeyPolicy::kFail;
  // kSharded: gpubox mode (one owner card per key). kReplicated: Collective mode, every card of
  // the job holds the whole table (HeterComm and PassManager follow it; `pass.placement` is set
  // from it).
  heter_comm::Placement placement = heter_comm::Placement::kSharded;
  // Which rows leave a card first when a pass needs room: every store's policy
  // (sparse/eviction_policy.hpp).
  card_table::EvictionPolicy eviction = card_table::EvictionPolicy::kLowestScore;
};

class CardTier {
 public:
  // One store and one HeterComm per local card of `cards` (group.at(c) is card c's rank), rows
  // by `accessor`; with a budget, every store is sized for it once (pass_manager.hpp).
  CardTier(device::CardSet& cards, comm::CommGroup& group, table::HostTier& host,
           const table::AccessorConfig& accessor, const CardTierOptions& options = {});
  ~CardTier();
  // The plan (CardTierPlan) a CardTier of these arguments makes, before any host tier exists: from
  // a store of its own on card 0, made and freed here. The trainer counts the plan's pinned host
  // memory in runner.host_memory_mb before the host table opens (CardTierPlan::host_table_bytes).
  static pass::CardTierPlan plan_ahead(device::CardSet& cards,
                                       const table::AccessorConfig& accessor,
                                       const CardTierOptions& options);
  // Whether a CardTier of these arguments can run the next pass's card work, whose buffers pin
  // host memory (pass::next_pass_work_possible), without a store: when not (the work off,
  // Collective mode, width classes, several trainers), plan_ahead's plan pins nothing and need not
  // be made.
  static bool pins_host_memory(const device::CardSet& cards, const table::AccessorConfig& accessor,
                               const CardTierOptions& options);
  CardTier(const CardTier&) = delete;
  CardTier& operator=(const CardTier&) = delete;

  // --- pass boundaries (controlling thread) ---
  // `keys`: the pass's unique keys; `slots` (same length, or empty): each key's slot, given to
  // the rows the host tier creates (the dataset's first occurrence, InMemoryDataset::unique_keys).
  // With several trainers (cards.total_cards() > local cards) these are this trainer's keys:
  // they are first sent to their owner cards over the communicator (every trainer's begin_pass
  // is collective; a trainer with no keys still joins), so each card holds the keys of every
  // trainer's data that it owns (replicated: every key of every trainer's data).
  // Throws gpubox::Error when the host tier fails or the pass cannot fit on a card.
  // `staged`: rows stage_rows fetched ahead for this pass (optional, borrowed for the call).
  // `access`: kEvaluate for a pass whose steps only pull, which leaves the host tier and the card
  // tier's keys as they were (pass::PassAccess; no staged rows then).
  pass::PassStats begin_pass(const std::vector<uint64_t>& keys,
                             const std::vector<int32_t>& slots = {},
                             const pass::StagedRows* staged = nullptr,
                             pass::PassAccess access = pass::PassAccess::kTrain);
  // begin_pass of several trainers in its two parts, so that a caller can meet the others
  // between the collective and the host-tier calls: exchange_keys sends this trainer's `keys`
  // (with `slots`) to their owner cards (all_to_all_v over the group, every trainer in it;
  // replicated: to every card) and returns what the local cards received, in peer order;
  // begin_received_pass places those and pulls their rows from the host tier (no collective).
  struct ReceivedKeys {  // in peer order, not sorted (pass::OwnedKeys is sorted)
    std::vector<uint64_t> keys;
    std::vector<int32_t> slots;
  };
  ReceivedKeys exchange_keys(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots);
  pass::PassStats begin_received_pass(const ReceivedKeys& received,
                                      pass::PassAccess access = pass::PassAccess::kTrain);
  // The host-tier rows of a coming pass's `keys` less `exclude` (sorted: the keys of every pass
  // trained before it from now on): PassManager::stage_rows. Any thread; touches only the host
  // tier. With several trainers it stages nothing (begin_pass pulls every row).
  pass::StagedRows stage_rows(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                              const std::vector<uint64_t>& exclude) const;
  // stage_rows in its two steps (PassManager::plan_staging, then fetch_staged), so the cards can
  // start on the keys before the rows are fetched. With several trainers both do nothing.
  pass::StagedRows plan_staging(const std::vector<uint64_t>& keys,
                                const std::vector<int32_t>& slots,
                                const std::vector<uint64_t>& exclude) const;
  void fetch_staged(pass::StagedRows* staged) const;
  // Every key on this trainer's cards, unsorted (PassManager::resident_keys): a coming pass's
  // staging excludes them too. Between passes or after begin_pass before the steps. With several
  // trainers none (stage_rows stages nothing there).
  std::vector<uint64_t> resident_keys() const;
  // Writes the dirty rows back but those of `keep` (sorted: the next pass's keys when it trains
  // right after; PassManager::end_pass); returns the pass's counters.
  pass::PassStats end_pass(const std::vector<uint64_t>& keep = {});
  // Writes the dirty rows back without ending the pass (before a save). Returns rows written.
  uint64_t sync();
  // Empties every card's store (after a model load; the next begin_pass refills it). Not
  // during a pass.
  void clear();
  // Gives up the open pass, if any, without writing it back, and empties every card's store as
  // clear() does: after a failed pass boundary (a server restart found in a write-back) whose
  // rows the schedule replaces by reloading a save. Between passes, no card thread running.
  void abandon_pass();
  // The next pass's card work between the current pass's steps (PassManager::prepare_next_pass,
  // runner.next_pass_chunk_keys): expect_next_pass on the controlling thread after begin_pass
  // (`current_keys`: this pass's sorted unique keys, shared; `poll` reports the next pass's
  // staging: its keys once planned, its rows once fetched), prepare_next_pass(c) on card thread
  // c between two steps (one bounded chunk; false when nothing is left or it waits). With
  // several trainers nothing is staged, so there is nothing to do.
  void expect_next_pass(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                        const std::function<pass::StagingProgress()>& poll);
  bool prepare_next_pass(int card);
  bool in_pass() const;
  // Dirty rows the last end_pass kept on the cards (its `keep`), not written back since: 0 after
  // sync(), clear() or abandon_pass() (PassManager::kept_dirty).
  uint64_t kept_dirty() const;
  // The card tier's footprint per card (rows, bytes per key): the log line at the start.
  const pass::CardTierPlan& plan() const;
  // The counters of the current (or last) pass.
  const pass::PassStats& current() const;

  // --- a step (card thread `card`; collective over the cards) ---
  // out_pull[i * pull_dim() ...] = the pull record of keys[i] (card memory): HeterComm::pull.
  // `planned` (optional): the step's key counts from the pass's plan
  // (HeterComm::plan_next_step; no wait at all: its checks are read late, drain_checks).
  // `n_on_card` (optional, with planned counts): n in card memory, so that the step runs at the
  // pass's fixed sizes, as step graphs (HeterComm::plan_next_step).
  void pull(int card, const uint64_t* keys, std::size_t n, float* out_pull,
            const device::Stream& stream, const heter_comm::PlannedCounts& planned = {},
            const uint64_t* n_on_card = nullptr);
  // HeterComm::plan_next_step for card `card`'s next pull (then pull without `planned`): a caller
  // that captures the pull plans it before its capture (it may read a step's late check).
  void plan_next_step(int card, const heter_comm::PlannedCounts& planned,
                      const uint64_t* n_on_card);
  // Whether card `card`'s planned pulls given n_on_card run padded this pass
  // (HeterComm::pads_planned_steps): capturable with the caller's work as one step graph.
  bool pads_planned_steps(int card) const;
  // pull() for a step that pushes nothing (an evaluation's): HeterComm::pull_only (the same
  // records; padded, only the lookup, as one step graph with no owner merge plan, and no
  // collective in the replicated placement). push_pulled after it is refused.
  void pull_only(int card, const uint64_t* keys, std::size_t n, float* out_pull,
                 const device::Stream& stream, const heter_comm::PlannedCounts& planned = {},
                 const uint64_t* n_on_card = nullptr);
  // Sizes card `card`'s step buffers for steps up to `bounds` (HeterComm::reserve_steps): on its
  // card thread, before a pass's first step.
  void reserve_steps(int card, const heter_comm::StepBounds& bounds);
  // One optimizer step per key of the card's last pull: HeterComm::push_pulled (enqueued, no
  // wait; `veto` and `clip`, clipping by global norm, as there).
  void push_pulled(int card, const float* grads, const device::Stream& stream,
                   uint32_t* veto = nullptr, heter_comm::NormClipState* clip = nullptr);
  // Reads card `card`'s pending checks of planned pulls and throws the first failure
  // (HeterComm::drain_checks): on its thread, after the last step of a pass or an evaluation.
  void drain_checks(int card);
  int32_t pull_dim() const { return layout().pull_dim(); }
  int32_t push_dim() const { return layout().push_dim(); }
  const table::RowLayout& layout() const;
  // Cumulative traffic counters of card `card`'s HeterComm.
  const heter_comm::HeterCommStats& stats(int card) const;

  int num_cards() const;
  table::HostTier& host() { return host_; }
  // Card `card`'s parts, for tests and tools that look inside.
  card_table::CardSparseStore& store(int card);
  heter_comm::HeterComm& heter_comm(int card);

 private:
  device::CardSet& cards_;
  comm::CommGroup& group_;
  heter_comm::Placement placement_;
  table::HostTier& host_;
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores_;
  std::vector<std::unique_ptr<heter_comm::HeterComm>> comms_;
  // Destroyed first (members go in reverse order), before comms_: its write-back's pinned buffers
  // are freed with it, and cudaFreeHost waits for the whole device. That assumes no collective is
  // still queued on a card: after a failure the communicator abort (CommGroup::abort, run by
  // run_on_cards' failure handler) has ended them before anything is destroyed.
  std::unique_ptr<pass::PassManager> pass_manager_;
};

}  // namespace tier_owner
}  // namespace gpubox
