// CardWorker's private state (trainer/engine/card_worker.hpp), shared by its two source files:
// card_worker.cpp (the buffers, the upload, the training step, the status ring) and
// card_worker_eval.cpp (the evaluation step). Private to trainer/engine.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/composed_step.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/step_graph.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace detail {

// Steps whose status may be pending at once (the ring of pinned slots they are read from): a
// step's verdict is read at most this many steps after it, and the host runs at most this many
// steps ahead of the card.
inline constexpr std::size_t kStatusDepth = 4;

// Card allocations and frees so far: a step graph captured at another count may hold pointers
// to memory that has since moved.
inline uint64_t memory_generation(const device::Card& card) {
  const device::DeviceCounts counts = card.counts();
  return counts.allocations + counts.frees;
}

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

}  // namespace detail

// What a training step's card work depends on (a whole-step graph's key but the buffers).
struct CardWorker::TrainStep {
  int64_t size = 0;  // instances of this card's batch
  int64_t global_batch = 0;
  bool steady = false;
  bool progress = false;
  bool stop_vote = false;
  DenseBatchView view;
};

// An evaluation step's: its batch, and whether its predictions are kept (they go into the pinned
// block of the ring slot the card's counter names: LateReadback::copy_to_slot_block).
struct CardWorker::EvalStep {
  int64_t size = 0;
  DenseBatchView view;
  bool keep_predictions = false;
};

// The step as step graphs (heterps/device/step_graph.hpp). A planned step of a padded pass (the
// trainer's, gpubox and Collective mode) is ONE graph (device::ComposedStep): "train step" (the
// sparse pull, forward, backward, metrics, the dense all-reduce, the finite check, the status
// (and progress AUC) into the ring slot the card's counter names, the sparse push and the dense
// optimizer) or "eval step" (the sparse lookup, the forward, the metrics, the predictions into
// their slot's pinned block, the ring's slot counter); a short last batch and an empty one too
// (a graph of its own size). Otherwise (an unpadded pass: GPUBOX_PADDED_STEPS=0, or no step
// plan) the dense half of a full batch is graphs of its own beside the sparse half's work:
// "dense step" and "dense update" for training, "dense predict" for an evaluation. A capture
// bakes the batch size, the gradient scale (1 / global batch), the metrics' steady flag, the stop
// vote, whether the progress AUC is copied and the buffers' addresses (which of the two upload
// buffers, the predictions' pinned blocks: all of the ring's, the card picks the slot's) in;
// so each graph is kept per such key and
// captured again when the card has allocated or freed since (a grown buffer) or the pass's padded
// sizes changed (reserve_steps).
struct CardWorker::Graphs {
  enum class Kind { kTrainStep, kDenseStep, kEvalStep };
  struct StepKey {
    Kind kind = Kind::kTrainStep;
    int64_t batch = 0;
    int64_t global_batch = 0;  // training
    bool steady = false;
    bool stop_vote = false;
    bool progress = false;   // the whole step's: it copies the progress AUC too
    std::size_t upload = 0;  // which upload buffer the batch is in (Buffers::uploaded)
    // An evaluation's: the predictions' pinned blocks (Buffers::prediction_blocks) as last
    // grown; 0: not kept. One value for every ring slot: the card picks the slot's block.
    uint64_t predictions = 0;
    bool operator==(const StepKey& o) const {
      return kind == o.kind && batch == o.batch && global_batch == o.global_batch &&
             steady == o.steady && stop_vote == o.stop_vote && progress == o.progress &&
             upload == o.upload && predictions == o.predictions;
    }
  };
  // A training step's key: "train step" (kTrainStep) or its dense half's ("dense step", which
  // copies no progress AUC).
  static StepKey training(Kind kind, const TrainStep& s, std::size_t upload) {
    StepKey key;
    key.kind = kind;
    key.batch = s.size;
    key.global_batch = s.global_batch;
    key.steady = s.steady;
    key.stop_vote = s.stop_vote;
    key.progress = kind == Kind::kTrainStep && s.progress;
    key.upload = upload;
    return key;
  }
  struct Cached {
    explicit Cached(const StepKey& k) : key(k), graph(name(k.kind)) {}
    static const char* name(Kind kind) {
      switch (kind) {
        case Kind::kTrainStep:
          return "train step";
        case Kind::kDenseStep:
          return "dense step";
        case Kind::kEvalStep:
          return "eval step";
      }
      return "step";
    }
    StepKey key;
    device::StepGraph graph;
    uint64_t generation = 0;
    uint64_t shape = 0;  // Graphs::shape when captured
  };
  // Training: steady flag x progress flag x upload buffer, a short last batch's and an empty
  // one's, a stop vote's. Evaluation: upload buffer (predictions kept or not), the last
  // batches'.
  static constexpr std::size_t kStepGraphsKept = 12;
  static constexpr std::size_t kEvalGraphsKept = 8;

  bool enabled = device::step_graphs_enabled();  // GPUBOX_STEP_GRAPHS=0: eagerly
  int64_t full_batch = 0;  // the pass's largest batch (reserve_steps); 0: no graph
  // The sparse half's padded sizes (occurrences, pair block) the composed graphs bake in, and a
  // serial that changes with them.
  std::pair<std::size_t, std::size_t> padded{0, 0};
  uint64_t shape = 0;
  std::vector<std::unique_ptr<Cached>> steps;  // training's, most recently used first
  std::vector<std::unique_ptr<Cached>> evals;  // evaluation's ("eval step")
  device::StepGraph update{"dense update"};
  uint64_t update_generation = 0;
  // An unpadded evaluation step's dense half ("dense predict": the forward, the predictions, the
  // metrics) for a batch of the pass's full size, per upload buffer (Buffers::uploaded): a capture
  // bakes the batch size and the buffers in.
  struct Predict {
    device::StepGraph graph{"dense predict"};
    int64_t batch = 0;
    uint64_t generation = 0;
  };
  std::array<Predict, 2> predicts;

  // The graph for `key`, made (empty) when new; keeps the last kStepGraphsKept keys of training
  // (kEvalGraphsKept of evaluation), so that an evaluation evicts no training graph.
  Cached& step_graph(const StepKey& key) {
    const bool eval = key.kind == Kind::kEvalStep;
    std::vector<std::unique_ptr<Cached>>& cache = eval ? evals : steps;
    for (std::size_t i = 0; i < cache.size(); ++i) {
      if (cache[i]->key == key) {
        std::rotate(cache.begin(), cache.begin() + static_cast<std::ptrdiff_t>(i),
                    cache.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        return *cache.front();
      }
    }
    cache.insert(cache.begin(), std::make_unique<Cached>(key));
    if (cache.size() > (eval ? kEvalGraphsKept : kStepGraphsKept)) cache.pop_back();
    return *cache.front();
  }

  // One composed step (device::ComposedStep) of `key`'s graph on `card`'s stream: `parts(replay)`
  // enqueues the step's parts, whose card work is captured into the graph, or (replay: the
  // graph's capture still holds, made at the card's memory generation and the pass's padded
  // sizes) runs only their host parts; then the graph is launched. The sparse half's plan goes
  // before it (HeterComm::plan_next_step reads a late check: refused inside a capture).
  template <class Parts>
  void compose(device::Card& card, const StepKey& key, Parts&& parts) {
    Cached& cached = step_graph(key);
    const uint64_t generation = detail::memory_generation(card);
    const bool replay =
        cached.graph.ready() && cached.generation == generation && cached.shape == shape;
    device::ComposedStep step(
        card.stream(), cached.graph,
        replay ? device::ComposedStep::Mode::kReplay : device::ComposedStep::Mode::kCapture);
    std::forward<Parts>(parts)(replay);
    step.finish();
    cached.generation = generation;  // a capture allocates nothing (it would have thrown)
    cached.shape = shape;
  }
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
// pinned block (device rule 2) in one copy: count | offsets | dense | labels | keys, each section
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
  // `comm` bounds the ring's waits for a step's status (its step ran collectives).
  Buffers(device::Card& card, comm::Communicator& comm)
      : uploaded{card.make_buffer<char>(0), card.make_buffer<char>(0)},
        copied{device::Event(card.device(), card.stream().counters()),
               device::Event(card.device(), card.stream().counters())},
        read{device::Event(card.device(), card.stream().counters()),
             device::Event(card.device(), card.stream().counters())},
        fence(card.device(), card.stream().counters()),
        pull(card.make_buffer<float>(0)),
        push(card.make_buffer<float>(0)),
        staging(detail::kStatusDepth),
        predictions(detail::kStatusDepth),
        ring(card, detail::kStatusDepth, 1, comm::bounded_slot_wait<StepTag>(comm, "the status")) {}

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
  // an evaluation step's predictions (the slot's block: LateReadback::copy_to_slot_block).
  std::vector<device::pinned_buffer<char>> staging;
  std::vector<device::pinned_buffer<float>> predictions;
  // Changes whenever a predictions block grows (a graph holding the blocks' addresses is then
  // captured again: Graphs::StepKey::predictions).
  uint64_t predictions_grown = 1;
  device::LateReadback<StepRecord, StepTag> ring;          // the steps' status, read late
  device::LateReadback<StepRecord, StepTag>::Slot slot{};  // the running step's
  Layout layout;
  int64_t batch = 0;
  std::size_t occurrences_count = 0;  // the batch's key occurrences

  // Every ring slot's predictions block, in slot order.
  std::array<float*, detail::kStatusDepth> prediction_blocks() {
    std::array<float*, detail::kStatusDepth> blocks{};
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = predictions[i].data();
    return blocks;
  }

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

// Runs op; a failure forgets the pending slots (their verdicts, predictions and votes).
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

}  // namespace gpubox::trainer
