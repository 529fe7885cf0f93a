#include "table/server/remote_host_tier.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "common/hash.hpp"
#include "common/logging.hpp"
#include "table/server/auth_handshake.hpp"

namespace gpubox::table::server {
namespace {

constexpr const char* kNoEnvNote =
    "a remote host tier's servers save through their own file system, not a caller's env";

uint64_t random_client_id() {
  std::random_device rd;
  const uint64_t entropy = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const auto now =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const uint64_t id = mix64(entropy ^ fmix64(now) ^ (static_cast<uint64_t>(::getpid()) << 17));
  return id == 0 ? 1 : id;
}

// The -o that gives a trainer whose rule is `ours` the rule `theirs`, each key once with the value
// it must take, and whether it needs one. Under PaddleRec's optimizer its keys are
// hyper_parameters.optimizer.* (two fields share its learning_rate) and a field of a rule's own
// has none (table::paddlerec_rule_key): then no -o gives the trainer the server's rule.
struct RuleFix {
  std::vector<SparseRuleField> set;  // the keys some differing field needs
  bool possible = true;
};

RuleFix rule_fix(const std::vector<SparseRuleField>& theirs, const AccessorConfig& ours,
                 const std::vector<SparseRuleField>& mine) {
  RuleFix fix;
  std::vector<SparseRuleField> wanted;  // every key's value, differing or not
  for (const SparseRuleField& field : theirs) {
    const auto own = std::find_if(mine.begin(), mine.end(),
                                  [&](const SparseRuleField& f) { return f.key == field.key; });
    if (own == mine.end()) continue;
    const bool differs = own->value != field.value;
    const std::string key =
        ours.rule_from_paddlerec_optimizer ? paddlerec_rule_key(field.key) : field.key;
    if (key.empty()) {
      fix.possible = fix.possible && !differs;
      continue;
    }
    auto at = std::find_if(wanted.begin(), wanted.end(),
                           [&](const SparseRuleField& f) { return f.key == key; });
    if (at == wanted.end()) at = wanted.insert(wanted.end(), SparseRuleField{key, field.value});
    fix.possible = fix.possible && at->value == field.value;
    const bool listed = std::any_of(fix.set.begin(), fix.set.end(),
                                    [&](const SparseRuleField& f) { return f.key == key; });
    if (differs && !listed) fix.set.push_back(*at);
  }
  return fix;
}

// OK when the server at `where` steps rows under the same sparse rule as `ours`, field by field;
// else an error naming every field that differs, both values, and the -o that gives the trainer
// the server's (rule_fix). A field one side does not know (another build) is not compared.
Status check_sparse_rule(const std::string& where, const std::vector<SparseRuleField>& theirs,
                         const AccessorConfig& ours) {
  const std::vector<SparseRuleField> mine = sparse_rule_fields(ours);
  std::ostringstream differ;
  differ.precision(9);  // a float's every digit: two values that differ never print alike
  for (const SparseRuleField& field : theirs) {
    const auto own = std::find_if(mine.begin(), mine.end(),
                                  [&](const SparseRuleField& f) { return f.key == field.key; });
    if (own == mine.end() || own->value == field.value) continue;
    differ << (differ.tellp() > 0 ? "; " : "") << field.key << " " << field.value
           << " (this trainer: " << own->value << ")";
  }
  if (differ.tellp() == 0) return Status::OK();
  const RuleFix fix = rule_fix(theirs, ours, mine);
  differ << "; start the servers with the trainer's config and -o overrides";
  if (!fix.possible) {
    differ << " (this trainer's rows take its PaddleRec hyper_parameters.optimizer, whose keys "
              "cannot give it the servers' rule)";
  } else {
    differ << ", or run the trainer with the servers' values:";
    for (const SparseRuleField& key : fix.set) differ << " -o " << key.key << "=" << key.value;
    if (ours.rule_from_paddlerec_optimizer) {
      differ << " (PaddleRec's optimizer, whose values its rows take: it steps the dense network "
                "too)";
    }
  }
  return Status::InvalidArgument("server " + where +
                                 " steps the sparse rows under another rule: " + differ.str());
}

// OK when the server at `where` creates rows from `theirs`, the seed of `ours`: else a trainer
// would start a key's row (its embed_w on the server, its embedx where it is created: on a card,
// or on the server) at values that neither config gives, and that differ from the same run on an
// in-process table. The error names both seeds and the -o that gives the trainer the servers'.
Status check_seed(const std::string& where, uint64_t theirs, const AccessorConfig& ours) {
  if (theirs == ours.seed) return Status::OK();
  return Status::InvalidArgument(
      "server " + where + " creates new rows from seed " + std::to_string(theirs) +
      " (runner.seed ^ hyper_parameters.sparse_optimizer.seed of its config), this trainer from " +
      std::to_string(ours.seed) +
      ": the rows would start at other values than the trainer's config gives; start the servers "
      "with the trainer's config and -o overrides, or run the trainer with -o runner.seed=" +
      std::to_string(theirs) +
      " -o hyper_parameters.sparse_optimizer.seed=0 (runner.seed also seeds the dense network "
      "and the shuffle: to keep the trainer's, give hyper_parameters.sparse_optimizer.seed the "
      "servers' seed xor the trainer's runner.seed instead)");
}

// Calls chunk(group, positions, m) for every run of at most `chunk_rows` keys of every endpoint
// group, in order: `positions` are the run's original key positions (m of them).
template <class Chunk>
void for_each_chunk(const std::vector<std::vector<uint32_t>>& groups, std::size_t chunk_rows,
                    Chunk chunk) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& idx = groups[g];
    for (std::size_t begin = 0; begin < idx.size(); begin += chunk_rows) {
      chunk(g, idx.data() + begin, std::min(chunk_rows, idx.size() - begin));
    }
  }
}

std::vector<std::string> endpoint_names(const std::vector<Endpoint>& endpoints) {
  std::vector<std::string> names;
  for (const auto& e : endpoints) names.push_back(e.to_string());
  return names;
}

// Endpoints that receive some of `groups` (group = endpoint * lanes + lane).
std::vector<std::size_t> endpoints_of(const std::vector<std::vector<uint32_t>>& groups,
                                      std::size_t lanes) {
  std::vector<std::size_t> out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].empty() && (out.empty() || out.back() != g / lanes)) out.push_back(g / lanes);
  }
  return out;
}

std::vector<std::size_t> all_endpoints(std::size_t n) {
  std::vector<std::size_t> out(n);
  for (std::size_t e = 0; e < n; ++e) out[e] = e;
  return out;
}
}  // namespace

std::string endpoints_from_environment() {
  for (const char* name : {"PADDLE_PSERVERS_IP_PORT_LIST", "GPUBOX_PSERVERS_IP_PORT_LIST"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && value[0] != '\0') return value;
  }
  return "";
}

StatusOr<std::unique_ptr<RemoteHostTier>> RemoteHostTier::connect(RemoteHostTierOptions options) {
  auto endpoints = parse_endpoints(options.endpoints);
  if (!endpoints.ok()) return endpoints.status();
  if (options.chunk_rows == 0) return Status::InvalidArgument("chunk_rows must be positive");
  if (options.max_in_flight < 1) return Status::InvalidArgument("max_in_flight must be positive");
  if (options.max_payload_bytes < 1024) {
    return Status::InvalidArgument("max_payload_bytes must be at least 1024");
  }
  if (options.connections_per_endpoint < 1) {
    return Status::InvalidArgument("connections_per_endpoint must be positive");
  }
  if (!options.auth_token.empty()) {
    GPUBOX_RETURN_IF_ERROR(check_token_strength(options.auth_token, "the client"));
  }
  if (options.client_id == 0) options.client_id = random_client_id();
  TransportOptions t;
  t.client_id = options.client_id;
  t.auth_token = options.auth_token;
  t.deadline_s = options.deadline_s;
  t.unreachable_s = options.unreachable_s;
  t.connect_timeout_s = options.connect_timeout_s;
  t.initial_backoff_s = options.initial_backoff_s;
  t.max_backoff_s = options.max_backoff_s;
  t.max_in_flight = options.max_in_flight;
  t.max_payload_bytes = options.max_payload_bytes;
  t.keepalive = options.keepalive;
  // Never shorter than the longest call's deadline (a ranged DENSE window of two frames a
  // connection, remote_dense.cpp), by which the call itself gives up naming the server.
  t.keepalive.user_timeout_s = client_user_timeout_s(
      options.keepalive, options.deadline_s + 2.0 * options.connections_per_endpoint *
                                                  static_cast<double>(options.max_payload_bytes) /
                                                  (1 << 20));
  std::unique_ptr<RemoteHostTier> tier(
      new RemoteHostTier(std::move(*endpoints), std::move(options), std::move(t)));
  GPUBOX_RETURN_IF_ERROR(tier->check_servers());
  return tier;
}

RemoteHostTier::RemoteHostTier(std::vector<Endpoint> endpoints, RemoteHostTierOptions options,
                               TransportOptions transport_options)
    : options_(std::move(options)),
      layout_(record_layout(options_.config)),
      classes_(width_classes(options_.config)),
      identities_(endpoint_names(endpoints)),
      transport_(std::move(endpoints), [&] {
        transport_options.on_connect = [this](uint32_t e, Connection& c, Clock::time_point d) {
          return check_identity(e, c, d);
        };
        return std::move(transport_options);
      }()) {
  chunk_rows_ =
      std::min(options_.chunk_rows, rows_per_frame(transport_.options().max_payload_bytes));
}

std::size_t RemoteHostTier::rows_per_frame(uint32_t max_payload_bytes) const {
  // The biggest frame is a PUSH chunk: a small head, then a key and a row per key (a PULL
  // request, key + slot, and its reply, a row, are smaller).
  const std::size_t per_row = sizeof(uint64_t) + sizeof(int32_t) + sizeof(float) * layout_.stride();
  const std::size_t head = 64;
  return std::max<std::size_t>(1,
                               max_payload_bytes > head ? (max_payload_bytes - head) / per_row : 1);
}

void RemoteHostTier::accept_restarts() {
  identities_.accept_restarts();
  throw_if_error(check_servers().with_context("a server restarted within the job"));
}

Status RemoteHostTier::check_servers() {
  const std::size_t n = endpoint_count();
  std::vector<InfoReply> infos(n);
  GPUBOX_RETURN_IF_ERROR(run_on_every_endpoint(
      Op::kInfo, {}, [&](std::size_t index, const uint8_t* data, std::size_t bytes) -> Status {
        auto info = decode_info_reply(data, bytes);
        if (!info.ok()) return info.status();
        infos[index] = *info;
        return Status::OK();
      }));
  // A server listed twice (under one address or two: its instance id is the same) would take
  // two shares of the keys under one shard's saves.
  for (std::size_t e = 0; e < n; ++e) {
    for (std::size_t earlier = 0; earlier < e; ++earlier) {
      if (infos[earlier].instance_id != infos[e].instance_id) continue;
      const std::string where = transport_.endpoints()[e].to_string();
      return Status::InvalidArgument(
          "server " + where + " is listed twice in the servers' list (positions " +
          std::to_string(earlier) + " and " + std::to_string(e) + ", as " +
          transport_.endpoints()[earlier].to_string() + " and " + where +
          "): list each server once (PADDLE_PSERVERS_IP_PORT_LIST)");
    }
  }
  for (std::size_t e = 0; e < n; ++e) {
    const InfoReply& info = infos[e];
    const std::string where = transport_.endpoints()[e].to_string();
    if (info.optimizer_kind != static_cast<int32_t>(options_.config.optimizer.kind) ||
        info.mf_dim != layout_.mf_dim || info.stride != static_cast<uint32_t>(layout_.stride()) ||
        info.storage != static_cast<int32_t>(layout_.storage)) {
      const auto storage = [](int32_t s) {
        return std::string(name_of(kSparseStorageNames, static_cast<SparseStorage>(s)));
      };
      const auto optimizer = [](int32_t k) {  // by its config name (sparse_optimizer.class)
        for (const auto& entry : kSparseOptimizerKindNames) {
          if (static_cast<int32_t>(entry.value) == k) return std::string(entry.name);
        }
        return "#" + std::to_string(k);
      };
      return Status::InvalidArgument(
          "server " + where + " holds rows of optimizer " + optimizer(info.optimizer_kind) +
          ", mf_dim " + std::to_string(info.mf_dim) + ", sparse_storage " + storage(info.storage) +
          " (stride " + std::to_string(info.stride) + "); this trainer uses optimizer " +
          optimizer(static_cast<int32_t>(options_.config.optimizer.kind)) + ", mf_dim " +
          std::to_string(layout_.mf_dim) + ", sparse_storage " +
          storage(static_cast<int32_t>(layout_.storage)) +
          ": start the servers with the trainer's config");
    }
    GPUBOX_RETURN_IF_ERROR(check_sparse_rule(where, info.rule, options_.config));
    GPUBOX_RETURN_IF_ERROR(check_seed(where, info.seed, options_.config));
    if (info.slot_dims_digest != slot_dims_digest(options_.config)) {
      return Status::InvalidArgument(
          "server " + where +
          " gives the slots other embedx widths than this trainer "
          "(hyper_parameters.slot_dims, sparse_feature_dim): start the servers with the "
          "trainer's config");
    }
    if (info.shard_num > 1 && (info.shard_num != n || info.shard_id != e)) {
      return Status::InvalidArgument(
          "server " + where + " is shard " + std::to_string(info.shard_id) + " of " +
          std::to_string(info.shard_num) + " but is listed at position " + std::to_string(e) +
          " of " + std::to_string(n) + " endpoints");
    }
    // One started alone (shard 0 of 1) in a list of several writes saves that collide with the
    // others'.
    if (info.shard_num == 1 && n > 1) {
      return Status::InvalidArgument(
          "server " + where +
          " runs alone (shard 0 of 1: started without --shard_id/--shard_num) "
          "but is listed at position " +
          std::to_string(e) + " of " + std::to_string(n) +
          " endpoints sharing the keys: start server i of the list with --shard_id i --shard_num " +
          std::to_string(n) + " (scripts/launch.sh and run_gpubox.sh do)");
    }
    // Chunks must fit the smallest frame limit among the servers too.
    chunk_rows_ = std::min(chunk_rows_, rows_per_frame(info.max_payload_bytes));
    frame_limit_ = std::min(frame_limit_, info.max_payload_bytes);
  }
  return Status::OK();
}

Status RemoteHostTier::check_identity(uint32_t endpoint, Connection& connection,
                                      Clock::time_point deadline) {
  FrameHeader request;
  request.op = Op::kInfo;
  request.request_id = transport_.next_request_id();
  request.client_id = transport_.options().client_id;
  auto payload = connection.call(request, {}, transport_.options().max_payload_bytes, deadline);
  if (!payload.ok()) return payload.status();
  auto info = decode_info_reply(payload->data(), payload->size());
  if (!info.ok()) return info.status();
  return identities_.observe(endpoint, ServerIdentity{info->instance_id, info->generation});
}

std::vector<std::vector<uint32_t>> RemoteHostTier::split_keys(const uint64_t* keys,
                                                              std::size_t n) const {
  const auto shards = static_cast<uint32_t>(endpoint_count());
  const auto lanes = static_cast<uint32_t>(options_.connections_per_endpoint);
  std::vector<std::vector<uint32_t>> out(static_cast<std::size_t>(shards) * lanes);
  if (out.size() == 1) {
    out[0].resize(n);
    for (std::size_t i = 0; i < n; ++i) out[0][i] = static_cast<uint32_t>(i);
    return out;
  }
  for (auto& v : out) v.reserve(n / out.size() + 16);
  for (std::size_t i = 0; i < n; ++i) {
    // The lane uses another mixer than host_shard, so lanes split each endpoint's keys evenly.
    const uint32_t lane = lanes == 1 ? 0 : static_cast<uint32_t>(fmix64(keys[i]) % lanes);
    out[host_shard(keys[i], shards) * lanes + lane].push_back(static_cast<uint32_t>(i));
  }
  return out;
}

OutgoingRequest RemoteHostTier::make_group_request(Op op, std::size_t group,
                                                   const std::vector<uint8_t>& payload) {
  const auto lanes = static_cast<std::size_t>(options_.connections_per_endpoint);
  OutgoingRequest req = transport_.make_request(op, static_cast<uint32_t>(group / lanes), payload);
  req.lane = static_cast<uint32_t>(group % lanes);
  return req;
}

Status RemoteHostTier::run_on_every_endpoint(Op op, const std::vector<uint8_t>& payload,
                                             const ReplyHandler& on_reply, bool retry,
                                             double timeout_s) {
  std::vector<OutgoingRequest> requests;
  for (uint32_t e = 0; e < endpoint_count(); ++e) {
    requests.push_back(transport_.make_request(op, e, payload));
  }
  return transport_.run(op, requests, on_reply, retry, timeout_s);
}

Status RemoteHostTier::pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                            std::size_t* created) {
  return fetch_rows(Op::kPull, keys, slots, n, rows, created);
}

Status RemoteHostTier::peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
                            std::size_t* unknown) {
  return fetch_rows(Op::kPeek, keys, slots, n, rows, unknown);
}

Status RemoteHostTier::fetch_rows(Op op, const uint64_t* keys, const int32_t* slots, std::size_t n,
                                  float* rows, std::size_t* created) {
  if (created) *created = 0;
  if (n == 0) return Status::OK();
  const auto groups = split_keys(keys, n);
  std::vector<OutgoingRequest> requests;
  std::vector<const uint32_t*> chunk_index;  // original positions of each request's keys
  std::vector<uint32_t> chunk_size;
  std::vector<uint64_t> chunk_keys;
  std::vector<int32_t> chunk_slots;
  std::vector<uint8_t> payload;
  for_each_chunk(groups, chunk_rows_, [&](std::size_t g, const uint32_t* pos, std::size_t m) {
    chunk_keys.resize(m);
    chunk_slots.resize(slots ? m : 0);
    for (std::size_t j = 0; j < m; ++j) {
      chunk_keys[j] = keys[pos[j]];
      if (slots) chunk_slots[j] = slots[pos[j]];
    }
    payload.clear();
    encode_pull_request(chunk_keys.data(), slots ? chunk_slots.data() : nullptr, m, &payload);
    requests.push_back(make_group_request(op, g, payload));
    chunk_index.push_back(pos);
    chunk_size.push_back(static_cast<uint32_t>(m));
  });
  uint64_t total_created = 0;
  Status st = transport_.run(
      op, requests,
      [&](std::size_t r, const uint8_t* data, std::size_t bytes) -> Status {
        auto reply = decode_pull_reply(data, bytes, chunk_size[r], layout_, classes_);
        if (!reply.ok()) return reply.status();
        GPUBOX_RETURN_IF_ERROR(unpack_rows(reply->rows, reply->rows_bytes, chunk_size[r], layout_,
                                           classes_, chunk_index[r], rows, "PULL reply"));
        total_created += reply->created;
        return Status::OK();
      },
      /*retry=*/true, /*deadline_s=*/-1.0, options_.connections_per_endpoint);
  if (created) *created = static_cast<std::size_t>(total_created);
  return st;
}

Status RemoteHostTier::push(const uint64_t* keys, std::size_t n, const float* rows) {
  if (n == 0) return Status::OK();
  const auto stride = static_cast<uint32_t>(layout_.stride());
  // The servers refuse non-finite rows per request; checking here first keeps the whole call
  // all-or-nothing for them.
  const std::size_t bad = first_non_finite_row(rows, n, layout_);
  if (bad != n * stride) return non_finite_row_error(keys, n, rows, stride, bad);
  const auto groups = split_keys(keys, n);
  std::vector<OutgoingRequest> requests;
  std::vector<uint64_t> chunk_keys;
  std::vector<float> chunk_rows;
  std::vector<uint8_t> payload;
  for_each_chunk(groups, chunk_rows_, [&](std::size_t g, const uint32_t* pos, std::size_t m) {
    chunk_keys.resize(m);
    chunk_rows.resize(m * stride);
    for (std::size_t j = 0; j < m; ++j) {
      chunk_keys[j] = keys[pos[j]];
      std::memcpy(chunk_rows.data() + j * stride, rows + std::size_t{pos[j]} * stride,
                  sizeof(float) * stride);
    }
    payload.clear();
    encode_push_request(chunk_keys.data(), m, chunk_rows.data(), layout_, &payload);
    requests.push_back(make_group_request(Op::kPush, g, payload));
  });
  MutationScope scope(
      &identities_,
      endpoints_of(groups, static_cast<std::size_t>(options_.connections_per_endpoint)));
  return transport_.run(
      Op::kPush, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/true, /*deadline_s=*/-1.0, options_.connections_per_endpoint);
}

Status RemoteHostTier::erase(const uint64_t* keys, std::size_t n) {
  if (n == 0) return Status::OK();
  const auto groups = split_keys(keys, n);
  std::vector<OutgoingRequest> requests;
  std::vector<uint64_t> chunk_keys;
  std::vector<uint8_t> payload;
  for_each_chunk(groups, chunk_rows_, [&](std::size_t g, const uint32_t* pos, std::size_t m) {
    chunk_keys.resize(m);
    for (std::size_t j = 0; j < m; ++j) chunk_keys[j] = keys[pos[j]];
    payload.clear();
    encode_erase_request(chunk_keys.data(), m, &payload);
    requests.push_back(make_group_request(Op::kErase, g, payload));
  });
  MutationScope scope(
      &identities_,
      endpoints_of(groups, static_cast<std::size_t>(options_.connections_per_endpoint)));
  return transport_.run(
      Op::kErase, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/true, /*deadline_s=*/-1.0, options_.connections_per_endpoint);
}

StatusOr<HostTierStats> RemoteHostTier::stats() {
  HostTierStats total;
  Status st = run_on_every_endpoint(
      Op::kStats, {}, [&](std::size_t, const uint8_t* data, std::size_t bytes) -> Status {
        auto s = decode_stats_reply(data, bytes);
        if (!s.ok()) return s.status();
        total.rows_in_memory += s->rows_in_memory;
        total.rows_on_disk += s->rows_on_disk;
        total.memory_bytes += s->memory_bytes;
        return Status::OK();
      });
  if (!st.ok()) return st;
  return total;
}

StatusOr<uint64_t> RemoteHostTier::shrink(const std::function<void()>& on_progress) {
  (void)on_progress;  // the servers' PROGRESS frames count in progress_frames()
  MutationScope scope(&identities_, all_endpoints(endpoint_count()));
  std::vector<OutgoingRequest> requests;
  for (uint32_t e = 0; e < endpoint_count(); ++e) {
    requests.push_back(transport_.make_request(Op::kShrink, e, {}));
  }
  uint64_t deleted = 0;
  // A shrink of any size: bounded by the time a server reports no progress, not in all.
  Status st = transport_.run_with_progress(
      Op::kShrink, requests,
      [&](std::size_t, const uint8_t* data, std::size_t bytes) -> Status {
        auto d = decode_u64_reply(data, bytes);
        if (!d.ok()) return d.status();
        deleted += *d;
        return Status::OK();
      },
      options_.deadline_s);
  if (!st.ok()) return st;
  return deleted;
}

Status RemoteHostTier::run_sync(Op op, const std::vector<uint8_t>& payload) {
  std::vector<uint64_t> tokens(endpoint_count());
  for (std::size_t e = 0; e < tokens.size(); ++e) tokens[e] = identities_.sync_token(e);
  std::vector<uint64_t> generations(endpoint_count(), 0);
  std::vector<OutgoingRequest> requests;
  for (uint32_t e = 0; e < endpoint_count(); ++e) {
    requests.push_back(transport_.make_request(op, e, payload));
  }
  // A save or load of any size: bounded by the time a server reports no progress, not in all.
  GPUBOX_RETURN_IF_ERROR(transport_.run_with_progress(
      op, requests,
      [&](std::size_t e, const uint8_t* data, std::size_t bytes) -> Status {
        auto generation = decode_u64_reply(data, bytes);
        if (!generation.ok()) return generation.status();
        identities_.synced(e, tokens[e], *generation);
        generations[e] = *generation;
        return Status::OK();
      },
      options_.deadline_s));
  MutexLock lock(sync_mu_);
  sync_generations_ = std::move(generations);
  return Status::OK();
}

std::vector<uint64_t> RemoteHostTier::last_sync_generations() const {
  MutexLock lock(sync_mu_);
  return sync_generations_;
}

Status RemoteHostTier::save(const std::string& path, SaveKind mode, io::FileEnv* env) {
  if (env != nullptr) return Status::InvalidArgument("save " + path + ": " + kNoEnvNote);
  std::vector<uint8_t> payload;
  encode_save_request(mode, path, &payload);
  return run_sync(Op::kSave, payload);
}

Status RemoteHostTier::load(const std::string& path, io::FileEnv* env) {
  if (env != nullptr) return Status::InvalidArgument("load " + path + ": " + kNoEnvNote);
  std::vector<uint8_t> payload;
  encode_path_request(path, &payload);
  return run_sync(Op::kLoad, payload);
}

Status RemoteHostTier::barrier(const std::string& name, uint32_t parties, double timeout_s) {
  std::vector<uint8_t> payload;
  encode_barrier_request(name, parties, &payload);
  std::vector<OutgoingRequest> requests{transport_.make_request(Op::kBarrier, 0, payload)};
  return transport_.run(
      Op::kBarrier, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/false, timeout_s);
}

Status RemoteHostTier::ping(std::size_t e, double deadline_s, bool* heard) {
  if (e >= endpoint_count()) {
    return Status::InvalidArgument("ping: no endpoint " + std::to_string(e) + " of " +
                                   std::to_string(endpoint_count()));
  }
  std::vector<OutgoingRequest> requests{
      transport_.make_request(Op::kInfo, static_cast<uint32_t>(e), {})};
  return transport_.run(
      Op::kInfo, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/true, deadline_s, /*connections=*/1, heard);
}

Status RemoteHostTier::shutdown_servers() {
  return run_on_every_endpoint(
      Op::kShutdown, {}, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/false);
}

Status RemoteHostTier::end_job(uint32_t trainers) {
  std::vector<uint8_t> payload;
  encode_barrier_request(kJobEndBarrier, trainers, &payload);
  return run_on_every_endpoint(
      Op::kBarrier, payload, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/false);
}

Status RemoteHostTier::push_updates(PsUpdateKind kind, const uint64_t* keys, const int32_t* slots,
                                    std::size_t n, const float* values) {
  if (n == 0) return Status::OK();
  const auto dim = static_cast<uint32_t>(layout_.push_dim());
  const std::size_t bad = first_non_finite(values, n * dim);
  if (bad != n * dim) return non_finite_row_error(keys, n, values, dim, bad);
  const auto groups = split_keys(keys, n);
  std::vector<OutgoingRequest> requests;
  std::vector<uint64_t> chunk_keys;
  std::vector<int32_t> chunk_slots;
  std::vector<float> chunk_values;
  std::vector<uint8_t> payload;
  for_each_chunk(groups, chunk_rows_, [&](std::size_t g, const uint32_t* pos, std::size_t m) {
    gather_records(keys, slots, values, dim, pos, m, &chunk_keys, &chunk_slots, &chunk_values);
    payload.clear();
    encode_ps_push_request(kind, chunk_keys.data(), chunk_slots.data(), m, chunk_values.data(), dim,
                           &payload);
    requests.push_back(make_group_request(Op::kPsPush, g, payload));
  });
  MutationScope scope(
      &identities_,
      endpoints_of(groups, static_cast<std::size_t>(options_.connections_per_endpoint)));
  return transport_.run(
      Op::kPsPush, requests, [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); },
      /*retry=*/true, /*deadline_s=*/-1.0, options_.connections_per_endpoint);
}

}  // namespace gpubox::table::server
