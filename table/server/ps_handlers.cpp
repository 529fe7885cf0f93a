// What the parameter-server modes' ops (ps_protocol.hpp) do on the server: PS_PUSH and DENSE,
// both through the server's PsStore (a sync step's parts through PsStepSums first). Retried
// requests are answered from the retry cache (handlers.cpp), so a gradient or a delta is applied
// once; a retried DENSE add, remembered without its values, is answered by reading its range again
// (dense_reread).
#include "table/server/ps_protocol.hpp"
#include "table/server/server_impl.hpp"

namespace gpubox::table::server {

Reply Server::Impl::ps_push(const FrameHeader& header, const std::vector<uint8_t>& payload,
                            const RequestOrigin& origin) {
  auto request = decode_ps_push_request(payload.data(), payload.size());
  if (!request.ok()) return table_error_reply(header, request.status());
  Status st = check_keys(request->keys.data(), request->keys.size());
  if (st.ok())
    st = admit_new_rows(request->keys.data(), request->slots.data(), request->keys.size());
  const std::size_t rows = request->keys.size();
  if (st.ok()) {
    st = request->kind == PsUpdateKind::kStepGradient
             ? ps_step_push(header, std::move(request).value(), origin)
             : ps_store_.apply(*table_, *request);
  }
  if (!st.ok()) return table_error_reply(header, st);
  rows_pushed.fetch_add(rows, std::memory_order_relaxed);
  return make_reply(header, Status::Code::kOk, {});
}

Status Server::Impl::ps_step_push(const FrameHeader& header, PsPushRequest request,
                                  const RequestOrigin& origin) {
  // Checked on arrival, not only when the step is applied: a part of the wrong width must not
  // drop the held step of another job or step.
  GPUBOX_RETURN_IF_ERROR(check_push_width(*table_, request.dim));
  return ps_step_sums_.add(
      std::move(request),
      "client " + std::to_string(header.client_id) + " at " + std::string(origin.address),
      [this](const PsPushRequest& summed) { return ps_store_.apply(*table_, summed); });
}

void Server::Impl::expire_step_sums(Clock::time_point now) { ps_step_sums_.expire(now); }

Reply Server::Impl::dense(const FrameHeader& header, const std::vector<uint8_t>& payload,
                          const ReserveReply& reserve, const RequestOrigin& origin) {
  auto request = decode_dense_request(payload.data(), payload.size());
  if (!request.ok()) {
    return table_error_reply(
        header, request.status().with_context("request " + std::to_string(header.request_id) +
                                              " of client " + std::to_string(header.client_id)));
  }
  return dense_request(header, std::move(request).value(), reserve, origin);
}

Reply Server::Impl::dense_reread(const FrameHeader& header, const std::vector<uint8_t>& payload,
                                 const ReserveReply& reserve, const RequestOrigin& origin) {
  auto request = decode_dense_request(payload.data(), payload.size());
  if (!request.ok()) return table_error_reply(header, request.status());  // decoded before
  request->action = DenseAction::kRead;
  request->has_values = false;
  request->values = {};
  return dense_request(header, std::move(request).value(), reserve, origin);
}

Reply Server::Impl::dense_request(const FrameHeader& header, DenseRequest request,
                                  const ReserveReply& reserve, const RequestOrigin& origin) {
  // A read or an add replies its range: a read of more than one frame (whose request is small)
  // is refused here, before anything is allocated for it.
  const std::size_t reply_bytes =
      kDenseReplyHeadBytes +
      (request.action == DenseAction::kWrite ? 0 : sizeof(float) * std::size_t{request.count});
  if (reply_bytes > options_.max_payload_bytes) {
    return table_error_reply(
        header,
        Status::ResourceExhausted(
            "DENSE '" + request.name + "': a reply of " + std::to_string(reply_bytes) + " bytes (" +
            std::to_string(request.count) + " values) is over the frame limit of " +
            std::to_string(options_.max_payload_bytes) + " bytes: ask for a smaller range"));
  }
  Status st = reserve(reply_bytes);
  if (!st.ok()) return error_reply(header, st.with_context("DENSE"));  // Aborted: retry later
  std::vector<uint8_t> out;
  st =
      ps_store_.dense(DenseCaller{header.client_id, origin.connection, std::string(origin.address)},
                      std::move(request), &out);
  if (!st.ok()) return table_error_reply(header, st);
  return make_reply(header, Status::Code::kOk, std::move(out));
}

}  // namespace gpubox::table::server
