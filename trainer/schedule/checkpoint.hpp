// Saves a training run can be restored from, and the restore (docs/operations.md, "Durability and
// resume").
//
// A save folder (<model_save_path>/<pass>) holds the sparse half, the dense half and, written
// last, a model manifest naming both (table/io/model_manifest.hpp). A save is complete when its
// manifest reads back and every half visible from here matches it; a delta save also needs
// every save it applies onto, back to a base or checkpoint (its chain).
//
// Resume (runner.resume: auto, with model_save_path set and save_mode not none): a training
// command run again after a crash of the trainer, of a server or of the machine finds the newest
// complete save under model_save_path (largest sequence), restores its sparse half into the host
// tier (the servers through LOAD, base then deltas in order) and its dense half on every card,
// and goes on with the pass after it. It refuses a newest save of another job (other data,
// other runner keys that shape the result: job_identity.hpp), made with other model keys or
// started from another --load, naming what differs, instead of mixing two runs; a newest save
// that ends this job (a rerun of a finished job) is not resumed: the job trains again.
//
// A server restart during the run (the client's instance-id check, table/server/server_identity
// .hpp) is repaired in the run wherever it is found: at the start of a pass, while its rows are
// pulled, at an evaluation or a save, the last save is loaded again and the passes after it are
// trained again. Found while a gpubox-mode pass is open (its rows trained on the cards, the
// write-back under way), that pass is dropped from the cards and trained again from the last
// save too: by one trainer alone, or by every trainer of a job together
// (engine/trainer_recovery.cpp: they agree after each phase that calls the servers). A PS-mode
// pass holds nothing the servers do not (every update goes to them as it is made): found within
// one, the pass is retried from the last save too, by every trainer of the job together
// (ps_modes/ps_trainer.hpp).
//
// Thread-safety: used by the trainer's controlling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/host_tier.hpp"
#include "table/io/model_manifest.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

// One complete save.
struct SavePoint {
  std::string dir;
  table::io::ModelManifest manifest;
  uint64_t digest = 0;  // of its MODEL_MANIFEST (what a delta made on top of it names)
};

// A save and the saves whose sparse halves restore it, oldest first: a base or checkpoint, then
// each delta up to the save itself (chain.back()).
struct RestorePlan {
  std::vector<SavePoint> chain;
  const SavePoint& save() const { return chain.back(); }
};

// Reads the model manifest of `dir` and of every save its chain goes through, and checks each
// link (a parent replaced since is refused) and each half visible from here (every sparse part
// too when `sparse_required`: an in-process tier reads them here). Throws gpubox::Error naming
// the folder and what is missing or differs.
RestorePlan plan_restore(const std::string& dir, bool sparse_required);

// The sparse half's folder of the save `dir`, absolute and normalized: what a save names to the
// host tier and a resume loads. A gpubox_server resolves a relative path inside its --data_dir,
// not the trainer's working directory, so a relative name would put the half where no resume
// looks (<data_dir>/<model_save_path>/<pass>/sparse).
std::string sparse_half_dir(const std::string& dir);

// What a load says when the save `point` does not fit the configured network: " (made with
// other model settings: key: saved A, now B; ...)" over the model keys that differ, the
// optimizers' aside, or "" when none differ (or either side records none).
std::string network_note(const SavePoint& point, const TrainerConfig& config);

// Loads the sparse halves of `plan` into `host`, in order (a delta applies onto what is there).
// With servers, each server's reply must name the part the manifest names; throws naming the
// server and both digests otherwise.
void restore_sparse(table::HostTier& host, const RestorePlan& plan);

// The digest of each sparse part just saved under `dir`/sparse: read back here for the
// in-process tier, the servers' SAVE replies otherwise.
std::vector<uint64_t> saved_sparse_digests(table::HostTier& host, const std::string& dir);

// The file an epoch's evaluation leaves in the save of the epoch's last pass (epoch_loop.cpp:
// a resume after a save without it evaluates that epoch first). begin_save removes it: a folder
// saved into again holds no evaluation of the new save.
inline constexpr const char* kEvaluatedMark = ".gpubox_evaluated";
// The file an epoch's evaluation leaves there when it begins (kEvaluatedMark replaces it at its
// end): a save that ends the job with it alone was cut short in the job's last evaluation, even
// where no epoch before holds a mark (a job of one epoch).
inline constexpr const char* kEvaluatingMark = ".gpubox_evaluating";

// True when `host` is held by servers (their share of a save is on their machine).
bool host_is_remote(const table::HostTier& host);

// The deepest folder holding every save a gpubox_train command writes or reads: `save_path`
// (runner.model_save_path, training) and `load` (--load, or runner.infer_load_path), absolute;
// "" when neither is set. The servers' --data_dir for it (scripts/run_gpubox.sh), since their
// SAVE and LOAD paths must stay inside it.
std::string model_root(const std::string& save_path, const std::string& load);

// The saves one trainer makes and restores: what a delta applies onto, the sequence of the next
// save, where the run started, the save to go back to after a server restart.
class SaveLineage {
 public:
  explicit SaveLineage(const TrainerConfig& config) : config_(config) {}

  // The job this run trains (job_identity.hpp) and the passes it schedules: its saves record
  // both, and find_resume_point continues only an interrupted run of the same job. Unset (tools,
  // tests that save by hand): saves record no job, and any save of the same model resumes.
  void set_job(std::map<std::string, std::string> identity, int64_t passes) {
    job_ = std::move(identity);
    job_passes_ = passes;
  }
  // This run marks its epochs' evaluations (kEvaluatedMark; epoch_loop: it saves, has test data,
  // and its trainers can agree on the marks) over epochs of `per_epoch` passes: a newest save
  // that ends the job is resumed, for its last epoch's evaluation alone, when it holds no mark
  // and either the mark of that evaluation begun (kEvaluatingMark) or the save ending the epoch
  // before holds one (a run killed during the job's last evaluation retrained the whole job on
  // rerun). Before find_resume_point.
  void set_marks_evaluations(bool marks, int64_t per_epoch) {
    marks_evaluations_ = marks;
    per_epoch_ = per_epoch;
  }
  // Whether find_resume_point chose a save that ends the job, for its last evaluation.
  bool resumed_to_evaluate() const { return resumed_to_evaluate_; }

  // Where a training command starts. With runner.resume auto (model_save_path set, save_mode
  // not none): the newest complete save under model_save_path, or nothing when there is none
  // (saves not complete are skipped, with a warning naming why) or when it ends this job
  // (every pass the config schedules saved: a rerun of a finished job trains it again from the
  // start, as PaddleRec's do, saying so). Throws, naming what differs and the ways out, when it
  // is of another job (set_job: other job keys or other data; runner.epochs aside, so more
  // epochs continue a job). Throws, naming the keys or
  // folders, when the newest save belongs to another run: other model keys, or started from
  // another `start_from` (the command's --load, "" = from scratch). Logs what it chose.
  // `host` says which halves must be readable here. Sets the origin the run's saves record:
  // the resumed save's, else `start_from`. A run that starts from scratch while its servers
  // already hold rows (of another run) is warned that it trains on top of them.
  std::optional<SavePoint> find_resume_point(const std::string& start_from, table::HostTier& host);

  // A save into `dir` begins: its MODEL_MANIFEST and evaluation mark are removed (the folder
  // holds no complete save until commit_save, nor an evaluation of it) and the sparse half's mode
  // is chosen: `configured`, except that a delta without a save to apply onto (the run's first
  // save) is written as a base. Through `files` (null: POSIX; trainer 0 passes the env that shows
  // its part's moves, trainer_zero_work.hpp).
  table::SaveKind begin_save(const std::string& dir, table::SaveKind configured,
                             table::io::FileEnv* files = nullptr);
  // Both halves are saved: writes the model manifest, reading the manifests of the saves beside
  // it for its sequence, through `files` (as begin_save). `run_pass` = the passes the trainer has
  // done (the save of pass p, counted from 0, records p + 1: a resume goes on with pass p + 1).
  // `dense_precision`: what card 0's dense net computed in (DenseModel::precision(); an export
  // records it as the precision the model was trained in).
  void commit_save(const std::string& dir, int64_t run_pass, table::SaveKind written,
                   std::vector<uint64_t> sparse, uint64_t dense,
                   config::DensePrecision dense_precision, table::io::FileEnv* files = nullptr);
  // The trainer restored `plan` and has done `run_pass` passes (its next pass is run_pass).
  void restored(const RestorePlan& plan, int64_t run_pass);

  // What a server restart found in pass `pass` means for that pass.
  enum class OpenPass {
    kNone,     // no pass was open: the passes from the last save are trained again
    kRetried,  // every update of the pass went to the servers, which the reload replaces (the
               // PS modes): the pass is trained again from the last save, like one not begun
    kDropped,  // the pass's rows on the cards (the gpubox mode's, trained or being written back)
               // are dropped with it: the pass is trained again from the last save
  };
  // What to reload after `error` stopped the run at `pass`: when the host tier reports a
  // server restart, runner.resume is auto and a save was made or loaded (and the run's
  // recoveries are not spent), the restarts are accepted and that save is returned with the
  // trainer's pass it stands for. Otherwise throws `error` again, with the restart named when
  // there was one. Before it names or accepts them, every server is asked who it is
  // (find_restarts): a fleet restarted together is accepted and reloaded at once, not one server
  // a retry. `before_accept` (when set) runs just before the restarts are accepted: the trainer
  // drops whatever still talks to the servers as they were (PsTrainer's threads), so that
  // nothing of theirs lands on an accepted server before the reload.
  struct Recovery {
    std::string dir;
    int64_t run_pass = 0;
  };
  // `beside`: a clause named after the restarts (what else failed as they were found, "" when
  // nothing did), so that a refusal names it before what running the command again does.
  Recovery recover(const Error& error, table::HostTier& host, OpenPass open, int64_t pass,
                   const std::function<void()>& before_accept = {}, const std::string& beside = "");
  // recover() once the restarts are known and named by `what` (the restarts this trainer's
  // servers report, or, in a job of several trainers, what another trainer found): the checks
  // (runner.resume, a save to go back to, the run's recoveries), the warning, `before_accept`,
  // the restarts accepted; returns the save to reload. Throws naming `what` and what running the
  // command again does when the run cannot go back.
  Recovery go_back(const std::string& what, table::HostTier& host, OpenPass open, int64_t pass,
                   const std::function<void()>& before_accept = {});
  // The folder of the save a job of several trainers goes back to, which trainer 0 chose and
  // names by its trainer's pass `run_pass` (Recovery::run_pass): the save this trainer restored
  // when it stands for that pass (the one the run started from), else the save of pass
  // run_pass - 1 under runner.model_save_path, which trainer 0 wrote.
  std::string save_dir_of(int64_t run_pass) const;
  // recover(), then `reload` of what it returned (the trainer reloads the save into the
  // servers); a restart found during the reload (a staggered fleet restart: a server that did
  // not answer find_restarts' ping, or restarted after it answered) goes through recover() again
  // (counted among the run's recoveries; no pass open then, whatever `open` said of the first
  // round) and the reload is made again. Any other error of `reload` is thrown. Returns the
  // recovery the last reload made. Both trainers recover through it. `beside_reload` (when
  // set): what else failed in a reload's error `again` beside the restart it found, of the save
  // `dir` ("this trainer also failed reloading <dir>: ...", "" when nothing did), named after
  // the restarts in the next round's refusal as `beside` is in the first's.
  using ReloadBeside = std::function<std::string(const Error& again, const std::string& dir)>;
  Recovery recover_and_reload(const Error& error, table::HostTier& host, OpenPass open,
                              int64_t pass, const std::function<void(const Recovery&)>& reload,
                              const std::function<void()>& before_accept = {},
                              const std::string& beside = "",
                              const ReloadBeside& beside_reload = {});
  // "server A restarted (...); server B ..." for the restarts `host` found; "" when none (or an
  // in-process tier). Without the rerun advice of a failed call's error
  // (ServerRestart::what_was_lost): the caller says what follows.
  static std::string describe_restarts(table::HostTier& host);
  // Whether `failure` (an error's message) names a restart `host` found: the failed call that
  // met it, or one cut off as that server went down, names its "ip:port". Any other failure is
  // the trainer's own (a device fault, another server down). False for an in-process tier.
  static bool names_a_restart(const std::string& failure, table::HostTier& host);
  // Whether `text` names the server `where` ("ip:port") as a whole: not "h:2901" within
  // "h:29011", nor "ps1:6000" within "gpu-ps1:6000" (names_a_restart).
  static bool names_server(const std::string& text, const std::string& where);
  // Asks every server who it is (a ping, each bounded by `timeout_s`), so that every restarted
  // server is found, not only the first one a failed call met (a call stops at the first
  // endpoint that answers Aborted), and a server that was down and is back as another instance
  // is found too. A server that does not answer is left as it is. A no-op for the in-process
  // tier.
  static void find_restarts(table::HostTier& host, double timeout_s);
  // What running the command again does, for an error that stops the run: "runner.resume is
  // off: ...", "no save was made or loaded yet: ...", or "running the command again resumes
  // from the last complete save (pass p, dir)". `writes_saves` false: another trainer writes the
  // job's saves (this lineage knows none it did not load), so the newest under
  // runner.model_save_path is named by its folder.
  std::string rerun_outcome(bool writes_saves = true) const;
  // Why go_back() refuses: no save made or loaded yet, the run's recoveries spent.
  bool has_save() const { return last_.has_value(); }
  bool recoveries_spent() const;
  // Why go_back() refused, as trainer 0 of a job of several tells the others (they go back to
  // the save it chose, or stop with its reason): runner.resume off, no save made or loaded, the
  // run's recoveries spent, or another failure. kNone: none of them holds (it would go back).
  enum class Refusal : int { kNone = 0, kResumeOff, kNoSave, kSpent, kOther };
  Refusal refusal() const;
  // The reason `why` in words ("runner.resume is off", ...); kOther names trainer 0's log, at
  // `log` (where the mode's launcher writes it: "log/worker.0.log under scripts/run_gpubox.sh").
  static std::string describe(Refusal why, const std::string& log);
  // `why` as one float (what a value table carries: the PS modes tell it through a server's dense
  // table), and back: kNone 1, kResumeOff 2, kNoSave 3, kSpent 4, kOther 0 and any other value.
  static float encode(Refusal why);
  static Refusal decode(float told);
  // Adopts the restarted servers `host` found (RemoteHostTier::accept_restarts): a trainer that
  // goes back with trainer 0, which reloads them. A no-op for the in-process tier.
  static void accept_restarts(table::HostTier& host);

  // Asks every server whether it is still the process it was (throws, like any call that finds
  // a restart, so that recover() sees it). A no-op for the in-process tier.
  static void check_servers(table::HostTier& host, int64_t pass);

 private:
  // find_resume_point without the servers' warning.
  std::optional<SavePoint> find_newest_save(const table::HostTier& host);
  // Refuses `candidate` (named `which`) when it is another job's, another run's or was made
  // with other model settings.
  void check_resumable(const SavePoint& candidate, const std::string& which) const;
  // "the last complete save (pass p, dir)" or "the save the run started from (dir)"; "" when
  // none was made or loaded.
  std::string last_save() const;

  // Whether `m` is the job's last save with its last epoch unevaluated (set_marks_evaluations).
  bool ends_job_unevaluated(const table::io::ModelManifest& m) const;

  const TrainerConfig& config_;
  std::map<std::string, std::string> job_;
  int64_t job_passes_ = 0;
  bool marks_evaluations_ = false;
  int64_t per_epoch_ = 1;
  bool resumed_to_evaluate_ = false;
  std::string origin_;
  std::optional<SavePoint> last_;  // the last save made or restored
  int64_t last_run_pass_ = 0;      // the trainer's pass when it was
  int recoveries_ = 0;
};

}  // namespace gpubox::trainer
