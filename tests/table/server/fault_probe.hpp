// Shared by gpubox_fault_probe's probes (fault_probe.cpp, fault_probe_net.cpp): arguments, the
// verdict line, and raw protocol calls against a live gpubox_server.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "table/server/auth_handshake.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::table::server::probe {

struct Args {
  std::string probe;
  std::map<std::string, std::string> flags;
  std::string get(const std::string& name, const std::string& fallback = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
};

struct Verdict {
  bool held = false;
  std::string detail;
};
inline Verdict held(std::string d) { return {true, std::move(d)}; }
inline Verdict failed(std::string d) { return {false, std::move(d)}; }

inline Clock::time_point in_seconds(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

inline AccessorConfig probe_config() {  // what scripts/fault_check.sh starts servers with
  AccessorConfig cfg;
  cfg.optimizer.kind = SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  return cfg;
}

inline uint32_t probe_stride() {
  return static_cast<uint32_t>(
      RowLayout::make(probe_config().optimizer.kind, probe_config().mf_dim).stride());
}

// ---- raw protocol ------------------------------------------------------------------------------

inline std::vector<Connection> open_connections(const Endpoint& ep, int n) {
  std::vector<Connection> out;
  for (int i = 0; i < n; ++i) {
    auto c = Connection::open(ep, in_seconds(2));
    if (!c.ok()) break;
    out.push_back(std::move(*c));
  }
  return out;
}

inline Status call(Connection& conn, Op op, const std::vector<uint8_t>& payload, uint64_t id = 1,
                   uint64_t client = 1, std::vector<uint8_t>* reply = nullptr) {
  FrameHeader h;
  h.op = op;
  h.request_id = id;
  h.client_id = client;
  auto r = conn.call(h, payload, kDefaultMaxPayloadBytes, in_seconds(5));
  if (!r.ok()) return r.status();
  if (reply) *reply = std::move(*r);
  return Status::OK();
}

// AUTH as `client` (nothing without a token: the connection's first frame then binds its id).
inline Status authenticate(Connection& conn, const std::string& token, uint64_t client = 1) {
  if (token.empty()) return Status::OK();
  std::vector<uint8_t> challenge;
  GPUBOX_RETURN_IF_ERROR(call(conn, Op::kAuth, {}, 1, client, &challenge));
  auto nonce = decode_auth_challenge(challenge.data(), challenge.size());
  if (!nonce.ok()) return nonce.status();
  const AuthProof proof = auth_proof(token, *nonce, client);
  return call(conn, Op::kAuthProof, std::vector<uint8_t>(proof.begin(), proof.end()), 2, client);
}

// A served request on a fresh connection: STATS answered before `seconds`.
inline Status served(const Endpoint& ep, const std::string& token, double seconds) {
  auto c = Connection::open(ep, in_seconds(seconds));
  if (!c.ok()) return c.status();
  GPUBOX_RETURN_IF_ERROR(authenticate(*c, token));
  FrameHeader h;
  h.op = Op::kStats;
  h.request_id = 1;
  h.client_id = 1;  // the id authenticate() proved: a connection speaks for one client
  auto r = c->call(h, {}, kDefaultMaxPayloadBytes, in_seconds(seconds));
  return r.ok() ? Status::OK() : r.status();
}

inline std::vector<uint8_t> frame_bytes(Op op, const std::vector<uint8_t>& payload,
                                        uint64_t id = 1) {
  FrameHeader h;
  h.op = op;
  h.request_id = id;
  return encode_frame(h, payload);
}

inline std::vector<uint8_t> push_payload(uint64_t key, float value, uint32_t stride) {
  std::vector<float> row(stride, value);
  std::vector<uint8_t> p;
  encode_push_request(&key, 1, row.data(), stride, &p);
  return p;
}

// ---- fault_probe_net.cpp: issue #30's network probes --------------------------------------------
Verdict drip(const Endpoint& ep, const Args& a);
Verdict auth_flood(const Endpoint& ep, const Args& a);
Verdict budget_starve(const Endpoint& ep, const Args& a);
Verdict token_guess(const Endpoint& ep, const Args& a);
Verdict auth_replay(const Endpoint& ep, const Args& a);
Verdict cap_message(const Endpoint& ep, const Args& a);
// ---- issue 32: a connection speaks for one client id -------------------------------------------
Verdict client_ids(const Endpoint& ep, const Args& a);
Verdict rotating_ids(const Endpoint& ep, const Args& a);

}  // namespace gpubox::table::server::probe
