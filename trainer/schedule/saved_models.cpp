#include "trainer/schedule/saved_models.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <system_error>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "table/io/model_manifest.hpp"

namespace gpubox::trainer {
namespace fs = std::filesystem;

namespace {

bool all_digits(const std::string& name) {
  return !name.empty() && name.size() <= 18 &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Whether `dir`, no save, holds a save's parts being written (a run stopped during its save).
bool unfinished_save(const fs::path& dir) {
  std::error_code ec;
  for (const std::string part : {table::io::kSparseHalf, table::io::kDenseHalf}) {
    if (fs::exists(dir / part, ec) || fs::exists(dir / (part + ".tmp"), ec)) return true;
  }
  return fs::exists(dir / (std::string(table::io::kModelManifestName) + ".tmp"), ec);
}

// The epochs of the numbered saves directly under `dir`, ascending. A save folder whose number
// has leading zeros is listed in `padded`, not read; a numbered folder holding an unfinished
// save's parts, in `unfinished`.
std::vector<int64_t> numbered_saves(const fs::path& dir, std::vector<std::string>* padded,
                                    std::vector<int64_t>* unfinished) {
  std::vector<int64_t> epochs;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!all_digits(name)) continue;
    if (!is_save_folder(it->path().string())) {
      const std::optional<int64_t> number = save_folder_pass(name);
      if (number && unfinished_save(it->path())) unfinished->push_back(*number);
      continue;
    }
    if (const std::optional<int64_t> number = save_folder_pass(name)) {
      epochs.push_back(*number);
    } else {
      padded->push_back(name);
    }
  }
  std::sort(padded->begin(), padded->end());
  std::sort(epochs.begin(), epochs.end());
  return epochs;
}

std::string list_text(const std::vector<int64_t>& epochs, const std::vector<std::string>& padded) {
  std::string out;
  for (int64_t e : epochs) out += (out.empty() ? "" : ", ") + std::to_string(e);
  if (out.empty()) out = "none";
  if (padded.empty()) return out;
  out += " (not read: ";
  for (std::size_t i = 0; i < padded.size(); ++i) out += (i > 0 ? ", " : "") + padded[i];
  return out + ": a save's folder is its pass number, with no leading zeros)";
}

// The saves `picked` (numbered, in order) are of one run: a run saves its passes in order, so
// each model manifest's sequence (the order of the folder's saves, table/io/model_manifest.hpp)
// is above the one before. A save of a lower sequence after one of a higher is an earlier run's,
// left beside a later run's saves (until that run ends its job and removes them:
// earlier_saves.hpp; or copied there): refused, naming both, rather than evaluated as this
// run's. Saves
// without a model manifest (older layouts) are not compared.
void check_one_run(const std::string& load_path, const std::vector<SaveToEvaluate>& picked) {
  const SaveToEvaluate* before = nullptr;
  uint64_t before_sequence = 0;
  for (const SaveToEvaluate& save : picked) {
    auto manifest = table::io::read_model_manifest(table::io::FileEnv::posix(), save.dir);
    if (!manifest.ok()) continue;
    GPUBOX_EXPECTS(
        before == nullptr || manifest->sequence > before_sequence, "'", load_path,
        "' mixes the saves of two runs: ", save.dir, " (sequence ", manifest->sequence,
        ") was saved before ", before->dir, " (sequence ", before_sequence,
        "), so it is of an earlier run than the saves before it, not their pass ", save.epoch,
        ". Evaluate one run: runner.infer_end_epoch ", save.epoch,
        " (this folder's last run ends before it), --load one save, or remove the "
        "earlier run's saves (a training run into this folder removes them when it ends its "
        "job)");
    before = &save;
    before_sequence = manifest->sequence;
  }
}

}  // namespace

std::optional<int64_t> save_folder_pass(const std::string& name) {
  if (!all_digits(name) || (name.size() > 1 && name[0] == '0')) return std::nullopt;
  return std::stoll(name);
}

bool is_save_folder(const std::string& dir) {
  std::error_code ec;
  const fs::path p(dir);
  return fs::exists(p / "MODEL_MANIFEST", ec) || fs::exists(p / "MANIFEST", ec) ||
         (fs::is_directory(p / "sparse", ec) && fs::is_directory(p / "dense", ec));
}

std::vector<SaveToEvaluate> saves_to_evaluate(const std::string& load_path, int64_t start_epoch,
                                              int64_t end_epoch) {
  GPUBOX_EXPECTS(!load_path.empty(),
                 "--mode infer needs --load or runner.infer_load_path (a config's "
                 "runner.model_init_path, PaddleRec's init_model_path, is where training starts, "
                 "not a model to evaluate: name it with --load)");
  if (is_save_folder(load_path)) {
    const std::string name = fs::path(load_path).lexically_normal().filename().string();
    return {{load_path, save_folder_pass(name).value_or(-1)}};
  }
  std::error_code ec;
  GPUBOX_EXPECTS(fs::is_directory(load_path, ec), "runner.infer_load_path '", load_path,
                 "' is neither a save nor a folder of saves (relative model paths are taken from "
                 "the working directory, as PaddleRec takes them)");
  std::vector<std::string> padded;
  std::vector<int64_t> unfinished;
  const std::vector<int64_t> present = numbered_saves(load_path, &padded, &unfinished);
  const int64_t end = end_epoch >= 0 ? end_epoch : (present.empty() ? 0 : present.back() + 1);
  for (int64_t n : unfinished) {
    // Past the saves evaluated "through the last": said, not passed over (a run killed during
    // that save; its rerun saves it whole).
    if (end_epoch < 0 && n >= end) {
      GPUBOX_LOG(WARNING) << (fs::path(load_path) / std::to_string(n)).string()
                          << " holds an unfinished save (its run stopped while saving it): not "
                             "evaluated; the saves evaluated end with "
                          << (present.empty() ? std::string("none") : std::to_string(end - 1));
    }
  }
  const std::string range = "runner.infer_start_epoch " + std::to_string(start_epoch) +
                            ", runner.infer_end_epoch " + std::to_string(end_epoch);
  GPUBOX_EXPECTS(start_epoch < end, "no save to evaluate under '", load_path, "' (", range,
                 "); saves there: ", list_text(present, padded));
  std::vector<SaveToEvaluate> out;
  for (int64_t epoch = start_epoch; epoch < end; ++epoch) {
    const fs::path dir = fs::path(load_path) / std::to_string(epoch);
    GPUBOX_EXPECTS(std::binary_search(present.begin(), present.end(), epoch), "no save of epoch ",
                   epoch, " at '", dir.string(), "' (", range,
                   "); saves there: ", list_text(present, padded));
    out.push_back({dir.string(), epoch});
  }
  check_one_run(load_path, out);
  return out;
}

}  // namespace gpubox::trainer
