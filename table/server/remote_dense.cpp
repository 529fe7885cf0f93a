// RemoteHostTier's DENSE (remote_host_tier.hpp): a dense table in one frame when it fits, else in
// ranges under the frame limit (ps_protocol.hpp: DenseRequest).
#include <algorithm>
#include <cstring>

#include "common/logging.hpp"
#include "table/server/protocol.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::table::server {
namespace {

// The bytes of a DENSE request besides its values (action, name, total, offset, count, write
// id, has_values), with room to spare.
std::size_t dense_head_bytes(const std::string& name) { return 64 + name.size(); }

// A read's or an add's frame carries the range's values, and the server holds the request while
// it builds the reply of as many: both count against one connection's buffer, which INFO's
// limit describes. A write's reply, and a ranged read's request, carry no values.
std::size_t bytes_per_value(DenseAction action, bool request_carries_values) {
  return action == DenseAction::kWrite || !request_carries_values ? sizeof(float)
                                                                  : 2 * sizeof(float);
}

// What a DENSE call of `bytes` (its requests' and replies' values) adds to its deadline: their
// time at 1 MiB/s, the floor the server holds a frame's transfer to (gpubox_server
// --min_transfer_kb_s, default 1024). A big table's exchange on a loaded machine then fails only
// when it stops moving, not at runner.server_timeout_s (PaddleRec fat_deepffm's 71 MB table, at
// load 14 on 2 cores, once took over 30 s for one of its ranges).
double transfer_allowance_s(std::size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(1u << 20);
}

// The endpoints a DENSE call changes: the first server's, unless the call is no change.
std::vector<std::size_t> changed_by(const DenseCall& call) {
  return call.mutation ? std::vector<std::size_t>{0} : std::vector<std::size_t>{};
}

}  // namespace

std::size_t RemoteHostTier::frame_payload_limit() const {
  return std::min<std::size_t>(frame_limit_, transport_.options().max_payload_bytes);
}

Status RemoteHostTier::dense(DenseAction action, const std::string& name,
                             std::vector<float>* values, const DenseCall& call) {
  const std::size_t n = values->size();
  if (n > UINT32_MAX) {
    return Status::InvalidArgument("dense table '" + name + "' of " + std::to_string(n) +
                                   " values: at most 2^32 - 1 travel");
  }
  const std::size_t limit = frame_payload_limit();
  const std::size_t head = dense_head_bytes(name) + kDenseReplyHeadBytes;
  if (limit <= head + 2 * sizeof(float)) {
    return Status::InvalidArgument("a frame limit of " + std::to_string(limit) +
                                   " bytes cannot carry DENSE '" + name + "'");
  }
  const std::size_t whole = (limit - head) / bytes_per_value(action, true);
  if (n > whole && call.request_id != 0) {
    return Status::InvalidArgument("dense table '" + name + "' of " + std::to_string(n) +
                                   " values is sent in ranges: it cannot be sent again under "
                                   "one request id");
  }
  if (n > whole) {
    // A ranged read carries no values; an add and a write carry theirs.
    const bool carries = action != DenseAction::kRead;
    return dense_in_ranges(action, name, values, (limit - head) / bytes_per_value(action, carries),
                           call);
  }
  // The whole table in one frame (a read creates it from *values when the server has none).
  std::vector<uint8_t> payload;
  encode_dense_request(action, name, values->data(), n, &payload);
  std::vector<OutgoingRequest> requests{
      transport_.make_request(Op::kDense, 0, payload, call.request_id)};
  MutationScope scope(&identities_, changed_by(call));
  const double deadline_s = (call.deadline_s >= 0 ? call.deadline_s : options_.deadline_s) +
                            transfer_allowance_s(n * bytes_per_value(action, true));
  return transport_.run(
      Op::kDense, requests,
      [&](std::size_t, const uint8_t* data, std::size_t bytes) -> Status {
        const bool write = action == DenseAction::kWrite;
        auto reply = decode_dense_reply(data, bytes, 0, write ? 0 : static_cast<uint32_t>(n));
        if (!reply.ok()) return reply.status();
        if (write && !reply->committed) {
          return Status::Internal("DENSE '" + name + "': the server did not take the write");
        }
        if (!write && n > 0) std::memcpy(values->data(), reply->values, sizeof(float) * n);
        if (call.progress) own_progress_.fetch_add(1, std::memory_order_relaxed);
        return Status::OK();
      },
      /*retry=*/true, deadline_s);
}

Status RemoteHostTier::dense_in_ranges(DenseAction action, const std::string& name,
                                       std::vector<float>* values, std::size_t per_frame,
                                       const DenseCall& call) {
  const std::size_t n = values->size();
  // All or nothing for non-finite values: the server checks each range, but ranges sent before
  // a bad one would already be applied.
  if (action != DenseAction::kRead) {
    const std::size_t bad = first_non_finite(values->data(), n);
    if (bad != n) {
      return Status::InvalidArgument("dense table '" + name + "': value " + std::to_string(bad) +
                                     " is not finite; nothing was sent");
    }
  }
  // A ranged write the server dropped before it completed (NotFound: another client's write took
  // its slot or its memory, it stalled or idled, the server restarted) is sent again whole once,
  // under a new write id; dropped again, the error names the server and why.
  Status st = send_ranges(action, name, values, per_frame, call);
  if (action != DenseAction::kWrite || st.code() != Status::Code::kNotFound) return st;
  GPUBOX_LOG(WARNING) << "gpubox: writing dense table '" << name
                      << "' again, once: " << st.message();
  st = send_ranges(action, name, values, per_frame, call);
  if (st.code() != Status::Code::kNotFound) return st;
  return st.with_context("dense table '" + name + "' written twice, dropped both times");
}

Status RemoteHostTier::send_ranges(DenseAction action, const std::string& name,
                                   std::vector<float>* values, std::size_t per_frame,
                                   const DenseCall& call) {
  const std::size_t n = values->size();
  DenseRequest head;
  head.action = action;
  head.name = name;
  head.total = static_cast<uint32_t>(n);
  // Unique per client: the server stages a ranged write under (client id, write id).
  head.write_id = action == DenseAction::kWrite ? transport_.next_request_id() : 0;
  // A ranged read carries no values: it cannot create the table (a write does).
  head.has_values = action != DenseAction::kRead;
  const auto lanes = static_cast<uint32_t>(options_.connections_per_endpoint);
  const std::size_t ranges = (n + per_frame - 1) / per_frame;
  // The ranges are encoded a window at a time, two a connection (one in flight while the next
  // is sent), so the frames in memory are bounded by the window, not the table: a table of
  // several GB does not take as much again in frames. A write's last range is in the last window.
  const std::size_t window = 2 * static_cast<std::size_t>(lanes);
  std::vector<OutgoingRequest> requests;
  std::vector<uint8_t> payload;
  MutationScope scope(&identities_, changed_by(call));
  const double deadline_s = call.deadline_s >= 0 ? call.deadline_s : options_.deadline_s;
  std::size_t committed = 0;
  Status st;
  const std::size_t value_bytes = bytes_per_value(action, head.has_values);
  for (std::size_t first = 0; first < ranges && st.ok(); first += window) {
    requests.clear();
    const std::size_t window_bytes =
        value_bytes * (std::min(n, (first + window) * per_frame) - first * per_frame);
    for (std::size_t r = first; r < std::min(ranges, first + window); ++r) {
      const std::size_t offset = r * per_frame;
      head.offset = static_cast<uint32_t>(offset);
      head.count = static_cast<uint32_t>(std::min(per_frame, n - offset));
      payload.clear();
      encode_dense_range(head, values->data() + offset, &payload);
      requests.push_back(transport_.make_request(Op::kDense, 0, payload));
      // Ranges are independent of one another: spread over the connections.
      requests.back().lane = static_cast<uint32_t>(r % lanes);
    }
    st = transport_.run(
        Op::kDense, requests,
        [&](std::size_t i, const uint8_t* data, std::size_t bytes) -> Status {
          const std::size_t offset = (first + i) * per_frame;
          const auto count = static_cast<uint32_t>(std::min(per_frame, n - offset));
          const bool write = action == DenseAction::kWrite;
          auto reply =
              decode_dense_reply(data, bytes, static_cast<uint32_t>(offset), write ? 0 : count);
          if (!reply.ok()) return reply.status();
          committed += reply->committed ? 1 : 0;
          if (!write && count > 0) {
            std::memcpy(values->data() + offset, reply->values, sizeof(float) * count);
          }
          if (call.progress) own_progress_.fetch_add(1, std::memory_order_relaxed);
          return Status::OK();
        },
        /*retry=*/true, deadline_s + transfer_allowance_s(window_bytes),
        options_.connections_per_endpoint);
  }
  if (!st.ok())
    return st.with_context("dense table '" + name + "' in " + std::to_string(ranges) + " ranges");
  if (action == DenseAction::kWrite && committed != 1) {
    // The last range's reply did not say committed: the server no longer held the earlier ranges
    // (restarted; or it dropped the write and forgot that it had, its record of dropped writes
    // being bounded), or the reply came from a retry that no longer matched the write.
    return Status::NotFound("dense table '" + name + "': the server " + endpoint_name(0) +
                            " did not commit the write of " + std::to_string(n) + " values in " +
                            std::to_string(ranges) +
                            " ranges: it no longer held the ranges sent before the last (a "
                            "server restart, or the held write was dropped); the table was not "
                            "written");
  }
  return Status::OK();
}

}  // namespace gpubox::table::server
