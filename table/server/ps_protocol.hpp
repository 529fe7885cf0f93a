// The parameter-server modes' two requests (runner.sync_mode async | sync | geo), next to the
// host-tier ops of protocol.hpp: the framing, limits and decoding rules are those of
// protocol.hpp. Kept apart so the pass-staged (gpubox) protocol reads as it was.
//
//   PS_PUSH: per-key updates that the server applies to its rows on arrival, under a lock per
//            key stripe: a gradient (the push record of sparse_rule.hpp: show, click, embed_g,
//            embedx_g[mf_dim], merged over the sender's batch; the accessor's optimizer rule
//            runs on the server) or a geo delta (the same fields, added to show, click, embed_w
//            and embedx_w; an embedx part that a trainer created arrives as a delta from the key's
//            initial values, which the server creates it at).
//   DENSE:   a named float vector held by the server (the dense table of the PS modes): read it
//            (created from the request's values when absent), add the request's values to it
//            and read the sum back in the same round trip, or write it (a job's start: the
//            values of the model it starts from, whatever a previous job left there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::server {

// How a PS_PUSH's values change a row. Travels as u8: never renumber.
enum class PsUpdateKind : uint8_t { kGradient = 0, kDelta = 1 };

// PS_PUSH request: u8 kind, u32 n, u32 dim, u64 keys[n], i32 slots[n], f32 values[n * dim].
// dim must be the table's push_dim (3 + mf_dim); values must be finite.
void encode_ps_push_request(PsUpdateKind kind, const uint64_t* keys, const int32_t* slots,
                            std::size_t n, const float* values, uint32_t dim,
                            std::vector<uint8_t>* out);
struct PsPushRequest {
  PsUpdateKind kind = PsUpdateKind::kGradient;
  uint32_t dim = 0;
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  std::vector<float> values;
};
StatusOr<PsPushRequest> decode_ps_push_request(const uint8_t* data, std::size_t n);

// What a DENSE request does. Travels as u8: never renumber.
enum class DenseAction : uint8_t {
  kRead = 0,   // the table's values; created from the request's values when absent
  kAdd = 1,    // values += the request's values; replies the sums
  kWrite = 2,  // the table becomes the request's values (any size; created when absent)
};
// Bounds of the dense tables one server holds (a client cannot make it keep more).
inline constexpr std::size_t kMaxDenseNameBytes = 64;
inline constexpr std::size_t kMaxDenseTables = 16;

// DENSE request: u8 action, string name (1..kMaxDenseNameBytes), u32 n, f32 values[n].
// DENSE reply: u32 n, f32 values[n].
void encode_dense_request(DenseAction action, const std::string& name, const float* values,
                          std::size_t n, std::vector<uint8_t>* out);
struct DenseRequest {
  DenseAction action = DenseAction::kRead;
  std::string name;
  std::vector<float> values;
};
StatusOr<DenseRequest> decode_dense_request(const uint8_t* data, std::size_t n);
void encode_dense_reply(const float* values, std::size_t n, std::vector<uint8_t>* out);
// Checks that the reply holds exactly `expect_n` values.
StatusOr<std::vector<float>> decode_dense_reply(const uint8_t* data, std::size_t n,
                                                std::size_t expect_n);

}  // namespace gpubox::table::server
