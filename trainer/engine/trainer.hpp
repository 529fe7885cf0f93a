// Trainer: the pass loop of gpubox_train (the gpubox schedule). Owns the cards, the
// communicator group, the host tier (table::make_host_tier: in-process SparseTable, or the
// gpubox_server client when servers are given), the card tier's owner (tier_owner::CardTier:
// stores, HeterComms, pass manager) and one CardWorker (dense model, optimizer, metrics) per card.
//
// A pass: load the pass's files into an InMemoryDataset -> shuffle -> begin_pass(unique keys and
// their slots) -> every card trains its batches (one host thread per card) -> end_pass (dirty rows
// back to the host tier) -> metrics all-reduced over the cards -> pass line and one JSON line in
// runner.metrics_path (with the pass manager's counters and the steady steps' device counts per
// card per step: host_syncs_per_step, ...) -> optional test evaluation and save. In train(),
// with runner.prefetch_passes > 0, the next passes are read and their rows staged while a pass
// trains (PassPipeline, pass_pipeline.hpp): same results, a shorter wait at the pass boundary.
//
// A server restart (checkpoint.hpp): the run goes back to its last save, a pass open on the
// cards dropped and trained again (trainer_recovery.cpp). One trainer does so where it found the
// restart; the trainers of a job meet after every phase that calls the servers and go back to
// trainer 0's last save together.
//
// Thread-safety: one controlling thread calls the public methods; card threads live inside them.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/pass/pass_types.hpp"
#include "table/host_tier.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/engine/step_sizes.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox {
namespace dataset {
class InMemoryDataset;
class QueueDataset;
}  // namespace dataset
namespace device {
class Card;
}
namespace tier_owner {
class CardTier;
}
namespace trainer {

struct DenseState;
class PassProgress;
struct PreparedPass;
class PassPipeline;
struct StepPlan;

// Where trainer 0's log is, named where the others fail because of it (why it refused to go back
// to a save, its part of a meeting that stopped moving).
inline constexpr const char* kTrainerZeroLog = "log/worker.0.log under scripts/run_gpubox.sh";

// A server restart the trainers of a job agreed on at a meeting (Trainer::agree_on_restarts):
// every trainer throws one, whatever its own phase threw, so that each reaches the epoch loop's
// recover() (it catches Error) and goes back to trainer 0's last save with the others. One
// trainer throws one for a restart it found in a phase's failure. `failure`: what else failed
// on this trainer in that phase (`phase`): any failure naming no restarted server (a device
// fault, another server down; SaveLineage::names_a_restart), "" when nothing did. The message
// holds it, and so does the error of a recovery that is refused or fails, or of a pass stopped
// as asked (Trainer::recover, stop_pass), so that the user sees both. With several cards,
// every card's failure that names no restarted server (device::CardsFailed), each distinct one
// once with its cards, the first four then how many cards more ("card 1: ...; cards 2, 3: ...");
// a phase whose card error was raised again above run_on_cards as a plain Error shows its first
// card's alone.
class AgreedRestart : public Error {
 public:
  explicit AgreedRestart(const std::string& message, std::string failure = "",
                         std::string phase = "", std::string other_failed = "")
      : Error(message),
        failure_(std::move(failure)),
        phase_(std::move(phase)),
        other_failed_(std::move(other_failed)) {}
  const std::string& failure() const { return failure_; }
  // "trainer k also failed there (its log …)": another trainer of the job failed beside the
  // restart in that phase (this one did not), "" otherwise. The message holds it.
  const std::string& other_failed() const { return other_failed_; }
  // "this trainer also failed <phase>: <failure>", "" when nothing else failed.
  std::string own_failure() const { return failure_.empty() ? "" : also_failed(phase_, failure_); }
  // The one wording of a failure found beside a restart: `phase` is "there" in a message that
  // starts with the phase, else the phase itself ("at the end of pass 1").
  static std::string also_failed(const std::string& phase, const std::string& failure) {
    return "this trainer also failed " + phase + ": " + failure;
  }

 private:
  std::string failure_;
  std::string phase_;
  std::string other_failed_;
};

// A pass stopped as asked whose write-back found a server restart beside another failure of
// this trainer or of another of the job (Trainer::stop_pass): the run of every trainer ends with
// it, not going back to the save.
class StoppedPassFailed : public Error {
 public:
  using Error::Error;
};

class Trainer final : public Schedule {
 public:
  Trainer(TrainerConfig config, TrainerEnv env);
  ~Trainer() override;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Every pass of the config: one per epoch over runner.train_data_dir, or, with
  // runner.pass_dirs, one per folder (each epoch goes over the list). Starts from
  // runner.model_init_path when set and no model was loaded yet (load()). Prints a pass line per
  // pass and appends it to runner.metrics_path, PaddleRec's two lines per epoch ("Epoch: E, using
  // time: ..." and "epoch: E done, ..."), evaluates runner.test_data_dir after each epoch and
  // saves under runner.model_save_path/<pass> when set. Passes and epochs count from 0, as in
  // PaddleRec (one pass per epoch: save <pass> is epoch <pass>'s). Starts from the save
  // `start_from` (gpubox_train --load; "" = from scratch), unless runner.resume finds a save of
  // this run under model_save_path: then from the pass after it (checkpoint.hpp). Returns the
  // reports of the passes it trained.
  // `hooks`: what the caller hears of the run and how it stops it (epoch_loop.hpp).
  std::vector<PassReport> train(const std::string& start_from = "", const RunHooks& hooks = {});
  // Trains one pass over `files` (pass ids count up from 0), read now (no prefetch); with several
  // trainers, over this trainer's share of them (collective: every trainer calls it with the
  // same list).
  PassReport train_pass(const std::vector<std::string>& files);
  // Evaluates `files` with the current model (no update); with several trainers each evaluates
  // its share, the metrics are the job's and the predictions (when kept) this trainer's share's.
  EvalResult evaluate(const std::vector<std::string>& files, bool keep_predictions) override;

  // Saves the host tier (runner.save_mode; `checkpoint` keeps optimizer state) under dir/sparse
  // and the dense parameters with their optimizer state under dir/dense, then the model
  // manifest naming both (table/io/model_manifest.hpp).
  //
  // Several trainers (collective: every trainer calls it with the same `dir`; servers only, the
  // in-process host tier is refused): every trainer writes its cards' dirty rows back, the job
  // meets (a barrier with runner.collective_timeout_s) and checks that every card holds the same
  // dense parameters and optimizer state (a digest per card, all-gathered), trainer 0 alone
  // sends SAVE to the servers and writes the dense half and the manifest, and the job meets
  // again: no trainer trains on before the save is complete, and all fail when it failed (a
  // server restart found there is agreed: the epoch loop's recover() goes back with all).
  void save(const std::string& dir) override;
  // Loads a save made by save(), once its halves are checked against its model manifest (a
  // delta: its chain from the base): host tier, dense parameters and optimizer state on every
  // card; the card tier is emptied (it refills at the next begin_pass). Throws naming what is
  // missing or differs.
  //
  // Several trainers (collective, servers only): every trainer checks the save and that all
  // load the same one (its manifest digest, all-gathered), trainer 0 alone sends LOAD to the
  // servers, the job meets after it (all fail when it failed), then every trainer puts the
  // dense half it read with the check onto its cards.
  void load(const std::string& dir) override;
  // The shrink after pass `pass` (runner.shrink_every): every trainer writes its cards' dirty
  // rows back and empties its cards and the passes staged ahead (rows read before the shrink),
  // then the host tier shrinks: trainer 0 alone for servers (on_trainer_zero: the others wait,
  // by its progress), each trainer its own in-process table. The next pass pulls all its rows.
  void shrink(int64_t pass) override;

  const TrainerConfig& config() const { return config_; }
  table::HostTier& host_tier() override;
  // The card tier's owner (stores, HeterComms, pass manager), for tests and tools that look in.
  tier_owner::CardTier& card_tier();
  int num_cards() const;
  // Dense parameters of one card (host copy): every card holds the same values.
  std::vector<float> dense_values(int card) const;
  int64_t passes_done() const override { return pass_id_; }

  // Schedule (schedule.hpp): what the epoch loop (train()) drives.
  const TrainerEnv& env() const override { return env_; }
  SaveLineage& lineage() override;
  bool prints() const override { return env_.trainer_id == 0; }  // the job's lines, once
  int local_cards() const override;
  void set_passes_done(int64_t passes) override { pass_id_ = passes; }
  void agree_on_start(const std::optional<SavePoint>& resume, const std::string& origin) override;
  std::optional<bool> on_any_trainer(bool mine, const char* what) override;
  void plan_pass_cache(int64_t loads) override;
  const dataset::PassDataCache* pass_cache() const override;
  int64_t step_plans_served() const override;
  void begin_run(const RunPlan& plan) override;
  void end_run() noexcept override;
  PassReport train_scheduled_pass(const RunPlan& plan, int64_t pass) override;
  void accumulate_pass_metrics(std::vector<double>* sums) const override;
  std::size_t metric_buckets() const override;
  void settle() override;
  std::optional<int64_t> recover(const Error& error, int64_t pass) override;
  void set_step_hooks(const StepHooks& hooks) override { step_hooks_ = hooks; }
  // Test hook (off by default): each scheduled pass, before its steps, waits until the next
  // pass's staging is planned and fetched (its pipeline job ended), so that the next pass's card
  // work between the steps always has its keys and rows (pass_prefetch_test); without it, when
  // the plan comes depends on the machine.
  void wait_for_next_staging_before_steps(bool wait) { wait_for_next_staging_ = wait; }
  // Test hook (none by default): runs at the start of every phase a job meets after
  // (agree_on_restarts; one trainer's too, whose meeting is the phase alone), inside it, given
  // the phase's `where`: a test restarts a server there, or fails the phase
  // (gpubox_job_recovery_test, gpubox_trainer_recovery_test).
  void set_meeting_hook(std::function<void(const std::string& where)> hook) {
    meeting_hook_ = std::move(hook);
  }

 private:
  struct State;
  // `what` the files are: pass `pass`'s data, or (pass -1) an evaluation's. One trainer alone
  // stops reading when the stop flag is set, throwing PassStopped.
  std::unique_ptr<dataset::InMemoryDataset> load_dataset(const std::vector<std::string>& files,
                                                         const std::string& what,
                                                         int64_t pass) const;
  // Pass `pass` over `files`: read and shuffled with that pass's seed (thread-safe: the pass
  // pipeline calls it from its threads).
  void read_pass(const std::vector<std::string>& files, int64_t pass, PreparedPass* into) const;
  // A shuffled pass's InMemoryDataset::store_in_order, skipped (logged) when a second copy of
  // its instances exceeds env_.memory_headroom(); a stop while copying throws PassStopped.
  void store_pass_in_order(dataset::InMemoryDataset* data, const std::string& what,
                           int64_t pass) const;
  // begin_pass (with the rows staged ahead, if any) -> steps -> end_pass of a read pass;
  // `begun` (optional) runs after begin_pass, before the steps; `next_keys` (optional) gives the
  // sorted keys of the pass that trains right after this one, or null: end_pass keeps their
  // rows dirty on the cards (PassManager::end_pass).
  PassReport run_pass(
      PreparedPass& prepared, const std::function<void()>& begun = {},
      const std::function<std::shared_ptr<const std::vector<uint64_t>>()>& next_keys = {});
  // run_pass's steps on every card (one host thread per card) and what they tell the report.
  struct StepTally;
  StepTally train_steps(const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                        int64_t pass, const PassStepSizes* sizes);
  // One card's steps of `plan` in train_steps (on the card's host thread), each counted into the
  // tally's entries of the card (`every_step`, `between_steps`: the card's own sums) with the next
  // pass's card work after it; card 0 reports `progress` (null on the others). Ends after the
  // last step, or after the step whose stop votes were read (card 0 notes it in the tally).
  void train_card_steps(device::Card& card, const StepPlan& plan,
                        const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                        int64_t pass, PassProgress* progress, StepTally* tally,
                        device::DeviceCounts* every_step, device::DeviceCounts* between_steps);
  // train_steps with a streamed pass's reading around it: started, its failure the pass's error,
  // finished; a stop asked ends the pass there (stop_pass).
  StepTally train_pass_steps(const dataset::InMemoryDataset* ds, dataset::QueueDataset* stream,
                             int64_t pass, const PassStepSizes* sizes);
  // Gives every card's unused pool memory above its pre-warmed size back (after a pass).
  void trim_pools();
  // The sizes of every step of `data` in batches of `batch` on this trainer's cards.
  std::shared_ptr<const PassStepSizes> plan_pass_steps(const dataset::InMemoryDataset& data,
                                                       std::size_t batch) const;
  void append_step_counts(const StepTally& tally, PassReport* report) const;
  // A stop vote ended pass `pass` after tally.stopped_after steps: the stream (if any) aborted,
  // the card tier's pass ended (several trainers meet after it: a server restart found there
  // ends each one stopped too), then PassStopped thrown.
  [[noreturn]] void stop_pass(dataset::QueueDataset* stream, int64_t pass, const StepTally& tally);
  // save() and load() of one trainer's part: trainer 0's, or the only trainer's.
  void write_save(const std::string& dir);
  // load() of the save whose folder `locate` finds (in load()'s first phase, so that a trainer
  // that cannot find it stops the others at once; `what` names it until then). Returns the
  // folder.
  std::string load_located(const std::function<std::string()>& locate, const std::string& what);
  // Several trainers: the job checks that every trainer loads the same save `save` (under `dir`
  // here): a gather of its manifest's digest.
  void agree_on_save_digest(const std::string& dir, const SavePoint& save);
  // The dense half of the save `dir` (`save`: its manifest), checked against the model; then
  // put_dense puts it onto every card (`mode`: the save's kind).
  DenseState read_dense(const std::string& dir, const SavePoint& save) const;
  void put_dense(const DenseState& dense, const std::string& dir, table::SaveKind mode);
  // Several trainers: every card of the job contributes its value of `per_card` (one per local
  // card) and receives every card's, in global card rank order. A job-wide barrier (collective,
  // bounded by runner.collective_timeout_s); `what` names it in errors.
  std::vector<int64_t> gather_over_job(const std::vector<int64_t>& per_card, const char* what);
  // Trainer 0 runs `part` (the job's single writer), then the job meets: the other trainers
  // fail, naming `what` ("writing the save ..."), when it threw; trainer 0 throws its error
  // again. A server restart it found is agreed (agree_on_restarts). With servers, the others
  // wait for the part before the meeting, bounded by its progress (trainer_zero_work.hpp): a
  // part longer than runner.collective_timeout_s that moves is waited for (`waited` names it
  // there: "to write the save ...").
  void on_trainer_zero(const std::function<void()>& part, const std::string& what,
                       const std::string& waited);
  // Several trainers: runs `phase` (host-tier calls, no collective after the last of them), then
  // the job meets (a gather) and every trainer hears whether any of them failed in it, or found
  // a server restart (its phase's failure, or, with `count_held_restarts`, a restart its client
  // holds: the peer watch's pings find them). Then every trainer throws: when one failed
  // otherwise, its own error or one naming `where` and the first that failed; else, when one
  // found a restart, an AgreedRestart (recover() goes back with the others), whatever its own
  // phase threw. So a trainer that meets a failure there never leaves the others waiting at a
  // later collective. One trainer, a meeting of one: `phase` alone (after the meeting hook); a
  // failure in which it finds a server restart (asking every server who it is only with
  // `count_held_restarts`) becomes an AgreedRestart, "`where`: " and the failure's message (any
  // failure naming no restarted server, a device fault or another server down, follows the
  // restarts found, "this trainer also failed there: ..."); any other is thrown as it is. `where`
  // reads after "failed" ("at the end of pass 3", "writing the save ...").
  void agree_on_restarts(const std::function<void()>& phase, const std::string& where,
                         bool count_held_restarts = true);
  // CardTier::begin_pass as a phase of agree_on_restarts (`where`); several trainers: its
  // collective key exchange first, outside the phase, so that a trainer that fails before the
  // exchange never meets the others' exchange with the meeting's gather.
  pass::PassStats begin_pass_agreed(const std::vector<uint64_t>& keys,
                                    const std::vector<int32_t>& slots,
                                    const pass::StagedRows* staged, pass::PassAccess access,
                                    const std::string& where);
  // Whether this trainer's client holds a server restart; after a failed call (`failed`) every
  // server is asked who it is first, so the failure is classified with every restart known.
  bool restart_found(bool failed);
  // Several trainers: recover() of an AgreedRestart: every trainer goes back to the save trainer
  // 0 chooses (agree_on_save) and reloads it with the others, again when a server restarts
  // during the reload.
  // `beside`: the failure found beside the restart (AgreedRestart::own_failure), named in a
  // refusal (agree_on_save).
  std::optional<int64_t> recover_together(const Error& error, int64_t pass,
                                          const std::string& beside);
  // recover() but for the error it throws: a recovery alone or together (recover_together).
  std::optional<int64_t> recover_unannotated(const Error& error, int64_t pass);
  // Before a save is reloaded into the servers: the passes read and staged ahead dropped, the
  // open pass (if any) given up unwritten and the cards emptied (CardTier::abandon_pass). No
  // card thread may run.
  void drop_card_work();
  // The open pass dropped, every restart accepted; trainer 0 chooses the save (or refuses) and
  // tells the others (a gather): returns that save's run pass (and, on trainer 0, its folder),
  // or throws, on every trainer, its reason.
  // `beside` follows the restarts in what it names (recover_together).
  SaveLineage::Recovery agree_on_save(int64_t pass, const std::string& beside);

  TrainerConfig config_;
  TrainerEnv env_;
  std::unique_ptr<State> state_;
  int64_t pass_id_ = 0;
  // What a run's caller hears and asks within a pass (set_step_hooks).
  StepHooks step_hooks_;
  bool loaded_ = false;  // a save was loaded (load()): runner.model_init_path is not needed
  bool wait_for_next_staging_ = false;                    // wait_for_next_staging_before_steps
  std::function<void(const std::string&)> meeting_hook_;  // set_meeting_hook
  TrainerZeroParts trainer_zero_parts_;          // on_trainer_zero's parts (alike on every trainer)
  TrainerZeroPublishes trainer_zero_publishes_;  // trainer 0's: its parts shown in order
};

// Adds a pass's per-step device counts to its report (per card per step, averaged over the
// cards and the `steps` steady steps counted in `per_card`): steady_steps, host_syncs_per_step,
// pipeline_waits_per_step, allocations_per_step, frees_per_step, pinned_allocations_per_step,
// pageable_copies_per_step, pinned_copies_per_step, launches_per_step (=
// launches_outside_graph_per_step), collectives_per_step, card_copies_per_step (all outside step
// graphs), graph_launches_per_step, graph_nodes_per_step, graph_captures_per_step (step graphs
// captured, not replayed: 0 once a step's shape and buffers stay); and
// max_pipeline_waits_in_a_step, `max_pipeline_waits`: the most pipeline waits one card's steady
// step counted. Nothing when steps == 0.
void append_step_counts(const std::vector<device::DeviceCounts>& per_card, std::size_t steps,
                        uint64_t max_pipeline_waits, PassReport* report);
// The same figures of an evaluation's `steps` steps past its warm-up (EvalResult::extra), each
// name prefixed "eval_" (eval_steady_steps, eval_launches_per_step, eval_graph_nodes_per_step...).
void append_eval_step_counts(const std::vector<device::DeviceCounts>& per_card, std::size_t steps,
                             uint64_t max_pipeline_waits,
                             std::vector<std::pair<std::string, double>>* extra);

}  // namespace trainer
}  // namespace gpubox
