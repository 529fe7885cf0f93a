// The model manifest: what makes the two halves of a save one save. The sparse rows are saved by
// the host tier (in-process, or by every gpubox_server on its own disk) and the dense parameters
// by the trainer, each half atomically with its own MANIFEST (save_dir.hpp); a crash between the
// two would leave a new half beside an old one. So every save folder gets one MODEL_MANIFEST,
// written after both halves (fsync'ed, atomic rename) and removed before a save into the folder
// begins: a folder without it holds no complete save. It names each half by the digest of the
// half's MANIFEST (which holds the checksums of every file of the half), the pass, what the
// sparse half holds (a delta names the save it applies onto) and the keys that define the model,
// so that a load refuses halves that do not belong together and says which.
//
// A save folder:
//   MODEL_MANIFEST
//   dense/              the dense parameters and their optimizer state (DenseTable)
//   sparse/             the sparse rows: of the in-process tier or of the one server, or
//   sparse/server-<i>   the share of server i when n > 1 servers hold the keys
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/config/config_enums.hpp"
#include "common/status.hpp"
#include "table/io/file_env.hpp"

namespace gpubox::table::io {

inline constexpr const char* kModelManifestName = "MODEL_MANIFEST";
inline constexpr const char* kDenseHalf = "dense";
inline constexpr const char* kSparseHalf = "sparse";

// The digest that names a save half: XXH3-64 of the bytes of its MANIFEST. It is the generation
// gpubox_server reports for the save it made or loaded (table/server/model_path.hpp), so a half
// on a server's own disk is named without reading it. Never 0.
uint64_t half_digest(const std::string& manifest_bytes);

// Reads `<folder>/MANIFEST`, checks it (its own checksum, and that it describes a `kind` save)
// and returns its digest. NotFound when it is missing.
StatusOr<uint64_t> read_half_digest(FileEnv* env, const std::string& folder,
                                    const std::string& kind);

// The folder of sparse part `i` of `n`, relative to the save folder ("sparse", or
// "sparse/server-<i>" when n > 1, where each server saves its share).
std::string sparse_part_folder(std::size_t i, std::size_t n);

struct ModelManifest {
  int64_t pass = 0;  // the passes trained when it was made (pass p's save, from 0: p + 1)
  // Orders the saves made into one model_save_path, across runs: the newest has the largest.
  uint64_t sequence = 0;
  config::SaveKind mode = config::SaveKind::kBase;  // what the sparse half holds
  // A delta: the save it applies onto (a folder relative to this save's folder, e.g. "../2")
  // and the digest of that save's MODEL_MANIFEST, so a replaced parent is noticed.
  std::string parent;
  uint64_t parent_digest = 0;
  // The save the run that made this one started from (gpubox_train --load), "" when it
  // started from scratch; kept across resumes.
  std::string origin;
  std::map<std::string, std::string> model_keys;  // the model-defining config keys and values
  // What the dense net computed in (card 0's DenseModel::precision()): model_keys' requested
  // hyper_parameters.dense_precision, or fp32 where the network or the card has no bf16 path.
  // Unset for saves made before it was recorded.
  std::optional<config::DensePrecision> dense_precision;
  // The job that made it (older saves: empty, 0): the config keys that shape its result besides
  // the model's, and its data (trainer/schedule/job_identity.hpp), and how many passes it
  // schedules, so a rerun tells a finished job from an interrupted one and this job from another.
  std::map<std::string, std::string> job;
  int64_t job_passes = 0;
  uint64_t dense = 0;            // digest of dense/MANIFEST
  std::vector<uint64_t> sparse;  // digest of each sparse part's MANIFEST

  // xxh64 over the model keys and values: a short name of the model's configuration.
  uint64_t config_hash() const;
  std::string encode() const;
  // `where` names the file in errors.
  static StatusOr<ModelManifest> parse(const std::string& text, const std::string& where);
};

// Writes `<dir>/MODEL_MANIFEST` atomically: to a temporary name, fsync'ed, renamed, folder
// fsync'ed. `*digest` (when given) receives the digest of what was written.
Status write_model_manifest(FileEnv* env, const std::string& dir, const ModelManifest& manifest,
                            uint64_t* digest = nullptr);
// Removes `<dir>/MODEL_MANIFEST` durably (before a save replaces the folder's halves).
Status remove_model_manifest(FileEnv* env, const std::string& dir);
// Reads and checks `<dir>/MODEL_MANIFEST`; NotFound naming it when missing (no complete save).
// `*digest` (when given) receives its digest.
StatusOr<ModelManifest> read_model_manifest(FileEnv* env, const std::string& dir,
                                            uint64_t* digest = nullptr);

// Compares the halves in `dir` with what `manifest` names: the dense half, and each sparse part
// whose MANIFEST is in `dir` (all of them must be when `sparse_required`; a server's share may
// be on its own machine), and the size of every file their MANIFESTs list. OK, or
// InvalidArgument naming every half that differs with both digests, that is missing, or whose
// file is truncated or missing.
Status check_halves(FileEnv* env, const std::string& dir, const ModelManifest& manifest,
                    bool sparse_required);

}  // namespace gpubox::table::io
