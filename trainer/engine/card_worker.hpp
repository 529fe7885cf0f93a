// CardWorker: the dense half of one card's training or evaluation step, driven by that card's
// host thread: the dense model, the dense optimizer and the metric accumulator. The sparse half
// (the card's store and HeterComm) is borrowed from the card tier's owner (tier_owner::CardTier).
//
// One training step (collective: every card calls it in the same step, an empty batch too):
//   upload batch (one pinned block, one copy on the card's copy stream into one of two card
//   buffers, so it overlaps the step before; the compute stream waits for its event) ->
//   CardTier::pull (records of every key
//   occurrence; waits S1, S2 unless the step's counts are planned) -> forward/backward (loss on
//   the card) -> metrics -> all-reduce of the flat dense gradient, the loss slot and the stop
//   vote -> finite check on the card (the same verdict on every card) ->
//   HeterComm::push_pulled (one optimizer step per key, vetoed on the card by a non-finite
//   verdict) -> the status (loss, verdict, stop votes, progress AUC) copied into the step's pinned
//   slot -> the dense optimizer step (vetoed too) -> the slot's event. With
//   hyper_parameters.optimizer.clip_by_norm (GradientClip, trainer/nn/gradient_clip.hpp) the dense
//   squares after the all-reduce, the sparse squares and the factor in push_pulled (a norm that is
//   not finite vetoes the step there: heter_comm::kNonFiniteNorm), the dense gradients scaled
//   before their step: card work inside the same graphs, no wait.
// Step graphs (heterps/device/step_graph.hpp): a planned step of a padded pass (the trainer's
// steps, gpubox and Collective mode, its short last batch and a card's empty one too) is ONE graph
// launch, "train step" (device::ComposedStep): the sparse pull (HeterComm::plan_next_step: the
// pass's fixed sizes, the batch's occurrence count read on the card from the upload block's first
// word), the dense step, the status copy, the sparse push and the dense update, captured once per
// batch shape (and upload buffer, stop vote, progress flag) and replayed. What changes from step
// to step reaches it through card memory: the ring slots the status and the sparse check land in
// (a slot counter on the card, device::LateReadback), adam's step count. A card whose batch is
// empty (past its batches, or an uneven last round) runs the same graph shape over zero rows: the
// same collectives, in the same order, inside one graph on every card. Otherwise (an unpadded
// pass) the dense half of a full batch is two graphs ("dense step", "dense update") beside the
// sparse half's work (GPUBOX_STEP_GRAPHS=0: every step eagerly). An evaluation step is the pull
// and the forward only, likewise ONE graph launch when planned in a padded pass, "eval step": the
// sparse lookup (no push follows: no owner merge plan, and in Collective mode no collective), the
// forward, the metrics, the predictions' copy into the slot's pinned block (when kept; the card
// picks the block, so one graph serves every slot) and the ring's slot counter; unpadded, the
// sparse half's work beside "dense predict" for a full batch.
// The host reads a step's slot kStatusDepth (4) steps later, when the ring needs the slot again
// (by then its copy has completed: no wait unless the host ran that far ahead of the card), or
// at drain(): a non-finite verdict throws naming the pass and step it happened in, the progress
// sink gets the running AUC, and stop_votes() the step's votes. Planned steps (the trainer's)
// wait for the card 0 times; no allocation and no pageable copy in steady state (device rules,
// heterps/device/card.hpp), and none in any step of a pass after reserve_steps for its largest
// batch; last_step_counts() says what the last step cost. drain() before anything that must see
// the pass's steps checked: the end of the pass (metrics, write-back), a save, an evaluation's
// end.
//
// Thread-safety: one card thread. The card, communicator and card tier must outlive the worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox {
namespace comm {
class Communicator;
}
namespace tier_owner {
class CardTier;
}

namespace trainer {

class DenseModel;
struct DenseBatchView;
struct StepRecord;
struct StepTag;
class DenseOptimizer;
class GradientClip;
class MetricsAccumulator;

// The largest step of a pass on one card (CardWorker::reserve_steps): from the pass's data,
// before its first step.
struct StepReservation {
  int64_t instances = 0;        // of the largest batch
  int slots = 0;                // sparse slots of a batch (its offsets: slots * instances + 1)
  int dense_dim = 0;            // dense values per instance
  heter_comm::StepBounds keys;  // occurrences, distinct keys, received keys (and block)
  // The other batch sizes of the pass's steps on this card (a smaller last batch; 0 for the
  // steps past its batches): their GEMM plans are made now too (cuBLASLt heuristics, oneDNN
  // primitives), not inside a step.
  std::vector<int64_t> other_instances;
};

class CardWorker {
 public:
  // `tier` holds this card's sparse side (card.local_index() is its card there).
  CardWorker(device::Card& card, comm::Communicator& comm, tier_owner::CardTier& tier,
             const TrainerConfig& config);
  ~CardWorker();
  CardWorker(const CardWorker&) = delete;
  CardWorker& operator=(const CardWorker&) = delete;

  // Sizes every card and pinned buffer of a step (the batch upload, the pull and push records,
  // the dense model's activations, the metrics' partials and the card tier's exchange) for
  // steps up to `largest`, so that no step up to it allocates, frees or regrows a pinned
  // buffer (a cudaMallocHost/cudaFreeHost inside a step synchronizes the device while the
  // other cards' collectives wait for this one). Between passes, on the card's thread. A batch
  // past it (data with no plan: a QueueDataset stream) still works: its step grows the buffers.
  void reserve_steps(const StepReservation& largest);

  // One training step on this card's `batch`. `global_batch`: instances of this step over all
  // cards (the dense gradient is the mean over them). A non-finite loss or gradient on any card
  // changes no sparse or dense parameter (vetoed on the card), and a later step (at most
  // kStatusDepth later) or drain() throws naming this pass and step. `progress`: also compute
  // the running AUC for the progress line, handed to the progress sink when the step's slot is
  // read. `planned_counts` (optional): the step's key counts from the pass's plan
  // (HeterComm::plan_next_step): then the step waits for nothing. `stop_vote`: this card asks
  // the run to stop (stop_votes() then says, on every card alike, whether any card asked).
  void train_step(const dataset::Batch& batch, int64_t global_batch, int64_t pass, int64_t step,
                  bool progress = false, const heter_comm::PlannedCounts& planned_counts = {},
                  bool stop_vote = false);
  // How many cards of the job voted to stop in the step whose slot was read last (kStatusDepth
  // steps back: the same step, and so the same count, on every card, so all of them stop after
  // the same step). After drain(), the pass's last step's: a vote in its last kStatusDepth steps
  // is seen there (the caller stops after the pass). 0 again when the next pass reserves its
  // steps, or after abandon().
  uint32_t stop_votes() const { return stop_votes_; }
  // Reads every pending step status and sparse check (waits for the card where one has not
  // completed) and throws the first failure, naming its pass and step. After the last step of a
  // pass or an evaluation, before its metrics, write-back or save.
  void drain();
  // Gets (step, running AUC) of each train_step asked for `progress`, when its slot is read.
  void set_progress_sink(std::function<void(int64_t step, double auc)> sink);
  // A pass left by an error between its steps: forgets the pending steps' slots (their
  // verdicts, progress and votes are not read), the progress sink and the votes, so that a
  // later pass or evaluation reads nothing of this one.
  void abandon();
  // What the last train_step asked of this card (host waits, allocations, copies, launches,
  // collectives: heterps/device/counters.hpp).
  const device::DeviceCounts& last_step_counts() const { return last_step_; }
  // Pull and predict only; adds to the metrics. Collective (the pull is; every card calls it in
  // the same step, an empty batch too). No wait (planned counts); drain() after the last one. A
  // planned step of a padded pass is one step graph launch, "eval step" (CardTier::pull_only's
  // lookup: no push follows, so no owner merge plan, and in Collective mode no collective; the
  // forward, predictions and metrics; the slot's copies); otherwise the sparse half's own work and,
  // for a batch of the pass's full size, the "dense predict" graph.
  // `predictions_out` (optional, batch.size() floats): the step's predictions are copied into its
  // pinned slot and written there when the slot is read, kStatusDepth steps later or at drain(),
  // without a wait; it must stay valid until then.
  void eval_step(const dataset::Batch& batch, const heter_comm::PlannedCounts& planned_counts = {},
                 float* predictions_out = nullptr);
  // Predictions of the last step (host copy, synchronizes), one per instance.
  std::vector<float> last_predictions() const;

  // Sums the metric buffers of all cards into every card's (collective).
  void all_reduce_metrics();

  device::Card& card() { return card_; }
  DenseModel& model() { return *model_; }
  DenseOptimizer& optimizer() { return *optimizer_; }
  MetricsAccumulator& metrics() { return *metrics_; }
  // A training pass of `steps` steps begins: its metrics are cleared and its first
  // steady_after(print_interval, steps) steps are left out of their SteadyLoss.
  void begin_pass_steps(std::size_t steps);

 private:
  // The batch into the next upload buffer on the card's copy stream (the compute stream waits
  // for the copy's event); returns its instances.
  int64_t upload(const dataset::Batch& batch);
  // The uploaded batch's pull on the compute stream (inside a whole-step graph: its sparse half;
  // `pull_only`: an evaluation's, CardTier::pull_only).
  void pull(const heter_comm::PlannedCounts& planned_counts, bool pull_only = false);
  // After the step's last use of its upload buffer: the event the copy stream waits for before
  // it overwrites that buffer two steps later.
  void end_upload();
  // Sizes the step buffers for a batch of these counts (a pinned or card allocation only when
  // one outgrows them); sets the layout of the upload block.
  void size_buffers(std::size_t instances, std::size_t occurrences, std::size_t offsets,
                    std::size_t dense, std::size_t labels);
  DenseBatchView batch_view(int slots) const;
  void run_train_step(const dataset::Batch& batch, int64_t global_batch, int64_t pass, int64_t step,
                      bool progress, const heter_comm::PlannedCounts& planned_counts,
                      bool stop_vote);
  // What a training step's card work depends on (a whole-step graph's key but the buffers); an
  // evaluation step's (detail/card_worker_state.hpp).
  struct TrainStep;
  struct EvalStep;
  // Whether a step with these counts runs as one composed graph (a planned step of a padded pass,
  // step graphs on).
  bool composes(const heter_comm::PlannedCounts& planned_counts) const;
  // After the upload: the whole step as one graph launch (device::ComposedStep; a planned step
  // of a padded pass), or its parts (the sparse half's own work and the dense half's two graphs,
  // or everything eagerly).
  void run_whole_step(const TrainStep& s, const heter_comm::PlannedCounts& planned_counts);
  void run_step_parts(const TrainStep& s, const heter_comm::PlannedCounts& planned_counts);
  // The dense half's card work up to the finite check; the status (and progress AUC) into the
  // step's ring slot.
  void enqueue_dense_step(const TrainStep& s);
  // The dense optimizer's step (after the sparse push, which wrote the clip factor: the dense
  // gradients scaled by it first), vetoed on the card by a non-finite verdict.
  void dense_update(const uint32_t* veto);
  // The clip state push_pulled reads and writes; null without hyper_parameters.optimizer
  // .clip_by_norm.
  heter_comm::NormClipState* clip_state();
  void enqueue_status(bool progress);
  // An evaluation step after its upload: one composed graph ("eval step"), or its parts (the
  // sparse half's own work, "dense predict" or the forward eagerly); the forward and metrics; the
  // predictions into the slot's pinned block (card_worker_eval.cpp).
  void run_whole_eval(const EvalStep& e, const heter_comm::PlannedCounts& planned_counts);
  void run_eval_parts(const EvalStep& e, const heter_comm::PlannedCounts& planned_counts);
  void enqueue_predict(const EvalStep& e);
  void copy_predictions(const EvalStep& e);
  // Takes the step's slot of the status ring (reading the step that used it last) and its
  // staging block.
  void begin_slot(const StepTag& tag);
  // A step's record, read late: throws its non-finite verdict, hands its progress AUC on.
  void retire(const StepTag& tag, const StepRecord& record);
  struct RetireStep;  // retire() as the ring's check
  // Runs op; a failure forgets the pending slots.
  template <class Op>
  void guarded(Op&& op);

  device::Card& card_;
  comm::Communicator& comm_;
  tier_owner::CardTier& tier_;
  std::unique_ptr<DenseModel> model_;
  std::unique_ptr<DenseOptimizer> optimizer_;
  std::unique_ptr<MetricsAccumulator> metrics_;
  std::unique_ptr<GradientClip> clip_;  // clipping by global norm; null when off
  struct Buffers;                       // detail/card_worker_state.hpp
  std::unique_ptr<Buffers> buffers_;
  struct Graphs;  // the step graphs (detail/card_worker_state.hpp)
  std::unique_ptr<Graphs> graphs_;
  device::DeviceCounts last_step_;
  uint32_t stop_votes_ = 0;
  std::function<void(int64_t, double)> progress_sink_;
  // runner.print_interval, and the steps of this pass before its steady part (steady_after, set
  // by begin_pass_steps; print_interval before any): the metrics' SteadyLoss counts the steps
  // from that one on.
  int print_interval_;
  int64_t steady_after_;
};

}  // namespace trainer
}  // namespace gpubox
