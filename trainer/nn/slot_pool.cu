#include <algorithm>
#include <type_traits>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/device_math.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using heter_comm::position_t;

// Field f of occurrence p's pull record.
struct PullRecords {
  using value_type = float;
  const float* records;
  int pull_dim;
  GPUBOX_HD float value(position_t p, int32_t f) const {
    return records[static_cast<int64_t>(p) * pull_dim + f];
  }
};

// Columns (and push fields) one work item covers. CUDA: one, so that neighbouring threads read
// neighbouring floats of a record. cpu: a group, so that a core splits an item's index into
// (slot, instance) once per segment rather than once per column (those integer divisions were
// half of the forward's time) and walks a segment's records once. Each column's additions are
// the same either way, so the choice never changes a bit of the result.
inline constexpr int kColumnsPerItem = heter_comm::kDefaultFieldsPerItem;

GPUBOX_HD GPUBOX_FORCEINLINE int columns_left(int total, int first) {
  return total - first < kColumnsPerItem ? total - first : kColumnsPerItem;
}

#if !defined(GPUBOX_BACKEND_CUDA)
// The pool's cpu loops (parallel_for's run_range): visit(s, i, segment, group) for the items
// [begin, end) of a slot-major space, item = (s * batch + i) * groups + group, a tile of
// kInstanceTile instances at a time across the range's slots. Item by item, each item touched an
// input row out_dim or ld values from the last (a cache miss each, the loops' main cost); a
// tile's rows stay in L1 for every slot. Every item is visited once, so the stores are the
// item-by-item loop's.
template <class Visit>
void visit_by_instance_tile(std::size_t begin, std::size_t end, int64_t batch, int groups,
                            const Visit& visit) {
  constexpr int64_t kInstanceTile = 16;
  const auto per_segment = static_cast<std::size_t>(groups);
  const int64_t first_slot = static_cast<int64_t>(begin / per_segment) / batch;
  const int64_t last_slot = static_cast<int64_t>((end - 1) / per_segment) / batch;
  for (int64_t tile = 0; tile < batch; tile += kInstanceTile) {
    const int64_t tile_end = tile + kInstanceTile < batch ? tile + kInstanceTile : batch;
    for (int64_t s = first_slot; s <= last_slot; ++s) {
      for (int64_t i = tile; i < tile_end; ++i) {
        const auto segment = static_cast<std::size_t>(s * batch + i);
        for (int group = 0; group < groups; ++group) {
          const std::size_t item = segment * per_segment + static_cast<std::size_t>(group);
          if (item >= begin && item < end) visit(s, i, segment, group);
        }
      }
    }
  }
}
#endif

// Writes the first layer's input rows (T: float or Bf16, row stride ld). Items [0, pooled_items)
// are one per (slot, instance) segment and group of output columns: an item sums its fields of
// the segment's records in the fixed order of segment_reduce.cuh (a segment is one instance's
// keys in one slot: short, so one thread takes it whole) and owns its output values, so no
// atomics are needed. With use_cvm, column 0 sums show and click and writes both cvm features.
// The items after them copy the dense features behind the pooled columns (the concat, in place),
// a group of an instance's features each.
template <class T>
struct PoolForward {
  PullRecords records;
  const uint32_t* offsets;
  const float* dense;
  T* rows;
  int64_t ld;
  int64_t batch;
  std::size_t pooled_items;
  int groups;        // column groups per segment: ceil(columns / kColumnsPerItem), where
                     // columns = cvm ? 1 + values : values, values = pull_dim - 2
  int dense_groups;  // ceil(dense_dim / kColumnsPerItem)
  SlotBlocks blocks;
  int out_dim;
  int dense_dim;
  bool use_cvm;
  GPUBOX_HD void operator()(std::size_t item) const {
    if (item >= pooled_items) {
      copy_dense(item - pooled_items);
      return;
    }
    const std::size_t segment = groups == 1 ? item : item / static_cast<std::size_t>(groups);
    const int64_t s = static_cast<int64_t>(segment) / batch;
    pool_group(s, static_cast<int64_t>(segment) - s * batch, segment,
               static_cast<int>(item - segment * groups));
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    const std::size_t pooled_end = end < pooled_items ? end : pooled_items;
    if (begin < pooled_end) {
      visit_by_instance_tile(begin, pooled_end, batch, groups,
                             [this](int64_t s, int64_t i, std::size_t segment, int group) {
                               pool_group(s, i, segment, group);
                             });
    }
    for (std::size_t k = begin > pooled_items ? begin : pooled_items; k < end; ++k) {
      copy_dense(k - pooled_items);
    }
  }
#endif
  // Column group `group` of segment (slot s, instance i).
  GPUBOX_HD void pool_group(int64_t s, int64_t i, std::size_t segment, int group) const {
    const int first = group * kColumnsPerItem;
    // A slot narrower than the records has fewer columns: an item past them has none.
    const int count = columns_left(blocks.width_of(s) - (use_cvm ? 1 : 0), first);
    if (count <= 0) return;
    pool_columns(segment, rows + i * ld + blocks.begin(s), first, count);
  }
  // Columns [first, first + count) of one segment. Column c sums field 2 + c, or 1 + c with cvm
  // (whose column 0 sums fields 0 and 1, show and click): a field f >= 2 lands at out[f] with
  // cvm and at out[f - 2] without.
  GPUBOX_HD void pool_columns(std::size_t segment, T* out, int first, int count) const {
    const bool cvm_head = use_cvm && first == 0;
    const int first_field = use_cvm ? (cvm_head ? 0 : 1 + first) : 2 + first;
    const int fields = count + (cvm_head ? 1 : 0);
    // The loops over sums run to its constant size with a guard inside: unrolled, so that on
    // CUDA (two sums) the array stays in registers.
    constexpr int kSums = kColumnsPerItem + 1;
    float sums[kSums];
    const position_t begin = offsets[segment];
    const position_t end = offsets[segment + 1];
#if !defined(GPUBOX_BACKEND_CUDA)
    // cpu: a segment of one key without cvm (the usual slot) in one short loop without the
    // guards below: the same -0.0f + field sum, so the same bits.
    if (!use_cvm && end == begin + 1) {
      const float* field = &records.records[static_cast<int64_t>(begin) * records.pull_dim];
      for (int k = 0; k < count; ++k) store_as(out + first + k, -0.0f + field[first_field + k]);
      return;
    }
#endif
    if (begin < end && end - begin <= heter_comm::kReduceChunk) {
      // sum_segment's one-chunk order, summed in place (its copy out of a variable count of
      // accumulators compiled to `rep movs`, half of this function's time on the cpu backend).
      for (int k = 0; k < kSums; ++k) sums[k] = -0.0f;
      for (position_t p = begin; p < end; ++p) {
        for (int k = 0; k < kSums; ++k) {
          if (k < fields) sums[k] += records.value(p, first_field + k);
        }
      }
    } else {
      heter_comm::sum_segment<kSums>(records, begin, end, first_field, fields, sums);
    }
    const int out_base = use_cvm ? first_field : first;
    int k = 0;
    if (cvm_head) {
      const float log_show = detail::log1p_f(sums[0]);
      store_as(out, log_show);
      store_as(out + 1, detail::log1p_f(sums[1]) - log_show);
      k = 2;
    }
    for (; k < kSums; ++k) {
      if (k < fields) store_as(out + out_base + k, sums[k]);
    }
  }
  GPUBOX_HD void copy_dense(std::size_t k) const {
    const std::size_t i = dense_groups == 1 ? k : k / static_cast<std::size_t>(dense_groups);
    const int first = static_cast<int>(k - i * dense_groups) * kColumnsPerItem;
    const int count = columns_left(dense_dim, first);
    T* out = rows + static_cast<int64_t>(i) * ld + out_dim + first;
    const float* in = dense + static_cast<int64_t>(i) * dense_dim + first;
    for (int j = 0; j < count; ++j) store_as(out + j, in[j]);
  }
};

// One work item per (slot, instance) segment and group of push fields: it writes those fields
// of every occurrence of the segment (show = 1, click = label, gradients scaled).
struct PoolBackward {
  const uint32_t* offsets;
  const float* d_pooled;
  const float* labels;
  float* push;
  float scale;
  int64_t batch;
  int push_dim;
  int groups;  // ceil(push_dim / kColumnsPerItem)
  SlotBlocks blocks;
  int64_t d_ld;  // d_pooled's row stride (>= the pool's out_dim)
  int cvm_columns;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t segment = groups == 1 ? item : item / static_cast<std::size_t>(groups);
    const int64_t s = static_cast<int64_t>(segment) / batch;
    write_group(s, static_cast<int64_t>(segment) - s * batch, segment,
                static_cast<int>(item - segment * groups));
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    visit_by_instance_tile(begin, end, batch, groups,
                           [this](int64_t s, int64_t i, std::size_t segment, int group) {
                             write_group(s, i, segment, group);
                           });
  }
#endif
  // Push fields [group * kColumnsPerItem, + kColumnsPerItem) of every occurrence of `segment`
  // (slot s, instance i). The loops run to their constant size with a guard inside (as
  // PoolForward's), so that the row stores stay stores (a variable-length copy compiled to
  // `rep movs`, a third of this loop's time on the cpu backend).
  GPUBOX_HD void write_group(int64_t s, int64_t i, std::size_t segment, int group) const {
    const int first = group * kColumnsPerItem;
    const int count = columns_left(push_dim, first);
#if !defined(GPUBOX_BACKEND_CUDA)
    // cpu: a segment of one key whose slot fills the record (the usual one) written directly,
    // this group's fields of it: field_value's values, without its per-field branches and the
    // guarded loops below (records wider than a group, e.g. 16-float embeddings, take two).
    const uint32_t begin = offsets[segment];
    if (offsets[segment + 1] == begin + 1 && blocks.width_of(s) - cvm_columns >= push_dim - 2) {
      float* row = push + static_cast<int64_t>(begin) * push_dim;
      const float* d = d_pooled + i * d_ld + blocks.begin(s) + cvm_columns;
      int field = first;
      if (field == 0) {  // count >= 2: push_dim >= 3 and a group is wider
        row[0] = 1.0f;
        row[1] = labels[i];
        field = 2;
      }
      for (; field < first + count; ++field) row[field] = scale * d[field - 2];
      return;
    }
#endif
    float values[kColumnsPerItem];
    for (int k = 0; k < kColumnsPerItem; ++k) {
      values[k] = k < count ? field_value(s, i, first + k) : 0.0f;
    }
    for (uint32_t j = offsets[segment]; j < offsets[segment + 1]; ++j) {
      float* row = push + static_cast<int64_t>(j) * push_dim + first;
      for (int k = 0; k < kColumnsPerItem; ++k) {
        if (k < count) row[k] = values[k];
      }
    }
  }
  GPUBOX_HD float field_value(int64_t s, int64_t i, int field) const {
    if (field == 0) return 1.0f;
    if (field == 1) return labels[i];
    // Fields past the slot's width (a narrower slot's in wider records) push zero.
    const int column = cvm_columns + (field - 2);
    return column < blocks.width_of(s) ? scale * d_pooled[i * d_ld + blocks.begin(s) + column]
                                       : 0.0f;
  }
};
}  // namespace

SlotSumPool::SlotSumPool(int slots, int mf_dim, bool use_cvm)
    : slots_(slots), mf_dim_(mf_dim), use_cvm_(use_cvm) {
  GPUBOX_EXPECTS(slots > 0 && mf_dim >= 0, "slot pool needs slots > 0 and mf_dim >= 0, got ", slots,
                 " slots, mf_dim ", mf_dim);
}

SlotSumPool::SlotSumPool(device::Card& card, const std::vector<int>& slot_dims, int record_mf_dim,
                         bool use_cvm)
    : SlotSumPool(static_cast<int>(slot_dims.size()), record_mf_dim, use_cvm) {
  if (std::all_of(slot_dims.begin(), slot_dims.end(),
                  [&](int dim) { return dim == record_mf_dim; })) {
    return;
  }
  offsets_host_.assign(1, 0);
  for (int dim : slot_dims) {
    GPUBOX_EXPECTS(dim >= 0 && dim <= record_mf_dim,
                   "slot pool: a slot's embedx width must be in [0, ", record_mf_dim,
                   "] (the records' width), got ", dim);
    offsets_host_.push_back(offsets_host_.back() + (use_cvm ? 2 : 0) + 1 + dim);
  }
  offsets_ = device::to_device(offsets_host_, card.memory(), card.stream());
  card.stream().synchronize();
}

void SlotSumPool::forward(const device::Stream& stream, const SlotBatchView& in, const float* dense,
                          int dense_dim, const InputRows& out) const {
  GPUBOX_EXPECTS(in.slots == slots_, "batch has ", in.slots, " slots, the model ", slots_);
  GPUBOX_EXPECTS(dense_dim >= 0 && out.ld >= out_dim() + dense_dim, "input rows of ", out.ld,
                 " columns cannot hold ", out_dim(), " pooled and ", dense_dim, " dense features");
  if (in.batch == 0) return;
  const int values = pull_dim() - 2;
  const int columns = use_cvm_ ? 1 + values : values;
  const int groups = (columns + kColumnsPerItem - 1) / kColumnsPerItem;
  const int dense_groups = (dense_dim + kColumnsPerItem - 1) / kColumnsPerItem;
  const std::size_t pooled_items = static_cast<std::size_t>(in.batch) * slots_ * groups;
  const std::size_t items = pooled_items + static_cast<std::size_t>(in.batch) * dense_groups;
  auto launch = [&](auto* rows) {
    using T = std::remove_pointer_t<decltype(rows)>;
    device::parallel_for(stream, items,
                         PoolForward<T>{PullRecords{in.records, pull_dim()}, in.offsets, dense,
                                        rows, out.ld, in.batch, pooled_items, groups, dense_groups,
                                        blocks(), out_dim(), dense_dim, use_cvm_});
  };
  if (out.type == ElementType::kBf16) {
    launch(static_cast<Bf16*>(out.data));
  } else {
    launch(static_cast<float*>(out.data));
  }
}

void SlotSumPool::backward(const device::Stream& stream, const SlotBatchView& in,
                           const float* d_pooled, int64_t d_ld, const float* labels, float scale,
                           float* push) const {
  GPUBOX_EXPECTS(in.slots == slots_, "batch has ", in.slots, " slots, the model ", slots_);
  GPUBOX_EXPECTS(d_ld >= out_dim(), "pooled gradient rows of ", d_ld, " floats cannot hold ",
                 out_dim(), " pooled columns");
  if (in.batch == 0) return;
  const int groups = (push_dim() + kColumnsPerItem - 1) / kColumnsPerItem;
  device::parallel_for(stream, static_cast<std::size_t>(in.batch) * slots_ * groups,
                       PoolBackward{in.offsets, d_pooled, labels, push, scale, in.batch, push_dim(),
                                    groups, blocks(), d_ld, use_cvm_ ? 2 : 0});
}

}  // namespace gpubox::trainer
