// Rows on the wire (protocol.hpp, "Rows on the wire"): each row at its own width with slot_dims
// (protocol 4), widths that are not the table's classes or bytes that do not hold the rows
// refused, and the finite check that reads 16-bit rows half by half.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "table/server/protocol.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::table::server {
namespace {

// Protocol 4: with slot_dims (widths 4, 8, 16; adagrad) PUSH and PULL carry each row at its own
// width: the bytes are the sum of the rows' own strides, the rows come back exactly (zeros past
// their width), and a forged width, a cut row or bytes left over are errors.
TEST(Protocol, RowsTravelAtTheirOwnWidths) {
  AccessorConfig cfg;
  cfg.mf_dim = 4;
  const AccessorConfig mixed = with_slot_dims(cfg, {{1, 8}, {2, 16}});
  const RowLayout record = record_layout(mixed);
  const WidthClasses classes = width_classes(mixed);
  ASSERT_TRUE(record.mixed_widths);
  const auto stride = static_cast<std::size_t>(record.stride());
  std::mt19937_64 rng(3);
  const std::size_t n = 9;
  std::vector<uint64_t> keys(n);
  std::vector<float> rows(n * stride, 0.0f);
  std::size_t own_floats = 0;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = rng();
    const int32_t width = std::vector<int32_t>{4, 8, 16}[i % 3];
    const RowLayout own = RowLayout::make(record.kind, width);
    for (int32_t f = 0; f < own.stride(); ++f)
      rows[i * stride + f] = static_cast<float>(rng() % 1000);
    rows[i * stride + own.mf_dim_offset()] = static_cast<float>(width);
    own_floats += own.stride();
  }
  EXPECT_EQ(own_floats, 3 * (14 + 18 + 26));  // adagrad strides of widths 4, 8, 16
  EXPECT_EQ(packed_floats(rows.data(), n, record), own_floats);

  std::vector<uint8_t> push;
  encode_push_request(keys.data(), n, rows.data(), record, &push);
  EXPECT_EQ(push.size(), 8 + n * sizeof(uint64_t) + own_floats * sizeof(float));
  auto decoded = decode_push_request(push.data(), push.size(), record, classes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(decoded->keys, keys);
  EXPECT_EQ(decoded->rows, rows);
  // The same rows at one width: every row at the record stride.
  std::vector<uint8_t> padded;
  encode_push_request(keys.data(), n, rows.data(), static_cast<uint32_t>(stride), &padded);
  EXPECT_EQ(padded.size(), 8 + n * sizeof(uint64_t) + n * stride * sizeof(float));
  std::printf("PUSH of %zu rows of widths 4/8/16: %zu bytes at their own widths, %zu padded\n", n,
              push.size(), padded.size());

  // A forged width (past the widest, or not whole), a cut row, a byte too many.
  const std::size_t width_at = 8 + n * sizeof(uint64_t) + record.mf_dim_offset() * sizeof(float);
  for (const float forged : {17.0f, -1.0f, 4.5f}) {
    std::vector<uint8_t> bad = push;
    std::memcpy(bad.data() + width_at, &forged, sizeof forged);
    EXPECT_FALSE(decode_push_request(bad.data(), bad.size(), record, classes).ok()) << forged;
  }
  EXPECT_FALSE(decode_push_request(push.data(), push.size() - 4, record, classes).ok());
  std::vector<uint8_t> longer = push;
  longer.resize(longer.size() + 4);
  EXPECT_FALSE(decode_push_request(longer.data(), longer.size(), record, classes).ok());
  // Another record stride is refused naming both.
  std::vector<uint8_t> other = push;
  const uint32_t wrong = static_cast<uint32_t>(stride) + 1;
  std::memcpy(other.data() + 4, &wrong, 4);
  const auto refused = decode_push_request(other.data(), other.size(), record, classes);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pushed to a table of stride"), std::string::npos);

  // PULL reply: packed in place by the server, unpacked into positions by the client.
  std::vector<uint8_t> reply(pull_reply_bytes(n, static_cast<uint32_t>(stride)));
  std::vector<float> work = rows;
  const std::size_t floats = pack_rows(work.data(), n, record, work.data());
  EXPECT_EQ(floats, own_floats);
  encode_pull_reply_head(n, static_cast<uint32_t>(stride), 2, reply.data());
  std::memcpy(reply.data() + pull_reply_rows_offset(), work.data(), floats * sizeof(float));
  reply.resize(pull_reply_rows_offset() + floats * sizeof(float));
  auto view =
      decode_pull_reply(reply.data(), reply.size(), static_cast<uint32_t>(n), record, classes);
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ(view->created, 2u);
  std::vector<uint32_t> positions(n);
  for (std::size_t j = 0; j < n; ++j) positions[j] = static_cast<uint32_t>(n - 1 - j);
  std::vector<float> out(n * stride, -1.0f);
  ASSERT_TRUE(unpack_rows(view->rows, view->rows_bytes, n, record, classes, positions.data(),
                          out.data(), "PULL reply")
                  .ok());
  for (std::size_t j = 0; j < n; ++j) {
    EXPECT_TRUE(std::equal(rows.begin() + j * stride, rows.begin() + (j + 1) * stride,
                           out.begin() + positions[j] * stride))
        << j;
  }
  EXPECT_FALSE(unpack_rows(view->rows, view->rows_bytes - 4, n, record, classes, nullptr,
                           out.data(), "PULL reply")
                   .ok());
  EXPECT_FALSE(
      decode_pull_reply(reply.data(), reply.size(), static_cast<uint32_t>(n + 1), record, classes)
          .ok());
}

// A width under the widest that is not one of the table's classes (0, 9, 12 of a 4/8/16 table)
// is refused naming the row and the width, in a PUSH request and in a PULL reply: the host
// table has no pool for such a row. And the rows' bytes are bounded by the narrowest class
// (width 4), not width 0: n rows claimed over fewer than n narrowest rows' bytes are refused
// before the rows are sized.
TEST(Protocol, RowWidthsMustBeTheTablesClassesAndBoundTheBytes) {
  for (const int32_t narrowest : {1, 4, 16}) {
    AccessorConfig cfg;
    cfg.mf_dim = narrowest;
    const AccessorConfig mixed = with_slot_dims(cfg, {{1, narrowest * 2}, {2, narrowest * 4}});
    const RowLayout record = record_layout(mixed);
    const WidthClasses classes = width_classes(mixed);
    const auto stride = static_cast<std::size_t>(record.stride());
    const auto own_stride = [&](int32_t w) {
      return static_cast<std::size_t>(RowLayout::make(record.kind, w).stride());
    };
    EXPECT_EQ(narrowest_row_bytes(record, classes), own_stride(narrowest) * sizeof(float));
    for (const int32_t width : {0, narrowest * 2 + 1, narrowest * 3}) {
      // Two rows: a good one of the widest width (so the bytes pass the narrowest bound), then
      // one of `width`.
      std::vector<float> rows(2 * stride, 1.0f);
      rows[record.mf_dim_offset()] = static_cast<float>(narrowest * 4);
      rows[stride + record.mf_dim_offset()] = static_cast<float>(width);
      const uint64_t keys[2] = {7, 8};
      std::vector<uint8_t> push;
      encode_push_request(keys, 2, rows.data(), record, &push);
      const auto refused = decode_push_request(push.data(), push.size(), record, classes);
      ASSERT_FALSE(refused.ok()) << narrowest << " " << width;
      EXPECT_EQ(refused.status().code(), Status::Code::kCorruption);
      EXPECT_NE(refused.status().message().find("row 1 of 2 records embedx width " +
                                                std::to_string(width) + ","),
                std::string::npos)
          << refused.status().to_string();
      EXPECT_NE(refused.status().message().find("not one of the table's widths"),
                std::string::npos);
      // The same rows as a PULL reply: the client refuses them the same way.
      const std::size_t floats = pack_rows(rows.data(), 2, record, rows.data());
      std::vector<float> out(2 * stride);
      const Status st =
          unpack_rows(reinterpret_cast<const uint8_t*>(rows.data()), floats * sizeof(float), 2,
                      record, classes, nullptr, out.data(), "PULL reply");
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
    }
    // Bytes for n rows of width 0 but not of the narrowest class: refused before sizing.
    const uint32_t n = 1000;
    std::vector<uint8_t> forged;
    PayloadWriter w(&forged);
    w.put_u32(n);
    w.put_u32(static_cast<uint32_t>(stride));
    std::vector<uint64_t> keys(n, 1);
    w.put_array(keys.data(), n);
    std::vector<float> zeros(n * own_stride(0), 0.0f);  // every row says width 0
    w.put_array(zeros.data(), zeros.size());
    const auto push = decode_push_request(forged.data(), forged.size(), record, classes);
    ASSERT_FALSE(push.ok());
    EXPECT_NE(push.status().message().find("cannot hold 1000 rows"), std::string::npos)
        << push.status().to_string();
    std::vector<uint8_t> reply(pull_reply_rows_offset());
    encode_pull_reply_head(n, static_cast<uint32_t>(stride), 0, reply.data());
    reply.resize(pull_reply_rows_offset() + zeros.size() * sizeof(float));
    EXPECT_FALSE(decode_pull_reply(reply.data(), reply.size(), n, record, classes).ok());
  }
}

// With fp16/bf16 sparse_storage an embedding slot holds two 16-bit halves: a NaN or infinity in
// either half (which a float's exponent test misses in the low half, and for fp16 in the high
// half too) is found, at the slot that holds it, in every position of a few rows.
TEST(Protocol, FirstNonFiniteRowReadsSixteenBitHalves) {
  for (const auto storage : {config::SparseStorage::kFp16, config::SparseStorage::kBf16}) {
    const RowLayout layout = RowLayout::make(SparseOptimizerKind::kAdagrad, 8, storage);
    const auto stride = static_cast<std::size_t>(layout.stride());
    constexpr std::size_t kRows = 3;
    std::vector<float> rows(kRows * stride, 0.0f);
    for (std::size_t r = 0; r < kRows; ++r) {
      float* row = rows.data() + r * stride;
      row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
      write_embed_w(row, layout, 0.5f);
      for (int32_t i = 0; i < layout.mf_dim; ++i) write_embedx_w(row, layout, i, -0.25f * i);
    }
    ASSERT_EQ(first_non_finite_row(rows.data(), kRows, layout), kRows * stride);
    EXPECT_EQ(first_non_finite_row(rows.data(), 0, layout), 0u);
    for (const float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      for (int32_t i = -1; i < layout.mf_dim; ++i) {  // -1: embed_w
        std::vector<float> copy = rows;
        float* row = copy.data() + stride;  // the second row
        i < 0 ? write_embed_w(row, layout, bad) : write_embedx_w(row, layout, i, bad);
        const std::size_t slot =
            i < 0 ? RowLayout::kEmbedW
                  : static_cast<std::size_t>(table::detail::packed_embedx_slot(layout, i));
        EXPECT_EQ(first_non_finite_row(copy.data(), kRows, layout), stride + slot)
            << "storage " << static_cast<int>(storage) << ", value " << bad << ", position " << i;
      }
    }
  }
}

}  // namespace
}  // namespace gpubox::table::server
