// The gpubox_server wire protocol's decoders on any bytes (table/server/protocol.hpp). Beyond not
// crashing: a decoded frame is exactly the bytes given and within the limit, and every message
// that decodes encodes back to the bytes it came from (or, where the encoding is not unique, to
// bytes that decode to the same message).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "table/server/protocol.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::table::server {
namespace {

constexpr uint32_t kLimit = 1 << 20;

using Bytes = std::vector<uint8_t>;

bool same(const Bytes& encoded, const uint8_t* data, std::size_t n) {
  return encoded.size() == n && (n == 0 || std::memcmp(encoded.data(), data, n) == 0);
}

void check_header(const uint8_t* data, std::size_t n) {
  auto header = decode_header(data, n, kLimit);
  if (!header.ok()) return;
  FUZZ_CHECK(n >= kHeaderBytes, "a header decoded from fewer than 32 bytes");
  FUZZ_CHECK(header->payload_bytes <= kLimit, "header over the limit");
  uint8_t again[kHeaderBytes];
  encode_header(*header, again);
  FUZZ_CHECK(std::memcmp(again, data, kHeaderBytes) == 0, "header does not round-trip");
}

void check_frame(const uint8_t* data, std::size_t n) {
  auto frame = decode_frame(data, n, kLimit);
  if (!frame.ok()) return;
  FUZZ_CHECK(frame->payload.size() == frame->header.payload_bytes, "payload size");
  FUZZ_CHECK(same(encode_frame(frame->header, frame->payload), data, n),
             "frame does not round-trip");
}

// A table with widths 4, 8 and 16 (adagrad): rows travel at their own widths.
AccessorConfig mixed_config() {
  AccessorConfig cfg;
  cfg.mf_dim = 4;
  return with_slot_dims(cfg, {{1, 8}, {2, 16}});
}
RowLayout mixed_record() { return record_layout(mixed_config()); }

void check_requests(const uint8_t* data, std::size_t n) {
  Bytes out;
  static const RowLayout mixed = mixed_record();
  static const WidthClasses classes = width_classes(mixed_config());
  if (auto push = decode_push_request(data, n, mixed, classes); push.ok()) {
    FUZZ_CHECK(push->rows.size() == push->keys.size() * push->stride, "mixed PUSH rows count");
    out.clear();
    encode_push_request(push->keys.data(), push->keys.size(), push->rows.data(), mixed, &out);
    FUZZ_CHECK(same(out, data, n), "PUSH request of mixed widths does not round-trip");
    out.clear();
  }
  if (auto pull = decode_pull_request(data, n); pull.ok()) {
    FUZZ_CHECK(pull->slots.empty() || pull->slots.size() == pull->keys.size(), "slots count");
    encode_pull_request(pull->keys.data(), pull->slots.empty() ? nullptr : pull->slots.data(),
                        pull->keys.size(), &out);
    auto again = decode_pull_request(out.data(), out.size());
    FUZZ_CHECK(again.ok() && again->keys == pull->keys && again->slots == pull->slots,
               "PULL request does not round-trip");
  }
  if (auto push = decode_push_request(data, n); push.ok()) {
    FUZZ_CHECK(push->rows.size() == push->keys.size() * push->stride, "PUSH rows count");
    out.clear();
    encode_push_request(push->keys.data(), push->keys.size(), push->rows.data(), push->stride,
                        &out);
    FUZZ_CHECK(same(out, data, n), "PUSH request does not round-trip");
    const std::size_t bad = first_non_finite(push->rows.data(), push->rows.size());
    FUZZ_CHECK(bad <= push->rows.size(), "first_non_finite out of range");
    if (bad < push->rows.size()) {
      (void)non_finite_row_error(push->keys.data(), push->keys.size(), push->rows.data(),
                                 push->stride, bad);
    }
  }
  if (auto keys = decode_erase_request(data, n); keys.ok()) {
    out.clear();
    encode_erase_request(keys->data(), keys->size(), &out);
    FUZZ_CHECK(same(out, data, n), "ERASE request does not round-trip");
  }
  if (auto save = decode_save_request(data, n); save.ok()) {
    out.clear();
    encode_save_request(save->mode, save->path, &out);
    FUZZ_CHECK(same(out, data, n), "SAVE request does not round-trip");
  }
  if (auto path = decode_path_request(data, n); path.ok()) {
    out.clear();
    encode_path_request(*path, &out);
    FUZZ_CHECK(same(out, data, n), "path request does not round-trip");
  }
  if (auto barrier = decode_barrier_request(data, n); barrier.ok()) {
    FUZZ_CHECK(barrier->parties > 0, "BARRIER of 0 parties");
    out.clear();
    encode_barrier_request(barrier->name, barrier->parties, &out);
    FUZZ_CHECK(same(out, data, n), "BARRIER request does not round-trip");
  }
  if (auto ps = decode_ps_push_request(data, n); ps.ok()) {
    FUZZ_CHECK(ps->slots.size() == ps->keys.size() &&
                   ps->values.size() == ps->keys.size() * std::size_t{ps->dim},
               "PS_PUSH counts");
    out.clear();
    if (ps->kind == PsUpdateKind::kStepGradient) {
      FUZZ_CHECK(ps->step.parts > 0 && ps->step.part < ps->step.parts &&
                     ps->step.parts <= kMaxStepParts && ps->step.chunk < ps->step.chunks &&
                     ps->step.chunks <= kMaxStepChunks,
                 "PS_PUSH step part");
      encode_ps_step_push_request(ps->step, ps->keys.data(), ps->slots.data(), ps->keys.size(),
                                  ps->values.data(), ps->dim, &out);
    } else {
      encode_ps_push_request(ps->kind, ps->keys.data(), ps->slots.data(), ps->keys.size(),
                             ps->values.data(), ps->dim, &out);
    }
    FUZZ_CHECK(same(out, data, n), "PS_PUSH request does not round-trip");
  }
  if (auto dense = decode_dense_request(data, n); dense.ok()) {
    FUZZ_CHECK(!dense->name.empty() && dense->name.size() <= kMaxDenseNameBytes, "DENSE name");
    FUZZ_CHECK(std::size_t{dense->offset} + dense->count <= dense->total, "DENSE range");
    FUZZ_CHECK(dense->values.size() == (dense->has_values ? dense->count : 0u), "DENSE values");
    out.clear();
    encode_dense_range(*dense, dense->values.data(), &out);
    FUZZ_CHECK(same(out, data, n), "DENSE request does not round-trip");
  }
}

void check_replies(const uint8_t* data, std::size_t n) {
  Bytes out;
  if (auto info = decode_info_reply(data, n); info.ok()) {
    FUZZ_CHECK(info->shard_id < info->shard_num, "INFO shard");
    encode_info_reply(*info, &out);
    FUZZ_CHECK(same(out, data, n), "INFO reply does not round-trip");
  }
  if (auto stats = decode_stats_reply(data, n); stats.ok()) {
    out.clear();
    encode_stats_reply(*stats, &out);
    FUZZ_CHECK(same(out, data, n), "STATS reply does not round-trip");
  }
  if (auto value = decode_u64_reply(data, n); value.ok()) {
    out.clear();
    encode_u64_reply(*value, &out);
    FUZZ_CHECK(same(out, data, n), "u64 reply does not round-trip");
  }
  if (auto note = decode_progress(data, n); note.ok()) {
    FUZZ_CHECK(n == kProgressPayloadBytes, "PROGRESS of another size decoded");
    out.clear();
    encode_progress(*note, &out);
    FUZZ_CHECK(same(out, data, n), "PROGRESS does not round-trip");
  }
  if (n >= 8) {
    uint32_t rows = 0, stride = 0;
    std::memcpy(&rows, data, 4);
    std::memcpy(&stride, data + 4, 4);
    if (auto view = decode_pull_reply(data, n, rows, stride); view.ok()) {
      FUZZ_CHECK(view->rows >= data && view->rows + std::size_t{rows} * stride * 4 <= data + n,
                 "PULL reply rows outside the payload");
    }
    static const RowLayout mixed = mixed_record();
    static const WidthClasses classes = width_classes(mixed_config());
    if (auto view = decode_pull_reply(data, n, rows, mixed, classes); view.ok()) {
      FUZZ_CHECK(view->rows >= data && view->rows + view->rows_bytes == data + n,
                 "PULL reply of mixed widths: rows outside the payload");
      // Bounded: the view holds at least the narrowest class's stride per row.
      FUZZ_CHECK(view->rows_bytes >= std::size_t{rows} * narrowest_row_bytes(mixed, classes),
                 "PULL reply of mixed widths: rows narrower than the narrowest class");
      std::vector<float> unpacked(std::size_t{rows} * static_cast<std::size_t>(mixed.stride()));
      (void)unpack_rows(view->rows, view->rows_bytes, rows, mixed, classes, nullptr,
                        unpacked.data(), "PULL reply");
    }
  }
  if (n >= 8) {
    uint32_t offset = 0, count = 0;
    std::memcpy(&offset, data, 4);
    std::memcpy(&count, data + 4, 4);
    if (auto reply = decode_dense_reply(data, n, offset, count); reply.ok()) {
      std::vector<float> values(reply->count);
      // An empty reply's values may be null, and memcpy from null is undefined even for 0 bytes.
      if (!values.empty()) std::memcpy(values.data(), reply->values, sizeof(float) * values.size());
      out.clear();
      encode_dense_reply(offset, values.data(), values.size(), reply->committed, &out);
      FUZZ_CHECK(same(out, data, n), "DENSE reply does not round-trip");
    }
  }
  FrameHeader error;
  error.op = Op::kPull;
  error.response = true;
  error.status = Status::Code::kInternal;
  FUZZ_CHECK(!decode_error_reply(error, data, n).ok(), "an error reply decoded as OK");
}

}  // namespace
}  // namespace gpubox::table::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace gpubox::table::server;  // NOLINT: the entry point is outside the namespace
  check_header(data, size);
  check_frame(data, size);
  // The payload decoders see the frame's payload when the input is a frame, else the raw bytes.
  const bool framed = size >= kHeaderBytes;
  const uint8_t* payload = framed ? data + kHeaderBytes : data;
  const std::size_t payload_size = framed ? size - kHeaderBytes : size;
  check_requests(payload, payload_size);
  check_replies(payload, payload_size);
  if (framed) {
    check_requests(data, size);
    check_replies(data, size);
  }
  return 0;
}
