#include "trainer/engine/card_worker.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/composed_step.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/profile_range.hpp"
#include "trainer/engine/detail/card_worker_state.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/nn/gradient_clip.hpp"

namespace gpubox::trainer {
namespace {

constexpr std::size_t kSectionAlign = 256;
std::size_t align_up(std::size_t bytes) {
  return (bytes + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

}  // namespace

using detail::kStatusDepth;
using detail::memory_generation;
using detail::run_captured;

CardWorker::CardWorker(device::Card& card, comm::Communicator& comm, tier_owner::CardTier& tier,
                       const TrainerConfig& config)
    : card_(card),
      comm_(comm),
      tier_(tier),
      print_interval_(config.runner.print_interval),
      steady_after_(config.runner.print_interval) {
  model_ = std::make_unique<DenseModel>(card, config.dense_model_config());
  optimizer_ =
      std::make_unique<DenseOptimizer>(card, config.hyper.optimizer, model_->parameters().size());
  metrics_ = std::make_unique<MetricsAccumulator>(card, config.runner.auc_buckets_log2);
  if (config.hyper.clip_by_norm > 0.0) {
    clip_ = std::make_unique<GradientClip>(card, static_cast<float>(config.hyper.clip_by_norm),
                                           model_->parameters().trained_size());
  }
  buffers_ = std::make_unique<Buffers>(card, comm);
  graphs_ = std::make_unique<Graphs>();
}

CardWorker::~CardWorker() = default;

void CardWorker::size_buffers(std::size_t instances, std::size_t occurrences, std::size_t offsets,
                              std::size_t dense, std::size_t labels) {
  Buffers& b = *buffers_;
  Buffers::Layout& at = b.layout;
  at.count = 0;
  at.offsets = align_up(sizeof(uint64_t));
  at.dense = at.offsets + align_up(offsets * sizeof(uint32_t));
  at.labels = at.dense + align_up(dense * sizeof(float));
  at.keys = at.labels + align_up(labels * sizeof(float));
  at.total = at.keys + align_up(occurrences * sizeof(uint64_t));
  // Grown only when a batch outgrows what reserve_steps sized (a pinned allocation synchronizes
  // the device). The running step's block: its slot's last copy out of it is done (the ring
  // retired the slot).
  device::pinned_buffer<char>& staging = b.staging[b.slot.index];
  if (staging.size() < at.total) {
    staging = device::pinned_buffer<char>(std::max(at.total, staging.size() * 3 / 2));
  }
  device::pinned_buffer<float>& predictions = b.predictions[b.slot.index];
  if (predictions.size() < instances) {
    predictions = device::pinned_buffer<float>(std::max(instances, predictions.size() * 3 / 2));
    ++b.predictions_grown;
  }
  b.uploaded[b.at].resize_discard(at.total);
  b.pull.resize_discard(occurrences * static_cast<std::size_t>(tier_.pull_dim()));
  b.push.resize_discard(occurrences * static_cast<std::size_t>(tier_.push_dim()));
  model_->reserve(static_cast<int64_t>(instances));
  metrics_->reserve(static_cast<int64_t>(instances));
}

void CardWorker::reserve_steps(const StepReservation& largest) {
  stop_votes_ = 0;  // a new pass's steps (or an evaluation's): the last pass's votes are read
  const auto n = static_cast<std::size_t>(std::max<int64_t>(0, largest.instances));
  const std::size_t slots = static_cast<std::size_t>(std::max(0, largest.slots));
  const std::size_t dense = static_cast<std::size_t>(std::max(0, largest.dense_dim));
  graphs_->full_batch = static_cast<int64_t>(n);
  const std::pair<std::size_t, std::size_t> padded{largest.keys.occurrences,
                                                   largest.keys.pair_block};
  if (padded != graphs_->padded) {
    graphs_->padded = padded;
    ++graphs_->shape;
  }
  for (int64_t other : largest.other_instances) model_->reserve(other);
  // Every slot's staging block and both upload buffers (between passes: the ring was drained,
  // no copy is in flight).
  for (std::size_t i = 0; i < kStatusDepth; ++i) {
    buffers_->slot.index = i;
    buffers_->at = i % buffers_->uploaded.size();
    size_buffers(n, largest.keys.occurrences, slots * n + 1, n * dense, n);
  }
  buffers_->fence_needed = true;
  tier_.reserve_steps(card_.local_index(), largest.keys);
}

int64_t CardWorker::upload(const dataset::Batch& batch) {
  Buffers& b = *buffers_;
  const device::Stream& stream = card_.stream();
  const device::ProfileRange range("upload");
  const int64_t size = static_cast<int64_t>(batch.size());
  const std::size_t occurrences = batch.keys.size();
  b.batch = size;
  b.occurrences_count = occurrences;
  b.at = (b.at + 1) % b.uploaded.size();
  // Every buffer this step needs, sized before its first collective (device rule 1): by
  // reserve_steps for the pass's largest batch, so nothing is allocated here.
  const uint64_t generation = memory_generation(card_);
  size_buffers(batch.size(), occurrences, batch.offsets.size(), batch.dense.size(),
               batch.labels.size());
  if (memory_generation(card_) != generation) b.fence_needed = true;
  const Buffers::Layout& at = b.layout;

  char* host = b.staging[b.slot.index].data();
  const uint64_t count = occurrences;
  std::memcpy(host + at.count, &count, sizeof(count));
  if (occurrences > 0)
    std::memcpy(host + at.keys, batch.keys.data(), occurrences * sizeof(uint64_t));
  if (!batch.offsets.empty()) {
    std::memcpy(host + at.offsets, batch.offsets.data(), batch.offsets.size() * sizeof(uint32_t));
  }
  if (!batch.dense.empty()) {
    std::memcpy(host + at.dense, batch.dense.data(), batch.dense.size() * sizeof(float));
  }
  if (!batch.labels.empty()) {
    std::memcpy(host + at.labels, batch.labels.data(), batch.labels.size() * sizeof(float));
  }
  // On the copy stream, after the last step that read this buffer (or, when a buffer was
  // allocated on the compute stream since, after everything enqueued there so far); the step
  // reads it once the copy's event has passed.
  const device::Stream& copy = card_.copy_stream();
  if (b.fence_needed) {
    b.fence.record(stream);
    copy.wait(b.fence);
    b.fence_needed = false;
  } else {
    copy.wait(b.read[b.at]);
  }
  device::copy_async(b.uploaded[b.at].data(), host, at.total, copy);
  b.copied[b.at].record(copy);
  stream.wait(b.copied[b.at]);
  return size;
}

void CardWorker::pull(const heter_comm::PlannedCounts& planned_counts, bool pull_only) {
  Buffers& b = *buffers_;
  if (pull_only) {
    tier_.pull_only(card_.local_index(), b.keys(), b.occurrences_count, b.pull.data(),
                    card_.stream(), planned_counts, b.occurrences());
    return;
  }
  tier_.pull(card_.local_index(), b.keys(), b.occurrences_count, b.pull.data(), card_.stream(),
             planned_counts, b.occurrences());
}

void CardWorker::end_upload() {
  Buffers& b = *buffers_;
  b.read[b.at].record(card_.stream());
}

// The uploaded batch as the model sees it.
DenseBatchView CardWorker::batch_view(int slots) const {
  const Buffers& b = *buffers_;
  DenseBatchView view;
  view.sparse.records = b.pull.data();
  view.sparse.offsets = b.offsets();
  view.sparse.batch = b.batch;
  view.sparse.slots = slots;
  view.dense = b.dense();
  view.labels = b.labels();
  view.batch = b.batch;
  return view;
}

void CardWorker::train_step(const dataset::Batch& batch, int64_t global_batch, int64_t pass,
                            int64_t step, bool progress,
                            const heter_comm::PlannedCounts& planned_counts, bool stop_vote) {
  // A step that fails part-way leaves its slot uncommitted: the ring forgets what is pending.
  guarded([&] {
    run_train_step(batch, global_batch, pass, step, progress, planned_counts, stop_vote);
  });
}

void CardWorker::begin_pass_steps(std::size_t steps) {
  metrics_->reset();
  steady_after_ = steady_after(print_interval_, static_cast<int64_t>(steps));
}

void CardWorker::run_train_step(const dataset::Batch& batch, int64_t global_batch, int64_t pass,
                                int64_t step, bool progress,
                                const heter_comm::PlannedCounts& planned_counts, bool stop_vote) {
  Buffers& b = *buffers_;
  const device::DeviceCounts before = card_.counts();
  const device::ProfileRange step_range("step");
  comm_.set_step(pass, step);
  // The slot of the step kStatusDepth steps back is read first (it may throw that step's error).
  begin_slot(StepTag{pass, step, /*train=*/true, progress});
  TrainStep s;
  s.size = upload(batch);
  s.global_batch = global_batch;
  s.steady = step >= steady_after_;
  s.progress = progress;
  s.stop_vote = stop_vote;
  s.view = batch_view(batch.num_slots);
  // A planned step of a padded pass enqueues only capturable work: the whole step is one graph,
  // an empty batch's too (a card past its batches: the same collectives in the same graph shape
  // as its peers', over zero rows).
  if (composes(planned_counts)) {
    run_whole_step(s, planned_counts);
  } else {
    run_step_parts(s, planned_counts);
  }
  end_upload();
  b.ring.commit(card_.stream());
  last_step_ = card_.counts() - before;
}

// Forward/backward, metrics, then the gradients and, in the loss slot, this card's loss
// all-reduced: every card holds the same values after it, so the finite verdict is the same on
// every card.
void CardWorker::enqueue_dense_step(const TrainStep& s) {
  Buffers& b = *buffers_;
  GradScales scales;
  scales.dense = s.global_batch > 0 ? 1.0f / static_cast<float>(s.global_batch) : 0.0f;
  DenseParameters& params = model_->parameters();
  {
    const device::ProfileRange range("dense forward/backward");
    model_->forward_backward_async(s.view, scales, b.push.data(), s.stop_vote);
    metrics_->add(model_->predictions(), b.labels(), s.size, s.steady);
  }
  const device::ProfileRange range("dense all-reduce");
  comm_.all_reduce_sum(params.grads().data(), params.grads().data(), params.reduced_size(),
                       card_.stream());
  model_->check_finite_async();
  if (clip_) clip_->begin_step_async(params.grads().data(), s.global_batch);
}

// The status (and the progress AUC) into the step's ring slot, from the card.
void CardWorker::enqueue_status(bool progress) {
  const device::ProfileRange range("dense status");
  const device::Stream& stream = card_.stream();
  const bool enqueues = device::ComposedStep::enqueues(stream);
  const double* auc = progress && enqueues ? metrics_->progress_on_card() : nullptr;
  buffers_->copy_status(stream, model_->step_status(), auc);
}

bool CardWorker::composes(const heter_comm::PlannedCounts& planned_counts) const {
  return graphs_->enabled && planned_counts.counts != nullptr &&
         tier_.pads_planned_steps(card_.local_index());
}

void CardWorker::run_whole_step(const TrainStep& s,
                                const heter_comm::PlannedCounts& planned_counts) {
  Buffers& b = *buffers_;
  const device::Stream& stream = card_.stream();
  // Planned before the capture (the sparse half reads a late check there to free its slot).
  tier_.plan_next_step(card_.local_index(), planned_counts, b.occurrences());
  // Captured, every part below enqueues its card work into the graph; replayed, each runs only
  // its host part (the sparse half's counts and check tags, the optimizer's step count).
  const Graphs::StepKey key = Graphs::training(Graphs::Kind::kTrainStep, s, b.at);
  graphs_->compose(card_, key, [&](bool replay) {
    pull({});  // as planned above
    if (!replay) enqueue_dense_step(s);
    // The verdict (on the card) vetoes the sparse updates on the owners and the dense update; the
    // clip's sparse part may still veto in push_pulled, so the status is copied after it.
    uint32_t* veto = &model_->step_status()->first_non_finite;
    tier_.push_pulled(card_.local_index(), b.push.data(), stream, veto, clip_state());
    enqueue_status(s.progress);
    optimizer_->count_step();
    if (!replay) dense_update(veto);
  });
}

void CardWorker::run_step_parts(const TrainStep& s,
                                const heter_comm::PlannedCounts& planned_counts) {
  Buffers& b = *buffers_;
  const device::Stream& stream = card_.stream();
  pull(planned_counts);  // no wait when the step's counts are planned
  // The dense half of a full batch: one graph launch (see Graphs); the vote is a value of the
  // capture (its kernel's argument): a graph per vote.
  const bool graphed = graphs_->enabled && s.size > 0 && s.size == graphs_->full_batch;
  if (graphed) {
    Graphs::Cached& cached =
        graphs_->step_graph(Graphs::training(Graphs::Kind::kDenseStep, s, b.at));
    run_captured(card_, cached.graph, &cached.generation, [&] { enqueue_dense_step(s); });
  } else {
    enqueue_dense_step(s);
  }
  // The verdict (on the card) vetoes the sparse updates on the owners and the dense update: a
  // non-finite step changes no parameter; the host reads the verdict kStatusDepth steps later
  // (or at drain) and throws naming this pass and step. The status is copied after the push: with
  // the clip, a non-finite sparse gradient vetoes there (HeterComm::push_pulled).
  uint32_t* veto = &model_->step_status()->first_non_finite;
  tier_.push_pulled(card_.local_index(), b.push.data(), stream, veto, clip_state());
  enqueue_status(s.progress);
  const device::ProfileRange range("dense update");
  optimizer_->count_step();
  if (graphed) {
    run_captured(card_, graphs_->update, &graphs_->update_generation, [&] { dense_update(veto); });
  } else {
    dense_update(veto);
  }
}

heter_comm::NormClipState* CardWorker::clip_state() { return clip_ ? clip_->state() : nullptr; }

void CardWorker::dense_update(const uint32_t* veto) {
  DenseParameters& params = model_->parameters();
  if (clip_) clip_->scale_dense_async(params.grads().data());
  optimizer_->step_on_card(params, veto);
}

struct CardWorker::RetireStep {
  CardWorker* worker;
  void operator()(const StepTag& tag, const StepRecord* record) const {
    worker->retire(tag, *record);
  }
};

void CardWorker::begin_slot(const StepTag& tag) {
  Buffers& b = *buffers_;
  b.slot = b.ring.begin(RetireStep{this});
  *b.slot.tag = tag;
}

void CardWorker::retire(const StepTag& tag, const StepRecord& record) {
  if (tag.predictions_out != nullptr && tag.predictions > 0) {
    std::memcpy(tag.predictions_out, tag.predictions_at, tag.predictions * sizeof(float));
  }
  if (!tag.train) return;
  model_->throw_if_non_finite(record.status, tag.pass, tag.step);
  stop_votes_ = record.status.stop_votes;
  if (tag.progress && progress_sink_) {
    progress_sink_(tag.step, MetricsAccumulator::progress_auc(record.auc));
  }
}

void CardWorker::drain() {
  guarded([&] { buffers_->ring.drain(RetireStep{this}); });
  tier_.drain_checks(card_.local_index());
}

void CardWorker::abandon() {
  buffers_->ring.discard();
  // A step that failed between its upload and end_upload left its buffer's read event stale:
  // the next upload waits for everything enqueued instead.
  buffers_->fence_needed = true;
  stop_votes_ = 0;
  progress_sink_ = nullptr;
}

void CardWorker::set_progress_sink(std::function<void(int64_t step, double auc)> sink) {
  progress_sink_ = std::move(sink);
}

void CardWorker::all_reduce_metrics() {
  comm_.set_step(-1, -1);
  comm_.all_reduce_sum(metrics_->flat(), metrics_->flat(), metrics_->flat_size(), card_.stream());
  comm_.synchronize(card_.stream(), "metrics all-reduce");
}

}  // namespace gpubox::trainer
