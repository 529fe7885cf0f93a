// gpubox_server's challenge-response authentication against hostile peers (issue #30), in-process
// on loopback: no replay, wrong proofs slowed per host and logged, proofs refused unchecked for
// their host's backoff retried by the client, proofs closed while they wait counted only if
// wrong, the token never on the wire, short tokens refused.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A server requiring kTestToken whose AUTH backoff is `backoff_s` from the first wrong proof on.
std::unique_ptr<Server> start_backoff_server(FakeHostTier* table, double auth_timeout_s,
                                             double backoff_s, std::size_t max_unauthenticated = 0,
                                             uint16_t port = 0) {
  ServerOptions so;
  so.port = port;
  so.auth_token = kTestToken;
  so.auth_timeout_s = auth_timeout_s;
  so.auth_backoff_base_s = backoff_s;
  so.auth_backoff_max_s = backoff_s;
  so.max_unauthenticated = max_unauthenticated;  // 0: the default
  return start_server(table, so);
}

// One wrong proof from `source`: its host (loopback) backs off.
void guess_wrong(const char* source, uint16_t port) {
  Connection guess = raw_connection_from(source, port);
  const std::string wrong = std::string(kTestToken).replace(0, 1, "X");
  EXPECT_EQ(raw_authenticate(guess, wrong).code(), Status::Code::kPermissionDenied);
}

// ---- authentication ---------------------------------------------------------------------------

TEST(Auth, ACapturedExchangeCannotBeReplayedOnANewConnection) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  // What a client sent on one connection: AUTH, its proof, a PUSH.
  Connection first = raw_connection(server->port());
  AuthNonce nonce{};
  AuthProof proof{};
  ASSERT_TRUE(raw_authenticate(first, kTestToken, 7, &nonce, &proof).ok());
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  std::vector<uint64_t> keys{42};
  std::vector<float> row(stride, 1.0f);
  std::vector<uint8_t> push;
  encode_push_request(keys.data(), 1, row.data(), stride, &push);
  ASSERT_TRUE(raw_call(first, Op::kPush, push, 3, 7).ok());
  ASSERT_EQ(table.size(), 1u);
  ASSERT_TRUE(table.erase(keys.data(), 1).ok());

  // The same bytes on a new connection: a new challenge, so the old proof is refused and the
  // PUSH never applied.
  Connection replay = raw_connection(server->port());
  std::vector<uint8_t> challenge;
  ASSERT_TRUE(raw_call(replay, Op::kAuth, {}, 1, 7, &challenge).ok());
  auto fresh = decode_auth_challenge(challenge.data(), challenge.size());
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(*fresh, nonce);
  Status st =
      raw_call(replay, Op::kAuthProof, std::vector<uint8_t>(proof.begin(), proof.end()), 2, 7);
  EXPECT_EQ(st.code(), Status::Code::kPermissionDenied) << st.to_string();
  EXPECT_FALSE(raw_call(replay, Op::kPush, push, 3, 7).ok());
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(server->counters().auth_failures, 1u);
}

// A trainer whose proofs come while its host backs off past --auth_timeout_s (a neighbour's wrong
// proof, one host) is not ended by the refusal: its proof was never checked, so the client
// retries it; a call whose deadline ends first names the wait, not "wrong auth token". The
// backoff (60 s) outlasts the test, so every proof is refused however slow the machine: the
// retrying call is let through by a server restarted on the port (without the host's failures).
TEST(Auth, AProofRefusedUncheckedForItsHostsBackoffIsRetriedByTheClient) {
  FakeHostTier table(test_config());
  // A port below the ephemeral range: the server is restarted on it below.
  auto server =
      start_backoff_server(&table, 5.0, 60.0, 0, gpubox::testing::port_below_ephemeral_range());
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  guess_wrong("127.0.0.2", port);
  const auto stats = [&](double deadline_s) {
    TransportOptions t;
    t.client_id = 3;
    t.auth_token = kTestToken;
    t.deadline_s = deadline_s;
    t.initial_backoff_s = 0.05;
    t.max_backoff_s = 0.2;
    Transport transport({Endpoint{"127.0.0.1", port}}, t);
    std::vector<OutgoingRequest> requests{transport.make_request(Op::kStats, 0, {})};
    return transport.run(Op::kStats, requests,
                         [](std::size_t, const uint8_t*, std::size_t) { return Status::OK(); });
  };
  const Status early = stats(1.0);
  EXPECT_EQ(early.code(), Status::Code::kDeadlineExceeded) << early.to_string();
  EXPECT_NE(early.message().find("last error: Unavailable: too many wrong AUTH proofs from host "
                                 "loopback"),
            std::string::npos)
      << early.to_string();
  const uint64_t deferred = server->counters().auth_proofs_deferred;
  EXPECT_GE(deferred, 1u);
  Status st = Status::Internal("the call did not return");
  std::thread call([&] { st = stats(30.0); });
  // Two refusals of the call's proofs: it retried one rather than end.
  EXPECT_TRUE(
      eventually([&] { return server->counters().auth_proofs_deferred >= deferred + 2; }, 20.0))
      << "the client did not retry its refused proof";
  EXPECT_EQ(server->counters().auth_failures, 1u);
  server.reset();
  ServerOptions fresh;
  fresh.auth_token = kTestToken;
  fresh.port = port;
  server = start_server(&table, fresh);
  call.join();  // no ASSERT before it: the thread must be joined
  ASSERT_TRUE(server) << "no server restarted on port " << port
                      << " (port taken by another process meanwhile?); the call: "
                      << st.to_string();
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// Sends `token`'s proof for client 1 on a new connection and returns once the server holds it
// waiting for its host's slot (the test's backoff), the only proof waiting; returns the connection.
Connection send_waiting_proof(const Server& server, const std::string& token) {
  EXPECT_EQ(server.counters().auth_proofs_waiting, 0u);
  Connection conn = raw_connection(server.port());
  std::vector<uint8_t> challenge;
  EXPECT_TRUE(raw_call(conn, Op::kAuth, {}, 1, 1, &challenge).ok());
  auto nonce = decode_auth_challenge(challenge.data(), challenge.size());
  EXPECT_TRUE(nonce.ok());
  const AuthProof proof = auth_proof(token, nonce.ok() ? *nonce : AuthNonce{}, 1);
  FrameHeader h;
  h.op = Op::kAuthProof;
  h.request_id = 2;
  h.client_id = 1;
  const auto frame = encode_frame(h, std::vector<uint8_t>(proof.begin(), proof.end()));
  EXPECT_TRUE(conn.send_all(frame.data(), frame.size(), seconds_from_now(2)).ok());
  // Not a sleep: a proof the server has not read yet is evicted as a plain connection.
  EXPECT_TRUE(eventually([&] { return server.counters().auth_proofs_waiting == 1; }))
      << "the proof is not waiting for its check";
  return conn;
}

// A proof waiting for its host's slot whose connection is closed before the check (here evicted
// by a newer unauthenticated connection) is checked then, unanswered: a wrong one counts (a
// neighbour cannot hold slots and leave without its host's delay growing), a right one does not
// (plain connects evicting a trainer's proofs used to charge its host a failure each).
TEST(Auth, AProofClosedWhileItWaitsForItsCheckCountsOnlyIfWrong) {
  FakeHostTier table(test_config());
  auto server = start_backoff_server(&table, 10.0, 5.0, /*max_unauthenticated=*/1);
  ASSERT_TRUE(server);
  guess_wrong("127.0.0.1", server->port());
  const std::string wrong = std::string(kTestToken).replace(0, 1, "X");
  // A proof closed while it waits leaves the gauge once counted: no sleep before reading it.
  const auto proof_closed = [&] { return server->counters().auth_proofs_waiting == 0; };
  {
    Connection waiting = send_waiting_proof(*server, wrong);  // checked 5 s on
    Connection newer = raw_connection(server->port());        // evicts it
    EXPECT_TRUE(closed_by_peer(waiting.fd(), 5.0));
    EXPECT_TRUE(eventually(proof_closed));
    EXPECT_EQ(server->counters().auth_failures, 2u) << "a wrong proof closed not counted";
  }
  Connection waiting = send_waiting_proof(*server, kTestToken);  // checked 10 s on
  Connection newer = raw_connection(server->port());
  EXPECT_TRUE(closed_by_peer(waiting.fd(), 5.0));
  EXPECT_TRUE(eventually(proof_closed));
  EXPECT_EQ(server->counters().auth_failures, 2u) << "a right proof closed counted as wrong";
  EXPECT_GE(server->counters().evicted, 2u);
}

// A plain connect over --max_unauthenticated evicts another plain connection before a proof
// waiting for its host's slot: that proof (a trainer's, slowed by a neighbour's wrong one) is
// checked at its slot and authenticates. It used to be evicted, as the oldest.
TEST(Auth, APlainConnectEvictsAPlainConnectionBeforeAWaitingProof) {
  FakeHostTier table(test_config());
  auto server = start_backoff_server(&table, 10.0, 1.0, /*max_unauthenticated=*/2);
  ASSERT_TRUE(server);
  guess_wrong("127.0.0.1", server->port());
  Connection waiting = send_waiting_proof(*server, kTestToken);
  const uint64_t accepted = server->counters().connections;
  Connection plain = raw_connection(server->port());
  // Accepted in this order (the server's sessions are oldest first by their accept).
  ASSERT_TRUE(eventually([&] { return server->counters().connections > accepted; }));
  Connection newer = raw_connection(server->port());  // evicts one of the two
  EXPECT_TRUE(closed_by_peer(plain.fd(), 3.0));
  Frame reply;
  ASSERT_TRUE(waiting.recv_frame(&reply, kDefaultMaxPayloadBytes, seconds_from_now(3)).ok());
  EXPECT_EQ(reply.header.request_id, 2u) << "not the proof's reply (a notice?)";
  EXPECT_EQ(reply.header.status, Status::Code::kOk);
  EXPECT_EQ(server->counters().auth_failures, 1u);
}

// A stand-in server that records what a client sends while it authenticates.
TEST(Auth, TheTokenNeverCrossesTheWire) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const uint16_t port = ntohs(addr.sin_port);
  std::vector<uint8_t> seen;
  std::thread fake([&] {
    Connection conn(::accept(listener, nullptr, nullptr));
    Frame ask;
    if (!conn.recv_frame(&ask, kDefaultMaxPayloadBytes, seconds_from_now(3)).ok()) return;
    std::vector<uint8_t> challenge;
    encode_auth_challenge(random_nonce(), &challenge);
    FrameHeader h = ask.header;
    h.response = true;
    const auto reply = encode_frame(h, challenge);
    if (!conn.send_all(reply.data(), reply.size(), seconds_from_now(3)).ok()) return;
    Frame proof;
    if (!conn.recv_frame(&proof, kDefaultMaxPayloadBytes, seconds_from_now(3)).ok()) return;
    seen = encode_frame(ask.header, ask.payload);
    const auto p = encode_frame(proof.header, proof.payload);
    seen.insert(seen.end(), p.begin(), p.end());
  });
  TransportOptions t;
  t.client_id = 9;
  t.auth_token = kTestToken;
  t.deadline_s = 1.0;
  Transport transport({Endpoint{"127.0.0.1", port}}, t);
  std::vector<OutgoingRequest> requests{transport.make_request(Op::kStats, 0, {})};
  EXPECT_FALSE(transport.run(Op::kStats, requests, {}, /*retry=*/false).ok());
  fake.join();
  ::close(listener);
  ASSERT_GT(seen.size(), 2 * kHeaderBytes) << "the client did not authenticate";
  const std::string wire(seen.begin(), seen.end());
  EXPECT_EQ(wire.find(kTestToken), std::string::npos);
  EXPECT_EQ(wire.find(std::string(kTestToken).substr(0, 8)), std::string::npos);
}

TEST(Auth, WrongProofsAreSlowedPerHostAndLogged) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  so.auth_backoff_base_s = 0.1;
  so.auth_backoff_max_s = 1.0;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const LogLevel level = log_level();
  set_log_level(LogLevel::WARNING);
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const std::string wrong = std::string(kTestToken).replace(0, 1, "X");
  for (int i = 0; i < 5; ++i) {  // checked at 0, +0.1, +0.2, +0.4, +0.8 s
    Connection guess = raw_connection(server->port());
    EXPECT_EQ(raw_authenticate(guess, wrong).code(), Status::Code::kPermissionDenied) << i;
  }
  const double took = seconds_since(start);
  // The right proof from that host waits its turn too, and then halves the host's failures
  // (5 -> 2): a wrong proof after it is the third in a row. (The log holds back the lines of the
  // 2 s after one it wrote: the second to fifth are counted in "4 similar lines held back".)
  Connection right = raw_connection(server->port());
  EXPECT_TRUE(raw_authenticate(right, kTestToken).ok());
  Connection guess = raw_connection(server->port());
  EXPECT_EQ(raw_authenticate(guess, wrong).code(), Status::Code::kPermissionDenied);
  const std::string log = ::testing::internal::GetCapturedStderr();
  set_log_level(level);
  EXPECT_GE(took, 1.4) << "5 wrong proofs in " << took << " s: not slowed";
  EXPECT_EQ(server->counters().auth_failures, 6u);
  EXPECT_NE(log.find("wrong AUTH proof from 127.0.0.1:"), std::string::npos) << log;
  for (const char* line :
       {"(1 in a row from host loopback; its next proof is checked 0.1 s from now at the soonest)",
        "(3 in a row from host loopback; its next proof is checked 0.4 s from now at the "
        "soonest)"}) {
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  }
}

// Every loopback address is one host (connection_share.hpp: share_address): a client that failed
// from 127.0.0.1 does not escape its backoff from 127.0.0.2. The backoff (30 s) is past the
// connections' --auth_timeout_s (5 s): a slowed proof is refused at once unchecked, naming why,
// as Unavailable (the client retries it: a neighbour's wrong proofs do not end a trainer's call).
TEST(Auth, WrongProofsAreSlowedPerHostNotPerAddress) {
  FakeHostTier table(test_config());
  auto server = start_backoff_server(&table, 5.0, 30.0);
  ASSERT_TRUE(server);
  guess_wrong("127.0.0.1", server->port());
  for (const char* other : {"127.0.0.2", "127.0.0.1"}) {
    Connection right = raw_connection_from(other, server->port());
    const Status st = raw_authenticate(right, kTestToken);
    EXPECT_EQ(st.code(), Status::Code::kUnavailable) << other << ": " << st.to_string();
    EXPECT_NE(st.message().find("too many wrong AUTH proofs from host loopback (every process of "
                                "one host, or of one IPv6 /64, shares its backoff): the next "
                                "proof from " +
                                std::string(other) + " is checked in "),
              std::string::npos)
        << st.to_string();
  }
  EXPECT_EQ(server->counters().auth_failures, 1u);
}

TEST(Auth, TokensShorterThan128BitsAreRefused) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = std::string(kTestToken).substr(0, 31);
  auto server = Server::start(&table, so);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(server.status().message().find("has 31 characters; at least 32"), std::string::npos)
      << server.status().to_string();
  so.auth_token = kTestToken;
  auto good = start_server(&table, so);
  ASSERT_TRUE(good);
  auto options = client_options(good->endpoint());
  options.auth_token = "s3cret";
  auto client = RemoteHostTier::connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(client.status().message().find("at least 32"), std::string::npos)
      << client.status().to_string();
}

}  // namespace
}  // namespace gpubox::table::server
