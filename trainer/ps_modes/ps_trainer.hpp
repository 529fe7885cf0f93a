// PsTrainer: the pass loop of the parameter-server modes (runner.sync_mode async | sync | geo;
// ARCHITECTURE §7), PaddleRec's CPU ParameterServer schedules on GPUBox's parts. The sparse rows
// and a dense table live on the gpubox_server processes the launcher names
// (PADDLE_PSERVERS_IP_PORT_LIST, scripts/launch.sh); a trainer is runner.thread_num training
// threads (PsWorker, each on its own card: on the cpu backend an execution context), each
// taking its own batches of the trainer's files (with runner.split_file_list, a contiguous block
// of them, as PaddleRec's get_file_shard and the gpubox mode split them; else each reads them all).
//
//   async: every thread steps without waiting for anyone: its batch's rows pulled, gradients
//          pushed (the servers apply the rule on arrival), both off the training thread, the
//          next batch's rows pulled while a step computes (the thread reads one batch ahead;
//          PsWorker, its bound there); every runner.dense_sync_steps steps its dense change is
//          added to the servers' dense table and the sum adopted, off the training thread and a
//          window behind (PsWorker::exchange_dense, its staleness bound there), and in full at
//          the end of the pass.
//   sync:  the same, and every step ends at a barrier of all trainers (one per step, thread 0
//          of each trainer at the servers, the threads of a trainer among themselves), so each
//          step's updates of every trainer are applied before anyone's next pull. The sparse
//          push is the job's: a key's gradients summed over the trainer's threads
//          (MergedPushes) and, with several trainers, over the trainers by the servers, which
//          apply its rule once the step's parts all arrived (table/server/ps_step_sums.hpp). The
//          dense step (runner.dense_sync_steps 1): every thread adds its gradient sums and batch
//          size to a servers' gradient table before the barrier, and after it every thread steps
//          its optimizer on the job's mean gradient, the same step with the same moments on every
//          thread, as the gpubox mode on as many cards (PsWorker::add_gradients); at the pass's
//          end trainer 0's thread 0 writes the dense table, which all adopt behind one more
//          barrier. Over longer windows each thread steps its own copy and the window's changes
//          are added scaled by 1 / (trainers x threads): the servers' dense table moves by the
//          mean of the threads' updates; a pass ending inside a window adds and adopts that
//          window's change behind one more barrier (async and geo push theirs at the end of
//          every pass too), so a save or an evaluation after the pass has it. Trainers with fewer
//          batches take empty steps, so all take the same number. A trainer missing from a barrier
//          for runner.collective_timeout_s ends the job with an error naming it.
//   geo:   every thread trains its local copy of the rows it touches (GeoRows) and its own
//          dense net; every runner.geo_step steps (and at the end of a pass) it pushes both
//          deltas and adopts the merged values.
//
// A job's start: trainer 0 writes the servers' dense table (this job's initial dense net) and
// zeroes the sync tables, whatever an earlier job on the same servers left there (a sync job of
// several trainers: and draws the job's id, under which its steps' parts go to the servers), and
// every trainer adopts the table after the start barrier.
//
// Saves are the gpubox mode's (trainer/schedule/checkpoint.hpp, docs/operations.md,
// "Durability and resume"): after each pass (runner.model_save_path, runner.save_mode), once
// every trainer's updates are on the servers, trainer 0 has every server save its rows (SAVE) and
// writes the dense half (the servers' dense table, with thread 0's optimizer state) and the model
// manifest; the others wait at a barrier, so no update lands during the save. A load (--load,
// runner.model_init_path, runner.resume: auto, --mode infer) is the same in reverse: trainer 0
// loads the sparse half into the servers and writes the dense half into their dense table;
// every thread takes the saved dense optimizer state. So a PS save is loaded by every mode,
// gpubox_serve's export and --mode infer, and a gpubox-mode save (made with as many servers)
// starts a PS run. Geo's per-trainer optimizer state of its local rows is not saved (its rows
// start again from the servers' values).
//
// A server restarted (same port, found by the client's instance-id check) between passes or
// within one is repaired in the run, as the gpubox mode repairs one between passes (recover,
// trainer/schedule/checkpoint.hpp): a PS pass holds nothing the servers do not (every update goes
// to them as it is made), so the pass that found it is trained again from the last complete
// save: the training threads are made again (a thread whose server call failed is unusable), the
// job's tables are written again as at its start (the restarted server lost them), and the save
// is loaded (the servers' rows and dense table, every thread's dense optimizer state), as a
// resume from that save in a new process does. Every server is asked who it is first, so that
// servers restarted together are all reloaded at once; the old threads are dropped before the
// restarts are accepted (none of their calls lands on a server before its reload).
//
// A job of several trainers (async, sync or geo) goes back together (ps_trainer_recovery.cpp): its
// trainers find a restart at different points (or one of them alone), so they agree first, then
// all go back to trainer 0's last complete save. A trainer whose pass failed on a restart does not
// leave the job: it meets the others at the pass's end, where every trainer votes (a table of the
// first server) whether it found one, and goes back when any did (the vote rides on the meeting
// where the trainers agree on a stop, which every pass of several trainers has: it costs one
// read of a small table a pass, and the vote's write, no barrier); a restart found between passes
// (an epoch's evaluation, the last epoch's too) is voted for the next pass, read by every trainer
// at a meeting right after the evaluation (one more barrier an evaluation: Schedule::
// agree_after_evaluation); trainer 0 tells the others when its save found one. A restart of the
// first server, which holds the votes and barriers, needs no vote: every trainer finds it at its
// next call to it. Going back: every trainer drops its threads and accepts the restarts, all
// meet, trainer 0 chooses the save (its lineage: runner.resume, at most 3 a run) and tells the
// others its pass (each loads that save's folder: trainer 0 wrote it), then the job starts again
// and the save is loaded as at a resume (trainer 0 reloads the servers while the others wait), so
// no trainer pushes before the reload is complete; every trainer trains from the pass after it. A
// restart found during that reload goes back again. A trainer that waited out the vote or the
// meeting after an evaluation with a restart known (another one came late) goes to the meeting all
// the same, which waits 3 x runner.collective_timeout_s; one that cannot meet the others (one died,
// or it found only a server that is still down) stops there, as before. In the sync mode the
// trainers also wait for each other at every step's barriers, where those whose step reached the
// restarted server before it restarted would wait for the one whose step failed (the server lost
// the step parts it held): that one comes to the barrier they wait at and tells them there, or at
// their next barrier, for free (SyncBarriers::hold: a mark in the table every arrival adds to),
// so every trainer comes to the pass's vote without waiting out runner.collective_timeout_s; the
// job's next start draws a new sync job id, under which no part of the failed step counts (the
// gpubox mode's own recovery is in trainer/engine). A server that was down when a call failed (no
// restart seen), and any other error, fail the pass as before. Such a job (runner.resume, a save
// folder) checks as it starts that every trainer sees trainer 0's runner.model_save_path.
//
// A trainer of several that fails for good (tell_failure, from the epoch loop) tells the others
// with its heartbeat: their watches report it failed, with what it reported, at their next beat,
// and they stop as for a lost trainer (ps_peer_watch.hpp).
//
// Ctrl-C from Python (StepHooks::stop_flag) stops a pass between two steps, every trainer of
// the job in the same pass, the pass unsaved and the servers holding every applied update
// (PsPassStop); trainer 0's thread 0 reports its progress through the same PassProgress as the
// gpubox mode (PsProgress; both in ps_step_hooks.hpp).
//
// Thread-safety: one controlling thread calls the public methods; training threads live inside.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/timer.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox::dataset {
class InMemoryDataset;
}

namespace gpubox::trainer::ps_modes {

class PsPassStop;
class SyncBarriers;

class PsTrainer final : public Schedule {
 public:
  // Test hook: runs on the trainer's thread at the points where a test orders the trainers of
  // a job (threads of one process), given the point: "meet <name>" as this trainer comes to
  // meeting <name>, "ps/start: read the job's id" after the job start's meeting (in the
  // constructor too), before a sync job's trainer reads the job's id there; on thread 0's
  // (card 0's), "arrive pass p, <what>" and "arrived pass p, <what>" around a sync pass's barrier
  // <what> ("step 3", "step 3's pulls"), and "evaluate" as an evaluation begins there (what it
  // throws is that card's failure).
  using OrderHook = std::function<void(const std::string& point)>;

  // How long the trainers of a job wait for each other to go back to the last save after a
  // server restart, in runner.collective_timeout_s: one for each of the barriers a trainer may
  // have waited out before it found the restart itself (the pass's vote or the meeting after an
  // evaluation, where a trainer that found nothing yet gets too late), and one for the meeting.
  // The watch gives a trainer whose begun flag went with a restarted first server as long, and
  // one more, and runner.peer_timeout_s (PsPeerWatchOptions::after_loss_timeout_s, counted from
  // before that meeting's start): it beats again once it accepts the restart.
  static constexpr double kRecoveryWaits = 3.0;

  // Connects to the servers of `env` (required: the PS modes keep no host tier in-process) and
  // makes one training thread per card: runner.thread_num on the cpu backend, the cards of
  // FLAGS_selected_gpus on cuda. Throws naming the servers when they cannot be reached.
  // `order_hook`: none but in tests.
  PsTrainer(TrainerConfig config, TrainerEnv env, OrderHook order_hook = nullptr);
  ~PsTrainer() override;
  PsTrainer(const PsTrainer&) = delete;
  PsTrainer& operator=(const PsTrainer&) = delete;

  // Every pass of the config (one per epoch over runner.train_data_dir, or one per
  // runner.pass_dirs folder), this trainer's share of each; prints gpubox_train's pass line and
  // PaddleRec's epoch lines, appends to runner.metrics_path, saves after each pass (as the
  // gpubox mode), evaluates runner.test_data_dir after each epoch. Starts from the newest save
  // under runner.model_save_path (runner.resume: auto; with the pass after it), else from
  // `start_from` (--load), else runner.model_init_path, else from scratch; every trainer of
  // the job must start alike. Returns the reports of the passes it trained.
  // `hooks`: what the caller hears of the run and how it stops it (epoch_loop.hpp).
  // Several trainers: every trainer must call it as often; the first call must follow the
  // constructor (the job's start meeting) within runner.collective_timeout_s on every trainer,
  // else the others' watches report that trainer lost ("did not begin training run 1") and end
  // the job. A later call has no such bound (the program's own work between calls may take any
  // time): a trainer that never comes to it is found at the run's first meeting.
  std::vector<PassReport> train(const std::string& start_from = "", const RunHooks& hooks = {});
  // One pass over this trainer's share of `files`.
  PassReport train_pass(const std::vector<std::string>& files);
  // Evaluates `files` (all of them) with the servers' rows and dense table; with
  // `keep_predictions`, also each example's label and prediction in file order.
  EvalResult evaluate(const std::vector<std::string>& files,
                      bool keep_predictions = false) override;
  // Every trainer of the job: saves the servers' rows and dense table into `dir` (see above).
  void save(const std::string& dir) override;
  // Every trainer of the job: the servers and every thread start from save `dir`.
  void load(const std::string& dir) override;
  // Every trainer of the job: after every trainer's updates are on the servers, trainer 0 alone
  // shrinks them (runner.shrink_every) while the others wait, as for a save.
  void shrink(int64_t pass) override;

  int threads() const;
  // Geo: the rows every training thread holds locally, summed (PsWorker::geo_rows).
  std::size_t geo_rows() const;
  // Thread 0's dense parameters (host copy).
  std::vector<float> dense_values() const;
  // Allocations so far of every training thread's steps and dense syncs
  // (PsWorker::step_allocations); a pass's share is its report's pass_step_allocations.
  uint64_t step_allocations() const;

  // Schedule (schedule.hpp): what the epoch loop (train()) drives. Every trainer prints its own
  // lines (its metrics are its threads').
  const TrainerEnv& env() const override { return env_; }
  table::HostTier& host_tier() override;
  SaveLineage& lineage() override;
  bool prints() const override { return true; }
  int local_cards() const override;
  int64_t passes_done() const override { return pass_id_; }
  void set_passes_done(int64_t passes) override { pass_id_ = passes; }
  PassReport train_scheduled_pass(const RunPlan& plan, int64_t pass) override;
  void accumulate_pass_metrics(std::vector<double>* sums) const override;
  std::size_t metric_buckets() const override;
  void plan_pass_cache(int64_t loads) override;
  const dataset::PassDataCache* pass_cache() const override;
  // Read by every pass: its stop between steps (ps_step_hooks.hpp) and thread 0's progress.
  void set_step_hooks(const StepHooks& hooks) override;
  // A server restart (see the file comment): the pass to train again, after the last save was
  // reloaded; nullopt for any other error. Throws naming the server when the restart cannot be
  // repaired in the run (no save, runner.resume off, the run's recoveries spent).
  std::optional<int64_t> recover(const Error& error, int64_t pass) override;
  // Several trainers of a job that recovers from saves (runner.resume, a save
  // folder): every trainer must see trainer 0's saves at runner.model_save_path. Trainer 0
  // writes a token there before a meeting, the others read it after it; one that does not see it
  // fails naming the folder, after that meeting (where the others stop, naming it).
  void agree_on_start(const std::optional<SavePoint>& resume, const std::string& origin) override;
  // This trainer's run failed with `error`: logged, and marked for the other trainers' watches
  // (PsPeerWatch::mark_failed), which then report it failed naming `error`; waits at most
  // runner.peer_timeout_s for them to see it. Not by a trainer that was told of another's failure
  // (PeerFailed: at a meeting, or trainer 0's refusal to go back) or lost a peer (its watch's
  // lost()), nor twice a job, nor when another trainer's failed flag is already set (a failure
  // they all hit at once). From its start this trainer's watch reports no other's failed flag.
  void tell_failure(const std::exception& error) noexcept override;
  // After the evaluation of the epoch that ended with pass `pass`, in a job that repairs
  // together: every trainer meets, and throws when a trainer voted for a restart its evaluation
  // found (recover() then goes back with all of them). One barrier an evaluation.
  void agree_after_evaluation(int64_t pass) override;

 private:
  struct State;
  // Every trainer waits at server barrier `name` (`what` names it in the timeout's error) for at
  // most `timeout_s` (< 0: runner.collective_timeout_s).
  void meet(const std::string& name, const std::string& what, double timeout_s = -1.0);
  // `part` runs on trainer 0 while the others wait at barrier `name`; every trainer then
  // throws when it failed (trainer 0 its error, the others one naming `what`), or when trainer
  // 0 goes on with another pass than this trainer. The others wait for the part before the
  // barrier, bounded by its progress (trainer_zero_work.hpp): a part longer than
  // runner.collective_timeout_s that moves is waited for.
  void on_trainer_zero(const std::function<void()>& part, const std::string& name,
                       const std::string& what);
  void write_save(const std::string& dir);
  // on_trainer_zero's parts: trainer 0 runs `part` and writes its outcome for the others (a
  // restart found, telling them to go back together), returning its error; the others read it
  // after the meeting and throw when trainer 0 failed or goes on with another pass.
  std::exception_ptr run_part_of_trainer_zero(const std::function<void()>& part, bool* restarted,
                                              bool* first_restarted);
  void read_outcome_of_trainer_zero(const std::string& what);
  // This trainer failed with `failed` where the others meet it at barrier `name`: marks it for
  // them (with `marks`: FailureNotice::kAtMeeting, read after the meeting; tell_failure then tells
  // no watch), meets them (with `meets`; an error of the meeting itself is only logged, so that
  // `failed` is what this trainer reports) and rethrows `failed`.
  [[noreturn]] void fail_at_meeting(const std::exception_ptr& failed, const std::string& name,
                                    const std::string& what, double timeout_s = -1.0,
                                    bool marks = true, bool meets = true);
  // After a meeting: throws PeerFailed "<told>; trainer w reported: <its mark>" when trainer `w`
  // marked a failure for it; when it marked nothing, throws PeerFailed "<told><unmarked>" if
  // `unmarked` is given (else returns). Without `unmarked` a mark that cannot be read throws.
  void throw_if_marked(int w, const std::string& told, const std::optional<std::string>& unmarked);
  // agree_on_start's check: trainer 0's token in runner.model_save_path seen by every trainer
  // (trainer 0 writes it, the others read it).
  void check_shared_saves();
  void write_job_token(const std::string& file);
  void read_job_token(const std::string& file);
  // Recovery from a server restart (ps_trainer_recovery.cpp). Whether the trainers of this job
  // go back to the last save together (several trainers, in every mode; see the file comment).
  bool repairs_together() const;
  // The end of pass `pass`, in a job that repairs together: every trainer votes whether it
  // `found` a server restart in the pass; true when any did (or the first server restarted:
  // every trainer finds that at its next call to it), and then recover() goes back.
  // `meet_all` is the pass's meeting at its end (PsPassStop's): every trainer casts its vote
  // before it, and reads the votes after it. `restarted`: the pass's error when this trainer
  // found a server restart in it (null when it did not); whether its threads also failed
  // otherwise there (own_failure_in_pass, once every restarted server is known) its vote tells.
  bool agree_on_restart(int64_t pass, const std::exception_ptr& restarted,
                        const std::function<void()>& meet_all);
  // This trainer's vote for a restart found in pass `pass` (or before it, after the one before;
  // `also_failed` as above), and whether any trainer voted for one in `pass`.
  void vote_restart(int64_t pass, bool also_failed = false);
  bool restart_voted(int64_t pass);
  // What failed on this trainer's training threads beside a restart found in pass `pass`
  // (`error`, the pass's error: device::CardsFailed when they failed): "this trainer also failed
  // in pass p: card 0: ..." (restart_beside.hpp; "after pass p" when `after`: found after the
  // pass's vote, in an epoch's evaluation or a save), "" when nothing did. Any other error (a
  // vote's, a meeting's, another trainer's restart told) is the restart's own.
  std::string own_failure_in_pass(const Error& error, int64_t pass, bool after = false) const;
  std::string own_failure_in_pass(const std::exception_ptr& error, int64_t pass) const;
  // "trainer k also failed in pass p (its log ... names why)": the first other trainer whose
  // vote for pass `pass` told a failure beside its restart; "" when none did (or the votes
  // cannot be read: the first server, which holds them, restarted). `voted_after`: the votes
  // read are those cast after pass `pass`'s vote (vote_after_evaluation's, for the pass after);
  // `after`: the failure came after the pass's training: "after pass p".
  std::string other_failed_in_pass(int64_t pass, bool voted_after, bool after);
  // Whether a server restart is known here: agreed (the vote, trainer 0's outcome), pending in
  // this trainer's client, or found by asking every server who it is.
  bool restart_found();
  // recover() of a job that repairs together: every trainer meets, trainer 0 chooses the save,
  // all reload it (start_job, load) and go on with the pass after it.
  std::optional<int64_t> recover_together(const Error& error, int64_t pass);
  // recover_together's first step when no restart was agreed yet (this trainer's own calls found
  // one after pass `pass`'s vote: an epoch's evaluation): its vote for the pass after, cast before
  // it meets the others after the evaluation, unless the first server restarted (every trainer
  // finds that itself); the vote tells whether `error` also failed otherwise (as
  // agree_on_restart's).
  void vote_after_evaluation(int64_t pass, const Error& error);
  // recover_together's rendezvous: trainer 0 chooses the save (its lineage) and tells the others
  // before they meet (`failed`: its refusal, told too); the others read it after they met, and
  // check that its folder holds that pass's save.
  SaveLineage::Recovery choose_save(const std::string& what, int64_t pass,
                                    std::exception_ptr* failed);
  SaveLineage::Recovery read_chosen_save(const std::string& what, int64_t pass);
  // One round of recover_together: every trainer drops its threads and accepts the restarts,
  // all meet, and the save trainer 0 chose is returned (throws when it refused, naming
  // `beside_of()`, asked once every restarted server is known: what else failed on this trainer
  // where the restart was found, or on another, "" when nothing did).
  SaveLineage::Recovery meet_to_go_back(int64_t pass,
                                        const std::function<std::string()>& beside_of);
  // Trainer 0 at the job's start: the restart votes zeroed.
  Status reset_restart_votes();
  // The training threads dropped (their calls under way waited for, their failures not logged).
  void drop_workers();
  // The stop flag when this trainer is alone (several stop together, in a pass: PsPassStop).
  const std::atomic<bool>* alone_stop_flag() const;
  // data.load_into_memory(), stopped when asked (alone): throws PassStopped(pass, what).
  Status load_stoppable(dataset::InMemoryDataset& data, const std::string& what,
                        int64_t pass) const;
  // One training thread per card, starting from the dense net's initial values (and the sync
  // mode's merged pushes), replacing any made before.
  void make_workers();
  // The job's start (see the file comment): trainer 0 writes the servers' tables, every trainer
  // adopts the dense table. `recovery`: a recovery's restart of the job, which keeps the
  // trainers' failure marks (PsPeerWatch::reset).
  void start_job(bool recovery = false);
  // A pass, in parts (ps_trainer_pass.cpp): its data, the sync mode's agreed step count (behind
  // the pass's barriers of every trainer at the servers), every training thread's steps
  // (train_threads returns thread 0's step count, train_thread one thread's), and its report (the
  // metrics of every thread).
  struct PassData;
  struct PassThreads;
  PassData read_pass(const std::vector<std::string>& share, int64_t pass);
  std::size_t agree_sync_steps(SyncBarriers& barriers, std::size_t batches);
  std::size_t train_threads(PassData& data, int64_t pass, PsPassStop& stop, SyncBarriers& barriers);
  std::size_t train_thread(PassThreads& run, int t);
  PassReport pass_report(int64_t pass, const Timer& pass_timer);
  // Throws naming `what` when another job took the servers over (ServersOwner::taken_over): a
  // pass's or an evaluation's figures would be of its dense table.
  void check_still_owner(const std::string& what) const;
  // An evaluation: its data (read as a pass's, thread 0 its one consumer), and thread 0's steps
  // over it (false when a stop cut them short).
  PassData read_eval(const std::vector<std::string>& files);
  bool eval_thread(PassData& data, bool keep_predictions, EvalResult* result);

  TrainerConfig config_;
  TrainerEnv env_;
  std::unique_ptr<State> state_;
  int64_t pass_id_ = 0;
  bool loaded_ = false;  // a save was loaded (load()): runner.model_init_path is not needed
  // on_trainer_zero's parts so far (alike on every trainer), in stages of the train() runs and
  // their recoveries, and the job's nonce.
  TrainerZeroParts trainer_zero_parts_;
  TrainerZeroPublishes trainer_zero_publishes_;  // trainer 0's: its parts shown in order
  // A job that repairs together: the job agreed that a server restarted (the pass's vote,
  // trainer 0's outcome), and the restarts this trainer found and accepted before recover()
  // (named in its warning).
  bool restart_agreed_ = false;
  // The pass train_pass trains (-1 outside it), left set when it throws: recover_together then
  // names a failure beside a restart "in pass p", else "after pass p" (an epoch's evaluation, a
  // save), whichever meeting agreed on the restart; recover_together resets it first.
  int64_t training_pass_ = -1;
  std::string restarts_found_;
  OrderHook order_hook_;
};

}  // namespace gpubox::trainer::ps_modes
