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

// Writes the first layer's input rows (T: float or Bf16, row stride ld). Items [0, pooled_items)
// are one per (slot, instance) segment and output column: an item sums one field of the
// segment's records in the fixed order of segment_reduce.cuh (a segment is one instance's
// keys in one slot: short, so one thread takes it whole) and owns its output value, so no atomics
// are needed. Neighbouring items read neighbouring floats of a record. With use_cvm, column 0
// sums show and click and writes both cvm features. The items after them copy the dense
// features, one each, behind the pooled columns (the concat, in place).
template <class T>
struct PoolForward {
  PullRecords records;
  const uint32_t* offsets;
  const float* dense;
  T* rows;
  int64_t ld;
  int64_t batch;
  std::size_t pooled_items;
  int columns;  // cvm ? 1 + values : values, values = pull_dim - 2 (embed_w, embedx_w[mf_dim])
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
    const int64_t segment = static_cast<int64_t>(item / static_cast<std::size_t>(columns));
    const int column = static_cast<int>(item % static_cast<std::size_t>(columns));
    const int64_t s = segment / batch;
    const int64_t i = segment % batch;
    // A slot narrower than the records has fewer columns: the item past them has none.
    if (column >= blocks.width_of(s) - (use_cvm ? 1 : 0)) return;
    T* out = rows + i * ld + blocks.begin(s);
    const position_t begin = offsets[segment];
    const position_t end = offsets[segment + 1];
    using heter_comm::sum_segment;
    if (!use_cvm) {
      store_as(out + column, sum_segment(records, begin, end, 2 + column));
      return;
    }
    if (column > 0) {
      store_as(out + 1 + column, sum_segment(records, begin, end, 1 + column));
      return;
    }
    const float log_show = detail::log1p_f(sum_segment(records, begin, end, 0));
    store_as(out, log_show);
    store_as(out + 1, detail::log1p_f(sum_segment(records, begin, end, 1)) - log_show);
  }
};

// One work item per (slot, instance) segment and push field: it writes that field of every
// occurrence of the segment (show = 1, click = label, gradients scaled).
struct PoolBackward {
  const uint32_t* offsets;
  const float* d_pooled;
  const float* labels;
  float* push;
  float scale;
  int64_t batch;
  int push_dim;
  SlotBlocks blocks;
  int out_dim;
  int cvm_columns;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int64_t segment = static_cast<int64_t>(item / static_cast<std::size_t>(push_dim));
    const int field = static_cast<int>(item % static_cast<std::size_t>(push_dim));
    const int64_t s = segment / batch;
    const int64_t i = segment % batch;
    float value = 1.0f;
    if (field == 1) {
      value = labels[i];
    } else if (field >= 2) {
      // Fields past the slot's width (a narrower slot's in wider records) push zero.
      const int column = cvm_columns + (field - 2);
      value = column < blocks.width_of(s) ? scale * d_pooled[i * out_dim + blocks.begin(s) + column]
                                          : 0.0f;
    }
    for (uint32_t j = offsets[segment]; j < offsets[segment + 1]; ++j) {
      push[static_cast<int64_t>(j) * push_dim + field] = value;
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
  const int values = pull_dim() - 2;
  const int columns = use_cvm_ ? 1 + values : values;
  const std::size_t pooled_items = static_cast<std::size_t>(in.batch) * slots_ * columns;
  const std::size_t items = pooled_items + static_cast<std::size_t>(in.batch) * dense_dim;
  auto launch = [&](auto* rows) {
    using T = std::remove_pointer_t<decltype(rows)>;
    device::parallel_for(
        stream, items,
        PoolForward<T>{PullRecords{in.records, pull_dim()}, in.offsets, dense, rows, out.ld,
                       in.batch, pooled_items, columns, blocks(), out_dim(), dense_dim, use_cvm_});
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
  device::parallel_for(stream, static_cast<std::size_t>(in.batch) * slots_ * push_dim(),
                       PoolBackward{in.offsets, d_pooled, labels, push, scale, in.batch, push_dim(),
                                    blocks(), out_dim(), use_cvm_ ? 2 : 0});
}

}  // namespace gpubox::trainer
