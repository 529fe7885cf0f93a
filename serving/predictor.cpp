#include "serving/predictor.hpp"

#include <algorithm>
#include <cstring>

#include "common/error.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::serving {
namespace {

// Grows a pinned staging buffer to at least `count` elements (by half again, so a slowly
// growing batch does not reallocate every time).
template <class T>
void grow(device::pinned_buffer<T>* buffer, std::size_t count) {
  if (buffer->size() < count) {
    *buffer = device::pinned_buffer<T>(std::max(count, buffer->size() * 3 / 2));
  }
}

}  // namespace

Predictor::Predictor(const ServingModel& model, int card_threads,
                     std::optional<trainer::DensePrecision> precision)
    : model_(model), cards_(device::CardSet::from_list("0", 0, 1, card_threads)) {
  device::Card& card = cards_.card(0);
  card.activate();
  trainer::DenseModelConfig net = model.spec().model;
  if (precision.has_value()) net.precision = *precision;
  dense_ = std::make_unique<trainer::DenseModel>(card, net);
  trainer::DenseParameters& params = dense_->parameters();
  GPUBOX_EXPECTS(model.dense_values().size() == params.size(), "the serving model holds ",
                 model.dense_values().size(), " dense parameters but the model its MANIFEST ",
                 "describes has ", params.size());
  params.set_values(model.dense_values());
  records_ = card.make_buffer<float>(0);
  dense_values_ = card.make_buffer<float>(0);
  offsets_ = card.make_buffer<uint32_t>(0);
}

Predictor::~Predictor() = default;

trainer::DensePrecision Predictor::precision() const { return dense_->precision(); }

void Predictor::predict(const dataset::Batch& batch, std::vector<float>* out) {
  const ServingSpec& spec = model_.spec();
  GPUBOX_EXPECTS(batch.num_slots == spec.model.slots && batch.dense_dim == spec.model.dense_dim,
                 "batch of ", batch.num_slots, " slots and ", batch.dense_dim,
                 " dense values for a model of ", spec.model.slots, " and ", spec.model.dense_dim);
  const std::size_t n = batch.size();
  out->assign(n, 0.0f);
  if (n == 0) return;
  device::Card& card = cards_.card(0);
  card.activate();
  const device::Stream& stream = card.stream();
  const std::size_t pull_dim = static_cast<std::size_t>(spec.pull_dim());
  const std::size_t occurrences = batch.keys.size();

  // The pull: one record per key occurrence, as HeterComm::pull delivers them to the model.
  grow(&host_records_, std::max<std::size_t>(1, occurrences * pull_dim));
  for (std::size_t j = 0; j < occurrences; ++j) {
    float* record = host_records_.data() + j * pull_dim;
    if (const float* found = model_.find(batch.keys[j]); found != nullptr) {
      std::memcpy(record, found, pull_dim * sizeof(float));
    } else {
      model_.initial_record(batch.keys[j], record);
    }
  }
  grow(&host_offsets_, batch.offsets.size());
  std::memcpy(host_offsets_.data(), batch.offsets.data(), batch.offsets.size() * sizeof(uint32_t));
  grow(&host_dense_, std::max<std::size_t>(1, batch.dense.size()));
  if (!batch.dense.empty()) {
    std::memcpy(host_dense_.data(), batch.dense.data(), batch.dense.size() * sizeof(float));
  }
  grow(&host_predictions_, n);

  records_.resize_discard(occurrences * pull_dim);
  offsets_.resize_discard(batch.offsets.size());
  dense_values_.resize_discard(batch.dense.size());
  if (occurrences > 0) {
    device::copy_async(records_.data(), host_records_.data(), occurrences * pull_dim, stream);
  }
  device::copy_async(offsets_.data(), host_offsets_.data(), batch.offsets.size(), stream);
  if (!batch.dense.empty()) {
    device::copy_async(dense_values_.data(), host_dense_.data(), batch.dense.size(), stream);
  }
  trainer::DenseBatchView view;
  view.sparse.records = records_.data();
  view.sparse.offsets = offsets_.data();
  view.sparse.batch = static_cast<int64_t>(n);
  view.sparse.slots = batch.num_slots;
  view.dense = dense_values_.data();
  view.batch = static_cast<int64_t>(n);
  dense_->reserve(static_cast<int64_t>(n));
  dense_->predict_async(view);
  device::copy_async(host_predictions_.data(), dense_->predictions(), n, stream);
  stream.synchronize();
  std::copy(host_predictions_.data(), host_predictions_.data() + n, out->begin());
}

}  // namespace gpubox::serving
