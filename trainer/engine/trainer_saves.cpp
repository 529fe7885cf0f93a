// Trainer's saves and loads, and what the trainers of a job agree on before they start
// (trainer.hpp).
#include <algorithm>
#include <filesystem>
#include <optional>

#include "common/error.hpp"
#include "table/io/progress_env.hpp"
#include "table/io/save_dir.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/engine/trainer_state.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox::trainer {

using engine_detail::as_int64;
using engine_detail::dense_state_of;
using engine_detail::kLocalTierSaves;

namespace {

// The sparse table's step (adam_bias_correction per_table) counts along the rows' moments, which
// only a checkpoint save keeps: a base or delta save's rows load with m = v = 0, so their step
// starts at 0 with them (restored, every row's first step would be corrected as a late one).
int64_t table_steps_kept(SaveKind mode, int64_t table_steps) {
  return mode == SaveKind::kCheckpoint ? table_steps : 0;
}

}  // namespace

void Trainer::agree_on_start(const std::optional<SavePoint>& resume, const std::string& origin) {
  if (env_.trainers == 1) return;
  // Every trainer starts the same way, else one would load (a collective) while another
  // trains: each trainer's resume point (its manifest's digest; load() checks that the saves
  // agree), 1 for a start from `origin`, 0 from scratch.
  const int64_t start = resume ? as_int64(resume->digest) : origin.empty() ? 0 : 1;
  const std::vector<int64_t> starts = gather_over_job(
      std::vector<int64_t>(static_cast<std::size_t>(num_cards()), start), "how the run starts");
  // Another trainer's load and saves' folder are known here only by what it did (this
  // trainer's own are named: another's runner.model_save_path may differ from this one's).
  auto describe = [&](int64_t how, std::size_t trainer) {
    const bool me = trainer == static_cast<std::size_t>(env_.trainer_id);
    return how == 0   ? std::string("from scratch")
           : how == 1 ? (me && !origin.empty() ? "from " + origin
                                               : std::string("from a save it was given (--load or "
                                                             "runner.model_init_path)"))
                      : "by resuming the save " +
                            (me ? "under " + config_.runner.model_save_path + " "
                                : std::string("under its runner.model_save_path ")) +
                            "whose MODEL_MANIFEST has digest " +
                            table::io::hex64(static_cast<uint64_t>(how));
  };
  const auto cards = static_cast<std::size_t>(num_cards());
  for (std::size_t rank = cards; rank < starts.size(); rank += cards) {
    GPUBOX_EXPECTS(starts[rank] == starts[0], "trainer ", rank / cards, " starts ",
                   describe(starts[rank], rank / cards), ", trainer 0 ", describe(starts[0], 0),
                   ": every trainer must see the same saves (a folder they share) and "
                   "runner.resume, --load and runner.model_init_path alike");
  }
}

std::optional<bool> Trainer::on_any_trainer(bool mine, const char* what) {
  if (env_.trainers == 1) return mine;
  const std::vector<int64_t> all =
      gather_over_job(std::vector<int64_t>(static_cast<std::size_t>(num_cards()), mine), what);
  return std::any_of(all.begin(), all.end(), [](int64_t v) { return v != 0; });
}

std::vector<int64_t> Trainer::gather_over_job(const std::vector<int64_t>& per_card,
                                              const char* what) {
  State& s = *state_;
  GPUBOX_EXPECTS(per_card.size() == static_cast<std::size_t>(s.cards.num_local_cards()),
                 "gather_over_job: one value per card");
  std::vector<int64_t> gathered;
  s.cards.run_on_cards(
      [&](device::Card& card) {
        comm::Communicator& comm = s.group->at(card.local_index());
        const device::Stream& stream = card.stream();
        auto all = card.make_buffer<int64_t>(static_cast<std::size_t>(comm.size()));
        auto mine = device::to_device(std::vector<int64_t>{per_card[card.local_index()]},
                                      card.memory(), stream);
        comm.all_gather(mine.data(), all.data(), 1, stream);
        comm.synchronize(stream, what);
        if (card.local_index() == 0) gathered = device::to_host(all);
      },
      [&](const std::string& why) { s.group->abort(why); });
  return gathered;
}

void Trainer::on_trainer_zero(const std::function<void()>& part, const std::string& what,
                              const std::string& waited) {
  State& s = *state_;
  auto* servers = dynamic_cast<table::server::RemoteHostTier*>(s.host.get());
  const bool shown = env_.trainers > 1 && servers != nullptr;
  // The job's nonce, drawn by trainer 0, before its first part (every trainer counts its parts
  // alike, so every trainer gathers it here together): an earlier job's table on the servers is
  // not this job's.
  if (shown && trainer_zero_parts_.job == 0) {
    const int64_t drawn = env_.trainer_id == 0 ? static_cast<int64_t>(draw_trainer_zero_job()) : 0;
    trainer_zero_parts_.job = static_cast<uint64_t>(
        gather_over_job(std::vector<int64_t>(static_cast<std::size_t>(num_cards()), drawn),
                        "trainer 0's nonce of the job")
            .at(0));
  }
  const TrainerZeroPart number = trainer_zero_parts_.next();
  const double collective_s = config_.runner.collective_timeout_s;
  const double server_s = config_.host_tier.remote.deadline_s;
  // The others wait outside the meeting's collective (whose timeout cannot be moved on) while
  // trainer 0's part moves.
  if (shown && env_.trainer_id != 0) {
    wait_for_trainer_zero(
        *servers, TrainerZeroWait::of(number, waited, collective_s, server_s, kTrainerZeroLog,
                                      [&s] { return s.watch != nullptr ? s.watch->lost() : ""; }));
  }
  // Only trainer 0's outcome counts: a restart another trainer's client holds is agreed at its
  // next phase.
  agree_on_restarts(
      [&] {
        if (env_.trainer_id != 0) return;
        std::optional<TrainerZeroWork> work;
        if (shown) {
          work.emplace(*servers, trainer_zero_publishes_, number,
                       TrainerZeroWork::interval_for(collective_s),
                       TrainerZeroWork::call_deadline_for(collective_s, server_s),
                       TrainerZeroWork::end_bound_for(collective_s, server_s),
                       [&s] { return s.watch != nullptr ? s.watch->lost() : ""; });
        }
        part();
      },
      what, /*held_counts=*/false);
}

void Trainer::save(const std::string& dir) {
  State& s = *state_;
  // Every trainer writes its cards' dirty rows back before any server saves.
  agree_on_restarts([&] { s.card_tier->sync(); }, "writing its rows back for the save " + dir);
  if (env_.trainers == 1) {
    write_save(dir);
    return;
  }
  GPUBOX_EXPECTS(host_is_remote(*s.host) || config_.runner.collective, "saving ", dir,
                 kLocalTierSaves);
  // The job meets (every write-back done) and checks that the dense half trainer 0 writes is
  // every card's.
  std::vector<int64_t> digests;
  for (auto& worker : s.workers)
    digests.push_back(as_int64(dense_state_of(*worker, *s.card_tier).digest()));
  const std::vector<int64_t> all = gather_over_job(digests, "the save's dense digests");
  const auto cards = static_cast<std::size_t>(s.cards.num_local_cards());
  for (std::size_t rank = 1; rank < all.size(); ++rank) {
    GPUBOX_EXPECTS(all[rank] == all[0], "saving ", dir,
                   ": the dense parameters or their "
                   "optimizer state of card rank ",
                   rank, " (trainer ", rank / cards, ", card ", rank % cards,
                   ") differ from card rank 0's (digests ",
                   table::io::hex64(static_cast<uint64_t>(all[rank])), " and ",
                   table::io::hex64(static_cast<uint64_t>(all[0])),
                   "): the trainers' dense updates diverged; the save would keep one of them");
  }
  on_trainer_zero([&] { write_save(dir); }, "writing the save " + dir, "to write the save " + dir);
}

void Trainer::write_save(const std::string& dir) {
  State& s = *state_;
  std::filesystem::create_directories(dir);
  // Its local writes (the model manifest, the dense half) move the part the other trainers wait
  // for (on_trainer_zero), as the servers' SAVE does: counted in the servers' client.
  auto* servers = dynamic_cast<table::server::RemoteHostTier*>(s.host.get());
  std::optional<table::io::ProgressEnv> shown;
  table::io::FileEnv* local = table::io::FileEnv::posix();
  if (servers != nullptr) local = &shown.emplace(local, &servers->local_work());
  // Explicit saves (gpubox_train --load's counterpart, tests) write base rows when the config
  // says none.
  // A model manifest is written last (checkpoint.hpp): until then the folder holds no save.
  const SaveKind mode = s.lineage->begin_save(
      dir, config_.runner.save_mode == SaveKind::kNone ? SaveKind::kBase : config_.runner.save_mode,
      local);
  // Named absolutely, as a resume loads it (checkpoint.hpp, sparse_half_dir).
  throw_if_error(s.host->save(sparse_half_dir(dir), mode)
                     .with_context("saving the sparse table under " + dir));
  // Every card holds the same dense parameters and optimizer state: save card 0's.
  DenseState dense = dense_state_of(*s.workers[0], *s.card_tier);
  dense.table_steps = table_steps_kept(mode, dense.table_steps);
  const uint64_t dense_digest = save_dense_half(dir, dense, local);
  s.lineage->commit_save(dir, pass_id_, mode, saved_sparse_digests(*s.host, dir), dense_digest,
                         s.workers[0]->model().precision(), local);
}

void Trainer::load(const std::string& dir) {
  load_located([&] { return dir; }, "the save " + dir);
}

std::string Trainer::load_located(const std::function<std::string()>& locate,
                                  const std::string& what) {
  State& s = *state_;
  GPUBOX_EXPECTS(!s.card_tier->in_pass(), "load during a pass");
  const bool remote = host_is_remote(*s.host);
  GPUBOX_EXPECTS(env_.trainers == 1 || remote || config_.runner.collective, "loading ", what,
                 kLocalTierSaves);
  loaded_ = true;
  // Only a save whose halves match its model manifest, with its whole delta chain. Several
  // trainers: one that cannot find or read it, its dense half too (not a folder they share),
  // stops the others now, not after their last meeting here.
  std::string dir;
  RestorePlan plan;
  DenseState dense;
  agree_on_restarts(
      [&] {
        dir = locate();
        plan = plan_restore(dir, !remote);
        const table::io::ModelManifest& saved = plan.save().manifest;
        throw_if_error(check_saved_dense_switches(saved.model_keys, config_, dir));
        throw_if_error(check_saved_network(saved.model_keys, saved.job, config_, dir));
        note_saved_precision(saved.model_keys, config_, dir);
        // One trainer reads the dense half after the sparse one, whose load names a save of
        // other slot widths (the dense half would only say that its size differs).
        if (env_.trainers > 1) dense = read_dense(dir, plan.save());
      },
      "reading " + what, /*count_held_restarts=*/false);
  if (env_.trainers == 1) {
    restore_sparse(*s.host, plan);
    dense = read_dense(dir, plan.save());
  } else {
    agree_on_save_digest(dir, plan.save());
    if (remote) {
      const std::string into = "the sparse half of " + dir + " into the servers";
      on_trainer_zero([&] { restore_sparse(*s.host, plan); }, "loading " + into, "to load " + into);
    } else {
      restore_sparse(*s.host, plan);  // Collective: each trainer's host tier holds the table
    }
  }
  put_dense(dense, dir, plan.save().manifest.mode);
  s.lineage->restored(plan, pass_id_);
  s.card_tier->clear();
  return dir;
}

void Trainer::shrink(int64_t pass) {
  State& s = *state_;
  const std::string after = "after pass " + std::to_string(pass);
  settle();
  // No card holds a row the shrink may delete (it would come back at its write-back), nor does
  // a pass staged ahead hold rows read before it.
  agree_on_restarts([&] { s.card_tier->sync(); }, "writing its rows back for the shrink " + after);
  if (s.pipeline) s.pipeline->clear();
  s.card_tier->clear();
  if (env_.trainers == 1 || !host_is_remote(*s.host)) {
    agree_on_restarts([&] { shrink_logged(*s.host, pass); }, "shrinking the table " + after);
    return;
  }
  on_trainer_zero([&] { shrink_logged(*s.host, pass); }, "shrinking the servers' tables " + after,
                  "to shrink the servers' tables " + after);
}

void Trainer::agree_on_save_digest(const std::string& dir, const SavePoint& save) {
  State& s = *state_;
  // Every trainer loads the same save (its manifest's digest; the folder's name may differ
  // between machines), and no trainer pulls rows before the servers hold it.
  const std::vector<int64_t> all = gather_over_job(
      std::vector<int64_t>(static_cast<std::size_t>(num_cards()), as_int64(save.digest)),
      "the save each trainer loads");
  const auto cards = static_cast<std::size_t>(s.cards.num_local_cards());
  for (std::size_t rank = cards; rank < all.size(); rank += cards) {
    GPUBOX_EXPECTS(all[rank] == all[0], "loading ", dir, ": trainer ", rank / cards,
                   " loads a save whose MODEL_MANIFEST has digest ",
                   table::io::hex64(static_cast<uint64_t>(all[rank])), ", trainer 0 one with ",
                   table::io::hex64(static_cast<uint64_t>(all[0])),
                   ": every trainer must see the same save (a shared folder)");
  }
}

DenseState Trainer::read_dense(const std::string& dir, const SavePoint& save) const {
  const DenseModel& model = state_->workers[0]->model();
  return load_dense_half(dir, model.parameters().size(), network_note(save, config_),
                         model.undropped_bias());
}

void Trainer::put_dense(const DenseState& dense, const std::string& dir, SaveKind mode) {
  State& s = *state_;
  for (auto& worker : s.workers) {
    device::Card& card = worker->card();
    card.activate();
    worker->model().parameters().set_values(dense.values);
    dense.restore_optimizer(worker->optimizer(), card.stream(), dir);
    // Dropout's masks go on from the save's step rather than drawing the first steps' again.
    worker->model().set_dropout_steps(static_cast<uint64_t>(dense.steps));
    s.card_tier->heter_comm(card.local_index())
        .set_table_steps(table_steps_kept(mode, dense.table_steps));
  }
}

}  // namespace gpubox::trainer
