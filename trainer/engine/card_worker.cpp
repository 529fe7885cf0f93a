#include "trainer/engine/card_worker.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/composed_step.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/profile_range.hpp"
#include "heterps/device/step_graph.hpp"
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

// Card allocations and frees so far: a step graph captured at another count may hold pointers
// to memory that has since moved.
uint64_t memory_generation(const device::Card& card) {
  const device::DeviceCounts counts = card.counts();
  return counts.allocations + counts.frees;
}

}  // namespace

// The step as step graphs (heterps/device/step_graph.hpp). A planned step of a padded pass (the
// trainer's, gpubox and Collective mode) is ONE graph, "train step" (device::ComposedStep): the
// sparse pull, forward, backward, metrics, the dense all-reduce, the finite check, the status
// (and progress AUC) into the ring slot the card's counter names, the sparse push and the dense
// optimizer; its last, shorter batch too (a graph of its own size). Otherwise (an unpadded pass:
// GPUBOX_PADDED_STEPS=0) the dense half of a full batch is two graphs, "dense step" and "dense
// update", beside the sparse half's own work. A capture bakes the batch size, the gradient scale
// (1 / global batch), the metrics' steady flag, the stop vote, whether the progress AUC is copied
// and the buffers' addresses (which of the two upload buffers) in; so each graph is kept per such
// key and captured again when the card has allocated or freed since (a grown buffer) or the pass's
// padded sizes changed (reserve_steps).
struct CardWorker::Graphs {
  struct StepKey {
    int64_t batch = 0;
    int64_t global_batch = 0;
    bool steady = false;
    bool stop_vote = false;
    bool progress = false;   // the whole step's: it copies the progress AUC too
    std::size_t upload = 0;  // which upload buffer the batch is in (Buffers::uploaded)
    bool whole = false;      // "train step" (the whole step), else "dense step"
    bool operator==(const StepKey& o) const {
      return batch == o.batch && global_batch == o.global_batch && steady == o.steady &&
             stop_vote == o.stop_vote && progress == o.progress && upload == o.upload &&
             whole == o.whole;
    }
  };
  struct Cached {
    explicit Cached(const StepKey& k) : key(k), graph(k.whole ? "train step" : "dense step") {}
    StepKey key;
    device::StepGraph graph;
    uint64_t generation = 0;
    uint64_t shape = 0;  // Graphs::shape when captured
  };
  static constexpr std::size_t kStepGraphsKept = 12;

  bool enabled = device::step_graphs_enabled();  // GPUBOX_STEP_GRAPHS=0: eagerly
  int64_t full_batch = 0;  // the pass's largest batch (reserve_steps); 0: no graph
  // The sparse half's padded sizes (occurrences, pair block) the whole-step graphs bake in, and
  // a serial that changes with them.
  std::pair<std::size_t, std::size_t> padded{0, 0};
  uint64_t shape = 0;
  std::vector<std::unique_ptr<Cached>> steps;  // most recently used first
  device::StepGraph update{"dense update"};
  uint64_t update_generation = 0;
  // An evaluation step's dense half ("dense predict": the forward, the predictions, the metrics)
  // for a batch of the pass's full size, per upload buffer (Buffers::uploaded): a capture bakes
  // the batch size and the buffers in.
  struct Predict {
    device::StepGraph graph{"dense predict"};
    int64_t batch = 0;
    uint64_t generation = 0;
  };
  std::array<Predict, 2> predicts;

  // The graph for `key`, made (empty) when new; keeps the last kStepGraphsKept keys.
  Cached& step_graph(const StepKey& key) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (steps[i]->key == key) {
        std::rotate(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(i),
                    steps.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        return *steps.front();
      }
    }
    steps.insert(steps.begin(), std::make_unique<Cached>(key));
    if (steps.size() > kStepGraphsKept) steps.pop_back();
    return *steps.front();
  }
};

namespace {
// Replays `graph` when its capture is still valid (made at the card's current memory
// generation), else captures `work` (card work enqueued on the card's stream) into it first.
template <class Work>
void run_captured(device::Card& card, device::StepGraph& graph, uint64_t* generation, Work&& work) {
  const uint64_t now = memory_generation(card);
  if (!graph.ready() || *generation != now) {
    graph.capture(card.stream(), std::forward<Work>(work));
    *generation = now;  // a capture allocates nothing (it would have thrown)
  }
  graph.replay(card.stream());
}
}  // namespace

struct CardWorker::TrainStep {
  int64_t size = 0;  // instances of this card's batch
  int64_t global_batch = 0;
  bool steady = false;
  bool progress = false;
  bool stop_vote = false;
  DenseBatchView view;
};

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
  // An evaluation step's predictions: `predictions` floats copied into the slot's pinned block
  // `predictions_at`, for the host at `predictions_out` (CardWorker::eval_step).
  const float* predictions_at = nullptr;
  float* predictions_out = nullptr;
  std::size_t predictions = 0;
};

// Step buffers, reused across steps (they only grow). The batch travels to the card as one
// pinned block (device rule 2) in one copy: offsets | dense | labels | keys, each section
// aligned to 256 bytes; the card-side views point into `uploaded`. The sections the dense net
// reads come first: their addresses depend on the batch size only, not on the step's key
// count, so a step graph that reads them holds for every full batch (of the same upload buffer).
// One staging block per slot of the status ring: a step writes its batch into its slot's block,
// whose previous copy (kStatusDepth steps before) the slot's event says is done (the slot's
// event follows the compute stream's wait for that copy).
//
// The upload overlaps the step before it (issue 31, item 4): it runs on the card's copy stream
// into one of two card buffers, alternately, while the compute stream may still run the
// previous step, which reads the other one. The copy stream waits for the event the compute
// stream recorded after the last step that read the buffer (two steps back: `read`), the
// compute stream waits for the copy's event (`copied`) before the step's pull: the card orders
// both, the host waits for neither.
struct CardWorker::Buffers {
  explicit Buffers(device::Card& card)
      : uploaded{card.make_buffer<char>(0), card.make_buffer<char>(0)},
        copied{device::Event(card.device(), card.stream().counters()),
               device::Event(card.device(), card.stream().counters())},
        read{device::Event(card.device(), card.stream().counters()),
             device::Event(card.device(), card.stream().counters())},
        fence(card.device(), card.stream().counters()),
        pull(card.make_buffer<float>(0)),
        push(card.make_buffer<float>(0)),
        staging(kStatusDepth),
        predictions(kStatusDepth),
        ring(card, kStatusDepth, 1) {}

  // The step's slot of the ring (the status, and the progress AUC when `progress`) from the card
  // (inside a whole-step graph: the slot the card's counter names).
  void copy_status(const device::Stream& stream, const DenseStepStatus* status,
                   const double* progress_auc) {
    const device::RingSegment record{status, offsetof(StepRecord, status), sizeof(*status)};
    if (progress_auc == nullptr) {
      ring.copy_on_card(stream, {record});
      return;
    }
    ring.copy_on_card(stream,
                      {record, {progress_auc, offsetof(StepRecord, auc), sizeof(StepRecord::auc)}});
  }

  // Section offsets (bytes) of the current batch inside `staging` and `uploaded`.
  // `count`: the batch's key occurrences (one uint64_t), read on the card by the sparse half's
  // step graphs (HeterComm::plan_next_step).
  struct Layout {
    std::size_t count = 0, keys = 0, offsets = 0, dense = 0, labels = 0, total = 0;
  };

  // The two upload buffers, the running step's is uploaded[at]; the copy into each (on the copy
  // stream) and the end of the last step that read each (on the compute stream).
  std::array<device::device_buffer<char>, 2> uploaded;
  std::array<device::Event, 2> copied;
  std::array<device::Event, 2> read;
  // A buffer (re)allocated on the compute stream since the copy stream last wrote it: the copy
  // waits for the compute stream's work so far instead (reserve_steps, an unplanned batch).
  device::Event fence;
  bool fence_needed = true;
  std::size_t at = 0;  // the running step's upload buffer
  device::device_buffer<float> pull;
  device::device_buffer<float> push;
  // Per ring slot; grow (a pinned allocation) only with the batch: the batch's staging block,
  // an evaluation step's predictions.
  std::vector<device::pinned_buffer<char>> staging;
  std::vector<device::pinned_buffer<float>> predictions;
  device::LateReadback<StepRecord, StepTag> ring;          // the steps' status, read late
  device::LateReadback<StepRecord, StepTag>::Slot slot{};  // the running step's
  Layout layout;
  int64_t batch = 0;
  std::size_t occurrences_count = 0;  // the batch's key occurrences

  const char* batch_block() const { return uploaded[at].data(); }
  const uint64_t* keys() const {
    return reinterpret_cast<const uint64_t*>(batch_block() + layout.keys);
  }
  const uint32_t* offsets() const {
    return reinterpret_cast<const uint32_t*>(batch_block() + layout.offsets);
  }
  const float* dense() const {
    return reinterpret_cast<const float*>(batch_block() + layout.dense);
  }
  const float* labels() const {
    return reinterpret_cast<const float*>(batch_block() + layout.labels);
  }
  const uint64_t* occurrences() const {
    return reinterpret_cast<const uint64_t*>(batch_block() + layout.count);
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
  s.steady = step >= warmup_steps_;
  s.progress = progress;
  s.stop_vote = stop_vote;
  s.view = batch_view(batch.num_slots);
  // A planned step of a padded pass enqueues only capturable work: the whole step is one graph.
  if (graphs_->enabled && s.size > 0 && planned_counts.counts != nullptr &&
      tier_.pads_planned_steps(card_.local_index())) {
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
}

// The status (and the progress AUC) into the step's ring slot, from the card.
void CardWorker::enqueue_status(bool progress) {
  const device::ProfileRange range("dense status");
  const device::Stream& stream = card_.stream();
  const bool enqueues = device::ComposedStep::enqueues(stream);
  const double* auc = progress && enqueues ? metrics_->progress_on_card() : nullptr;
  buffers_->copy_status(stream, model_->step_status(), auc);
}

void CardWorker::run_whole_step(const TrainStep& s,
                                const heter_comm::PlannedCounts& planned_counts) {
  Buffers& b = *buffers_;
  const device::Stream& stream = card_.stream();
  Graphs::Cached& cached = graphs_->step_graph(
      {s.size, s.global_batch, s.steady, s.stop_vote, s.progress, b.at, /*whole=*/true});
  const uint64_t generation = memory_generation(card_);
  const bool replay =
      cached.graph.ready() && cached.generation == generation && cached.shape == graphs_->shape;
  // Captured, every part below enqueues its card work into the graph; replayed, each runs only
  // its host part (the sparse half's counts and check tags, the optimizer's step count).
  // Planned before the capture (the sparse half reads a late check there to free its slot).
  tier_.plan_next_step(card_.local_index(), planned_counts, b.occurrences());
  device::ComposedStep composed(
      stream, cached.graph,
      replay ? device::ComposedStep::Mode::kReplay : device::ComposedStep::Mode::kCapture);
  pull({});  // as planned above
  if (!replay) enqueue_dense_step(s);
  enqueue_status(s.progress);
  // The verdict (on the card) vetoes the sparse updates on the owners and the dense update.
  const uint32_t* veto = &model_->step_status()->first_non_finite;
  tier_.push_pulled(card_.local_index(), b.push.data(), stream, veto);
  optimizer_->count_step();
  if (!replay) optimizer_->step_on_card(model_->parameters(), veto);
  composed.finish();
  cached.generation = generation;  // a capture allocates nothing (it would have thrown)
  cached.shape = graphs_->shape;
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
    Graphs::Cached& cached = graphs_->step_graph(
        {s.size, s.global_batch, s.steady, s.stop_vote, false, b.at, /*whole=*/false});
    run_captured(card_, cached.graph, &cached.generation, [&] { enqueue_dense_step(s); });
  } else {
    enqueue_dense_step(s);
  }
  enqueue_status(s.progress);
  // The verdict (on the card) vetoes the sparse updates on the owners and the dense update: a
  // non-finite step changes no parameter; the host reads the verdict kStatusDepth steps later
  // (or at drain) and throws naming this pass and step.
  const uint32_t* veto = &model_->step_status()->first_non_finite;
  tier_.push_pulled(card_.local_index(), b.push.data(), stream, veto);
  const device::ProfileRange range("dense update");
  optimizer_->count_step();
  if (graphed) {
    run_captured(card_, graphs_->update, &graphs_->update_generation,
                 [&] { optimizer_->step_on_card(model_->parameters(), veto); });
  } else {
    optimizer_->step_on_card(model_->parameters(), veto);
  }
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

template <class Op>
void CardWorker::guarded(Op&& op) {
  try {
    op();
  } catch (...) {
    buffers_->ring.discard();
    stop_votes_ = 0;
    throw;
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

void CardWorker::eval_step(const dataset::Batch& batch,
                           const heter_comm::PlannedCounts& planned_counts,
                           float* predictions_out) {
  Buffers& b = *buffers_;
  const device::ProfileRange range("eval step");
  comm_.set_step(-1, -1);  // no training step context
  guarded([&] {
    begin_slot(StepTag{});  // the staging block's slot: nothing to check but the predictions
    // The sparse half pulls only: nothing is pushed, so no merge plan (and, replicated, no
    // collective at all: CardTier::pull_only).
    const int64_t size = upload(batch);
    pull(planned_counts, /*pull_only=*/true);
    const DenseBatchView view = batch_view(batch.num_slots);
    const auto predict = [&] {
      model_->predict_async(view);
      metrics_->add(model_->predictions(), b.labels(), size);
    };
    if (graphs_->enabled && size > 0 && size == graphs_->full_batch) {
      Graphs::Predict& graph = graphs_->predicts[b.at];
      if (graph.batch != size) {
        graph.graph.reset();  // another pass's batch size: captured again
        graph.batch = size;
      }
      run_captured(card_, graph.graph, &graph.generation, predict);
    } else {
      predict();
    }
    if (predictions_out != nullptr && size > 0) {
      float* pinned = b.predictions[b.slot.index].data();
      device::copy_async(pinned, model_->predictions(), static_cast<std::size_t>(size),
                         card_.stream());
      b.slot.tag->predictions_at = pinned;
      b.slot.tag->predictions_out = predictions_out;
      b.slot.tag->predictions = static_cast<std::size_t>(size);
    }
    b.ring.copy_on_card(card_.stream(), {});  // nothing into the slot: the counter advances
    end_upload();
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
