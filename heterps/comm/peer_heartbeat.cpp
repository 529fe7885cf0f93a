#include "heterps/comm/peer_heartbeat.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "heterps/comm/rendezvous_store.hpp"

namespace gpubox::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kBeat = 'h';
constexpr char kGoodbye = 'q';
constexpr char kHelloMagic[4] = {'G', 'B', 'H', 'B'};
constexpr std::size_t kHelloBytes = 8;  // magic + the connecting trainer's id (big-endian)

// A peer's connection that ends without its goodbye is reported this much later: a peer that
// stopped on an error of its own (after a collective that showed the job something was wrong)
// leaves its peers the time to stop on theirs, which says more than "it exited".
constexpr auto kEndedGrace = std::chrono::milliseconds(1000);

std::string heartbeat_key(int trainer) { return "heartbeat/" + std::to_string(trainer); }

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

int ms_until(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// The first address `host` resolves to (numeric or a name), with `port`.
addrinfo* resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* out = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &out);
  GPUBOX_EXPECTS(rc == 0 && out != nullptr, "heartbeat: cannot resolve '", host,
                 "': ", ::gai_strerror(rc));
  return out;
}

// A connected socket to host:port before `deadline` (refused connections are tried again: the
// peer published its address after listening, so a refusal is a network in flux), or -1 and
// `*error`.
int connect_before(const std::string& host, uint16_t port, Clock::time_point deadline,
                   std::string* error) {
  addrinfo* info = resolve(host, port, false);
  int fd = -1;
  while (fd < 0 && Clock::now() < deadline) {
    fd = ::socket(info->ai_family, info->ai_socktype | SOCK_CLOEXEC, info->ai_protocol);
    if (fd < 0) {
      *error = errno_text("socket");
      break;
    }
    set_nonblocking(fd);
    int rc = ::connect(fd, info->ai_addr, info->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      while ((rc = ::poll(&p, 1, ms_until(deadline))) == 0 && Clock::now() < deadline) {
      }
      int err = rc > 0 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (rc > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      *error = errno_text("connect");
      ::close(fd);
      fd = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ::freeaddrinfo(info);
  return fd;
}

// Sends or receives exactly n bytes on a non-blocking socket before `deadline`.
bool transfer(int fd, char* data, std::size_t n, bool send, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t k = send ? ::send(fd, data + done, n - done, MSG_NOSIGNAL)
                           : ::recv(fd, data + done, n - done, 0);
    if (k > 0) {
      done += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (Clock::now() >= deadline) return false;
    pollfd p{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    ::poll(&p, 1, ms_until(deadline));
  }
  return true;
}

std::string this_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

PeerHeartbeat::PeerHeartbeat(RendezvousStore& store, int trainer_id, int trainers,
                             const std::string& host, HeartbeatOptions options,
                             LostPeerHandler on_lost)
    : trainer_id_(trainer_id),
      trainers_(trainers),
      host_(host),
      options_(options),
      on_lost_(std::move(on_lost)),
      descriptions_(static_cast<std::size_t>(std::max(trainers, 0))) {
  GPUBOX_EXPECTS(trainers >= 2 && trainer_id >= 0 && trainer_id < trainers, "heartbeat: trainer ",
                 trainer_id, " of ", trainers);
  GPUBOX_EXPECTS(options.timeout.count() > 0, "heartbeat: the peer timeout must be positive");
  GPUBOX_EXPECTS(::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) == 0, errno_text("heartbeat: pipe"));
  try {
    listen_on(host);
    std::ostringstream me;
    me << host_ << ' ' << port_ << ' ' << ::getpid() << ' ' << this_hostname();
    const std::string value = me.str();
    store.set(heartbeat_key(trainer_id_), std::vector<char>(value.begin(), value.end()));
    join(store);
  } catch (...) {
    stop(false);  // no thread yet: closes the sockets and the pipe
    throw;
  }
  thread_ = std::thread([this] { run(); });
}

PeerHeartbeat::~PeerHeartbeat() { stop(false); }

std::string PeerHeartbeat::describe(int trainer) const {
  return descriptions_.at(static_cast<std::size_t>(trainer));
}

void PeerHeartbeat::listen_on(const std::string& host) {
  addrinfo* info = resolve(host, 0, true);
  listen_fd_ = ::socket(info->ai_family, info->ai_socktype | SOCK_CLOEXEC, info->ai_protocol);
  const bool bound = listen_fd_ >= 0 && ::bind(listen_fd_, info->ai_addr, info->ai_addrlen) == 0 &&
                     ::listen(listen_fd_, trainers_) == 0;
  const std::string error = errno_text("bind/listen");
  ::freeaddrinfo(info);
  GPUBOX_EXPECTS(bound, "heartbeat: cannot listen on ", host, " (POD_IP): ", error);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  set_nonblocking(listen_fd_);
}

void PeerHeartbeat::join(RendezvousStore& store) {
  const auto deadline = Clock::now() + options_.join_timeout;
  const auto addresses = read_addresses(store, deadline);
  for (int t = 0; t < trainer_id_; ++t)
    connect_to(t, addresses[static_cast<std::size_t>(t)], deadline);
  accept_higher(deadline);
  ::close(listen_fd_);
  listen_fd_ = -1;
  for (Peer& peer : peers_) {
    const int one = 1;
    ::setsockopt(peer.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    set_nonblocking(peer.fd);
    peer.last_heard = Clock::now();  // the silence counts from the mesh, not from each join
  }
}

std::vector<std::pair<std::string, uint16_t>> PeerHeartbeat::read_addresses(
    RendezvousStore& store, Clock::time_point deadline) {
  std::vector<std::pair<std::string, uint16_t>> addresses(static_cast<std::size_t>(trainers_));
  for (int t = 0; t < trainers_; ++t) {
    if (t == trainer_id_) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const std::vector<char> raw =
        store.get(heartbeat_key(t), std::max(left, std::chrono::milliseconds(0)));
    std::istringstream in(std::string(raw.begin(), raw.end()));
    std::string host, machine;
    long port = 0, pid = 0;
    GPUBOX_EXPECTS(
        static_cast<bool>(in >> host >> port >> pid >> machine) && port > 0 && port < 65536,
        "heartbeat: rendezvous key ", heartbeat_key(t), " in ", store.describe(), " holds '",
        std::string(raw.begin(), raw.end()), "', not '<host> <port> <pid> <machine>'");
    addresses[static_cast<std::size_t>(t)] = {host, static_cast<uint16_t>(port)};
    descriptions_[static_cast<std::size_t>(t)] =
        ::gpubox::detail::concat("trainer ", t, " (pid ", pid, " on ", machine, ", at ", host, ")");
  }
  return addresses;
}

void PeerHeartbeat::connect_to(int t, const std::pair<std::string, uint16_t>& address,
                               Clock::time_point deadline) {
  std::string error = "timed out";
  const int fd = connect_before(address.first, address.second, deadline, &error);
  GPUBOX_EXPECTS(fd >= 0, "heartbeat: trainer ", trainer_id_, " cannot reach ", describe(t),
                 " at port ", address.second, ": ", error);
  peers_.push_back(Peer{t, fd, describe(t), Clock::now()});
  char hello[kHelloBytes];
  std::memcpy(hello, kHelloMagic, 4);
  const uint32_t id = htonl(static_cast<uint32_t>(trainer_id_));
  std::memcpy(hello + 4, &id, 4);
  GPUBOX_EXPECTS(transfer(fd, hello, kHelloBytes, true, deadline), "heartbeat: trainer ",
                 trainer_id_, " cannot greet ", describe(t), ": ", errno_text("send"));
}

void PeerHeartbeat::accept_higher(Clock::time_point deadline) {
  // The trainers of higher ids connect here; anything else that connects is dropped.
  const auto joined = [this](int t) {
    return std::any_of(peers_.begin(), peers_.end(), [t](const Peer& p) { return p.trainer == t; });
  };
  int missing = trainers_ - 1 - trainer_id_;
  while (missing > 0) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, ms_until(deadline)) <= 0) {
      if (Clock::now() < deadline) continue;
      std::string names;
      for (int t = trainer_id_ + 1; t < trainers_; ++t) {
        if (!joined(t)) names += (names.empty() ? "" : ", ") + describe(t);
      }
      GPUBOX_FAIL("heartbeat: trainer ", trainer_id_, " (at ", host_, ":", port_, ") waited ",
                  options_.join_timeout.count(), " ms for ", names, " to connect");
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    char hello[kHelloBytes];
    uint32_t id = 0;
    const bool greeted = transfer(fd, hello, kHelloBytes, false,
                                  std::min(deadline, Clock::now() + options_.timeout));
    if (greeted) std::memcpy(&id, hello + 4, 4);
    const int t = static_cast<int>(ntohl(id));
    if (!greeted || std::memcmp(hello, kHelloMagic, 4) != 0 || t <= trainer_id_ || t >= trainers_ ||
        joined(t)) {
      ::close(fd);
      continue;
    }
    peers_.push_back(Peer{t, fd, describe(t), Clock::now()});
    --missing;
  }
}

void PeerHeartbeat::run() {
  const auto interval = std::max(options_.timeout / 5, std::chrono::milliseconds(20));
  auto next_beat = Clock::now();
  std::vector<pollfd> fds;
  while (!stopping_.load(std::memory_order_acquire)) {
    auto now = Clock::now();
    if (now >= next_beat) {
      for (Peer& peer : peers_) {
        // A full send buffer (the link is down) drops the beat: the peer's silence is its signal.
        if (!peer.closed) ::send(peer.fd, &kBeat, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      next_beat = now + interval;
    }
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    auto wake = next_beat;
    for (const Peer& peer : peers_) {
      fds.push_back(pollfd{peer.closed ? -1 : peer.fd, POLLIN, 0});
      if (!peer.ended.empty()) wake = std::min(wake, peer.ended_at + kEndedGrace);
    }
    ::poll(fds.data(), fds.size(), ms_until(wake));
    now = Clock::now();
    // Read first: bytes that waited while this thread did not run are not silence.
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      if (fds[i + 1].revents != 0) receive(peers_[i], now);
    }
    for (Peer& peer : peers_) {
      if (peer.closed || peer.said_goodbye || now - peer.last_heard < options_.timeout) continue;
      const double silent = std::chrono::duration<double>(now - peer.last_heard).count();
      std::ostringstream reason;
      reason.precision(3);
      reason << "lost " << peer.description << ": no heartbeat for " << silent
             << " s (runner.peer_timeout_s=" << options_.timeout.count() / 1000.0
             << "): the network between trainer " << trainer_id_ << " (at " << host_
             << ") and it is down, or its machine stopped";
      peer.closed = true;  // reported once; the socket stays open until stop()
      report(reason.str());
    }
    for (Peer& peer : peers_) {
      if (peer.ended.empty() || now - peer.ended_at < kEndedGrace) continue;
      report(peer.ended);
      peer.ended.clear();
    }
  }
  close_peers(finished_.load(std::memory_order_acquire));
}

void PeerHeartbeat::receive(Peer& peer, Clock::time_point now) {
  char bytes[64];
  for (;;) {
    const ssize_t k = ::recv(peer.fd, bytes, sizeof(bytes), 0);
    if (k > 0) {
      peer.last_heard = now;
      if (std::memchr(bytes, kGoodbye, static_cast<std::size_t>(k)) != nullptr) {
        peer.said_goodbye = true;
      }
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (k < 0 && errno == EINTR) continue;
    const std::string how = k == 0 ? std::string("closed") : errno_text("failed (recv");
    peer.closed = true;
    if (!peer.said_goodbye) {
      peer.ended = ::gpubox::detail::concat(
          "lost ", peer.description, ": its heartbeat connection ", how, k == 0 ? "" : ")",
          " before it finished: its process exited or was killed");
      peer.ended_at = now;
    }
    return;
  }
}

void PeerHeartbeat::report(const std::string& reason) {
  if (reported_) {
    GPUBOX_LOG(WARNING) << "heartbeat: " << reason;
    return;
  }
  reported_ = true;
  if (on_lost_) on_lost_(reason);
}

void PeerHeartbeat::stop(bool finished) {
  if (thread_.joinable()) {
    finished_.store(finished, std::memory_order_release);
    stopping_.store(true, std::memory_order_release);
    const char wake = 1;
    [[maybe_unused]] const ssize_t k = ::write(wake_[1], &wake, 1);
    thread_.join();
  } else {
    close_peers(false);
  }
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void PeerHeartbeat::close_peers(bool finished) {
  for (Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    if (finished && !peer.closed) ::send(peer.fd, &kGoodbye, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(peer.fd);
    peer.fd = -1;
    peer.closed = true;
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

}  // namespace gpubox::comm
