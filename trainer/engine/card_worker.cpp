#include "trainer/engine/card_worker.hpp"

#include <algorithm>
#include <cstring>

#include "common/error.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/profile_range.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"

namespace gpubox::trainer {
namespace {

constexpr std::size_t kSectionAlign = 256;
std::size_t align_up(std::size_t bytes) {
  return (bytes + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

// Steps whose status may be pending at once (the ring of pinned slots they are read from): a
// step's verdict is read at most this many steps after it, and the host runs at most this many
// steps ahead of the card.
constexpr std::size_t kStatusDepth = 4;

}  // namespace

// What a step leaves for the host to read late (one pinned slot of the ring per step).
struct StepRecord {
  DenseStepStatus status;                                 // training steps
  double auc[MetricsAccumulator::kProgressDoubles] = {};  // progress steps
};
// What the host knows of a step when its record is read.
struct StepTag {
  int64_t pass = -1;
  int64_t step = -1;
  bool train = false;     // status holds a training step's verdict
  bool progress = false;  // auc holds the running AUC
};

// Step buffers, reused across steps (they only grow). The batch travels to the card as one
// pinned block (device rule 2) in one copy: keys | offsets | dense | labels, each
// section aligned to 256 bytes; the card-side views point into `uploaded`. One staging block per
// slot of the status ring: a step writes its batch into its slot's block, whose previous copy
// (kStatusDepth steps before) the slot's event says is done.
struct CardWorker::Buffers {
  explicit Buffers(device::Card& card)
      : uploaded(card.make_buffer<char>(0)),
        pull(card.make_buffer<float>(0)),
        push(card.make_buffer<float>(0)),
        staging(kStatusDepth),
        ring(card, kStatusDepth, 1) {}

  // Section offsets (bytes) of the current batch inside `staging` and `uploaded`.
  struct Layout {
    std::size_t keys = 0, offsets = 0, dense = 0, labels = 0, total = 0;
  };

  device::device_buffer<char> uploaded;
  device::device_buffer<float> pull;
  device::device_buffer<float> push;
  // Per ring slot; grows (a pinned allocation) only with the batch.
  std::vector<device::pinned_buffer<char>> staging;
  device::LateReadback<StepRecord, StepTag> ring;          // the steps' status, read late
  device::LateReadback<StepRecord, StepTag>::Slot slot{};  // the running step's
  Layout layout;
  int64_t batch = 0;

  const uint64_t* keys() const {
    return reinterpret_cast<const uint64_t*>(uploaded.data() + layout.keys);
  }
  const uint32_t* offsets() const {
    return reinterpret_cast<const uint32_t*>(uploaded.data() + layout.offsets);
  }
  const float* dense() const {
    return reinterpret_cast<const float*>(uploaded.data() + layout.dense);
  }
  const float* labels() const {
    return reinterpret_cast<const float*>(uploaded.data() + layout.labels);
  }
};

CardWorker::CardWorker(device::Card& card, comm::Communicator& comm, tier_owner::CardTier& tier,
                       const TrainerConfig& config)
    : card_(card), comm_(comm), tier_(tier), warmup_steps_(config.runner.print_interval) {
  model_ = std::make_unique<DenseModel>(card, config.dense_model_config());
  optimizer_ =
      std::make_unique<DenseOptimizer>(card, config.hyper.optimizer, model_->parameters().size());
  metrics_ = std::make_unique<MetricsAccumulator>(card, config.runner.auc_buckets_log2);
  buffers_ = std::make_unique<Buffers>(card);
}

CardWorker::~CardWorker() = default;

void CardWorker::size_buffers(std::size_t instances, std::size_t occurrences, std::size_t offsets,
                              std::size_t dense, std::size_t labels) {
  Buffers& b = *buffers_;
  Buffers::Layout& at = b.layout;
  at.keys = 0;
  at.offsets = at.keys + align_up(occurrences * sizeof(uint64_t));
  at.dense = at.offsets + align_up(offsets * sizeof(uint32_t));
  at.labels = at.dense + align_up(dense * sizeof(float));
  at.total = at.labels + align_up(labels * sizeof(float));
  // Grown only when a batch outgrows what reserve_steps sized (a pinned allocation synchronizes
  // the device). The running step's block: its slot's last copy out of it is done (the ring
  // retired the slot).
  device::pinned_buffer<char>& staging = b.staging[b.slot.index];
  if (staging.size() < at.total) {
    staging = device::pinned_buffer<char>(std::max(at.total, staging.size() * 3 / 2));
  }
  b.uploaded.resize_discard(at.total);
  b.pull.resize_discard(occurrences * static_cast<std::size_t>(tier_.pull_dim()));
  b.push.resize_discard(occurrences * static_cast<std::size_t>(tier_.push_dim()));
  model_->reserve(static_cast<int64_t>(instances));
  metrics_->reserve(static_cast<int64_t>(instances));
}

void CardWorker::reserve_steps(const StepReservation& largest) {
  const auto n = static_cast<std::size_t>(std::max<int64_t>(0, largest.instances));
  const std::size_t slots = static_cast<std::size_t>(std::max(0, largest.slots));
  const std::size_t dense = static_cast<std::size_t>(std::max(0, largest.dense_dim));
  for (int64_t other : largest.other_instances) model_->reserve(other);
  // Every slot's staging block (between passes: the ring was drained, no copy is in flight).
  for (std::size_t i = 0; i < kStatusDepth; ++i) {
    buffers_->slot.index = i;
    size_buffers(n, largest.keys.occurrences, slots * n + 1, n * dense, n);
  }
  tier_.reserve_steps(card_.local_index(), largest.keys);
}

int64_t CardWorker::upload(const dataset::Batch& batch, const uint64_t* planned_counts) {
  Buffers& b = *buffers_;
  const device::Stream& stream = card_.stream();
  const device::ProfileRange range("upload");
  const int64_t size = static_cast<int64_t>(batch.size());
  const std::size_t occurrences = batch.keys.size();
  b.batch = size;
  // Every buffer this step needs, sized before its first collective (device rule 1): by
  // reserve_steps for the pass's largest batch, so nothing is allocated here.
  size_buffers(batch.size(), occurrences, batch.offsets.size(), batch.dense.size(),
               batch.labels.size());
  const Buffers::Layout& at = b.layout;

  char* host = b.staging[b.slot.index].data();
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
  device::copy_async(b.uploaded.data(), host, at.total, stream);
  tier_.pull(card_.local_index(), b.keys(), occurrences, b.pull.data(), stream, planned_counts);
  return size;
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
                            int64_t step, bool progress, const uint64_t* planned_counts,
                            bool stop_vote) {
  // A step that fails part-way leaves its slot uncommitted: the ring forgets what is pending.
  guarded([&] {
    run_train_step(batch, global_batch, pass, step, progress, planned_counts, stop_vote);
  });
}

void CardWorker::run_train_step(const dataset::Batch& batch, int64_t global_batch, int64_t pass,
                                int64_t step, bool progress, const uint64_t* planned_counts,
                                bool stop_vote) {
  Buffers& b = *buffers_;
  const device::Stream& stream = card_.stream();
  const device::DeviceCounts before = card_.counts();
  const device::ProfileRange step_range("step");
  comm_.set_step(pass, step);
  // The slot of the step kStatusDepth steps back is read first (it may throw that step's error).
  begin_slot(StepTag{pass, step, /*train=*/true, progress});
  // And pull: no wait when the step's counts are planned.
  const int64_t size = upload(batch, planned_counts);
  const DenseBatchView view = batch_view(batch.num_slots);
  GradScales scales;
  scales.dense = global_batch > 0 ? 1.0f / static_cast<float>(global_batch) : 0.0f;
  {
    const device::ProfileRange range("dense forward/backward");
    model_->forward_backward_async(view, scales, b.push.data(), stop_vote);
    metrics_->add(model_->predictions(), b.labels(), size, step >= warmup_steps_);
    if (progress) metrics_->progress_async(b.slot.host->auc);
  }
  // The gradients and, in the loss slot, this card's loss: after the all-reduce every card
  // holds the same values, so the finite verdict below is the same on every card.
  DenseParameters& params = model_->parameters();
  {
    const device::ProfileRange range("dense all-reduce");
    comm_.all_reduce_sum(params.grads().data(), params.grads().data(), params.reduced_size(),
                         stream);
    model_->check_finite_async();
    device::copy_async(&b.slot.host->status, model_->step_status(), 1, stream);
  }
  // The verdict (on the card) vetoes the sparse updates on the owners and the dense update: a
  // non-finite step changes no parameter; the host reads the verdict kStatusDepth steps later
  // (or at drain) and throws naming this pass and step.
  const uint32_t* veto = &model_->step_status()->first_non_finite;
  tier_.push_pulled(card_.local_index(), b.push.data(), stream, veto);
  {
    const device::ProfileRange range("dense update");
    optimizer_->step(params, veto);
  }
  b.ring.commit(stream);
  last_step_ = card_.counts() - before;
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
  if (!tag.train) return;
  model_->throw_if_non_finite(record.status, tag.pass, tag.step);
  stop_votes_ = record.status.stop_votes;
  if (tag.progress && progress_sink_) {
    progress_sink_(tag.step, MetricsAccumulator::progress_auc(record.auc));
  }
}

template <class Op>
void CardWorker::guarded(Op&& op) {
  try {
    op();
  } catch (...) {
    buffers_->ring.discard();
    throw;
  }
}

void CardWorker::drain() {
  guarded([&] { buffers_->ring.drain(RetireStep{this}); });
  tier_.drain_checks(card_.local_index());
  stop_votes_ = 0;
}

void CardWorker::set_progress_sink(std::function<void(int64_t step, double auc)> sink) {
  progress_sink_ = std::move(sink);
}

void CardWorker::eval_step(const dataset::Batch& batch, const uint64_t* planned_counts) {
  Buffers& b = *buffers_;
  const device::ProfileRange range("eval step");
  comm_.set_step(-1, -1);  // no training step context
  guarded([&] {
    begin_slot(StepTag{});  // the staging block's slot: nothing to check
    const int64_t size = upload(batch, planned_counts);
    model_->predict_async(batch_view(batch.num_slots));
    metrics_->add(model_->predictions(), b.labels(), size);
    b.ring.commit(card_.stream());
  });
}

std::vector<float> CardWorker::last_predictions() const {
  return device::to_host(model_->predictions(), static_cast<std::size_t>(buffers_->batch),
                         card_.stream());
}

void CardWorker::all_reduce_metrics() {
  comm_.set_step(-1, -1);
  comm_.all_reduce_sum(metrics_->flat(), metrics_->flat(), metrics_->flat_size(), card_.stream());
  comm_.synchronize(card_.stream(), "metrics all-reduce");
}

}  // namespace gpubox::trainer
