#include "table/server/protocol.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/config/config_enums.hpp"

namespace gpubox::table::server {
namespace {

constexpr uint32_t kMaxStatusCode = static_cast<uint32_t>(Status::Code::kInternal);
constexpr std::size_t kMaxPathBytes = 4096;
constexpr std::size_t kMaxErrorBytes = 64 * 1024;

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

std::string hex_prefix(const uint8_t* bytes, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n && i < 8; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kAuth:
      return "AUTH";
    case Op::kInfo:
      return "INFO";
    case Op::kPull:
      return "PULL";
    case Op::kPush:
      return "PUSH";
    case Op::kErase:
      return "ERASE";
    case Op::kSave:
      return "SAVE";
    case Op::kLoad:
      return "LOAD";
    case Op::kShrink:
      return "SHRINK";
    case Op::kStats:
      return "STATS";
    case Op::kBarrier:
      return "BARRIER";
    case Op::kShutdown:
      return "SHUTDOWN";
    case Op::kPsPush:
      return "PS_PUSH";
    case Op::kDense:
      return "DENSE";
    case Op::kPeek:
      return "PEEK";
    case Op::kAuthProof:
      return "AUTH_PROOF";
    case Op::kProgress:
      return "PROGRESS";
  }
  return "OP#?";
}

bool is_known_op(uint16_t value) {
  return value >= static_cast<uint16_t>(Op::kAuth) && value <= static_cast<uint16_t>(Op::kProgress);
}

Status make_status(Status::Code code, std::string message) {
  switch (code) {
    case Status::Code::kOk:
      return Status::OK();
    case Status::Code::kInvalidArgument:
      return Status::InvalidArgument(std::move(message));
    case Status::Code::kNotFound:
      return Status::NotFound(std::move(message));
    case Status::Code::kIOError:
      return Status::IOError(std::move(message));
    case Status::Code::kCorruption:
      return Status::Corruption(std::move(message));
    case Status::Code::kUnavailable:
      return Status::Unavailable(std::move(message));
    case Status::Code::kDeadlineExceeded:
      return Status::DeadlineExceeded(std::move(message));
    case Status::Code::kPermissionDenied:
      return Status::PermissionDenied(std::move(message));
    case Status::Code::kResourceExhausted:
      return Status::ResourceExhausted(std::move(message));
    case Status::Code::kAborted:
      return Status::Aborted(std::move(message));
    case Status::Code::kInternal:
      return Status::Internal(std::move(message));
  }
  return Status::Internal(std::move(message));
}

// ---- header ----------------------------------------------------------------------------------

void encode_header(const FrameHeader& header, uint8_t* out, uint16_t version) {
  const uint16_t op = static_cast<uint16_t>(header.op) | (header.response ? kResponseBit : 0);
  store<uint32_t>(out + 0, kFrameMagic);
  store<uint16_t>(out + 4, version);
  store<uint16_t>(out + 6, op);
  store<uint32_t>(out + 8, static_cast<uint32_t>(header.status));
  store<uint32_t>(out + 12, header.payload_bytes);
  store<uint64_t>(out + 16, header.request_id);
  store<uint64_t>(out + 24, header.client_id);
}

uint16_t header_version(const uint8_t* bytes, std::size_t n) {
  if (n < 6 || load<uint32_t>(bytes) != kFrameMagic) return 0;
  return load<uint16_t>(bytes + 4);
}

StatusOr<FrameHeader> decode_header(const uint8_t* bytes, std::size_t n,
                                    uint32_t max_payload_bytes) {
  if (n < kHeaderBytes) {
    return Status::Corruption("truncated frame header: " + std::to_string(n) + " of " +
                              std::to_string(kHeaderBytes) + " bytes");
  }
  const uint32_t magic = load<uint32_t>(bytes);
  if (magic != kFrameMagic) {
    return Status::Corruption("bad frame magic (first bytes " + hex_prefix(bytes, n) +
                              "): not a gpubox_server client or garbage on the connection");
  }
  const uint16_t version = load<uint16_t>(bytes + 4);
  if (version != kProtocolVersion) {
    return Status::InvalidArgument("unsupported protocol version " + std::to_string(version) +
                                   " (this build speaks " + std::to_string(kProtocolVersion) +
                                   "): client and server must be of the same GPUBox release");
  }
  const uint16_t raw_op = load<uint16_t>(bytes + 6);
  const uint16_t op = raw_op & static_cast<uint16_t>(~kResponseBit);
  if (!is_known_op(op)) {
    return Status::InvalidArgument("unknown op " + std::to_string(op));
  }
  const uint32_t status = load<uint32_t>(bytes + 8);
  if (status > kMaxStatusCode) {
    return Status::Corruption("bad status code " + std::to_string(status) + " in frame header");
  }
  FrameHeader h;
  h.op = static_cast<Op>(op);
  h.response = (raw_op & kResponseBit) != 0;
  h.status = static_cast<Status::Code>(status);
  h.payload_bytes = load<uint32_t>(bytes + 12);
  h.request_id = load<uint64_t>(bytes + 16);
  h.client_id = load<uint64_t>(bytes + 24);
  if (h.payload_bytes > max_payload_bytes) {
    return Status::ResourceExhausted(
        std::string(op_name(h.op)) + " frame of " + std::to_string(h.payload_bytes) +
        " payload bytes is over the limit of " + std::to_string(max_payload_bytes));
  }
  if (!h.response && h.status != Status::Code::kOk) {
    return Status::Corruption("request frame carries a status");
  }
  return h;
}

std::vector<uint8_t> encode_frame(FrameHeader header, const std::vector<uint8_t>& payload) {
  GPUBOX_EXPECTS(payload.size() <= std::numeric_limits<uint32_t>::max(), "payload too large");
  header.payload_bytes = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> frame(kHeaderBytes + payload.size());
  encode_header(header, frame.data());
  if (!payload.empty()) std::memcpy(frame.data() + kHeaderBytes, payload.data(), payload.size());
  return frame;
}

StatusOr<Frame> decode_frame(const uint8_t* bytes, std::size_t n, uint32_t max_payload_bytes) {
  auto header = decode_header(bytes, n, max_payload_bytes);
  if (!header.ok()) return header.status();
  const std::size_t want = kHeaderBytes + header->payload_bytes;
  if (n < want) {
    return Status::Corruption("truncated " + std::string(op_name(header->op)) + " frame: " +
                              std::to_string(n) + " of " + std::to_string(want) + " bytes");
  }
  if (n > want) {
    return Status::Corruption(std::to_string(n - want) + " trailing bytes after a " +
                              op_name(header->op) + " frame");
  }
  Frame frame;
  frame.header = *header;
  frame.payload.assign(bytes + kHeaderBytes, bytes + n);
  return frame;
}

// ---- payload building blocks ------------------------------------------------------------------

void PayloadWriter::put_raw(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  out_->insert(out_->end(), p, p + bytes);
}

void PayloadWriter::put_string(const std::string& s) {
  put_u32(static_cast<uint32_t>(s.size()));
  put_raw(s.data(), s.size());
}

Status PayloadReader::check_fits(std::size_t count, std::size_t elem_bytes) const {
  // count * elem_bytes could overflow for a forged count: compare by division.
  if (elem_bytes != 0 && count > remaining() / elem_bytes) {
    std::ostringstream msg;
    msg << what_ << ": " << count << " elements of " << elem_bytes << " bytes do not fit in the "
        << remaining() << " bytes left of the payload";
    return Status::Corruption(msg.str());
  }
  return Status::OK();
}

Status PayloadReader::get_raw(void* out, std::size_t bytes, const char* field) {
  if (bytes > remaining()) {
    std::ostringstream msg;
    msg << what_ << ": truncated payload reading " << field << " (" << bytes << " bytes wanted, "
        << remaining() << " left)";
    return Status::Corruption(msg.str());
  }
  if (bytes) std::memcpy(out, data_ + pos_, bytes);
  pos_ += bytes;
  return Status::OK();
}

Status PayloadReader::skip_array(std::size_t count, std::size_t elem_bytes, const uint8_t** at) {
  GPUBOX_RETURN_IF_ERROR(check_fits(count, elem_bytes));
  *at = data_ + pos_;
  pos_ += count * elem_bytes;
  return Status::OK();
}

Status PayloadReader::get_string(std::string* s, std::size_t max_bytes) {
  uint32_t len = 0;
  GPUBOX_RETURN_IF_ERROR(get_u32(&len));
  if (len > max_bytes) {
    return Status::Corruption(std::string(what_) + ": string of " + std::to_string(len) +
                              " bytes is over the limit of " + std::to_string(max_bytes));
  }
  GPUBOX_RETURN_IF_ERROR(check_fits(len, 1));
  s->assign(reinterpret_cast<const char*>(data_ + pos_), len);
  pos_ += len;
  return Status::OK();
}

Status PayloadReader::finish() const {
  if (remaining() != 0) {
    return Status::Corruption(std::string(what_) + ": " + std::to_string(remaining()) +
                              " unexpected trailing bytes");
  }
  return Status::OK();
}

// ---- messages --------------------------------------------------------------------------------

void encode_info_reply(const InfoReply& info, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(info.shard_id);
  w.put_u32(info.shard_num);
  w.put_i32(info.optimizer_kind);
  w.put_i32(info.mf_dim);
  w.put_u32(info.stride);
  w.put_u32(info.max_payload_bytes);
  w.put_u64(info.instance_id);
  w.put_u64(info.generation);
  w.put_i32(info.storage);
  w.put_u64(info.slot_dims_digest);
  w.put_u64(info.seed);
  w.put_u32(static_cast<uint32_t>(info.rule.size()));
  for (const SparseRuleField& field : info.rule) {
    w.put_string(field.key);
    w.put_raw(&field.value, sizeof(field.value));
  }
}

StatusOr<InfoReply> decode_info_reply(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "INFO reply");
  InfoReply info;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&info.shard_id));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&info.shard_num));
  GPUBOX_RETURN_IF_ERROR(r.get_i32(&info.optimizer_kind));
  GPUBOX_RETURN_IF_ERROR(r.get_i32(&info.mf_dim));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&info.stride));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&info.max_payload_bytes));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&info.instance_id));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&info.generation));
  GPUBOX_RETURN_IF_ERROR(r.get_i32(&info.storage));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&info.slot_dims_digest));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&info.seed));
  uint32_t fields = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&fields));
  if (fields > kMaxInfoRuleFields) {
    return Status::Corruption("INFO reply: " + std::to_string(fields) +
                              " sparse rule fields (at most " + std::to_string(kMaxInfoRuleFields) +
                              ")");
  }
  info.rule.resize(fields);
  for (SparseRuleField& field : info.rule) {
    GPUBOX_RETURN_IF_ERROR(r.get_string(&field.key, 256));
    GPUBOX_RETURN_IF_ERROR(r.get_raw(&field.value, sizeof(field.value), "f64"));
  }
  GPUBOX_RETURN_IF_ERROR(r.finish());
  if (info.shard_num == 0 || info.shard_id >= info.shard_num) {
    return Status::Corruption("INFO reply: shard " + std::to_string(info.shard_id) + " of " +
                              std::to_string(info.shard_num));
  }
  bool known_storage = false;
  for (const auto& name : config::kSparseStorageNames) {
    known_storage = known_storage || static_cast<int32_t>(name.value) == info.storage;
  }
  if (!known_storage) {
    return Status::Corruption("INFO reply: sparse storage " + std::to_string(info.storage));
  }
  return info;
}

void encode_pull_request(const uint64_t* keys, const int32_t* slots, std::size_t n,
                         std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_u32(slots != nullptr ? 1 : 0);
  w.put_array(keys, n);
  if (slots != nullptr) w.put_array(slots, n);
}

StatusOr<PullRequest> decode_pull_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "PULL request");
  uint32_t count = 0, has_slots = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&has_slots));
  if (has_slots > 1)
    return Status::Corruption("PULL request: has_slots is " + std::to_string(has_slots));
  PullRequest req;
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.keys, count));
  if (has_slots) GPUBOX_RETURN_IF_ERROR(r.get_array(&req.slots, count));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return req;
}

void encode_push_request(const uint64_t* keys, std::size_t n, const float* rows, uint32_t stride,
                         std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_u32(stride);
  w.put_array(keys, n);
  w.put_array(rows, n * stride);
}

void encode_push_request(const uint64_t* keys, std::size_t n, const float* rows,
                         const RowLayout& record, std::vector<uint8_t>* out) {
  if (!record.mixed_widths) {
    encode_push_request(keys, n, rows, static_cast<uint32_t>(record.stride()), out);
    return;
  }
  PayloadWriter w(out);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_u32(static_cast<uint32_t>(record.stride()));
  w.put_array(keys, n);
  const auto stride = static_cast<std::size_t>(record.stride());
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = rows + i * stride;
    w.put_array(row, static_cast<std::size_t>(record.of_row(row).stride()));
  }
}

StatusOr<PushRequest> decode_push_request(const uint8_t* data, std::size_t n,
                                          const RowLayout& record, const WidthClasses& classes) {
  if (!record.mixed_widths) return decode_push_request(data, n);
  PayloadReader r(data, n, "PUSH request");
  uint32_t count = 0;
  PushRequest req;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.stride));
  if (req.stride != static_cast<uint32_t>(record.stride())) {
    return Status::InvalidArgument("rows of stride " + std::to_string(req.stride) +
                                   " pushed to a table of stride " +
                                   std::to_string(record.stride()));
  }
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.keys, count));
  // Every row takes at least the narrowest class's stride: check the bytes before sizing the
  // rows, so a frame cannot make the server size more than stride / narrowest stride times it.
  if (r.remaining() / narrowest_row_bytes(record, classes) < count) {
    return Status::Corruption("PUSH request: " + std::to_string(r.remaining()) +
                              " bytes cannot hold " + std::to_string(count) + " rows");
  }
  req.rows.resize(static_cast<std::size_t>(count) * req.stride);
  const uint8_t* packed = nullptr;
  const std::size_t bytes = r.remaining();
  GPUBOX_RETURN_IF_ERROR(r.skip_array(bytes, 1, &packed));
  GPUBOX_RETURN_IF_ERROR(
      unpack_rows(packed, bytes, count, record, classes, nullptr, req.rows.data(), "PUSH request"));
  return req;
}

StatusOr<PushRequest> decode_push_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "PUSH request");
  uint32_t count = 0;
  PushRequest req;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.stride));
  if (req.stride == 0 && count > 0) return Status::Corruption("PUSH request: row stride 0");
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.keys, count));
  // count * stride fits in 64 bits (both are 32-bit); get_array checks it against the payload.
  GPUBOX_RETURN_IF_ERROR(r.get_array(&req.rows, static_cast<std::size_t>(count) * req.stride));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return req;
}

std::size_t first_non_finite(const float* v, std::size_t n) {
  // The exponent test is integer arithmetic that the compiler vectorizes: the common all-finite
  // case is one pass at memory speed; only a block that has a bad value is looked at again.
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr std::size_t kBlock = 1024;
  for (std::size_t begin = 0; begin < n; begin += kBlock) {
    const std::size_t end = std::min(n, begin + kBlock);
    uint32_t any = 0;
    for (std::size_t i = begin; i < end; ++i) {
      any |= static_cast<uint32_t>(
          (load<uint32_t>(reinterpret_cast<const uint8_t*>(v + i)) & kExponent) == kExponent);
    }
    if (!any) continue;
    for (std::size_t i = begin; i < end; ++i) {
      if (!std::isfinite(v[i])) return i;
    }
  }
  return n;
}

std::size_t first_non_finite_row(const float* rows, std::size_t n, const RowLayout& layout) {
  const auto stride = static_cast<std::size_t>(layout.stride());
  const std::size_t bad = first_non_finite(rows, n * stride);
  if (bad != n * stride || !layout.packed()) return bad;
  for (std::size_t r = 0; r < n; ++r) {
    const float* row = rows + r * stride;
    const RowLayout own = layout.of_row(row);
    if (!std::isfinite(read_embed_w(row, own))) return r * stride + RowLayout::kEmbedW;
    for (int32_t i = 0; i < own.mf_dim; ++i) {
      if (!std::isfinite(read_embedx_w(row, own, i))) {
        return r * stride + static_cast<std::size_t>(detail::packed_embedx_slot(own, i));
      }
    }
  }
  return n * stride;
}

Status non_finite_row_error(const uint64_t* keys, std::size_t n, const float* rows, uint32_t stride,
                            std::size_t index) {
  std::ostringstream msg;
  msg << "row of key " << keys[index / stride] << " holds " << rows[index] << " in field "
      << index % stride << " of " << stride << "; none of this request's " << n
      << " rows was applied";
  return Status::InvalidArgument(msg.str());
}

void encode_erase_request(const uint64_t* keys, std::size_t n, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(static_cast<uint32_t>(n));
  w.put_array(keys, n);
}

StatusOr<std::vector<uint64_t>> decode_erase_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "ERASE request");
  uint32_t count = 0;
  std::vector<uint64_t> keys;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&count));
  GPUBOX_RETURN_IF_ERROR(r.get_array(&keys, count));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return keys;
}

void encode_save_request(SaveKind mode, const std::string& path, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(static_cast<uint32_t>(mode));
  w.put_string(path);
}

StatusOr<SaveRequest> decode_save_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "SAVE request");
  uint32_t mode = 0;
  SaveRequest req;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&mode));
  if (mode > static_cast<uint32_t>(SaveKind::kCheckpoint)) {
    return Status::InvalidArgument("SAVE request: unknown save mode " + std::to_string(mode));
  }
  req.mode = static_cast<SaveKind>(mode);
  GPUBOX_RETURN_IF_ERROR(r.get_string(&req.path, kMaxPathBytes));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return req;
}

void encode_path_request(const std::string& path, std::vector<uint8_t>* out) {
  PayloadWriter(out).put_string(path);
}

StatusOr<std::string> decode_path_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "path request");
  std::string path;
  GPUBOX_RETURN_IF_ERROR(r.get_string(&path, kMaxPathBytes));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return path;
}

void encode_u64_reply(uint64_t value, std::vector<uint8_t>* out) {
  PayloadWriter(out).put_u64(value);
}

StatusOr<uint64_t> decode_u64_reply(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "u64 reply");
  uint64_t v = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&v));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return v;
}

void encode_progress(const ProgressNote& note, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u64(note.steps);
  w.put_u64(note.io_bytes);
}

StatusOr<ProgressNote> decode_progress(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "PROGRESS");
  ProgressNote note;
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&note.steps));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&note.io_bytes));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return note;
}

void encode_stats_reply(const HostTierStats& stats, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u64(stats.rows_in_memory);
  w.put_u64(stats.rows_on_disk);
  w.put_u64(stats.memory_bytes);
}

StatusOr<HostTierStats> decode_stats_reply(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "STATS reply");
  HostTierStats s;
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&s.rows_in_memory));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&s.rows_on_disk));
  GPUBOX_RETURN_IF_ERROR(r.get_u64(&s.memory_bytes));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return s;
}

void encode_barrier_request(const std::string& name, uint32_t parties, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_string(name);
  w.put_u32(parties);
}

StatusOr<BarrierRequest> decode_barrier_request(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "BARRIER request");
  BarrierRequest req;
  GPUBOX_RETURN_IF_ERROR(r.get_string(&req.name, 256));
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&req.parties));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  if (req.parties == 0) return Status::InvalidArgument("BARRIER request: 0 parties");
  return req;
}

void encode_error_reply(const std::string& message, std::vector<uint8_t>* out) {
  PayloadWriter(out).put_string(message.size() > kMaxErrorBytes ? message.substr(0, kMaxErrorBytes)
                                                                : message);
}

Status decode_error_reply(const FrameHeader& header, const uint8_t* data, std::size_t n) {
  if (header.status == Status::Code::kOk) return Status::OK();
  PayloadReader r(data, n, "error reply");
  std::string message;
  Status st = r.get_string(&message, kMaxErrorBytes);
  if (!st.ok()) message = "(undecodable error message: " + st.message() + ")";
  return make_status(header.status, std::move(message));
}

}  // namespace gpubox::table::server
