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
//   dense: sync_dense() pushes the change of the dense parameters since the last sync (times a
//          scale) to the servers' dense table and adopts the merged values. exchange_dense()
//          (async) does the same off the training thread, one window behind: it adopts the
//          exchange it started at the previous dense step (waiting only if that one is not done
//          yet), keeping the local changes made since, and starts the next with the changes of
//          the steps since that one (merged: one add per window, as Paddle's communicator
//          merges the steps it queued). The bound: a step's dense parameters have every one of
//          this thread's own changes, and every other thread's changes that reached the servers
//          before this thread's previous exchange: at most two windows of
//          runner.dense_sync_steps steps old (one with sync_dense()).
//
// Thread-safety: one thread. The card and the servers' client must outlive the worker.
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
#include "trainer/ps_modes/dense_exchanger.hpp"
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
  PsWorker(device::Card& card, table::server::RemoteHostTier& servers, const TrainerConfig& config);
  ~PsWorker();
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;

  // One training step on `batch` (see the file comment); an empty batch does nothing. Returns
  // the batch's summed log loss. Throws on a non-finite loss or gradient, or a failed server call.
  double train_step(const dataset::Batch& batch, int64_t pass, int64_t step);
  // Predicts `batch` with the servers' rows (in geo mode too: the merged model) and adds to the
  // metrics; nothing changes (rows missing on the servers are created there, as a gpubox
  // evaluation's begin_pass does).
  void eval_step(const dataset::Batch& batch);
  // The predictions of the last eval_step's batch (host copy).
  std::vector<float> last_predictions() const;

  // Adds (dense parameters - their value at the last sync) * scale to the servers' dense table
  // and takes the sum as the new dense parameters. scale 0: only reads the table.
  // Waits for an exchange_dense() still under way first.
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
  // Geo: pushes the deltas of the rows changed since the last sync, their weights scaled by
  // `scale` (GeoRows::sync), adopts the merged rows. Returns how many rows it synced; 0 in the
  // other modes.
  std::size_t sync_rows(float scale);

  device::Card& card() { return card_; }
  DenseModel& model() { return *model_; }
  DenseOptimizer& optimizer() { return *optimizer_; }
  MetricsAccumulator& metrics() { return *metrics_; }
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
  // Rows of the batch's distinct keys (`local_rows`: the geo copy, else the servers') -> pull
  // records per occurrence, copied to the card with the batch.
  void upload(const dataset::Batch& batch, bool local_rows);
  DenseBatchView batch_view(const dataset::Batch& batch) const;
  // The gradients of the step's occurrences (read back from the card) summed per distinct key
  // into merged_.
  void merge_push(std::size_t occurrences);
  // *into = the dense parameters (host copy, into a reused buffer, through read_back_).
  void read_dense(std::vector<float>* into);
  // The dense parameters = `values` (through read_back_, as read_dense).
  void adopt_dense(const std::vector<float>& values);
  // Waits for the last upload's copies if they are still under way (an eval step's), so that
  // the pinned batch buffers can be overwritten or regrown.
  void reuse_upload_buffers();
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
  BatchKeys keys_;
  std::vector<float> synced_dense_;
  std::vector<float> dense_;
  std::vector<float> snapshot_;
  std::vector<float> sent_;
  std::unique_ptr<DenseExchanger> exchanger_;  // the async mode's exchange_dense()
  std::vector<uint32_t> geo_locals_;           // geo: each distinct key's row in GeoRows
  std::vector<float> rows_;                    // distinct keys x stride
  std::vector<float> merged_;                  // distinct keys x push_dim
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
};

}  // namespace gpubox::trainer::ps_modes
