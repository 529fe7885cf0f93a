// RemoteHostTier's push of a sync step's part (remote_host_tier.hpp: push_step; the server's side:
// ps_step_sums.hpp).
#include <algorithm>
#include <cstring>
#include <string>

#include "table/server/protocol.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::table::server {

void RemoteHostTier::gather_records(const uint64_t* keys, const int32_t* slots, const float* values,
                                    uint32_t dim, const uint32_t* pos, std::size_t m,
                                    std::vector<uint64_t>* chunk_keys,
                                    std::vector<int32_t>* chunk_slots,
                                    std::vector<float>* chunk_values) {
  chunk_keys->resize(m);
  chunk_slots->resize(m);
  chunk_values->resize(m * dim);
  for (std::size_t j = 0; j < m; ++j) {
    (*chunk_keys)[j] = keys[pos[j]];
    (*chunk_slots)[j] = slots[pos[j]];
    std::memcpy(chunk_values->data() + j * dim, values + std::size_t{pos[j]} * dim,
                sizeof(float) * dim);
  }
}

Status RemoteHostTier::push_step(PsStepPart part, const uint64_t* keys, const int32_t* slots,
                                 std::size_t n, const float* values) {
  const auto dim = static_cast<uint32_t>(layout_.push_dim());
  const std::size_t bad = first_non_finite(values, n * dim);
  if (bad != n * dim) return non_finite_row_error(keys, n, values, dim, bad);
  const auto groups = split_keys(keys, n);
  const auto lanes = static_cast<std::size_t>(options_.connections_per_endpoint);
  std::vector<OutgoingRequest> requests;
  std::vector<uint64_t> chunk_keys;
  std::vector<int32_t> chunk_slots;
  std::vector<float> chunk_values;
  std::vector<uint8_t> payload;
  std::vector<std::size_t> endpoints(endpoint_count());
  for (std::size_t e = 0; e < endpoints.size(); ++e) {
    endpoints[e] = e;
    std::size_t chunks = 0;  // this server's, over its lanes
    for (std::size_t g = e * lanes; g < (e + 1) * lanes; ++g) {
      chunks += (groups[g].size() + chunk_rows_ - 1) / chunk_rows_;
    }
    if (chunks > kMaxStepChunks) {
      return Status::InvalidArgument("a sync step's part of " + std::to_string(n) + " keys makes " +
                                     std::to_string(chunks) + " chunks of at most " +
                                     std::to_string(chunk_rows_) + " rows for " + endpoint_name(e) +
                                     ", over the servers' " + std::to_string(kMaxStepChunks) +
                                     " a part: push fewer keys a step");
    }
    part.chunks = static_cast<uint32_t>(std::max<std::size_t>(chunks, 1));
    part.chunk = 0;
    if (chunks == 0) {  // no key there: an empty chunk says this part is whole
      payload.clear();
      encode_ps_step_push_request(part, nullptr, nullptr, 0, nullptr, dim, &payload);
      requests.push_back(make_group_request(Op::kPsPush, e * lanes, payload));
      continue;
    }
    for (std::size_t g = e * lanes; g < (e + 1) * lanes; ++g) {
      for (std::size_t begin = 0; begin < groups[g].size(); begin += chunk_rows_) {
        const std::size_t m = std::min(chunk_rows_, groups[g].size() - begin);
        gather_records(keys, slots, values, dim, groups[g].data() + begin, m, &chunk_keys,
                       &chunk_slots, &chunk_values);
        payload.clear();
        encode_ps_step_push_request(part, chunk_keys.data(), chunk_slots.data(), m,
                                    chunk_values.data(), dim, &payload);
        requests.push_back(make_group_request(Op::kPsPush, g, payload));
        ++part.chunk;
      }
    }
  }
  MutationScope scope(&identities_, std::move(endpoints));
  return transport_.run(
      Op::kPsPush, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/true, /*deadline_s=*/-1.0, options_.connections_per_endpoint);
}

}  // namespace gpubox::table::server
