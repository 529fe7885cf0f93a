// HeterComm: one training step's sparse traffic across cards (ARCHITECTURE §1), one object per
// card. Every key has one owner card, owner_card(key, total_cards) (common/hash.hpp); the owner
// holds its row in its CardSparseStore.
//
//   pull   local dedup (sort + unique, each occurrence remembers its unique key) -> keys to
//          their owners (all_to_all_v) -> owners look the rows up and fill pull records
//          (show, click, embed_w, embedx_w[mf_dim]) -> records back (all_to_all_v) -> scatter
//          to every occurrence.
//   push   per-occurrence push records (show, click, embed_g, embedx_g[mf_dim]) summed per
//          unique key locally -> keys and sums to the owners -> summed again on the owner over
//          all source cards -> ONE optimizer step per key per batch
//          (table/sparse_row/optimizer.hpp), row marked dirty.
//
// Replicated placement (HeterCommOptions::placement, Collective mode): every card holds every
// row, so the pull reads the card's own replica (no records travel), and instead of the key and
// record all_to_all_v every card's unique keys and summed records are all-gathered (padded to the
// step's largest unique count, then packed in source-rank order, the layout an owner receives).
// Every card then merges all of them and applies the same step per key to its replica, exactly
// as the owner does in the sharded placement: same sums in the same order, so replicas stay
// byte-identical and equal to the sharded owners' rows. Same host waits; collectives per step:
// 3 (counts, keys, records) instead of 4; a planned step at the pass's fixed sizes, 2 (keys and
// records, in fixed blocks: heter_comm_padded.cu), inside its two step graphs. Clipping by global
// norm (push's and push_pulled's `clip`) adds one all-reduce of one double (the owners' sparse
// squares) to a sharded step on several cards, planned or not (inside the push graph); a replicated
// step adds none (every card merged every key).
//
// pull and push are collectives: every card of the communicator calls them in the same order
// (a card with an empty batch calls them with n = 0). Sums are taken in a fixed order (by
// position inside a card, by source rank across cards; a hot key's long segment in chunks summed
// in parallel, see segment_reduce.cuh), so a run is reproducible and both backends agree.
//
// Sizes: reserve_steps before a pass's first step sizes every buffer for the pass's largest step
// (the trainer computes it from the pass's data on the host); without it the buffers grow with
// 1.5x headroom at the steps that need more.
//
// Host waits (bounded: Communicator::synchronize): an unplanned pull waits twice (the key counts;
// the owner's lookups) and returns with its records enqueued; the push_pulled after it waits at
// its end (so its caller may allocate: device rule 1). A pull
// whose counts are planned (plan_next_step, with MissingKeyPolicy::kFail: the trainer's steps)
// waits for nothing: its merge count stays on the card, and its checks (no key missing on its
// owner, the card's counts as planned) are written on the card and read at most kCheckDepth (4)
// steps later, or by drain_checks(), through a ring of pinned slots; a failed check throws
// naming the pass and step it happened in. A planned training step (pull + push_pulled)
// therefore waits 0 times (its caller must not allocate before its next wait: size everything
// with reserve_steps), an unplanned one 3 times. A planned step given its occurrence count on the
// card, in a pass reserved with StepBounds::pair_block (kFail: the trainer's; either placement),
// runs at the pass's fixed sizes and is two step graph launches, "sparse pull" and "sparse push"
// (heter_comm_padded.cu), and one kernel that copies its check into the slot the card's counter
// names (device::LateReadback): nothing else is launched, copied or exchanged outside them. Inside
// a caller's device::ComposedStep (the trainer's whole step as one graph) all of it goes into the
// caller's graph instead. Buffers are owned, reused
// across steps and sized before the keys move: in steady state a step allocates no card memory,
// and it never allocates while a collective is in flight (device rules, card.hpp).
// Thread-safety: none; one card thread drives its HeterComm, its store and its communicator.
// Move-only; the card, store and communicator must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "heterps/device/card.hpp"
#include "heterps/device/stream.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox {
namespace comm {
class Communicator;
}
namespace card_table {
class CardSparseStore;
}

namespace heter_comm {

class HeterComm {
 public:
  // `store` holds this card's owned keys (its config gives the row layout and the optimizer);
  // `comm` is this card's rank; comm.size() is total_cards.
  HeterComm(device::Card& card, card_table::CardSparseStore& store, comm::Communicator& comm,
            const HeterCommOptions& options = {});
  ~HeterComm();
  HeterComm(HeterComm&&) noexcept;
  HeterComm& operator=(HeterComm&&) noexcept;
  HeterComm(const HeterComm&) = delete;
  HeterComm& operator=(const HeterComm&) = delete;

  // out_pull[i * pull_dim() ...] = the pull record of keys[i], i < n (keys and out_pull in this
  // card's memory). Duplicates get the same record. Collective; the records are enqueued on
  // `stream` when it returns (read them after a synchronization).
  // A key missing on its owner: see HeterCommOptions::missing_keys (kFail throws on the owner,
  // which must abort the group so the peers wake up, see comm::CommGroup::abort). `slots`
  // (optional, card memory): the slot of each occurrence; with kCreate a missing key's row is
  // created at its slot's width (hyper_parameters.slot_dims; a key in several slots takes the
  // slot it is seen in first, in rank order then batch order, on pull and on push: the rule of
  // every tier, see table::slot_mf_dim; deterministic, so replicas agree), else at slot 0's. Given
  // with kCreate, the slots travel with the keys (one more collective: every card of the step gives
  // slots, or none does; a step where some do and some do not fails on every card with the same
  // error, agreed with the key counts before any key moves); otherwise they are not read.
  void pull(const uint64_t* keys, std::size_t n, float* out_pull, const device::Stream& stream,
            const int32_t* slots = nullptr);

  // pull() for a step that pushes nothing (an evaluation's, an inference's): the same records,
  // bit for bit, and the same late check (a key missing on its owner, the card's counts against
  // the plan). A planned step at the pass's fixed sizes (plan_next_step with n_on_card) then does
  // only what its records need, as one step graph ("sparse lookup"; heter_comm_padded.cu): no
  // owner merge plan (only a push uses it); replicated placement, no collective at all (every card
  // reads its own keys from its own replica), sharded, the keys' and the records' all-to-alls.
  // Any other pull_only is pull(). push_pulled after it is refused. Every card calls it in the
  // same step, as pull (the sharded exchanges; the same order of steps on every card).
  void pull_only(const uint64_t* keys, std::size_t n, float* out_pull,
                 const device::Stream& stream);

  // grads[i * push_dim() ...] = the push record of occurrence i (show, click, embed_g,
  // embedx_g[mf_dim]). Applies one optimizer step per distinct key over all cards. Collective;
  // synchronizes `stream`. With MissingKeyPolicy::kFail, a missing key fails the step on its
  // owner before any of that owner's rows changes. `slots`: as pull's. `veto` and `clip`: as
  // push_pulled's, the same factor of the same rows (a row this push creates counts its embed_g
  // only, as one its pull created in push_pulled's step), so the two forms step alike. A vetoed
  // push still keeps the rows it created for keys the owners lacked (kCreate), as a vetoed
  // push_pulled keeps those its pull created: their values are the initial ones, unstepped. With
  // a clip, sharded, a kFail owner's failure also stops the other cards' step (they wait for the
  // norm's all-reduce, within the communicator's bound).
  void push(const uint64_t* keys, std::size_t n, const float* grads, const device::Stream& stream,
            const int32_t* slots = nullptr, uint32_t* veto = nullptr,
            NormClipState* clip = nullptr);

  // push() for exactly the keys of this card's last pull (same n, same order; grads as in
  // push), reusing that pull's work: no dedup, no key exchange, no hash lookup, no merge plan
  // (the owners kept the rows they found and planned the merge). Every card calls push_pulled
  // in the same step (collective). Requires a pull since the last push, and no store change in
  // between (insert_rows, erase, clear would invalidate the kept row indices). `veto` (card
  // memory, optional): the owners apply the updates only while *veto == kNoVeto, so a verdict
  // computed on the cards (e.g. a non-finite dense gradient) stops them without a host round
  // trip. After a planned pull, returns with its work enqueued on `stream` (no wait); after an
  // unplanned one, ends with a bounded wait for its work (Communicator::synchronize).
  // `clip` (card memory, optional): clipping by global norm (NormClipState): the merged
  // gradients' squares join the norm (one more all-reduce, of one double, when sharded over
  // several cards), the factor is written there and scales every update. Every card of the step
  // gives one, or none does. It needs `veto`: a global norm that is not finite (a NaN or inf
  // sparse gradient) writes kNonFiniteNorm there (unless it already holds a veto) on every card,
  // so the step changes no parameter and the caller's verdict reports it.
  void push_pulled(const float* grads, const device::Stream& stream, uint32_t* veto = nullptr,
                   NormClipState* clip = nullptr);

  // Reads every pending check of the planned pulls (waits for the card only where a check's copy
  // has not completed) and throws the first failure: a key missing on its owner or a card's
  // counts unlike the plan, naming the pass and step of the pull (the communicator's step
  // context when it ran). Call it before anything that must see a checked pass: a save, the end
  // of a pass or of an evaluation. A failure forgets the later checks. stats().merged_updates
  // counts a planned step's updates once its check is read.
  void drain_checks();

  // Sizes every buffer of pull and push_pulled (and the card's scratch arena, to
  // kScratchHeadroom) for steps up to `bounds`, now (between steps: not collective, no wait).
  // With a pair_block that enables padded steps, only the padded steps' buffers: an unpadded
  // step in that pass (not the trainer's) sizes its own before its keys move (device rule 1 still
  // holds), allocating in that step. Ends the last pull's state (push_pulled needs a pull after
  // it).
  void reserve_steps(const StepBounds& bounds);
  // The card's scratch arena kept by reserve_steps (and before an unplanned step's keys move):
  // HeterComm's own sort and scan own their temporaries, but the card's other Thrust calls (the
  // trainer's loss and non-finite checks: reductions, a few KiB on CUDA) take theirs from the
  // arena, which would otherwise grow once mid-pass (an allocation inside a step).
  static constexpr std::size_t kScratchHeadroom = std::size_t{1} << 20;

  // The next pull's (or push's) key counts, known before the step from the pass's data
  // (trainer/engine/step_sizes.hpp): counts.counts[src * row + dst] = distinct keys card `src`
  // sends card `dst` in that step (row = total_cards; replicated: row = 1, each card's distinct
  // keys). A counts.row unlike the placement's is refused here, before the step (throws naming
  // both widths: the plan was made for the other placement). That pull exchanges no counts and
  // waits for nothing (no S1, no S2); its own row is checked against the card's late (see
  // drain_checks: a mismatch fails, naming the card). The counts are borrowed until that pull.
  // Ignored with MissingKeyPolicy::kCreate (its slots agreement travels with the counts).
  // `n_on_card` (card memory, the pull's n, valid until the step's push_pulled ran on the card;
  // required after reserve_steps' StepBounds::pair_block, kFail): the step then runs at
  // the pass's fixed sizes: every kernel over the pass's largest batch (reading its own n on the
  // card), every exchange in fixed blocks (each led by its live count), its host bookkeeping from
  // the plan; so pull and push_pulled are each one step graph launch ("sparse pull", "sparse
  // push"; HeterCommOptions::step_graphs), captured once per set of buffers. Every card of the
  // step gives it, or none does (the blocks' sizes differ from the plain exchange's).
  void plan_next_step(const PlannedCounts& counts, const uint64_t* n_on_card = nullptr);

  // Whether this pass's planned steps run padded (reserve_steps was given a pair_block, kFail,
  // padded steps on): a planned pull given its occurrence count on the card (plan_next_step) and
  // its push_pulled then wait for nothing and enqueue only capturable work, so a caller may
  // capture them with its own work as one step graph (device::ComposedStep: inside one, neither
  // makes a graph of its own; replaying, each runs only its host part).
  bool pads_planned_steps() const;

  // The card bytes of the steps' exchange buffers (HeterCommMemory). A pass reserved for padded
  // steps (StepBounds::pair_block, kFail, HeterCommOptions::padded_steps) sizes only the padded
  // blocks, by placement; the unpadded buffers grow only when an unpadded step runs.
  HeterCommMemory memory() const;

  int32_t pull_dim() const { return layout().pull_dim(); }
  int32_t push_dim() const { return layout().push_dim(); }
  const table::RowLayout& layout() const;

  // hyper_parameters.sparse_optimizer.adam_bias_correction per_table: the steps the table took
  // on this card, one per push or push_pulled (whether or not the card owned a key of it; not a
  // vetoed one), which correct every row's adam update (table/sparse_row/optimizer.hpp:
  // TableAdamStep). Every card of a job counts the same. State of the model: a save keeps it, a
  // load sets it. 0 and no effect per_row. table_steps waits for the card's stream;
  // set_table_steps between steps only, waits too.
  int64_t table_steps() const;
  void set_table_steps(int64_t steps);
  int rank() const;
  int total_cards() const;
  const HeterCommStats& stats() const;
  // Counters for the last pull or push only (same fields).
  const HeterCommStats& last_step() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether padded steps are on: GPUBOX_PADDED_STEPS=0 runs every planned step unpadded
// (HeterCommOptions::padded_steps); read at each call (the card tier reads it when it makes its
// HeterComms).
bool padded_steps_enabled();

}  // namespace heter_comm
}  // namespace gpubox
