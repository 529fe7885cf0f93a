#include "trainer/schedule/earlier_saves.hpp"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/io/model_manifest.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/saved_models.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
namespace io = table::io;

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string without_tmp(const std::string& name) {
  const std::string tmp = ".tmp";
  return name.size() > tmp.size() && name.compare(name.size() - tmp.size(), tmp.size(), tmp) == 0
             ? name.substr(0, name.size() - tmp.size())
             : name;
}

// The save folders `start_from` restores from (itself and its delta chain), normalized.
std::set<std::string> kept_saves(const std::string& start_from) {
  std::set<std::string> kept;
  if (start_from.empty()) return kept;
  kept.insert(fs::absolute(start_from).lexically_normal().string());
  try {
    for (const SavePoint& link : plan_restore(start_from, false).chain) kept.insert(link.dir);
  } catch (const Error&) {
    // Not a complete save here (its load says so): only the folder itself is kept.
  }
  return kept;
}

// The first entry of `dir` that a save does not write, or "" when there is none.
std::string foreign_entry(const fs::path& dir) {
  static const std::set<std::string> kSaveEntries = {table::io::kModelManifestName,
                                                     table::io::kSparseHalf, table::io::kDenseHalf};
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (kSaveEntries.count(without_tmp(name)) == 0) return name;
  }
  return ec ? "(unreadable: " + ec.message() + ")" : "";
}

}  // namespace

uint64_t remove_earlier_saves(const std::string& save_path, const std::string& start_from) {
  std::error_code ec;
  if (save_path.empty() || !fs::is_directory(save_path, ec)) return 0;
  const std::set<std::string> kept = kept_saves(start_from);
  std::vector<fs::path> earlier;
  for (fs::directory_iterator it(save_path, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    const std::string name = dir.filename().string();
    std::error_code entry_ec;  // an entry that cannot be read is not a save of ours
    if (!it->is_directory(entry_ec) || !all_digits(without_tmp(name))) continue;
    const bool staging = name != without_tmp(name);
    if (!staging && !is_save_folder(dir.string())) continue;  // a numbered folder of the user's
    if (kept.count(fs::absolute(dir).lexically_normal().string()) > 0) continue;
    const std::string foreign = foreign_entry(dir);
    GPUBOX_EXPECTS(foreign.empty(), "runner.model_save_path ", save_path,
                   ": this run starts afresh (not a resume), and ", dir.string(),
                   " holds a save of an earlier run, which it would remove so that no save of two "
                   "runs is taken for one, but that folder also holds '",
                   foreign,
                   "', not written by a save: move what you keep out of it (or remove it), or "
                   "use another runner.model_save_path");
    earlier.push_back(dir);
  }
  GPUBOX_EXPECTS(!ec, "runner.model_save_path ", save_path, ": cannot list it: ", ec.message());
  if (earlier.empty()) return 0;
  std::sort(earlier.begin(), earlier.end(), [](const fs::path& a, const fs::path& b) {
    const std::string x = without_tmp(a.filename().string()),
                      y = without_tmp(b.filename().string());
    return x.size() != y.size() ? x.size() < y.size() : a.filename() < b.filename();  // 2 < 10
  });
  std::string names;
  uint64_t highest = 0;
  for (const fs::path& dir : earlier) {
    auto manifest = io::read_model_manifest(io::FileEnv::posix(), dir.string());
    if (manifest.ok()) highest = std::max(highest, manifest->sequence);
    fs::remove_all(dir, ec);
    GPUBOX_EXPECTS(!ec, "removing the earlier run's save ", dir.string(), ": ", ec.message());
    names += (names.empty() ? "" : ", ") + dir.filename().string();
  }
  GPUBOX_LOG(WARNING) << "runner.model_save_path " << save_path
                      << ": this run starts afresh (not a resume): removed the saves of an "
                         "earlier run there ("
                      << names
                      << "), so that its saves are never taken for this run's (resume, --mode "
                         "infer, export); use another runner.model_save_path to keep a run's "
                         "saves";
  return highest;
}

}  // namespace gpubox::trainer
