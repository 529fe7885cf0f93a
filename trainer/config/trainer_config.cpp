#include "trainer/config/trainer_config.hpp"

#include <cstdlib>
#include <iterator>
#include <set>

#include "common/config/config_document.hpp"
#include "common/config/config_keys.hpp"
#include "common/enum_names.hpp"
#include "common/logging.hpp"

namespace gpubox::trainer {

DenseModelConfig TrainerConfig::dense_model_config() const {
  DenseModelConfig model;
  model.kind = hyper.model;
  model.slots = num_sparse_slots();
  model.mf_dim = mf_dim();
  if (sparse.slot_dims.count > 0) {
    model.mf_dim = table::record_layout(sparse).mf_dim;
    for (int s = 0; s < model.slots; ++s) {
      model.slot_dims.push_back(
          table::slot_mf_dim(sparse, dataset::slot_id(dataset.slots, static_cast<std::size_t>(s))));
    }
  }
  model.use_cvm = hyper.use_cvm;
  model.dense_dim = dataset.dense_dim;
  model.fc_sizes = hyper.fc_sizes;
  model.seed = runner.seed;
  model.precision = hyper.dense_precision;
  model.cross_layers = hyper.cross_layers;
  model.cross_rank = hyper.cross_rank;
  model.dcn_structure = hyper.dcn_structure;
  model.cross_experts =
      hyper.model == ModelKind::kDcnV2 && hyper.cross_mixture ? hyper.cross_experts : 0;
  model.cross_l2 = static_cast<float>(hyper.cross_l2);
  model.bot_layer_sizes = hyper.bot_layer_sizes;
  model.batch_norm = hyper.dnn_batch_norm;
  model.dnn_dropout = static_cast<float>(hyper.dnn_dropout);
  model.dlrm_output = hyper.model == ModelKind::kDlrm ? hyper.dlrm_output : DlrmOutput::kLogit;
  model.cin_layer_sizes = hyper.layer_sizes_cin;
  model.attn_layer_sizes = hyper.attn_layer_sizes;
  model.attn_heads = hyper.head_num;
  model.attn_residual = hyper.use_residual;
  model.attn_scaling = hyper.scaling;
  model.attn_use_wide = hyper.use_wide;
  model.flen_groups = hyper.field_group_sizes;
  return model;
}

bool places_rows_only(const std::string& key) {
  for (const char* placing : {"runner.rocksdb_path", "runner.host_memory_row_budget",
                              "runner.host_memory_mb", "runner.server_timeout_s",
                              "runner.server_connect_timeout_s", "runner.server_connections"}) {
    if (key == placing) return true;
  }
  return false;
}

// "key: saved A, now B; ..." for every model key that differs ("" when none). A config built in
// code has no model keys: a save made with one, or a run with one, is not compared.
std::string model_key_differences(const std::map<std::string, std::string>& saved,
                                  const std::map<std::string, std::string>& now) {
  if (now.empty() || saved.empty()) return "";
  std::set<std::string> keys;
  for (const auto& [k, v] : saved) keys.insert(k);
  for (const auto& [k, v] : now) keys.insert(k);
  std::string out;
  for (const std::string& key : keys) {
    if (places_rows_only(key)) continue;
    const auto s = saved.find(key);
    const auto n = now.find(key);
    std::string was = s == saved.end() ? "(not recorded)" : s->second;
    const std::string is = n == now.end() ? "(not a key)" : n->second;
    if (s == saved.end() && config::find_key(key) != nullptr) {
      // A key newer than the save: the run that made it behaved as the key's default.
      const std::string def = config::ConfigDocument::defaults().value_text(key);
      if (is == def) continue;
      was = "(not recorded; its default is " + def + ")";
    }
    if (was != is) out += (out.empty() ? "" : "; ") + key + ": saved " + was + ", now " + is;
  }
  return out;
}

Status check_saved_dense_switches(const std::map<std::string, std::string>& saved_model_keys,
                                  const TrainerConfig& config, const std::string& save_dir) {
  struct Switch {
    std::string key;
    std::string missing;  // what a save from before the key was made with
    std::string config;
    const char* unset;  // what a config that does not set it gets
  };
  const Switch switches[] = {
      {"hyper_parameters.dnn_batch_norm", "false", config.hyper.dnn_batch_norm ? "true" : "false",
       "PaddleRec's dlrm folder turns it on when unset, every other config off"},
      {"hyper_parameters.dlrm_output", "logit",
       name_of(config::kDlrmOutputNames, config.hyper.dlrm_output),
       "PaddleRec's dlrm folder makes it softmax2 when unset and its top_layer_sizes ends in 2, "
       "every other config logit"}};
  for (const Switch& s : switches) {
    const auto found = saved_model_keys.find(s.key);
    const std::string saved = found != saved_model_keys.end() ? found->second : s.missing;
    if (saved == s.config) continue;
    return Status::InvalidArgument(
        "save " + save_dir + " was made with " + s.key + "=" + saved +
        (found == saved_model_keys.end() ? " (it records no such key: made before it)" : "") +
        ", but the config " + config.config_path + " has " + s.config + " (" + s.unset +
        "): add -o " + s.key + "=" + saved + " to read this save");
  }
  return Status::OK();
}

Status check_saved_network(const std::map<std::string, std::string>& saved_model_keys,
                           const std::map<std::string, std::string>& saved_job_keys,
                           const TrainerConfig& config, const std::string& save_dir) {
  // The keys a save loads under whatever they are: the optimizers' (a warm start at other
  // rates), the precision computed in (either reads the same parameters; an export says which
  // it uses), dropout and the cross layers' L2 penalty (training only), the rows' storage, and
  // the tiers' runner.* keys.
  const auto shaping = [](std::map<std::string, std::string> keys) {
    for (auto it = keys.begin(); it != keys.end();) {
      const std::string& k = it->first;
      const bool free =
          k.rfind("hyper_parameters.", 0) != 0 || k.rfind("hyper_parameters.optimizer.", 0) == 0 ||
          k.rfind("hyper_parameters.sparse_optimizer.", 0) == 0 ||
          k == "hyper_parameters.dense_precision" || k == "hyper_parameters.dnn_dropout" ||
          k == "hyper_parameters.cross_l2" || k == "hyper_parameters.sparse_storage";
      it = free ? keys.erase(it) : std::next(it);
    }
    return keys;
  };
  std::string differences =
      model_key_differences(shaping(saved_model_keys), shaping(config.model_keys));
  // What the dense values went through (job keys: saves record them with the job's): the
  // transform as applied (a save from before that records `auto`, the text, is not compared),
  // and Criteo's integer scaling where either side reads Criteo files.
  const auto job_key = [](const std::map<std::string, std::string>& keys, const char* key) {
    const auto found = keys.find(key);
    return found == keys.end() ? std::string() : found->second;
  };
  const auto differ = [&](const char* key) {
    const std::string was = job_key(saved_job_keys, key);
    const std::string is = job_key(config.job_keys, key);
    if (was.empty() || is.empty() || was == is) return;
    differences +=
        (differences.empty() ? "" : "; ") + std::string(key) + ": saved " + was + ", now " + is;
  };
  if (job_key(saved_job_keys, "runner.dense_transform") != "auto") differ("runner.dense_transform");
  if (job_key(saved_job_keys, "runner.data_format") == "criteo" ||
      job_key(config.job_keys, "runner.data_format") == "criteo") {
    differ("runner.criteo_dense");
  }
  if (differences.empty()) return Status::OK();
  return Status::InvalidArgument("save " + save_dir +
                                 " was made for another network or input than "
                                 "the config " +
                                 config.config_path + " describes: " + differences +
                                 "; read it with the config that made it (or -o "
                                 "each key to its saved value)");
}

Status check_saved_row_starts(const std::map<std::string, std::string>& saved_model_keys,
                              const TrainerConfig& config, const std::string& save_dir) {
  std::string differences;
  std::string remedy;
  // An unseen key's row starts with embed_w drawn from initial_range under the seeds (none at
  // 0) and no embedx (made at a push, which evaluating and serving never do): the seeds count
  // only where either range is above 0, and mf_initial_range never.
  const char* const range = "hyper_parameters.sparse_optimizer.initial_range";
  bool drawn = false;
  for (const auto* keys : {&saved_model_keys, &config.model_keys}) {
    const auto found = keys->find(range);
    drawn = drawn || (found != keys->end() && std::strtod(found->second.c_str(), nullptr) > 0);
  }
  for (const char* key : {range, "hyper_parameters.sparse_optimizer.seed", "runner.seed"}) {
    if (key != range && !drawn) continue;
    const auto saved = saved_model_keys.find(key);
    const auto now = config.model_keys.find(key);
    if (saved == saved_model_keys.end() || now == config.model_keys.end() ||
        saved->second == now->second) {
      continue;
    }
    differences += (differences.empty() ? "" : "; ") + std::string(key) + ": saved " +
                   saved->second + ", now " + now->second;
    remedy += std::string(" -o ") + key + "=" + saved->second;
  }
  if (differences.empty()) return Status::OK();
  return Status::InvalidArgument(
      "save " + save_dir + " started its rows at other values than the config " +
      config.config_path + " has: " + differences +
      "; a key the save never saw is read as the row it would have started at, so evaluating or "
      "exporting under other values answers for other rows: add" +
      remedy);
}

void note_saved_precision(const std::map<std::string, std::string>& saved_model_keys,
                          const TrainerConfig& config, const std::string& save_dir) {
  const std::string key = "hyper_parameters.dense_precision";
  const auto saved = saved_model_keys.find(key);
  const auto now = config.model_keys.find(key);
  if (saved == saved_model_keys.end() || now == config.model_keys.end() ||
      saved->second == now->second) {
    return;
  }
  GPUBOX_LOG(WARNING) << "save " << save_dir << " was trained with " << key << "=" << saved->second
                      << "; this run computes its dense net in " << now->second
                      << " (the config's): its figures differ from the save's own a little; add -o "
                      << key << "=" << saved->second << " to compute as it trained";
}

Status check_saved_derived_keys(const std::map<std::string, std::string>& saved_model_keys,
                                const TrainerConfig& config, const std::string& save_dir) {
  for (const auto& [key, why] : config.derived_model_keys) {
    const auto found = saved_model_keys.find(key);
    const std::string saved = found != saved_model_keys.end()
                                  ? found->second
                                  : config::ConfigDocument::defaults().value_text(key);
    const auto now = config.model_keys.find(key);
    if (now == config.model_keys.end() || saved == now->second) continue;
    return Status::InvalidArgument(
        "save " + save_dir + " was made with " + key + "=" + saved +
        (found == saved_model_keys.end() ? " (it records no such key: its default)" : "") +
        ", but the config " + config.config_path + " leaves it unset and has " + now->second +
        " (" + why + "): add -o " + key + "=" + saved + " to resume this save at its start");
  }
  return Status::OK();
}

}  // namespace gpubox::trainer
