// The sparse row: one fixed-stride float record per key, shared by the card tier (heterps) and
// the host/disk tiers (table). ARCHITECTURE §4 (CtrDymf-like). One definition, used by both.
//
//   [show, click, delta_score, unseen_days, embed_w, embed_state[k1],
//    slot, mf_dim, mf_size, embedx_state[k2], embedx_w[mf_dim]]
//
// k1/k2 depend on the optimizer (SparseOptimizerKind). mf_size is 0 until the embedx part is
// created (creation rule below), then mf_dim. The optimizer state lives in the row, so a row
// moved between tiers carries it. Everything here is trivially copyable and usable on host and
// card (GPUBOX_HD).
//
// The embedding values (embed_w, embedx_w) are kept as hyper_parameters.sparse_storage says:
// fp32, one per float slot, or fp16 / bf16 (common/half.hpp), two per float slot, so the row
// shrinks: embedx_w[2j], embedx_w[2j+1] share slot j of the embedx_w part (low, high 16 bits),
// and embed_w sits in the low half of its own slot, whose high half takes the last embedx value
// when mf_dim is odd. Every read and write of a value goes through read_embed_w / write_embed_w /
// read_embedx_w / write_embedx_w below: reads widen exactly, writes round to nearest even. The
// other fields keep their offsets whatever the storage.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/config/config_enums.hpp"
#include "common/float_rn.hpp"
#include "common/half.hpp"
#include "common/hash.hpp"
#include "common/macros.hpp"

namespace gpubox::table {

// hyper_parameters.sparse_optimizer.class (names: config::kSparseOptimizerKindNames).
using SparseOptimizerKind = config::SparseOptimizerKind;
using config::kSparseOptimizerKindNames;
// hyper_parameters.sparse_storage (names: config::kSparseStorageNames).
using SparseStorage = config::SparseStorage;
using config::kSparseStorageNames;
// hyper_parameters.sparse_optimizer.adam_bias_correction (names: config::kAdamBiasCorrectionNames).
using AdamBiasCorrection = config::AdamBiasCorrection;

// The per-key optimizer of a row: which one (hyper_parameters.sparse_optimizer.class) and its
// hyper-parameters per part (embed_w, embedx): learning rate, adagrad's initial g2sum, initial
// range, clip bounds, and adam's decays. Plain data.
struct SparseOptimizerConfig {
  SparseOptimizerKind kind = SparseOptimizerKind::kAdagrad;
  // embed_w (wide weight) part
  float learning_rate = 0.05f;
  float initial_g2sum = 3.0f;  // adagrad step: lr * sqrt(initial_g2sum / (initial_g2sum + g2sum))
  float initial_range = 0.0f;  // embed_w starts uniform in [-initial_range, initial_range]
  float min_bound = -10.0f;
  float max_bound = 10.0f;
  float weight_decay = 0.0f;  // L2 (Paddle's sparse rules have none): see sparse_rule.hpp
  float l1_decay = 0.0f;      // L1 (Paddle's L1Decay), embed_w only: see sparse_rule.hpp
  // embedx part
  float mf_learning_rate = 0.05f;
  float mf_initial_g2sum = 3.0f;
  float mf_initial_range = 1e-4f;
  float mf_min_bound = -10.0f;
  float mf_max_bound = 10.0f;
  float mf_weight_decay = 0.0f;
  // adam / shared_adam
  float beta1_decay_rate = 0.9f;
  float beta2_decay_rate = 0.999f;
  float ada_epsilon = 1e-8f;
  // adam / shared_adam: the row's step count or the table's (TableAdamStep, optimizer.hpp).
  AdamBiasCorrection bias_correction = AdamBiasCorrection::kPerRow;
};

// hyper_parameters.slot_dims: the embedx width of the slots that do not take the default
// (AccessorConfig::mf_dim), Paddle's dynamic mf dim (PSGPUWrapper::SetSlotDimVector). A row's
// width is fixed when it is created, from its slot, and the row records it (mf_dim field), so a
// row read anywhere says its own layout (RowLayout::of_row). Rows of one width form a width
// class; the tiers store each class at its own stride.
// A key seen in several slots of different widths is created, in every tier, with the slot it
// is seen in first: a pass's keys in load order (InMemoryDataset::unique_keys_and_slots, then
// begin_pass and the host tier's pull with them), a host-tier pull's in call order
// (SparseShard::locate), created on the cards (missing_keys: create) in rank order then batch
// order (HeterComm, CardSparseStore::create_missing_rows). From then on the row keeps that
// width and slot: pushes, write-backs, saves and loads carry them (a model record's slot). A
// bounded table of plain data, so that functors copy it to the card.
inline constexpr int32_t kMaxSlotDims = 128;
inline constexpr int32_t kMaxWidthClasses = 8;
struct SlotDims {
  int32_t count = 0;  // entries used
  int32_t slot[kMaxSlotDims] = {};
  int32_t dim[kMaxSlotDims] = {};
};

// The accessor (Paddle's CtrDymfAccessor role): what a sparse row is and the rules every tier
// applies to it — the embedx width, the optimizer, the show/click score with the embedx
// creation threshold, the decay and deletion rules of shrink, and the initialisation seed.
// hyper_parameters.sparse_feature_dim, hyper_parameters.sparse_optimizer.* and runner.seed, as
// table/sparse_config.hpp derives them from a config for every tier. Plain data; the defaults
// here are the key table's (tests/integration/config_agreement_test.cpp checks they agree).
struct AccessorConfig {
  int32_t mf_dim = 8;  // embedx width (sparse_feature_dim minus the wide weight)
  SparseStorage storage = SparseStorage::kFp32;  // how the rows keep embed_w and embedx_w
  SlotDims slot_dims;  // slots of another embedx width (hyper_parameters.slot_dims)
  SparseOptimizerConfig optimizer;
  // score = nonclk_coeff * (show - click) + clk_coeff * click; embedx is created at
  // embedx_threshold
  float nonclk_coeff = 0.1f;
  float clk_coeff = 1.0f;
  bool show_scale = true;        // divide a key's merged gradient by its show (sparse_rule.hpp)
  float embed_threshold = 0.0f;  // embed_w steps once the score reaches this (0: always, Paddle's)
  float embedx_threshold = 10.0f;
  // shrink: show/click decay, deletion by score and by unseen days
  float show_click_decay_rate = 0.98f;
  float delete_threshold = 0.8f;
  float delete_after_unseen_days = 30.0f;
  uint64_t seed = 0;  // embed init is a hash of (key, seed): runs are reproducible
  // Host bookkeeping, not a rule: the rule is a PaddleRec config's hyper_parameters.optimizer
  // (sparse_config_from), so its rates, beta1, beta2 and epsilon are that optimizer's keys, and
  // setting a rule's own hyper_parameters.sparse_optimizer key leaves that rule (rule_fields.hpp).
  bool rule_from_paddlerec_optimizer = false;
};

// The embedx width of the rows of `slot`.
GPUBOX_HD inline int32_t slot_mf_dim(const AccessorConfig& cfg, int32_t slot) {
  for (int32_t i = 0; i < cfg.slot_dims.count; ++i) {
    if (cfg.slot_dims.slot[i] == slot) return cfg.slot_dims.dim[i];
  }
  return cfg.mf_dim;
}

// The widths of the rows a config creates, ascending and distinct: the default and every
// slot_dims value. Class c holds the rows of width dims[c].
struct WidthClasses {
  int32_t count = 0;
  int32_t dims[kMaxWidthClasses] = {};

  // The class of rows of width `mf_dim`, or -1 when the config creates none.
  GPUBOX_HD int32_t class_of(int32_t mf_dim) const {
    for (int32_t c = 0; c < count; ++c) {
      if (dims[c] == mf_dim) return c;
    }
    return -1;
  }
  GPUBOX_HD int32_t widest() const { return count > 0 ? dims[count - 1] : 0; }
};

// The width classes of `cfg`; more than kMaxWidthClasses distinct widths is an error at config
// time (sparse_config_from), so this one only asserts it.
GPUBOX_HD inline WidthClasses width_classes(const AccessorConfig& cfg) {
  WidthClasses classes;
  const auto add = [&classes](int32_t dim) {
    if (classes.class_of(dim) >= 0 || classes.count == kMaxWidthClasses) return;
    int32_t at = classes.count++;
    for (; at > 0 && classes.dims[at - 1] > dim; --at) classes.dims[at] = classes.dims[at - 1];
    classes.dims[at] = dim;
  };
  add(cfg.mf_dim);
  for (int32_t i = 0; i < cfg.slot_dims.count; ++i) add(cfg.slot_dims.dim[i]);
  return classes;
}

// Offsets (in floats) of each field for a given optimizer, mf_dim and storage.
//
// With slot_dims, rows differ in mf_dim (and, for adam, in embedx_state_dim). Records that move
// between tiers and cards (pull and push records, host-tier transfers) take the layout of the
// widest class, record_layout(cfg): each record holds one row in its own layout (of_row) at the
// start of a widest-stride slot, zeros after it. Stored rows keep their own stride.
struct RowLayout {
  int32_t mf_dim = 0;
  int32_t embed_state_dim = 0;   // k1
  int32_t embedx_state_dim = 0;  // k2
  SparseStorage storage = SparseStorage::kFp32;
  SparseOptimizerKind kind = SparseOptimizerKind::kAdagrad;
  // A record layout (record_layout) of a config with several width classes: the rows it carries
  // say their own width. False: every row has this layout.
  bool mixed_widths = false;

  static constexpr int32_t kShow = 0;
  static constexpr int32_t kClick = 1;
  static constexpr int32_t kDeltaScore = 2;
  static constexpr int32_t kUnseenDays = 3;
  static constexpr int32_t kEmbedW = 4;
  static constexpr int32_t kEmbedState = 5;

  GPUBOX_HD static RowLayout make(SparseOptimizerKind kind, int32_t mf_dim,
                                  SparseStorage storage = SparseStorage::kFp32) {
    RowLayout layout;
    layout.mf_dim = mf_dim;
    layout.storage = storage;
    layout.kind = kind;
    switch (kind) {
      case SparseOptimizerKind::kSgd:
        layout.embed_state_dim = 0;
        layout.embedx_state_dim = 0;
        break;
      case SparseOptimizerKind::kAdagrad:  // one shared g2sum per part
        layout.embed_state_dim = 1;
        layout.embedx_state_dim = 1;
        break;
      case SparseOptimizerKind::kAdam:  // gsum[d], g2sum[d], beta1_pow, beta2_pow
        layout.embed_state_dim = 4;
        layout.embedx_state_dim = 2 * mf_dim + 2;
        break;
      case SparseOptimizerKind::kSharedAdam:  // gsum, g2sum shared over the part, beta pows
        layout.embed_state_dim = 4;
        layout.embedx_state_dim = 4;
        break;
    }
    return layout;
  }
  GPUBOX_HD int32_t slot() const { return kEmbedState + embed_state_dim; }
  GPUBOX_HD int32_t mf_dim_offset() const { return slot() + 1; }
  GPUBOX_HD int32_t mf_size() const { return slot() + 2; }
  GPUBOX_HD int32_t embedx_state() const { return slot() + 3; }
  GPUBOX_HD int32_t embedx_w() const { return embedx_state() + embedx_state_dim; }
  // 16-bit values, two per float slot (sparse_storage fp16 or bf16).
  GPUBOX_HD bool packed() const { return storage != SparseStorage::kFp32; }
  // Float slots of the embedx_w part: mf_dim, or packed mf_dim / 2 (an odd last value shares
  // embed_w's slot).
  GPUBOX_HD int32_t embedx_w_slots() const { return packed() ? mf_dim / 2 : mf_dim; }
  // Floats per row.
  GPUBOX_HD int32_t stride() const { return embedx_w() + embedx_w_slots(); }
  // The same row with fp32 values: what save records and the unpacked copies hold.
  GPUBOX_HD RowLayout unpacked() const {
    RowLayout layout = *this;
    layout.storage = SparseStorage::kFp32;
    return layout;
  }
  // The layout of `row`, a row carried under this layout: this one, or with mixed_widths the
  // one its mf_dim field names (the field's offset does not depend on the width).
  GPUBOX_HD RowLayout of_row(const float* row) const {
    return mixed_widths ? make(kind, static_cast<int32_t>(row[mf_dim_offset()]), storage) : *this;
  }
  // The layout of the rows of `slot` under `cfg`.
  GPUBOX_HD static RowLayout for_slot(const AccessorConfig& cfg, int32_t slot) {
    return make(cfg.optimizer.kind, slot_mf_dim(cfg, slot), cfg.storage);
  }

  // The pull record a model sees: show, click, embed_w, embedx_w[mf_dim].
  GPUBOX_HD int32_t pull_dim() const { return 3 + mf_dim; }
  // The push record (per key occurrence, and merged per key): show, click, embed_g,
  // embedx_g[mf_dim]; the slot travels separately.
  GPUBOX_HD int32_t push_dim() const { return 3 + mf_dim; }
};

// --- the embedding values, whatever the storage -------------------------------------------

namespace detail {
// The 16-bit value in half `high` of a float slot, widened to float.
GPUBOX_HD inline float read_half_slot(const float* slot, bool high, SparseStorage storage) {
  uint32_t bits = 0;
  std::memcpy(&bits, slot, sizeof(bits));
  const auto value = static_cast<uint16_t>(high ? bits >> 16 : bits & 0xffffu);
  return storage == SparseStorage::kFp16 ? half_to_float(value) : bf16_to_float(value);
}
// Rounds `value` to the storage's 16 bits into half `high` of a float slot; the other half stays.
GPUBOX_HD inline void write_half_slot(float* slot, bool high, SparseStorage storage, float value) {
  const uint32_t half =
      storage == SparseStorage::kFp16 ? float_to_half(value) : float_to_bf16(value);
  uint32_t bits = 0;
  std::memcpy(&bits, slot, sizeof(bits));
  bits = high ? (bits & 0x0000ffffu) | (half << 16) : (bits & 0xffff0000u) | half;
  std::memcpy(slot, &bits, sizeof(bits));
}
// Where embedx_w[i] of a packed row lives: its float slot and half.
GPUBOX_HD inline int32_t packed_embedx_slot(const RowLayout& layout, int32_t i) {
  return i < 2 * layout.embedx_w_slots() ? layout.embedx_w() + i / 2 : RowLayout::kEmbedW;
}
GPUBOX_HD inline bool packed_embedx_high(const RowLayout& layout, int32_t i) {
  return i < 2 * layout.embedx_w_slots() ? (i & 1) != 0 : true;
}
}  // namespace detail

GPUBOX_HD inline float read_embed_w(const float* row, const RowLayout& layout) {
  return layout.packed() ? detail::read_half_slot(row + RowLayout::kEmbedW, false, layout.storage)
                         : row[RowLayout::kEmbedW];
}
GPUBOX_HD inline void write_embed_w(float* row, const RowLayout& layout, float value) {
  if (layout.packed()) {
    detail::write_half_slot(row + RowLayout::kEmbedW, false, layout.storage, value);
  } else {
    row[RowLayout::kEmbedW] = value;
  }
}
// embedx_w[i], 0 <= i < mf_dim (whether or not the part exists: mf_size says).
GPUBOX_HD inline float read_embedx_w(const float* row, const RowLayout& layout, int32_t i) {
  if (!layout.packed()) return row[layout.embedx_w() + i];
  return detail::read_half_slot(row + detail::packed_embedx_slot(layout, i),
                                detail::packed_embedx_high(layout, i), layout.storage);
}
GPUBOX_HD inline void write_embedx_w(float* row, const RowLayout& layout, int32_t i, float value) {
  if (layout.packed()) {
    detail::write_half_slot(row + detail::packed_embedx_slot(layout, i),
                            detail::packed_embedx_high(layout, i), layout.storage, value);
  } else {
    row[layout.embedx_w() + i] = value;
  }
}

// The weights of one part of a row (embed_w: 1 value; embedx_w: mf_dim values) as floats, for
// the optimizer rules (sparse_rule.hpp): get widens, set rounds to the storage.
struct PartWeights {
  float* row;
  RowLayout layout;
  bool embedx;

  GPUBOX_HD float get(int32_t i) const {
    return embedx ? read_embedx_w(row, layout, i) : read_embed_w(row, layout);
  }
  GPUBOX_HD void set(int32_t i, float value) const {
    if (embedx) {
      write_embedx_w(row, layout, i, value);
    } else {
      write_embed_w(row, layout, value);
    }
  }
};

// Copies a row of layout `from` into `to` (same optimizer and mf_dim, any storage): every field
// as is, the values converted (exact when widening, rounded to nearest even when narrowing).
// With equal storages it is a plain copy.
GPUBOX_HD inline void convert_row(const float* src, const RowLayout& from, float* dst,
                                  const RowLayout& to) {
  if (from.storage == to.storage) {
    for (int32_t i = 0; i < from.stride(); ++i) dst[i] = src[i];
    return;
  }
  for (int32_t i = 0; i < from.embedx_w(); ++i) dst[i] = src[i];
  for (int32_t i = 0; i < to.embedx_w_slots(); ++i) dst[to.embedx_w() + i] = 0.0f;
  if (to.packed()) dst[RowLayout::kEmbedW] = 0.0f;  // the high half may stay unused
  write_embed_w(dst, to, read_embed_w(src, from));
  for (int32_t i = 0; i < from.mf_dim; ++i) write_embedx_w(dst, to, i, read_embedx_w(src, from, i));
}

// A digest of the width `cfg` gives each slot (the default and slot_dims, in any order), so that
// processes can check they create rows of the same widths (gpubox_server's INFO reply).
inline uint64_t slot_dims_digest(const AccessorConfig& cfg) {
  uint64_t digest = hash_with_seed(static_cast<uint64_t>(static_cast<uint32_t>(cfg.mf_dim)), 17);
  for (int32_t i = 0; i < cfg.slot_dims.count; ++i) {
    const uint64_t pair = (uint64_t{static_cast<uint32_t>(cfg.slot_dims.slot[i])} << 32) |
                          static_cast<uint32_t>(cfg.slot_dims.dim[i]);
    digest += hash_with_seed(pair, 19);
  }
  return digest;
}

// The layout of the records that carry rows of every width of `cfg` (the widest class's).
GPUBOX_HD inline RowLayout record_layout(const AccessorConfig& cfg) {
  const WidthClasses classes = width_classes(cfg);
  RowLayout layout = RowLayout::make(cfg.optimizer.kind, classes.widest(), cfg.storage);
  layout.mixed_widths = classes.count > 1;
  return layout;
}

// Copies a stored row into a record of `record`'s width: the row's own floats, then zeros.
GPUBOX_HD inline void row_into_record(const float* row, const RowLayout& record, float* out) {
  const int32_t own = record.of_row(row).stride();
  for (int32_t i = 0; i < own; ++i) out[i] = row[i];
  for (int32_t i = own; i < record.stride(); ++i) out[i] = 0.0f;
}

// nonclk_coeff * (show - click) + clk_coeff * click, each operation rounded on its own
// (common/float_rn.hpp): the card and the host get the same bits, so a row one ulp from a
// threshold is created, evicted or shrunk alike on both (nvcc would contract it into an FMA).
GPUBOX_HD inline float show_click_score(float show, float click, const AccessorConfig& cfg) {
  return add_rn(mul_rn(cfg.nonclk_coeff, sub_rn(show, click)), mul_rn(cfg.clk_coeff, click));
}

// show/click score used by the creation rule, eviction and shrink.
GPUBOX_HD inline float row_score(const float* row, const AccessorConfig& cfg) {
  return show_click_score(row[RowLayout::kShow], row[RowLayout::kClick], cfg);
}

namespace detail {
// Uniform in [-range, range] from a seeded hash of (key, seed, lane).
GPUBOX_HD inline float init_value(uint64_t key, uint64_t seed, uint32_t lane, float range) {
  const uint64_t bits = hash_with_seed(key * 0x9e3779b97f4a7c15ULL + lane, seed);
  return (2.0f * unit_float(bits) - 1.0f) * range;
}

// Optimizer state of a part at creation. As in Paddle's rules (SparseAdaGradSGDRule::
// InitValueWork, heter_ps's creation of embedx), the adagrad g2sum starts at 0: initial_g2sum
// only enters the step size, so the first step is lr * g. Adam's beta powers start at beta.
GPUBOX_HD inline void init_state(float* state, int32_t dim, const SparseOptimizerConfig& cfg) {
  for (int32_t i = 0; i < dim; ++i) state[i] = 0.0f;
  switch (cfg.kind) {
    case SparseOptimizerKind::kSgd:
    case SparseOptimizerKind::kAdagrad:
      break;
    case SparseOptimizerKind::kAdam:
    case SparseOptimizerKind::kSharedAdam:
      state[dim - 2] = cfg.beta1_decay_rate;
      state[dim - 1] = cfg.beta2_decay_rate;
      break;
  }
}
}  // namespace detail

// A new row for `key` in `slot`: counters zero, embed_w and its state initialised, embedx absent.
// The row takes the slot's width (RowLayout::for_slot); `room` is the layout of the space at
// `row` (the slot's own, or a record layout at least as wide), zeroed whole.
GPUBOX_HD inline void init_row(float* row, const RowLayout& room, const AccessorConfig& cfg,
                               uint64_t key, int32_t slot) {
  for (int32_t i = 0; i < room.stride(); ++i) row[i] = 0.0f;
  const RowLayout layout = RowLayout::for_slot(cfg, slot);
  write_embed_w(
      row, layout,
      cfg.optimizer.initial_range > 0.0f
          ? detail::init_value(key, cfg.seed ^ 0x5bd1e995ULL, 0, cfg.optimizer.initial_range)
          : 0.0f);
  detail::init_state(row + RowLayout::kEmbedState, layout.embed_state_dim, cfg.optimizer);
  row[layout.slot()] = static_cast<float>(slot);
  row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
  row[layout.mf_size()] = 0.0f;
}

// Creates the embedx part of `key`'s row now: its values from a seeded hash of (key, seed), so
// every tier, every trainer and every run creates the same values; its optimizer state fresh.
GPUBOX_HD inline void create_embedx(float* row, const RowLayout& layout, const AccessorConfig& cfg,
                                    uint64_t key) {
  for (int32_t i = 0; i < layout.mf_dim; ++i) {
    write_embedx_w(row, layout, i,
                   detail::init_value(key, cfg.seed, static_cast<uint32_t>(i + 1),
                                      cfg.optimizer.mf_initial_range));
  }
  detail::init_state(row + layout.embedx_state(), layout.embedx_state_dim, cfg.optimizer);
  row[layout.mf_size()] = static_cast<float>(layout.mf_dim);
}

// Creates the embedx part (create_embedx) when the row's score reaches embedx_threshold.
// Returns true when it created the part now.
GPUBOX_HD inline bool maybe_create_embedx(float* row, const RowLayout& any_layout,
                                          const AccessorConfig& cfg, uint64_t key) {
  const RowLayout layout = any_layout.of_row(row);
  if (row[layout.mf_size()] > 0.0f) return false;
  if (row_score(row, cfg) < cfg.embedx_threshold) return false;
  create_embedx(row, layout, cfg, key);
  return true;
}

// Field f < pull_dim() of the pull record (show, click, embed_w, embedx_w or zeros while embedx
// is absent, and past the row's own width): kernels that spread one record over several threads
// read it field by field. `layout`: the record's (any width of the row's optimizer).
GPUBOX_HD inline float pull_record_field(const float* row, const RowLayout& record, int32_t f) {
  switch (f) {
    case 0:
      return row[RowLayout::kShow];
    case 1:
      return row[RowLayout::kClick];
    case 2:
      return read_embed_w(row, record);
    default: {
      if (!(row[record.mf_size()] > 0.0f)) return 0.0f;
      const RowLayout layout = record.of_row(row);
      return f - 3 < layout.mf_dim ? read_embedx_w(row, layout, f - 3) : 0.0f;
    }
  }
}

// pull_record_field(row, record, f) for f in [begin, end) into out[0, end - begin), the row's
// embedx state and own layout read once rather than per field.
GPUBOX_HD inline void pull_record_fields(const float* row, const RowLayout& record, int32_t begin,
                                         int32_t end, float* out) {
  int32_t f = begin;
  for (; f < end && f < 3; ++f) out[f - begin] = pull_record_field(row, record, f);
  if (f >= end) return;
  int32_t stop = f;  // the end of the embedx values the row holds
  if (row[record.mf_size()] > 0.0f) {
    const RowLayout layout = record.of_row(row);
    stop = end < 3 + layout.mf_dim ? end : 3 + layout.mf_dim;
    for (; f < stop; ++f) out[f - begin] = read_embedx_w(row, layout, f - 3);
  }
  for (; f < end; ++f) out[f - begin] = 0.0f;
}

// Fills the whole pull record.
GPUBOX_HD inline void fill_pull_record(const float* row, const RowLayout& layout, float* out) {
  pull_record_fields(row, layout, 0, layout.pull_dim(), out);
}

}  // namespace gpubox::table
