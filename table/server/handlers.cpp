// What each op does to the table (Server::Impl::apply and one function per op), and the retry
// cache in front of the mutations.
#include <algorithm>
#include <optional>
#include <sstream>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "table/server/model_path.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/server_impl.hpp"

namespace gpubox::table::server {
namespace {

// A DENSE read changes nothing (or creates a table from its values, which a retry then reads):
// it skips the retry cache, which a dense table's ranges would otherwise fill, pushing out the
// replies that keep a retried PUSH or add from being applied twice.
bool is_mutation(Op op, const std::vector<uint8_t>& payload) {
  if (op == Op::kDense) {
    return payload.empty() || payload[0] != static_cast<uint8_t>(DenseAction::kRead);
  }
  return op == Op::kPush || op == Op::kErase || op == Op::kShrink || op == Op::kSave ||
         op == Op::kLoad || op == Op::kPsPush;
}

// A DENSE add: its retry-cache entry holds no values (an add range's reply is up to a frame, and
// two of them would push out every other remembered reply); a retry reads the range again.
bool is_dense_add(Op op, const std::vector<uint8_t>& payload) {
  return op == Op::kDense && !payload.empty() &&
         payload[0] == static_cast<uint8_t>(DenseAction::kAdd);
}

Reply u64_reply(const FrameHeader& header, uint64_t value) {
  std::vector<uint8_t> out;
  encode_u64_reply(value, &out);
  return make_reply(header, Status::Code::kOk, std::move(out));
}

// A bulk call (SAVE, LOAD, SHRINK) frees what it built (a file's rows, the rows it dropped) all at
// once: handed back to the kernel, the heap otherwise keeps it (common/malloc_reuse.hpp).
Reply after_bulk_call(Reply reply) {
  return_freed_memory();
  return reply;
}

}  // namespace

Reply table_error_reply(const FrameHeader& request, const Status& status) {
  const std::string context = op_name(request.op);
  if (status.code() == Status::Code::kAborted) {
    return error_reply(request, Status::Internal(context + ": " + status.to_string()));
  }
  return error_reply(request, status.with_context(context));
}

void Server::Impl::note_ranged_write_retry(const FrameHeader& header,
                                           const std::vector<uint8_t>& payload,
                                           const RequestOrigin& origin) {
  if (header.op != Op::kDense || payload.empty() ||
      payload[0] != static_cast<uint8_t>(DenseAction::kWrite)) {
    return;
  }
  StatusOr<DenseRequest> request = decode_dense_request(payload.data(), payload.size());
  if (!request.ok() || request->whole()) return;  // remembered, so it decoded when first applied
  ps_store_.carried_by(
      DenseCaller{header.client_id, origin.connection, std::string(origin.address)},
      request->write_id);
}

namespace {

// "client C at ADDRESS" (without a token the client id is the client's own word: the address
// says where it came from).
std::string who(const FrameHeader& header, const RequestOrigin& origin) {
  return "client " + std::to_string(header.client_id) + " at " + std::string(origin.address);
}

}  // namespace

Reply Server::Impl::handle(const FrameHeader& header, const std::vector<uint8_t>& payload,
                           const ReserveReply& reserve, const RequestOrigin& origin) {
  if (!is_mutation(header.op, payload)) return apply(header, payload, reserve, origin);
  // header.client_id is the connection's bound client (session.hpp): one connection cannot reach
  // another client's remembered replies, nor push them out beyond its own share.
  const RequestKey key{header.client_id, header.request_id, static_cast<uint16_t>(header.op),
                       request_digest(payload.data(), payload.size())};
  CachedReply cached;
  switch (window_.begin(key, Clock::now(), &cached)) {
    case RequestWindow::Begin::kDone:
      duplicates.fetch_add(1, std::memory_order_relaxed);
      if (is_dense_add(header.op, payload)) {
        return dense_reread(header, payload, reserve, origin);
      }
      note_ranged_write_retry(header, payload, origin);
      return make_reply(header, cached.status, std::move(cached.payload));
    case RequestWindow::Begin::kInProgress:
      duplicates.fetch_add(1, std::memory_order_relaxed);
      // Aborted = "retry later": the client's transport retries it after a backoff.
      return error_reply(header, Status::Aborted("request " + std::to_string(header.request_id) +
                                                 " is still being applied; retry"));
    case RequestWindow::Begin::kNew:
      break;
  }
  // Ends the entry begun above, forgotten, on every exit that does not finish it below (apply
  // threw): left in progress, every retry of the request would be answered "retry later".
  struct Unfinished {
    RequestWindow* window;
    const RequestKey* key;
    bool finished = false;
    ~Unfinished() {
      if (!finished) window->finish(*key, Clock::now(), CachedReply{}, false);
    }
  } unfinished{&window_, &key};
  Reply reply = apply(header, payload, reserve, origin);
  // Only a success must not repeat: a refused or failed mutation is applied again on retry.
  const bool remember = reply.status == Status::Code::kOk;
  if (remember) {
    cached.status = reply.status;
    // A DENSE add's record: its reply's head (offset, count), no values (is_dense_add).
    const std::size_t kept = is_dense_add(header.op, payload)
                                 ? std::min(reply.frame.size(), kHeaderBytes + kDenseReplyHeadBytes)
                                 : reply.frame.size();
    cached.payload.assign(reply.frame.begin() + kHeaderBytes, reply.frame.begin() + kept);
  }
  unfinished.finished = true;
  window_.finish(key, Clock::now(), std::move(cached), remember);
  return reply;
}

Reply Server::Impl::apply(const FrameHeader& header, const std::vector<uint8_t>& payload,
                          const ReserveReply& reserve, const RequestOrigin& origin) {
  switch (header.op) {
    case Op::kInfo:
      return info(header);
    case Op::kPull:
    case Op::kPeek:
      return pull(header, payload, reserve);
    case Op::kPush:
      return push(header, payload);
    case Op::kErase:
      return erase(header, payload);
    case Op::kSave:
      return after_bulk_call(save(header, payload, origin));
    case Op::kLoad:
      return after_bulk_call(load(header, payload, origin));
    case Op::kShrink:
      return after_bulk_call(shrink(header, payload, origin));
    case Op::kStats:
      return stats(header);
    case Op::kShutdown:
      return shutdown(header, origin);
    case Op::kPsPush:
      return ps_push(header, payload, origin);
    case Op::kDense:
      return dense(header, payload, reserve, origin);
    case Op::kAuth:
    case Op::kAuthProof:
    case Op::kBarrier:
    case Op::kProgress:  // refused by the session: a server's frame
      break;             // handled by the session
  }
  return table_error_reply(header, Status::Internal("op not dispatched"));
}

Status Server::Impl::check_keys(const uint64_t* keys, std::size_t n) const {
  if (options_.shard_num <= 1) return Status::OK();
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t shard = host_shard(keys[i], options_.shard_num);
    if (shard != options_.shard_id) {
      std::ostringstream msg;
      msg << "key " << keys[i] << " belongs to shard " << shard << " of " << options_.shard_num
          << ", not to this server (shard " << options_.shard_id
          << "): the client's endpoint list does not match the servers' --shard_id order";
      return Status::InvalidArgument(msg.str());
    }
  }
  return Status::OK();
}

Status Server::Impl::admit_new_rows(const uint64_t* keys, const int32_t* slots, std::size_t n) {
  const std::size_t limit = options_.memory_limit_bytes;
  if (limit == 0 || n == 0) return Status::OK();
  auto stats = table_->stats();
  if (!stats.ok()) return stats.status();
  const auto stride = static_cast<std::size_t>(table_->layout().stride());
  // What one more row costs: its floats, its epoch and its index slots at about half fill, or
  // the table's own average once it holds enough rows for the average to mean something.
  double per_row = static_cast<double>(stride * sizeof(float) + 32);
  if (stats->rows_in_memory >= 65536) {
    per_row = std::max(per_row, static_cast<double>(stats->memory_bytes) /
                                    static_cast<double>(stats->rows_in_memory));
  }
  const double room =
      stats->memory_bytes < limit ? static_cast<double>(limit - stats->memory_bytes) : 0.0;
  if (static_cast<double>(n) * per_row <= room) return Status::OK();  // fits if all were new
  // Near the limit: count the keys the table does not hold (peek creates nothing).
  std::vector<float> scratch(n * stride);
  std::size_t unknown = 0;
  GPUBOX_RETURN_IF_ERROR(table_->peek(keys, slots, n, scratch.data(), &unknown));
  if (static_cast<double>(unknown) * per_row <= room) return Status::OK();
  std::ostringstream msg;
  msg << "server memory limit: the table holds " << stats->rows_in_memory << " rows in "
      << (stats->memory_bytes >> 20) << " MiB of its " << (limit >> 20)
      << " MiB (gpubox_server --memory_mb); this request would create " << unknown
      << " more rows: refused, nothing created (rows it holds are still served and updated; "
         "raise --memory_mb, give the server a disk tier with --rocksdb_dir, or shrink the "
         "table)";
  return Status::ResourceExhausted(msg.str());
}

Reply Server::Impl::info(const FrameHeader& header) {
  InfoReply info;
  info.shard_id = options_.shard_id;
  info.shard_num = options_.shard_num;
  info.optimizer_kind = static_cast<int32_t>(table_->config().optimizer.kind);
  info.mf_dim = table_->layout().mf_dim;
  info.stride = static_cast<uint32_t>(table_->layout().stride());
  // What a client may send: the frame limit, or less when a connection may buffer less.
  info.max_payload_bytes = static_cast<uint32_t>(
      std::min<std::size_t>(options_.max_payload_bytes, connection_buffer_limit(true)));
  info.instance_id = instance_id_;
  info.generation = generation_.load();
  info.storage = static_cast<int32_t>(table_->layout().storage);
  info.slot_dims_digest = table::slot_dims_digest(table_->config());
  info.seed = table_->config().seed;
  info.rule = table::sparse_rule_fields(table_->config());
  std::vector<uint8_t> out;
  encode_info_reply(info, &out);
  return make_reply(header, Status::Code::kOk, std::move(out));
}

Reply Server::Impl::pull(const FrameHeader& header, const std::vector<uint8_t>& payload,
                         const ReserveReply& reserve) {
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  auto req = decode_pull_request(payload.data(), payload.size());
  if (!req.ok()) return fail(req.status());
  Status st = check_keys(req->keys.data(), req->keys.size());
  if (st.ok() && header.op == Op::kPull) {
    st = admit_new_rows(req->keys.data(), req->slots.empty() ? nullptr : req->slots.data(),
                        req->keys.size());
  }
  if (!st.ok()) return fail(st);
  const uint32_t stride = static_cast<uint32_t>(table_->layout().stride());
  const std::size_t bytes = pull_reply_bytes(req->keys.size(), stride);
  if (bytes > options_.max_payload_bytes) {
    return fail(Status::ResourceExhausted("reply of " + std::to_string(bytes) +
                                          " bytes is over the frame limit"));
  }
  st = reserve(bytes);
  if (!st.ok()) return error_reply(header, st.with_context("PULL"));  // Aborted: retry later
  // The rows are written in place into the reply frame (48-byte offset: float-aligned).
  FrameHeader h = header;
  h.response = true;
  h.payload_bytes = static_cast<uint32_t>(bytes);
  Reply reply;
  reply.frame.resize(kHeaderBytes + bytes);
  std::size_t created = 0;
  float* rows =
      reinterpret_cast<float*>(reply.frame.data() + kHeaderBytes + pull_reply_rows_offset());
  const int32_t* slots = req->slots.empty() ? nullptr : req->slots.data();
  st = header.op == Op::kPeek
           ? table_->peek(req->keys.data(), slots, req->keys.size(), rows, &created)
           : table_->pull(req->keys.data(), slots, req->keys.size(), rows, &created);
  if (!st.ok()) return fail(st);
  // Each row at its own width (protocol 4): packed in place, the frame cut to what they take.
  const table::RowLayout& record = table_->layout();
  if (record.mixed_widths) {
    const std::size_t floats = pack_rows(rows, req->keys.size(), record, rows);
    h.payload_bytes = static_cast<uint32_t>(pull_reply_rows_offset() + floats * sizeof(float));
    reply.frame.resize(kHeaderBytes + h.payload_bytes);
  }
  encode_header(h, reply.frame.data());
  encode_pull_reply_head(req->keys.size(), stride, created, reply.frame.data() + kHeaderBytes);
  rows_pulled.fetch_add(req->keys.size(), std::memory_order_relaxed);
  return reply;
}

Reply Server::Impl::push(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  auto req = decode_push_request(payload.data(), payload.size(), table_->layout(),
                                 width_classes(table_->config()));
  if (!req.ok()) {
    return fail(req.status().with_context("request " + std::to_string(header.request_id) +
                                          " of client " + std::to_string(header.client_id)));
  }
  const auto stride = static_cast<uint32_t>(table_->layout().stride());
  if (!req->keys.empty() && req->stride != stride) {
    return fail(Status::InvalidArgument("rows of stride " + std::to_string(req->stride) +
                                        " pushed to a table of stride " + std::to_string(stride)));
  }
  // A non-finite value would be served back to every trainer: refuse the whole request.
  const std::size_t bad =
      first_non_finite_row(req->rows.data(), req->keys.size(), table_->layout());
  if (bad != req->rows.size()) {
    return fail(
        non_finite_row_error(req->keys.data(), req->keys.size(), req->rows.data(), stride, bad));
  }
  Status st = check_keys(req->keys.data(), req->keys.size());
  if (st.ok()) st = admit_new_rows(req->keys.data(), nullptr, req->keys.size());
  if (st.ok()) st = table_->push(req->keys.data(), req->keys.size(), req->rows.data());
  if (!st.ok()) return fail(st);
  rows_pushed.fetch_add(req->keys.size(), std::memory_order_relaxed);
  return make_reply(header, Status::Code::kOk, {});
}

Reply Server::Impl::erase(const FrameHeader& header, const std::vector<uint8_t>& payload) {
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  auto keys = decode_erase_request(payload.data(), payload.size());
  if (!keys.ok()) return fail(keys.status());
  Status st = check_keys(keys->data(), keys->size());
  if (st.ok()) st = table_->erase(keys->data(), keys->size());
  if (!st.ok()) return fail(st);
  return make_reply(header, Status::Code::kOk, {});
}

Reply Server::Impl::save(const FrameHeader& header, const std::vector<uint8_t>& payload,
                         const RequestOrigin& origin) {
  io::FileWorkProgress* const progress = origin.progress;
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  auto req = decode_save_request(payload.data(), payload.size());
  if (!req.ok()) return fail(req.status());
  auto path = resolve_model_path(options_, req->path);
  if (!path.ok()) return fail(path.status());
  if (data_env_ == nullptr) return fail(data_env_error_);
  std::optional<io::ProgressEnv> counted;
  io::FileEnv* env = data_env_.get();
  if (progress != nullptr) env = &counted.emplace(env, progress);
  Status st = table_->save(*path, req->mode, env);
  if (!st.ok()) return fail(st);
  const uint64_t generation = model_generation(data_env_.get(), *path);
  GPUBOX_LOG(INFO) << "gpubox_server: saved to " << data_env_->root() << "/" << *path
                   << " (generation " << std::hex << generation << std::dec << "), asked by "
                   << who(header, origin);
  return u64_reply(header, generation);
}

Reply Server::Impl::load(const FrameHeader& header, const std::vector<uint8_t>& payload,
                         const RequestOrigin& origin) {
  io::FileWorkProgress* const progress = origin.progress;
  const auto fail = [&](const Status& st) { return table_error_reply(header, st); };
  auto req = decode_path_request(payload.data(), payload.size());
  if (!req.ok()) return fail(req.status());
  auto path = resolve_model_path(options_, *req);
  if (!path.ok()) return fail(path.status());
  if (data_env_ == nullptr) return fail(data_env_error_);
  std::optional<io::ProgressEnv> counted;
  io::FileEnv* env = data_env_.get();
  if (progress != nullptr) env = &counted.emplace(env, progress);
  Status st = table_->load(*path, env);
  if (!st.ok()) return fail(st);
  const uint64_t generation = model_generation(data_env_.get(), *path);
  generation_.store(generation);
  GPUBOX_LOG(INFO) << "gpubox_server: loaded " << data_env_->root() << "/" << *path
                   << " (generation " << std::hex << generation << std::dec
                   << ") over the table, asked by " << who(header, origin);
  return u64_reply(header, generation);
}

Reply Server::Impl::shrink(const FrameHeader& header, const std::vector<uint8_t>& payload,
                           const RequestOrigin& origin) {
  io::FileWorkProgress* const progress = origin.progress;
  if (!payload.empty()) {
    return table_error_reply(header, Status::Corruption("SHRINK request carries a payload"));
  }
  // Each shard (or bounded chunk of a shard's rows) the table finished is a step of the worker.
  std::function<void()> on_progress;
  if (progress != nullptr) on_progress = [progress] { progress->step(); };
  auto deleted = table_->shrink(on_progress);
  if (!deleted.ok()) return table_error_reply(header, deleted.status());
  GPUBOX_LOG(INFO) << "gpubox_server: shrank the table (" << *deleted << " rows deleted), asked by "
                   << who(header, origin);
  return u64_reply(header, *deleted);
}

Reply Server::Impl::stats(const FrameHeader& header) {
  auto stats = table_->stats();
  if (!stats.ok()) return table_error_reply(header, stats.status());
  std::vector<uint8_t> out;
  encode_stats_reply(*stats, &out);
  return make_reply(header, Status::Code::kOk, std::move(out));
}

Reply Server::Impl::shutdown(const FrameHeader& header, const RequestOrigin& origin) {
  GPUBOX_LOG(INFO) << "gpubox_server: SHUTDOWN requested by " << who(header, origin);
  Reply reply = make_reply(header, Status::Code::kOk, {});
  reply.stop_server_after = true;
  return reply;
}

}  // namespace gpubox::table::server
