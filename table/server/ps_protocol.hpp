// The parameter-server modes' two requests (runner.sync_mode async | sync | geo), next to the
// host-tier ops of protocol.hpp: the framing, limits and decoding rules are those of
// protocol.hpp. Kept apart so the pass-staged (gpubox) protocol reads as it was.
//
//   PS_PUSH: per-key updates that the server applies to its rows on arrival (the sync mode's job
//            of several trainers: once its step is whole, PsUpdateKind), under a lock per key
//            stripe: a gradient (the push record of sparse_rule.hpp: show, click, embed_g,
//            embedx_g[mf_dim], merged over the sender's batch; the accessor's optimizer rule
//            runs on the server) or a geo delta (the same fields, added to show, click, embed_w
//            and embedx_w; an embedx part that a trainer created arrives as a delta from the key's
//            initial values, which the server creates it at).
//   DENSE:   a named float vector held by the server (the dense table of the PS modes): read it
//            (created from the request's values when absent), add the request's values to it
//            and read the sum back in the same round trip, or write it (a job's start: the
//            values of the model it starts from, whatever a previous job left there); a range
//            of it at a time when the table does not fit in one frame (see DenseRequest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::server {

// How a PS_PUSH's values change a row. Travels as u8: never renumber.
//   kStepGradient (protocol 9): a gradient of one step of the sync mode's job of several
//   trainers, held by the server until every part of the job's step arrived, then summed per key
//   in part order and applied once (ps_step_sums.hpp), as the gpubox mode's cards sum a key's
//   gradients before its rule.
enum class PsUpdateKind : uint8_t { kGradient = 0, kDelta = 1, kStepGradient = 2 };

// Which part of which step a kStepGradient PS_PUSH is: the job (a random id its trainer 0 drew),
// the step (pass << 32 | step), the job's parts (its training threads, trainers x threads) and
// this one's (trainer x threads + thread), and the request's chunk of what the part sends this
// server (every part sends every server at least one chunk a step, empty when it has no key
// there, so the server knows when the step is whole).
struct PsStepPart {
  uint64_t job = 0;
  uint64_t step = 0;
  uint32_t parts = 0;
  uint32_t part = 0;
  uint32_t chunks = 0;
  uint32_t chunk = 0;
};
inline constexpr uint32_t kMaxStepParts = 4096;
inline constexpr uint32_t kMaxStepChunks = 1u << 16;

// PS_PUSH request: u8 kind, [kStepGradient: u64 job, u64 step, u32 parts, u32 part, u32 chunks,
// u32 chunk], u32 n, u32 dim, u64 keys[n], i32 slots[n], f32 values[n * dim]. dim must be the
// table's push_dim (3 + mf_dim); values must be finite. A step part needs parts in
// [1, kMaxStepParts], part < parts, chunks in [1, kMaxStepChunks], chunk < chunks.
void encode_ps_push_request(PsUpdateKind kind, const uint64_t* keys, const int32_t* slots,
                            std::size_t n, const float* values, uint32_t dim,
                            std::vector<uint8_t>* out);
// A kStepGradient PS_PUSH of `part`.
void encode_ps_step_push_request(const PsStepPart& part, const uint64_t* keys, const int32_t* slots,
                                 std::size_t n, const float* values, uint32_t dim,
                                 std::vector<uint8_t>* out);
struct PsPushRequest {
  PsUpdateKind kind = PsUpdateKind::kGradient;
  PsStepPart step;  // kStepGradient only
  uint32_t dim = 0;
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  std::vector<float> values;
};
StatusOr<PsPushRequest> decode_ps_push_request(const uint8_t* data, std::size_t n);

// What a DENSE request does. Travels as u8: never renumber.
enum class DenseAction : uint8_t {
  kRead = 0,   // the range's values; the table created from the request's values when absent
               // (a whole-table request only)
  kAdd = 1,    // the range's values += the request's values; replies the sums
  kWrite = 2,  // the table becomes the request's values (any size; created when absent)
};
// Bounds of the dense tables one server holds (a client cannot make it keep more), and of the
// writes it stages (a table written in several ranges, see below): per client, the id its
// connection is bound to (beyond, the client's own oldest is dropped, an abandoned one first), per
// peer host (its share address, connection_share.hpp: a client that takes a new id on each
// connection is still one host, and so is one spreading over 127.0.0.2, 127.0.0.3, ...) and from
// all clients (beyond either, the longest idle abandoned write goes first, else the idlest write of
// the clients holding the most when they hold more than the new write's, else it is refused).
inline constexpr std::size_t kMaxDenseNameBytes = 64;
inline constexpr std::size_t kMaxDenseTables = 16;
inline constexpr std::size_t kMaxStagedDenseWrites = 4;
inline constexpr std::size_t kMaxHeldDenseWrites = 64;
// Per host (share address): half the server's, so one host (a local process spreading over
// loopback addresses included) never holds every slot, and 8 trainers of one host writing 4 ranged
// writes each at once still fit. Two hosts at their share fill the server: a third one's new write
// then takes a slot of the clients holding the most on the server (PsStore::dense), or is refused.
inline constexpr std::size_t kMaxHeldDenseWritesPerHost = kMaxHeldDenseWrites / 2;

// DENSE request (protocol 6): u8 action, string name (1..kMaxDenseNameBytes), u32 total (the
// table's size as the client knows it), u32 offset, u32 count (the range [offset, offset+count)
// of the table it reads, adds to or writes; within total), u64 write_id, u8 has_values, then
// f32 values[count] when has_values (required by an add and a write).
//
// A table over one frame travels in ranges (RemoteHostTier::dense): each range of a read or an
// add is applied on its own, atomically; a write of a part of the table (count < total) is
// staged on the server under (client id, write_id) and replaces the table at once when its last
// range arrives, so a write is seen whole or not at all. The server allocates only for bytes
// that arrived: a staged write grows with its ranges, and `total` sizes nothing (it is checked
// against the server's dense memory limit at the first range). A ranged write's range carries at
// least one value.
//
// DENSE reply: u32 offset, u32 count, u8 committed, f32 values[count]: a read or an add replies
// the range's values after the request; a write replies no values, committed 1 when the table
// now holds what was written (a whole write, or the range that completed a staged write).
struct DenseRequest {
  DenseAction action = DenseAction::kRead;
  std::string name;
  uint32_t total = 0;
  uint32_t offset = 0;
  uint32_t count = 0;
  uint64_t write_id = 0;
  bool has_values = false;
  std::vector<float> values;  // count of them when has_values, else empty
  bool whole() const { return offset == 0 && count == total; }
};
// The whole table in one request: total = count = n, offset 0.
void encode_dense_request(DenseAction action, const std::string& name, const float* values,
                          std::size_t n, std::vector<uint8_t>* out);
// Any range; `values` (head.count of them) are read only when head.has_values.
void encode_dense_range(const DenseRequest& head, const float* values, std::vector<uint8_t>* out);
// Refuses (naming the field) an unknown action, a name out of bounds, a range outside total, an
// add or a write without values, and bytes that do not hold exactly what the head says.
StatusOr<DenseRequest> decode_dense_request(const uint8_t* data, std::size_t n);

struct DenseReply {
  uint32_t offset = 0;
  uint32_t count = 0;
  bool committed = false;
  const uint8_t* values = nullptr;  // count floats, unaligned (memcpy them)
};
inline constexpr std::size_t kDenseReplyHeadBytes = 9;
void encode_dense_reply(uint32_t offset, const float* values, std::size_t n, bool committed,
                        std::vector<uint8_t>* out);
// Checks that the reply answers the range [offset, offset + expect_count) exactly.
StatusOr<DenseReply> decode_dense_reply(const uint8_t* data, std::size_t n, uint32_t offset,
                                        uint32_t expect_count);

}  // namespace gpubox::table::server
