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
#include <future>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.hpp"
#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "trainer/config/trainer_config.hpp"

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
  // The async mode's dense step (see the file comment); sync_dense(1) at the end of a pass
  // makes the servers' table equal this thread's parameters again when it is the only writer.
  void exchange_dense();
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

 private:
  // The batch's distinct keys (with their slot ids) and each occurrence's index among them.
  void gather_keys(const dataset::Batch& batch);
  // Rows of the distinct keys (`local_rows`: the geo copy, else the servers') -> pull records per
  // occurrence, copied to the card with the batch.
  void upload(const dataset::Batch& batch, bool local_rows);
  DenseBatchView batch_view(const dataset::Batch& batch) const;
  // Adopts the exchange under way, if any (waits for it; throws its error).
  void finish_exchange();

  device::Card& card_;
  table::server::RemoteHostTier& servers_;
  const TrainerConfig& config_;
  std::unique_ptr<DenseModel> model_;
  std::unique_ptr<DenseOptimizer> optimizer_;
  std::unique_ptr<MetricsAccumulator> metrics_;
  std::unique_ptr<GeoRows> geo_;  // geo mode only
  std::vector<int32_t> slot_ids_;
  std::vector<float> synced_dense_;  // dense parameters at the last sync_dense
  std::size_t last_batch_ = 0;       // examples of the last eval_step
  // exchange_dense()'s add under way on its own thread: `sent` holds the change, then the
  // servers' sum; `snapshot` the parameters it was taken from.
  struct Exchange {
    std::vector<float> snapshot;
    std::vector<float> sent;
    std::future<Status> done;
  };
  std::unique_ptr<Exchange> exchange_;

  // Step buffers, reused (they only grow).
  std::unordered_map<uint64_t, uint32_t> unique_index_;
  std::vector<uint64_t> unique_keys_;
  std::vector<int32_t> unique_slots_;
  std::vector<uint32_t> occurrence_unique_;
  std::vector<uint32_t> geo_locals_;  // geo: each distinct key's row in GeoRows
  std::vector<float> rows_;           // distinct keys x stride
  std::vector<float> records_;        // occurrences x pull_dim
  std::vector<float> merged_;         // distinct keys x push_dim
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace gpubox::trainer::ps_modes
