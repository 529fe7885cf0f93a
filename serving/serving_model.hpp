// The serving model: what `gpubox_train --mode export` writes and gpubox_serve loads.
//
// An export folder is a save folder of kind "serving" (table/io/save_dir.hpp: written into
// `<out>.tmp`, every file fsync'ed, a MANIFEST with each file's record count, size and xxh64
// checksum written last, swapped in atomically). It holds only what inference reads:
//   dense           the dense net's parameters: float32, little-endian, in DenseParameters'
//                   flat layout (no optimizer state; fat_deepffm's undropped bias, a save's
//                   block of its own, added to the DNN output's bias: the layout at p = 0)
//   sparse-NNNNN    sparse rows, at most ExportOptions::rows_per_part per file: per row the
//                   key (uint64) and its pull record (show, click, embed_w, embedx_w[mf_dim]:
//                   what the model reads of a row, no optimizer state), float32 or float16
// and MANIFEST properties describing the model and its input (model kind, slot names, mf_dim,
// use_cvm, dense_dim, fc_sizes, for dcn_v2 cross_layers, cross_rank, dcn_structure and
// cross_experts, for dcn cross_layers, for dlrm bot_layer_sizes, for xdeepfm layer_sizes_cin, for
// autoint attn_layer_sizes, head_num, use_residual, scaling and use_wide, the slot text names), the
// dense precision the save was trained in (dense_precision: fp32 or bf16; an export made before the
// key reads as fp32), the value type, the show threshold, and what a key the export does not hold
// reads as: the accessor's
// initial pull record for it (zeros, embed_w from the seeded initial_range when that is not 0),
// which is what `--mode infer` reads for a key the save does not hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config_enums.hpp"
#include "common/status.hpp"
#include "table/key_index_map.hpp"
#include "table/sparse_row/accessor.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/nn/dense_model_types.hpp"

namespace gpubox::serving {

inline constexpr const char* kServingKind = "serving";
inline constexpr const char* kServingFormat = "gpubox-serving-1";

enum class ValueType { kFloat32, kFloat16 };

struct ExportOptions {
  // Rows whose show count is below this are left out (they read as unknown keys); 0 keeps all.
  double show_threshold = 0.0;
  ValueType value_type = ValueType::kFloat32;
  std::size_t rows_per_part = std::size_t{1} << 20;
};

struct ExportSummary {
  uint64_t rows_in_save = 0;
  uint64_t rows_exported = 0;
  uint64_t dense_parameters = 0;
  uint64_t parts = 0;
  uint64_t bytes = 0;  // of every file written, the MANIFEST excepted
  // The dense precision recorded: the one the save was trained in.
  trainer::DensePrecision precision = trainer::DensePrecision::kFp32;
};

// Writes the serving model of the save `save_dir` (a Trainer::save folder: sparse/ and dense/)
// into `out_dir`. `config` describes the model that was trained (as for --mode infer); the dense
// precision recorded is the one the save was trained in (its MODEL_MANIFEST's dense_precision:
// what the dense net computed in, fp32 where bf16 was asked but the network or the card has none;
// a save made before it records only what was asked, and is exported as fp32, a bf16 ask
// logged; a config whose dense_precision differs from the save's is logged). Reads
// the save with the host tier's own loader, so a corrupt or partial save is refused naming its
// file. Not thread-safe with another export to the same folder.
StatusOr<ExportSummary> export_serving_model(const trainer::TrainerConfig& config,
                                             const std::string& save_dir,
                                             const std::string& out_dir,
                                             const ExportOptions& options);

// What an export's MANIFEST says about the model and its input.
struct ServingSpec {
  // kind, slots, mf_dim, use_cvm, dense_dim, fc_sizes, cross_*, ...; precision: the one trained
  // in (gpubox_serve serves in it unless --precision says otherwise)
  trainer::DenseModelConfig model;
  std::vector<std::string> slot_names;
  std::string label_name;
  std::string dense_name;
  bool feasign_first = false;
  // What the dense values went through in training (runner.dense_transform as applied: a
  // PaddleRec folder's reader's when auto); exports made before it record none.
  config::DenseTransform dense_transform = config::DenseTransform::kNone;
  ValueType value_type = ValueType::kFloat32;
  // How many of a record's first values (show, click) are float32 in a float16 export: 2 since
  // counts_type was recorded (a popular key's show count passes float16's 65504 and read back
  // as inf: a use_cvm model then served one prediction for every input), 0 before.
  int float32_counts = 0;
  double show_threshold = 0.0;
  uint64_t rows = 0;
  uint64_t dense_parameters = 0;
  // For the initial pull record of keys the export does not hold (table::init_row).
  table::AccessorConfig sparse;

  int pull_dim() const { return 3 + model.mf_dim; }
};

// A loaded export, in host memory: the dense parameters, and the sparse pull records behind one
// key -> record map (a key is one row whatever slot it appears in, as in training).
// Immutable once loaded: every const method may be called from any thread.
class ServingModel {
 public:
  // Reads and verifies `dir`: the MANIFEST's own checksum, then each file's size and checksum,
  // record sizes and counts against the MANIFEST, no key twice. Errors name the file.
  static StatusOr<ServingModel> load(const std::string& dir);

  const ServingSpec& spec() const { return spec_; }
  const std::vector<float>& dense_values() const { return dense_; }
  std::size_t rows() const { return index_.size(); }
  // The pull record of `key` (pull_dim() floats), nullptr when the export does not hold it.
  const float* find(uint64_t key) const {
    const uint32_t at = index_.find(key);
    return at == table::KeyIndexMap::kAbsent
               ? nullptr
               : records_.data() + static_cast<std::size_t>(at) * spec_.pull_dim();
  }
  // The pull record a key the export does not hold reads as (pull_dim() floats into `out`).
  void initial_record(uint64_t key, float* out) const;

 private:
  // One sparse-NNNNN file's records (already checksummed) into the index, checked for size and
  // for keys seen before.
  Status add_sparse_part(const std::string& path, const std::string& data, uint64_t records);

  ServingSpec spec_;
  std::vector<float> dense_;
  std::vector<float> records_;  // rows() x pull_dim()
  table::KeyIndexMap index_;
};

}  // namespace gpubox::serving
