#include "table/server/ps_protocol.hpp"

#include "table/server/protocol.hpp"

namespace gpubox::table::server {

namespace {

void put_ps_push_rows(PayloadWriter& w, const uint64_t* keys, const int32_t* slots, std::size_t n,
                      const float* values, uint32_t dim) {
  w.put_u32(static_cast<uint32_t>(n));
  w.put_u32(dim);
  w.put_array(keys, n);
  w.put_array(slots, n);
  w.put_array(values, n * dim);
}

Status get_step_part(PayloadReader& r, PsStepPart* part) {
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&part->job));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&part->step));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&part->parts));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&part->part));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&part->chunks));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&part->chunk));
  if (part->parts == 0 || part->parts > kMaxStepParts || part->part >= part->parts ||
      part->chunks == 0 || part->chunks > kMaxStepChunks || part->chunk >= part->chunks) {
    return Status::InvalidArgument(
        "PS_PUSH request: step part " + std::to_string(part->part) + " of " +
        std::to_string(part->parts) + ", chunk " + std::to_string(part->chunk) + " of " +
        std::to_string(part->chunks) + " (parts in [1, " + std::to_string(kMaxStepParts) +
        "], chunks in [1, " + std::to_string(kMaxStepChunks) + "])");
  }
  return Status::OK();
}

}  // namespace

void encode_ps_push_request(PsUpdateKind kind, const uint64_t* keys, const int32_t* slots,
                            std::size_t n, const float* values, uint32_t dim,
                            std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u8(static_cast<uint8_t>(kind));
  put_ps_push_rows(w, keys, slots, n, values, dim);
}

void encode_ps_step_push_request(const PsStepPart& part, const uint64_t* keys, const int32_t* slots,
                                 std::size_t n, const float* values, uint32_t dim,
                                 std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u8(static_cast<uint8_t>(PsUpdateKind::kStepGradient));
  w.put_u64(part.job);
  w.put_u64(part.step);
  w.put_u32(part.parts);
  w.put_u32(part.part);
  w.put_u32(part.chunks);
  w.put_u32(part.chunk);
  put_ps_push_rows(w, keys, slots, n, values, dim);
}

StatusOr<PsPushRequest> decode_ps_push_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "PS_PUSH request");
  PsPushRequest req;
  uint8_t kind = 0;
  uint32_t count = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u8(&kind));
  if (kind > static_cast<uint8_t>(PsUpdateKind::kStepGradient)) {
    return Status::InvalidArgument("PS_PUSH request: unknown update kind " + std::to_string(kind));
  }
  req.kind = static_cast<PsUpdateKind>(kind);
  if (req.kind == PsUpdateKind::kStepGradient) GPUBOX_RETURN_IF_ERROR(get_step_part(r, &req.step));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.dim));
  if (req.dim == 0 || req.dim > 4096) {
    return Status::InvalidArgument("PS_PUSH request: record width " + std::to_string(req.dim) +
                                   " is not in [1, 4096]");
  }
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.keys, count));
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.slots, count));
  // count * dim cannot overflow: count is bounded by the bytes present (checked above).
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.values, std::size_t{count} * req.dim));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return req;
}

void encode_dense_request(DenseAction action, const std::string& name, const float* values,
                          std::size_t n, std::vector<uint8_t>* out) {
  DenseRequest head;
  head.action = action;
  head.name = name;
  head.total = static_cast<uint32_t>(n);
  head.count = static_cast<uint32_t>(n);
  head.has_values = true;
  encode_dense_range(head, values, out);
}

void encode_dense_range(const DenseRequest& head, const float* values, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u8(static_cast<uint8_t>(head.action));
  w.put_string(head.name);
  w.put_u32(head.total);
  w.put_u32(head.offset);
  w.put_u32(head.count);
  w.put_u64(head.write_id);
  w.put_u8(head.has_values ? 1 : 0);
  if (head.has_values) w.put_array(values, head.count);
}

StatusOr<DenseRequest> decode_dense_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "DENSE request");
  DenseRequest req;
  uint8_t action = 0;
  uint8_t has_values = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u8(&action));
  if (action > static_cast<uint8_t>(DenseAction::kWrite)) {
    return Status::InvalidArgument("DENSE request: unknown action " + std::to_string(action));
  }
  req.action = static_cast<DenseAction>(action);
  GPUBOX_RETURN_IF_ERROR(r.get_string(&req.name, kMaxDenseNameBytes));
  if (req.name.empty()) return Status::InvalidArgument("DENSE request: empty table name");
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.total));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.offset));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.count));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&req.write_id));
  GPUBOX_RETURN_IF_ERROR(r.get_u8(&has_values));
  if (uint64_t{req.offset} + req.count > req.total) {
    return Status::InvalidArgument(
        "DENSE request '" + req.name + "': range [" + std::to_string(req.offset) + ", " +
        std::to_string(uint64_t{req.offset} + req.count) + ") is outside a table of " +
        std::to_string(req.total) + " values");
  }
  if (has_values > 1 || (has_values == 0 && req.action != DenseAction::kRead)) {
    return Status::InvalidArgument("DENSE request '" + req.name + "': has_values " +
                                   std::to_string(has_values) +
                                   " (an add or a write carries its values)");
  }
  req.has_values = has_values == 1;
  // get_array checks that the count fits in the bytes present before anything is allocated.
  if (req.has_values) GPUBOX_RETURN_IF_ERROR(r.get_array(&req.values, req.count));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return req;
}

void encode_dense_reply(uint32_t offset, const float* values, std::size_t n, bool committed,
                        std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(offset);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_u8(committed ? 1 : 0);
  w.put_array(values, n);
}

StatusOr<DenseReply> decode_dense_reply(const uint8_t* data, std::size_t n, uint32_t offset,
                                        uint32_t expect_count) {
  PayloadReader r(data, n, "DENSE reply");
  DenseReply reply;
  uint8_t committed = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&reply.offset));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&reply.count));
  GPUBOX_RETURN_IF_ERROR(r.get_u8(&committed));
  if (reply.offset != offset || reply.count != expect_count || committed > 1) {
    return Status::InvalidArgument("DENSE reply holds values [" + std::to_string(reply.offset) +
                                   ", " + std::to_string(uint64_t{reply.offset} + reply.count) +
                                   "), expected [" + std::to_string(offset) + ", " +
                                   std::to_string(uint64_t{offset} + expect_count) + ")");
  }
  reply.committed = committed == 1;
  GPUBOX_RETURN_IF_ERROR(r.skip_array(reply.count, sizeof(float), &reply.values));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return reply;
}

}  // namespace gpubox::table::server
