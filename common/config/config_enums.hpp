// The enums whose values are config values, each with its one name table (common/enum_names.hpp)
// used to parse the config, to print and to document. They sit here, under every module, because
// every binary validates the whole config (config_keys.hpp) and must know every key's choices;
// the modules use them under their own names (dataset::DataFormat, table::SparseOptimizerKind,
// trainer::ModelKind ...). Plain enums: usable in host and device code.
#pragma once

#include <cstdint>

#include "common/enum_names.hpp"

namespace gpubox::config {

// runner.data_format: the input formats.
enum class DataFormat {
  kSlot,       // PaddleRec slot text: `click:1 dense_feature:0.5 ... 1:737395 ... 26:306163`
  kMultiSlot,  // Paddle MultiSlot: `1 <label>  <dense_dim> <v>...  (<n> <k1>..<kn>) per slot`
  kCriteo,     // raw Criteo TSV: label, 13 integers, 26 hex categoricals, tab separated
};
inline constexpr EnumName<DataFormat> kDataFormatNames[] = {
    {DataFormat::kSlot, "slot"},
    {DataFormat::kMultiSlot, "multislot"},
    {DataFormat::kCriteo, "criteo"},
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

// hyper_parameters.model.
enum class ModelKind {
  kDnn,       // PaddleRec DNN: pooled slots + dense features -> MLP (ReLU) -> 1 logit
  kWideDeep,  // kDnn + wide part (sum of embed_w over the instance's keys + linear on dense)
  kWide,      // the wide part alone plus a bias: a logistic regression (the baseline wide_deep
              // must beat)
};
inline constexpr EnumName<ModelKind> kModelKindNames[] = {
    {ModelKind::kDnn, "dnn"},
    {ModelKind::kWideDeep, "wide_deep"},
    {ModelKind::kWide, "wide"},
};

// hyper_parameters.optimizer.class: the dense optimizer.
enum class DenseOptimizerKind { kAdam, kSgd };
inline constexpr EnumName<DenseOptimizerKind> kDenseOptimizerKindNames[] = {
    {DenseOptimizerKind::kAdam, "Adam"},
    {DenseOptimizerKind::kSgd, "SGD"},
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

// runner.save_form: how the host table's save writes its part files: text (`key v0 v1 ...` per
// line, floats in shortest round-trip form, like Paddle's) or binary (little-endian uint64 key +
// float32 values per record).
enum class SaveForm { kText, kBinary };
inline constexpr EnumName<SaveForm> kSaveFormNames[] = {{SaveForm::kText, "text"},
                                                        {SaveForm::kBinary, "binary"}};

// runner.sync_mode: the training schedule. GPUBox runs the pass-staged card tier only, so far.
enum class SyncMode { kGpubox };
inline constexpr EnumName<SyncMode> kSyncModeNames[] = {{SyncMode::kGpubox, "gpubox"}};

// runner.reader_type: how a pass is read. A pass is always loaded into memory.
enum class ReaderType { kInMemoryDataset };
inline constexpr EnumName<ReaderType> kReaderTypeNames[] = {
    {ReaderType::kInMemoryDataset, "InmemoryDataset"}};

}  // namespace gpubox::config
