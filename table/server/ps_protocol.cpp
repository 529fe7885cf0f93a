#include "table/server/ps_protocol.hpp"

#include "table/server/protocol.hpp"

namespace gpubox::table::server {

void encode_ps_push_request(PsUpdateKind kind, const uint64_t* keys, const int32_t* slots,
                            std::size_t n, const float* values, uint32_t dim,
                            std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u8(static_cast<uint8_t>(kind));
  w.put_u32(static_cast<uint32_t>(n));
  w.put_u32(dim);
  w.put_array(keys, n);
  w.put_array(slots, n);
  w.put_array(values, n * dim);
}

StatusOr<PsPushRequest> decode_ps_push_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "PS_PUSH request");
  PsPushRequest req;
  uint8_t kind = 0;
  uint32_t count = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u8(&kind));
  if (kind > static_cast<uint8_t>(PsUpdateKind::kDelta)) {
    return Status::InvalidArgument("PS_PUSH request: unknown update kind " + std::to_string(kind));
  }
  req.kind = static_cast<PsUpdateKind>(kind);
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
  PayloadWriter w(out);
  w.put_u8(static_cast<uint8_t>(action));
  w.put_string(name);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_array(values, n);
}

StatusOr<DenseRequest> decode_dense_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "DENSE request");
  DenseRequest req;
  uint8_t action = 0;
  uint32_t count = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u8(&action));
  if (action > static_cast<uint8_t>(DenseAction::kWrite)) {
    return Status::InvalidArgument("DENSE request: unknown action " + std::to_string(action));
  }
  req.action = static_cast<DenseAction>(action);
  GPUBOX_RETURN_IF_ERROR(r.get_string(&req.name, kMaxDenseNameBytes));
  if (req.name.empty()) return Status::InvalidArgument("DENSE request: empty table name");
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.values, count));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return req;
}

void encode_dense_reply(const float* values, std::size_t n, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_array(values, n);
}

StatusOr<std::vector<float>> decode_dense_reply(const uint8_t* data, std::size_t n,
                                                std::size_t expect_n) {
  PayloadReader r(data, n, "DENSE reply");
  uint32_t count = 0;
  std::vector<float> values;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  if (count != expect_n) {
    return Status::InvalidArgument("DENSE reply holds " + std::to_string(count) +
                                   " values, expected " + std::to_string(expect_n));
  }
  GPUBOX_RETURN_IF_ERROR(r.get_array(&values, count));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return values;
}

}  // namespace gpubox::table::server
