#include "trainer/config/config_loader.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <utility>

#include "common/config/config_document.hpp"
#include "common/config/network_shape.hpp"
#include "common/config/row_width.hpp"
#include "common/config/slot_dims.hpp"
#include "dataset/dataset_config.hpp"
#include "table/sparse_config.hpp"
#include "trainer/config/clip_by_norm.hpp"
#include "trainer/config/dnn_dropout.hpp"
#include "trainer/config/network_choice.hpp"

namespace gpubox::trainer {
namespace {

// The runner keys that cannot change what a run trains: where it reads (the data is
// fingerprinted instead: job_identity.hpp), writes, logs and waits, how it evaluates, how it
// overlaps its work (bit-identical either way, as the tests pin) and what it saves.
bool shapes_the_job(const std::string& key) {
  // One key a line:
  // clang-format off
  static const std::set<std::string> outside = {
      "runner.train_data_dir",
      "runner.pass_dirs",
      "runner.test_data_dir",
      "runner.model_save_path",
      "runner.infer_load_path",
      "runner.model_init_path",
      "runner.metrics_path",
      "runner.infer_batch_size",
      "runner.print_interval",
      "runner.stop_on_divergence",
      "runner.infer_start_epoch",
      "runner.infer_end_epoch",
      "runner.prefetch_passes",
      "runner.next_pass_chunk_keys",
      "runner.staging_nice",
      "runner.pass_cache_mb",
      "runner.card_memory_mb",
      "runner.auc_buckets_log2",
      "runner.auth_token_file",
      "runner.collective_timeout_s",
      "runner.peer_timeout_s",
      "runner.resume",
      "runner.save_mode",
  };
  // clang-format on
  return outside.count(key) == 0;
}

// The cross network keys (dcn, dcn_v2); DCN-Mix without a rank is an error. dcn (v1) is always
// parallel, as PaddleRec's: dcn_structure is dcn_v2's (every shipped config sets it, so a set
// "stacked" cannot be told from the default).
Status read_cross_keys(const config::ConfigDocument& doc, HyperParameters& h) {
  const std::string k = "hyper_parameters.";
  h.cross_layers = static_cast<int>(doc.get_int(k + "cross_layers"));
  h.cross_rank = static_cast<int>(doc.get_int(k + "cross_rank"));
  h.dcn_structure = doc.get_enum(k + "dcn_structure", kDcnStructureNames);
  h.cross_mixture = doc.get_bool(k + "cross_mixture");
  h.cross_experts = static_cast<int>(doc.get_int(k + "cross_experts"));
  h.cross_l2 = doc.get_float(k + "cross_l2");
  // dcn (v1) has vector cross layers: a rank or a mixture set for it would be dropped unseen.
  if (h.model == ModelKind::kDcn && (h.cross_mixture || h.cross_rank > 0)) {
    return Status::InvalidArgument(
        doc.source() + ": " + k + "model is dcn (DCN v1: vector cross layers), but " + k +
        (h.cross_mixture ? "cross_mixture (PaddleRec's use_low_rank_mixture) is true"
                         : "cross_rank (PaddleRec's low_rank) is " + std::to_string(h.cross_rank)) +
        ", which only dcn_v2's matrix cross layers have; set " + k + "model: dcn_v2 or drop it");
  }
  if (h.model == ModelKind::kDcnV2 && h.cross_mixture && h.cross_rank == 0) {
    return Status::InvalidArgument(
        doc.source() + ": " + k + "cross_mixture (PaddleRec's use_low_rank_mixture) is true, " +
        "but the experts' rank " + k + "cross_rank (PaddleRec's low_rank) is 0; set it > 0 " +
        "(PaddleRec's default is 32)");
  }
  return Status::OK();
}

// dlrm's dot interaction takes every slot's embedding (embed_w and embedx: sparse_feature_dim
// values) and the bottom MLP's output as vectors of one width; the bottom MLP reads the dense
// features.
Status check_dlrm(const TrainerConfig& c, const std::string& source) {
  const DenseModelConfig model = c.dense_model_config();
  const int bottom = model.bot_layer_sizes.back();
  for (std::size_t s = 0; s < model.slot_dims.size(); ++s) {
    if (model.slot_dims[s] + 1 != bottom) {
      return Status::InvalidArgument(
          source +
          ": dlrm's dot interaction needs every slot's embedding as wide as the "
          "bottom MLP's output (the last of hyper_parameters.bot_layer_sizes: " +
          std::to_string(bottom) + "), but hyper_parameters.slot_dims gives slot " +
          c.sparse_slot_names()[s] + " " + std::to_string(model.slot_dims[s] + 1) +
          " (embed_w and " + std::to_string(model.slot_dims[s]) + " embedx values)");
    }
  }
  if (model.mf_dim + 1 != bottom) {
    return Status::InvalidArgument(
        source +
        ": dlrm's dot interaction needs the bottom MLP's output (the last of "
        "hyper_parameters.bot_layer_sizes: " +
        std::to_string(bottom) +
        ") as wide as every "
        "slot's embedding (hyper_parameters.sparse_feature_dim: " +
        std::to_string(model.mf_dim + 1) + "); set them equal");
  }
  if (model.dense_dim <= 0) {
    return Status::InvalidArgument(source +
                                   ": dlrm's bottom MLP reads the dense features, but "
                                   "hyper_parameters.dense_input_dim is 0");
  }
  return Status::OK();
}

// xdeepfm's CIN, and its DNN: layer_sizes_dnn when given (PaddleRec's xdeepfm net reads it and
// not fc_sizes, which its config.yaml also sets), else fc_sizes; fat_deepffm's DNN the same way
// (PaddleRec's fat_deepffm reads layer_sizes_dnn). No other network reads layer_sizes_dnn: set
// for one, it is refused rather than dropped unseen; xdeepfm (and deepfefm)
// with slot_dims is refused too.
Status read_xdeepfm_keys(const config::ConfigDocument& doc, HyperParameters& h) {
  const std::string k = "hyper_parameters.";
  h.layer_sizes_cin = doc.get_int_list(k + "layer_sizes_cin");
  // Its fields share one width (the CIN multiplies them element by element; deepfefm's pair
  // matrices are k x k).
  const bool xdeepfm = h.model == ModelKind::kXdeepfm;
  if ((xdeepfm || h.model == ModelKind::kDeepFefm) && !doc.get_int_map(k + "slot_dims").empty()) {
    return Status::InvalidArgument(
        doc.source() + ": " + name_of(kModelKindNames, h.model) + "'s fields share one width (" +
        (xdeepfm ? "its CIN multiplies them element by element"
                 : "its field-pair matrices are k x k") +
        "), but " + k + "slot_dims sets other widths for some slots; leave it empty");
  }
  const std::vector<int> dnn = doc.get_int_list(k + "layer_sizes_dnn");
  if (dnn.empty()) return Status::OK();
  if (h.model != ModelKind::kXdeepfm && h.model != ModelKind::kFlen &&
      h.model != ModelKind::kFatDeepffm) {
    return Status::InvalidArgument(doc.source() + ": " + k +
                                   "layer_sizes_dnn is xdeepfm's, flen's and fat_deepffm's DNN, " +
                                   "but the model is " + name_of(kModelKindNames, h.model) +
                                   ", which reads " + k + "fc_sizes; set that instead");
  }
  h.fc_sizes = dnn;
  return Status::OK();
}

// flen's field groups: field_group_sizes (consecutive slots per group), as many as PaddleRec's
// sparse_num_field says, covering the sparse slots (checked once the dataset's slots are known);
// with slot_dims refused (its groups sum embeddings of one width).
Status read_flen_keys(const config::ConfigDocument& doc, HyperParameters& h) {
  const std::string k = "hyper_parameters.";
  h.field_group_sizes = doc.get_int_list(k + "field_group_sizes");
  const int groups = doc.get_int(k + "sparse_num_field");
  if (h.model != ModelKind::kFlen) return Status::OK();
  if (static_cast<int>(h.field_group_sizes.size()) != groups) {
    return Status::InvalidArgument(doc.source() + ": flen's " + k + "sparse_num_field is " +
                                   std::to_string(groups) + " field groups, but " + k +
                                   "field_group_sizes lists " +
                                   std::to_string(h.field_group_sizes.size()) + " (set both)");
  }
  if (!doc.get_int_map(k + "slot_dims").empty()) {
    return Status::InvalidArgument(doc.source() +
                                   ": flen sums its fields' embeddings by group, "
                                   "so they share one width, but " +
                                   k +
                                   "slot_dims sets other widths for some slots; leave it empty");
  }
  return Status::OK();
}

// autoint's interacting layers (each a multiple of head_num wide); fc_sizes: [] (no DNN) is
// autoint's alone: another network with an MLP needs a hidden layer, and wide, fm and ffm read no
// fc_sizes.
Status read_autoint_keys(const config::ConfigDocument& doc, HyperParameters& h) {
  const std::string k = "hyper_parameters.";
  h.attn_layer_sizes = doc.get_int_list(k + "attn_layer_sizes");
  h.head_num = doc.get_int(k + "head_num");
  h.use_residual = doc.get_bool(k + "use_residual");
  h.scaling = doc.get_bool(k + "scaling");
  h.use_wide = doc.get_bool(k + "use_wide");
  const bool mlp = h.model != ModelKind::kWide && h.model != ModelKind::kFm &&
                   h.model != ModelKind::kFfm && h.model != ModelKind::kAutoint;
  if (mlp && h.fc_sizes.empty()) {
    return Status::InvalidArgument(
        doc.source() + ": " + k + "fc_sizes is [], but " + name_of(kModelKindNames, h.model) +
        " needs a hidden layer in its dnn (only autoint takes [] for no dnn)");
  }
  if (h.model != ModelKind::kAutoint) return Status::OK();
  if (!doc.get_int_map(k + "slot_dims").empty()) {
    return Status::InvalidArgument(doc.source() +
                                   ": autoint's fields share one width (one projection reads "
                                   "them all), but " +
                                   k +
                                   "slot_dims sets other widths for some slots; leave it empty");
  }
  for (int size : h.attn_layer_sizes) {
    if (size % h.head_num != 0) {
      return Status::InvalidArgument(
          doc.source() + ": " + k + "attn_layer_sizes has " + std::to_string(size) +
          ", which head_num " + std::to_string(h.head_num) +
          " does not divide (each head takes attn_layer_size / head_num columns)");
    }
  }
  return Status::OK();
}

// The disk tier's folder (wiped when the tier opens, refused once it holds other files) and the
// saves' are apart: one inside the other, the first run saved into the tier's folder and its
// rerun was refused ("holds '0', which no disk tier writes").
Status check_disk_tier_apart(const TrainerConfig& c, const std::string& source) {
  const std::string& disk = c.host_tier.table.rocksdb_path;
  const std::string& saves = c.runner.model_save_path;
  if (disk.empty() || saves.empty()) return Status::OK();
  std::error_code ec, ec_saves;
  const std::filesystem::path a = std::filesystem::weakly_canonical(disk, ec);
  const std::filesystem::path b = std::filesystem::weakly_canonical(saves, ec_saves);
  if (ec_saves) ec = ec_saves;
  const auto within = [](const std::filesystem::path& inner, const std::filesystem::path& outer) {
    const auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
    return o == outer.end();
  };
  if (ec || (!within(a, b) && !within(b, a))) return Status::OK();
  return Status::InvalidArgument(source + ": runner.rocksdb_path '" + disk +
                                 "' and runner.model_save_path '" + saves +
                                 "' overlap: the disk tier's folder is wiped when it opens and "
                                 "holds nothing else; give them folders apart");
}

// ffm's rows hold one factor per field (config::row_embedx_width): the table part made them that
// wide (config::resolve_embedx_width, as gpubox_server does); refused here when they cannot be.
// fat_deepffm's rows are ffm's.
Status check_ffm_rows(const TrainerConfig& c, const config::ConfigDocument& doc, ModelKind model) {
  const std::string& source = doc.source();
  const std::string name = name_of(kModelKindNames, model);
  const int64_t factor = doc.get_int("hyper_parameters.sparse_feature_dim") - 1;
  const int64_t fields = c.num_sparse_slots() + c.dataset.dense_dim;
  const int64_t width = c.sparse.mf_dim;
  // The table part's fields are the dataset part's (config/network_shape.hpp), but for a data
  // format that counts them otherwise (flen's avazu reader): refused, naming both.
  if (width != config::row_embedx_width(model, factor, c.num_sparse_slots(), c.dataset.dense_dim)) {
    return Status::InvalidArgument(
        source + ": " + name + "'s rows are " + std::to_string(width) +
        " values wide as the table part (and gpubox_server) reads this config, but the data's " +
        std::to_string(fields) + " fields (sparse slots and dense features) give " +
        std::to_string(fields * factor) +
        "; set hyper_parameters.sparse_inputs_slots and dense_input_dim to the data's");
  }
  if (factor < 1) {
    return Status::InvalidArgument(source + ": " + name +
                                   "'s factors have sparse_feature_dim - 1 values, but "
                                   "hyper_parameters.sparse_feature_dim is " +
                                   std::to_string(factor + 1) + " (set it to 2 or more)");
  }
  if (fields < 2) {
    return Status::InvalidArgument(
        source + ": " + name + " pairs fields, but the sparse slots (" +
        std::to_string(c.num_sparse_slots()) + ") and hyper_parameters.dense_input_dim (" +
        std::to_string(c.dataset.dense_dim) + ") make " + std::to_string(fields) + " field");
  }
  if (width > config::kMaxSlotDim) {
    return Status::InvalidArgument(
        source + ": " + name + "'s rows hold a factor of sparse_feature_dim - 1 = " +
        std::to_string(factor) + " values for each of " + std::to_string(fields) +
        " fields (the sparse slots and hyper_parameters.dense_input_dim): " +
        std::to_string(width) + " values, over the " + std::to_string(config::kMaxSlotDim) +
        " a row may hold; lower hyper_parameters.sparse_feature_dim");
  }
  if (!doc.get_int_map("hyper_parameters.slot_dims").empty()) {
    return Status::InvalidArgument(source + ": " + name +
                                   " gives every field's factor one width "
                                   "(sparse_feature_dim - 1), but hyper_parameters.slot_dims "
                                   "sets other widths for some slots; leave it empty");
  }
  return Status::OK();
}

// What a network needs of the other parts, once they are read: dlrm's widths, ffm's and
// fat_deepffm's rows, flen's groups covering the slots.
Status check_network_parts(const TrainerConfig& c, const config::ConfigDocument& doc) {
  const ModelKind model = c.hyper.model;
  if (c.hyper.dnn_batch_norm && c.runner.sync_mode == SyncMode::kGeo) {
    // geo adds each thread's move since its last sync, scaled by 1 / (trainers x threads): fine
    // for weights, which the gradients keep correcting, but measured on a running statistic (a
    // running variance went below 0 and dlrm's held-out AUC fell to 0.5 on 2 x 2 threads). async
    // averages its statistics' moves the same way and stays bounded (ps_batch_norm_test's
    // AsyncAveragesTheThreadsStatisticMoves; docs/user-guide.md's batch norm).
    return Status::InvalidArgument(
        doc.source() + ": hyper_parameters.dnn_batch_norm is not built for runner.sync_mode " +
        "geo (its summed parameter moves overshoot the running statistics, which are moving " +
        "averages, not trained); use runner.sync_mode async or sync, gpubox or collective, or " +
        "set hyper_parameters.dnn_batch_norm=false" +
        (config::paddlerec_model_name(doc) == "dlrm" &&
                 !doc.is_set("hyper_parameters.dnn_batch_norm")
             ? " (on by default in PaddleRec's dlrm folder)"
             : ""));
  }
  // wide, fm and ffm have no dnn; autoint none with fc_sizes: [] (DenseModel's has_mlp).
  const bool no_dnn = !config::has_dnn(model, c.hyper.fc_sizes.empty());
  if (c.hyper.dnn_batch_norm && no_dnn) {
    return Status::InvalidArgument(
        doc.source() + ": hyper_parameters.dnn_batch_norm=true normalises after every hidden " +
        "layer of the dnn, but " + name_of(kModelKindNames, model) + " has none" +
        (model == ModelKind::kAutoint ? " (hyper_parameters.fc_sizes is [])" : "") +
        "; set hyper_parameters.dnn_batch_norm=false");
  }
  if (model != ModelKind::kDlrm && c.hyper.dlrm_output != DlrmOutput::kLogit &&
      doc.is_set("hyper_parameters.dlrm_output")) {
    return Status::InvalidArgument(
        doc.source() +
        ": hyper_parameters.dlrm_output=" + name_of(kDlrmOutputNames, c.hyper.dlrm_output) +
        " is dlrm's output layer, but the network is " + name_of(kModelKindNames, model) +
        "; remove it or set hyper_parameters.model=dlrm");
  }
  if (model == ModelKind::kDlrm) GPUBOX_RETURN_IF_ERROR(check_dlrm(c, doc.source()));
  if (model == ModelKind::kFfm || model == ModelKind::kFatDeepffm) {
    GPUBOX_RETURN_IF_ERROR(check_ffm_rows(c, doc, model));
  }
  // fm's and deepfm's pairwise part and xdeepfm's CIN and DNN take the embedx part
  // (sparse_feature_dim - 1 values): with none, fm trained wide's network and deepfm
  // wide_deep's, unsaid, and xdeepfm stopped on a layer of no columns.
  if ((model == ModelKind::kFm || model == ModelKind::kDeepFm || model == ModelKind::kXdeepfm) &&
      doc.get_int("hyper_parameters.sparse_feature_dim") < 2) {
    return Status::InvalidArgument(
        doc.source() + ": " + name_of(kModelKindNames, model) + "'s " +
        (model == ModelKind::kXdeepfm ? "CIN and DNN take" : "pairwise interactions take") +
        " each key's factor of sparse_feature_dim - 1 values, but "
        "hyper_parameters.sparse_feature_dim is " +
        std::to_string(doc.get_int("hyper_parameters.sparse_feature_dim")) +
        " (set it to 2 or more" +
        (model == ModelKind::kXdeepfm
             ? ")"
             : std::string(", or hyper_parameters.model=") +
                   (model == ModelKind::kFm ? "wide" : "wide_deep") + " for what it would train)"));
  }
  if (model == ModelKind::kFlen) {
    int grouped = 0;
    for (int size : c.hyper.field_group_sizes) grouped += size;
    if (grouped != c.num_sparse_slots()) {
      return Status::InvalidArgument(
          doc.source() + ": flen's hyper_parameters.field_group_sizes group " +
          std::to_string(grouped) + " slots, but the data has " +
          std::to_string(c.num_sparse_slots()) + " sparse slots (sparse_inputs_slots)");
    }
  }
  return Status::OK();
}

// The keys the table part reads that a save files with the job's, where saves made before the
// table read them put them (a key moved between the two would refuse every older save's resume):
// the schedule, which the table reads only to derive adam_bias_correction (recorded as used).
bool filed_with_the_job(const std::string& key) { return key == "runner.sync_mode"; }

// The shortest text that reads back as `value` (a recorded key, as -o would write it).
std::string float_text(float value) {
  char text[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(value));
    if (std::strtof(text, nullptr) == value) break;
  }
  return text;
}

// The keys a save records: the model's (a load or resume compares them) and the job's (a resume
// continues only the same job), as -o would write them.
void record_keys(const config::ConfigDocument& doc, TrainerConfig* c) {
  for (const config::KeySpec& key : config::config_keys()) {
    const bool hyper = key.name.rfind("hyper_parameters.", 0) == 0;
    if (!key.has_effect()) continue;
    if (hyper || ((key.parts & config::kTable) != 0 && !filed_with_the_job(key.name))) {
      c->model_keys[key.name] = doc.value_text(key.name);
    } else if (shapes_the_job(key.name)) {
      c->job_keys[key.name] = doc.value_text(key.name);
    }
  }
  // The network trained, also when a model folder chose it (a save records what was built).
  c->model_keys["hyper_parameters.model"] = name_of(kModelKindNames, c->hyper.model);
  // Slot names that are the numbered ones a config without them gets: recorded as not given,
  // the same network either way (a load compares the text).
  const std::string names = "hyper_parameters.slot_names";
  const int sparse_inputs_slots =
      static_cast<int>(doc.get_int("hyper_parameters.sparse_inputs_slots"));
  if (doc.is_set(names) &&
      c->dataset.slots == dataset::numbered_slots(sparse_inputs_slots, c->dataset.label_name)) {
    c->model_keys[names] = config::ConfigDocument::defaults().value_text(names);
  }
  // Adagrad's epsilon when the config leaves it: the value used (a resume compares it with the
  // next run's).
  const std::string epsilon = "hyper_parameters.optimizer.epsilon";
  if (c->hyper.optimizer.kind == DenseOptimizerKind::kAdagrad && !doc.is_set(epsilon)) {
    c->model_keys[epsilon] = "1e-06";
  }
  // The rows' bias correction as used: unset, it is derived (per_table for some PaddleRec
  // folders, table::sparse_config_from), and a resume must not switch it under the saved steps.
  c->model_keys["hyper_parameters.sparse_optimizer.adam_bias_correction"] =
      name_of(config::kAdamBiasCorrectionNames, c->sparse.optimizer.bias_correction);
  // The rows' start ranges as used where a PaddleRec folder's network derives them when unset
  // (table::paddlerec_start_range): the manifest says where the rows started, and a save made at
  // other ranges (GPUBox's, before the derivation) is not resumed with its new keys at another
  // spread than its rows (check_saved_derived_keys names the -o that keeps its ranges).
  if (table::paddlerec_start_range(doc)) {
    const std::string why = "derived when unset from PaddleRec's " +
                            config::paddlerec_model_name(doc) + " net.py embedding initialiser";
    const std::pair<const char*, float> used[] = {
        {"hyper_parameters.sparse_optimizer.initial_range", c->sparse.optimizer.initial_range},
        {"hyper_parameters.sparse_optimizer.mf_initial_range",
         c->sparse.optimizer.mf_initial_range}};
    for (const auto& [key, value] : used) {
      if (doc.is_set(key)) continue;
      c->model_keys[key] = float_text(value);
      c->derived_model_keys[key] = why;
    }
  }
}

// A data folder key (runner.train_data_dir, test_data_dir): its one folder, or, given a list,
// the first and, when it names several, the whole list (RunnerConfig::train_data_dirs).
void folders(const config::ConfigDocument& doc, const char* key, std::string* first,
             std::vector<std::string>* all) {
  std::vector<std::string> paths = doc.get_paths(key);
  *first = paths.empty() ? std::string() : paths.front();
  all->clear();
  if (paths.size() > 1) *all = std::move(paths);
}

// The runner.* keys gpubox_train reads itself (the dataset's and tiers' are read by their modules).
Status read_runner_keys(const config::ConfigDocument& doc, RunnerConfig& r) {
  folders(doc, "runner.train_data_dir", &r.train_data_dir, &r.train_data_dirs);
  r.pass_dirs = doc.get_string_list("runner.pass_dirs");
  folders(doc, "runner.test_data_dir", &r.test_data_dir, &r.test_data_dirs);
  r.model_save_path = doc.get_string("runner.model_save_path");
  r.infer_load_path = doc.get_string("runner.infer_load_path");
  r.model_init_path = doc.get_string("runner.model_init_path");
  r.infer_start_epoch = doc.get_int("runner.infer_start_epoch");
  r.infer_end_epoch = doc.get_int("runner.infer_end_epoch");
  r.metrics_path = doc.get_string("runner.metrics_path");
  r.infer_batch_size = doc.get_int("runner.infer_batch_size");
  r.epochs = doc.get_int("runner.epochs");
  r.print_interval = doc.get_int("runner.print_interval");
  r.stop_on_divergence = doc.get_bool("runner.stop_on_divergence");
  r.card_memory_mb = doc.get_int<int64_t>("runner.card_memory_mb");
  r.prefetch_passes = doc.get_int("runner.prefetch_passes");
  r.next_pass_chunk_keys = doc.get_int("runner.next_pass_chunk_keys");
  r.staging_nice = doc.get_int("runner.staging_nice");
  r.pass_cache_mb = doc.get_int<int64_t>("runner.pass_cache_mb");
  r.shuffle = doc.get_bool("runner.shuffle");
  r.seed = doc.get_uint64("runner.seed");
  r.auc_buckets_log2 = doc.get_int("runner.auc_buckets_log2");
  r.save_mode = doc.get_enum("runner.save_mode", table::kSaveKindNames);
  r.resume = doc.get_enum("runner.resume", config::kResumeModeNames);
  r.shrink_every = doc.get_enum("runner.shrink_every", config::kShrinkEveryNames);
  r.auth_token_file = doc.get_string("runner.auth_token_file");
  r.collective_timeout_s = doc.get_float("runner.collective_timeout_s");
  r.peer_timeout_s = doc.get_float("runner.peer_timeout_s");
  r.sync_mode = doc.get_enum("runner.sync_mode", config::kSyncModeNames);
  // PaddleRec: use_fleet without a sync_mode is Collective mode (on GPUs): the gpubox schedule
  // with the table replicated on every card. Every sync_mode runs through fleet there, so with
  // one set, use_fleet changes nothing.
  const bool use_gpu = doc.get_bool("runner.use_gpu");
  if (doc.get_bool("runner.use_fleet") && !doc.is_set("runner.sync_mode")) {
    if (!use_gpu) {
      return Status::InvalidArgument(
          doc.source() +
          ": runner.use_fleet: true with runner.use_gpu: false and no runner.sync_mode names no "
          "mode GPUBox has (Collective runs on GPUs); set runner.use_gpu: true for Collective "
          "mode, or runner.sync_mode to gpubox, async, sync or geo");
    }
    r.collective = true;
  }
  r.geo_step = doc.get_int("runner.geo_step");
  r.dense_sync_steps = doc.get_int("runner.dense_sync_steps");
  r.split_file_list = doc.get_bool("runner.split_file_list");
  r.reader_type = doc.get_enum("runner.reader_type", config::kReaderTypeNames);
  return Status::OK();
}

// hyper_parameters.dnn_batch_norm as trained: the key when set, else on in PaddleRec's dlrm folder
// (its MLPLayer normalises after every layer, with no key to turn it off). Reads the key either
// way.
bool dnn_batch_norm_of(const config::ConfigDocument& doc) {
  const bool batch_norm = doc.get_bool("hyper_parameters.dnn_batch_norm");
  return doc.is_set("hyper_parameters.dnn_batch_norm")
             ? batch_norm
             : config::paddlerec_model_name(doc) == "dlrm";
}

// The hyper_parameters.* keys of the dense network and its optimizer.
Status read_hyper_keys(const config::ConfigDocument& doc, HyperParameters& h) {
  const std::string o = "hyper_parameters.optimizer.";
  // Adam in PaddleRec's dlrm folder, as its network trains (config::resolve_dense_optimizer).
  h.optimizer.kind = config::resolve_dense_optimizer(doc);
  h.optimizer.learning_rate = static_cast<float>(doc.get_float(o + "learning_rate"));
  h.optimizer.beta1 = static_cast<float>(doc.get_float(o + "beta1"));
  h.optimizer.beta2 = static_cast<float>(doc.get_float(o + "beta2"));
  h.optimizer.epsilon = static_cast<float>(doc.get_float(o + "epsilon"));
  // Adagrad's epsilon is Paddle's Adagrad default (1e-6) unless set: 1e-8 is Adam's default.
  if (h.optimizer.kind == DenseOptimizerKind::kAdagrad && !doc.is_set(o + "epsilon")) {
    h.optimizer.epsilon = 1e-6f;
  }
  h.optimizer.initial_accumulator =
      static_cast<float>(doc.get_float(o + "initial_accumulator_value"));
  h.fc_sizes = doc.get_int_list("hyper_parameters.fc_sizes");
  // The model key, else the network its PaddleRec model folder names (as the table part, and so
  // gpubox_server, resolves it: their rows' width depends on it).
  StatusOr<NetworkChoice> choice = config::resolve_network(doc);
  if (!choice.ok()) return choice.status();
  h.model = choice->model;
  h.model_source = choice->source;
  h.use_cvm = doc.get_bool("hyper_parameters.use_cvm");
  h.dense_precision = doc.get_enum("hyper_parameters.dense_precision", kDensePrecisionNames);
  if (Status cross = read_cross_keys(doc, h); !cross.ok()) return cross;
  h.bot_layer_sizes = doc.get_int_list("hyper_parameters.bot_layer_sizes");
  h.dnn_batch_norm = dnn_batch_norm_of(doc);
  h.dnn_dropout = dnn_dropout_of(doc);
  // PaddleRec's dlrm ends its top MLP (top_layer_sizes) in a 2-wide softmax. Another network
  // keeps its logit (asking otherwise is refused: check_network_parts).
  h.dlrm_output = config::resolve_dlrm_output(doc);
  if (Status dnn = read_xdeepfm_keys(doc, h); !dnn.ok()) return dnn;
  if (Status autoint = read_autoint_keys(doc, h); !autoint.ok()) return autoint;
  if (Status flen = read_flen_keys(doc, h); !flen.ok()) return flen;
  return Status::OK();
}

}  // namespace

StatusOr<TrainerConfig> trainer_config_from(const config::ConfigDocument& doc) {
  TrainerConfig c;
  GPUBOX_RETURN_IF_ERROR(read_runner_keys(doc, c.runner));
  GPUBOX_RETURN_IF_ERROR(read_hyper_keys(doc, c.hyper));
  c.hyper.clip_by_norm = clip_by_norm_of(doc);
  StatusOr<dataset::DatasetConfig> dataset = dataset::dataset_config_from(doc);
  if (!dataset.ok()) return dataset.status();
  c.dataset = std::move(dataset).value();
  StatusOr<table::AccessorConfig> rows = table::sparse_config_from(doc);
  if (!rows.ok()) return rows.status();
  c.sparse = std::move(rows).value();
  c.host_tier = table::host_tier_config_from(doc);
  // cold_after_days acts only through a shrink: without one it would be a silent no-op.
  if (c.runner.shrink_every == ShrinkEvery::kNever && c.host_tier.table.cold_after_days > 0) {
    return Status::InvalidArgument(
        doc.source() + ": runner.cold_after_days is " +
        std::to_string(c.host_tier.table.cold_after_days) +
        " but runner.shrink_every is never: rows move to disk only in a shrink; set "
        "runner.shrink_every to pass or epoch, or runner.cold_after_days to 0");
  }
  GPUBOX_RETURN_IF_ERROR(check_disk_tier_apart(c, doc.source()));
  GPUBOX_RETURN_IF_ERROR(check_network_parts(c, doc));
  GPUBOX_RETURN_IF_ERROR(check_dnn_dropout(c, doc));
  GPUBOX_RETURN_IF_ERROR(check_clip_by_norm(c, doc));
  record_keys(doc, &c);
  // The effective value (PaddleRec's dlrm folder turns it on unset): a load compares it.
  c.model_keys["hyper_parameters.dnn_batch_norm"] = c.hyper.dnn_batch_norm ? "true" : "false";
  c.model_keys["hyper_parameters.dlrm_output"] = name_of(kDlrmOutputNames, c.hyper.dlrm_output);
  // The rate trained (a PaddleRec folder's when unset): a resume goes on only at the save's, and
  // one made at another (main's in these folders: 0) is told the -o that resumes it.
  record_dnn_dropout(doc, &c);
  record_clip_by_norm(doc, &c);  // likewise the clip (the dcn_v2 folder's when unset)
  // The dense transform applied, not `auto` (a PaddleRec folder's reader picks it): infer and
  // export elsewhere, or without runner.train_reader_path, compare what the model was fed.
  c.job_keys["runner.dense_transform"] =
      name_of(config::kDenseTransformNames, c.dataset.dense_transform);
  // The dense optimizer used (PaddleRec's dlrm folder trains Adam whatever class says).
  c.model_keys["hyper_parameters.optimizer.class"] =
      name_of(kDenseOptimizerKindNames, c.hyper.optimizer.kind);
  c.config_path = doc.source();
  return c;
}

std::string dnn_batch_norm_note(const config::ConfigDocument& doc) {
  if (doc.is_set("hyper_parameters.dnn_batch_norm") ||
      config::paddlerec_model_name(doc) != "dlrm") {
    return "";
  }
  return "hyper_parameters.dnn_batch_norm: on, PaddleRec's dlrm folder's default (its MLPLayer "
         "puts a BatchNorm1D after every layer's ReLU); -o hyper_parameters.dnn_batch_norm=false "
         "turns it off";
}

std::string dlrm_output_note(const config::ConfigDocument& doc) {
  if (doc.is_set("hyper_parameters.dlrm_output") ||
      config::resolve_dlrm_output(doc) != DlrmOutput::kSoftmax2) {
    return "";
  }
  const std::string norm = dnn_batch_norm_of(doc)
                               ? " and batch-normalised, as its MLPLayer builds every layer"
                               : ", not batch-normalised (hyper_parameters.dnn_batch_norm false), "
                                 "unlike its MLPLayer";
  return "hyper_parameters.dlrm_output: softmax2, PaddleRec's dlrm folder's output layer for its "
         "hyper_parameters.top_layer_sizes' last entry 2 (2 wide, ReLU'd" +
         norm +
         ", a two-class softmax; the prediction its class 1); -o hyper_parameters.dlrm_output="
         "logit trains one linear logit";
}

std::string dlrm_output_warning(const TrainerConfig& c) {
  if (c.hyper.model != ModelKind::kDlrm || c.hyper.dlrm_output != DlrmOutput::kSoftmax2 ||
      c.hyper.dnn_batch_norm) {
    return "";
  }
  return c.config_path +
         ": hyper_parameters.dlrm_output softmax2 without hyper_parameters.dnn_batch_norm, a "
         "network PaddleRec never builds (its MLPLayer normalises after every ReLU): the 2-wide "
         "output layer is ReLU'd before its softmax, and once both outputs are 0 for every input "
         "no gradient reaches them and training stalls for good (logloss ln 2 = 0.693147, AUC "
         "0.5: the job then stops at the first pass that predicts one value for everything); "
         "-o hyper_parameters.dnn_batch_norm=true builds PaddleRec's, -o "
         "hyper_parameters.dlrm_output=logit one linear logit";
}

StatusOr<TrainerConfig> load_trainer_config(const std::string& path,
                                            const std::vector<std::string>& overrides) {
  StatusOr<config::ConfigDocument> doc = config::ConfigDocument::load(path, overrides);
  if (!doc.ok()) return doc.status();
  return trainer_config_from(*doc);
}

StatusOr<TrainerConfig> parse_trainer_config(const std::string& yaml_text,
                                             const std::string& base_dir,
                                             const std::vector<std::string>& overrides,
                                             const std::string& source_name) {
  StatusOr<config::ConfigDocument> doc =
      config::ConfigDocument::parse(yaml_text, base_dir, overrides, source_name);
  if (!doc.ok()) return doc.status();
  return trainer_config_from(*doc);
}

}  // namespace gpubox::trainer
