// PsWorker: one training thread of the parameter-server modes (runner.sync_mode async | sync |
// geo, ARCHITECTURE §7), on its own card (the cpu backend: an execution context; trainer threads
// are runner.thread_num of them). The parts are the gpubox mode's: the dataset's batches, the
// dense net (DenseModel, DenseOptimizer), the metrics, the accessor's rule and the servers'
// client; only the schedule differs:
//
//   step:  the batch's distinct keys -> their rows (async/sync: pulled from the servers; geo:
//          the thread's local copy, GeoRows) -> pull records per occurrence -> forward/backward
//          -> finite check (throws naming pass and step before anything changes) -> push
//          records merged per key -> (async/sync) pushed to the servers, which apply the rule on
//          arrival, without waiting for anyone; (geo) applied to the local copy -> the dense
//          optimizer step on the thread's own dense parameters.
//   rows:  (async) the servers' calls of a step leave the training thread (CallQueue, one per
//          thread, run in order): train_step(batch, ..., next) starts pulling the rows of `next`
//          once this step's own rows are in, and hands this step's push over without waiting,
//          so the pull of batch k+1 and the push of batch k travel while step k and step k+1
//          compute. The order of the queue is the bound: pull(k+1) is sent after push(k-1)
//          was applied and before push(k), so a step's rows lack at most this thread's own
//          previous step's update of the keys they share (and, as before, whatever other
//          threads had not pushed yet), as Paddle's async Communicator sends a step's sparse
//          gradients from its queue while the next step's lookups already run (a step given
//          no batch before it pulls its own rows behind the queue: they miss nothing of its
//          own). finish_rows() (sync_dense() calls it) waits for the queue: every pass ends
//          with every push applied. A failed call (a dead server: the transport's error names
//          it) fails the step that waits for it next, naming the pass and step of the call that
//          failed; the calls queued behind it are not sent. The failure is permanent (a
//          CallQueue stops at its first): every later step and finish_rows() throw it again, so
//          a worker whose call failed is unusable (only its destructor is left to call).
//   dense: sync_dense() pushes the change of the dense parameters since the last sync (times a
//          scale) to the servers' dense table and adopts the merged values. exchange_dense()
//          (async) does the same off the training thread, one window behind: it adopts the
//          exchange it started at the previous dense step (waiting only if that one is not done
//          yet), keeping the local changes made since, and starts the next with the changes of
//          the steps since that one (merged: one add per window, as Paddle's communicator
//          merges the steps it queued). The bound: a step's dense parameters have every one of
//          this thread's own changes, and every other thread's changes that reached the servers
//          before this thread's previous exchange: at most two windows of
//          runner.dense_sync_steps steps old (one with sync_dense()). The sync mode's step
//          (runner.dense_sync_steps 1) exchanges gradients instead: add_gradients() and
//          step_averaged() around the job's barrier, one optimizer step on the job's mean
//          gradient on every thread (ps_worker_averaged.cpp); its sparse push is the job's,
//          merged over the trainer's threads (MergedPushes; apply_step(false)) and over the
//          trainers by the servers (table/server/ps_step_sums.hpp).
//
// Thread-safety: one thread, except that other threads may read computed_push()'s arrays while
// they are valid (see computed_push); the caller orders them (the sync mode: every thread of a
// trainer reads its share of the others' pushes between the step's pull barrier and its step
// barrier, before any thread computes the next step). The card and the servers' client must
// outlive the worker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/ps_modes/batch_keys.hpp"
#include "trainer/ps_modes/call_queue.hpp"
#include "trainer/ps_modes/dense_exchanger.hpp"
#include "trainer/ps_modes/ps_push_types.hpp"
#include "trainer/ps_modes/step_buffers.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer {
class DenseModel;
class DenseOptimizer;
class MetricsAccumulator;
struct DenseBatchView;
}  // namespace gpubox::trainer

namespace gpubox::trainer::ps_modes {

class GeoRows;

// The servers' dense table every worker of a job shares.
inline constexpr const char* kDenseTableName = "dense";

// The servers' tables of the sync mode's dense step (averages_gradients): a step's gradient sums
// and batch size go to one, the next step's to the other (each overwritten, not cleared, by its
// step's first writer: PsWorker::add_gradients).
inline constexpr const char* kGradientTableNames[2] = {"ps_dense_grads_0", "ps_dense_grads_1"};

// Whether the job's dense step is one optimizer step on the gradients of every thread of the job
// (the sync mode with runner.dense_sync_steps 1: PsWorker::add_gradients, step_averaged), as the
// gpubox mode's cards all-reduce theirs; else each thread steps its own copy and the changes are
// averaged (the sync mode's longer windows), or added (async).
bool averages_gradients(const RunnerConfig& runner);

// What the async and sync modes' dense exchange costs, for the start's INFO line: the dense
// table of `dense_values` floats goes to the servers and back every runner.dense_sync_steps steps
// of train_batch_size instances a thread; over 1 MiB an instance (PaddleRec fat_deepffm's 71 MB
// table at batch 1: 143 MB) it adds the interval that amortises it. Empty in the geo mode (its
// own geo_step) and the gpubox mode.
std::string dense_exchange_note(const TrainerConfig& config, std::size_t dense_values);

class PsWorker {
 public:
  // Starts from the dense net's initial values; sync_dense(0) then adopts the servers' dense
  // table (PsTrainer writes it at a job's start).
  // `trainer_id`: this trainer's (PADDLE_TRAINER_ID), which its dropout masks mix in.
  PsWorker(device::Card& card, table::server::RemoteHostTier& servers, const TrainerConfig& config,
           int trainer_id = 0);
  ~PsWorker();
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;
  // The trainer drops this thread because a server restarted and the servers are reloaded
  // (PsTrainer::recover): the pulls, pushes and dense add still queued (async) are not sent,
  // and the call and dense add under way are waited for (they use this worker's buffers), so that
  // nothing of this worker reaches the servers once abandon() returns; their failures,
  // expected, are not logged (nor by the destructor). Only the destructor is left to call.
  void abandon();
  // Geo: drops the local copies of the rows (GeoRows) and their optimizer state, so that the
  // next pass pulls every row it touches from the servers again (after a shrink, which may
  // have deleted or decayed them there). Only between passes: a pass's end synced every row.
  void forget_rows();
  // Geo: the rows held locally (0 in the other modes).
  std::size_t geo_rows() const;

  // One training step on `batch` (see the file comment); an empty batch does nothing. Returns
  // the batch's summed log loss. Throws on a non-finite loss or gradient, or a failed server call
  // (async: also one of an earlier step's push, or of this batch's pull started by the step
  // before). `next` (async; ignored in the other modes): the batch this thread trains next, in
  // the call after this one, whose rows are then pulled while this step computes; nullptr: none
  // known (the next step pulls its own). A step that throws waits for that pull first: unless a
  // server call failed, the worker trains on (a later pass, or another batch).
  double train_step(const dataset::Batch& batch, int64_t pass, int64_t step,
                    const dataset::Batch* next = nullptr);
  // train_step in two halves, for the sync mode, whose threads of every trainer all pull a
  // step's rows before any of them pushes (else a thread's pull can find another's update of the
  // same step: ps_trainer_pass.cpp). compute_step: the rows, forward/backward, the finite check
  // and the merged gradients (throws as train_step); apply_step: the push (geo: the local copy's
  // update) and the dense optimizer step of the last compute_step (nothing after an empty batch
  // or a second time; averages_gradients: no dense step, which add_gradients and step_averaged
  // take after it); discard_step: drops it (the caller failed between the two: neither its push
  // nor its dense step is made; its metrics stay added). Between compute_step and one of the
  // others, nothing else of this worker may be called; compute_step throws while a step is pending.
  double compute_step(const dataset::Batch& batch, int64_t pass, int64_t step,
                      const dataset::Batch* next = nullptr);
  // `push` false: the step's gradients went to the servers merged with the trainer's other
  // threads' (the sync mode: MergedPushes), so apply_step does not push them.
  void apply_step(bool push = true);
  // The last compute_step's distinct keys, their slots and merged gradients (push_dim floats a
  // key); n = 0 after an empty batch, and always in the async mode (its push slots hold them).
  // Valid from the return of compute_step until this thread's next compute_step: its
  // apply_step and discard_step leave them, so other threads may read them (read-only)
  // meanwhile (MergedPushes: one thread may have applied its step while another still reads
  // its push).
  ComputedPush computed_push() const;
  void discard_step();
  // Waits for this thread's pulls and pushes still under way (async; see the file comment), a
  // pull started for a batch that will not be trained included. Throws the first failure.
  void finish_rows();
  // Predicts `batch` with the servers' rows (in geo mode too: the merged model) and adds to the
  // metrics; nothing changes (rows missing on the servers are created there, as a gpubox
  // evaluation's begin_pass does).
  void eval_step(const dataset::Batch& batch);
  // The predictions of the last eval_step's batch (host copy).
  std::vector<float> last_predictions() const;

  // Adds (dense parameters - their value at the last sync) * scale to the servers' dense table
  // and takes the sum as the new dense parameters. scale 0: only reads the table.
  // Waits for the rows' calls (finish_rows()) and an exchange_dense() still under way first.
  void sync_dense(float scale);
  // As sync_dense(scale), but the running statistics' change (DenseParameters'
  // [trained_size(), size())) times `statistic_scale`: the async mode adds each thread's
  // weight change whole but the statistics' as 1 / (trainers x threads) of it, since every
  // thread moves its own copy of the moving averages toward its batches (summed whole, T
  // threads would move the servers' T times as far and overshoot).
  void sync_dense(float scale, float statistic_scale);
  // The async mode's dense step (see the file comment), the statistics' change times
  // `statistic_scale` (as sync_dense's); sync_dense(1) at the end of a pass makes the servers'
  // table equal this thread's parameters again when it is the only writer.
  void exchange_dense(float statistic_scale = 1.0f);
  // The sync mode's dense step (averages_gradients; apply_step then leaves the dense parameters
  // alone), in two halves around the barrier after every thread of the job added its part:
  // add_gradients() puts this step's dense gradient sums and batch size into the servers'
  // gradient table of the step (kGradientTableNames, in turn) as `share` says: one thread of the
  // job (kOverwrite) writes them over what the table held two steps ago (zeros after an empty
  // batch), every other thread (kAdd) adds them (nothing after an empty batch); a job of one
  // thread (kLocal) leaves the servers alone. The caller orders them: the overwrite right after
  // compute_step and before the step's pull barrier, the adds after it; every read of the table
  // two steps ago (step_averaged of step g - 2) comes before each reader's next pull barrier
  // (g - 1), which the overwriting thread passed before computing step g (ps_trainer_pass.cpp).
  // step_averaged() reads the job's sums (kLocal: its own, from the card) and steps the
  // optimizer on their mean, the gradient of the job's mean loss over every thread's batch:
  // every thread the same step with the same moments, so their dense parameters stay the same
  // (the batch-norm statistics' changes, in the gradients' place, averaged weighted by batch).
  enum class GradientShare { kOverwrite, kAdd, kLocal };
  void add_gradients(GradientShare share);
  void step_averaged(GradientShare share);
  // The servers' dense table = this thread's dense parameters (a write: the sync mode's
  // averages_gradients pass end, from one thread of the job).
  void publish_dense();
  // Geo: pushes the deltas of the rows changed since the last sync, their weights scaled by
  // `scale` (GeoRows::sync), adopts the merged rows. Returns how many rows it synced; 0 in the
  // other modes.
  std::size_t sync_rows(float scale);

  device::Card& card() { return card_; }
  DenseModel& model() { return *model_; }
  DenseOptimizer& optimizer() { return *optimizer_; }
  MetricsAccumulator& metrics() { return *metrics_; }
  // A training pass of `steps` steps of this thread begins (-1: not known, a stream read until it
  // ends): its metrics are cleared and its first steady_after(print_interval, steps) steps are
  // left out of their SteadyLoss.
  void begin_pass_steps(int64_t steps);
  // The AUC of what metrics() holds so far (the progress line's; waits for the card).
  double running_auc();

  // Allocations made so far by this thread's steps and dense syncs (train_step, eval_step,
  // sync_dense, exchange_dense): growths of its reused host buffers (step_buffers.hpp: the
  // batch's keys and rows, the pull records, the gradients read back, the dense table's
  // copies) and card allocations on its card. A step like one before it allocates nothing: the
  // dense table's copies are sized once (regrown only if the table grew), whatever the batch.
  // Not counted: what the servers' client allocates inside a call (RemoteHostTier).
  uint64_t step_allocations() const { return growth_.growths() + card_allocations_; }

 private:
  // A batch's distinct keys and their rows: the servers' (pulled on the training thread, or by
  // row_calls_ while the step before computed) or the geo copy's.
  //
  // Ownership: while `pulling`, keys, rows, pass and step are the queue's (its pull reads and
  // fills them), from submit until wait(ticket) returns; the training thread touches only
  // pulling, ticket and batch_digest then. Otherwise all of it is the training thread's.
  struct RowSlot {
    BatchKeys keys;
    std::vector<float> rows;  // distinct keys x stride
    bool pulling = false;     // a pull of row_calls_ fills it (ticket)
    uint64_t ticket = 0;
    uint64_t batch_digest = 0;  // of the batch prefetch() pulled the rows of
    int64_t pass = 0;
    int64_t step = 0;
  };
  // A step's push handed to row_calls_: its keys, slots and merged gradients (distinct keys x
  // push_dim), the call's until it ran. Both slots grow together (merge_target).
  //
  // Ownership: while `pushing`, keys, slots, values, pass and step are the queue's, from submit
  // until wait(ticket) returns (wait_push); pushing and ticket stay the training thread's.
  struct PushSlot {
    std::vector<uint64_t> keys;
    std::vector<int32_t> slots;
    std::vector<float> values;
    bool pushing = false;
    uint64_t ticket = 0;
    int64_t pass = 0;
    int64_t step = 0;
  };
  // `batch`'s distinct keys into rows_[index], its rows sized for them, for step `step` of
  // `pass`; the other slot is given as much room.
  void gather(const dataset::Batch& batch, int64_t pass, int64_t step, int index);
  // Pulls the rows of slot's keys from the servers (on the training thread or row_calls_'); a
  // failure names the slot's pass and step.
  Status pull_rows(RowSlot& slot);
  // Pushes one merged gradient per key; a failure names `pass` and `step`.
  Status push_gradients(const uint64_t* keys, const int32_t* slots, std::size_t n,
                        const float* values, int64_t pass, int64_t step);
  // rows_[current_] with `batch`'s rows: the pull the step before started for it (waited for),
  // else pulled now (`local_rows`: read from the geo copy).
  RowSlot& take_rows(const dataset::Batch& batch, int64_t pass, int64_t step, bool local_rows);
  // Starts the pull of `next`'s rows into the other slot (async).
  void prefetch(const dataset::Batch& next, int64_t pass, int64_t step);
  // For a step that will not take the rows prefetch() is pulling into the other slot (it was
  // discarded, or compute_step threw): waits for the pull, so that no later gather writes into
  // the slot under it.
  void abandon_prefetch();
  // Waits for the push `push` holds, if any.
  void wait_push(PushSlot& push);
  // Where this step's merged gradients of `unique` keys go: merged_, or (async) the values of
  // the push slot push_rows() hands over next, its last push waited for and its room made.
  std::vector<float>* merge_target(std::size_t unique);
  // Hands the merged gradients of `slot`'s keys to row_calls_, or pushes them now (sync).
  void push_rows(const RowSlot& slot, int64_t pass, int64_t step);
  // Throws `status` of a row_calls_ wait unless OK (and notes that it did, for the destructor).
  void throw_rows_failure(const Status& status);
  // The rows of `slot` -> pull records per occurrence, copied to the card with the batch.
  void upload(const dataset::Batch& batch, const RowSlot& slot);
  DenseBatchView batch_view(const dataset::Batch& batch) const;
  // compute_step's work once the rows are in `slot`: the upload, forward/backward, metrics, the
  // finite check and the merged gradients. Returns the batch's summed log loss.
  double compute_gradients(const dataset::Batch& batch, const RowSlot& slot, int64_t pass,
                           int64_t step);
  // The gradients of the step's occurrences (keys.occurrence_index().size() of them, read back
  // from the card) summed per distinct key of `keys` into *merged (merge_target()), in the order
  // of a card's merge (merge_by_key).
  void merge_push(const BatchKeys& keys, std::vector<float>* merged);
  // gradient_sums_ = the first n dense gradients (through read_back_; waits for the card) and,
  // after them, the batch of the last compute_step.
  void read_back_grads_into_sums(std::size_t n);
  // read_back_ = the dense parameters (waits for the card); returns their count.
  std::size_t read_back_dense();
  // *into = the dense parameters (host copy, into a reused buffer, through read_back_).
  void read_dense(std::vector<float>* into);
  // The dense parameters = `values` (through read_back_, as read_dense).
  void adopt_dense(const std::vector<float>& values);
  // Waits for the last upload's copies if they are still under way (an eval step's), so that
  // the pinned batch buffers can be overwritten or regrown.
  void reuse_upload_buffers();
  // Waits for the exchange under way, if any (false: none); throws its error.
  bool wait_exchange();
  // Adopts the exchange under way, if any (waits for it; throws its error).
  void finish_exchange();
  // Adds the card allocations since `before` to card_allocations_.
  void count_card_allocations(const device::DeviceCounts& before);

  device::Card& card_;
  table::server::RemoteHostTier& servers_;
  const TrainerConfig& config_;
  std::unique_ptr<DenseModel> model_;
  std::unique_ptr<DenseOptimizer> optimizer_;
  std::unique_ptr<MetricsAccumulator> metrics_;
  std::unique_ptr<GeoRows> geo_;  // geo mode only
  std::vector<int32_t> slot_ids_;
  std::size_t last_batch_ = 0;  // examples of the last eval_step

  // Reused buffers (they only grow; growth_ counts it). The dense table's: the parameters at
  // the last sync, the parameters read back, and exchange_dense()'s snapshot and change (the
  // change becomes the servers' sum on the exchanger's thread).
  BufferGrowth growth_;
  uint64_t card_allocations_ = 0;
  std::vector<float> synced_dense_;
  std::vector<float> dense_;
  std::vector<float> snapshot_;
  std::vector<float> sent_;
  // The sync mode's averaged step (add_gradients): the gradient sums and the batch size, the
  // steps exchanged so far (whose parity picks the table) and the batch of the last
  // compute_step.
  const bool averages_gradients_;
  std::vector<float> gradient_sums_;
  uint64_t gradient_steps_ = 0;
  std::size_t step_batch_ = 0;
  std::unique_ptr<DenseExchanger> exchanger_;  // the async mode's exchange_dense()
  std::vector<uint32_t> geo_locals_;           // geo: each distinct key's row in GeoRows
  std::vector<float> merged_;                  // distinct keys x push_dim
  RowSlot rows_[2];                            // this step's, and (async) the next one's
  int current_ = 0;
  PushSlot pushes_[2];  // async: taken in turn
  int next_push_ = 0;
  int64_t steady_after_ = 0;  // the steps of a pass SteadyLoss leaves out (begin_pass_steps)
  bool rows_failure_thrown_ = false;  // a row_calls_ failure reached the caller
  bool abandoned_ = false;            // abandon(): the destructor logs no failure
  // What compute_step left for apply_step.
  struct ComputedStep {
    bool pending = false;
    bool prefetching = false;  // the next step's rows are coming into the other slot
    bool push_kept = false;    // computed_push() holds its push (until the next compute_step)
    int64_t pass = 0;
    int64_t step = 0;
  };
  ComputedStep computed_;
  // The batch as it goes to the card, in pinned memory so that its copies are asynchronous
  // (a pageable copy blocks the thread and is staged by the driver): the pull records
  // (occurrences x pull_dim) and the batch's offsets, dense values and labels. `uploaded_`
  // follows the last upload's copies: the next upload overwrites these once it has passed
  // (a training step has waited for the card by then; an eval step may not have).
  device::pinned_buffer<float> records_;
  device::pinned_buffer<uint32_t> offsets_;
  device::pinned_buffer<float> dense_values_;
  device::pinned_buffer<float> labels_;
  device::Event uploaded_;
  device::pinned_buffer<float> push_;       // occurrences x push_dim, read back
  device::pinned_buffer<float> read_back_;  // the dense parameters, read back or set
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  // async: the rows' pulls and pushes, in order, off the training thread. Last: its destructor
  // runs what is queued, which uses the buffers above.
  std::unique_ptr<CallQueue> row_calls_;
};

}  // namespace gpubox::trainer::ps_modes
