// Plain data of HeterComm: options and counters. Host code includes this without device headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpubox::heter_comm {

// The value of push_pulled's veto word that lets the updates through (any other value, e.g. the
// index of a non-finite dense gradient, vetoes them).
inline constexpr uint32_t kNoVeto = UINT32_MAX;
// The veto clipping by global norm writes (NormClipState) when the step's global norm is not
// finite while the dense gradients were: a NaN or inf sparse (embedding) gradient.
inline constexpr uint32_t kNonFiniteNorm = UINT32_MAX - 1;

// Clipping by global norm (Paddle's ClipGradByGlobalNorm; PaddleRec's
// hyper_parameters.optimizer.clip_by_norm), one per card, in card memory. The caller writes the
// inputs before push_pulled or push (inside its step: no host wait), which add the step's sparse
// part and write `factor` before they apply the updates; the caller scales its dense gradients
// by `factor` after it. Every card of a step gets the same factor.
struct NormClipState {
  // In: the dense gradients' sum of squares, the same on every card (after their all-reduce).
  double squares = 0;
  // In: each merged sparse gradient (a key's pushes summed over all cards: its embed_g, and its
  // embedx_g where the row held its embedx part before this push, the part that steps) joins the
  // norm as sparse_scale * g (the trainer: 1 / the step's global batch, so that the norm is that of
  // the mean loss's gradient, as Paddle's; not g / show, which show_scale steps: the factor scales
  // g before the step divides it, docs/user-guide.md says why).
  float sparse_scale = 1;
  float clip_norm = 0;  // in: > 0
  // Out: clip_norm / max(clip_norm, sqrt(squares + sparse part)), 1 exactly at or under the clip;
  // the merged sparse gradients are multiplied by it before their optimizer step. A norm that is
  // not finite vetoes the step instead (the push's veto word := kNonFiniteNorm, unless it
  // already holds a veto), the same on every card: no parameter changes.
  float factor = 1;
};

// What the owner card does with a key it does not hold during a step.
enum class MissingKeyPolicy {
  // Create the row on the fly (table::init_row with slot 0: a row's slot comes from begin_pass,
  // which places every key of a pass before its steps), count it, mark it dirty. For HeterComm
  // on its own (tests, benchmarks); the card tier uses kFail.
  kCreate,
  kFail,  // throw gpubox::Error naming the key, the owner card and the requesting card
};

// Where a key's row lives (ARCHITECTURE §7).
enum class Placement {
  // gpubox mode: one owner card per key, owner_card(key, total_cards); keys and records travel
  // to and from the owners (all_to_all_v).
  kSharded,
  // Collective mode: every card holds every row (a replica of the whole table). A pull reads
  // the card's own replica; the push all-gathers every card's (key, summed grad) records, and
  // every card merges them and applies the same optimizer step to its replica, in the order the
  // owner would, so the replicas stay identical (and equal to kSharded's owners' rows).
  kReplicated,
};

struct HeterCommOptions {
  MissingKeyPolicy missing_keys = MissingKeyPolicy::kCreate;
  Placement placement = Placement::kSharded;
  // A planned step at the pass's fixed sizes (StepBounds::pair_block) runs as step graphs
  // (heterps/device/step_graph.hpp); false: the same padded work, enqueued eagerly
  // (GPUBOX_STEP_GRAPHS=0, device::step_graphs_enabled).
  bool step_graphs = true;
  // false: StepBounds::pair_block is ignored, so a planned step runs unpadded, at its own
  // batch's sizes (GPUBOX_PADDED_STEPS=0, padded_steps_enabled): to compare a padded step with
  // the plain one it must equal bit for bit, or to debug one.
  bool padded_steps = true;
};

// A step's key counts from the pass's plan (HeterComm::plan_next_step): counts[src * row + dst]
// = the distinct keys card `src` sends card `dst`. `row` is what the plan was made for: sharded,
// total_cards (one entry per owner); replicated, 1 (each card's distinct keys, sent to every
// card). HeterComm refuses a row unlike its placement's (the plan and the placement come from the
// same runner.collective flag, read in two places). No counts: an unplanned step.
struct PlannedCounts {
  const uint64_t* counts = nullptr;
  std::size_t row = 0;
};

// Card bytes a HeterComm holds for its steps' exchanges (HeterComm::memory): what reserve_steps
// (or a step past its bounds) sized, by which steps use them. The plans and reductions both kinds
// share (the local dedup, the owner merge, the segment reducer) are not counted here.
struct HeterCommMemory {
  std::size_t padded = 0;    // a padded step's fixed blocks (StepBounds::pair_block)
  std::size_t unpadded = 0;  // an unpadded step's exchange buffers (sized per step's counts)
};

// The largest step a card runs in a pass (HeterComm::reserve_steps sizes every buffer of a step
// for it, so no step of the pass allocates). A step larger in any count still works: its
// buffers grow then, counted as allocations of that step.
struct StepBounds {
  std::size_t occurrences = 0;  // keys of this card's batch, duplicates included
  std::size_t unique = 0;       // distinct keys of this card's batch
  // Keys this card receives in a step: as their owner (sharded), or every card's distinct keys
  // (replicated).
  std::size_t received = 0;
  std::size_t block = 0;  // replicated: the largest distinct count of any card's batch
  // The largest count of distinct keys any card sends any one card in a step of the pass (the
  // same on every card): sharded, to an owner card; replicated, its whole distinct set to every
  // card (the same value as `block`). Given, a planned step whose occurrence count is on the card
  // (HeterComm::plan_next_step) runs at the pass's fixed sizes: `occurrences` positions and
  // blocks of pair_block keys per pair of cards, captured once as step graphs and replayed.
  std::size_t pair_block = 0;
};

// Cumulative counters of one card's HeterComm (what this card did, as sender and as owner).
// Bytes count what this card hands to all_to_all_v (its own block included: on a GPU that block
// is a local copy; `*_remote` excludes it; a padded step's whole fixed blocks, padding included).
struct HeterCommStats {
  uint64_t pull_calls = 0;
  uint64_t push_calls = 0;
  uint64_t keys_in = 0;           // occurrences passed to pull + push
  uint64_t unique_keys_sent = 0;  // after the local dedup, pull + push
  uint64_t owner_lookups = 0;     // keys looked up in this card's table (hash finds)
  uint64_t merged_updates = 0;    // optimizer steps applied on this card (one per key per batch)
  uint64_t created_on_pull = 0;   // rows created on the fly (MissingKeyPolicy::kCreate)
  uint64_t created_on_push = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_sent_remote = 0;
  // One-off card allocations for Thrust temporaries (stop once the scratch arena has grown to
  // the steady per-step demand).
  uint64_t scratch_allocations = 0;
};

}  // namespace gpubox::heter_comm
