// The rows of PULL replies and PUSH requests on the wire (protocol.hpp, "Rows on the wire"): the
// PULL reply's head and views, and packing rows at their own widths.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "table/server/protocol.hpp"

namespace gpubox::table::server {
namespace {

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace

std::size_t pull_reply_bytes(std::size_t n, uint32_t stride) {
  return pull_reply_rows_offset() + n * stride * sizeof(float);
}

void encode_pull_reply_head(std::size_t n, uint32_t stride, uint64_t created, uint8_t* out) {
  store<uint32_t>(out, static_cast<uint32_t>(n));
  store<uint32_t>(out + 4, stride);
  store<uint64_t>(out + 8, created);
}

StatusOr<PullReplyView> decode_pull_reply(const uint8_t* data, std::size_t n, uint32_t expect_n,
                                          uint32_t expect_stride) {
  PayloadReader r(data, n, "PULL reply");
  PullReplyView view;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&view.n));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&view.stride));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&view.created));
  if (view.n != expect_n || view.stride != expect_stride) {
    return Status::Corruption("PULL reply holds " + std::to_string(view.n) + " rows of stride " +
                              std::to_string(view.stride) + ", expected " +
                              std::to_string(expect_n) + " of stride " +
                              std::to_string(expect_stride));
  }
  view.rows_bytes = static_cast<std::size_t>(view.n) * view.stride * sizeof(float);
  GPUBOX_RETURN_IF_ERROR(
      r.skip_array(static_cast<std::size_t>(view.n) * view.stride, sizeof(float), &view.rows));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return view;
}

StatusOr<PullReplyView> decode_pull_reply(const uint8_t* data, std::size_t n, uint32_t expect_n,
                                          const RowLayout& record, const WidthClasses& classes) {
  const auto stride = static_cast<uint32_t>(record.stride());
  if (!record.mixed_widths) return decode_pull_reply(data, n, expect_n, stride);
  PayloadReader r(data, n, "PULL reply");
  PullReplyView view;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&view.n));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&view.stride));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&view.created));
  if (view.n != expect_n || view.stride != stride) {
    return Status::Corruption("PULL reply holds " + std::to_string(view.n) + " rows of stride " +
                              std::to_string(view.stride) + ", expected " +
                              std::to_string(expect_n) + " of stride " + std::to_string(stride));
  }
  view.rows_bytes = r.remaining();
  if (view.rows_bytes > std::size_t{view.n} * stride * sizeof(float) ||
      view.rows_bytes < std::size_t{view.n} * narrowest_row_bytes(record, classes)) {
    return Status::Corruption("PULL reply: " + std::to_string(view.rows_bytes) +
                              " bytes of rows cannot be " + std::to_string(view.n) +
                              " rows of the table's widths");
  }
  GPUBOX_RETURN_IF_ERROR(r.skip_array(view.rows_bytes, 1, &view.rows));
  return view;
}

std::size_t narrowest_row_bytes(const RowLayout& record, const WidthClasses& classes) {
  if (!record.mixed_widths || classes.count == 0) return record.stride() * sizeof(float);
  return static_cast<std::size_t>(
      RowLayout::make(record.kind, classes.dims[0], record.storage).stride() * sizeof(float));
}

std::size_t packed_floats(const float* rows, std::size_t n, const RowLayout& record) {
  const auto stride = static_cast<std::size_t>(record.stride());
  if (!record.mixed_widths) return n * stride;
  std::size_t floats = 0;
  for (std::size_t i = 0; i < n; ++i) floats += record.of_row(rows + i * stride).stride();
  return floats;
}

std::size_t pack_rows(const float* rows, std::size_t n, const RowLayout& record, float* out) {
  const auto stride = static_cast<std::size_t>(record.stride());
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = rows + i * stride;
    const auto own = static_cast<std::size_t>(record.of_row(row).stride());
    if (out + at != row) std::memmove(out + at, row, own * sizeof(float));
    at += own;
  }
  return at;
}

Status unpack_rows(const uint8_t* packed, std::size_t bytes, std::size_t n, const RowLayout& record,
                   const WidthClasses& classes, const uint32_t* positions, float* rows,
                   const char* what) {
  const auto stride = static_cast<std::size_t>(record.stride());
  const std::size_t width_at = sizeof(float) * static_cast<std::size_t>(record.mf_dim_offset());
  std::size_t at = 0;
  for (std::size_t j = 0; j < n; ++j) {
    std::size_t own = stride;
    if (record.mixed_widths) {
      if (bytes - at < width_at + sizeof(float)) {
        return Status::Corruption(std::string(what) + ": row " + std::to_string(j) + " of " +
                                  std::to_string(n) + " is cut short");
      }
      // A width class of the table, not any width up to the widest: another width would size
      // and store a row that no slot makes (the host table's arenas have no pool for it).
      const auto width = load<float>(packed + at + width_at);
      if (!(width >= 0.0f && width <= static_cast<float>(record.mf_dim)) ||
          width != std::floor(width) || classes.class_of(static_cast<int32_t>(width)) < 0) {
        std::ostringstream msg;
        msg << what << ": row " << j << " of " << n << " records embedx width " << width
            << ", which is not one of the table's widths (";
        for (int32_t c = 0; c < classes.count; ++c) msg << (c > 0 ? ", " : "") << classes.dims[c];
        msg << ": hyper_parameters.slot_dims and sparse_feature_dim)";
        return Status::Corruption(msg.str());
      }
      own = static_cast<std::size_t>(
          RowLayout::make(record.kind, static_cast<int32_t>(width), record.storage).stride());
    }
    if (bytes - at < own * sizeof(float)) {
      return Status::Corruption(std::string(what) + ": row " + std::to_string(j) + " of " +
                                std::to_string(n) + " is cut short");
    }
    float* out = rows + (positions != nullptr ? std::size_t{positions[j]} : j) * stride;
    std::memcpy(out, packed + at, own * sizeof(float));
    std::fill(out + own, out + stride, 0.0f);
    at += own * sizeof(float);
  }
  if (at != bytes) {
    return Status::Corruption(std::string(what) + ": " + std::to_string(bytes - at) +
                              " bytes after its " + std::to_string(n) + " rows");
  }
  return Status::OK();
}

}  // namespace gpubox::table::server
