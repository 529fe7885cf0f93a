// gpubox_fault_probe: one abuse probe against a live gpubox_server on loopback (issue #12 items
// 1-6 and 8), for scripts/fault_check.sh. Prints one line, "held: ..." or "failed: ...", and
// exits 0 or 1. Every loop is bounded.
//
//   gpubox_fault_probe <probe> --endpoint 127.0.0.1:P [--pid PID] [--log FILE] [--data_dir D]
//                      [--token T] [--server_binary B --config C]
//   probes: over_cap, out_of_fds, barrier_leavers, forged_lengths, retry_cache, paths,
//           token_required, nonfinite, restart; issue #30's network items (fault_probe_net.cpp):
//           drip, auth_flood, budget_starve, token_guess, auth_replay, cap_message; and its data
//           items (fault_probe_data.cpp): save_race, big_part, memory_limit, finite_results;
//           issue 32's client_ids and rotating_ids (fault_probe_net.cpp)
#include "tests/table/server/fault_probe.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "table/server/remote_host_tier.hpp"
#include "tests/table/server/fault_probe_data.hpp"
#include "tests/table/server/process_probe.hpp"

namespace gpubox::table::server {
namespace {

namespace fs = std::filesystem;
using namespace testing;  // NOLINT: the process probes
using namespace probe;    // NOLINT: the shared probe helpers
using std::chrono::milliseconds;

// ---- the server process, seen from outside ----------------------------------------------------

std::size_t file_size(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<std::size_t>(n);
}

bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

// ---- probes -----------------------------------------------------------------------------------

// 1: more idle connections than --max_connections: the extra ones are closed at once (idle less
// than a frame's grace, none gives them its slot: connection_share.hpp), the server does not
// spin, and once the idle timeout freed the rest a client is served.
Verdict over_cap(const Endpoint& ep, const Args& a) {
  const pid_t pid = std::stoi(a.get("pid"));
  const double idle = std::stod(a.get("idle_timeout_s", "2"));
  const double cpu0 = cpu_seconds(pid);
  auto conns = open_connections(ep, 400);
  std::this_thread::sleep_for(milliseconds(300));  // well before the idle timeout
  int closed = 0;
  for (auto& c : conns) closed += closed_by_peer(c.fd(), 0.0) ? 1 : 0;
  std::this_thread::sleep_for(milliseconds(1200));
  const double cpu = cpu_seconds(pid) - cpu0;
  std::ostringstream d;
  d << conns.size() << " idle connections: " << closed << " closed at once (over the cap), "
    << conns.size() - closed << " kept; server CPU " << cpu << " s in 1.5 s";
  if (cpu > 0.4) return failed(d.str() + " (spinning)");
  if (closed == 0 || closed == static_cast<int>(conns.size())) {
    return failed(d.str() + " (no cap in force)");
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(idle + 0.5));
  Status st = served(ep, "", 3.0);
  if (!st.ok()) return failed(d.str() + "; not served after the idle timeout: " + st.to_string());
  return held(d.str() + "; served after the idle timeout");
}

// 1: out of descriptors (cap above the fd limit): accept pauses instead of spinning, the log
// grows by a few lines, and the server serves again once descriptors are free.
Verdict out_of_fds(const Endpoint& ep, const Args& a) {
  const pid_t pid = std::stoi(a.get("pid"));
  const std::string log = a.get("log");
  const std::size_t log0 = file_size(log);
  const double cpu0 = cpu_seconds(pid);
  std::vector<Connection> conns = open_connections(ep, 400);
  std::this_thread::sleep_for(milliseconds(2000));
  const double cpu = cpu_seconds(pid) - cpu0;
  const std::size_t grew = file_size(log) - log0;
  conns.clear();
  std::ostringstream d;
  d << "400 connections under ulimit -n 256: server CPU " << cpu << " s in 2 s, log +" << grew
    << " bytes";
  if (cpu > 0.5 || grew > 16 * 1024) return failed(d.str());
  Status st;
  for (int i = 0; i < 30 && !(st = served(ep, "", 2.0)).ok(); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (!st.ok()) return failed(d.str() + "; not served afterwards: " + st.to_string());
  return held(d.str() + "; served afterwards");
}

// 2: barrier waiters that leave are freed (their descriptors close) and never count.
Verdict barrier_leavers(const Endpoint& ep, const Args& a) {
  const pid_t pid = std::stoi(a.get("pid"));
  const std::size_t fds0 = open_fds(pid);
  {
    auto conns = open_connections(ep, 300);
    std::vector<uint8_t> p;
    encode_barrier_request("crowd", 100000, &p);
    const auto frame = frame_bytes(Op::kBarrier, p);
    for (auto& c : conns) (void)c.send_all(frame.data(), frame.size(), in_seconds(2));
    std::this_thread::sleep_for(milliseconds(300));
  }
  std::size_t fds = open_fds(pid);
  for (int i = 0; i < 60 && fds > fds0 + 2; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    fds = open_fds(pid);
  }
  std::ostringstream d;
  d << "300 waiters left: server fds " << fds0 << " -> " << fds;
  if (fds > fds0 + 2) return failed(d.str() + " (leaked)");
  std::vector<uint8_t> p;
  encode_barrier_request("pair", 2, &p);
  const auto frame = frame_bytes(Op::kBarrier, p);
  {
    auto gone = open_connections(ep, 1);
    if (gone.empty()) return failed("cannot connect");
    (void)gone[0].send_all(frame.data(), frame.size(), in_seconds(2));
    std::this_thread::sleep_for(milliseconds(100));
  }
  auto lone = open_connections(ep, 2);
  if (lone.size() != 2) return failed("cannot connect");
  (void)lone[0].send_all(frame.data(), frame.size(), in_seconds(2));
  pollfd pf{lone[0].fd(), POLLIN, 0};
  if (::poll(&pf, 1, 500) == 1)
    return failed(d.str() + "; a lone party was released by one that left");
  (void)lone[1].send_all(frame.data(), frame.size(), in_seconds(2));
  Frame reply;
  if (!lone[0].recv_frame(&reply, kDefaultMaxPayloadBytes, in_seconds(2)).ok()) {
    return failed(d.str() + "; two live parties were not released");
  }
  return held(d.str() + "; a party that left did not count");
}

// 3: forged payload lengths cost no memory: before AUTH (refused from the header) and after.
Verdict forged_lengths(const Endpoint& ep, const Args& a) {
  const pid_t pid = std::stoi(a.get("pid"));
  const std::string token = a.get("token");
  const std::size_t rss0 = resident_bytes(pid) / (1 << 20);
  auto conns = open_connections(ep, 48);
  FrameHeader h;
  h.op = Op::kPush;
  h.client_id = 1;  // authenticate()'s id: the connection is bound to it
  h.payload_bytes = kDefaultMaxPayloadBytes;
  std::vector<uint8_t> head(kHeaderBytes + 1024, 0);
  encode_header(h, head.data());
  for (auto& c : conns) {
    if (!authenticate(c, token).ok()) return failed("AUTH with the right token refused");
    (void)c.send_all(head.data(), head.size(), in_seconds(2));
  }
  std::this_thread::sleep_for(milliseconds(500));
  const std::size_t rss = resident_bytes(pid) / (1 << 20);
  const auto t0 = Clock::now();
  Status st = served(ep, token, 5.0);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  std::ostringstream d;
  d << "48 headers announcing 64 MiB" << (token.empty() ? "" : " (authenticated)") << ": RSS "
    << rss0 << " -> " << rss << " MB, another client served in " << took << " s";
  if (rss > rss0 + 64) return failed(d.str());
  if (!st.ok() || took > 2.0) return failed(d.str() + " " + st.to_string());
  if (!token.empty()) {  // the same before AUTH: refused from the header
    auto bare = open_connections(ep, 48);
    for (auto& c : bare) (void)c.send_all(head.data(), head.size(), in_seconds(2));
    std::this_thread::sleep_for(milliseconds(300));
    const std::size_t rss2 = resident_bytes(pid) / (1 << 20);
    d << "; unauthenticated: RSS " << rss2 << " MB";
    if (rss2 > rss0 + 64) return failed(d.str());
  }
  return held(d.str());
}

// 4: rejected requests are not cached; a SAVE reusing a PUSH's ids is applied.
Verdict retry_cache(const Endpoint& ep, const Args& a) {
  const pid_t pid = std::stoi(a.get("pid"));
  const std::string data_dir = a.get("data_dir");
  auto conns = open_connections(ep, 1);
  if (conns.empty()) return failed("cannot connect");
  Connection& c = conns[0];
  const std::size_t rss0 = resident_bytes(pid) / (1 << 20);
  const uint32_t stride = probe_stride();
  const auto bad = push_payload(1, 1.0f, stride + 1);  // wrong stride: refused
  for (uint64_t id = 1; id <= 20000; ++id) {
    if (call(c, Op::kPush, bad, id, 7).code() != Status::Code::kInvalidArgument) {
      return failed("a wrong-stride PUSH was not refused");
    }
  }
  const std::size_t rss = resident_bytes(pid) / (1 << 20);
  if (!call(c, Op::kPush, push_payload(42, 0.5f, stride), 90001, 7).ok()) {
    return failed("PUSH refused");
  }
  std::vector<uint8_t> save;
  encode_save_request(SaveKind::kBase, "probe_save", &save);
  Status st = call(c, Op::kSave, save, 90001, 7);
  std::ostringstream d;
  d << "20000 refused requests: RSS " << rss0 << " -> " << rss << " MB";
  if (rss > rss0 + 32) return failed(d.str());
  if (!st.ok() || !fs::exists(fs::path(data_dir) / "probe_save")) {
    return failed(d.str() + "; a SAVE reusing a PUSH's ids was not applied " + st.to_string());
  }
  return held(d.str() + "; a SAVE reusing a PUSH's ids was applied");
}

// 5: SAVE/LOAD paths stay inside --data_dir.
Verdict paths(const Endpoint& ep, const Args& a) {
  const fs::path data_dir = a.get("data_dir");
  const fs::path outside = data_dir.parent_path() / "outside";
  fs::create_directories(outside / "victim.tmp");
  std::error_code ec;
  fs::create_symlink(outside, data_dir / "link", ec);
  auto conns = open_connections(ep, 1);
  if (conns.empty()) return failed("cannot connect");
  int refused = 0;
  const std::vector<std::string> attempts{(outside / "victim").string(), "../outside/victim",
                                          "link/victim", "/tmp/gpubox_probe_escape"};
  for (const auto& path : attempts) {
    std::vector<uint8_t> save, load;
    encode_save_request(SaveKind::kBase, path, &save);
    encode_path_request(path, &load);
    refused += call(conns[0], Op::kSave, save).ok() ? 0 : 1;
    refused += call(conns[0], Op::kLoad, load).ok() ? 0 : 1;
  }
  std::ostringstream d;
  d << refused << " of " << 2 * attempts.size() << " SAVE/LOAD outside --data_dir refused";
  if (refused != static_cast<int>(2 * attempts.size()) || fs::exists(outside / "victim") ||
      !fs::exists(outside / "victim.tmp") || fs::exists("/tmp/gpubox_probe_escape")) {
    return failed(d.str() + " (something was written or deleted outside)");
  }
  return held(d.str() + ", nothing written or deleted outside");
}

// 5: with a token, SHUTDOWN, SAVE and LOAD without it are refused.
Verdict token_required(const Endpoint& ep, const Args& a) {
  const pid_t pid = std::stoi(a.get("pid"));
  std::vector<uint8_t> save, load;
  encode_save_request(SaveKind::kBase, "m", &save);
  encode_path_request("m", &load);
  int refused = 0;
  for (auto [op, payload] : {std::pair{Op::kShutdown, std::vector<uint8_t>{}},
                             std::pair{Op::kSave, save}, std::pair{Op::kLoad, load}}) {
    auto conns = open_connections(ep, 1);
    if (conns.empty()) return failed("cannot connect");
    refused += call(conns[0], op, payload).code() == Status::Code::kPermissionDenied ? 1 : 0;
  }
  std::this_thread::sleep_for(milliseconds(200));
  if (refused != 3 || !alive(pid)) return failed(std::to_string(refused) + " of 3 refused");
  return held("SHUTDOWN, SAVE and LOAD without the token refused; server still up");
}

// 6: a PUSH with NaN/Inf is refused naming the key, and none of its rows is applied.
Verdict nonfinite(const Endpoint& ep, const Args&) {
  auto conns = open_connections(ep, 1);
  if (conns.empty()) return failed("cannot connect");
  const uint32_t stride = probe_stride();
  std::vector<uint64_t> keys{501, 502};
  std::vector<float> rows(2 * stride, 0.5f);
  std::vector<uint8_t> p;
  encode_push_request(keys.data(), 2, rows.data(), stride, &p);
  if (!call(conns[0], Op::kPush, p, 1).ok()) return failed("PUSH refused");
  rows.assign(2 * stride, 1.5f);
  rows[stride + 3] = std::numeric_limits<float>::quiet_NaN();
  p.clear();
  encode_push_request(keys.data(), 2, rows.data(), stride, &p);
  Status st = call(conns[0], Op::kPush, p, 2);
  std::vector<uint8_t> pull, reply;
  encode_pull_request(keys.data(), nullptr, 2, &pull);
  if (!call(conns[0], Op::kPull, pull, 3, 1, &reply).ok()) return failed("PULL refused");
  auto view = decode_pull_reply(reply.data(), reply.size(), 2, stride);
  if (!view.ok()) return failed(view.status().to_string());
  float first = 0;
  std::memcpy(&first, view->rows, sizeof(float));
  if (st.ok() || st.message().find("key 502") == std::string::npos || first != 0.5f) {
    return failed("NaN PUSH: " + st.to_string() + "; key 501 holds " + std::to_string(first));
  }
  return held("NaN PUSH refused naming key 502; key 501 of the same request kept its row");
}

// 8: a server killed and restarted empty under a client that pushed: the next call fails naming
// the endpoint. The probe runs the server itself (--server_binary, --config, --data_dir).
Verdict restart(const Endpoint&, const Args& a) {
  const std::string binary = a.get("server_binary");
  const std::string log = a.get("log", "/dev/null");
  uint16_t port = 0;
  auto spawn = [&](uint16_t want) -> pid_t {
    int out[2];
    if (::pipe(out) != 0) return -1;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      FILE* err = std::fopen(log.c_str(), "a");
      if (err) ::dup2(fileno(err), STDERR_FILENO);
      ::execl(binary.c_str(), binary.c_str(), "--port", std::to_string(want).c_str(), "--config",
              a.get("config").c_str(), "--data_dir", a.get("data_dir").c_str(), nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buf[256];
    ssize_t k;
    while (text.find('\n') == std::string::npos && (k = ::read(out[0], buf, sizeof(buf))) > 0) {
      text.append(buf, static_cast<std::size_t>(k));
    }
    ::close(out[0]);
    const auto at = text.find("listening on ");
    if (at == std::string::npos) return -1;
    const std::string endpoint = text.substr(at + 13, text.find(' ', at + 13) - at - 13);
    port = static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
    return pid;
  };
  const pid_t first = spawn(0);
  if (first < 0) return failed("cannot start " + binary);
  RemoteHostTierOptions o;
  o.endpoints = "127.0.0.1:" + std::to_string(port);
  o.config = probe_config();
  o.deadline_s = 5;
  auto client = RemoteHostTier::connect(o);
  if (!client.ok()) return failed(client.status().to_string());
  std::vector<uint64_t> keys(1000);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1 + i;
  std::vector<float> rows(keys.size() * (*client)->layout().stride(), 0.5f);
  if (!(*client)->push(keys.data(), keys.size(), rows.data()).ok()) return failed("push failed");
  ::kill(first, SIGKILL);
  ::waitpid(first, nullptr, 0);
  pid_t second = -1;
  for (int i = 0; i < 50 && second < 0; ++i) {  // the port may linger a moment
    second = spawn(port);
    if (second < 0) std::this_thread::sleep_for(milliseconds(100));
  }
  if (second < 0) return failed("cannot restart on port " + std::to_string(port));
  Status st = (*client)->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  ::kill(second, SIGKILL);
  ::waitpid(second, nullptr, 0);
  const std::string where = "server 127.0.0.1:" + std::to_string(port) + " restarted";
  if (st.ok() || st.message().find(where) == std::string::npos) {
    return failed("after kill -9 and an empty restart the pull returned " + st.to_string());
  }
  return held("kill -9, restarted empty: \"" + st.message().substr(st.message().find(where), 60) +
              "...\"");
}

}  // namespace
}  // namespace gpubox::table::server

int main(int argc, char** argv) {
  using namespace gpubox::table::server;         // NOLINT: main
  using namespace gpubox::table::server::probe;  // NOLINT: main
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: gpubox_fault_probe <probe> --endpoint IP:PORT [--flag value]...\n");
    return 2;
  }
  Args a;
  a.probe = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    a.flags[name] = argv[i + 1];
  }
  Endpoint ep;
  if (!a.get("endpoint").empty()) {
    auto eps = parse_endpoints(a.get("endpoint"));
    if (!eps.ok()) {
      std::printf("failed: %s\n", eps.status().to_string().c_str());
      return 1;
    }
    ep = (*eps)[0];
  }
  const std::map<std::string, Verdict (*)(const Endpoint&, const Args&)> probes{
      {"over_cap", over_cap},
      {"out_of_fds", out_of_fds},
      {"barrier_leavers", barrier_leavers},
      {"forged_lengths", forged_lengths},
      {"retry_cache", retry_cache},
      {"paths", paths},
      {"token_required", token_required},
      {"nonfinite", nonfinite},
      {"restart", restart},
      {"drip", probe::drip},
      {"auth_flood", probe::auth_flood},
      {"budget_starve", probe::budget_starve},
      {"token_guess", probe::token_guess},
      {"auth_replay", probe::auth_replay},
      {"cap_message", probe::cap_message},
      {"client_ids", probe::client_ids},
      {"rotating_ids", probe::rotating_ids}};
  auto it = probes.find(a.probe);
  std::string line;
  if (it == probes.end() && run_data_probe(a.probe, a.flags, &line)) {
    std::printf("%s\n", line.c_str());
    return line.rfind("held", 0) == 0 ? 0 : 1;
  }
  if (it == probes.end()) {
    std::printf("failed: unknown probe '%s'\n", a.probe.c_str());
    return 2;
  }
  Verdict v;
  try {
    v = it->second(ep, a);
  } catch (const std::exception& e) {
    v = failed(std::string("probe threw: ") + e.what());
  }
  std::printf("%s: %s\n", v.held ? "held" : "failed", v.detail.c_str());
  return v.held ? 0 : 1;
}
