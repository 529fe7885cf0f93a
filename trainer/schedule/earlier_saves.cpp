#include "trainer/schedule/earlier_saves.hpp"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/io/model_manifest.hpp"
#include "table/io/save_dir.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/metrics_file.hpp"
#include "trainer/schedule/saved_models.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
namespace io = table::io;

// What a removal renames a doomed save folder to before deleting it: a folder of this name is
// one a removal did not finish deleting (the next run deletes it). Hidden: nothing lists it.
const std::string kDoomedPrefix = ".gpubox_removing_";

std::string without_tmp(const std::string& name) {
  const std::string tmp = ".tmp";
  return name.size() > tmp.size() && name.compare(name.size() - tmp.size(), tmp.size(), tmp) == 0
             ? name.substr(0, name.size() - tmp.size())
             : name;
}

// `dir` as a folder: absolute, symbolic links resolved where it exists, no trailing separator.
fs::path folder_key(const fs::path& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) p = fs::absolute(dir);
  p = p.lexically_normal();
  while (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
  return p;
}

bool same_folder(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return (fs::equivalent(a, b, ec) && !ec) || folder_key(a) == folder_key(b);
}

// The save folders `start_from` restores from: itself and its delta chain.
std::vector<fs::path> kept_saves(const std::string& start_from) {
  std::vector<fs::path> kept;
  if (start_from.empty()) return kept;
  kept.emplace_back(start_from);
  try {
    for (const SavePoint& link : plan_restore(start_from, false).chain) kept.emplace_back(link.dir);
  } catch (const Error&) {
    // Not a complete save here (its load says so): only the folder itself is kept.
  }
  return kept;
}

// The first entry of `dir` that a save does not write, or "" when there is none.
std::string foreign_entry(const fs::path& dir) {
  // The run's own evaluation marks and pass lines are part of the save (a rerun with fewer epochs
  // and test data was refused for it: "holds '.gpubox_evaluated', not written by a save").
  static const std::set<std::string> kSaveEntries = {table::io::kModelManifestName,
                                                     table::io::kSparseHalf, table::io::kDenseHalf,
                                                     kEvaluatedMark, kEvaluatingMark};
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (kSaveEntries.count(without_tmp(name)) == 0 && name.rfind(kPassLineFile, 0) != 0) {
      return name;
    }
  }
  return ec ? "(unreadable: " + ec.message() + ")" : "";
}

// A save folder's halves as its model manifest lists them: every file inside dense/ and
// sparse/ must be one their MANIFESTs list (`foreign` names the first that is not, from the
// save folder); `unread` says why a half that is there could not be looked into.
struct HalvesCheck {
  std::string foreign;
  std::string unread;
};

// Whether `rel` lies inside the staging copy (`<name>.tmp/`) of an allowed folder: a half (or a
// server's part) a killed save was writing; its files are listed by no MANIFEST yet.
bool inside_staging(const std::string& rel, const std::set<std::string>& allowed) {
  for (std::size_t slash = rel.find('/'); slash != std::string::npos;
       slash = rel.find('/', slash + 1)) {
    const std::string folder = rel.substr(0, slash);
    if (folder != without_tmp(folder) && allowed.count(without_tmp(folder)) > 0) return true;
  }
  return false;
}

HalvesCheck check_halves_entries(const fs::path& dir, const io::ModelManifest& m) {
  std::set<std::string> allowed;    // relative to `dir`: files and the folders holding them
  std::vector<std::string> opaque;  // the parts whose MANIFEST does not read: not looked into
  HalvesCheck out;
  const auto list = [&](const std::string& part, const char* kind) {
    allowed.insert(part);
    auto half = io::read_manifest(io::FileEnv::posix(), (dir / part).string(), kind);
    if (!half.ok()) {
      std::error_code ec;
      if (fs::exists(dir / part, ec) && out.unread.empty()) {
        out.unread = part + "/" + io::kManifestName + ": " + half.status().message();
      }
      opaque.push_back(part + "/");
      return;
    }
    allowed.insert(part + "/" + io::kManifestName);
    for (const io::ManifestFile& f : half->files) allowed.insert(part + "/" + f.name);
  };
  list(io::kDenseHalf, io::kDenseHalf);
  for (std::size_t i = 0; i < m.sparse.size(); ++i) {
    list(io::sparse_part_folder(i, m.sparse.size()), io::kSparseHalf);
  }
  allowed.insert(io::kSparseHalf);
  for (const char* half : {io::kDenseHalf, io::kSparseHalf}) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir / half, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string rel = it->path().lexically_relative(dir).generic_string();
      const bool inside_opaque = std::any_of(opaque.begin(), opaque.end(), [&](const auto& o) {
        return rel.compare(0, o.size(), o) == 0;
      });
      if (inside_opaque || allowed.count(rel) > 0 || allowed.count(without_tmp(rel)) > 0 ||
          inside_staging(rel, allowed)) {
        continue;
      }
      out.foreign = rel;
      return out;
    }
  }
  return out;
}

// The first entry of save folder `dir` that a save does not write, its halves' files included;
// "" when there is none. A folder without a readable model manifest (a staging copy not
// finished) is judged by its top level alone.
std::string foreign_in_save(const fs::path& dir, std::string* unread = nullptr) {
  const std::string top = foreign_entry(dir);
  if (!top.empty()) return top;
  auto m = io::read_model_manifest(io::FileEnv::posix(), dir.string());
  if (!m.ok()) return "";
  HalvesCheck halves = check_halves_entries(dir, *m);
  if (unread != nullptr) *unread = halves.unread;
  return halves.foreign;
}

struct Candidate {
  fs::path dir;
  uint64_t number = 0;
  bool staging = false;  // `<pass>.tmp`
};

// The save folders (and staging copies) under `save_path` numbered `passes` or more, except
// those `start_from` restores from, in pass order.
std::vector<Candidate> later_saves(const std::string& save_path, const std::string& start_from,
                                   int64_t passes) {
  const std::vector<fs::path> kept = kept_saves(start_from);
  std::vector<Candidate> out;
  std::error_code ec;
  for (fs::directory_iterator it(save_path, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    const std::string name = dir.filename().string();
    std::error_code entry_ec;  // an entry that cannot be read is not a save of ours
    const std::optional<int64_t> pass = save_folder_pass(without_tmp(name));
    if (!it->is_directory(entry_ec) || !pass) continue;
    Candidate c{dir, static_cast<uint64_t>(*pass), name != without_tmp(name)};
    if (c.number < static_cast<uint64_t>(std::max<int64_t>(passes, 0))) continue;
    if (!c.staging && !is_save_folder(dir.string())) continue;  // a numbered folder of the user's
    const bool is_kept = std::any_of(kept.begin(), kept.end(),
                                     [&](const fs::path& k) { return same_folder(k, dir); });
    if (!is_kept) out.push_back(c);
  }
  GPUBOX_EXPECTS(!ec, "runner.model_save_path ", save_path, ": cannot list it: ", ec.message());
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.number != b.number ? a.number < b.number : a.staging < b.staging;
  });
  return out;
}

// Why `c` is kept apart from what it holds (foreign_in_save), or "" when its removal hangs on
// its entries alone: its model manifest names its pass and a sequence below `newest`; a staging
// copy without a model manifest holds only halves being written (`dense.tmp`, `sparse.tmp`:
// a committed half's files are listed by nothing that could be checked).
std::string kept_regardless(const Candidate& c, uint64_t newest) {
  auto m = io::read_model_manifest(io::FileEnv::posix(), c.dir.string());
  if (c.staging && !m.ok()) {
    std::error_code ec;
    for (fs::directory_iterator it(c.dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name == without_tmp(name)) {
        return "an unfinished save whose half '" + name + "' is committed: not checked";
      }
    }
    return ec ? "it cannot be listed: " + ec.message() : "";
  }
  if (!m.ok()) {
    return fs::exists(c.dir / "MANIFEST") ? "it is a save of an older layout (MANIFEST, no " +
                                                std::string(io::kModelManifestName) + ")"
                                          : "its " + std::string(io::kModelManifestName) +
                                                " does not read back: " + m.status().message();
  }
  if (m->pass < 1 || static_cast<uint64_t>(m->pass - 1) != c.number) {
    return "its " + std::string(io::kModelManifestName) + " is of pass " +
           std::to_string(m->pass - 1) + ", not its folder's";
  }
  if (m->sequence >= newest) return "it is not older than this run's last save";
  return "";
}

// Why `c` is not provably an earlier run's save (its removal is skipped), or "" when it is: its
// entries are a save's, and kept_regardless finds nothing.
std::string not_provable(const Candidate& c, uint64_t newest) {
  std::string unread;
  const std::string foreign = foreign_in_save(c.dir, &unread);
  if (!foreign.empty()) return "it also holds '" + foreign + "', not written by a save";
  if (!unread.empty()) return "its halves' files cannot be checked: " + unread;
  return kept_regardless(c, newest);
}

}  // namespace

void delete_removal_leftovers(const std::string& save_path, bool locked) {
  std::error_code ec;
  if (save_path.empty() || !locked || !fs::is_directory(save_path, ec)) return;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(save_path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(kDoomedPrefix, 0) == 0) doomed.push_back(it->path());
  }
  for (const fs::path& dir : doomed) {
    std::error_code type_ec;
    std::string why;
    if (!fs::is_directory(fs::symlink_status(dir, type_ec))) {
      why = "not a folder (a file or a symbolic link)";
    } else {
      const std::string foreign = foreign_in_save(dir);
      if (!foreign.empty()) why = "it holds '" + foreign + "', not written by a save";
    }
    if (!why.empty()) {
      GPUBOX_LOG(WARNING) << "runner.model_save_path " << save_path << ": kept " << dir.string()
                          << ", named like what a removal left but not deleted: " << why
                          << "; remove or rename it yourself";
      continue;
    }
    std::error_code rm;
    fs::remove_all(dir, rm);
    if (rm) {
      GPUBOX_LOG(WARNING) << "cannot delete " << dir.string() << ": " << rm.message();
    } else {
      GPUBOX_LOG(INFO) << "runner.model_save_path " << save_path << ": deleted " << dir.string()
                       << ", an earlier run's save whose removal was interrupted";
    }
  }
}

void check_earlier_saves(const std::string& save_path, const std::string& start_from,
                         int64_t passes) {
  std::error_code ec;
  if (save_path.empty() || !fs::is_directory(save_path, ec)) return;
  for (const Candidate& c : later_saves(save_path, start_from, passes)) {
    // A folder the end keeps anyway (another pass's, an older layout) is not refused; this
    // run's saves will all be newer than the folder's.
    if (!kept_regardless(c, UINT64_MAX).empty()) continue;
    const std::string foreign = foreign_in_save(c.dir);
    GPUBOX_EXPECTS(foreign.empty(), "runner.model_save_path ", save_path, ": this run saves ",
                   passes, " passes (0 to ", passes - 1, "), and ", c.dir.string(),
                   " holds a save of an earlier run, which its end would remove so that no save "
                   "of two runs is taken for one, but that folder also holds '",
                   foreign,
                   "', not written by a save: move what you keep out of it (or remove it), or "
                   "use another runner.model_save_path");
  }
}

void remove_earlier_saves(const std::string& save_path, const std::string& start_from,
                          int64_t passes, bool locked) {
  std::error_code ec;
  if (save_path.empty() || passes < 1 || !fs::is_directory(save_path, ec)) return;
  const std::vector<Candidate> later = later_saves(save_path, start_from, passes);
  if (later.empty()) return;
  const std::string where = "runner.model_save_path " + save_path + ": ";
  if (!locked) {
    GPUBOX_LOG(WARNING) << where << "the saves after this run's last (from "
                        << later.front().dir.string()
                        << ") are kept: the folder's lock is not held, so another run may be "
                           "saving there; remove an earlier run's saves yourself";
    return;
  }
  const fs::path last = fs::path(save_path) / std::to_string(passes - 1);
  auto last_manifest = io::read_model_manifest(io::FileEnv::posix(), last.string());
  if (!last_manifest.ok()) {
    GPUBOX_LOG(WARNING) << where << "the saves after this run's last are kept: "
                        << last_manifest.status().message();
    return;
  }
  delete_removal_leftovers(save_path, locked);
  std::string removed, kept;
  for (const Candidate& c : later) {
    const std::string why = not_provable(c, last_manifest->sequence);
    const std::string name = c.dir.filename().string();
    if (!why.empty()) {
      kept += (kept.empty() ? "" : "; ") + name + " (" + why + ")";
      continue;
    }
    // Renamed first (one step): a run killed while deleting leaves no partial save to load.
    const fs::path doomed = c.dir.parent_path() / (kDoomedPrefix + name);
    std::error_code rm;
    const bool link = fs::is_symlink(fs::symlink_status(c.dir, rm));
    fs::rename(c.dir, doomed, rm);
    if (rm) {
      kept += (kept.empty() ? "" : "; ") + name + " (renaming it failed: " + rm.message() + ")";
      continue;
    }
    fs::remove_all(doomed, rm);  // what is left of it, the next run deletes
    if (rm) GPUBOX_LOG(WARNING) << "cannot delete " << doomed.string() << ": " << rm.message();
    removed +=
        (removed.empty() ? "" : ", ") + name + (link ? " (a symbolic link: its target kept)" : "");
  }
  if (!removed.empty()) {
    GPUBOX_LOG(WARNING) << where << "this run ended its job, and removed the saves of an earlier "
                        << "run after its last pass (" << removed
                        << "), so that they are never taken for this run's (resume, --mode "
                           "infer, export); use another runner.model_save_path to keep a run's "
                           "saves";
  }
  if (!kept.empty()) {
    GPUBOX_LOG(WARNING) << where << "kept the numbered folders after this run's last pass that "
                        << "are not provably an earlier run's save: " << kept
                        << "; --mode infer and export over this folder may refuse them";
  }
}

}  // namespace gpubox::trainer
