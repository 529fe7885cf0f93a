#include "trainer/ps_modes/ps_worker.hpp"

#include <algorithm>
#include <cstdio>

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
    : card_(card), servers_(servers), config_(config) {
  card_.activate();
  model_ = std::make_unique<DenseModel>(card, config.dense_model_config());
  optimizer_ =
      std::make_unique<DenseOptimizer>(card, config.hyper.optimizer, model_->parameters().size());
  metrics_ = std::make_unique<MetricsAccumulator>(card, config.runner.auc_buckets_log2);
  buffers_ = std::make_unique<Buffers>(card);
  if (config.runner.sync_mode == SyncMode::kGeo) geo_ = std::make_unique<GeoRows>(servers);
  for (std::size_t s = 0; s < config.dataset.slots.size(); ++s) {
    slot_ids_.push_back(dataset::slot_id(config.dataset.slots, s));
  }
  synced_dense_ = model_->parameters().values_to_host();
}

// An exchange still under way here was started by a dense step after which nothing took it: the
// pass's last sync_dense() (which throws its error) did not run, so the thread is unwinding from
// an earlier error, which is the one reported. A destructor cannot return this one, so it is
// logged (the status names the server) rather than lost; the wait itself is needed, as the
// exchange uses this worker's buffers and servers.
PsWorker::~PsWorker() {
  if (!exchange_ || !exchange_->done.valid()) return;
  Status st;
  try {
    st = exchange_->done.get();
  } catch (const std::exception& e) {
    st = Status::Internal(user_message(e));
  } catch (...) {  // a destructor must not throw
    st = Status::Internal("an exception that is not a std::exception");
  }
  if (!st.ok()) {
    GPUBOX_LOG(ERROR) << "training thread of card " << card_.device()
                      << ": the dense exchange under way when the thread stopped failed, so its "
                         "change of the dense parameters did not reach the servers: "
                      << st.to_string();
  }
}

void PsWorker::gather_keys(const dataset::Batch& batch) {
  unique_index_.clear();
  unique_keys_.clear();
  unique_slots_.clear();
  occurrence_unique_.resize(batch.keys.size());
  const std::size_t b = batch.size();
  for (int s = 0; s < batch.num_slots; ++s) {
    const uint32_t first = batch.offsets[static_cast<std::size_t>(s) * b];
    const uint32_t last = batch.offsets[static_cast<std::size_t>(s + 1) * b];
    for (uint32_t j = first; j < last; ++j) {
      const auto [it, inserted] =
          unique_index_.emplace(batch.keys[j], static_cast<uint32_t>(unique_keys_.size()));
      if (inserted) {
        unique_keys_.push_back(batch.keys[j]);
        unique_slots_.push_back(slot_ids_.at(static_cast<std::size_t>(s)));
      }
      occurrence_unique_[j] = it->second;
    }
  }
}

void PsWorker::upload(const dataset::Batch& batch, bool local_rows) {
  const table::RowLayout& layout = servers_.layout();
  const auto stride = static_cast<std::size_t>(layout.stride());
  const auto pull_dim = static_cast<std::size_t>(layout.pull_dim());
  const std::size_t unique = unique_keys_.size();
  rows_.resize(unique * stride);
  if (local_rows) {
    geo_locals_.resize(unique);
    geo_->read(unique_keys_.data(), unique_slots_.data(), unique, rows_.data(), geo_locals_.data());
  } else if (unique > 0) {
    throw_if_error(
        servers_.pull(unique_keys_.data(), unique_slots_.data(), unique, rows_.data(), nullptr)
            .with_context("pulling the rows of a batch"));
  }
  const std::size_t occurrences = batch.keys.size();
  records_.resize(occurrences * pull_dim);
  for (std::size_t j = 0; j < occurrences; ++j) {
    table::fill_pull_record(rows_.data() + std::size_t{occurrence_unique_[j]} * stride, layout,
                            records_.data() + j * pull_dim);
  }
  const device::Stream& stream = card_.stream();
  Buffers& buf = *buffers_;
  buf.records.resize_discard(records_.size());
  buf.offsets.resize_discard(batch.offsets.size());
  buf.dense.resize_discard(batch.dense.size());
  buf.labels.resize_discard(batch.labels.size());
  buf.push.resize_discard(occurrences * static_cast<std::size_t>(layout.push_dim()));
  device::copy_async(buf.records.data(), records_.data(), records_.size(), stream);
  device::copy_async(buf.offsets.data(), batch.offsets.data(), batch.offsets.size(), stream);
  device::copy_async(buf.dense.data(), batch.dense.data(), batch.dense.size(), stream);
  device::copy_async(buf.labels.data(), batch.labels.data(), batch.labels.size(), stream);
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
  gather_keys(batch);
  upload(batch, geo_ != nullptr);
  GradScales scales;
  scales.dense = 1.0f / static_cast<float>(size);  // the gradient of the batch's mean loss
  const double loss = model_->forward_backward(batch_view(batch), scales, buffers_->push.data());
  // Steady after the thread's first runner.print_interval steps (SteadyLoss, the divergence
  // check's).
  metrics_->add(model_->predictions(), buffers_->labels.data(), size,
                step >= config_.runner.print_interval);
  model_->check_finite(loss, pass, step);  // before any parameter changes

  const auto push_dim = static_cast<std::size_t>(servers_.layout().push_dim());
  const std::vector<float> push = device::to_host(buffers_->push);
  merged_.assign(unique_keys_.size() * push_dim, 0.0f);
  for (std::size_t j = 0; j < occurrence_unique_.size(); ++j) {
    float* into = merged_.data() + std::size_t{occurrence_unique_[j]} * push_dim;
    const float* from = push.data() + j * push_dim;
    for (std::size_t f = 0; f < push_dim; ++f) into[f] += from[f];
  }
  if (geo_) {
    geo_->apply(geo_locals_.data(), geo_locals_.size(), merged_.data());
  } else {
    throw_if_error(servers_
                       .push_updates(table::server::PsUpdateKind::kGradient, unique_keys_.data(),
                                     unique_slots_.data(), unique_keys_.size(), merged_.data())
                       .with_context("pushing the gradients of pass " + std::to_string(pass) +
                                     ", step " + std::to_string(step)));
  }
  optimizer_->step(model_->parameters());
  return loss;
}

double PsWorker::running_auc() {
  metrics_->progress_async();
  card_.stream().synchronize();
  return metrics_->progress_auc();
}

void PsWorker::eval_step(const dataset::Batch& batch) {
  const auto size = static_cast<int64_t>(batch.size());
  if (size == 0) return;
  gather_keys(batch);
  upload(batch, false);
  model_->predict(batch_view(batch));
  metrics_->add(model_->predictions(), buffers_->labels.data(), size);
  last_batch_ = batch.size();
}

std::vector<float> PsWorker::last_predictions() const {
  return device::to_host(model_->predictions(), last_batch_, card_.stream());
}

void PsWorker::sync_dense(float scale) {
  finish_exchange();
  DenseParameters& params = model_->parameters();
  std::vector<float> values = params.values_to_host();
  table::server::DenseAction action = table::server::DenseAction::kRead;
  if (scale != 0.0f) {
    action = table::server::DenseAction::kAdd;
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = (values[i] - synced_dense_[i]) * scale;
    }
  }
  throw_if_error(servers_.dense(action, kDenseTableName, &values)
                     .with_context("syncing the dense parameters with the servers"));
  params.set_values(values);
  synced_dense_ = std::move(values);
}

void PsWorker::finish_exchange() {
  if (!exchange_) return;
  const std::unique_ptr<Exchange> done = std::move(exchange_);
  throw_if_error(done->done.get().with_context("syncing the dense parameters with the servers"));
  // The servers' sum, plus what this thread changed since the snapshot (not sent yet).
  DenseParameters& params = model_->parameters();
  std::vector<float> values = params.values_to_host();
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = done->sent[i] + (values[i] - done->snapshot[i]);
  }
  params.set_values(values);
  synced_dense_ = std::move(done->sent);
}

void PsWorker::exchange_dense() {
  finish_exchange();
  auto next = std::make_unique<Exchange>();
  next->snapshot = model_->parameters().values_to_host();
  next->sent.resize(next->snapshot.size());
  for (std::size_t i = 0; i < next->sent.size(); ++i) {
    next->sent[i] = next->snapshot[i] - synced_dense_[i];
  }
  std::vector<float>* sent = &next->sent;  // stable: the Exchange outlives its future
  next->done = std::async(std::launch::async, [this, sent] {
    return servers_.dense(table::server::DenseAction::kAdd, kDenseTableName, sent);
  });
  exchange_ = std::move(next);
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
