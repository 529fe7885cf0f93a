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

// Fields one work item of the pool takes: heter_comm's choice for segment sums (one on CUDA, so
// that neighbouring threads read neighbouring floats of a record; a group on the cpu backend, so
// that a core walks a segment's records once, with one index division per segment). Each value's
// additions are the same either way: the choice never changes a bit.
constexpr int32_t kPoolFields = heter_comm::kDefaultFieldsPerItem;

// Writes the first layer's input rows (T: float or Bf16, row stride ld). Items [0, pooled_items)
// are one per (slot, instance) segment and group of its records' fields (groups.fields of them:
// show and click with use_cvm, then embed_w, embedx_w[mf_dim]): an item sums them over the
// segment's records in the fixed order of segment_reduce.cuh (a segment is one instance's keys in
// one slot: short, so one thread takes it whole) and owns its output values, so no atomics are
// needed. Output column o holds field o with use_cvm (show and click as the cvm features), field
// 2 + o without. The items after them copy the dense features, one each, behind the pooled
// columns (the concat, in place).
template <class T>
struct PoolForward {
  PullRecords records;
  const uint32_t* offsets;
  const float* dense;
  T* rows;
  int64_t ld;
  int64_t batch;
  std::size_t pooled_items;
  heter_comm::FieldGroups<kPoolFields> groups;
  SlotBlocks blocks;
  int out_dim;
  int dense_dim;
  bool use_cvm;
  GPUBOX_HD void operator()(std::size_t item) const {
    if (item >= pooled_items) {
      const auto k = static_cast<int64_t>(item - pooled_items);
      const int64_t i = k / dense_dim;
      store_as(rows + i * ld + out_dim + k % dense_dim, dense[k]);
      return;
    }
    const auto segment = static_cast<int64_t>(groups.row(item));
    const int32_t first = groups.first(item);
    const int64_t s = segment / batch;
    const int64_t i = segment % batch;
    // A slot narrower than the records has fewer columns: the fields past them are not pooled.
    const int32_t left = blocks.width_of(s) - first;
    const int32_t count = groups.count(item) < left ? groups.count(item) : left;
    if (count <= 0) return;
    const position_t begin = offsets[segment];
    const position_t end = offsets[segment + 1];
    float sums[kPoolFields];
    heter_comm::sum_segment<kPoolFields>(records, begin, end, (use_cvm ? 0 : 2) + first, count,
                                         sums);
    // The click feature, log(click + 1) - log(show + 1), needs show's sum: this item's first
    // value when it holds both, else (one field an item, CUDA) summed here.
    const bool has_click = use_cvm && first <= 1 && first + count > 1;
    const float show = !has_click   ? 0.0f
                       : first == 0 ? sums[0]
                                    : heter_comm::sum_segment(records, begin, end, 0);
    T* out = rows + i * ld + blocks.begin(s) + first;
    for (int32_t j = 0; j < count; ++j) {
      const int32_t column = first + j;
      if (!use_cvm || column > 1) {
        store_as(out + j, sums[j]);
      } else if (column == 0) {
        store_as(out + j, detail::log1p_f(sums[j]));
      } else {
        store_as(out + j, detail::log1p_f(sums[j]) - detail::log1p_f(show));
      }
    }
  }
};

// One work item per (slot, instance) segment and group of push fields (kPoolFields, as the
// forward): it writes those fields of every occurrence of the segment (show = 1, click = label,
// gradients scaled).
struct PoolBackward {
  const uint32_t* offsets;
  const float* d_pooled;
  const float* labels;
  float* push;
  float scale;
  int64_t batch;
  heter_comm::FieldGroups<kPoolFields> groups;  // groups.fields: push_dim
  SlotBlocks blocks;
  int out_dim;
  int cvm_columns;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto segment = static_cast<int64_t>(groups.row(item));
    const int32_t first = groups.first(item);
    const int32_t count = groups.count(item);
    const int64_t s = segment / batch;
    const int64_t i = segment % batch;
    float values[kPoolFields] = {};
    for (int32_t j = 0; j < count; ++j) {
      const int field = first + j;
      float value = 1.0f;
      if (field == 1) {
        value = labels[i];
      } else if (field >= 2) {
        // Fields past the slot's width (a narrower slot's in wider records) push zero.
        const int column = cvm_columns + (field - 2);
        value = column < blocks.width_of(s)
                    ? scale * d_pooled[i * out_dim + blocks.begin(s) + column]
                    : 0.0f;
      }
      values[j] = value;
    }
    const int64_t push_dim = groups.fields;
    for (uint32_t p = offsets[segment]; p < offsets[segment + 1]; ++p) {
      float* record = push + static_cast<int64_t>(p) * push_dim + first;
      for (int32_t j = 0; j < count; ++j) record[j] = values[j];
    }
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
  const heter_comm::FieldGroups<kPoolFields> groups{use_cvm_ ? pull_dim() : pull_dim() - 2};
  const std::size_t pooled_items = static_cast<std::size_t>(in.batch) * slots_ * groups.groups();
  const std::size_t items = pooled_items + static_cast<std::size_t>(in.batch) * dense_dim;
  auto launch = [&](auto* rows) {
    using T = std::remove_pointer_t<decltype(rows)>;
    device::parallel_for(
        stream, items,
        PoolForward<T>{PullRecords{in.records, pull_dim()}, in.offsets, dense, rows, out.ld,
                       in.batch, pooled_items, groups, blocks(), out_dim(), dense_dim, use_cvm_});
  };
  if (out.type == ElementType::kBf16) {
    launch(static_cast<Bf16*>(out.data));
  } else {
    launch(static_cast<float*>(out.data));
  }
}

void SlotSumPool::backward(const device::Stream& stream, const SlotBatchView& in,
                           const float* d_pooled, const float* labels, float scale,
                           float* push) const {
  GPUBOX_EXPECTS(in.slots == slots_, "batch has ", in.slots, " slots, the model ", slots_);
  if (in.batch == 0) return;
  const heter_comm::FieldGroups<kPoolFields> groups{push_dim()};
  device::parallel_for(stream, static_cast<std::size_t>(in.batch) * slots_ * groups.groups(),
                       PoolBackward{in.offsets, d_pooled, labels, push, scale, in.batch, groups,
                                    blocks(), out_dim(), use_cvm_ ? 2 : 0});
}

}  // namespace gpubox::trainer
