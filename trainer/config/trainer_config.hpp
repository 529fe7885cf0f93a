// TrainerConfig: everything gpubox_train reads from its config (config_gpubox.yaml plus `-o`
// overrides), typed. Plain data, host-only. Filled by trainer_config_from (config_loader.hpp)
// from a config::ConfigDocument, which applies the key table's defaults
// (common/config/config_keys.cpp: every key, its default and its meaning); the YAML key of each
// field is in its comment. The dataset and table parts are filled by their own modules, so
// gpubox_data and gpubox_server read them exactly as the trainer does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/config/shrink_every.hpp"
#include "common/status.hpp"
#include "dataset/dataset_types.hpp"
#include "table/host_table_types.hpp"
#include "table/host_tier.hpp"
#include "table/sparse_row/accessor.hpp"
#include "trainer/nn/dense_model_types.hpp"

namespace gpubox::trainer {

// runner.data_format: the dataset module's own enum (one definition of the input formats).
using DataFormat = dataset::DataFormat;
// runner.save_mode: none | base | delta | checkpoint (one enum with the host tier's saves).
using SaveKind = table::SaveKind;
// runner.resume: auto | off.
using ResumeMode = config::ResumeMode;
// runner.sync_mode: gpubox | async | sync | geo.
using SyncMode = config::SyncMode;
using ReaderType = config::ReaderType;
// runner.shrink_every: never | pass | epoch.
using ShrinkEvery = config::ShrinkEvery;

struct RunnerConfig {
  // Paths: relative ones in the config file are resolved against the config file's folder; in
  // `-o` overrides, against the working directory; the model paths (model_save_path,
  // infer_load_path, model_init_path) always from the working directory, as PaddleRec takes
  // them. Empty = not set.
  std::string train_data_dir;          // runner.train_data_dir: one pass per epoch over it
  std::vector<std::string> pass_dirs;  // runner.pass_dirs: each folder is one pass (overrides)
  std::string test_data_dir;           // runner.test_data_dir: evaluated after each epoch
  // When the config gives train_data_dir / test_data_dir as a list (dnn's online.yaml): every
  // folder, read in order as one; the string above is then the first. Empty otherwise.
  std::vector<std::string> train_data_dirs;
  std::vector<std::string> test_data_dirs;
  std::string model_save_path;           // runner.model_save_path: saves under <path>/<pass>
  std::string infer_load_path;           // runner.infer_load_path: a save, or a folder of saves
  int infer_start_epoch = 0;             // runner.infer_start_epoch: first save <path>/<epoch>
  int infer_end_epoch = -1;              // runner.infer_end_epoch: saves end before it; -1: last
  std::string model_init_path;           // runner.model_init_path: loaded before the first pass
  std::string metrics_path;              // runner.metrics_path: one JSON line per pass
  int infer_batch_size = 0;              // runner.infer_batch_size: per card per evaluation step
  int epochs = 0;                        // runner.epochs
  int print_interval = 0;                // runner.print_interval: batches between progress lines
  bool stop_on_divergence = true;        // runner.stop_on_divergence: stop a diverged job
  int64_t card_memory_mb = 0;            // runner.card_memory_mb: card-tier budget; 0 = no limit
  int prefetch_passes = 0;               // runner.prefetch_passes: passes staged ahead; 0 = off
  int next_pass_chunk_keys = 0;          // runner.next_pass_chunk_keys: card work a step; 0 = off
  int staging_nice = 0;                  // runner.staging_nice: the staging thread's added nice
  int64_t pass_cache_mb = 0;             // runner.pass_cache_mb: parsed loads kept; -1 auto, 0 off
  bool shuffle = false;                  // runner.shuffle: local shuffle of each pass
  uint64_t seed = 0;                     // runner.seed: dense init, shuffle (and sparse, mixed in)
  int auc_buckets_log2 = 0;              // runner.auc_buckets_log2: AUC histogram size, >= 20
  SaveKind save_mode = SaveKind::kNone;  // runner.save_mode: none | base | delta | checkpoint
  ResumeMode resume = ResumeMode::kOff;  // runner.resume: auto | off
  ShrinkEvery shrink_every = ShrinkEvery::kNever;  // runner.shrink_every: never | pass | epoch
  std::string auth_token_file;             // runner.auth_token_file (GPUBOX_AUTH_TOKEN_FILE wins)
  double collective_timeout_s = 0;         // runner.collective_timeout_s
  double peer_timeout_s = 0;               // runner.peer_timeout_s: a lost trainer or server
  SyncMode sync_mode = SyncMode::kGpubox;  // runner.sync_mode (with runner.use_fleet, use_gpu)
  // Collective mode: runner.use_fleet and use_gpu with no runner.sync_mode. The gpubox schedule
  // with the embedding table replicated on every card (heter_comm::Placement::kReplicated).
  bool collective = false;
  int geo_step = 0;              // runner.geo_step: geo mode's push interval
  int dense_sync_steps = 0;      // runner.dense_sync_steps: async/sync dense interval
  bool split_file_list = false;  // runner.split_file_list: PS modes' file shards
  ReaderType reader_type = ReaderType::kInMemoryDataset;  // runner.reader_type: held or streamed
};

struct HyperParameters {
  DenseOptimizerConfig optimizer;     // hyper_parameters.optimizer.{class, learning_rate, ...}
  std::vector<int> fc_sizes;          // hyper_parameters.fc_sizes
  ModelKind model = ModelKind::kDnn;  // hyper_parameters.model: dnn | wide_deep | wide | ...
  // Where `model` came from, for the start line: "hyper_parameters.model", the PaddleRec model
  // folder that named it ("workspace models/rank/wide_deep", "the config's folder ..."), or the
  // default (network_choice.hpp).
  std::string model_source = "the default (no hyper_parameters.model, no PaddleRec model folder)";
  bool use_cvm = false;                                    // hyper_parameters.use_cvm
  DensePrecision dense_precision = DensePrecision::kFp32;  // hyper_parameters.dense_precision
  int cross_layers = 3;                                    // hyper_parameters.cross_layers (dcn_v2)
  int cross_rank = 0;  // hyper_parameters.cross_rank (dcn_v2; 0 = full rank)
  DcnStructure dcn_structure = DcnStructure::kStacked;  // hyper_parameters.dcn_structure
  bool cross_mixture = false;        // hyper_parameters.cross_mixture (dcn_v2: DCN-Mix)
  int cross_experts = 4;             // hyper_parameters.cross_experts (with cross_mixture)
  double cross_l2 = 0.0;             // hyper_parameters.cross_l2 (dcn, dcn_v2)
  std::vector<int> bot_layer_sizes;  // hyper_parameters.bot_layer_sizes (dlrm)
  // hyper_parameters.dnn_batch_norm; not set: true in PaddleRec's dlrm folder only.
  bool dnn_batch_norm = false;
  // hyper_parameters.dnn_dropout; not set: PaddleRec's rate in its dcn_v2, deepfefm, fat_deepffm
  // and flen folders (dnn_dropout.hpp), 0 elsewhere.
  double dnn_dropout = 0.0;
  // hyper_parameters.optimizer.clip_by_norm: every step's gradients (dense and sparse) clipped to
  // this global norm; 0 off. Not set: 10 in PaddleRec's dcn_v2 folder (clip_by_norm.hpp).
  double clip_by_norm = 0.0;
  // hyper_parameters.dlrm_output; not set: softmax2 where PaddleRec's top_layer_sizes ends in 2.
  DlrmOutput dlrm_output = DlrmOutput::kLogit;
  std::vector<int> layer_sizes_cin;  // hyper_parameters.layer_sizes_cin (xdeepfm)
  // autoint: hyper_parameters.attn_layer_sizes, head_num, use_residual, scaling, use_wide.
  std::vector<int> attn_layer_sizes;
  int head_num = 2;
  bool use_residual = true;
  bool scaling = true;
  bool use_wide = true;
  // flen: hyper_parameters.field_group_sizes (checked against sparse_num_field and the slots).
  std::vector<int> field_group_sizes{13, 3, 6};
};

struct TrainerConfig {
  std::string config_path;  // the file it was loaded from ("" when built in code)
  RunnerConfig runner;
  HyperParameters hyper;
  // The dataset part (dataset::dataset_config_from): format, slots (sparse_inputs_slots,
  // slot_names), dense_input_dim, threads, train_batch_size, pipe_command, parsing rules.
  dataset::DatasetConfig dataset;
  // The table part (table::sparse_config_from): the sparse row and optimizer of every tier,
  // mf_dim = sparse_feature_dim - 1, seed = runner.seed ^ sparse_optimizer.seed.
  table::AccessorConfig sparse;
  // The host tier (table::host_tier_config_from): the in-process table's shards, save form and
  // disk tier, the remote client's timeouts. The endpoints come from the launcher (TrainerEnv).
  table::HostTierConfig host_tier;
  // The keys that define the model (every hyper_parameters key with an effect, and the keys the
  // table part reads), each with its value as text: a save records them, and resuming from a
  // save made with other values is refused naming the keys (trainer/schedule/checkpoint.hpp).
  std::map<std::string, std::string> model_keys;
  // The model_keys recorded at a value the config does not set but derives (a PaddleRec folder's
  // start ranges, config_loader.cpp's record_keys, and dropout rate, record_dnn_dropout), each with
  // what derived it: a resume from a save made at another value names the -o that keeps the save's
  // (check_saved_derived_keys).
  std::map<std::string, std::string> derived_model_keys;
  // The other keys that shape what a run trains (its schedule, batches, reading, seed: every
  // runner key with an effect but those that only say where it reads, writes, logs or waits,
  // or how it overlaps its work), each with its value as text: with the data's fingerprint, the
  // identity of a training job that a save records, so that runner.resume continues only the
  // same job (trainer/schedule/job_identity.hpp).
  std::map<std::string, std::string> job_keys;
  // Set by a job that only evaluates (run_job.hpp's infer_job): the files it evaluates, which the
  // trainers of a job compare instead of its training data (trainer/schedule/job_settings.hpp).
  std::optional<std::vector<std::string>> evaluated_files;

  int num_sparse_slots() const { return static_cast<int>(dataset.slots.size()); }
  int mf_dim() const { return sparse.mf_dim; }
  // Slot names in data order (hyper_parameters.slot_names, or "1".."N").
  const std::vector<std::string>& sparse_slot_names() const { return dataset.slots; }
  DenseModelConfig dense_model_config() const;
};

// Keys recorded with a save that only place its rows (memory budgets, the disk tier's folder,
// the servers' connections): the disk tier trains as memory does, so two runs that differ in
// them are the same model (a job that died of memory resumes under a budget), and two trainers
// of one job may set them for their own machines.
bool places_rows_only(const std::string& key);

// "key: saved A, now B; ..." for every model key that differs ("" when none). A config built in
// code has no model keys: a save made with one, or a run with one, is not compared. A key newer
// than the save counts as its default there. Keys that only place the rows (memory budgets, the
// disk tier's folder, the servers' connections) never differ.
std::string model_key_differences(const std::map<std::string, std::string>& saved,
                                  const std::map<std::string, std::string>& now);

// OK when the save `save_dir` (its MODEL_MANIFEST's model and job keys) was made for the network
// and input `config` describes: every hyper_parameters.* model key but the optimizers',
// dense_precision, dnn_dropout, cross_l2 and sparse_storage, and of the job's keys
// runner.dense_transform as applied (a save that records no job, or `auto`: not compared) and
// runner.criteo_dense where either reads Criteo files. Else
// InvalidArgument naming each key that differs and both values: --mode infer, an export and a
// load read a save only with the config of its network (one that only had the same number of
// dense parameters read it silently as another network, or its slots in another order).
// Logs a warning when the save `save_dir` (its model keys) was trained in another
// hyper_parameters.dense_precision than `config` computes in (a load reads either: --mode infer
// of a bf16 save under an fp32 config evaluated in fp32 without a word).
void note_saved_precision(const std::map<std::string, std::string>& saved_model_keys,
                          const TrainerConfig& config, const std::string& save_dir);

Status check_saved_network(const std::map<std::string, std::string>& saved_model_keys,
                           const std::map<std::string, std::string>& saved_job_keys,
                           const TrainerConfig& config, const std::string& save_dir);

// OK when the save `save_dir` (its MODEL_MANIFEST's model keys) started its rows where `config`
// starts them: hyper_parameters.sparse_optimizer.initial_range, and where either range is above
// 0 its seed and runner.seed (mf_initial_range never: embedx is drawn at a push; a key the save
// does not record: not compared). Else InvalidArgument naming each
// key, both values and the -o that reads the save at its own: --mode infer and an export read a
// key the save never saw as the row it would have started at (a load to train on takes the
// config's, for keys new to it).
Status check_saved_row_starts(const std::map<std::string, std::string>& saved_model_keys,
                              const TrainerConfig& config, const std::string& save_dir);

// OK when the save `save_dir` was made with the batch-norm setting and the dlrm output layer
// `config` has: `saved_model_keys` is its MODEL_MANIFEST's model_keys, whose
// hyper_parameters.dnn_batch_norm (missing: false) and hyper_parameters.dlrm_output (missing:
// logit; a save from before the key) are compared with config.hyper's. Otherwise
// InvalidArgument naming the key, both values and PaddleRec's dlrm folder's default, which a
// load, --mode infer and an export report before the dense sizes would (they differ by the
// running statistics and gamma/beta, or the output layer's width, and a size error would point at
// fc_sizes or the slots).
Status check_saved_dense_switches(const std::map<std::string, std::string>& saved_model_keys,
                                  const TrainerConfig& config, const std::string& save_dir);

// OK when the save `save_dir` was made with the values `config` derives for its
// derived_model_keys (a key the save does not record: that key's default). Otherwise
// InvalidArgument naming the key, the save's value, the derived one, what derived it and the
// -o that resumes the save at its value (a dcn_v2-folder save made at GPUBox's start ranges).
Status check_saved_derived_keys(const std::map<std::string, std::string>& saved_model_keys,
                                const TrainerConfig& config, const std::string& save_dir);

}  // namespace gpubox::trainer
