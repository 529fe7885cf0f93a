#include "trainer/ps_modes/ps_worker.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "heterps/device/memory.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/sparse_row/accessor.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/ps_modes/geo_rows.hpp"

namespace gpubox::trainer::ps_modes {

// The batch on the card, one buffer per array.
struct PsWorker::Buffers {
  explicit Buffers(device::Card& card)
      : records(card.make_buffer<float>(0)),
        offsets(card.make_buffer<uint32_t>(0)),
        dense(card.make_buffer<float>(0)),
        labels(card.make_buffer<float>(0)),
        push(card.make_buffer<float>(0)) {}
  device::device_buffer<float> records;
  device::device_buffer<uint32_t> offsets;
  device::device_buffer<float> dense;
  device::device_buffer<float> labels;
  device::device_buffer<float> push;
};

PsWorker::PsWorker(device::Card& card, table::server::RemoteHostTier& servers,
                   const TrainerConfig& config)
    : card_(card),
      servers_(servers),
      config_(config),
      uploaded_(card.device(), card.stream().counters(), device::EventTiming::kOff,
                device::EventReader::kHost) {
  card_.activate();
  model_ = std::make_unique<DenseModel>(card, config.dense_model_config());
  optimizer_ =
      std::make_unique<DenseOptimizer>(card, config.hyper.optimizer, model_->parameters().size());
  metrics_ = std::make_unique<MetricsAccumulator>(card, config.runner.auc_buckets_log2);
  buffers_ = std::make_unique<Buffers>(card);
  if (config.runner.sync_mode == SyncMode::kGeo) geo_ = std::make_unique<GeoRows>(servers);
  exchanger_ = std::make_unique<DenseExchanger>(servers, kDenseTableName);
  for (std::size_t s = 0; s < config.dataset.slots.size(); ++s) {
    slot_ids_.push_back(dataset::slot_id(config.dataset.slots, s));
  }
  read_dense(&synced_dense_);
}

// An exchange still under way here was started by a dense step after which nothing took it: the
// pass's last sync_dense() (which throws its error) did not run, so the thread is unwinding from
// an earlier error, which is the one reported. A destructor cannot return this one, so it is
// logged (the status names the server) rather than lost; the wait itself is needed, as the
// exchange uses this worker's buffers and servers.
PsWorker::~PsWorker() {
  if (!exchanger_->pending()) return;
  const Status st = exchanger_->wait();
  if (!st.ok()) {
    GPUBOX_LOG(ERROR) << "training thread of card " << card_.device()
                      << ": the dense exchange under way when the thread stopped failed, so its "
                         "change of the dense parameters did not reach the servers: "
                      << st.to_string();
  }
}

void PsWorker::count_card_allocations(const device::DeviceCounts& before) {
  card_allocations_ += (card_.counts() - before).allocations;
}

void PsWorker::reuse_upload_buffers() {
  if (!uploaded_.ready()) uploaded_.synchronize();
}

namespace {
// The batch's array into its pinned buffer (grown through `growth`) and on to the card.
template <class T>
void stage(const std::vector<T>& from, device::pinned_buffer<T>* pinned, T* to,
           BufferGrowth& growth, const device::Stream& stream) {
  growth.fit(pinned, from.size());
  std::copy(from.begin(), from.end(), pinned->data());
  device::copy_async(to, pinned->data(), from.size(), stream);
}
}  // namespace

void PsWorker::upload(const dataset::Batch& batch, bool local_rows) {
  const table::RowLayout& layout = servers_.layout();
  const auto stride = static_cast<std::size_t>(layout.stride());
  const auto pull_dim = static_cast<std::size_t>(layout.pull_dim());
  const std::size_t unique = keys_.size();
  growth_.resize(&rows_, unique * stride);
  if (local_rows) {
    growth_.resize(&geo_locals_, unique);
    geo_->read(keys_.keys().data(), keys_.slots().data(), unique, rows_.data(), geo_locals_.data());
  } else if (unique > 0) {
    const Status pulled =
        servers_.pull(keys_.keys().data(), keys_.slots().data(), unique, rows_.data(), nullptr);
    if (!pulled.ok()) throw_if_error(pulled.with_context("pulling the rows of a batch"));
  }
  const std::size_t occurrences = batch.keys.size();
  const std::size_t record_floats = occurrences * pull_dim;
  reuse_upload_buffers();
  growth_.fit(&records_, record_floats);
  const std::vector<uint32_t>& index = keys_.occurrence_index();
  for (std::size_t j = 0; j < occurrences; ++j) {
    table::fill_pull_record(rows_.data() + std::size_t{index[j]} * stride, layout,
                            records_.data() + j * pull_dim);
  }
  const device::Stream& stream = card_.stream();
  Buffers& buf = *buffers_;
  buf.records.resize_discard(record_floats);
  buf.offsets.resize_discard(batch.offsets.size());
  buf.dense.resize_discard(batch.dense.size());
  buf.labels.resize_discard(batch.labels.size());
  buf.push.resize_discard(occurrences * static_cast<std::size_t>(layout.push_dim()));
  device::copy_async(buf.records.data(), records_.data(), record_floats, stream);
  stage(batch.offsets, &offsets_, buf.offsets.data(), growth_, stream);
  stage(batch.dense, &dense_values_, buf.dense.data(), growth_, stream);
  stage(batch.labels, &labels_, buf.labels.data(), growth_, stream);
  uploaded_.record(stream);
  model_->reserve(static_cast<int64_t>(batch.size()));
  metrics_->reserve(static_cast<int64_t>(batch.size()));
}

DenseBatchView PsWorker::batch_view(const dataset::Batch& batch) const {
  DenseBatchView view;
  view.sparse.records = buffers_->records.data();
  view.sparse.offsets = buffers_->offsets.data();
  view.sparse.batch = static_cast<int64_t>(batch.size());
  view.sparse.slots = batch.num_slots;
  view.dense = buffers_->dense.data();
  view.labels = buffers_->labels.data();
  view.batch = static_cast<int64_t>(batch.size());
  return view;
}

double PsWorker::train_step(const dataset::Batch& batch, int64_t pass, int64_t step) {
  const auto size = static_cast<int64_t>(batch.size());
  if (size == 0) return 0.0;
  const device::DeviceCounts before = card_.counts();
  keys_.gather(batch, slot_ids_, growth_);
  upload(batch, geo_ != nullptr);
  GradScales scales;
  scales.dense = 1.0f / static_cast<float>(size);  // the gradient of the batch's mean loss
  const double loss = model_->forward_backward(batch_view(batch), scales, buffers_->push.data());
  // Steady after the thread's first runner.print_interval steps (SteadyLoss, the divergence
  // check's).
  metrics_->add(model_->predictions(), buffers_->labels.data(), size,
                step >= config_.runner.print_interval);
  model_->check_finite(loss, pass, step);  // before any parameter changes
  merge_push(batch.keys.size());
  if (geo_) {
    geo_->apply(geo_locals_.data(), geo_locals_.size(), merged_.data());
  } else {
    const Status pushed =
        servers_.push_updates(table::server::PsUpdateKind::kGradient, keys_.keys().data(),
                              keys_.slots().data(), keys_.size(), merged_.data());
    if (!pushed.ok()) {
      throw_if_error(pushed.with_context("pushing the gradients of pass " + std::to_string(pass) +
                                         ", step " + std::to_string(step)));
    }
  }
  optimizer_->step(model_->parameters());
  count_card_allocations(before);
  return loss;
}

void PsWorker::merge_push(std::size_t occurrences) {
  const auto push_dim = static_cast<std::size_t>(servers_.layout().push_dim());
  const std::size_t push_floats = occurrences * push_dim;
  growth_.fit(&push_, push_floats);
  device::copy_async(push_.data(), buffers_->push.data(), push_floats, card_.stream());
  card_.stream().synchronize();
  growth_.resize(&merged_, keys_.size() * push_dim);
  std::fill(merged_.begin(), merged_.end(), 0.0f);
  const std::vector<uint32_t>& index = keys_.occurrence_index();
  for (std::size_t j = 0; j < occurrences; ++j) {
    float* into = merged_.data() + std::size_t{index[j]} * push_dim;
    const float* from = push_.data() + j * push_dim;
    for (std::size_t f = 0; f < push_dim; ++f) into[f] += from[f];
  }
}

double PsWorker::running_auc() {
  metrics_->progress_async();
  card_.stream().synchronize();
  return metrics_->progress_auc();
}

void PsWorker::eval_step(const dataset::Batch& batch) {
  const auto size = static_cast<int64_t>(batch.size());
  if (size == 0) return;
  const device::DeviceCounts before = card_.counts();
  keys_.gather(batch, slot_ids_, growth_);
  upload(batch, false);
  model_->predict(batch_view(batch));
  metrics_->add(model_->predictions(), buffers_->labels.data(), size);
  last_batch_ = batch.size();
  count_card_allocations(before);
}

std::vector<float> PsWorker::last_predictions() const {
  return device::to_host(model_->predictions(), last_batch_, card_.stream());
}

void PsWorker::read_dense(std::vector<float>* into) {
  const DenseParameters& params = model_->parameters();
  growth_.resize(into, params.size());
  if (params.size() == 0) return;
  growth_.fit(&read_back_, params.size());
  device::copy_async(read_back_.data(), params.values().data(), params.size(), card_.stream());
  card_.stream().synchronize();
  std::copy(read_back_.data(), read_back_.data() + params.size(), into->data());
}

void PsWorker::sync_dense(float scale) { sync_dense(scale, scale); }

void PsWorker::sync_dense(float scale, float statistic_scale) {
  finish_exchange();
  const device::DeviceCounts before = card_.counts();
  read_dense(&dense_);
  table::server::DenseAction action = table::server::DenseAction::kRead;
  if (scale != 0.0f) {
    action = table::server::DenseAction::kAdd;
    const std::size_t trained = model_->parameters().trained_size();
    for (std::size_t i = 0; i < dense_.size(); ++i) {
      dense_[i] = (dense_[i] - synced_dense_[i]) * (i < trained ? scale : statistic_scale);
    }
  }
  const Status synced = servers_.dense(action, kDenseTableName, &dense_);
  if (!synced.ok()) {
    throw_if_error(synced.with_context("syncing the dense parameters with the servers"));
  }
  adopt_dense(dense_);
  std::swap(synced_dense_, dense_);  // the servers' values; the old buffer is reused
  count_card_allocations(before);
}

void PsWorker::adopt_dense(const std::vector<float>& values) {
  growth_.fit(&read_back_, values.size());
  std::copy(values.begin(), values.end(), read_back_.data());
  model_->parameters().set_values(read_back_.data(), values.size());
}

void PsWorker::finish_exchange() {
  if (!exchanger_->pending()) return;
  const Status added = exchanger_->wait();
  if (!added.ok()) {
    throw_if_error(added.with_context("syncing the dense parameters with the servers"));
  }
  // The servers' sum, plus what this thread changed since the snapshot (not sent yet).
  read_dense(&dense_);
  for (std::size_t i = 0; i < dense_.size(); ++i) {
    dense_[i] = sent_[i] + (dense_[i] - snapshot_[i]);
  }
  adopt_dense(dense_);
  std::swap(synced_dense_, sent_);  // the servers' sum; the old buffer is the next change's
}

void PsWorker::exchange_dense(float statistic_scale) {
  finish_exchange();
  const device::DeviceCounts before = card_.counts();
  read_dense(&snapshot_);
  growth_.resize(&sent_, snapshot_.size());
  for (std::size_t i = 0; i < sent_.size(); ++i) sent_[i] = snapshot_[i] - synced_dense_[i];
  const std::size_t trained = model_->parameters().trained_size();
  for (std::size_t i = trained; i < sent_.size(); ++i) sent_[i] *= statistic_scale;
  exchanger_->start(&sent_);  // sent_ is the exchanger's until finish_exchange()
  count_card_allocations(before);
}

std::size_t PsWorker::sync_rows(float scale) { return geo_ ? geo_->sync(scale) : 0; }

std::string dense_exchange_note(const TrainerConfig& config, std::size_t dense_values) {
  const SyncMode mode = config.runner.sync_mode;
  if (mode != SyncMode::kAsync && mode != SyncMode::kSync) return "";
  const double mb = 1e-6 * static_cast<double>(dense_values * sizeof(float));
  const int every = std::max(1, config.runner.dense_sync_steps);
  const double per_instance =
      2 * mb / every / static_cast<double>(std::max(1, config.dataset.batch_size));
  char line[512];
  std::snprintf(line, sizeof(line),
                "the dense table (%zu values, %.1f MB) goes to the servers and back every %d "
                "step(s) of %d instance(s) a training thread (runner.dense_sync_steps, "
                "train_batch_size): %.3g MB an instance",
                dense_values, mb, every, config.dataset.batch_size, per_instance);
  std::string note = line;
  if (per_instance > 1.048576) {
    note +=
        "; -o runner.dense_sync_steps=K exchanges it every K steps (each thread's own changes "
        "stay in its parameters meanwhile; others' arrive up to two windows late), as Paddle's "
        "async communicator merges the steps it queued (PaddleRec fat_deepffm's config.yaml, 71 "
        "MB at batch 1: 0.22 steps/s at 1, 1.0 at 16, the same pass metrics)";
  }
  return note;
}

}  // namespace gpubox::trainer::ps_modes
