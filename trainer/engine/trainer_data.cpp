// Trainer's reading of a pass or of evaluation data: one trainer's share of the files, loaded
// whole or scanned for its keys and step sizes when streamed (trainer.hpp).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "dataset/data_files.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/load_report.hpp"
#include "dataset/queue_dataset.hpp"
#include "trainer/engine/step_sizes.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"

namespace gpubox::trainer {

std::unique_ptr<dataset::InMemoryDataset> Trainer::load_dataset(
    const std::vector<std::string>& files, const std::string& what, int64_t pass) const {
  auto ds = std::make_unique<dataset::InMemoryDataset>(config_.dataset);
  if (files.empty() && env_.trainers > 1) {
    // An uneven split left this trainer no file: it joins every step with empty batches.
    GPUBOX_LOG(INFO) << what << ": trainer " << env_.trainer_id << " of " << env_.trainers
                     << " has no file of it";
    return ds;
  }
  ds->set_filelist(files);
  // One trainer stops reading when asked (several stop together, in a step: epoch_loop.hpp).
  const std::atomic<bool>* stop = env_.trainers == 1 ? step_hooks_.stop_flag : nullptr;
  ds->set_stop_flag(stop);
  ds->set_pass_cache(state_->pass_cache.get());
  const Status st = ds->load_into_memory();
  if (st.code() == Status::Code::kAborted && stop != nullptr && stop->load()) {
    throw PassStopped(pass, "reading " + what);
  }
  if (!st.ok()) GPUBOX_FAIL("loading ", what, ": ", st.message());
  report_read(ds->load_stats(), files, what, config_.dataset.max_malformed_share);
  return ds;
}

void Trainer::read_pass(const std::vector<std::string>& files, int64_t pass,
                        PreparedPass* into) const {
  const std::vector<std::string> share = trainer_file_share(files, env_.trainer_id, env_.trainers);
  const std::string what = "pass " + std::to_string(pass);
  if (config_.runner.reader_type != ReaderType::kQueueDataset) {
    into->data = load_dataset(share, what, pass);
    // The keys' slots are those of their first occurrences in the load order: taken before the
    // instances are stored in the pass's shuffled order, so that the steps (and the plan below)
    // read each batch's instances in sequence.
    into->keys = into->data->unique_keys_and_slots_shared();
    if (config_.runner.shuffle) {
      into->data->local_shuffle(config_.runner.seed * 1000003 + pass);
      store_pass_in_order(into->data.get(), what, pass);
    }
    into->step_sizes =
        plan_pass_steps(*into->data, static_cast<std::size_t>(config_.dataset.batch_size));
    return;
  }
  // Streamed: read once now for the pass's keys (begin_pass needs them all before the first
  // step; memory: the keys, not the instances) and its step sizes, streamed again by run_pass.
  into->stream = std::make_unique<dataset::QueueDataset>(config_.dataset);
  if (share.empty() && env_.trainers > 1) {
    GPUBOX_LOG(INFO) << what << ": trainer " << env_.trainer_id << " of " << env_.trainers
                     << " has no file of it";
  } else {
    into->stream->set_filelist(share);
  }
  const int cards = state_->cards.num_local_cards();
  PassStepSizer sizer(static_cast<std::size_t>(config_.dataset.batch_size), cards,
                      env_.trainer_id * cards, cards * env_.trainers, !config_.runner.collective);
  auto keys = std::make_shared<dataset::UniqueKeys>();
  const Status st = into->stream->scan(
      keys.get(), [&sizer](const dataset::InstanceBlock& chunk) { sizer.add(chunk); });
  if (!st.ok()) GPUBOX_FAIL("reading ", what, " for its keys: ", st.message());
  into->keys = std::move(keys);
  into->step_sizes = std::make_shared<const PassStepSizes>(sizer.finish());
  if (!share.empty() || env_.trainers == 1) {
    report_read(into->stream->load_stats(), share, what, config_.dataset.max_malformed_share);
  }
}

void Trainer::store_pass_in_order(dataset::InMemoryDataset* data, const std::string& what,
                                  int64_t pass) const {
  // The copy holds the pass twice until it ends: skipped (the same batches, read from the
  // shuffled order) when that would not fit beside what this process holds already.
  const std::size_t bytes = data->memory_bytes();
  const uint64_t headroom = env_.memory_headroom();
  if (bytes > headroom) {
    GPUBOX_LOG(INFO) << what << ": its " << (bytes >> 20) << " MiB of instances stay in the load "
                     << "order (copying them in the shuffled order needs that much again, "
                     << (headroom >> 20) << " MiB free)";
    return;
  }
  if (!data->store_in_order()) throw PassStopped(pass, "storing " + what + " in its order");
}

std::shared_ptr<const PassStepSizes> Trainer::plan_pass_steps(const dataset::InMemoryDataset& data,
                                                              std::size_t batch) const {
  const int cards = state_->cards.num_local_cards();
  return state_->step_plans->plan(
      data, batch, cards, env_.trainer_id * cards, cards * env_.trainers,
      /*per_owner=*/!config_.runner.collective, std::max(1, config_.dataset.thread_num));
}

}  // namespace gpubox::trainer
