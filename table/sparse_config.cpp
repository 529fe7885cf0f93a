#include "table/sparse_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/config_enums.hpp"
#include "common/config/network_shape.hpp"
#include "common/config/slot_dims.hpp"
#include "common/enum_names.hpp"
#include "common/error.hpp"
#include "table/sparse_row/rule_fields.hpp"

namespace gpubox::table {
namespace {

static_assert(kMaxSlotDims == config::kMaxSlotDims && kMaxWidthClasses == config::kMaxWidthClasses,
              "the table's slot_dims bounds are the config check's");

SlotDims slot_dims_from(const config::ConfigDocument& doc, int32_t default_dim) {
  // Read whether or not slot_dims names a slot: the table part reads what the key table says.
  auto entries = config::resolve_slot_dims(
      doc.get_int_map("hyper_parameters.slot_dims"),
      doc.get_string_list("hyper_parameters.slot_names"),
      doc.get_int<int32_t>("hyper_parameters.sparse_inputs_slots"), default_dim);
  GPUBOX_EXPECTS(entries.ok(), entries.status().message());
  SlotDims dims;
  for (const config::SlotDim& entry : *entries) {
    if (entry.dim == default_dim) continue;  // the default: nothing to record
    dims.slot[dims.count] = entry.slot;
    dims.dim[dims.count] = entry.dim;
    ++dims.count;
  }
  return dims;
}

const std::string kSo = "hyper_parameters.sparse_optimizer.";
const std::string kDenseOpt = "hyper_parameters.optimizer.";

// How the embedding rows of `doc` step (paddlerec_rows_rule_note).
enum class RowsRule {
  kSparseOptimizer,           // hyper_parameters.sparse_optimizer.*: not a PaddleRec config's case
  kPaddleRecOptimizer,        // PaddleRec's Adam, as the rows' sparse adam
  kSparseOptimizerNotPaddle,  // a PaddleRec config whose SGD / Adagrad the rows do not take
};

RowsRule rows_rule(const config::ConfigDocument& doc) {
  // PaddleRec's dlrm network trains Adam whatever class says (config::resolve_dense_optimizer).
  const bool adam = config::resolve_dense_optimizer(doc) == config::DenseOptimizerKind::kAdam;
  const bool paddlerec_dlrm = config::paddlerec_dlrm_network(doc);
  // Any key of a rule's own (its rates, accumulators, moments, decays, thresholds): a config that
  // tunes one means that rule, not PaddleRec's optimizer. Start values, bounds and the show/click
  // bookkeeping are every rule's.
  for (const char* key : kSparseRuleOwnKeys) {
    if (doc.is_set(kSo + key)) return RowsRule::kSparseOptimizer;
  }
  if ((!doc.is_set(kDenseOpt + "class") && !paddlerec_dlrm) ||
      config::paddlerec_model_name(doc).empty()) {
    return RowsRule::kSparseOptimizer;
  }
  return adam ? RowsRule::kPaddleRecOptimizer : RowsRule::kSparseOptimizerNotPaddle;
}

// The standard deviation of a normal truncated at 2 standard deviations, in those (Paddle's
// TruncatedNormal): sqrt(1 - 4 phi(2) / (Phi(2) - Phi(-2))).
constexpr double kTruncatedAt2StdFactor = 0.8796256610342398;

// The folder's net.py embedding initialiser when `doc` trains the folder's own network; nullptr
// otherwise (no folder, or hyper_parameters.model names another network).
const config::PaddleRecEmbeddingInit* folder_embedding_init(const config::ConfigDocument& doc) {
  const config::PaddleRecEmbeddingInit* init =
      config::paddlerec_embedding_init(config::paddlerec_model_name(doc));
  if (init == nullptr) return nullptr;
  const StatusOr<config::NetworkChoice> network = config::resolve_network(doc);
  const StatusOr<config::NetworkChoice> folder = config::network_from_paddlerec_folder(
      doc.get_string("workspace"), doc.file_path().empty() ? doc.source() : doc.file_path());
  if (!network.ok() || !folder.ok() || network->model != folder->model) return nullptr;
  return init;
}

// The uniform half-width with the standard deviation of `init` (a normal of std
// std_over_sqrt_dim / sqrt(sparse_feature_dim) truncated at 2 std), nullopt when it is of another
// form or not applied (config::PaddleRecEmbeddingInit).
std::optional<float> applied_range(const config::PaddleRecEmbeddingInit* init,
                                   const config::ConfigDocument& doc) {
  if (init == nullptr || !init->applied || init->std_over_sqrt_dim <= 0.0) return std::nullopt;
  const double dim = doc.get_int<int64_t>("hyper_parameters.sparse_feature_dim");
  return static_cast<float>(std::sqrt(3.0) * kTruncatedAt2StdFactor * init->std_over_sqrt_dim /
                            std::sqrt(dim));
}

std::string range_text(float range) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", static_cast<double>(range));
  return text;
}

const std::string kBiasCorrection = kSo + "adam_bias_correction";

// hyper_parameters.sparse_optimizer.adam_bias_correction, set or derived (config_keys.cpp), and
// checked. Derived as Paddle's mode corrects a PaddleRec config's Adam rows: per table in its
// static training without a parameter server (no runner.sync_mode: PaddleRec's static_trainer,
// and Collective with use_fleet; the adam op with lazy_mode), per row with one (sync_mode
// gpubox: PSGPU's SparseAdamOptimizer; async, sync, geo: SparseAdamSGDRule). per_table needs the
// table's step to be one count every card agrees on, which the gpubox schedule (collective
// included: one synchronous step of every card) has; the parameter-server modes apply each
// trainer thread's push on arrival (async, sync) or keep the optimizer state in each thread's
// local copy (geo).
StatusOr<AdamBiasCorrection> adam_bias_correction_of(const config::ConfigDocument& doc,
                                                     SparseOptimizerKind kind) {
  const AdamBiasCorrection set = doc.get_enum(kBiasCorrection, config::kAdamBiasCorrectionNames);
  const config::SyncMode mode = doc.get_enum("runner.sync_mode", config::kSyncModeNames);
  const bool adam = kind == SparseOptimizerKind::kAdam || kind == SparseOptimizerKind::kSharedAdam;
  if (!doc.is_set(kBiasCorrection)) {
    return adam && !doc.is_set("runner.sync_mode") &&
                   rows_rule(doc) == RowsRule::kPaddleRecOptimizer
               ? AdamBiasCorrection::kPerTable
               : AdamBiasCorrection::kPerRow;
  }
  if (set == AdamBiasCorrection::kPerRow) return set;
  if (!adam) {
    return Status::InvalidArgument(
        doc.source() + ": " + kBiasCorrection + ": per_table corrects adam's moments, but the " +
        "rows step under " + name_of(kSparseOptimizerKindNames, kind) + " (" + kSo +
        "class); remove the key or set class adam or shared_adam");
  }
  if (mode != config::SyncMode::kGpubox) {
    return Status::InvalidArgument(
        doc.source() + ": " + kBiasCorrection + ": per_table counts the table's steps, which " +
        "runner.sync_mode " + name_of(config::kSyncModeNames, mode) + " does not have (its " +
        "servers apply each thread's push as it comes; geo's optimizer state is each thread's " +
        "own); Paddle's parameter server corrects per row there: use per_row, or "
        "runner.sync_mode " +
        "gpubox (collective included)");
  }
  return set;
}

// How a PaddleRec config's rows under its Adam correct their moments (paddlerec_rows_rule_note).
std::string correction_note(const config::ConfigDocument& doc) {
  StatusOr<AdamBiasCorrection> correction =
      adam_bias_correction_of(doc, SparseOptimizerKind::kAdam);
  if (correction.ok() && *correction == AdamBiasCorrection::kPerTable) {
    // dcn_v2's folder has only dygraph_model.py: paddle.optimizer.Adam, not lazy.
    const std::string op = config::paddlerec_folder_has_lazy_adam(config::paddlerec_model_name(doc))
                               ? "Paddle's lazy adam op"
                               : "Paddle's Adam (one beta1_pow / beta2_pow a table)";
    return kBiasCorrection + " per_table: the table's step count, as " + op +
           " in its training without a parameter server (no runner.sync_mode)";
  }
  return kBiasCorrection + " per_row: each row's own steps, as Paddle's parameter servers " +
         "(runner.sync_mode gpubox: PSGPU's SparseAdamOptimizer; async, sync, geo: " +
         "SparseAdamSGDRule)";
}

// Where the rows of `doc` start, as `rows` holds them (paddlerec_rows_rule_note): each range
// marked set by the config, from the folder's initialiser, or GPUBox's default.
std::string start_note(const config::ConfigDocument& doc, const AccessorConfig& rows) {
  const config::PaddleRecEmbeddingInit* init = folder_embedding_init(doc);
  const std::optional<float> derived =
      rows.rule_from_paddlerec_optimizer ? applied_range(init, doc) : std::nullopt;
  const auto from = [&](const char* key) -> std::string {
    if (doc.is_set(kSo + key)) return "set by " + kSo + key;
    if (derived) return "derived, as " + kSo + key + " is unset";
    return "GPUBox's " + kSo + key;
  };
  std::string note = "they start at embed_w U(+-" + range_text(rows.optimizer.initial_range) +
                     ") (" + from("initial_range") + "), embedx U(+-" +
                     range_text(rows.optimizer.mf_initial_range) + ") (" +
                     from("mf_initial_range") +
                     "; a key's embedx is made at its first push, so it is 0 at its first "
                     "forward)";
  if (init == nullptr) return note;
  const std::string net =
      config::paddlerec_model_name(doc) + "'s net.py initialiser " + init->initialiser;
  if (derived) return note + ", the std of " + net + " (" + init->why + ")";
  if (init->applied) {
    // Applied under the folder's Adam only: measured there (docs/bench/h158.md).
    const std::optional<float> range = applied_range(init, doc);
    return note + "; not at the std of " + net + ", which GPUBox applies only where the rows " +
           "take the folder's Adam (with no sparse rule key set)" +
           (range ? "; set the two ranges to " + range_text(*range) + " for it" : "");
  }
  return note + "; not at " + net + " (" + init->why + ")";
}

}  // namespace

std::optional<float> paddlerec_start_range(const config::ConfigDocument& doc) {
  if (rows_rule(doc) != RowsRule::kPaddleRecOptimizer) return std::nullopt;
  return applied_range(folder_embedding_init(doc), doc);
}

std::string paddlerec_rows_rule_note(const config::ConfigDocument& doc,
                                     const AccessorConfig& rows) {
  const RowsRule rule = rows_rule(doc);
  const std::string optimizer =
      std::string(name_of(config::kDenseOptimizerKindNames, config::resolve_dense_optimizer(doc))) +
      " at learning_rate " + doc.value_text(kDenseOpt + "learning_rate");
  // PaddleRec's dlrm network steps every parameter with Adam whatever its class says.
  const bool dlrm = config::paddlerec_dlrm_network(doc);
  const std::string paddlerec =
      dlrm ? "the optimizer PaddleRec's dlrm network steps every parameter with whatever " +
                 kDenseOpt + "class says (" + optimizer + ")"
           : "PaddleRec's " + kDenseOpt + "class (" + optimizer + ")";
  // A folder whose start GPUBox applies under its Adam says where the rows start under any rule.
  const config::PaddleRecEmbeddingInit* init = folder_embedding_init(doc);
  const bool start_applied = init != nullptr && init->applied;
  if (rule == RowsRule::kSparseOptimizer) {
    if (!dlrm && !start_applied) return "";
    return doc.source() + ": the embedding rows step under " + kSo + "* as this config sets " +
           "them (class " + doc.value_text(kSo + "class") + ")" +
           (dlrm || doc.is_set(kDenseOpt + "class") ? ", not under " + paddlerec : "") + "; " +
           start_note(doc, rows);
  }
  if (rule == RowsRule::kPaddleRecOptimizer) {
    return doc.source() + ": the embedding rows step under " + paddlerec +
           ", as its trainer steps its embedding tables (" + kSo +
           "class adam at that learning_rate and mf_learning_rate, with its beta1, beta2 and "
           "epsilon, embedx from a key's first step, " +
           correction_note(doc) + "); " + start_note(doc, rows) + "; set " + kSo +
           "class for another rule";
  }
  return doc.source() + ": the embedding rows step under " + kSo +
         "* (class, learning_rate, mf_learning_rate, embedx_threshold: Paddle's parameter-server "
         "rule), not under " +
         paddlerec + ", whose steps on a row scale with the batch; " + start_note(doc, rows);
}

StatusOr<AccessorConfig> sparse_config_from(const config::ConfigDocument& doc) {
  const std::string& so = kSo;
  const auto f = [&](const char* name) { return static_cast<float>(doc.get_float(so + name)); };
  const auto dense = [&](const char* name) {
    return static_cast<float>(doc.get_float(kDenseOpt + name));
  };
  AccessorConfig c;
  c.optimizer.kind = doc.get_enum(so + "class", kSparseOptimizerKindNames);
  // The network the config means (its key, else its PaddleRec model folder: resolved as the
  // trainer resolves it) sets how many factors a row holds.
  StatusOr<int64_t> mf_dim = config::resolve_embedx_width(doc);
  if (!mf_dim.ok()) return mf_dim.status();
  c.mf_dim = static_cast<int32_t>(*mf_dim);
  c.storage = doc.get_enum("hyper_parameters.sparse_storage", kSparseStorageNames);
  c.slot_dims = slot_dims_from(doc, c.mf_dim);
  c.optimizer.learning_rate = f("learning_rate");
  c.optimizer.initial_g2sum = f("initial_g2sum");
  c.optimizer.initial_range = f("initial_range");
  c.optimizer.min_bound = f("min_bound");
  c.optimizer.max_bound = f("max_bound");
  c.optimizer.weight_decay = f("weight_decay");
  c.optimizer.l1_decay = f("l1_decay");
  c.optimizer.mf_learning_rate = f("mf_learning_rate");
  c.optimizer.mf_initial_g2sum = f("mf_initial_g2sum");
  c.optimizer.mf_initial_range = f("mf_initial_range");
  c.optimizer.mf_min_bound = f("mf_min_bound");
  c.optimizer.mf_max_bound = f("mf_max_bound");
  c.optimizer.mf_weight_decay = f("mf_weight_decay");
  c.optimizer.beta1_decay_rate = f("beta1_decay_rate");
  c.optimizer.beta2_decay_rate = f("beta2_decay_rate");
  c.optimizer.ada_epsilon = f("ada_epsilon");
  c.nonclk_coeff = f("nonclk_coeff");
  c.clk_coeff = f("clk_coeff");
  c.show_scale = doc.get_bool(so + "show_scale");
  c.embed_threshold = f("embed_threshold");
  c.embedx_threshold = f("embedx_threshold");
  c.show_click_decay_rate = f("show_click_decay_rate");
  c.delete_threshold = f("delete_threshold");
  c.delete_after_unseen_days = f("delete_after_unseen_days");
  // runner.seed also seeds the dense model and the shuffle; mixing it in gives a different
  // run different embeddings without touching sparse_optimizer.seed.
  c.seed = doc.get_uint64("runner.seed") ^ doc.get_uint64(so + "seed");
  // Read for every config (the table part reads the same keys whatever they hold).
  const float learning_rate = dense("learning_rate");
  const float beta1 = dense("beta1"), beta2 = dense("beta2"), epsilon = dense("epsilon");
  if (rows_rule(doc) == RowsRule::kPaddleRecOptimizer) {
    c.optimizer.kind = SparseOptimizerKind::kAdam;
    c.optimizer.learning_rate = c.optimizer.mf_learning_rate = learning_rate;
    c.optimizer.beta1_decay_rate = beta1;
    c.optimizer.beta2_decay_rate = beta2;
    c.optimizer.ada_epsilon = epsilon;
    c.embedx_threshold = 0.0f;
    c.rule_from_paddlerec_optimizer = true;
    if (const std::optional<float> range = paddlerec_start_range(doc)) {
      if (!doc.is_set(so + "initial_range")) c.optimizer.initial_range = *range;
      if (!doc.is_set(so + "mf_initial_range")) c.optimizer.mf_initial_range = *range;
    }
  }
  StatusOr<AdamBiasCorrection> correction = adam_bias_correction_of(doc, c.optimizer.kind);
  if (!correction.ok()) return correction.status();
  c.optimizer.bias_correction = *correction;
  return c;
}

HostTierConfig host_tier_config_from(const config::ConfigDocument& doc) {
  const std::string r = "runner.";
  HostTierConfig c;
  c.table.shards = doc.get_int<uint32_t>(r + "host_table_shards");
  // The memory plan's mix of width classes: one share a slot (the label is no key slot).
  c.table.key_slots = static_cast<uint32_t>(
      std::max(0, doc.get_int<int32_t>("hyper_parameters.sparse_inputs_slots") - 1));
  c.table.save_form = doc.get_enum(r + "save_form", kSaveFormNames);
  c.table.rocksdb_path = doc.get_string(r + "rocksdb_path");
  c.table.memory_row_budget =
      static_cast<uint64_t>(doc.get_int<int64_t>(r + "host_memory_row_budget"));
  c.table.memory_budget_bytes = static_cast<uint64_t>(doc.get_int<int64_t>(r + "host_memory_mb"))
                                << 20;
  c.table.cold_after_days = doc.get_int<int32_t>(r + "cold_after_days");
  c.remote.deadline_s = doc.get_float(r + "server_timeout_s");
  c.remote.connect_timeout_s = doc.get_float(r + "server_connect_timeout_s");
  c.remote.connections_per_endpoint = doc.get_int<int>(r + "server_connections");
  return c;
}

StatusOr<AccessorConfig> load_sparse_config(const std::string& path,
                                            const std::vector<std::string>& overrides) {
  StatusOr<config::ConfigDocument> doc = config::ConfigDocument::load(path, overrides);
  if (!doc.ok()) return doc.status();
  StatusOr<AccessorConfig> rows = sparse_config_from(*doc);
  if (!rows.ok()) return rows.status();
  AccessorConfig& c = *rows;
  // ffm multiplies the width by its fields (the trainer's loader says the same, and more).
  if (c.mf_dim > config::kMaxSlotDim) {
    return Status::InvalidArgument(
        doc->source() + ": ffm's (fat_deepffm's) rows would hold " + std::to_string(c.mf_dim) +
        " values (a factor of hyper_parameters.sparse_feature_dim - 1 per field: the sparse "
        "slots and hyper_parameters.dense_input_dim), over the " +
        std::to_string(config::kMaxSlotDim) + " a row may hold");
  }
  return c;
}

}  // namespace gpubox::table
