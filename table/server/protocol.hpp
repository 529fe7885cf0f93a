// The gpubox_server wire protocol: length-prefixed binary frames over TCP.
//
// Frame = 32-byte header + payload, every integer little-endian:
//
//   offset  size  field
//        0     4  magic "GPBX" (0x58425047)
//        4     2  version (kProtocolVersion)
//        6     2  op (Op), with kResponseBit set on responses
//        8     4  status: 0 in requests; a Status::Code in responses (non-zero: the payload is the
//                 error message)
//       12     4  payload length in bytes (at most the receiver's limit)
//       16     8  request id: chosen by the client, echoed by the server. A retried request keeps
//                 its id, so the server applies a mutation (PUSH, ERASE, ...) at most once.
//       24     8  client id: random per client object; (client id, request id) names a request.
//                 A connection speaks for one client: the id its AUTH_PROOF proved, or (no
//                 token) its first frame's; a frame with another id is refused
//                 (PermissionDenied, naming the peer and both ids) and the connection closed.
//
// A server answers the requests of one connection in order. Payloads per op are described by the
// encode_* functions below. Before a connection authenticated (on a server with a token) it may
// send only AUTH and AUTH_PROOF (auth_handshake.hpp), with at most kMaxAuthPayloadBytes of
// payload; while a BARRIER waits it may send nothing (bytes then close the connection).
// A response with request id 0 (kNoticeRequestId; clients number requests from 1) answers no
// request: it is the server's notice about the connection (at its connection cap, evicted,
// another protocol version, a deadline passed), sent just before the server closes it; its status
// and message are the reason. A PROGRESS frame (a response, status OK, the request id of the SAVE,
// LOAD or SHRINK in flight) answers nothing either: the server sends it while that call still
// makes progress, at most every ServerOptions::progress_interval_s, and the request's reply
// follows later on the same connection; a client never sends one (the server closes a connection
// that does). A frame of another protocol version is answered with such a notice
// in that version's header, so an older or newer client reports both versions. Decoders never trust
// a length: every count is checked against the bytes actually present and against the frame limit
// before anything is allocated, and any mismatch is a Status error (never a crash, never an
// unbounded allocation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/host_tier.hpp"
#include "table/sparse_row/rule_fields.hpp"

namespace gpubox::table::server {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian and copied as such");

inline constexpr uint32_t kFrameMagic = 0x58425047;  // "GPBX" as bytes on the wire
// 2: INFO carries the server's instance id and generation; SAVE and LOAD reply with a generation.
// 3: INFO carries the rows' sparse storage (fp16 and bf16 rows have the same stride).
// 4: PULL replies and PUSH requests carry each row at its own width (hyper_parameters.slot_dims;
//    see "Rows on the wire" below).
// 5: AUTH is a challenge-response (auth_handshake.hpp: the token never crosses the wire);
//    notices (request id 0) say why the server closes a connection.
// 6: DENSE carries a range of its table (ps_protocol.hpp), so a dense table of any size travels
//    in frames under the limit.
// 7: INFO carries the server's sparse rule field by field (table/sparse_row/rule_fields.hpp).
// 8: INFO carries the seed the server's new rows start from (AccessorConfig::seed).
// 9: PS_PUSH's kStepGradient: the sync mode's step of several trainers summed per key on the
//    server, then applied once (ps_protocol.hpp, ps_step_sums.hpp).
// 10: PROGRESS frames while a SAVE or LOAD makes progress, so that a client bounds such a call by
//    the time without progress instead of its total time.
// 11: SHRINK too runs on the server's SAVE/LOAD worker and sends PROGRESS frames (a step per shard
//    of the table, or per bounded chunk of a shard's rows); its client bounds it by the time
//    without progress. Request and reply are as in 10 (no payload; u64 deleted).
inline constexpr uint16_t kProtocolVersion = 11;
inline constexpr uint64_t kNoticeRequestId = 0;
inline constexpr std::size_t kHeaderBytes = 32;
inline constexpr uint16_t kResponseBit = 0x8000;
// Default frame limit of both sides: 64 MiB of payload (a chunk of a few thousand rows is far
// below it; the limit exists so a forged length cannot make anyone allocate gigabytes).
inline constexpr uint32_t kDefaultMaxPayloadBytes = 64u << 20;
// Payload limit of an AUTH or AUTH_PROOF frame, and of anything an unauthenticated connection
// sends: it must not make the server buffer more.
inline constexpr uint32_t kMaxAuthPayloadBytes = 64;

enum class Op : uint16_t {
  kAuth = 1,       // -> the connection's challenge (auth_handshake.hpp); first on a token server
  kInfo = 2,       // -> shard id/num, optimizer kind, mf_dim, row stride, frame limit, identity,
                   //    sparse storage
  kPull = 3,       // keys (+ slots) -> rows, created count
  kPush = 4,       // keys + full rows
  kErase = 5,      // keys
  kSave = 6,       // mode + path -> generation of the save
  kLoad = 7,       // path -> generation of what is now loaded
  kShrink = 8,     // -> deleted rows
  kStats = 9,      // -> HostTierStats
  kBarrier = 10,   // name + parties: answered once `parties` connections wait on `name`
  kShutdown = 11,  // graceful stop after the reply
  kPsPush = 12,  // PS modes: per-key gradients or geo deltas, applied on arrival (ps_protocol.hpp)
  kDense = 13,   // PS modes: read or add to a named dense vector (ps_protocol.hpp)
  kPeek = 14,    // PULL's request and reply, read-only (HostTier::peek): created = unknown keys
  kAuthProof = 15,  // the HMAC of AUTH's challenge under the token (auth_handshake.hpp)
  kProgress = 16,   // server -> client only: a SAVE, LOAD or SHRINK in flight still moves
};

// "PULL", "PUSH", ... ("OP#<n>" for an unknown value).
const char* op_name(Op op);
bool is_known_op(uint16_t value);

struct FrameHeader {
  Op op = Op::kInfo;
  bool response = false;
  Status::Code status = Status::Code::kOk;
  uint32_t payload_bytes = 0;
  uint64_t request_id = 0;
  uint64_t client_id = 0;
};

// Writes the 32-byte header (of protocol `version`: only a notice to a client of another version
// is written in any but kProtocolVersion).
void encode_header(const FrameHeader& header, uint8_t* out, uint16_t version = kProtocolVersion);
// The protocol version of a header that starts with the frame magic (0 when it does not).
uint16_t header_version(const uint8_t* bytes, std::size_t n);
// Parses and validates a header: magic, version, known op, status code, payload under
// `max_payload_bytes`. `n` < kHeaderBytes is a truncated-frame error.
StatusOr<FrameHeader> decode_header(const uint8_t* bytes, std::size_t n,
                                    uint32_t max_payload_bytes);

// A whole frame in one buffer (header + payload). encode_frame sets payload_bytes.
std::vector<uint8_t> encode_frame(FrameHeader header, const std::vector<uint8_t>& payload);
struct Frame {
  FrameHeader header;
  std::vector<uint8_t> payload;
};
// Decodes exactly one frame from `n` bytes: truncated, oversized or trailing bytes are errors.
StatusOr<Frame> decode_frame(const uint8_t* bytes, std::size_t n, uint32_t max_payload_bytes);

// Status <-> wire: the code travels in the header, the message as the payload.
Status make_status(Status::Code code, std::string message);

// ---- payload building blocks ------------------------------------------------------------------

// Appends little-endian values to a byte buffer.
class PayloadWriter {
 public:
  explicit PayloadWriter(std::vector<uint8_t>* out) : out_(out) {}
  void put_u8(uint8_t v) { put_raw(&v, 1); }
  void put_u32(uint32_t v) { put_raw(&v, 4); }
  void put_i32(int32_t v) { put_raw(&v, 4); }
  void put_u64(uint64_t v) { put_raw(&v, 8); }
  void put_string(const std::string& s);
  template <class T>
  void put_array(const T* values, std::size_t n) {
    put_raw(values, n * sizeof(T));
  }
  void put_raw(const void* data, std::size_t bytes);

 private:
  std::vector<uint8_t>* out_;
};

// Reads little-endian values with bounds checks; every read past the end is a Corruption
// status naming `what` (the message being decoded).
class PayloadReader {
 public:
  PayloadReader(const uint8_t* data, std::size_t n, const char* what)
      : data_(data), n_(n), what_(what) {}
  Status get_u8(uint8_t* v) { return get_raw(v, 1, "u8"); }
  Status get_u32(uint32_t* v) { return get_raw(v, 4, "u32"); }
  Status get_i32(int32_t* v) { return get_raw(v, 4, "i32"); }
  Status get_u64(uint64_t* v) { return get_raw(v, 8, "u64"); }
  Status get_string(std::string* s, std::size_t max_bytes = 4096);
  // Checks that `count` elements fit in the remaining bytes before resizing `out`.
  template <class T>
  Status get_array(std::vector<T>* out, std::size_t count) {
    GPUBOX_RETURN_IF_ERROR(check_fits(count, sizeof(T)));
    out->resize(count);
    return get_raw(out->data(), count * sizeof(T), "array");
  }
  // A view of the next `count` elements (unaligned; read with memcpy) without copying.
  Status skip_array(std::size_t count, std::size_t elem_bytes, const uint8_t** at);
  Status get_raw(void* out, std::size_t bytes, const char* field);
  // Error when bytes are left over (a frame must be consumed exactly).
  Status finish() const;
  std::size_t remaining() const { return n_ - pos_; }

 private:
  Status check_fits(std::size_t count, std::size_t elem_bytes) const;
  const uint8_t* data_;
  std::size_t n_;
  std::size_t pos_ = 0;
  const char* what_;
};

// ---- messages --------------------------------------------------------------------------------

// INFO reply: u32 shard_id, u32 shard_num, i32 optimizer_kind, i32 mf_dim, u32 stride,
// u32 max_payload_bytes, u64 instance_id, u64 generation, i32 storage (SparseStorage: rows travel
// as the server keeps them, packed when 16-bit), u64 slot_dims_digest, u64 seed, u32 n, then n
// rule fields (string key, f64 value; n at most kMaxInfoRuleFields).
struct InfoReply {
  uint32_t shard_id = 0;
  uint32_t shard_num = 1;
  int32_t optimizer_kind = 0;
  int32_t mf_dim = 0;
  uint32_t stride = 0;
  uint32_t max_payload_bytes = kDefaultMaxPayloadBytes;  // what this server accepts per frame
  // Random per server process (never 0): a new value means the server restarted.
  uint64_t instance_id = 0;
  // The save the server last loaded (its digest, see model_path.hpp); 0: nothing loaded since
  // it started, so it holds only what clients wrote to this instance.
  uint64_t generation = 0;
  int32_t storage = 0;  // config::SparseStorage
  // table::slot_dims_digest of the server's accessor: the width it gives each slot.
  uint64_t slot_dims_digest = 0;
  // The seed of the server's accessor (runner.seed ^ hyper_parameters.sparse_optimizer.seed of
  // its config): a row the server creates starts at values hashed from its key and this seed.
  uint64_t seed = 0;
  // The server's sparse rule (table::sparse_rule_fields of its accessor), by config key.
  std::vector<SparseRuleField> rule;
};
inline constexpr std::size_t kMaxInfoRuleFields = 64;
// Room for a newer build's fields (a decoder refuses more than kMaxInfoRuleFields).
static_assert(table::kSparseRuleFieldCount <= kMaxInfoRuleFields / 2,
              "an INFO reply carries every sparse rule field, with room for a newer build's");
void encode_info_reply(const InfoReply& info, std::vector<uint8_t>* out);
StatusOr<InfoReply> decode_info_reply(const uint8_t* data, std::size_t n);

// PULL (and PEEK) request: u32 n, u32 has_slots, u64 keys[n], (i32 slots[n] when has_slots).
void encode_pull_request(const uint64_t* keys, const int32_t* slots, std::size_t n,
                         std::vector<uint8_t>* out);
struct PullRequest {
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;  // empty when the client sent none
};
StatusOr<PullRequest> decode_pull_request(const uint8_t* data, std::size_t n);

// Rows on the wire (PULL replies, PUSH requests): each row at its own stride, the floats of
// RowLayout::of_row of the table's record layout (the row's mf_dim field, at the same offset in
// every width, says which), one after the other; with one width (no mixed_widths) every row at
// the record stride. A width-4 row of a 4/8/16 table travels in 56 bytes, not 104.
//
// Packs n rows of the record stride into their own strides (`out` may be `rows`: rows only move
// down). Returns the floats written.
std::size_t pack_rows(const float* rows, std::size_t n, const RowLayout& record, float* out);
// The packed floats of n rows (at most n * record stride).
std::size_t packed_floats(const float* rows, std::size_t n, const RowLayout& record);
// Unpacks n rows from `bytes` bytes at `packed` (unaligned) into record-stride rows: row j goes to
// rows[positions[j]] (or rows[j] when positions is null), zeros after its own floats. A width
// that is not one of `classes` (the table's width_classes), or bytes that do not hold exactly the
// n rows, is a Corruption error naming `what` and the width.
Status unpack_rows(const uint8_t* packed, std::size_t bytes, std::size_t n, const RowLayout& record,
                   const WidthClasses& classes, const uint32_t* positions, float* rows,
                   const char* what);
// The bytes of the narrowest row the table's `classes` make: a packed row takes at least these,
// so n rows that claim fewer bytes are refused before anything is sized by n.
std::size_t narrowest_row_bytes(const RowLayout& record, const WidthClasses& classes);

// PULL (and PEEK) reply: u32 n, u32 stride, u64 created, then the n rows (each at its own width,
// see above; the record stride is `stride`). The server writes rows in place:
// pull_reply_rows_offset() is where they start in the payload.
inline constexpr std::size_t pull_reply_rows_offset() { return 16; }
std::size_t pull_reply_bytes(std::size_t n, uint32_t stride);
void encode_pull_reply_head(std::size_t n, uint32_t stride, uint64_t created, uint8_t* out);
struct PullReplyView {
  uint32_t n = 0;
  uint32_t stride = 0;
  uint64_t created = 0;
  const uint8_t* rows = nullptr;  // the packed rows, unaligned (unpack_rows)
  std::size_t rows_bytes = 0;
};
// Checks n/stride against the expected values and the payload size: every row at `expect_stride`
// (one width), or, with the table's record layout, each at its own width, between the narrowest
// of `classes` and the record stride (each row's width is checked by unpack_rows).
StatusOr<PullReplyView> decode_pull_reply(const uint8_t* data, std::size_t n, uint32_t expect_n,
                                          uint32_t expect_stride);
StatusOr<PullReplyView> decode_pull_reply(const uint8_t* data, std::size_t n, uint32_t expect_n,
                                          const RowLayout& record, const WidthClasses& classes);

// PUSH request: u32 n, u32 stride, u64 keys[n], then the n rows (each at its own width; the
// record stride is `stride`). The stride form writes rows of one width.
void encode_push_request(const uint64_t* keys, std::size_t n, const float* rows, uint32_t stride,
                         std::vector<uint8_t>* out);
void encode_push_request(const uint64_t* keys, std::size_t n, const float* rows,
                         const RowLayout& record, std::vector<uint8_t>* out);
struct PushRequest {
  std::vector<uint64_t> keys;
  std::vector<float> rows;  // at the record stride
  uint32_t stride = 0;
};
// Rows of one width; with the table's record layout, each at its own width, one of `classes`
// (unpacked to the record stride; a request of another record stride is an InvalidArgument
// error).
StatusOr<PushRequest> decode_push_request(const uint8_t* data, std::size_t n);
StatusOr<PushRequest> decode_push_request(const uint8_t* data, std::size_t n,
                                          const RowLayout& record, const WidthClasses& classes);

// PUSH rows must be finite: the index of the first NaN or infinity in v[0..n), or n.
std::size_t first_non_finite(const float* v, std::size_t n);
// first_non_finite over `n` push rows of `layout` (records of layout.stride() floats): with 16-bit
// sparse_storage an embedding slot holds two halves, which a float's exponent test does not see,
// so those values are read through the row's accessors. Returns the index of the float slot that
// holds the first non-finite value, or n * stride.
std::size_t first_non_finite_row(const float* rows, std::size_t n, const RowLayout& layout);
// "row of key K holds nan in field F of S; none of this request's N rows was applied" for the
// value at `index` of push rows `rows` (from first_non_finite).
Status non_finite_row_error(const uint64_t* keys, std::size_t n, const float* rows, uint32_t stride,
                            std::size_t index);

// ERASE request: u32 n, u64 keys[n].
void encode_erase_request(const uint64_t* keys, std::size_t n, std::vector<uint8_t>* out);
StatusOr<std::vector<uint64_t>> decode_erase_request(const uint8_t* data, std::size_t n);

// SAVE request: u32 mode, string path. LOAD request: string path.
void encode_save_request(SaveKind mode, const std::string& path, std::vector<uint8_t>* out);
struct SaveRequest {
  SaveKind mode = SaveKind::kBase;
  std::string path;
};
StatusOr<SaveRequest> decode_save_request(const uint8_t* data, std::size_t n);
void encode_path_request(const std::string& path, std::vector<uint8_t>* out);
StatusOr<std::string> decode_path_request(const uint8_t* data, std::size_t n);

// SHRINK reply: u64 deleted. SAVE and LOAD replies: u64 generation. STATS reply: u64
// rows_in_memory, rows_on_disk, memory_bytes.
void encode_u64_reply(uint64_t value, std::vector<uint8_t>* out);
StatusOr<uint64_t> decode_u64_reply(const uint8_t* data, std::size_t n);
void encode_stats_reply(const HostTierStats& stats, std::vector<uint8_t>* out);
StatusOr<HostTierStats> decode_stats_reply(const uint8_t* data, std::size_t n);

// PROGRESS payload: u64 steps, u64 io_bytes: the steps the server's SAVE/LOAD/SHRINK worker took
// so far (file operations finished, the table's steps between them, a SHRINK's shards and chunks
// of rows) and the bytes its file operations moved; exactly 16 bytes. Informative: the frame's
// arrival is what counts.
struct ProgressNote {
  uint64_t steps = 0;
  uint64_t io_bytes = 0;
};
inline constexpr std::size_t kProgressPayloadBytes = 16;
void encode_progress(const ProgressNote& note, std::vector<uint8_t>* out);
StatusOr<ProgressNote> decode_progress(const uint8_t* data, std::size_t n);

// BARRIER request: string name, u32 parties (> 0). AUTH request: string token.
void encode_barrier_request(const std::string& name, uint32_t parties, std::vector<uint8_t>* out);
// The BARRIER each trainer of a job reaches once its job ended well (RemoteHostTier::end_job):
// a server started with exit_when_job_ends stops when it completes (a TRAINING_ROLE=PSERVER
// server then exits with its job, as PaddleRec's do after stop_worker).
inline constexpr const char* kJobEndBarrier = "gpubox/job_end";

struct BarrierRequest {
  std::string name;
  uint32_t parties = 0;
};
StatusOr<BarrierRequest> decode_barrier_request(const uint8_t* data, std::size_t n);

// Error reply payload: the message (u32 length + bytes).
void encode_error_reply(const std::string& message, std::vector<uint8_t>* out);
// The Status a response frame stands for (OK, or its code with the decoded message).
Status decode_error_reply(const FrameHeader& header, const uint8_t* data, std::size_t n);

}  // namespace gpubox::table::server
