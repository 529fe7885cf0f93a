#include "trainer/config/unread_keys.hpp"

#include <algorithm>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/config_enums.hpp"
#include "common/config/network_shape.hpp"
#include "common/enum_names.hpp"
#include "table/sparse_config.hpp"

namespace gpubox::trainer {
namespace {

// Keys of one network's parts, set for another network that reads none of them: "a; b" naming
// each and the networks that read it ("" when none). A cross_num on deepfm trained deepfm without
// a word (the network is the config's or its folder's; the key is another's).
std::string other_networks_keys(const config::ConfigDocument& doc) {
  using config::ModelKind;
  struct NetworkKey {
    const char* key;
    std::vector<ModelKind> read_by;
    const char* networks;
  };
  static const NetworkKey kKeys[] = {
      {"hyper_parameters.cross_layers", {ModelKind::kDcn, ModelKind::kDcnV2}, "dcn, dcn_v2"},
      {"hyper_parameters.cross_l2", {ModelKind::kDcn, ModelKind::kDcnV2}, "dcn, dcn_v2"},
      {"hyper_parameters.cross_rank", {ModelKind::kDcnV2}, "dcn_v2"},
      {"hyper_parameters.dcn_structure", {ModelKind::kDcnV2}, "dcn_v2"},
      {"hyper_parameters.cross_mixture", {ModelKind::kDcnV2}, "dcn_v2"},
      {"hyper_parameters.cross_experts", {ModelKind::kDcnV2}, "dcn_v2"},
      {"hyper_parameters.bot_layer_sizes", {ModelKind::kDlrm}, "dlrm"},
      {"hyper_parameters.layer_sizes_cin", {ModelKind::kXdeepfm}, "xdeepfm"},
      {"hyper_parameters.attn_layer_sizes", {ModelKind::kAutoint}, "autoint"},
      {"hyper_parameters.head_num", {ModelKind::kAutoint}, "autoint"},
      {"hyper_parameters.use_residual", {ModelKind::kAutoint}, "autoint"},
      {"hyper_parameters.scaling", {ModelKind::kAutoint}, "autoint"},
      {"hyper_parameters.use_wide", {ModelKind::kAutoint}, "autoint"},
      {"hyper_parameters.field_group_sizes", {ModelKind::kFlen}, "flen"},
      {"hyper_parameters.sparse_num_field", {ModelKind::kFlen}, "flen"}};
  const StatusOr<config::NetworkChoice> network = config::resolve_network(doc);
  if (!network.ok()) return "";  // refused elsewhere, naming why
  std::string keys;
  for (const NetworkKey& k : kKeys) {
    if (doc.is_default(k.key) ||
        std::find(k.read_by.begin(), k.read_by.end(), network->model) != k.read_by.end()) {
      continue;
    }
    keys += std::string(keys.empty() ? "" : "; ") + k.key + " (" + k.networks + ")";
  }
  if (keys.empty()) return "";
  return doc.source() + ": set, but not read by the network it trains, " +
         name_of(config::kModelKindNames, network->model) + " (" + network->source + "): " + keys +
         "; is hyper_parameters.model (or the model folder) the one meant?";
}

// Keys of one optimizer class set where the class the run steps with reads none of them: "a; b"
// naming each and the classes that read it ("" when none). beta1 under SGD, initial_g2sum under
// adam trained as the class says without a word.
std::string other_optimizers_keys(const config::ConfigDocument& doc) {
  using config::DenseOptimizerKind;
  using config::SparseOptimizerKind;
  struct ClassKeys {
    std::string key;
    bool read;
    const char* classes;
  };
  const DenseOptimizerKind dense = config::resolve_dense_optimizer(doc);
  const bool adam = dense == DenseOptimizerKind::kAdam;
  const StatusOr<table::AccessorConfig> rows = table::sparse_config_from(doc);
  if (!rows.ok()) return "";  // refused elsewhere, naming why
  const SparseOptimizerKind sparse = rows->optimizer.kind;
  const bool sparse_adam =
      sparse == SparseOptimizerKind::kAdam || sparse == SparseOptimizerKind::kSharedAdam;
  const bool sparse_adagrad = sparse == SparseOptimizerKind::kAdagrad;
  const std::string o = "hyper_parameters.optimizer.";
  const std::string s = "hyper_parameters.sparse_optimizer.";
  const ClassKeys kKeys[] = {
      {o + "beta1", adam, "optimizer.class Adam"},
      {o + "beta2", adam, "optimizer.class Adam"},
      {o + "epsilon", dense != DenseOptimizerKind::kSgd, "optimizer.class Adam, Adagrad"},
      {o + "initial_accumulator_value", dense == DenseOptimizerKind::kAdagrad,
       "optimizer.class Adagrad"},
      {s + "initial_g2sum", sparse_adagrad, "sparse_optimizer.class adagrad"},
      {s + "mf_initial_g2sum", sparse_adagrad, "sparse_optimizer.class adagrad"},
      {s + "beta1_decay_rate", sparse_adam, "sparse_optimizer.class adam, shared_adam"},
      {s + "beta2_decay_rate", sparse_adam, "sparse_optimizer.class adam, shared_adam"},
      {s + "ada_epsilon", sparse_adam, "sparse_optimizer.class adam, shared_adam"},
      {s + "adam_bias_correction", sparse_adam, "sparse_optimizer.class adam, shared_adam"}};
  std::string keys;
  for (const ClassKeys& k : kKeys) {
    if (k.read || doc.is_default(k.key)) continue;
    keys += (keys.empty() ? "" : "; ") + k.key + " (" + k.classes + ")";
  }
  if (keys.empty()) return "";
  return doc.source() + ": set, but not read by the optimizers the run steps with (" +
         "optimizer.class " + name_of(config::kDenseOptimizerKindNames, dense) + ", the rows' " +
         name_of(config::kSparseOptimizerKindNames, sparse) + "): " + keys;
}

}  // namespace

std::string unread_keys_note(const config::ConfigDocument& doc) {
  using config::SyncMode;
  struct ModeKey {
    const char* key;
    std::vector<SyncMode> read_in;
    const char* modes;
  };
  static const ModeKey kModeKeys[] = {
      {"runner.geo_step", {SyncMode::kGeo}, "geo"},
      {"runner.dense_sync_steps", {SyncMode::kAsync, SyncMode::kSync}, "async and sync"},
      {"runner.split_file_list",
       {SyncMode::kAsync, SyncMode::kSync, SyncMode::kGeo},
       "async, sync and geo"},
      // The card tier's (the PS modes' training threads pull from the servers, no card tier).
      {"runner.card_memory_mb", {SyncMode::kGpubox}, "gpubox"},
      {"runner.prefetch_passes", {SyncMode::kGpubox}, "gpubox"},
      {"runner.next_pass_chunk_keys", {SyncMode::kGpubox}, "gpubox"},
      {"runner.staging_nice", {SyncMode::kGpubox}, "gpubox"}};
  const SyncMode mode = doc.get_enum("runner.sync_mode", config::kSyncModeNames);
  std::string keys;
  for (const ModeKey& k : kModeKeys) {
    if (doc.is_default(k.key) ||
        std::find(k.read_in.begin(), k.read_in.end(), mode) != k.read_in.end()) {
      continue;
    }
    keys += std::string(keys.empty() ? "" : "; ") + k.key + " (read in " + k.modes + " mode)";
  }
  std::string note;
  if (!keys.empty()) {
    note = doc.source() + ": set, but not read in runner.sync_mode " +
           name_of(config::kSyncModeNames, mode) + ": " + keys;
  }
  if (!doc.get_string_list("runner.pass_dirs").empty() &&
      !doc.is_default("runner.train_data_dir")) {
    note += std::string(note.empty() ? doc.source() + ": " : "; ") + "runner.train_data_dir (" +
            doc.get_string("runner.train_data_dir") + ") is not read: runner.pass_dirs replaces it";
  }
  for (const std::string& more : {other_networks_keys(doc), other_optimizers_keys(doc)}) {
    if (!more.empty()) note += (note.empty() ? "" : "\n") + more;
  }
  return note;
}

}  // namespace gpubox::trainer
