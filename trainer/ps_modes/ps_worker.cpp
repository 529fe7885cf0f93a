#include "trainer/ps_modes/ps_worker.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/error_report.hpp"
#include "common/hash.hpp"
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
                   const TrainerConfig& config, int trainer_id)
    : card_(card),
      servers_(servers),
      config_(config),
      averages_gradients_(averages_gradients(config.runner)),
      uploaded_(card.device(), card.stream().counters(), device::EventTiming::kOff,
                device::EventReader::kHost) {
  steady_after_ = config.runner.print_interval;  // until a pass begins (begin_pass_steps)
  card_.activate();
  DenseModelConfig model = config.dense_model_config();
  // The threads' cards are ranked 0.. on every trainer: the trainer tells their masks apart.
  model.dropout_trainer = trainer_id;
  model_ = std::make_unique<DenseModel>(card, model);
  optimizer_ =
      std::make_unique<DenseOptimizer>(card, config.hyper.optimizer, model_->parameters().size());
  metrics_ = std::make_unique<MetricsAccumulator>(card, config.runner.auc_buckets_log2);
  buffers_ = std::make_unique<Buffers>(card);
  if (config.runner.sync_mode == SyncMode::kGeo) geo_ = std::make_unique<GeoRows>(servers);
  exchanger_ = std::make_unique<DenseExchanger>(servers, kDenseTableName);
  // Two calls: the next batch's pull and this step's push (a third waits for the first).
  if (config.runner.sync_mode == SyncMode::kAsync) row_calls_ = std::make_unique<CallQueue>(2);
  for (std::size_t s = 0; s < config.dataset.slots.size(); ++s) {
    slot_ids_.push_back(dataset::slot_id(config.dataset.slots, s));
  }
  read_dense(&synced_dense_);
}

void PsWorker::forget_rows() {
  if (geo_) geo_ = std::make_unique<GeoRows>(servers_);
}

std::size_t PsWorker::geo_rows() const { return geo_ ? geo_->size() : 0; }

// An exchange still under way here was started by a dense step after which nothing took it: the
// pass's last sync_dense() (which throws its error) did not run, so the thread is unwinding from
// an earlier error, which is the one reported. A destructor cannot return this one, so it is
// logged (the status names the server) rather than lost; the wait itself is needed, as the
// exchange uses this worker's buffers and servers. The rows' pushes still queued are sent the
// same way (the steps that made them were taken), unless the trainer abandoned the thread
// (abandon() cancelled them); a failure of theirs is logged unless a step or finish_rows() threw
// it already, or the thread was abandoned.
PsWorker::~PsWorker() {
  if (row_calls_ != nullptr) {
    const Status st = row_calls_->drain();
    if (!st.ok() && !rows_failure_thrown_ && !abandoned_) {
      GPUBOX_LOG(ERROR) << "training thread of card " << card_.device()
                        << ": a call of the sparse rows under way when the thread stopped "
                           "failed, so its update (and any queued behind it) did not reach the "
                           "servers: "
                        << st.to_string();
    }
  }
  if (!exchanger_->pending()) return;
  const Status st = exchanger_->wait();
  if (!st.ok() && !abandoned_) {
    GPUBOX_LOG(ERROR) << "training thread of card " << card_.device()
                      << ": the dense exchange under way when the thread stopped failed, so its "
                         "change of the dense parameters did not reach the servers: "
                      << st.to_string();
  }
}

void PsWorker::abandon() {
  abandoned_ = true;
  if (row_calls_ != nullptr) row_calls_->cancel();
  exchanger_->cancel();  // a failure of the add under way is expected: not logged
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

namespace {
// "<what> of pass P, step S" (pass < 0: an evaluation's batch): a failed call's context.
std::string step_context(const char* what, int64_t pass, int64_t step) {
  if (pass < 0) return std::string(what) + " of an evaluation batch";
  return std::string(what) + " of pass " + std::to_string(pass) + ", step " + std::to_string(step);
}

// Which batch a row slot's rows were pulled for: its keys and their split into instances and
// slots (which slot a key belongs to is part of what is pulled).
uint64_t batch_digest(const dataset::Batch& batch) {
  uint64_t digest = mix64(batch.keys.size() ^ (uint64_t{batch.offsets.size()} << 32));
  for (const uint64_t key : batch.keys) digest = mix64(digest ^ key);
  for (const uint32_t offset : batch.offsets) digest = mix64(digest + offset);
  return digest;
}
}  // namespace

Status PsWorker::pull_rows(RowSlot& slot) {
  if (slot.keys.size() == 0) return Status::OK();
  const Status pulled = servers_.pull(slot.keys.keys().data(), slot.keys.slots().data(),
                                      slot.keys.size(), slot.rows.data(), nullptr);
  if (pulled.ok()) return pulled;
  return pulled.with_context(step_context("pulling the rows", slot.pass, slot.step));
}

Status PsWorker::push_gradients(const uint64_t* keys, const int32_t* slots, std::size_t n,
                                const float* values, int64_t pass, int64_t step) {
  const Status pushed =
      servers_.push_updates(table::server::PsUpdateKind::kGradient, keys, slots, n, values);
  if (pushed.ok()) return pushed;
  return pushed.with_context(step_context("pushing the gradients", pass, step));
}

void PsWorker::gather(const dataset::Batch& batch, int64_t pass, int64_t step, int index) {
  RowSlot& slot = rows_[index];
  slot.keys.gather(batch, slot_ids_, growth_);
  growth_.resize(&slot.rows,
                 slot.keys.size() * static_cast<std::size_t>(servers_.layout().stride()));
  slot.pass = pass;
  slot.step = step;
  // The other slot takes the same room (no pull fills it now: see the callers), so that a
  // batch like one before grows neither, whichever slot it lands in.
  RowSlot& other = rows_[1 - index];
  other.keys.reserve(slot.keys.capacity(), growth_);
  growth_.reserve(&other.rows, slot.rows.capacity());
}

PsWorker::RowSlot& PsWorker::take_rows(const dataset::Batch& batch, int64_t pass, int64_t step,
                                       bool local_rows) {
  RowSlot& slot = rows_[current_];
  if (slot.pulling) {
    slot.pulling = false;
    throw_rows_failure(row_calls_->wait(slot.ticket));
    GPUBOX_EXPECTS(slot.batch_digest == batch_digest(batch), "pass ", pass, ", step ", step,
                   ": a batch of ", batch.keys.size(),
                   " keys, not the one the step before was given as the next and pulled the "
                   "rows of (",
                   slot.keys.occurrence_index().size(), " keys, other keys or slots)");
    return slot;
  }
  gather(batch, pass, step, current_);
  if (local_rows) {
    const std::size_t unique = slot.keys.size();
    growth_.resize(&geo_locals_, unique);
    geo_->read(slot.keys.keys().data(), slot.keys.slots().data(), unique, slot.rows.data(),
               geo_locals_.data());
  } else if (row_calls_ != nullptr) {
    // Behind this thread's pushes still queued: the rows hold every update of its own.
    const int index = current_;
    throw_rows_failure(
        row_calls_->wait(row_calls_->submit([this, index] { return pull_rows(rows_[index]); })));
  } else {
    throw_if_error(pull_rows(slot));
  }
  return slot;
}

void PsWorker::prefetch(const dataset::Batch& next, int64_t pass, int64_t step) {
  const int other = 1 - current_;
  RowSlot& slot = rows_[other];
  gather(next, pass, step, other);
  slot.batch_digest = batch_digest(next);
  slot.ticket = row_calls_->submit([this, other] { return pull_rows(rows_[other]); });
  slot.pulling = true;
}

void PsWorker::wait_push(PushSlot& push) {
  if (!push.pushing) return;
  push.pushing = false;
  throw_rows_failure(row_calls_->wait(push.ticket));
}

std::vector<float>* PsWorker::merge_target(std::size_t unique) {
  if (row_calls_ == nullptr) return &merged_;
  PushSlot& push = pushes_[next_push_];
  wait_push(push);  // two steps ago: sent long since, as the pull after it was waited for
  const std::size_t values = unique * static_cast<std::size_t>(servers_.layout().push_dim());
  if (unique > push.keys.capacity() || values > push.values.capacity()) {
    // A batch with more keys than any before: both slots grow now (the other's push waited
    // for), so that a batch like one before grows neither.
    for (PushSlot& slot : pushes_) {
      wait_push(slot);
      growth_.reserve(&slot.keys, unique);
      growth_.reserve(&slot.slots, unique);
      growth_.reserve(&slot.values, values);
    }
  }
  return &push.values;
}

void PsWorker::push_rows(const RowSlot& slot, int64_t pass, int64_t step) {
  const std::size_t n = slot.keys.size();
  if (row_calls_ == nullptr) {
    throw_if_error(push_gradients(slot.keys.keys().data(), slot.keys.slots().data(), n,
                                  merged_.data(), pass, step));
    return;
  }
  const int p = next_push_;
  next_push_ = 1 - next_push_;
  PushSlot& push = pushes_[p];  // its values merged in already (merge_target)
  growth_.resize(&push.keys, n);
  growth_.resize(&push.slots, n);
  std::copy(slot.keys.keys().begin(), slot.keys.keys().end(), push.keys.begin());
  std::copy(slot.keys.slots().begin(), slot.keys.slots().end(), push.slots.begin());
  push.pass = pass;
  push.step = step;
  push.ticket = row_calls_->submit([this, p] {
    const PushSlot& from = pushes_[p];
    return push_gradients(from.keys.data(), from.slots.data(), from.keys.size(), from.values.data(),
                          from.pass, from.step);
  });
  push.pushing = true;
}

void PsWorker::finish_rows() {
  if (row_calls_ == nullptr) return;
  for (RowSlot& slot : rows_) slot.pulling = false;
  for (PushSlot& push : pushes_) push.pushing = false;
  throw_rows_failure(row_calls_->drain());
}

void PsWorker::throw_rows_failure(const Status& status) {
  if (status.ok()) return;
  rows_failure_thrown_ = true;
  throw_if_error(status);
}

void PsWorker::upload(const dataset::Batch& batch, const RowSlot& slot) {
  const table::RowLayout& layout = servers_.layout();
  const auto stride = static_cast<std::size_t>(layout.stride());
  const auto pull_dim = static_cast<std::size_t>(layout.pull_dim());
  const std::size_t occurrences = batch.keys.size();
  const std::size_t record_floats = occurrences * pull_dim;
  reuse_upload_buffers();
  growth_.fit(&records_, record_floats);
  const std::vector<uint32_t>& index = slot.keys.occurrence_index();
  for (std::size_t j = 0; j < occurrences; ++j) {
    table::fill_pull_record(slot.rows.data() + std::size_t{index[j]} * stride, layout,
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

void PsWorker::begin_pass_steps(int64_t steps) {
  metrics_->reset();
  steady_after_ = steady_after(config_.runner.print_interval, steps);
}

double PsWorker::train_step(const dataset::Batch& batch, int64_t pass, int64_t step,
                            const dataset::Batch* next) {
  GPUBOX_EXPECTS(!averages_gradients_, "pass ", pass, ", step ", step,
                 ": train_step takes no dense step in the sync mode's averaged step "
                 "(runner.dense_sync_steps 1): compute_step, apply_step, add_gradients and "
                 "step_averaged instead");
  const double loss = compute_step(batch, pass, step, next);
  apply_step();
  return loss;
}

double PsWorker::compute_step(const dataset::Batch& batch, int64_t pass, int64_t step,
                              const dataset::Batch* next) {
  GPUBOX_EXPECTS(!computed_.pending, "pass ", pass, ", step ", step, ": step ", computed_.step,
                 " of pass ", computed_.pass,
                 " was computed and neither applied nor discarded (apply_step, discard_step)");
  const auto size = static_cast<int64_t>(batch.size());
  step_batch_ = batch.size();
  computed_.push_kept = false;
  if (size == 0) return 0.0;
  const device::DeviceCounts before = card_.counts();
  const RowSlot& slot = take_rows(batch, pass, step, geo_ != nullptr);
  const bool prefetching = row_calls_ != nullptr && next != nullptr && next->size() > 0;
  if (prefetching) prefetch(*next, pass, step + 1);
  double loss = 0.0;
  try {
    loss = compute_gradients(batch, slot, pass, step);
  } catch (...) {
    // No step takes the next batch's rows now: the pull is waited for before the error leaves,
    // so that the worker stays usable (a later step or pass gathers into that slot).
    if (prefetching) abandon_prefetch();
    throw;
  }
  computed_ = ComputedStep{true, prefetching, row_calls_ == nullptr, pass, step};
  count_card_allocations(before);
  return loss;
}

double PsWorker::compute_gradients(const dataset::Batch& batch, const RowSlot& slot, int64_t pass,
                                   int64_t step) {
  const auto size = static_cast<int64_t>(batch.size());
  upload(batch, slot);
  GradScales scales;
  // The gradient of the batch's mean loss; averaged over the job, of its summed loss (divided by
  // the job's batch in step_averaged, as the gpubox mode scales by its global batch).
  scales.dense = averages_gradients_ ? 1.0f : 1.0f / static_cast<float>(size);
  const double loss = model_->forward_backward(batch_view(batch), scales, buffers_->push.data());
  // Steady after the thread's first steady_after steps (SteadyLoss, the divergence check's).
  metrics_->add(model_->predictions(), buffers_->labels.data(), size, step >= steady_after_);
  model_->check_finite(loss, pass, step);  // before any parameter changes
  merge_push(slot.keys, merge_target(slot.keys.size()));
  return loss;
}

ComputedPush PsWorker::computed_push() const {
  if (!computed_.push_kept) return {};
  GPUBOX_EXPECTS(row_calls_ == nullptr, "the async mode's pushes are its push slots'");
  const BatchKeys& keys = rows_[current_].keys;
  return ComputedPush{keys.keys().data(), keys.slots().data(), merged_.data(), keys.size()};
}

void PsWorker::apply_step(bool push) {
  if (!computed_.pending) return;
  computed_.pending = false;
  const device::DeviceCounts before = card_.counts();
  if (geo_) {
    geo_->apply(geo_locals_.data(), geo_locals_.size(), merged_.data());
  } else if (push) {
    push_rows(rows_[current_], computed_.pass, computed_.step);
  }
  if (computed_.prefetching) current_ = 1 - current_;
  if (!averages_gradients_) optimizer_->step(model_->parameters());
  count_card_allocations(before);
}

void PsWorker::discard_step() {
  if (!computed_.pending) return;
  computed_.pending = false;
  if (computed_.prefetching) abandon_prefetch();
}

void PsWorker::abandon_prefetch() {
  // A failure stays the queue's (a CallQueue stops at its first): the next step or
  // finish_rows() throws it, or the destructor logs it.
  RowSlot& slot = rows_[1 - current_];
  slot.pulling = false;
  (void)row_calls_->wait(slot.ticket);
}

void PsWorker::merge_push(const BatchKeys& keys, std::vector<float>* merged) {
  const auto push_dim = static_cast<std::size_t>(servers_.layout().push_dim());
  const std::size_t push_floats = keys.occurrence_index().size() * push_dim;
  growth_.fit(&push_, push_floats);
  device::copy_async(push_.data(), buffers_->push.data(), push_floats, card_.stream());
  card_.stream().synchronize();
  growth_.resize(merged, keys.size() * push_dim);
  merge_by_key(keys, push_.data(), static_cast<int32_t>(push_dim), merged->data());
}

double PsWorker::running_auc() {
  metrics_->progress_async();
  card_.stream().synchronize();
  return metrics_->progress_auc();
}

void PsWorker::eval_step(const dataset::Batch& batch) {
  const auto size = static_cast<int64_t>(batch.size());
  if (size == 0) return;
  finish_rows();  // nothing of the rows under way (a training step's) while it reads them
  const device::DeviceCounts before = card_.counts();
  upload(batch, take_rows(batch, -1, -1, false));
  model_->predict(batch_view(batch));
  metrics_->add(model_->predictions(), buffers_->labels.data(), size);
  last_batch_ = batch.size();
  count_card_allocations(before);
}

std::vector<float> PsWorker::last_predictions() const {
  return device::to_host(model_->predictions(), last_batch_, card_.stream());
}

std::size_t PsWorker::read_back_dense() {
  const DenseParameters& params = model_->parameters();
  if (params.size() == 0) return 0;
  growth_.fit(&read_back_, params.size());
  device::copy_async(read_back_.data(), params.values().data(), params.size(), card_.stream());
  card_.stream().synchronize();
  return params.size();
}

void PsWorker::read_dense(std::vector<float>* into) {
  growth_.resize(into, model_->parameters().size());
  const std::size_t n = read_back_dense();
  std::copy(read_back_.data(), read_back_.data() + n, into->data());
}

void PsWorker::sync_dense(float scale) { sync_dense(scale, scale); }

void PsWorker::sync_dense(float scale, float statistic_scale) {
  finish_rows();
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

bool PsWorker::wait_exchange() {
  if (!exchanger_->pending()) return false;
  const Status added = exchanger_->wait();
  if (!added.ok()) {
    throw_if_error(added.with_context("syncing the dense parameters with the servers"));
  }
  return true;
}

void PsWorker::finish_exchange() {
  if (!wait_exchange()) return;
  // The servers' sum, plus what this thread changed since the snapshot (not sent yet).
  read_dense(&dense_);
  for (std::size_t i = 0; i < dense_.size(); ++i) {
    dense_[i] = sent_[i] + (dense_[i] - snapshot_[i]);
  }
  adopt_dense(dense_);
  std::swap(synced_dense_, sent_);  // the servers' sum; the old buffer is the next change's
}

void PsWorker::exchange_dense(float statistic_scale) {
  const device::DeviceCounts before = card_.counts();
  // The statistics' moves (batch norm's running mean and variance, past trained_size()) are
  // sent scaled by statistic_scale: every thread moved them at the full rate.
  const std::size_t trained = model_->parameters().trained_size();
  if (wait_exchange()) {
    // finish_exchange() and the next snapshot and change in one pass over the table (a dense
    // step every step: each pass over a 1.2 MB table cost): the parameters become the servers'
    // sum plus this thread's change since the snapshot, which is the next snapshot; the sum is
    // the synced values, and the next change to send is the parameters minus the sum.
    const std::size_t n = read_back_dense();
    float* params = read_back_.data();
    for (std::size_t i = 0; i < n; ++i) {
      const float sum = sent_[i];
      const float adopted = sum + (params[i] - snapshot_[i]);
      params[i] = adopted;
      snapshot_[i] = adopted;
      synced_dense_[i] = sum;
      sent_[i] = adopted - sum;
    }
    model_->parameters().set_values(read_back_.data(), n);
  } else {
    read_dense(&snapshot_);
    growth_.resize(&sent_, snapshot_.size());
    for (std::size_t i = 0; i < sent_.size(); ++i) sent_[i] = snapshot_[i] - synced_dense_[i];
  }
  for (std::size_t i = trained; i < sent_.size(); ++i) sent_[i] *= statistic_scale;
  exchanger_->start(&sent_);  // sent_ is the exchanger's until the next wait_exchange()
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
    if (mode == SyncMode::kSync) {
      note +=
          "; in the sync mode K > 1 also gives up its one optimizer step on the job's averaged "
          "gradients: each thread steps its own optimizer and the windows' changes are averaged";
    }
  }
  return note;
}

}  // namespace gpubox::trainer::ps_modes
