// gpubox_fault_probe's probes of issue #30's network items: slots held by dripping clients and by
// an unauthenticated flood, the in-flight budget starved by slow senders, token guesses and
// replays, and what a client reads when the server is at its connection cap. Every loop is
// bounded (a few hundred connections, a few seconds).
#include <sys/socket.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "tests/table/server/fault_probe.hpp"
#include "tests/table/server/process_probe.hpp"

namespace gpubox::table::server::probe {
namespace {

using std::chrono::milliseconds;
using testing::closed_by_peer;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<uint8_t> header_bytes(Op op, uint32_t payload_bytes) {
  FrameHeader h;
  h.op = op;
  h.request_id = 1;
  h.payload_bytes = payload_bytes;
  std::vector<uint8_t> out(kHeaderBytes);
  encode_header(h, out.data());
  return out;
}

// A DENSE write range of table `name` (8 values): the half at `offset` (0 or 4) of write
// `write_id`.
std::vector<uint8_t> half_write(const std::string& name, uint32_t offset, uint64_t write_id) {
  const std::vector<float> four{1.0f, 2.0f, 3.0f, 4.0f};
  DenseRequest head;
  head.action = DenseAction::kWrite;
  head.name = name;
  head.total = 8;
  head.offset = offset;
  head.count = 4;
  head.write_id = write_id;
  head.has_values = true;
  std::vector<uint8_t> payload;
  encode_dense_range(head, four.data(), &payload);
  return payload;
}

bool log_has(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str().find(what) != std::string::npos;
}

RemoteHostTierOptions client_options(const Endpoint& ep, const std::string& token) {
  RemoteHostTierOptions o;
  o.endpoints = ep.to_string();
  o.config = probe_config();
  o.auth_token = token;
  o.deadline_s = 1.0;
  o.connect_timeout_s = 0.5;
  o.connections_per_endpoint = 1;
  return o;
}

uint64_t rows_held(const Endpoint& ep, const std::string& token) {
  auto c = Connection::open(ep, in_seconds(2));
  if (!c.ok() || !authenticate(*c, token).ok()) return 0;
  std::vector<uint8_t> reply;
  if (!call(*c, Op::kStats, {}, 9, 1, &reply).ok()) return 0;
  auto stats = decode_stats_reply(reply.data(), reply.size());
  return stats.ok() ? stats->rows_in_memory : 0;
}

}  // namespace

// 30.2: 40 clients drip a byte per 200 ms into PUSH frames announcing 64 MiB: each is cut at its
// frame deadline (the server's --frame_deadline_s), and the server serves afterwards.
Verdict drip(const Endpoint& ep, const Args& a) {
  const double grace = std::stod(a.get("frame_deadline_s", "1"));
  auto conns = open_connections(ep, 40);
  const auto head = header_bytes(Op::kPush, kDefaultMaxPayloadBytes);
  for (auto& c : conns) (void)c.send_all(head.data(), head.size(), in_seconds(2));
  const auto start = Clock::now();
  std::vector<char> open(conns.size(), 1);
  std::size_t still = conns.size();
  double last_cut = 0;
  while (still > 0 && seconds_since(start) < grace + 5) {
    for (std::size_t i = 0; i < conns.size(); ++i) {
      if (!open[i]) continue;
      const uint8_t byte = 0x5a;
      if (::send(conns[i].fd(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1 ||
          closed_by_peer(conns[i].fd(), 0.0)) {
        open[i] = 0;
        --still;
        last_cut = seconds_since(start);
      }
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
  std::ostringstream d;
  d << conns.size()
    << " clients dripping a byte per 200 ms into 64 MiB PUSH frames: " << conns.size() - still
    << " cut, the last after " << last_cut << " s (--frame_deadline_s " << grace << ")";
  if (conns.size() < 40 || still > 0) return failed(d.str());
  const Status st = served(ep, "", 3.0);
  if (!st.ok()) return failed(d.str() + "; not served afterwards: " + st.to_string());
  return held(d.str() + "; served afterwards");
}

// 30.2: 200 connections that never authenticate against --max_connections 32 (token server):
// the oldest are evicted for the new, and a client that authenticates is served meanwhile.
Verdict auth_flood(const Endpoint& ep, const Args& a) {
  const std::string token = a.get("token");
  auto flood = open_connections(ep, 200);
  std::this_thread::sleep_for(milliseconds(300));
  const auto start = Clock::now();
  const Status st = served(ep, token, 3.0);
  const double took = seconds_since(start);
  int evicted = 0;
  for (auto& c : flood) evicted += closed_by_peer(c.fd(), 0.0) ? 1 : 0;
  std::ostringstream d;
  d << flood.size() << " unauthenticated connections held open: " << evicted
    << " evicted or refused; an authenticating client ";
  if (!st.ok()) return failed(d.str() + "was not served: " + st.to_string());
  d << "served in " << took << " s";
  if (!log_has(a.get("log"), "evicted") && evicted == 0) return failed(d.str() + " (no eviction)");
  return held(d.str());
}

// 30.3: 17 slow senders announce 64 MiB PUSH frames, send just under 1 MiB and stall against
// --max_inflight_mb 4 (3 of them then hold 3 MiB, the most big holders may take is 3.5 MiB):
// small requests are served (the reserve), a big PUSH (~1 MB) is refused with "server busy:
// in-flight budget" (and logged), and served once the senders were cut at their deadline.
Verdict budget_starve(const Endpoint& ep, const Args& a) {
  const double grace = std::stod(a.get("frame_deadline_s", "1"));
  auto slow = open_connections(ep, 17);
  const auto head = header_bytes(Op::kPush, kDefaultMaxPayloadBytes);
  const std::vector<uint8_t> some((1 << 20) - 100, 0x5a);  // a buffer step is 1 MiB then
  for (auto& c : slow) {
    (void)c.send_all(head.data(), head.size(), in_seconds(2));
    (void)c.send_all(some.data(), some.size(), in_seconds(2));
  }
  const auto stalled_at = Clock::now();
  std::this_thread::sleep_for(milliseconds(200));
  auto small = RemoteHostTier::connect(client_options(ep, ""));
  if (!small.ok()) return failed("a client could not connect: " + small.status().to_string());
  std::vector<uint64_t> keys(16384);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1 + i;
  std::vector<float> rows(keys.size() * (*small)->layout().stride(), 0.5f);
  Status st = (*small)->push(keys.data(), 64, rows.data());
  if (!st.ok())
    return failed("a 64-row PUSH was refused while slow senders held the budget: " +
                  st.to_string());
  auto options = client_options(ep, "");
  options.chunk_rows = keys.size();  // one frame of ~1 MB
  options.deadline_s = 0.3;
  auto big = RemoteHostTier::connect(options);
  if (!big.ok()) return failed("a client could not connect: " + big.status().to_string());
  st = (*big)->push(keys.data(), keys.size(), rows.data());
  std::ostringstream d;
  d << "17 slow senders of 64 MiB frames: a 64-row PUSH served; a 16384-row PUSH refused: ";
  if (st.ok() || st.message().find("server busy: in-flight budget") == std::string::npos) {
    return failed(d.str() + "no, " + st.to_string());
  }
  d << "\"server busy: in-flight budget\"";
  if (!log_has(a.get("log"), "server busy: in-flight budget")) {
    return failed(d.str() + ", but the server logged nothing");
  }
  Status later;
  while (!(later = (*big)->push(keys.data(), keys.size(), rows.data())).ok() &&
         seconds_since(stalled_at) < grace + 5) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (!later.ok()) return failed(d.str() + "; still refused: " + later.to_string());
  d << " (logged); served " << seconds_since(stalled_at) << " s after the senders stalled";
  return held(d.str());
}

// 30.8: wrong tokens as fast as the server answers, for 3 s: slowed per host and logged.
Verdict token_guess(const Endpoint& ep, const Args& a) {
  std::string wrong = a.get("token");
  if (wrong.empty()) return failed("needs --token");
  wrong[0] = wrong[0] == 'x' ? 'y' : 'x';
  const auto start = Clock::now();
  int guesses = 0;
  while (seconds_since(start) < 3.0) {
    auto c = Connection::open(ep, in_seconds(2));
    if (!c.ok()) return failed("cannot connect: " + c.status().to_string());
    // Refused as wrong, or unchecked while its host backs off past --auth_timeout_s.
    const Status st = authenticate(*c, wrong);
    if (st.code() != Status::Code::kPermissionDenied &&
        !(st.code() == Status::Code::kUnavailable &&
          st.message().find("too many wrong AUTH proofs") != std::string::npos)) {
      return failed("a wrong token was not refused: " + st.to_string());
    }
    ++guesses;
  }
  std::ostringstream d;
  d << guesses << " wrong tokens in " << seconds_since(start) << " s from one address";
  if (guesses > 12) return failed(d.str() + " (not slowed)");
  if (!log_has(a.get("log"), "wrong AUTH proof from 127.0.0.1")) {
    return failed(d.str() + "; not logged");
  }
  return held(d.str() + " (slowed, logged)");
}

// 30.8: an AUTH exchange and PUSH captured on one connection, replayed on another: refused.
Verdict auth_replay(const Endpoint& ep, const Args& a) {
  const std::string token = a.get("token");
  auto first = Connection::open(ep, in_seconds(2));
  if (!first.ok()) return failed("cannot connect");
  std::vector<uint8_t> challenge;
  if (!call(*first, Op::kAuth, {}, 1, 5, &challenge).ok()) return failed("AUTH refused");
  auto nonce = decode_auth_challenge(challenge.data(), challenge.size());
  if (!nonce.ok()) return failed(nonce.status().to_string());
  const AuthProof proof = auth_proof(token, *nonce, 5);
  const std::vector<uint8_t> proof_bytes(proof.begin(), proof.end());
  if (!call(*first, Op::kAuthProof, proof_bytes, 2, 5).ok())
    return failed("the right proof refused");
  const auto push = push_payload(777001, 0.5f, probe_stride());
  if (!call(*first, Op::kPush, push, 3, 5).ok()) return failed("PUSH refused");
  const uint64_t rows0 = rows_held(ep, token);

  auto replay = Connection::open(ep, in_seconds(2));
  if (!replay.ok()) return failed("cannot connect");
  (void)call(*replay, Op::kAuth, {}, 1, 5, &challenge);
  const Status st = call(*replay, Op::kAuthProof, proof_bytes, 2, 5);
  const auto other = push_payload(777002, 0.5f, probe_stride());
  const bool pushed = call(*replay, Op::kPush, other, 4, 5).ok();
  const uint64_t rows1 = rows_held(ep, token);
  if (st.ok() || pushed || rows1 != rows0) {
    return failed("a replayed proof was accepted (" + st.to_string() + ")");
  }
  return held("a captured AUTH_PROOF replayed on a new connection: " + st.to_string() +
              "; its PUSH not applied");
}

// 30.10: at the connection cap a client reads "server at its connection cap (N)", not a reset.
// The cap is held by connections in a call (a PUSH frame begun), which never give their slots
// (idle ones of a client holding more than its share would: connection_share.hpp).
Verdict cap_message(const Endpoint& ep, const Args&) {
  auto held_open = open_connections(ep, 400);
  const auto head = header_bytes(Op::kPush, 1000);
  for (auto& c : held_open) (void)c.send_all(head.data(), head.size(), in_seconds(2));
  std::this_thread::sleep_for(milliseconds(300));
  auto client = RemoteHostTier::connect(client_options(ep, ""));
  if (client.ok()) return failed("a client connected although 400 connections were open");
  const std::string message = client.status().message();
  const auto at = message.find("server at its connection cap (");
  if (at == std::string::npos) return failed("the client read: " + message);
  return held("the client read \"" + message.substr(at, message.find(')', at) + 1 - at) + "\"");
}

// 32: a connection speaks for one client id. A frame in another client's name is refused (the
// reply and the log name the peer and both ids) and its connection closed; a hostile client's
// ranged DENSE writes in its own name, however many, leave another client's held write whole.
Verdict client_ids(const Endpoint& ep, const Args& a) {
  const std::string token = a.get("token");
  const auto connect_as = [&](uint64_t client) -> StatusOr<Connection> {
    auto c = Connection::open(ep, in_seconds(2));
    if (!c.ok()) return c.status();
    // Without a token the first frame binds the id.
    const Status st =
        token.empty() ? call(*c, Op::kStats, {}, 1, client) : authenticate(*c, token, client);
    if (!st.ok()) return st;
    return c;
  };
  const auto write_range = [](uint32_t offset, uint64_t write_id) {
    return half_write("probe_client_ids", offset, write_id);
  };
  constexpr uint64_t kVictim = 3201, kHostile = 3202;
  auto victim = connect_as(kVictim);
  auto hostile = connect_as(kHostile);
  if (!victim.ok() || !hostile.ok()) return failed("cannot connect and bind");
  if (!call(*victim, Op::kDense, write_range(0, 1), 10, kVictim).ok()) {
    return failed("the victim's first range was refused");
  }
  std::this_thread::sleep_for(milliseconds(2100));  // the connection log's interval: a fresh line
  const Status forged = call(*hostile, Op::kDense, write_range(0, 99), 11, kVictim);
  const std::string m = forged.message();
  if (forged.code() != Status::Code::kPermissionDenied ||
      m.find("carries client id " + std::to_string(kVictim)) == std::string::npos ||
      m.find("bound to client id " + std::to_string(kHostile)) == std::string::npos ||
      m.find("127.0.0.1:") == std::string::npos) {
    return failed("a frame in another client's name: " + forged.to_string());
  }
  if (!closed_by_peer(hostile->fd(), 3.0)) return failed("the switching connection stayed open");
  if (!log_has(a.get("log"), "bound to client id " + std::to_string(kHostile))) {
    return failed("the refusal is not in the server's log");
  }
  auto own = connect_as(kHostile);
  if (!own.ok()) return failed("cannot connect again");
  constexpr uint64_t kWrites = 200;
  for (uint64_t w = 1; w <= kWrites; ++w) {
    if (!call(*own, Op::kDense, write_range(0, w), 100 + w, kHostile).ok()) {
      return failed("the hostile client's own write " + std::to_string(w) + " was refused");
    }
  }
  std::vector<uint8_t> reply;
  const Status last = call(*victim, Op::kDense, write_range(4, 1), 12, kVictim, &reply);
  auto head = decode_dense_reply(reply.data(), reply.size(), 4, 0);
  if (!last.ok() || !head.ok() || !head->committed) {
    return failed("the victim's held write was dropped: " + last.to_string());
  }
  const std::size_t from = m.find("carries");
  return held("refused: \"" + m.substr(from, m.find(" (", from) - from) + "\", closed; " +
              std::to_string(kWrites) +
              " writes in the hostile client's own name left the victim's held write whole");
}

// 32: a local client taking a new client id and a new loopback address (127.0.0.2, 127.0.0.3, ...)
// on every connection, holding its writes open without finishing them, is still one host (every
// loopback address is one, share_address): it holds at most its host's share of the ranged writes
// (its extra writes take the idlest slots of its own greediest ids until all hold alike, then are
// refused naming the peer, its host and the limit, logged), and trainers of its own host, at
// 127.0.0.1 and at another of its addresses, write at once while it holds them, and after it left.
Verdict rotating_ids(const Endpoint& ep, const Args& a) {
  const auto bound = [&](const char* source, uint64_t client) -> StatusOr<Connection> {
    Connection c(testing::loopback_socket_from(source, ep.port));
    if (!c.is_open()) return Status::Unavailable(std::string("connect from ") + source);
    GPUBOX_RETURN_IF_ERROR(call(c, Op::kStats, {}, 1, client));  // binds the id
    return c;
  };
  const auto honest_commits = [&](const char* source, uint64_t client) {
    auto c = bound(source, client);
    std::vector<uint8_t> reply;
    if (!c.ok() || !call(*c, Op::kDense, half_write("probe_rotating", 0, 1), 2, client).ok() ||
        !call(*c, Op::kDense, half_write("probe_rotating", 4, 1), 3, client, &reply).ok()) {
      return false;
    }
    auto head = decode_dense_reply(reply.data(), reply.size(), 4, 0);
    return head.ok() && head->committed;
  };
  std::vector<Connection> hostile;
  Status refused;
  for (uint64_t client = 5000; client < 5000 + kMaxHeldDenseWrites && refused.ok(); ++client) {
    const std::string source = "127.0.0." + std::to_string(2 + (client - 5000) % 250);
    auto c = bound(source.c_str(), client);
    if (!c.ok()) return failed("cannot connect: " + c.status().to_string());
    hostile.push_back(std::move(*c));
    for (uint64_t w = 1; w <= kMaxStagedDenseWrites && refused.ok(); ++w) {
      refused = call(hostile.back(), Op::kDense, half_write("probe_rotating", 0, w), 1 + w, client);
    }
  }
  const std::string m = refused.message();
  const auto at = m.find("peer 127.0.0.");
  if (refused.code() != Status::Code::kResourceExhausted || at == std::string::npos ||
      m.find("(host loopback) already holds 32", at) == std::string::npos ||
      m.find("no other client holds more of them") == std::string::npos) {
    return failed("a client rotating ids on open connections: " + refused.to_string());
  }
  if (!log_has(a.get("log"), "(host loopback) already holds 32") ||
      !log_has(a.get("log"), "dropped the ranged DENSE write")) {
    return failed("the refusal, or a write dropped for a client holding fewer, is not logged");
  }
  if (!honest_commits("127.0.0.1", 6001)) {
    return failed("a trainer of the rotating client's host was refused while it held its writes");
  }
  if (!honest_commits("127.0.0.200", 6002)) {
    return failed("a trainer at another loopback address (the same host) was refused");
  }
  const std::size_t ids = hostile.size();
  hostile.clear();  // the rotating client leaves its writes abandoned
  if (!honest_commits("127.0.0.1", 6003)) {
    return failed("a trainer of the rotating client's host was refused after it left");
  }
  return held("refused at last: \"" + m.substr(at, m.find(" ranged", at) - at) + "\" (" +
              std::to_string(ids) +
              " ids over as many loopback addresses tried); trainers of its host wrote at once");
}

}  // namespace gpubox::table::server::probe
