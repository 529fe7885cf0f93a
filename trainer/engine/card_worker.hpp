// CardWorker: the dense half of one card's training or evaluation step, driven by that card's
// host thread: the dense model, the dense optimizer and the metric accumulator. The sparse half
// (the card's store and HeterComm) is borrowed from the card tier's owner (ps::CardTier).
//
// One training step (collective: every card calls it in the same step, an empty batch too):
//   upload batch (one pinned block, one copy) -> CardTier::pull (records of every key
//   occurrence; waits S1, S2) -> forward/backward (loss on the card) -> metrics -> all-reduce
//   of the flat dense gradient and the loss slot -> finite check on the card (the same verdict
//   on every card) -> HeterComm::push_pulled (one optimizer step per key, vetoed on the card by
//   a non-finite verdict; ends with the step's last wait S3) -> verdict on the host: throw
//   naming pass and step, or the dense optimizer step (identical on every card).
// Three host waits per step, no allocation and no pageable copy in steady state (device rules,
// heterps/device/card.hpp); last_step_counts() says what the last step cost.
//
// Thread-safety: one card thread. The card, communicator and card tier must outlive the worker.
#pragma once

#include <cstdint>
#include <memory>

#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox {
namespace comm {
class Communicator;
}
namespace ps {
class CardTier;
}

namespace trainer {

class DenseModel;
struct DenseBatchView;
class DenseOptimizer;
class MetricsAccumulator;

class CardWorker {
 public:
  // `tier` holds this card's sparse side (card.local_index() is its card there).
  CardWorker(device::Card& card, comm::Communicator& comm, ps::CardTier& tier,
             const TrainerConfig& config);
  ~CardWorker();
  CardWorker(const CardWorker&) = delete;
  CardWorker& operator=(const CardWorker&) = delete;

  // One training step on this card's `batch`. `global_batch`: instances of this step over all
  // cards (the dense gradient is the mean over them). Returns the batch's summed log loss.
  // Throws (naming pass and step) on a non-finite loss or gradient on any card, before any
  // sparse or dense parameter changes. `progress`: also compute the running AUC for the
  // progress line (progress_auc(), read with the step's last wait).
  double train_step(const dataset::Batch& batch, int64_t global_batch, int64_t pass, int64_t step,
                    bool progress = false);
  // The running AUC of the last train_step asked for `progress`.
  double progress_auc() const;
  // What the last train_step asked of this card (host waits, allocations, copies, launches,
  // collectives: heterps/device/counters.hpp).
  const device::DeviceCounts& last_step_counts() const { return last_step_; }
  // Pull and predict only; adds to the metrics. Collective (the pull is).
  void eval_step(const dataset::Batch& batch);
  // Predictions of the last step (host copy), one per instance.
  std::vector<float> last_predictions() const;

  // Sums the metric buffers of all cards into every card's (collective).
  void all_reduce_metrics();

  device::Card& card() { return card_; }
  DenseModel& model() { return *model_; }
  DenseOptimizer& optimizer() { return *optimizer_; }
  MetricsAccumulator& metrics() { return *metrics_; }

 private:
  int64_t upload(const dataset::Batch& batch);
  DenseBatchView batch_view(int slots) const;

  device::Card& card_;
  comm::Communicator& comm_;
  ps::CardTier& tier_;
  std::unique_ptr<DenseModel> model_;
  std::unique_ptr<DenseOptimizer> optimizer_;
  std::unique_ptr<MetricsAccumulator> metrics_;
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  device::DeviceCounts last_step_;
  // Steps of a pass before its steady part (runner.print_interval): the metrics' SteadyLoss
  // counts the steps from this one on.
  int64_t warmup_steps_;
};

}  // namespace trainer
}  // namespace gpubox
