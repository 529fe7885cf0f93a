// Predictor: the dense model of a serving model on one card, fed from the host-side sparse
// lookups. predict() does for a batch what the trainer's evaluation step does (pull records of
// every key occurrence -> DenseModel::predict), with the pull served by ServingModel instead of
// the card tier: the same DenseModel code computes the predictions, on either backend.
//
// Thread-safety: one thread at a time (the micro-batcher's worker). The ServingModel must
// outlive the predictor.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "dataset/batch.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "serving/serving_model.hpp"

namespace gpubox::trainer {
class DenseModel;
}

namespace gpubox::serving {

class Predictor {
 public:
  // `card_threads`: host threads of the cpu backend's card (0 = the machine's cores); on CUDA
  // the model runs on GPU 0. `precision`: the dense net's, unset: the one the MANIFEST records;
  // bf16 runs in fp32 where the card has no bf16 GEMMs or the network has no MLP (DenseModel
  // decides and logs it, as in training). Throws gpubox::Error when the export's
  // dense parameters do not fit the model its MANIFEST describes.
  Predictor(const ServingModel& model, int card_threads,
            std::optional<trainer::DensePrecision> precision = std::nullopt);
  ~Predictor();
  Predictor(const Predictor&) = delete;
  Predictor& operator=(const Predictor&) = delete;

  // Predictions of `batch` (its labels are ignored), one per instance, into `out`. Keys the
  // export does not hold read as ServingModel::initial_record. Synchronizes the card.
  void predict(const dataset::Batch& batch, std::vector<float>* out);
  // What the dense net computes in (the precision asked for, or fp32 where it fell back); fixed
  // at construction, so any thread may ask.
  trainer::DensePrecision precision() const;

 private:
  const ServingModel& model_;
  device::CardSet cards_;
  std::unique_ptr<trainer::DenseModel> dense_;
  // Host staging (pinned) and card copies of one batch; they only grow.
  device::pinned_buffer<float> host_records_;
  device::pinned_buffer<float> host_dense_;
  device::pinned_buffer<uint32_t> host_offsets_;
  device::pinned_buffer<float> host_predictions_;
  device::device_buffer<float> records_;
  device::device_buffer<float> dense_values_;
  device::device_buffer<uint32_t> offsets_;
};

}  // namespace gpubox::serving
