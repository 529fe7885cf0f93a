#include "serving/save_to_export.hpp"

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/enum_names.hpp"
#include "common/logging.hpp"
#include "table/dense_table.hpp"
#include "table/io/model_manifest.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::serving {
namespace {

// The dense precision the save was trained in: what its dense net computed in, as its
// MODEL_MANIFEST records it (DenseModel's choice: bf16 asked runs in fp32 where the network or the
// card has no bf16 path). A save made before that records only the
// hyper_parameters.dense_precision it was made with (a model key every save records), which
// says what was asked, not what ran: nothing in it proves bf16 ran, so it is exported as fp32,
// the precision its fp32 master weights are exact in, and a bf16 ask is logged with the
// override. A config whose dense_precision differs from the save's is logged: the export records
// the save's, and --mode infer with that config computes in the config's (gpubox_serve
// --precision serves in either).
StatusOr<trainer::DensePrecision> trained_precision(const table::io::ModelManifest& manifest,
                                                    const trainer::TrainerConfig& config,
                                                    const std::string& save_dir) {
  static const std::string kKey = "hyper_parameters.dense_precision";
  const std::string manifest_path = save_dir + "/" + table::io::kModelManifestName;
  const trainer::DensePrecision configured = config.dense_model_config().precision;
  std::optional<trainer::DensePrecision> asked;  // unset: a save from before the key
  const auto found = manifest.model_keys.find(kKey);
  if (found != manifest.model_keys.end()) {
    auto saved = parse_enum(trainer::kDensePrecisionNames, found->second);
    if (!saved.ok()) {
      return Status::Corruption(manifest_path + ": '" + kKey + "': " + saved.status().message());
    }
    asked = *saved;
  }
  if (asked.has_value() && *asked != configured) {
    GPUBOX_LOG(WARNING) << "save " << save_dir << " was made with " << kKey << "="
                        << name_of(trainer::kDensePrecisionNames, *asked) << ", the config "
                        << config.config_path << " says "
                        << name_of(trainer::kDensePrecisionNames, configured)
                        << ": the export records what the save was trained in"
                        << " (gpubox_serve --precision overrides it)";
  }
  if (manifest.dense_precision.has_value()) return *manifest.dense_precision;
  if (asked.value_or(configured) == trainer::DensePrecision::kBf16) {
    GPUBOX_LOG(WARNING) << manifest_path << " has no dense_precision (a save made before saves "
                        << "recorded what the dense net computed in): "
                        << (asked.has_value() ? "it was made with " : "the config says ") << kKey
                        << "=bf16, which ran in fp32 where the network or the card had no bf16 "
                        << "path, so the export records fp32; gpubox_serve --precision bf16 (or "
                        << "gpubox.load(..., precision=\"bf16\")) serves it in bf16";
  }
  return trainer::DensePrecision::kFp32;
}

// fat_deepffm's undropped bias (trainer::kFatDeepffmBiasBlock, a save's block beside "dense" when
// it trained with dropout) added to the DNN output's bias b, the last value of `dense` (the net's
// layout at p = 0, which the export records and gpubox_serve builds): evaluation has no dropout,
// so its logit w.h + b + first-order + bias is the folded net's exactly. Any other net, or a block
// of another size, is refused.
Status fold_undropped_bias(const table::DenseTable& saved, const trainer::TrainerConfig& config,
                           const std::string& save_dir, std::vector<float>* dense) {
  for (const std::string& name : saved.names()) {
    if (name != "dense" && name != trainer::kFatDeepffmBiasBlock) {
      return Status::InvalidArgument("save " + save_dir + " holds a dense block '" + name +
                                     "' this build does not know (saved by a newer build?)");
    }
  }
  const auto bias = saved.get(trainer::kFatDeepffmBiasBlock);
  if (!bias.has_value()) return Status::OK();
  if (config.hyper.model != trainer::ModelKind::kFatDeepffm) {
    return Status::InvalidArgument(
        "save " + save_dir + " holds the dense block " + trainer::kFatDeepffmBiasBlock +
        " (fat_deepffm's undropped bias), but the config " + config.config_path + " builds " +
        name_of(trainer::kModelKindNames, config.hyper.model) +
        ": export it with the network it was trained as");
  }
  if (bias->values.size() != 1 || dense->empty()) {
    return Status::Corruption("save " + save_dir + ": its dense block " +
                              trainer::kFatDeepffmBiasBlock + " holds " +
                              std::to_string(bias->values.size()) + " values, not 1, beside " +
                              std::to_string(dense->size()) + " dense parameters");
  }
  dense->back() += bias->values[0];
  return Status::OK();
}

// The keys an export may take from the config rather than the save (the rows converted to the
// config's storage, unseen keys started by its rule): said as a warning, as a dense precision
// that differs is, where only a note of the table's loader said the rows were rounded.
void warn_of_conversions(const std::map<std::string, std::string>& saved,
                         const trainer::TrainerConfig& config, const std::string& save_dir) {
  static const std::pair<const char*, const char*> kTaken[] = {
      {"hyper_parameters.sparse_storage",
       "its rows are converted to the config's storage (rounded, where it is 16-bit) and its "
       "MANIFEST says so"},
      {"hyper_parameters.sparse_optimizer.class",
       "its unseen keys start as the config's rule starts a row"}};
  for (const auto& [key, effect] : kTaken) {
    const auto was = saved.find(key);
    const auto now = config.model_keys.find(key);
    if (was == saved.end() || now == config.model_keys.end() || was->second == now->second) {
      continue;
    }
    GPUBOX_LOG(WARNING) << "save " << save_dir << " was trained with " << key << "=" << was->second
                        << ", the config " << config.config_path << " says " << now->second
                        << ": the export is not the model as trained (" << effect << "); -o " << key
                        << "=" << was->second << " exports it as trained";
  }
}

}  // namespace

StatusOr<SaveToExport> read_save_to_export(const trainer::TrainerConfig& config,
                                           const std::string& save_dir) {
  table::io::FileEnv* env = table::io::FileEnv::posix();
  const std::string context = "exporting save " + save_dir;
  auto model_manifest = table::io::read_model_manifest(env, save_dir);
  if (!model_manifest.ok()) return model_manifest.status().with_context(context);
  // The export's manifest says batch norm as the config does (write_network_keys).
  GPUBOX_RETURN_IF_ERROR(
      trainer::check_saved_dense_switches(model_manifest->model_keys, config, save_dir)
          .with_context(context));
  GPUBOX_RETURN_IF_ERROR(trainer::check_saved_network(model_manifest->model_keys,
                                                      model_manifest->job, config, save_dir)
                             .with_context(context));
  // The export's unseen keys read as the rows they would have started at (its MANIFEST's
  // initial_range and sparse_seed): the save's.
  GPUBOX_RETURN_IF_ERROR(
      trainer::check_saved_row_starts(model_manifest->model_keys, config, save_dir)
          .with_context(context));
  if (model_manifest->sparse.size() != 1) {
    return Status::InvalidArgument(
        "save " + save_dir + " keeps its sparse half on " +
        std::to_string(model_manifest->sparse.size()) +
        " servers: export reads a sparse half kept in one piece, which a save of one "
        "process (gpubox mode, or the in-process host tier) is; a save made through several "
        "servers is evaluated through them (--mode infer with the same servers listed) but "
        "cannot be exported yet");
  }
  GPUBOX_RETURN_IF_ERROR(
      table::io::check_halves(env, save_dir, *model_manifest, true).with_context(context));
  warn_of_conversions(model_manifest->model_keys, config, save_dir);
  auto precision = trained_precision(*model_manifest, config, save_dir);
  if (!precision.ok()) return precision.status().with_context(context);
  const std::string sparse_dir = save_dir + "/sparse";
  auto sparse_manifest = table::io::read_manifest(env, sparse_dir, "sparse");
  if (!sparse_manifest.ok()) return sparse_manifest.status().with_context(context);
  // "delta" or "delta+shrinks" (a delta whose loader replays the shrinks it records).
  if (auto mode = sparse_manifest->get("mode"); mode.ok() && mode->rfind("delta", 0) == 0) {
    return Status::InvalidArgument("save " + save_dir +
                                   " is a delta save (only the rows changed since the previous "
                                   "save): export a base or checkpoint save");
  }
  SaveToExport save;
  save.precision = *precision;
  auto table = table::SparseTable::open(config.sparse, table::HostTableConfig{});
  if (!table.ok()) return table.status();
  save.table = std::move(*table);
  GPUBOX_RETURN_IF_ERROR(save.table->load(sparse_dir).with_context(context));
  table::DenseTable dense;
  GPUBOX_RETURN_IF_ERROR(dense.load(save_dir + "/dense").with_context(context));
  const auto block = dense.get("dense");
  if (!block.has_value()) return Status::Corruption("save " + save_dir + " has no dense block");
  save.dense = block->values;
  GPUBOX_RETURN_IF_ERROR(fold_undropped_bias(dense, config, save_dir, &save.dense));
  return save;
}

}  // namespace gpubox::serving
