// The enums whose values are config values, each with its one name table (common/enum_names.hpp)
// used to parse the config, to print and to document. They sit here, under every module, because
// every binary validates the whole config (config_keys.hpp) and must know every key's choices;
// the modules use them under their own names (dataset::DataFormat, table::SparseOptimizerKind,
// trainer::ModelKind ...). Plain enums: usable in host and device code.
#pragma once

#include <cstdint>

#include "common/enum_names.hpp"

namespace gpubox::config {

// runner.data_format: the input formats. kAuto is not a format of its own: the format of each file
// (or of a pipe_command's output) is recognised from its first lines (dataset/format_detect.hpp).
enum class DataFormat {
  kAuto,       // recognise slot text (either token order), MultiSlot, raw Criteo, feat_idx,
               // idx_value or avazu text
  kSlot,       // PaddleRec slot text: `click:1 dense_feature:0.5 ... 1:737395 ... 26:306163`
  kMultiSlot,  // Paddle MultiSlot: `<n> <v1>..<vn>` per field, fields in runner.multislot_order
               // (default: label, sparse slots, dense, the order of PaddleRec's readers)
  kCriteo,     // raw Criteo TSV: label, 13 integers, 26 hex categoricals, tab separated
  kFeatIdx,    // PaddleRec's LR/FM Criteo text: `feat_idx:I ... feat_value:V ... label:L`
  kIdxValue,   // PaddleRec autoint's Criteo text: `L I_1 .. I_n V_1 .. V_n` (n fields)
  kAvazu,      // PaddleRec flen's Avazu text (avazu_reader.py): `id,f_1,..,f_n,label`, integers
};
inline constexpr EnumName<DataFormat> kDataFormatNames[] = {
    {DataFormat::kAuto, "auto"},           {DataFormat::kSlot, "slot"},
    {DataFormat::kMultiSlot, "multislot"}, {DataFormat::kCriteo, "criteo"},
    {DataFormat::kFeatIdx, "feat_idx"},    {DataFormat::kIdxValue, "idx_value"},
    {DataFormat::kAvazu, "avazu"},
};

// runner.pipe_command_args: whether a pipe_command gets PaddleRec's two arguments appended,
// `<config path> <utils path>` (PaddleRec's readers read them as sys.argv[1] and sys.argv[2]).
enum class PipeCommandArgs {
  kAuto,            // appended when the command runs a Python script (`python x.py`, `x.py`)
  kConfigAndUtils,  // always appended, as PaddleRec does
  kNone,            // never: the command reads only standard input (`zcat`, `cut -f2-`)
};
inline constexpr EnumName<PipeCommandArgs> kPipeCommandArgsNames[] = {
    {PipeCommandArgs::kAuto, "auto"},
    {PipeCommandArgs::kConfigAndUtils, "config_and_utils"},
    {PipeCommandArgs::kNone, "none"},
};

// runner.criteo_dense: how raw Criteo integer features become dense floats.
enum class CriteoDense {
  kMinMax,  // (x - min) / diff with PaddleRec's Criteo constants (what the shipped sample holds)
  kLog,     // log(1 + max(x, 0))
  kNone,    // x as is
};
inline constexpr EnumName<CriteoDense> kCriteoDenseNames[] = {
    {CriteoDense::kMinMax, "minmax"},
    {CriteoDense::kLog, "log"},
    {CriteoDense::kNone, "none"},
};

// runner.dense_transform: what slot text and MultiSlot dense values go through when GPUBox reads
// the files itself in place of a PaddleRec Python reader (dataset/paddlerec_readers.hpp).
enum class DenseTransform {
  kAuto,    // the transform of the reader the config names (runner.train_reader_path), if known
  kNone,    // x as written
  kLog1p,   // log(x + 1), as dcn_v2's reader.py
  kClip01,  // max(0, min(1, x)), as deepfefm's criteo_reader.py
};
inline constexpr EnumName<DenseTransform> kDenseTransformNames[] = {
    {DenseTransform::kAuto, "auto"},
    {DenseTransform::kNone, "none"},
    {DenseTransform::kLog1p, "log1p"},
    {DenseTransform::kClip01, "clip01"},
};

// runner.slot_token_order: `slot:feasign` tokens or `feasign:slot` tokens in slot text.
enum class SlotTokenOrder { kSlotFirst, kFeasignFirst };
inline constexpr EnumName<SlotTokenOrder> kSlotTokenOrderNames[] = {
    {SlotTokenOrder::kSlotFirst, "slot:feasign"},
    {SlotTokenOrder::kFeasignFirst, "feasign:slot"},
};

// hyper_parameters.sparse_optimizer.class. The values are written in save MANIFESTs and sent in
// the server's INFO reply: never renumber them.
enum class SparseOptimizerKind : int32_t { kSgd = 0, kAdagrad = 1, kAdam = 2, kSharedAdam = 3 };
inline constexpr EnumName<SparseOptimizerKind> kSparseOptimizerKindNames[] = {
    {SparseOptimizerKind::kSgd, "sgd"},
    {SparseOptimizerKind::kAdagrad, "adagrad"},
    {SparseOptimizerKind::kAdam, "adam"},
    {SparseOptimizerKind::kSharedAdam, "shared_adam"},
};

// hyper_parameters.sparse_optimizer.adam_bias_correction: whose step count corrects adam's (and
// shared_adam's) moments for their start at 0, lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t).
// per_row: t is the row's own steps, from its first (Paddle's parameter-server rules keep
// beta1_pow and beta2_pow in every row: SparseAdamSGDRule, and PSGPU's SparseAdamOptimizer).
// per_table: t is the table's steps, one per training step whether a row is in the batch or not,
// and epsilon is scaled by sqrt(1 - beta2^t) too (Paddle's adam op with lazy_mode, which
// PaddleRec's static models use in single and collective training: one beta1_pow / beta2_pow per
// parameter, advanced by every step). A save records the value used (a resume compares it).
enum class AdamBiasCorrection : int32_t { kPerRow = 0, kPerTable = 1 };
inline constexpr EnumName<AdamBiasCorrection> kAdamBiasCorrectionNames[] = {
    {AdamBiasCorrection::kPerRow, "per_row"},
    {AdamBiasCorrection::kPerTable, "per_table"},
};

// hyper_parameters.sparse_storage: how the sparse rows keep their embedding values (embed_w,
// embedx_w) in the card and host tiers (and the disk tier, which holds the same rows): fp32, or
// rounded to 16 bits (to nearest, ties to even) and packed two per float slot; optimizer state
// and show/click stay fp32, the arithmetic is fp32. The values are written in save MANIFESTs and
// sent in the server's INFO reply: never renumber them.
enum class SparseStorage : int32_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };
inline constexpr EnumName<SparseStorage> kSparseStorageNames[] = {
    {SparseStorage::kFp32, "fp32"},
    {SparseStorage::kFp16, "fp16"},
    {SparseStorage::kBf16, "bf16"},
};

// hyper_parameters.model.
enum class ModelKind {
  kDnn,       // PaddleRec DNN: pooled slots + dense features -> MLP (ReLU) -> 1 logit
  kWideDeep,  // kDnn + wide part (sum of embed_w over the instance's keys + linear on dense)
  kWide,      // the wide part alone plus a bias: a logistic regression (the baseline wide_deep
              // must beat)
  kDeepFm,    // kWideDeep + the pairwise factorization-machine term over the slots' embeddings
  kDcnV2,     // DCN-v2: a cross network over the first layer's input rows, stacked before the MLP
              // or parallel to it (hyper_parameters.cross_layers, cross_rank, dcn_structure)
  kFm,        // a factorization machine: kWide's first-order terms and bias + kDeepFm's pairwise
              // term, no MLP (PaddleRec's fm)
  kDcn,       // DCN (v1): vector cross layers x0 * (x_l . w_l) + b_l + x_l beside the MLP, both
              // read by the logit layer (PaddleRec's dcn; hyper_parameters.cross_layers)
  kDlrm,      // DLRM: a bottom MLP over the dense features, pairwise dot products among it and the
          // slots' embeddings, a top MLP (fc_sizes) over both (hyper_parameters.bot_layer_sizes)
  kXdeepfm,  // xDeepFM: the wide part + a Compressed Interaction Network over the slots' and dense
             // features' embeddings + the MLP over them (hyper_parameters.layer_sizes_cin)
  kFfm,      // a field-aware factorization machine: kFm with one factor per (feature, field pair):
             // a key's row holds one k-vector per field (fields = sparse slots + dense features;
             // row_embedx_width), no MLP (PaddleRec's ffm)
  // DeepFEFM: the wide part + a field-embedded FM (v_a^T (W_ab + W_ab^T) v_b for every pair of
  // fields, slots and dense features) + the MLP over the slots' embeddings, the dense terms and
  // the pairs' values (PaddleRec's deepfefm; deepfefm_part.hpp)
  kDeepFefm,
  kAutoint,  // AutoInt: multi-head self-attention layers over the slots' and dense features'
             // embeddings into the logit, + the wide part (use_wide) and the MLP over the
             // embeddings when fc_sizes is set (hyper_parameters.attn_layer_sizes, head_num)
  kFlen,     // FLEN: the MLP over the slots' embeddings + a field-wise bi-interaction between
             // field groups (hyper_parameters.field_group_sizes) through a ReLU layer into the
             // logit (PaddleRec's flen; flen_part.hpp)
  // FAT-DeepFFM: kFfm's rows (one k-vector per field), a squeeze-excitation attention (CEN) over
  // the field-aware vectors, their sum as first-order term and the MLP over the pairs' Hadamard
  // products (PaddleRec's fat_deepffm; fat_deepffm_part.hpp)
  kFatDeepffm,
};
inline constexpr EnumName<ModelKind> kModelKindNames[] = {
    {ModelKind::kDnn, "dnn"},           {ModelKind::kWideDeep, "wide_deep"},
    {ModelKind::kWide, "wide"},         {ModelKind::kDeepFm, "deepfm"},
    {ModelKind::kDcnV2, "dcn_v2"},      {ModelKind::kFm, "fm"},
    {ModelKind::kDcn, "dcn"},           {ModelKind::kDlrm, "dlrm"},
    {ModelKind::kXdeepfm, "xdeepfm"},   {ModelKind::kFfm, "ffm"},
    {ModelKind::kDeepFefm, "deepfefm"}, {ModelKind::kAutoint, "autoint"},
    {ModelKind::kFlen, "flen"},         {ModelKind::kFatDeepffm, "fat_deepffm"},
};

// hyper_parameters.dcn_structure: how dcn_v2's cross network meets the MLP (DCN-v2's two
// structures; PaddleRec's is_stacked). stacked: the MLP reads the cross network's output;
// parallel: both read the input rows and the output layer reads [cross output | last hidden].
enum class DcnStructure { kStacked, kParallel };
inline constexpr EnumName<DcnStructure> kDcnStructureNames[] = {
    {DcnStructure::kStacked, "stacked"},
    {DcnStructure::kParallel, "parallel"},
};

// hyper_parameters.dlrm_output: dlrm's output layer. logit: one linear logit, sigmoid (MLPerf's
// DLRM). softmax2: PaddleRec's (its MLPLayer over top_layer_sizes ending in 2): the top MLP's last
// layer is 2 wide and, like its hidden layers, ReLU'd (and batch-normalised with dnn_batch_norm),
// then a two-class softmax, trained by its cross entropy; the prediction is softmax's class 1,
// sigmoid(u1 - u0) of the two outputs.
enum class DlrmOutput { kLogit, kSoftmax2 };
inline constexpr EnumName<DlrmOutput> kDlrmOutputNames[] = {
    {DlrmOutput::kLogit, "logit"},
    {DlrmOutput::kSoftmax2, "softmax2"},
};

// hyper_parameters.dense_precision: what the dense net's GEMMs read. bf16: activations and the
// weights' GEMM copies in bf16; accumulation, master weights, optimizer, biases and loss in fp32.
enum class DensePrecision { kFp32, kBf16 };
inline constexpr EnumName<DensePrecision> kDensePrecisionNames[] = {
    {DensePrecision::kFp32, "fp32"},
    {DensePrecision::kBf16, "bf16"},
};

// hyper_parameters.optimizer.class: the dense optimizer.
enum class DenseOptimizerKind { kAdam, kSgd, kAdagrad };
inline constexpr EnumName<DenseOptimizerKind> kDenseOptimizerKindNames[] = {
    {DenseOptimizerKind::kAdam, "Adam"},
    {DenseOptimizerKind::kSgd, "SGD"},
    {DenseOptimizerKind::kAdagrad, "Adagrad"},  // Paddle's, as PaddleRec's flen trains with
};

// runner.save_mode, and what one save of the sparse table writes: base (the model rows),
// delta (rows changed since the previous save, and deletions), checkpoint (full rows with
// optimizer state). kNone: the trainer does not save. The values travel in SAVE requests and
// name saves in MANIFEST files: never renumber them.
enum class SaveKind : uint32_t { kBase = 0, kDelta = 1, kCheckpoint = 2, kNone = 3 };
inline constexpr EnumName<SaveKind> kSaveKindNames[] = {
    {SaveKind::kNone, "none"},
    {SaveKind::kBase, "base"},
    {SaveKind::kDelta, "delta"},
    {SaveKind::kCheckpoint, "checkpoint"},
};

// runner.resume: what a training command does when runner.model_save_path already holds a
// complete save (trainer/schedule/checkpoint.hpp).
enum class ResumeMode {
  kAuto,  // continue from the last complete save, with the pass after it
  kOff,   // start afresh (from --load or from scratch); this run's saves replace the old ones
};
inline constexpr EnumName<ResumeMode> kResumeModeNames[] = {
    {ResumeMode::kAuto, "auto"},
    {ResumeMode::kOff, "off"},
};

// runner.save_form: how the host table's save writes its part files: text (`key v0 v1 ...` per
// line, floats in shortest round-trip form, like Paddle's) or binary (little-endian uint64 key +
// float32 values per record).
enum class SaveForm { kText, kBinary };
inline constexpr EnumName<SaveForm> kSaveFormNames[] = {{SaveForm::kText, "text"},
                                                        {SaveForm::kBinary, "binary"}};

// runner.sync_mode: the training schedule (ARCHITECTURE §7). Every schedule uses the same parts
// (dataset, accessor rules, servers, client, dense net); they differ in where rows live during a
// step and when trainers meet. Collective (runner.use_fleet without sync_mode) is not a value.
enum class SyncMode {
  kGpubox,  // each pass's rows staged on the cards; dense all-reduced every step
  kAsync,   // CPU parameter server: threads pull rows per batch, push gradients without waiting
  kSync,    // as async, with every trainer's step applied before anyone's next pull (a barrier)
  kGeo,     // trainers train local copies; every runner.geo_step steps push deltas, pull merged
};
inline constexpr EnumName<SyncMode> kSyncModeNames[] = {{SyncMode::kGpubox, "gpubox"},
                                                        {SyncMode::kAsync, "async"},
                                                        {SyncMode::kSync, "sync"},
                                                        {SyncMode::kGeo, "geo"}};

// runner.reader_type: how a pass is read, PaddleRec's spellings: loaded into memory whole
// (dataset/in_memory_dataset.hpp), or streamed through a bounded queue (queue_dataset.hpp).
// PaddleRec's DataLoader (its Python reader feeding the trainer batch by batch, as its
// benchmark configs ask) has no GPUBox counterpart to choose: GPUBox reads the files itself, so
// it is read as InmemoryDataset (every use tests for kQueueDataset).
enum class ReaderType { kInMemoryDataset, kQueueDataset, kDataLoader };
inline constexpr EnumName<ReaderType> kReaderTypeNames[] = {
    {ReaderType::kInMemoryDataset, "InmemoryDataset"},
    {ReaderType::kQueueDataset, "QueueDataset"},
    {ReaderType::kDataLoader, "DataLoader"}};

}  // namespace gpubox::config
