// CardWorker's evaluation step (card_worker.hpp): the sparse lookup and the forward, composed as
// one step graph ("eval step") when the step is planned in a padded pass, else the sparse half's
// own work beside the dense half's "dense predict" graph (or eagerly).
#include <cstddef>
#include <vector>

#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/profile_range.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/engine/detail/card_worker_state.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {

void CardWorker::eval_step(const dataset::Batch& batch,
                           const heter_comm::PlannedCounts& planned_counts,
                           float* predictions_out) {
  Buffers& b = *buffers_;
  const device::ProfileRange range("eval step");
  comm_.set_step(-1, -1);  // no training step context
  guarded([&] {
    begin_slot(StepTag{});  // the staging block's slot: nothing to check but the predictions
    EvalStep e;
    e.size = upload(batch);
    e.view = batch_view(batch.num_slots);
    if (predictions_out != nullptr && e.size > 0) {
      // Copied into the slot's pinned block on the card, written out when the slot is read.
      e.keep_predictions = true;
      b.slot.tag->predictions_at = b.predictions[b.slot.index].data();
      b.slot.tag->predictions_out = predictions_out;
      b.slot.tag->predictions = static_cast<std::size_t>(e.size);
    }
    // The sparse half pulls only: nothing is pushed, so no merge plan (and, replicated, no
    // collective at all: CardTier::pull_only). Planned in a padded pass, the whole step is one
    // graph, an empty batch's too.
    if (composes(planned_counts)) {
      run_whole_eval(e, planned_counts);
    } else {
      run_eval_parts(e, planned_counts);
    }
    end_upload();
    b.ring.commit(card_.stream());
  });
}

// The forward, the predictions and the metrics.
void CardWorker::enqueue_predict(const EvalStep& e) {
  model_->predict_async(e.view);
  metrics_->add(model_->predictions(), buffers_->labels(), e.size);
}

// The predictions into the running slot's pinned block, when kept: one kernel that takes the
// block from the ring's counter on the card (before copy_on_card advances it), so one captured
// graph serves every slot.
void CardWorker::copy_predictions(const EvalStep& e) {
  if (!e.keep_predictions) return;
  Buffers& b = *buffers_;
  b.ring.copy_to_slot_block(card_.stream(), b.prediction_blocks().data(), model_->predictions(),
                            static_cast<std::size_t>(e.size));
}

void CardWorker::run_whole_eval(const EvalStep& e,
                                const heter_comm::PlannedCounts& planned_counts) {
  Buffers& b = *buffers_;
  // Planned before the capture (the lookup reads a late check there to free its slot).
  tier_.plan_next_step(card_.local_index(), planned_counts, b.occurrences());
  Graphs::StepKey key;
  key.kind = Graphs::Kind::kEvalStep;
  key.batch = e.size;
  key.upload = b.at;
  key.predictions = e.keep_predictions ? b.predictions_grown : 0;
  graphs_->compose(card_, key, [&](bool replay) {
    pull({}, /*pull_only=*/true);  // as planned above
    if (!replay) {
      enqueue_predict(e);
      copy_predictions(e);
    }
    b.ring.copy_on_card(card_.stream(), {});  // nothing into the slot: the counter advances
  });
}

void CardWorker::run_eval_parts(const EvalStep& e,
                                const heter_comm::PlannedCounts& planned_counts) {
  Buffers& b = *buffers_;
  pull(planned_counts, /*pull_only=*/true);
  // The dense half of a full batch: one graph launch (see Graphs), kept per upload buffer; the
  // predictions' copy (into the slot's block) after it.
  if (graphs_->enabled && e.size > 0 && e.size == graphs_->full_batch) {
    Graphs::Predict& graph = graphs_->predicts[b.at];
    if (graph.batch != e.size) {
      graph.graph.reset();  // another pass's batch size: captured again
      graph.batch = e.size;
    }
    detail::run_captured(card_, graph.graph, &graph.generation, [&] { enqueue_predict(e); });
  } else {
    enqueue_predict(e);
  }
  copy_predictions(e);
  b.ring.copy_on_card(card_.stream(), {});  // nothing into the slot: the counter advances
}

std::vector<float> CardWorker::last_predictions() const {
  return device::to_host(model_->predictions(), static_cast<std::size_t>(buffers_->batch),
                         card_.stream());
}

}  // namespace gpubox::trainer
