#include "trainer/schedule/checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <set>

#include "common/config/config_document.hpp"
#include "common/config/config_keys.hpp"
#include "common/logging.hpp"
#include "table/io/save_dir.hpp"
#include "trainer/schedule/detail/save_lineage_detail.hpp"
#include "trainer/schedule/evaluation_marks.hpp"
#include "trainer/schedule/job_identity.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
namespace io = table::io;
using detail::as_remote;
using detail::describe_start;

// Saves one delta chain may go through (a bound against a corrupt or cyclic chain).
constexpr std::size_t kMaxChain = 100000;

io::FileEnv* env() { return io::FileEnv::posix(); }

// Absolute and normalized, without a trailing separator, so that two names of one folder
// compare equal (--load /x/5/ and /x/5).
std::string normalized(const std::string& dir) {
  fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
  while (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
  return p.string();
}

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// The differences between a save's job and this one's, runner.epochs aside (more epochs
// continue a job); "" when either records none.
std::string job_differences_of(std::map<std::string, std::string> saved,
                               std::map<std::string, std::string> now) {
  saved.erase("runner.epochs");
  now.erase("runner.epochs");
  // A save from before the transform was recorded as applied holds the config's text: `auto`
  // names no transform to compare.
  if (const auto t = saved.find("runner.dense_transform");
      t != saved.end() && t->second == "auto") {
    saved.erase("runner.dense_transform");
    now.erase("runner.dense_transform");
  }
  // A save from before the job recorded its cards: not compared.
  if (saved.count("cards") == 0) now.erase("cards");
  const std::string files = data_file_differences(&saved, &now);
  const std::string keys = model_key_differences(saved, now);
  if (keys.empty() || files.empty()) return keys;
  return keys + " (the files that differ: " + files + ")";
}

// The complete-looking saves directly under `root` (their MODEL_MANIFEST reads back; hidden
// folders and staging copies are not looked at), newest first. Folders that hold halves but no
// model manifest are named in `*incomplete`. The manifests are read through `files`.
std::vector<SavePoint> saves_under(const std::string& root, std::vector<std::string>* incomplete,
                                   io::FileEnv* files = env()) {
  std::vector<SavePoint> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec)) continue;
    const std::string dir = entry.path().string();
    if (dir.size() > 4 && dir.compare(dir.size() - 4, 4, ".tmp") == 0) continue;
    // Hidden: not a save (an interrupted removal's leftover, earlier_saves.hpp).
    if (entry.path().filename().string().rfind('.', 0) == 0) continue;
    SavePoint point;
    point.dir = dir;
    auto manifest = io::read_model_manifest(files, dir, &point.digest);
    if (manifest.ok()) {
      point.manifest = std::move(manifest).value();
      out.push_back(std::move(point));
    } else if (incomplete != nullptr) {
      incomplete->push_back(manifest.status().message());
    }
  }
  std::sort(out.begin(), out.end(), [](const SavePoint& a, const SavePoint& b) {
    if (a.manifest.sequence != b.manifest.sequence) {
      return a.manifest.sequence > b.manifest.sequence;
    }
    return a.manifest.pass > b.manifest.pass;
  });
  return out;
}

}  // namespace

bool host_is_remote(const table::HostTier& host) {
  return dynamic_cast<const table::server::RemoteHostTier*>(&host) != nullptr;
}

std::string model_root(const std::string& save_path, const std::string& load) {
  std::vector<fs::path> folders;
  for (const std::string& p : {save_path, load}) {
    if (!p.empty()) folders.push_back(fs::path(normalized(p)));
  }
  if (folders.empty()) return "";
  fs::path root = folders[0];
  for (const fs::path& f : folders) {
    fs::path common;
    for (auto a = root.begin(), b = f.begin(); a != root.end() && b != f.end() && *a == *b;
         ++a, ++b) {
      common /= *a;
    }
    root = common;
  }
  // A save path ending in '/' normalizes to a trailing empty part.
  std::string out = root.string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

RestorePlan plan_restore(const std::string& dir, bool sparse_required) {
  RestorePlan plan;
  std::string current = normalized(dir);
  uint64_t expected_digest = 0;  // what the save after `current` in the chain names it by
  std::set<std::string> seen;
  for (;;) {
    const std::string via =
        plan.chain.empty() ? "" : "the save " + dir + " applies onto " + current + ", but ";
    GPUBOX_EXPECTS(seen.insert(current).second && seen.size() <= kMaxChain, via,
                   "its chain of delta saves loops back to ", current);
    SavePoint point;
    point.dir = current;
    auto manifest = io::read_model_manifest(env(), current, &point.digest);
    if (!manifest.ok()) GPUBOX_FAIL(via, manifest.status().message());
    point.manifest = std::move(manifest).value();
    if (!plan.chain.empty() && point.digest != expected_digest) {
      GPUBOX_FAIL(via, "that folder now holds another save (its MODEL_MANIFEST has digest ",
                  io::hex64(point.digest), ", the delta was made on top of ",
                  io::hex64(expected_digest), ")");
    }
    const Status halves = io::check_halves(env(), current, point.manifest, sparse_required);
    if (!halves.ok()) GPUBOX_FAIL(via, halves.message());
    plan.chain.insert(plan.chain.begin(), point);
    if (point.manifest.mode != table::SaveKind::kDelta) break;
    expected_digest = point.manifest.parent_digest;
    current = (fs::path(current) / point.manifest.parent).lexically_normal().string();
  }
  return plan;
}

std::string network_note(const SavePoint& point, const TrainerConfig& config) {
  // The optimizers' keys shape no parameter: a save loads under other learning rates.
  auto shaping = [](std::map<std::string, std::string> keys) {
    for (auto it = keys.begin(); it != keys.end();) {
      const bool optimizer = it->first.rfind("hyper_parameters.optimizer.", 0) == 0 ||
                             it->first.rfind("hyper_parameters.sparse_optimizer.", 0) == 0;
      it = optimizer ? keys.erase(it) : std::next(it);
    }
    return keys;
  };
  const std::string differences =
      model_key_differences(shaping(point.manifest.model_keys), shaping(config.model_keys));
  return differences.empty() ? "" : " (made with other model settings: " + differences + ")";
}

std::string sparse_half_dir(const std::string& dir) {
  return (fs::path(normalized(dir)) / io::kSparseHalf).string();
}

void restore_sparse(table::HostTier& host, const RestorePlan& plan) {
  auto* remote = as_remote(host);
  for (const SavePoint& link : plan.chain) {
    const std::vector<uint64_t>& parts = link.manifest.sparse;
    const std::size_t holders = remote != nullptr ? remote->endpoint_count() : 1;
    if (parts.size() != holders) {
      GPUBOX_FAIL("the save ", link.dir, " holds its sparse rows in ", parts.size(),
                  " part(s) (saved by that many servers) but this trainer has ", holders,
                  remote != nullptr ? " server(s)" : " in-process host tier",
                  ": load it with as many servers as saved it");
    }
    const std::string sparse = sparse_half_dir(link.dir);
    Status loaded_half = host.load(sparse);
    if (remote != nullptr && loaded_half.code() == Status::Code::kNotFound) {
      // The trainer cannot look into the servers' folders before asking: say what to do.
      loaded_half = loaded_half.with_context(
          "the servers hold no sparse half of this save (saved by servers with another "
          "--data_dir, or by a gpubox_train before 2026-11-24, whose remote saves landed under "
          "<data_dir>/<model_save_path>): remove that save, or add -o runner.resume=off to start "
          "afresh");
    }
    if (loaded_half.code() == Status::Code::kCorruption) {
      // Damaged after it was written (a checksum that does not match): every rerun found it
      // the newest save and failed on it again.
      loaded_half = loaded_half.with_context(
          "the save " + link.dir +
          " is damaged: move it (and the saves after it) out of the "
          "folder to resume from the save before, or add -o runner.resume=off to start afresh");
    }
    throw_if_error(loaded_half.with_context("restoring the sparse half of " + link.dir));
    if (remote == nullptr) continue;
    const std::vector<uint64_t> loaded = remote->last_sync_generations();
    for (std::size_t e = 0; e < parts.size(); ++e) {
      if (e < loaded.size() && loaded[e] == parts[e]) continue;
      GPUBOX_FAIL("server ", remote->endpoint_name(e), " loaded ",
                  join(link.dir, io::sparse_part_folder(e, parts.size())), " with digest ",
                  io::hex64(e < loaded.size() ? loaded[e] : 0), " but ", link.dir, "/",
                  io::kModelManifestName, " names ", io::hex64(parts[e]),
                  ": the server's copy is not the half saved with this dense half (another "
                  "--data_dir, or replaced since)");
    }
  }
}

std::vector<uint64_t> saved_sparse_digests(table::HostTier& host, const std::string& dir) {
  if (auto* remote = as_remote(host)) {
    std::vector<uint64_t> digests = remote->last_sync_generations();
    GPUBOX_EXPECTS(digests.size() == remote->endpoint_count(),
                   "no SAVE reply from every server for ", dir);
    return digests;
  }
  auto digest = io::read_half_digest(env(), join(dir, io::kSparseHalf), io::kSparseHalf);
  throw_if_error(digest.status().with_context("reading back the sparse half of " + dir));
  return {*digest};
}

std::optional<SavePoint> SaveLineage::find_resume_point(const std::string& start_from,
                                                        table::HostTier& host) {
  origin_ = start_from.empty() ? "" : normalized(start_from);
  std::optional<SavePoint> point = find_newest_save(host);
  if (!point && origin_.empty() && host_is_remote(host)) {
    const auto stats = host.stats();
    if (stats.ok() && stats->rows_in_memory + stats->rows_on_disk > 0) {
      GPUBOX_LOG(WARNING) << "this run starts from scratch, but the servers already hold "
                          << stats->rows_in_memory + stats->rows_on_disk
                          << " rows (of another run?): it trains on top of them. Restart the "
                          << "servers for a fresh model";
    }
  }
  return point;
}

void SaveLineage::check_resumable(const SavePoint& candidate, const std::string& which) const {
  const io::ModelManifest& m = candidate.manifest;
  const std::string remedy =
      ". Resuming would mix two runs: run the command that made it, or add -o "
      "runner.resume=off to start afresh (its saves replace those there, its job's end "
      "removes the rest), or use another runner.model_save_path";
  // Another job (other data, batches, reading, seed ...; runner.epochs aside: more epochs
  // continue a job) is never resumed; this job, with every pass it schedules saved, starts
  // again (a rerun of a finished job).
  const std::string job_differences = job_differences_of(m.job, job_);
  if (!job_differences.empty()) {
    GPUBOX_FAIL("runner.resume: ", which, " is of another job than this one: ", job_differences,
                ". Resuming would mix two jobs: add -o runner.resume=off to start afresh "
                "(its saves replace those there, its job's end removes the rest), or use another "
                "runner.model_save_path");
  }
  if (m.origin != origin_) {
    GPUBOX_FAIL("runner.resume: ", which, " belongs to a run that started ",
                describe_start(m.origin), ", and this command starts ", describe_start(origin_),
                remedy);
  }
  const std::string differences = model_key_differences(m.model_keys, config_.model_keys);
  if (!differences.empty()) {
    // A switch a config's folder flips when unset (a save from before dlrm_output, of PaddleRec's
    // dlrm folder, built one logit): the -o that resumes it.
    const Status switches = check_saved_dense_switches(m.model_keys, config_, candidate.dir);
    // A start range a PaddleRec folder derives (dcn_v2's, a save made at GPUBox's): its -o.
    const Status derived = check_saved_derived_keys(m.model_keys, config_, candidate.dir);
    GPUBOX_FAIL("runner.resume: ", which, " was made with other model settings: ", differences,
                switches.ok() ? "" : " (" + switches.message() + ")",
                derived.ok() ? "" : " (" + derived.message() + ")", remedy);
  }
}

bool SaveLineage::ends_job_unevaluated(const io::ModelManifest& m) const {
  // The job's last epoch unevaluated (no mark, where its evaluation's start left one or the epoch
  // before holds one): the run before was killed in that evaluation.
  const int64_t before = m.pass - 1 - per_epoch_;  // the save ending the epoch before
  if (m.job.empty() || !marks_evaluations_ || m.pass != job_passes_ ||
      std::filesystem::exists(evaluated_mark(config_.runner, m.pass - 1))) {
    return false;
  }
  return std::filesystem::exists(evaluated_mark(config_.runner, m.pass - 1, kEvaluatingMark)) ||
         (before >= 0 && std::filesystem::exists(evaluated_mark(config_.runner, before)));
}

std::optional<SavePoint> SaveLineage::find_newest_save(const table::HostTier& host) {
  const RunnerConfig& r = config_.runner;
  if (r.model_save_path.empty()) return std::nullopt;
  std::vector<std::string> incomplete;
  const std::vector<SavePoint> saves = saves_under(r.model_save_path, &incomplete);
  if (r.save_mode == table::SaveKind::kNone) {
    // Nothing is saved, so nothing resumes: an earlier run's saves there are not read (a rerun
    // of a killed job starts afresh), said rather than passed over.
    if (r.resume != ResumeMode::kOff && !saves.empty()) {
      GPUBOX_LOG(WARNING) << "runner.resume: not resuming: runner.save_mode is none, and "
                          << r.model_save_path << " holds saves of an earlier run (the newest: "
                          << "pass " << saves.front().manifest.pass - 1 << "); this run starts "
                          << describe_start(origin_) << " and saves nothing (set save_mode to "
                          << "resume from them)";
    }
    return std::nullopt;
  }
  if (r.resume == ResumeMode::kOff) {
    if (!saves.empty()) {
      GPUBOX_LOG(WARNING) << "runner.resume is off: " << r.model_save_path
                          << " holds saves of an earlier run (the newest: pass "
                          << saves.front().manifest.pass - 1 << "); this run starts "
                          << describe_start(origin_) << ": its saves replace those of its "
                          << "passes, and its job's end removes the later ones (use another "
                          << "runner.model_save_path to keep them)";
    }
    return std::nullopt;
  }
  for (const std::string& why : incomplete) {
    GPUBOX_LOG(INFO) << "runner.resume: skipped: " << why;
  }
  const bool sparse_required = !host_is_remote(host);
  std::string first_failure;  // why the newest save does not restore
  for (const SavePoint& candidate : saves) {
    const io::ModelManifest& m = candidate.manifest;
    const std::string which = "the newest save under " + r.model_save_path + " (pass " +
                              std::to_string(m.pass - 1) + ", " + candidate.dir + ")";
    check_resumable(candidate, which);
    try {
      plan_restore(candidate.dir, sparse_required);
    } catch (const Error& e) {
      GPUBOX_LOG(WARNING) << "runner.resume: " << candidate.dir
                          << " is not a complete save, trying the one before: " << e.what();
      if (first_failure.empty()) first_failure = candidate.dir + ": " + e.what();
      continue;
    }
    if (ends_job_unevaluated(m)) {
      GPUBOX_LOG(INFO) << "runner.resume: " << which << " ends this job, but its last epoch "
                       << "was not evaluated (the run before stopped in that evaluation: the "
                       << "save holds no mark of its end, only of its start or the epoch "
                       << "before's): resuming from it to evaluate that epoch";
      origin_ = m.origin;
      resumed_to_evaluate_ = true;
      return candidate;
    }
    if (!m.job.empty() && job_passes_ > 0 && m.pass >= job_passes_) {
      GPUBOX_LOG(INFO) << "runner.resume: " << which << " ends this job (all its " << job_passes_
                       << " passes saved): training it again from the start (as PaddleRec "
                       << "does), " << describe_start(origin_)
                       << "; its saves replace those there, and its job's end removes the rest "
                          "(copy them elsewhere first to keep them, or set another "
                          "runner.model_save_path)";
      return std::nullopt;
    }
    origin_ = m.origin;
    GPUBOX_LOG(INFO) << "runner.resume: resuming from pass " << m.pass - 1 << " (" << candidate.dir
                     << ", a " << name_of(table::kSaveKindNames, m.mode) << " save); the next "
                     << "pass is " << m.pass;
    if (m.mode != table::SaveKind::kCheckpoint) {
      // A warning, not a note: a helper's kill probe measured the resumed job's test AUC 0.004
      // under the uninterrupted one's, the pass after the resume 0.03 under, on learnable data.
      GPUBOX_LOG(WARNING) << "runner.resume: a " << name_of(table::kSaveKindNames, m.mode)
                          << " save holds no sparse optimizer state: every row's accumulators "
                             "start again from their initial values, so the passes after the "
                             "resume step as a fresh table does and the job ends measurably "
                             "apart from an uninterrupted one; runner.save_mode checkpoint "
                             "resumes exactly";
    }
    return candidate;
  }
  // Saves that none restores (a read error, halves that do not match, a newer format) are not
  // "no save": training afresh would later remove them.
  GPUBOX_EXPECTS(first_failure.empty(), "runner.resume: no save under ", r.model_save_path,
                 " restores (", saves.size(), " tried), the newest: ", first_failure,
                 ". Repair it, or add -o runner.resume=off to train afresh (its saves replace "
                 "those there, its job's end removes the rest), or use another "
                 "runner.model_save_path");
  GPUBOX_LOG(INFO) << "runner.resume: no complete save under " << r.model_save_path << "; starting "
                   << describe_start(origin_);
  return std::nullopt;
}

table::SaveKind SaveLineage::begin_save(const std::string& dir, table::SaveKind configured,
                                        io::FileEnv* files) {
  if (files == nullptr) files = env();
  // The evaluation of what the folder held before (a rerun saves into a finished job's folders);
  // first, so that the manifest's removal syncs the folder after both.
  for (const char* name : {kEvaluatedMark, kEvaluatingMark}) {
    if (const std::string mark = join(dir, name); files->exists(mark)) {
      throw_if_error(files->remove_all(mark).with_context("starting a save in " + dir));
    }
  }
  throw_if_error(io::remove_model_manifest(files, dir).with_context("starting a save in " + dir));
  // A delta chain starts with a save that replaces the table, and stays in its folder: the
  // first save after a --load of another folder's save is a base (a delta onto it became
  // unloadable once that folder's job was rerun or removed).
  if (configured == table::SaveKind::kDelta &&
      (!last_ || normalized(last_->dir) == normalized(dir) ||
       fs::path(normalized(last_->dir)).parent_path() != fs::path(normalized(dir)).parent_path())) {
    return table::SaveKind::kBase;
  }
  return configured;
}

void SaveLineage::commit_save(const std::string& dir, int64_t run_pass, table::SaveKind written,
                              std::vector<uint64_t> sparse, uint64_t dense,
                              config::DensePrecision dense_precision, io::FileEnv* files) {
  if (files == nullptr) files = env();
  io::ModelManifest m;
  m.pass = run_pass;
  // Newer than every save beside it (of this run or an earlier one) and than the last one.
  uint64_t newest = last_ ? last_->manifest.sequence : 0;
  const std::string here = normalized(dir);
  for (const SavePoint& other :
       saves_under(fs::path(here).parent_path().string(), nullptr, files)) {
    newest = std::max(newest, other.manifest.sequence);
  }
  m.sequence = newest + 1;
  m.mode = written;
  if (written == table::SaveKind::kDelta) {
    GPUBOX_EXPECTS(last_.has_value(), "a delta save without a save to apply onto");
    m.parent = fs::path(normalized(last_->dir)).lexically_relative(here).string();
    m.parent_digest = last_->digest;
  }
  m.origin = origin_;
  m.model_keys = config_.model_keys;
  m.dense_precision = dense_precision;
  m.job = job_;
  m.job_passes = job_passes_;
  m.dense = dense;
  m.sparse = std::move(sparse);
  SavePoint point;
  point.dir = here;
  throw_if_error(io::write_model_manifest(files, dir, m, &point.digest)
                     .with_context("writing the model manifest of " + dir));
  point.manifest = std::move(m);
  last_ = std::move(point);
  last_run_pass_ = run_pass;
}

void SaveLineage::restored(const RestorePlan& plan, int64_t run_pass) {
  last_ = plan.save();
  last_run_pass_ = run_pass;
}

std::string SaveLineage::last_save() const {
  // last_run_pass_ counts the passes done: the save of pass p (from 0) stands at p + 1, the save
  // a run started from (--load, model_init_path) at 0.
  if (!last_) return "";
  return last_run_pass_ > 0 ? "the last complete save (pass " + std::to_string(last_run_pass_ - 1) +
                                  ", " + last_->dir + ")"
                            : "the save the run started from (" + last_->dir + ")";
}

std::string SaveLineage::save_dir_of(int64_t run_pass) const {
  if (last_ && last_run_pass_ == run_pass) return last_->dir;
  GPUBOX_EXPECTS(run_pass > 0 && !config_.runner.model_save_path.empty(),
                 "no save of this run stands for pass ", run_pass, " (trainer 0 goes back to it)");
  return normalized(
      (fs::path(config_.runner.model_save_path) / std::to_string(run_pass - 1)).string());
}

}  // namespace gpubox::trainer
