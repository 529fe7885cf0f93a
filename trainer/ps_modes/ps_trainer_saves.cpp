// PsTrainer's saves and loads: trainer 0 writes or restores the servers' halves while the others
// wait at a server barrier (on_trainer_zero); every trainer adopts the dense half.
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/io/progress_env.hpp"
#include "table/server/ps_protocol.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_trainer_state.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/dense_state.hpp"

namespace gpubox::trainer::ps_modes {

using table::server::DenseAction;

void PsTrainer::save(const std::string& dir) {
  // Every trainer's updates are on the servers before they save, and none lands until the save
  // is written.
  const std::string pass = std::to_string(pass_id_);  // the passes done: the save's pass + 1
  meet("ps/save/" + pass,
       "to end pass " + std::to_string(pass_id_ - 1) + " before the save " + dir);
  on_trainer_zero([&] { write_save(dir); }, "ps/saved/" + pass, "to write the save " + dir);
}

void PsTrainer::shrink(int64_t pass) {
  // As a save: every trainer's updates are on the servers first, and none lands until the
  // shrink is done.
  const std::string done = std::to_string(pass_id_);
  const std::string after = "after pass " + std::to_string(pass);
  meet("ps/shrink/" + done, "to end pass " + std::to_string(pass) + " before the shrink");
  on_trainer_zero([&] { shrink_logged(*state_->servers, pass); }, "ps/shrunk/" + done,
                  "to shrink the servers' tables " + after);
  // Geo: every thread's local rows are the servers' as they were before the shrink (a deleted
  // row would be trained from its stale copy and its delta recreate it as initial values plus
  // delta, decayed show and click read undecayed), so they are dropped and pulled again. Every
  // trainer's threads are idle here (the shrink is done), and the pass's end synced every row.
  for (auto& worker : state_->workers) worker->forget_rows();
}

void PsTrainer::write_save(const std::string& dir) {
  State& s = *state_;
  std::filesystem::create_directories(dir);
  // Its local writes (the model manifest, the dense half) move the part the other trainers wait
  // for (on_trainer_zero), as the servers' SAVE and the dense table's read do.
  table::io::ProgressEnv local(table::io::FileEnv::posix(), &s.servers->local_work());
  // The model manifest is written last (checkpoint.hpp): until then the folder holds no save.
  const SaveKind mode = s.lineage->begin_save(
      dir, config_.runner.save_mode == SaveKind::kNone ? SaveKind::kBase : config_.runner.save_mode,
      &local);
  // Named absolutely, as a resume loads it (checkpoint.hpp, sparse_half_dir).
  throw_if_error(s.servers->save(sparse_half_dir(dir), mode)
                     .with_context("saving the sparse table under " + dir));
  // Thread 0's optimizer state, with the servers' dense values (what every thread adopts).
  PsWorker& worker = *s.workers[0];
  worker.card().activate();
  DenseState dense = DenseState::of(worker.model(), worker.optimizer(), worker.card().stream());
  throw_if_error(
      s.servers->dense(DenseAction::kRead, kDenseTableName, &dense.values, dense_call_of_part())
          .with_context("reading the servers' dense table for the save " + dir));
  const uint64_t dense_digest = save_dense_half(dir, dense, &local);
  s.lineage->commit_save(dir, pass_id_, mode, saved_sparse_digests(*s.servers, dir), dense_digest,
                         worker.model().precision(), &local);
  GPUBOX_LOG(INFO) << "saved " << dir << " (pass " << pass_id_ - 1 << ")";
}

void PsTrainer::load(const std::string& dir) {
  State& s = *state_;
  // Only a save whose halves match its model manifest, with its whole delta chain.
  const RestorePlan plan = plan_restore(dir, false);
  const table::io::ModelManifest& saved = plan.save().manifest;
  throw_if_error(check_saved_dense_switches(saved.model_keys, config_, dir));
  throw_if_error(check_saved_network(saved.model_keys, saved.job, config_, dir));
  note_saved_precision(saved.model_keys, config_, dir);
  const DenseModel& model = s.workers[0]->model();
  const DenseState dense = load_dense_half(
      dir, model.parameters().size(), network_note(plan.save(), config_), model.undropped_bias());
  loaded_ = true;
  on_trainer_zero(
      [&] {
        restore_sparse(*s.servers, plan);
        std::vector<float> values = dense.values;
        throw_if_error(
            s.servers->dense(DenseAction::kWrite, kDenseTableName, &values, dense_call_of_part())
                .with_context("writing the dense half of " + dir + " to the servers"));
      },
      "ps/load", "to load " + dir + " into the servers");
  for (auto& worker : s.workers) {
    device::Card& card = worker->card();
    card.activate();
    dense.restore_optimizer(worker->optimizer(), card.stream(), dir);
    worker->model().set_dropout_steps(static_cast<uint64_t>(dense.steps));  // masks go on
    card.stream().synchronize();
    worker->sync_dense(0.0f);  // the dense half, from the servers' table
  }
  s.lineage->restored(plan, pass_id_);
}

}  // namespace gpubox::trainer::ps_modes
