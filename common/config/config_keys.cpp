#include "common/config/config_keys.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>

#include "common/config/config_enums.hpp"
#include "common/config/detail/paddlerec_tables.hpp"
#include "common/config/detail/parse_value.hpp"
#include "common/config/shrink_every.hpp"
#include "common/config/slot_dims.hpp"
#include "common/error.hpp"

namespace gpubox::config {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr double kFloatMax = std::numeric_limits<double>::max();

// Builders: one line per key in the table below.
KeySpec base(std::string name, KeyType type, std::string default_text, unsigned parts,
             std::string meaning) {
  KeySpec k;
  k.name = std::move(name);
  k.type = type;
  k.default_text = std::move(default_text);
  k.parts = parts;
  k.meaning = std::move(meaning);
  return k;
}
KeySpec bool_key(std::string name, std::string def, unsigned parts, std::string meaning) {
  return base(std::move(name), KeyType::kBool, std::move(def), parts, std::move(meaning));
}
KeySpec int_key(std::string name, std::string def, int64_t min, int64_t max, unsigned parts,
                std::string meaning) {
  KeySpec k = base(std::move(name), KeyType::kInt, std::move(def), parts, std::move(meaning));
  k.int_min = min;
  k.int_max = max;
  return k;
}
KeySpec seed_key(std::string name, unsigned parts, std::string meaning) {
  return base(std::move(name), KeyType::kUInt64, "0", parts, std::move(meaning));
}
KeySpec float_key(std::string name, std::string def, double min, double max, unsigned parts,
                  std::string meaning) {
  KeySpec k = base(std::move(name), KeyType::kFloat, std::move(def), parts, std::move(meaning));
  k.float_min = min;
  k.float_max = max;
  return k;
}
KeySpec string_key(std::string name, std::string def, unsigned parts, std::string meaning) {
  return base(std::move(name), KeyType::kString, std::move(def), parts, std::move(meaning));
}
KeySpec path_key(std::string name, std::string def, unsigned parts, std::string meaning) {
  return base(std::move(name), KeyType::kPath, std::move(def), parts, std::move(meaning));
}
KeySpec work_path_key(std::string name, unsigned parts, std::string meaning) {
  return base(std::move(name), KeyType::kWorkPath, "\"\"", parts, std::move(meaning));
}
template <class E, std::size_t N>
KeySpec enum_key(std::string name, const EnumName<E> (&names)[N], E def, unsigned parts,
                 std::string meaning) {
  KeySpec k = base(std::move(name), KeyType::kEnum, "", parts, std::move(meaning));
  k.default_text = name_of(names, def);
  if (k.default_text.find(':') != std::string::npos) k.default_text = '"' + k.default_text + '"';
  k.choices = names_of(names);
  return k;
}
KeySpec int_list_key(std::string name, std::string def, int64_t item_min, std::size_t min_items,
                     unsigned parts, std::string meaning) {
  KeySpec k = base(std::move(name), KeyType::kIntList, std::move(def), parts, std::move(meaning));
  k.int_min = item_min;
  k.int_max = kInt32Max;
  k.min_items = min_items;
  return k;
}
KeySpec list_key(std::string name, KeyType type, unsigned parts, std::string meaning) {
  return base(std::move(name), type, "[]", parts, std::move(meaning));
}

constexpr unsigned kNoEffect = 0;

// The table by section, a key a line: its name, default, range, the parts that read it and what
// it means (docs/config-reference.md is rendered from them).
// clang-format off
void add_runner_keys(std::vector<KeySpec>& t) {
  t.push_back(string_key("workspace", "\"\"", kTrainer | kDataset | kTable, "PaddleRec's model folder (models/rank/<name>): without hyper_parameters.model, the network it names is trained, or refused when GPUBox does not build it (else the folder the config sits in names it)"));

  const std::string r = "runner.";
  t.push_back(path_key(r + "train_data_dir", "\"\"", kTrainer, "folder of training files (or one file, or a list of them, read in order as one); each epoch over it is one pass; what gpubox_data stat loads"));
  t.back().also_list = true;
  t.push_back(list_key(r + "pass_dirs", KeyType::kPathList, kTrainer, "when non-empty, each folder is one pass (e.g. one per day), in order, every epoch; replaces train_data_dir"));
  t.push_back(path_key(r + "test_data_dir", "\"\"", kTrainer, "when set, evaluated after each epoch (\"test auc: ...\"); the data --mode infer evaluates unless --infer_data_dir is given; a list of folders is read in order as one"));
  t.back().also_list = true;
  t.push_back(work_path_key(r + "model_save_path", kTrainer, "when set, each pass is saved to <model_save_path>/<pass>, passes numbered from 0 as PaddleRec numbers epochs"));
  t.push_back(work_path_key(r + "infer_load_path", kTrainer, "what --mode infer evaluates unless --load is given: this save, or, as PaddleRec, every save <infer_load_path>/<epoch> for infer_start_epoch <= epoch < infer_end_epoch"));
  t.push_back(work_path_key(r + "model_init_path", kTrainer, "when set, training starts from this save (a <model_save_path>/<pass> folder), loaded before the first pass; --load overrides it"));
  t.push_back(path_key(r + "metrics_path", "log/metrics.jsonl", kTrainer, "one JSON object per pass is appended here (\"\": none); the default is relative to the working directory"));
  t.push_back(int_key(r + "train_batch_size", "512", 1, kInt32Max, kDataset, "instances per card per training step"));
  t.push_back(int_key(r + "infer_batch_size", "512", 1, kInt32Max, kTrainer, "instances per card per step when evaluating (test_data_dir, --mode infer)"));
  t.push_back(int_key(r + "epochs", "1", 1, kInt32Max, kTrainer, "passes over train_data_dir (with pass_dirs: rounds over the list)"));
  t.push_back(int_key(r + "thread_num", "1", 1, 1024, kDataset | kTrainer, "reader threads loading a pass; in the async, sync and geo modes also the training threads of a trainer (Hogwild: each its own batches, sharing the servers' rows)"));
  t.push_back(int_key(r + "print_interval", "100", 1, kInt32Max, kTrainer, "batches between progress lines during a pass; also the steps of each card or training thread a pass begins with that its divergence check leaves out (half of a pass of fewer than twice as many)"));
  t.push_back(bool_key(r + "stop_on_divergence", "true", kTrainer, "a pass whose training logloss (after its first print_interval steps) ends over 2 times the constant predictor's (the entropy of its click rate) stops the job with an error, before its save; over 1 time, the pass line is followed by a warning; each only when even the low end of the mean's range (3 standard errors) is over, with 10 instances of each class, else an INFO line says why"));
  t.push_back(bool_key(r + "use_auc", "true", kNoEffect, "PaddleRec's AUC switch; GPUBox always computes AUC"));
  t.push_back(bool_key(r + "use_gpu", "true", kTrainer, "PaddleRec's device switch: cards come from FLAGS_selected_gpus; with use_fleet and no sync_mode, true asks for Collective mode"));
  t.push_back(enum_key(r + "sync_mode", kSyncModeNames, SyncMode::kGpubox, kTrainer | kTable, "training schedule: gpubox stages each pass's rows on the cards; async, sync and geo are PaddleRec's CPU parameter-server modes on gpubox_server (scripts/launch.sh)"));
  t.push_back(bool_key(r + "use_fleet", "false", kTrainer, "PaddleRec's fleet switch: with sync_mode set it changes nothing; true without sync_mode on GPUs (use_gpu) asks for Collective mode (the table replicated on every card)"));
  t.push_back(int_key(r + "geo_step", "100", 1, kInt32Max, kTrainer, "geo mode: steps of a training thread between pushes of its deltas (local minus last synced) and pulls of the merged values"));
  t.push_back(int_key(r + "dense_sync_steps", "1", 1, kInt32Max, kTrainer, "async and sync modes: steps of a training thread between pushes of its dense update to the servers' dense table and pulls of the merged values; sync at 1: every step the job's dense gradients are averaged and every thread takes one optimizer step on them (the gpubox mode's step on as many cards), above 1 each thread steps its own copy and the window's changes are averaged"));
  t.push_back(enum_key(r + "reader_type", kReaderTypeNames, ReaderType::kInMemoryDataset, kTrainer, "how a pass is read: InmemoryDataset loads it whole; QueueDataset streams it in file order through a bounded queue, no shuffle (the gpubox and sync modes read it twice, its keys or count first); DataLoader (PaddleRec's Python DataLoader) reads as InmemoryDataset"));
  t.push_back(string_key(r + "pipe_command", "\"\"", kDataset, "when set, each file is read through `sh -c \"(<pipe_command> [<config> <utils>]) < file\"`, run in the working directory"));
  t.push_back(enum_key(r + "pipe_command_args", kPipeCommandArgsNames, PipeCommandArgs::kAuto, kDataset, "whether the config's path and pipe_utils_path are appended to pipe_command, as PaddleRec does for its readers: auto = when the command runs a Python script"));
  t.push_back(path_key(r + "pipe_utils_path", "\"\"", kDataset, "the <utils> argument of pipe_command; empty: tools/utils/static_ps of the PaddleRec checkout holding the config or the working directory, else the config's folder"));
  t.push_back(bool_key(r + "dataset_debug", "false", kNoEffect, "PaddleRec's reader debug switch"));
  t.push_back(bool_key(r + "split_file_list", "false", kTrainer, "async, sync and geo modes: true gives each trainer a contiguous block of each pass's files (PaddleRec's get_file_shard, as the gpubox mode splits them); false: every trainer reads every file"));
  t.push_back(string_key(r + "train_reader_path", "\"\"", kDataset, "PaddleRec's Python reader module: GPUBox reads the files itself; the reader of a PaddleRec model folder names the dense transform applied (runner.dense_transform: auto)"));
  t.push_back(string_key(r + "infer_reader_path", "\"\"", kNoEffect, "PaddleRec's Python reader module for inference"));
  t.push_back(int_key(r + "infer_start_epoch", "0", 0, kInt32Max, kTrainer, "--mode infer: the first save <infer_load_path>/<epoch> evaluated"));
  t.push_back(int_key(r + "infer_end_epoch", "-1", -1, kInt32Max, kTrainer, "--mode infer: the saves evaluated end before this epoch; -1: at the last save under infer_load_path"));
  t.push_back(int_key(r + "prefetch_passes", "1", 0, 8, kTrainer, "passes read, deduplicated and staged (their host-tier rows fetched) while an earlier pass trains, so begin_pass moves only what changed; each one ahead holds its data set and staged rows in host memory; 0 = off"));
  t.push_back(int_key(r + "next_pass_chunk_keys", "131072", 0, kInt32Max, kTrainer, "with prefetch_passes, once the next pass is read each card looks its keys up and evicts rows neither pass uses, and once its rows are staged inserts them, between the steps of the pass training, at most this many keys a chunk (on the GPU build each chunk is sized from its measured card time to about a quarter of a step), one chunk after each step, so its begin_pass only does the rest; 0 = off (begin_pass does it all)"));
  t.push_back(int_key(r + "staging_nice", "0", 0, 19, kTrainer, "added to the nice value of the thread that reads and stages the passes ahead (prefetch_passes), of the threads it starts and of the threads that run its host-tier pulls (Linux, per thread), so on a busy machine the training steps get the cores first but the staging may end after the pass (BENCHMARKS.md); 0 = the steps' priority"));
  t.push_back(int_key(r + "pass_cache_mb", "-1", -1, kInt64Max >> 20, kTrainer, "MiB of parsed records a run keeps of the files it read, so a later epoch's load of the same unchanged files (a pass, the test data) shares them (no copy, their unique keys computed once) instead of reading and parsing the files again, with the same result; the unique keys kept count in the budget too, but give way to records (a load that fits only without other loads' keys drops them); loads whose records do not fit in what is left, or read through pipe_command, read their files every epoch; none with reader_type QueueDataset or when each file list is loaded once (one epoch left, one save to infer); per trainer process: -1 = an eighth of the memory this process may use (the machine's, or its cgroup's limit when lower) divided by the job's trainers (PADDLE_TRAINERS_NUM), logged at start; 0 = off"));
  t.push_back(int_key(r + "card_memory_mb", "0", 0, kInt64Max, kTrainer, "card-tier budget per card in MiB (rows over it are evicted); 0 = no limit"));
  t.push_back(int_key(r + "host_table_shards", "64", 1, 65536, kTable, "lock shards of the in-process host table and of gpubox_server's (one part file each in a save)"));
  t.push_back(enum_key(r + "save_form", kSaveFormNames, SaveForm::kBinary, kTable, "part files of the host table's saves: binary records or Paddle-like text lines (loads read either)"));
  t.push_back(path_key(r + "rocksdb_path", "\"\"", kTable, "disk tier (RocksDB) folder under the host table, working storage wiped at start; gpubox_server shard i of n > 1 uses <path>/shard-i; \"\": no disk tier"));
  t.push_back(int_key(r + "host_memory_row_budget", "0", 0, kInt64Max, kTable, "rows the host table keeps in memory, the lowest-score ones go to the disk tier (needs rocksdb_path); 0 = all"));
  t.push_back(int_key(r + "host_memory_mb", "0", 0, kInt64Max >> 20, kTable, "MiB of host memory for the host table's rows and index and, when the table is in-process, the next pass's card work's pinned buffers (the card tier's plan line says how much; the table gets the rest); the lowest-score rows beyond go to the disk tier (needs rocksdb_path); with host_memory_row_budget the smaller wins; 0 = no limit"));
  t.push_back(int_key(r + "cold_after_days", "0", 0, kInt32Max, kTable, "shrink moves rows unseen this many days (shrinks, runner.shrink_every) to the disk tier (needs rocksdb_path); 0 = never; > 0 needs shrink_every other than never (refused at start)"));
  t.push_back(enum_key(r + "shrink_every", kShrinkEveryNames, ShrinkEvery::kNever, kTrainer, "when the training run shrinks the sparse table (show/click decay, deletion by sparse_optimizer.delete_threshold and delete_after_unseen_days, rows unseen cold_after_days to disk): never, after every pass, or after each epoch's last pass, before that pass's save; each shrink is one day of the *_days keys; it writes the cards' rows back and empties the cards first (the next pass pulls all its rows), and trainer 0 alone shrinks gpubox_server tables"));
  t.push_back(float_key(r + "server_timeout_s", "30", 1, 1e6, kTable, "longest a host-tier call to the gpubox_server processes may take, retries included, before the job fails naming the server; a SAVE or LOAD: longest a server may report no progress (one that keeps reporting is never cut)"));
  t.push_back(float_key(r + "server_connect_timeout_s", "2", 1e-3, 1e6, kTable, "longest one connection attempt to a gpubox_server may take (it is retried until server_timeout_s)"));
  t.push_back(int_key(r + "server_connections", "2", 1, 64, kTable, "connections per gpubox_server that one host-tier call spreads its requests over"));
  t.push_back(enum_key(r + "data_format", kDataFormatNames, DataFormat::kAuto, kDataset, "input format: auto recognises each file's (or pipe output's) format from its first lines and says which; slot: PaddleRec slot text; multislot: Paddle MultiSlot; criteo: raw Criteo TSV; feat_idx: PaddleRec's LR/FM Criteo text; idx_value: PaddleRec autoint's Criteo text (label, the fields' indices, their values); avazu: PaddleRec flen's comma-separated integers (an id, one index per slot, the label)"));
  t.push_back(list_key(r + "multislot_order", KeyType::kStringList, kDataset, "multislot: the fields of a line by name (label_name, slot names, dense_name; other names are read and skipped); empty = label, sparse slots, dense, as PaddleRec's readers write"));
  t.push_back(enum_key(r + "slot_token_order", kSlotTokenOrderNames, SlotTokenOrder::kSlotFirst, kDataset, "token order of the slot format"));
  t.push_back(bool_key(r + "strict_parse", "false", kDataset, "true: the first malformed line is an error instead of skipped and counted"));
  t.push_back(float_key(r + "max_malformed_share", "0.5", 0, 1, kDataset, "the share of a load's lines (a pass, the test data) that may be malformed and skipped; more stops the job naming the counts and the first of them (1: never; strict_parse: the first one)"));
  t.push_back(int_key(r + "max_line_bytes", "1048576", 16, int64_t{1} << 30, kDataset, "longer lines are malformed (line_too_long)"));
  t.push_back(string_key(r + "label_name", "click", kDataset, "slot and multislot: name of the label (PaddleRec's slot_dnn: \"1\"); numbered slots skip it"));
  t.push_back(string_key(r + "dense_name", "dense_feature", kDataset, "slot and multislot: name of the dense values"));
  t.push_back(bool_key(r + "ignore_unknown_slots", "true", kDataset, "slot format: a token of a slot the model does not use is skipped and counted, as PaddleRec's readers do; false: the line is malformed"));
  t.push_back(enum_key(r + "criteo_dense", kCriteoDenseNames, CriteoDense::kMinMax, kDataset, "criteo format: integer features become dense floats by PaddleRec's min-max constants, log(1 + x), or as they are"));
  t.push_back(enum_key(r + "dense_transform", kDenseTransformNames, DenseTransform::kAuto, kDataset, "slot and multislot: what dense values go through when GPUBox reads the files in place of PaddleRec's Python reader: auto applies that reader's (runner.train_reader_path: dcn_v2's reader log(x + 1), deepfefm's criteo_reader clips to [0, 1]) and says so at start; none, log1p, clip01: that one"));
  t.push_back(bool_key(r + "shuffle", "true", kTrainer, "local shuffle of each loaded pass"));
  t.push_back(seed_key(r + "seed", kTrainer | kTable, "seed of the dense initialisation and the shuffle; mixed into sparse_optimizer.seed"));
  t.push_back(int_key(r + "auc_buckets_log2", "20", 20, 28, kTrainer, "AUC histogram buckets = 2^this; two histograms of doubles, at least 16 MiB a card at 20 and 4 GiB at 28"));
  t.push_back(enum_key(r + "save_mode", kSaveKindNames, SaveKind::kBase, kTrainer, "what each save writes: nothing, the model rows, the rows changed since the last save, or full rows with optimizer state"));
  t.push_back(enum_key(r + "resume", kResumeModeNames, ResumeMode::kAuto, kTrainer, "auto: a training command run again (after a crash) continues from the last complete save under model_save_path, with the pass after it; off: it starts afresh: its saves replace the earlier run's there, and its job's end removes the earlier run's later ones (as every run that does not resume: docs/operations.md; no effect when nothing is saved)"));
  t.push_back(path_key(r + "auth_token_file", "\"\"", kTrainer, "file holding the token of the gpubox_server endpoints (their --auth_token_file); the environment variable GPUBOX_AUTH_TOKEN_FILE wins over it; \"\": none"));
  t.push_back(float_key(r + "collective_timeout_s", "300", 1e-3, 1e6, kTrainer, "longest wait in seconds for the peers of a collective before the job fails naming the card, pass, step and collective; while trainer 0 alone works for the job on the servers (a save into or a load from them; in the PS modes also the job's start, ps/start, in a recovery too, and the save folder's token), the longest the others wait without its progress (a part that moves is waited for; when they cannot read its progress, and in a PS job's first part, this bounds the whole part). Also, in the PS modes with several trainers, the longest a trainer may begin training run 1 (its first train()) after the others: one later is taken for lost and fails the job"));
  t.push_back(float_key(r + "peer_timeout_s", "10", 0.5, 86400, kTrainer, "several trainers: longest silence in seconds of another trainer's heartbeat, or of a gpubox_server's answers, before the job ends naming it by address (a lost link or machine); slow steps are bounded by collective_timeout_s"));
}

void add_dense_optimizer_keys(std::vector<KeySpec>& t) {
  const std::string o = "hyper_parameters.optimizer.";
  t.push_back(enum_key(o + "class", kDenseOptimizerKindNames, DenseOptimizerKind::kAdam, kTrainer | kTable, "dense optimizer, applied identically on every card (Adagrad: g2 += g^2, w -= lr g / (sqrt(g2) + epsilon), as Paddle's); Adam also steps a PaddleRec model folder's embedding rows when its config names no sparse rule (see sparse_optimizer.class)"));
  t.push_back(float_key(o + "learning_rate", "0.001", 1e-12, 1e6, kTrainer | kTable, "dense learning rate"));
  t.push_back(string_key(o + "strategy", "async", kNoEffect, "PaddleRec's distributed strategy"));
  t.push_back(float_key(o + "beta1", "0.9", 0, 0.999999, kTrainer | kTable, "Adam first-moment decay"));
  t.push_back(float_key(o + "beta2", "0.999", 0, 0.999999, kTrainer | kTable, "Adam second-moment decay"));
  t.push_back(float_key(o + "epsilon", "1.0e-8", 1e-30, 1, kTrainer | kTable, "Adam epsilon; Adagrad's: 1e-6 unless set (Paddle's Adagrad default, PaddleRec flen's)"));
  t.push_back(float_key(o + "clip_by_norm", "0", 0, 1e30, kTrainer, "clip by global norm, as Paddle's ClipGradByGlobalNorm: every step's gradients, the dense parameters' and the embedding rows' (each key's summed over the step), times clip_by_norm / max(clip_by_norm, global norm), the norm that of the mean loss's gradient over the step's cards; 0: off; not set: 10 in PaddleRec's dcn_v2 folder (its trainer's default); gpubox and Collective mode only (refused in async, sync and geo)"));
  t.push_back(float_key(o + "initial_accumulator_value", "0.001", 0, 1e6, kTrainer, "Adagrad: the start of each dense parameter's squared-gradient sum (PaddleRec flen's dygraph_model passes 1e-3)"));
}

void add_model_keys(std::vector<KeySpec>& t) {
  const std::string h = "hyper_parameters.";
  t.push_back(int_key(h + "sparse_inputs_slots", "27", 2, 100000, kDataset | kTable, "as in PaddleRec the label counts as one: the data has this minus 1 sparse slots, numbered from 1 and skipping runner.label_name"));
  t.push_back(int_key(h + "sparse_feature_number", "0", 0, kInt64Max, kNoEffect, "PaddleRec's table size; GPUBox tables grow as needed"));
  t.push_back(int_key(h + "sparse_feature_dim", "9", 1, 1024, kTable, "per key: 1 wide weight (embed_w) + mf_dim embedding values (embedx); ffm: + one factor of sparse_feature_dim - 1 values per field (the sparse slots and the dense features), so a row holds fields x (sparse_feature_dim - 1) embedding values; fat_deepffm's rows are ffm's"));
  t.push_back(enum_key(h + "sparse_storage", kSparseStorageNames, SparseStorage::kFp32, kTable, "how the card and host tiers keep each key's embedding values (embed_w, embedx): fp32, or fp16 / bf16 rounded to nearest even, two per float (optimizer state, show and click stay fp32; the math is fp32); saves hold fp32 values, so a save loads into any storage"));
  {
    KeySpec k = base(h + "slot_dims", KeyType::kIntMap, "{}", kTable, "embedx width per slot, e.g. {1: 4, 7: 16} (Paddle's dynamic mf dim, PSGPUWrapper::SetSlotDimVector): each slot's rows and pooled input take this many values; a slot not listed takes sparse_feature_dim - 1; at most 8 distinct widths");
    k.int_min = 0;
    k.int_max = kMaxSlotDim;
    t.push_back(std::move(k));
  }
  t.push_back(int_key(h + "dense_input_dim", "13", 0, 100000, kDataset | kTable, "dense features per instance (ffm: each is a field too)"));
  t.push_back(int_key(h + "num_field", "0", 0, 200000, kDataset, "PaddleRec's fields per line of its LR/FM Criteo text (feat_idx): when set, it must equal dense_input_dim plus the sparse slots, or the sparse slots alone (PaddleRec dlrm's interaction fields); 0 = not checked"));
  t.push_back(int_list_key(h + "fc_sizes", "[512, 256, 128, 32]", 1, 0, kTrainer, "hidden layers (ReLU); the output layer follows: one logit, or for dlrm with dlrm_output softmax2 a 2-wide two-class softmax; [] only for autoint (no dnn)"));
  t.push_back(int_key(h + "distributed_embedding", "0", 0, 1, kNoEffect, "PaddleRec's switch; GPUBox embeddings are always sharded over the cards"));
  t.push_back(enum_key(h + "model", kModelKindNames, ModelKind::kDnn, kTrainer | kTable, "dense model: dnn, dnn plus the wide part, the wide part alone (logistic regression), deepfm (the wide part as first-order term + pairwise FM over the slot embeddings + dnn), dcn_v2 (a cross network with the dnn, see cross_layers), fm (the wide part + the pairwise FM over the slot embeddings, no dnn), dcn (DCN v1: vector cross layers beside the dnn), dlrm (bottom MLP over the dense features, pairwise dot products among its output and the slot embeddings, top MLP: see bot_layer_sizes), xdeepfm (the wide part + a CIN over the slot and dense feature embeddings + the dnn over them: see layer_sizes_cin), ffm (field-aware fm: a key holds one factor per field, see sparse_feature_dim; no dnn), deepfefm (the wide part + a field-embedded fm, a learned k x k matrix per pair of fields, slot or dense feature + the dnn over the slot embeddings, the dense terms and the pairs' values), autoint (self-attention layers over the slot and dense feature embeddings + the wide part (use_wide) + the dnn over them when fc_sizes is set: see attn_layer_sizes), flen (the dnn over the slot embeddings + a bi-interaction between groups of slots through a ReLU layer: see field_group_sizes), or fat_deepffm (ffm's rows, a compose-excitation attention (CEN) over the field-aware factors, their sum + the dnn over the field pairs' products: see layer_sizes_dnn)"));
  t.push_back(bool_key(h + "dnn_batch_norm", "false", kTrainer, "a batch norm (Paddle's BatchNorm1D: momentum 0.9, epsilon 1e-5) after the ReLU of every hidden layer of the dnn (fc_sizes) and, for dlrm, of every bottom MLP layer and of the two-class output layer (dlrm_output softmax2): training normalises each card's batch by its own statistics, inference (--mode infer, evaluation, export, gpubox_serve) by the running mean and variance, which are saved with the dense parameters and kept one model across cards; not with runner.sync_mode geo (refused); not set: true in PaddleRec's dlrm folder (its MLPLayer always has it), false elsewhere"));
  t.push_back(float_key(h + "dnn_dropout", "0.0", 0, 0.999, kTrainer, "dropout p in training after the dnn's hidden layers (fc_sizes), as PaddleRec's DNNs: a Dropout(p) after every Linear and every ReLU, so a hidden unit is kept with probability (1-p)^2 and scaled by 1/(1-p)^2 (inverted dropout; p 0.5 keeps a quarter); deepfefm and fat_deepffm drop the dnn's 1-wide output too (keep 1-p), as theirs; flen's net drops a third time after its batch norm (not built: a hidden unit kept with probability (1-p)^3) and after its bi-interaction's layer (keep 1-p); the masks are a hash of (runner.seed, card, layer, step, unit): new every step, each card's its own, the same on cpu and GPU; evaluation, --mode infer, export and gpubox_serve never drop; at most 0.999 (a hidden unit kept with probability at least 1e-6, its scale at most 1e6), flen's at most 0.990 (a hidden unit kept with probability (1-p)^3 at least 2^-20: the least the masks' 32-bit threshold holds to 1e-3 of the scale 1/keep; a higher rate is refused); not with dnn_batch_norm (a rate set is refused, the folder's gives way to 0); not set: PaddleRec's rate in its dcn_v2 (0.5), deepfefm (0.2), fat_deepffm (0.5) and flen (0.2) folders for the folder's own network (their nets' dropout_rate; autoint's net registers a Dropout it never calls), 0 elsewhere; a save records the rate trained"));
  t.push_back(enum_key(h + "dlrm_output", kDlrmOutputNames, DlrmOutput::kLogit, kTrainer | kTable, "dlrm's output layer: logit = one linear logit and a sigmoid (MLPerf's DLRM); softmax2 = PaddleRec's: the top MLP's last layer 2 wide, ReLU'd and batch-normalised (with dnn_batch_norm) like its hidden layers, a two-class softmax trained by its cross entropy, the prediction its class 1 (saved, exported and served with the model); not set: softmax2 in PaddleRec's dlrm folder when its top_layer_sizes ends in 2 (an -o of fc_sizes replaces that list, its last 2 included: logit), logit elsewhere (a last 2 outside the folder means one logit); softmax2 without dnn_batch_norm is warned of at start (both ReLU'd outputs can die: logloss ln 2, AUC 0.5 for good), and a training pass that predicts one value for everything stops the job (docs/user-guide.md); refused with top_layer_sizes ending in 1; dlrm only; in PaddleRec's dlrm folder softmax2 trains as PaddleRec does, under Adam at optimizer.learning_rate whatever optimizer.class says (dense net and rows)"));
  t.push_back(int_list_key(h + "bot_layer_sizes", "[512, 256, 64, 16]", 1, 1, kTrainer, "dlrm: the bottom MLP's layers (ReLU) over the dense features; the last is its output, which must be as wide as sparse_feature_dim (the slots' embeddings it meets in the dot interaction); the top MLP is fc_sizes (PaddleRec's top_layer_sizes)"));
  t.push_back(int_list_key(h + "layer_sizes_cin", "[128, 32]", 1, 1, kTrainer, "xdeepfm: the Compressed Interaction Network's feature maps per layer, over the fields (every slot's embedx and each dense feature x_i times a learned vector, sparse_feature_dim - 1 wide); each layer's maps are summed over the embedding and read by the logit"));
  t.push_back(int_list_key(h + "layer_sizes_dnn", "[]", 1, 0, kTrainer, "xdeepfm and flen: the dnn's hidden layers (ReLU) over the fields' embeddings, in place of fc_sizes (PaddleRec's xdeepfm and flen read these and not fc_sizes); fat_deepffm's the same, over its field pairs' products; [] = fc_sizes; another model refuses it non-empty"));
  t.push_back(int_list_key(h + "attn_layer_sizes", "[64, 64, 64]", 1, 1, kTrainer, "autoint: the interacting layers' widths, each a multiple of head_num: multi-head self-attention over the fields (every slot's embedx and each dense feature x_i times a learned vector, sparse_feature_dim - 1 wide), ReLU, LayerNorm; the last layer's fields are read by the logit"));
  t.push_back(int_key(h + "head_num", "2", 1, 1024, kTrainer, "autoint: attention heads per interacting layer"));
  t.push_back(bool_key(h + "use_residual", "true", kTrainer, "autoint: each interacting layer adds relu(H W_res) to its attention's output"));
  t.push_back(bool_key(h + "scaling", "true", kTrainer, "autoint: the attention scores are divided by the square root of a head's width"));
  t.push_back(int_list_key(h + "field_group_sizes", "[13, 3, 6]", 1, 1, kTrainer, "flen: how many consecutive sparse slots each field group holds (PaddleRec's net hard-codes 13 user, 3 item and 6 context fields); they must add up to the sparse slots, and there are sparse_num_field of them"));
  t.push_back(int_key(h + "sparse_num_field", "3", 2, 16, kTrainer, "flen (PaddleRec's name): the field groups its bi-interaction pairs; must equal the length of field_group_sizes"));
  t.push_back(bool_key(h + "use_wide", "true", kTrainer, "autoint: the first-order term (the wide part: the keys' embed_w and a weight per dense feature)"));
  t.push_back(int_key(h + "cross_layers", "3", 1, 64, kTrainer, "cross layers over the first layer's input x0: dcn_v2 x_{l+1} = x0 * (W_l x_l + b_l) + x_l, dcn x_{l+1} = x0 * (x_l . w_l) + b_l + x_l (PaddleRec's cross_num)"));
  t.push_back(int_key(h + "cross_rank", "0", 0, 100000, kTrainer, "dcn_v2: 0 = full-rank W_l; r > 0 = low-rank W_l = U_l V_l^T with r columns (PaddleRec's low_rank sets it for DCN-Mix only)"));
  t.push_back(enum_key(h + "dcn_structure", kDcnStructureNames, DcnStructure::kStacked, kTrainer, "dcn_v2: stacked (the dnn reads the cross output) or parallel (cross and dnn side by side, concatenated before the logit layer; PaddleRec's is_stacked); dcn is always parallel, as PaddleRec's"));
  t.push_back(bool_key(h + "cross_mixture", "false", kTrainer, "dcn_v2: DCN-Mix, each cross layer a softmax-gated mixture of cross_experts low-rank experts x0 * (U_e tanh(C_e tanh(V_e^T x_l)) + b_l), rank cross_rank (> 0 needed) (PaddleRec's use_low_rank_mixture)"));
  t.push_back(int_key(h + "cross_experts", "4", 1, 64, kTrainer, "dcn_v2 with cross_mixture: experts per cross layer (PaddleRec's num_experts)"));
  t.push_back(float_key(h + "cross_l2", "0.0", 0, 1e6, kTrainer, "dcn, dcn_v2: L2 penalty cross_l2 * (sum of squares of the cross layers' weights, not biases or gate) added to the mean loss, as a gradient term (PaddleRec's l2_reg_cross); the logloss reported stays the data's"));
  t.push_back(enum_key(h + "dense_precision", kDensePrecisionNames, DensePrecision::kFp32, kTrainer, "what the dense net's GEMMs compute in: fp32, or bf16 inputs with fp32 accumulation, master weights, optimizer and loss; bf16 only where the hardware has it (AVX512-BF16/AMX CPUs, GPUs), else fp32 and said at start; an export records it and gpubox_serve serves in it (its --precision overrides)"));
  t.push_back(bool_key(h + "use_cvm", "false", kTrainer, "true: each slot also feeds log(show+1), log(click+1)-log(show+1)"));
  t.push_back(list_key(h + "slot_names", KeyType::kStringList, kDataset | kTable, "sparse slot names in data order; empty = numbered (see sparse_inputs_slots)"));
}

void add_sparse_optimizer_keys(std::vector<KeySpec>& t) {
  const std::string s = "hyper_parameters.sparse_optimizer.";
  t.push_back(enum_key(s + "class", kSparseOptimizerKindNames, SparseOptimizerKind::kAdagrad, kTable, "per-key optimizer of the sparse table (card and host tiers); a PaddleRec model folder's config that sets none of a rule's own keys (class, learning rates, thresholds, accumulators, moments, decays) and whose optimizer.class is Adam takes that Adam, as PaddleRec's trainers and Paddle's parameter server do: adam at optimizer.learning_rate (both parts), its beta1, beta2 and epsilon, embedx_threshold 0"));
  t.push_back(float_key(s + "learning_rate", "0.05", 0, kFloatMax, kTable, "embed_w learning rate"));
  t.push_back(float_key(s + "initial_g2sum", "3.0", 0, kFloatMax, kTable, "embed_w adagrad: step lr * sqrt(initial_g2sum / (initial_g2sum + g2sum)), g2sum starting at 0 as in Paddle"));
  t.push_back(float_key(s + "initial_range", "0.0", 0, kFloatMax, kTable, "embed_w starts uniform in [-initial_range, initial_range]; unset in PaddleRec's dcn_v2 folder under its Adam: the std of its net's initialiser (uniform +-sqrt(3) * 0.8796 * 0.1 / sqrt(sparse_feature_dim), 0.0241 at 40; a save records the value used)"));
  t.push_back(float_key(s + "min_bound", "-10.0", -kFloatMax, kFloatMax, kTable, "embed_w clip (lower)"));
  t.push_back(float_key(s + "max_bound", "10.0", -kFloatMax, kFloatMax, kTable, "embed_w clip (upper)"));
  t.push_back(float_key(s + "weight_decay", "0.0", 0, kFloatMax, kTable, "embed_w L2: weight_decay * w joins the gradient of each step the key takes (Paddle's sparse rules have no L2)"));
  t.push_back(float_key(s + "l1_decay", "0.0", 0, kFloatMax, kTable, "embed_w L1: l1_decay * sign(w) joins the gradient of each step the key takes (Paddle's L1Decay; PaddleRec logistic_regression's reg)"));
  t.push_back(float_key(s + "mf_learning_rate", "0.05", 0, kFloatMax, kTable, "embedx learning rate"));
  t.push_back(float_key(s + "mf_initial_g2sum", "3.0", 0, kFloatMax, kTable, "embedx adagrad: as initial_g2sum"));
  t.push_back(float_key(s + "mf_initial_range", "0.0001", 0, kFloatMax, kTable, "embedx starts uniform in [-mf_initial_range, mf_initial_range] when made (at a key's first push under embedx_threshold 0: 0 at its first forward); unset in PaddleRec's dcn_v2 folder under its Adam: as initial_range there"));
  t.push_back(float_key(s + "mf_min_bound", "-10.0", -kFloatMax, kFloatMax, kTable, "embedx clip (lower)"));
  t.push_back(float_key(s + "mf_max_bound", "10.0", -kFloatMax, kFloatMax, kTable, "embedx clip (upper)"));
  t.push_back(float_key(s + "mf_weight_decay", "0.0", 0, kFloatMax, kTable, "embedx L2, as weight_decay"));
  t.push_back(float_key(s + "beta1_decay_rate", "0.9", 0, 0.999999, kTable, "adam / shared_adam first-moment decay"));
  t.push_back(float_key(s + "beta2_decay_rate", "0.999", 0, 0.999999, kTable, "adam / shared_adam second-moment decay"));
  t.push_back(float_key(s + "ada_epsilon", "1.0e-8", 0, kFloatMax, kTable, "adam / shared_adam epsilon"));
  t.push_back(enum_key(s + "adam_bias_correction", kAdamBiasCorrectionNames, AdamBiasCorrection::kPerRow, kTable, "adam / shared_adam: whose step count t corrects the moments' bias, lr * sqrt(1 - beta2^t) / (1 - beta1^t): per_row, the row's own steps from its first (Paddle's parameter servers: SparseAdamSGDRule, PSGPU's SparseAdamOptimizer); per_table, the table's, one per training step whether the row is in the batch or not, epsilon scaled by sqrt(1 - beta2^t) (Paddle's adam op with lazy_mode, as PaddleRec's static models train in single and collective mode); per_table with runner.sync_mode gpubox (collective included) only, the step count kept with the dense half of a checkpoint save (runner.save_mode base and delta keep the rows without moments: a load starts it at 0). Not set: per_table for a PaddleRec model folder's config whose rows take its Adam and that sets no runner.sync_mode (Paddle's training without a parameter server: its adam op), per_row otherwise (sync_mode gpubox: Paddle's PSGPU keeps the powers per row too)"));
  t.push_back(float_key(s + "nonclk_coeff", "0.1", -kFloatMax, kFloatMax, kTable, "score = nonclk_coeff * (show - click) + clk_coeff * click"));
  t.push_back(float_key(s + "clk_coeff", "1.0", -kFloatMax, kFloatMax, kTable, "(see nonclk_coeff)"));
  t.push_back(bool_key(s + "show_scale", "true", kTable, "a key's gradient, summed over its occurrences in a batch, is divided by their count (Paddle's ctr_accessor_param.show_scale); false: the sum"));
  t.push_back(float_key(s + "embed_threshold", "0.0", 0, kFloatMax, kTable, "when > 0, embed_w learns only once the score reaches this: rarer keys are counted, not learned (GPUBox's; 0 = always, as Paddle)"));
  t.push_back(float_key(s + "embedx_threshold", "10.0", -kFloatMax, kFloatMax, kTable, "embedx is created once the score reaches this (Paddle's embedx_threshold / mf_create_thresholds)"));
  t.push_back(float_key(s + "show_click_decay_rate", "0.98", 0, 1, kTable, "show/click decay per shrink (only when runner.shrink_every is not never)"));
  t.push_back(float_key(s + "delete_threshold", "0.8", -kFloatMax, kFloatMax, kTable, "shrink deletes rows scoring below this (only when runner.shrink_every is not never)"));
  t.push_back(float_key(s + "delete_after_unseen_days", "30.0", 0, kFloatMax, kTable, "shrink deletes rows unseen for more than this many shrinks (days; only when runner.shrink_every is not never); a shrink counts a row one more first, so a row trained in the pass before it is unseen for 1 there (PaddleRec's accessor): 0 deletes every row at each shrink (warned)"));
  t.push_back(seed_key(s + "seed", kTable, "embedding initialisation seed (a hash of key and seed), xor runner.seed"));
}
// clang-format on

// Each default is parsed as a config's value would be: a bad default fails at the first lookup.
void parse_defaults(std::vector<KeySpec>& t) {
  for (KeySpec& k : t) {
    YAML::Node node;
    try {
      node = YAML::Load(k.default_text);
    } catch (const YAML::Exception& e) {
      GPUBOX_FAIL("config key table: the default of ", k.name, " is not YAML: ", e.what());
    }
    const Status st = detail::parse_value(k, node, "", &k.default_value);
    GPUBOX_EXPECTS(st.ok(), "config key table: bad default: ", st.message());
  }
}

std::vector<KeySpec> build_table() {
  std::vector<KeySpec> t;
  add_runner_keys(t);
  add_dense_optimizer_keys(t);
  add_model_keys(t);
  add_sparse_optimizer_keys(t);
  parse_defaults(t);
  return t;
}

// Indices of config_keys() sorted by name, for lookups.
const std::vector<std::size_t>& sorted_index() {
  static const std::vector<std::size_t> index = [] {
    const std::vector<KeySpec>& keys = config_keys();
    std::vector<std::size_t> idx(keys.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(),
              [&](std::size_t a, std::size_t b) { return keys[a].name < keys[b].name; });
    for (std::size_t i = 1; i < idx.size(); ++i) {
      GPUBOX_EXPECTS(keys[idx[i - 1]].name != keys[idx[i]].name,
                     "config key table: key listed twice: ", keys[idx[i]].name);
    }
    return idx;
  }();
  return index;
}

std::string leaf_of(const std::string& key) { return key.substr(key.rfind('.') + 1); }

}  // namespace

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

const std::vector<KeySpec>& config_keys() {
  static const std::vector<KeySpec> table = build_table();
  return table;
}

const KeySpec* find_key(std::string_view name) {
  const std::vector<KeySpec>& keys = config_keys();
  const std::vector<std::size_t>& idx = sorted_index();
  auto it = std::lower_bound(idx.begin(), idx.end(), name,
                             [&](std::size_t i, std::string_view n) { return keys[i].name < n; });
  return it != idx.end() && keys[*it].name == name ? &keys[*it] : nullptr;
}

bool is_section(std::string_view name) {
  for (const KeySpec& k : config_keys()) {
    if (k.name.size() > name.size() && k.name.compare(0, name.size(), name) == 0 &&
        k.name[name.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  return edit_distance_within(a, b, std::max(a.size(), b.size()));
}

std::size_t edit_distance_within(std::string_view a, std::string_view b, std::size_t bound) {
  // The distance is at least the length difference, and a row's minimum never falls again: both
  // end the work early, so a long or far name costs a few rows, not |a| x |b|.
  const std::size_t longer = std::max(a.size(), b.size());
  const std::size_t shorter = std::min(a.size(), b.size());
  if (longer - shorter > bound) return bound + 1;
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    std::size_t row_min = row[0];
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
      row_min = std::min(row_min, row[j]);
    }
    if (row_min > bound) return bound + 1;
  }
  return std::min(row[b.size()], bound + 1);
}

namespace {
// Every name a suggestion may give, once, in the order suggestions prefer among equals: the keys
// and their sections (a section is a prefix of many keys), then PaddleRec's names (a typo of one
// of its keys is answered with its spelling).
const std::vector<std::string>& suggestion_candidates() {
  static const std::vector<std::string> candidates = [] {
    std::vector<std::string> out;
    std::set<std::string> seen;
    const auto add = [&](const std::string& name) {
      if (seen.insert(name).second) out.push_back(name);
    };
    for (const KeySpec& k : config_keys()) {
      add(k.name);
      for (auto dot = k.name.find('.'); dot != std::string::npos; dot = k.name.find('.', dot + 1)) {
        add(k.name.substr(0, dot));
      }
    }
    for (const KeyAlias& a : key_aliases()) add(a.name);
    for (const IgnoredKey& k : ignored_paddlerec_keys()) add(k.name);
    return out;
  }();
  return candidates;
}
}  // namespace

std::vector<std::string> key_suggestions(std::string_view name) {
  const auto leaf = [](std::string_view n) {
    const auto dot = n.rfind('.');
    return dot == std::string_view::npos ? n : n.substr(dot + 1);
  };
  const std::string_view name_leaf = leaf(name);
  // Small for the name's length: a typo or two, not another word.
  const std::size_t bound = std::max<std::size_t>(1, name_leaf.size() / 3);
  std::vector<std::pair<std::size_t, std::string>> close;  // (distance, candidate)
  std::vector<std::string> same_leaf;
  const auto consider = [&](const std::string& candidate) {
    const std::size_t d = edit_distance_within(name, candidate, bound);
    if (d <= bound) {
      close.emplace_back(d, candidate);
    } else if (leaf(candidate) == name_leaf && candidate.find('.') != std::string::npos) {
      same_leaf.push_back(candidate);
    }
  };
  for (const std::string& candidate : suggestion_candidates()) consider(candidate);
  std::stable_sort(close.begin(), close.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  const auto add = [&](const std::string& candidate) {
    if (out.size() < 3 && std::find(out.begin(), out.end(), candidate) == out.end()) {
      out.push_back(candidate);
    }
  };
  for (const auto& [distance, candidate] : close) add(candidate);
  for (const std::string& candidate : same_leaf) add(candidate);
  return out;
}

std::string closest_key(std::string_view name) {
  const std::vector<std::string> s = key_suggestions(name);
  return s.empty() ? std::string() : s.front();
}

std::string type_text(const KeySpec& k) {
  const auto int_range = [&](const char* what) {
    if (k.int_max == kInt32Max || k.int_max == kInt64Max) {
      return std::string(what) + " >= " + std::to_string(k.int_min);
    }
    return std::string(what) + " in [" + std::to_string(k.int_min) + ", " +
           std::to_string(k.int_max) + "]";
  };
  switch (k.type) {
    case KeyType::kBool:
      return "true or false";
    case KeyType::kInt:
      return int_range("integer");
    case KeyType::kUInt64:
      return "integer in [0, 2^64)";
    case KeyType::kFloat:
      if (k.float_min == -kFloatMax && k.float_max == kFloatMax) return "number";
      if (k.float_max == kFloatMax) return "number >= " + number_text(k.float_min);
      return "number in [" + number_text(k.float_min) + ", " + number_text(k.float_max) + "]";
    case KeyType::kString:
      return "string";
    case KeyType::kPath:
      return k.also_list ? "path or list of paths" : "path";
    case KeyType::kWorkPath:
      return "path (from the working directory)";
    case KeyType::kEnum: {
      std::string out;
      for (const std::string& c : k.choices) out += (out.empty() ? "" : "|") + c;
      return "one of " + out;
    }
    case KeyType::kIntList:
      return "list of " + int_range("integers") +
             (k.min_items > 0 ? ", at least " + std::to_string(k.min_items) : "");
    case KeyType::kStringList:
      return "list of strings";
    case KeyType::kPathList:
      return "list of paths";
    case KeyType::kIntMap:
      return "map of slot to " + int_range("integer");
  }
  return "?";
}

std::string parts_text(const KeySpec& k) {
  if (!k.has_effect()) return "no effect (PaddleRec compatibility)";
  std::string out;
  const auto add = [&](unsigned bit, const char* name) {
    if (k.parts & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  };
  add(kTrainer, "trainer");
  add(kDataset, "dataset");
  add(kTable, "table");
  return out;
}

std::string yaml_comment(const KeySpec& k) {
  std::string out = k.has_effect() ? k.meaning : "PaddleRec compatibility, no effect: " + k.meaning;
  if (k.type == KeyType::kEnum && k.choices.size() > 1) out += " (" + type_text(k) + ")";
  return out;
}

std::string render_markdown_key_table() {
  // Text for a table cell: '|' would end the cell, '<' '>' would be read as HTML.
  const auto cell = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '|') {
        out += "\\|";
      } else if (c == '<') {
        out += "&lt;";
      } else if (c == '>') {
        out += "&gt;";
      } else {
        out += c;
      }
    }
    return out;
  };
  std::ostringstream out;
  out << "| key | type | default | read by | meaning |\n|---|---|---|---|---|\n";
  for (const KeySpec& k : config_keys()) {
    out << "| `" << k.name << "` | " << cell(type_text(k)) << " | `" << k.default_text << "` | "
        << parts_text(k) << " | " << cell(k.meaning) << " |\n";
  }
  out << "\nPaddleRec spellings of these keys (a config sets one or the other):\n\n"
         "| PaddleRec key | GPUBox key | meaning |\n|---|---|---|\n";
  for (const KeyAlias& a : key_aliases()) {
    out << "| `" << a.name << "` | " << (a.key.empty() ? "(none)" : "`" + a.key + "`") << " | "
        << cell(a.reason) << " |\n";
  }
  out << "\nPaddleRec's `table_parameters` (its sparse table and accessor, as slot_dnn's configs "
         "write them; one table) set these keys:\n\n"
         "| `table_parameters.<table>.` leaf | GPUBox key | note |\n|---|---|---|\n";
  for (const detail::TableLeafDoc& d : detail::table_parameter_docs()) {
    out << "| `" << d.path << "` | " << (d.sets.empty() ? "(no effect)" : cell(d.sets)) << " | "
        << cell(d.note) << " |\n";
  }
  out << "\nPaddleRec keys accepted with any value and ignored (listed at start when a config sets "
         "them):\n\n| PaddleRec key | why GPUBox ignores it |\n|---|---|\n";
  for (const IgnoredKey& k : ignored_paddlerec_keys()) {
    out << "| `" << k.name << (k.section ? ".*" : "") << "` | " << cell(k.reason) << " |\n";
  }
  return out.str();
}

std::string render_yaml_template() {
  std::ostringstream out;
  out << "# GPUBox config: every key at its default (gpubox_train --print_config_template).\n"
         "# Relative paths are relative to this file's folder, except the model paths\n"
         "# (model_save_path, infer_load_path, model_init_path: from the working directory, as in\n"
         "# PaddleRec); paths given with -o are relative to the working directory. An unknown key\n"
         "# or a value of the wrong type is an error.\n";
  std::vector<std::string> open;  // the sections currently open, outermost first
  std::vector<std::string> closed;
  for (const KeySpec& k : config_keys()) {
    std::vector<std::string> path;
    for (auto dot = k.name.find('.'); dot != std::string::npos; dot = k.name.find('.', dot + 1)) {
      path.push_back(k.name.substr(0, dot));
    }
    std::size_t common = 0;
    while (common < open.size() && common < path.size() && open[common] == path[common]) {
      ++common;
    }
    for (std::size_t i = common; i < open.size(); ++i) closed.push_back(open[i]);
    open.resize(common);
    for (std::size_t i = common; i < path.size(); ++i) {
      GPUBOX_EXPECTS(std::find(closed.begin(), closed.end(), path[i]) == closed.end(),
                     "config key table: the keys of section ", path[i], " are not contiguous");
      if (i == 0) out << "\n";
      out << std::string(2 * i, ' ') << leaf_of(path[i]) << ":\n";
      open.push_back(path[i]);
    }
    std::string line = std::string(2 * path.size(), ' ') + leaf_of(k.name) + ": " + k.default_text;
    line.resize(std::max<std::size_t>(line.size() + 1, 44), ' ');
    out << line << "# " << yaml_comment(k) << "\n";
  }
  return out.str();
}

}  // namespace gpubox::config
