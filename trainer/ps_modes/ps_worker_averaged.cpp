// PsWorker's part of the sync mode's averaged dense step (ps_worker.hpp: add_gradients,
// step_averaged; averages_gradients): the job's gradients summed in the servers' gradient
// tables, one optimizer step on their mean on every thread.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/memory.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

namespace gpubox::trainer::ps_modes {

void PsWorker::add_gradients(GradientShare share) {
  const std::size_t n = model_->parameters().size();
  const char* table = kGradientTableNames[gradient_steps_ % 2];
  if (share == GradientShare::kLocal) return;  // step_averaged steps on the card's own
  if (share == GradientShare::kAdd && step_batch_ == 0) return;  // nothing to add
  // kOverwrite: this thread's sums replace what the table held from two steps ago (zeros after
  // an empty batch), so that no thread has to clear it (see ps_worker.hpp for the ordering).
  read_back_grads_into_sums(n);
  const auto action = share == GradientShare::kOverwrite ? table::server::DenseAction::kWrite
                                                         : table::server::DenseAction::kAdd;
  throw_if_error(
      servers_.dense(action, table, &gradient_sums_)
          .with_context(std::string(share == GradientShare::kOverwrite
                                        ? "writing the dense gradients to the servers' "
                                        : "adding the dense gradients to the servers' ") +
                        table));
}

void PsWorker::read_back_grads_into_sums(std::size_t n) {
  growth_.resize(&gradient_sums_, n + 1);
  gradient_sums_[n] = static_cast<float>(step_batch_);
  if (step_batch_ == 0) {  // no gradients this step (the card's are an older step's)
    std::fill(gradient_sums_.begin(), gradient_sums_.begin() + static_cast<std::ptrdiff_t>(n),
              0.0f);
    return;
  }
  DenseParameters& params = model_->parameters();
  growth_.fit(&read_back_, n);
  device::copy_async(read_back_.data(), params.grads().data(), n, card_.stream());
  card_.stream().synchronize();
  std::copy(read_back_.data(), read_back_.data() + n, gradient_sums_.begin());
}

void PsWorker::step_averaged(GradientShare share) {
  const device::DeviceCounts before = card_.counts();
  DenseParameters& params = model_->parameters();
  const std::size_t n = params.size();
  const char* table = kGradientTableNames[gradient_steps_++ % 2];
  if (share == GradientShare::kLocal) {
    read_back_grads_into_sums(n);  // the job's sums are this thread's: no server round trip
  } else {
    growth_.resize(&gradient_sums_, n + 1);
    throw_if_error(servers_.dense(table::server::DenseAction::kRead, table, &gradient_sums_)
                       .with_context(std::string("reading the job's dense gradients from the "
                                                 "servers' ") +
                                     table));
  }
  const float batch = gradient_sums_[n];
  if (batch > 0.0f) {  // else no thread of the job had a batch: nothing to step
    // Pinned: the copy does not block the thread. The wait: a thread without a batch this step
    // read nothing back, so its last step's copy from the buffer may still be under way.
    card_.stream().synchronize();
    growth_.fit(&read_back_, n);
    const float scale = 1.0f / batch;
    for (std::size_t i = 0; i < n; ++i) read_back_.data()[i] = gradient_sums_[i] * scale;
    device::copy_async(params.grads().data(), read_back_.data(), n, card_.stream());
    optimizer_->step(params);
  }
  count_card_allocations(before);
}

void PsWorker::publish_dense() {
  read_dense(&dense_);
  throw_if_error(servers_.dense(table::server::DenseAction::kWrite, kDenseTableName, &dense_)
                     .with_context("writing the dense parameters to the servers"));
}

bool averages_gradients(const RunnerConfig& runner) {
  return runner.sync_mode == SyncMode::kSync && runner.dense_sync_steps == 1;
}

}  // namespace gpubox::trainer::ps_modes
