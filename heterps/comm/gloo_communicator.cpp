#include "heterps/comm/gloo_communicator.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "common/error.hpp"
#include "common/group_aborted.hpp"
#include "heterps/comm/detail/data_types.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::comm {
namespace {

using detail::SumType;
using detail::visit_type;

static_assert(sizeof(std::size_t) == sizeof(uint64_t), "counts travel as uint64");

// Gloo's rendezvous store over ours, under the prefix "gloo/": Gloo's full-mesh connect
// publishes each rank's pair addresses and reads every peer's.
// Its waits look, every kFailureLookMs, whether a trainer told its failure (`peer_failure`): a
// trainer that failed before publishing its address (a bad POD_IP) left its peers waiting the
// whole runner.collective_timeout_s.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(RendezvousStore& store, std::chrono::milliseconds timeout,
            const PeerFailure& peer_failure)
      : store_(store), timeout_(timeout), peer_failure_(peer_failure) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(kPrefix + key, data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return store_.get(kPrefix + key, timeout_);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& key : keys) prefixed.push_back(kPrefix + key);
    if (!peer_failure_) return store_.wait(prefixed, timeout);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        return store_.wait(prefixed,
                           std::max(std::chrono::milliseconds(0),
                                    std::min(left, std::chrono::milliseconds(kFailureLookMs))));
      } catch (const Error&) {
        if (left.count() <= kFailureLookMs) throw;  // the whole timeout: its own message
      }
      const std::string failed = peer_failure_();
      if (!failed.empty()) GPUBOX_FAIL("the Gloo group could not form: ", failed);
    }
  }

 private:
  static constexpr const char* kPrefix = "gloo/";
  static constexpr int64_t kFailureLookMs = 250;
  RendezvousStore& store_;
  const std::chrono::milliseconds timeout_;
  const PeerFailure& peer_failure_;
};

// Gloo's device binds `host` and peers connect to it: an address that does not resolve crashed
// inside Gloo (a segfault, no message), one that is not this machine's failed with Gloo's own
// enforce text, both naming neither POD_IP nor what to do.
void check_bindable(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  GPUBOX_EXPECTS(resolved == 0 && found != nullptr, "this trainer's address '", host,
                 "' (POD_IP, or GPUBOX_POD_IP) does not resolve (", ::gai_strerror(resolved),
                 "): set it to an address of this machine that the other trainers reach");
  const std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, &::freeaddrinfo);
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  GPUBOX_EXPECTS(fd >= 0, "a socket for this trainer's address '", host,
                 "': ", std::strerror(errno));
  const int bound = ::bind(fd, found->ai_addr, found->ai_addrlen);  // port 0: any free one
  const int error = errno;
  ::close(fd);
  GPUBOX_EXPECTS(bound == 0, "this trainer's address '", host,
                 "' (POD_IP, or GPUBOX_POD_IP) cannot be bound here (", std::strerror(error),
                 "): set it to an address of this machine that the other trainers reach");
}

std::string trainer_key(int trainer) { return "trainer/" + std::to_string(trainer); }

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// Whether process `pid` of this host still runs: it exists and is not a zombie (a killed
// trainer stays one until its launcher reaps it).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  // "pid (comm) S ...": the state follows the last ')'.
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// A stand-in for a null buffer of zero bytes: Gloo wants a pointer for every buffer.
char empty_buffer[1];

void* or_empty(const void* ptr) { return ptr != nullptr ? const_cast<void*>(ptr) : empty_buffer; }

// Gloo's TCP pairs write with write(2), not send(MSG_NOSIGNAL): a write to a peer that reset
// its connection (an abort closes them with SO_LINGER 0) raises SIGPIPE, which would kill the
// process instead of failing the collective with EPIPE. Ignored unless the program installed a
// handler of its own (gpubox_train ignores it already; tests and tools did not).
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

// ---- group ---------------------------------------------------------------------------------

GlooGroup::GlooGroup(device::CardSet& cards, RendezvousStore& store,
                     std::chrono::milliseconds timeout, const std::string& host,
                     const PeerFailure& peer_failure)
    : store_(store),
      timeout_(timeout),
      trainer_id_(cards.trainer_id()),
      trainers_(cards.total_cards() / cards.num_local_cards()),
      cards_per_trainer_(cards.num_local_cards()),
      host_(host) {
  GPUBOX_EXPECTS(timeout.count() > 0, "communicator timeout must be positive");
  ignore_sigpipe();
  check_bindable(host_);
  {
    const std::string who = this_host() + " " + std::to_string(::getpid());
    store_.set(trainer_key(trainer_id_), std::vector<char>(who.begin(), who.end()));
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = host_;
  device_ = gloo::transport::tcp::CreateDevice(attr);
  GlooStore gloo_store(store_, timeout_, peer_failure);
  const int local = cards.num_local_cards();
  const int total = cards.total_cards();
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts(static_cast<std::size_t>(local));
  std::vector<std::string> failures(static_cast<std::size_t>(local));
  {
    // Every local rank waits for all the others' addresses: they connect concurrently.
    std::vector<std::thread> threads;
    for (int c = 0; c < local; ++c) {
      threads.emplace_back([&, c] {
        try {
          auto context = std::make_shared<gloo::rendezvous::Context>(cards.card(c).rank(), total);
          context->setTimeout(timeout_);
          context->connectFullMesh(gloo_store, device_);
          contexts[static_cast<std::size_t>(c)] = std::move(context);
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(c)] = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  for (int c = 0; c < local; ++c) {
    if (!failures[static_cast<std::size_t>(c)].empty()) {
      GPUBOX_FAIL("Gloo group of ", total, " cards (", trainers_, " trainers x ", local,
                  "): card rank ", cards.card(c).rank(), " of trainer ", trainer_id_,
                  " could not connect (a card rank r belongs to trainer r / ", local,
                  "): ", failures[static_cast<std::size_t>(c)]);
    }
  }
  for (int c = 0; c < local; ++c) {
    ranks_.push_back(
        std::make_unique<GlooCommunicator>(*this, contexts[static_cast<std::size_t>(c)]));
  }
  MutexLock lock(mu_);
  in_collective_.assign(ranks_.size(), false);
}

GlooGroup::~GlooGroup() = default;

Communicator& GlooGroup::at(int local_rank) {
  GPUBOX_EXPECTS(local_rank >= 0 && local_rank < size(), "rank ", local_rank,
                 " is not in this group of ", size());
  return *ranks_[static_cast<std::size_t>(local_rank)];
}

void GlooGroup::abort(const std::string& reason) {
  std::vector<std::size_t> idle;
  {
    MutexLock lock(mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;  // the first reason wins
    reason_ = reason.empty() ? std::string("(no reason given)") : reason;
    aborted_.store(true, std::memory_order_release);
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (!in_collective_[r]) idle.push_back(r);
    }
  }
  // The peers waiting on these ranks see their sockets close and fail at once (the header).
  // Closed outside mu_: each close waits for a tick of Gloo's loop thread, and no rank can
  // enter a collective once aborted_ is set (a rank leaving one closes its own, below; a second
  // close of a pair does nothing). A rank inside a collective is not woken (Gloo has no way to):
  // it fails at its peers' closing or Gloo's timeout, and a trainer whose peer was lost is ended
  // by PeerWatch's forced exit (trainer/engine/peer_watch.hpp) if it has not stopped by then.
  for (std::size_t r : idle) ranks_[r]->close_connections();
}

void GlooGroup::enter_collective(int local, const char* collective) {
  MutexLock lock(mu_);
  if (aborted_.load(std::memory_order_relaxed)) {
    GPUBOX_GROUP_ABORTED(reason_, "communicator aborted (rank ",
                         ranks_[static_cast<std::size_t>(local)]->rank(), " in ", collective,
                         "): ", reason_);
  }
  in_collective_[static_cast<std::size_t>(local)] = true;
}

void GlooGroup::leave_collective(int local) {
  bool aborted = false;
  {
    MutexLock lock(mu_);
    in_collective_[static_cast<std::size_t>(local)] = false;
    aborted = aborted_.load(std::memory_order_relaxed);
  }
  if (aborted) ranks_[static_cast<std::size_t>(local)]->close_connections();
}

std::string GlooGroup::reason() const {
  MutexLock lock(mu_);
  return reason_;
}

std::string GlooGroup::gone_trainers() const {
  const std::string me = this_host();
  std::string out;
  for (int t = 0; t < trainers_; ++t) {
    if (t == trainer_id_) continue;
    try {
      const std::vector<char> value = store_.get(trainer_key(t), std::chrono::milliseconds(0));
      std::istringstream in(std::string(value.begin(), value.end()));
      std::string host;
      long pid = 0;
      if (!(in >> host >> pid) || host != me || pid <= 0) continue;
      if (!process_alive(static_cast<pid_t>(pid))) {
        out +=
            ::gpubox::detail::concat("trainer ", t, " (pid ", pid, " on this host) has exited; ");
      }
    } catch (const Error&) {
      // Never published: the group would not have been made. Nothing to name.
    }
  }
  return out;
}

// ---- communicator --------------------------------------------------------------------------

GlooCommunicator::GlooCommunicator(GlooGroup& group, std::shared_ptr<gloo::Context> context)
    : group_(&group), context_(std::move(context)) {}

void GlooCommunicator::close_connections() { context_->closeConnections(); }

int GlooCommunicator::rank() const { return context_->rank; }
int GlooCommunicator::size() const { return context_->size; }

bool GlooCommunicator::other_process(int peer) const {
  return peer / group_->cards_per_trainer() != rank() / group_->cards_per_trainer();
}

void GlooCommunicator::count_ring(double bytes) {
  if (other_process((rank() + 1) % size()))
    bytes_to_other_processes_ += static_cast<uint64_t>(bytes);
}

template <class Op>
void GlooCommunicator::run_gloo(const char* collective, const device::Stream& stream, Op&& op) {
  const int local = rank() % group_->cards_per_trainer();
  group_->enter_collective(local, collective);  // throws when aborted
  std::string failure;
  try {
    // Stream order: the caller's earlier work on `stream` must be done before Gloo reads it.
    // Not counted: the Communicator's public method counts the collective.
    device::detail::synchronize_uncounted(stream);
    op();
    group_->leave_collective(local);
    return;
  } catch (const Error& e) {
    failure = e.what();
  } catch (const std::exception& e) {
    failure = ::gpubox::detail::concat("Gloo: ", e.what());
  }
  group_->leave_collective(local);
  // Aborted meanwhile (a lost peer, another rank's failure): that reason is the cause.
  if (group_->aborted()) {
    const std::string reason = group_->reason();
    GPUBOX_GROUP_ABORTED(reason, "communicator aborted (rank ", rank(), " in ", collective,
                         "): ", reason);
  }
  // A peer's closed socket may arrive while its process is still exiting: look a little while.
  std::string gone = group_->gone_trainers();
  for (int i = 0; i < 20 && gone.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = group_->gone_trainers();
  }
  const std::string message = ::gpubox::detail::concat(
      collective, " on card rank ", rank(), " (trainer ", rank() / group_->cards_per_trainer(),
      ") failed: ", gone, failure, " (a peer trainer exited, or stalled past the ",
      group_->timeout().count(), " ms timeout, runner.collective_timeout_s)");
  group_->abort(message);
  GPUBOX_FAIL(message);
}

void GlooCommunicator::do_all_reduce_sum(const void* send, void* recv, std::size_t count,
                                         DataType type, const device::Stream& stream) {
  GPUBOX_EXPECTS(count == 0 || (send != nullptr && recv != nullptr), "all_reduce_sum on rank ",
                 rank(), ": null buffer for ", count, " elements");
  visit_type(type, [&](auto tag) {
    using T = decltype(tag);
    using Sum = SumType<T>;
    run_gloo("all_reduce_sum", stream, [&] {
      if (count == 0) return;  // every rank passes the same count: nobody sends anything
      if (send != recv) std::memcpy(recv, send, count * sizeof(T));
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<Sum*>(recv), count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<Sum>));
      gloo::allreduce(opts);
      count_ring(2.0 * (size() - 1) / size() * static_cast<double>(count * sizeof(T)));
    });
  });
}

void GlooCommunicator::do_all_to_all_v(const void* send, const std::size_t* send_counts, void* recv,
                                       const std::size_t* recv_counts, DataType type,
                                       const device::Stream& stream) {
  GPUBOX_EXPECTS(send_counts != nullptr && recv_counts != nullptr, "all_to_all_v on rank ", rank(),
                 ": null count array");
  const auto n = static_cast<std::size_t>(size());
  std::vector<int64_t> sends(send_counts, send_counts + n);
  std::vector<int64_t> recvs(recv_counts, recv_counts + n);
  visit_type(type, [&](auto tag) {
    using T = decltype(tag);
    run_gloo("all_to_all_v", stream, [&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(static_cast<T*>(or_empty(send)), std::move(sends));
      opts.setOutput(static_cast<T*>(or_empty(recv)), std::move(recvs));
      gloo::alltoallv(opts);
    });
    for (int p = 0; p < size(); ++p) {
      if (other_process(p)) bytes_to_other_processes_ += send_counts[p] * sizeof(T);
    }
  });
}

void GlooCommunicator::do_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                                     const device::Stream& stream) {
  visit_type(type, [&](auto tag) {
    using T = decltype(tag);
    run_gloo("all_gather", stream, [&] {
      if (count == 0) return;
      T* out = static_cast<T*>(recv);
      const T* mine = out + static_cast<std::size_t>(rank()) * count;
      // In place (send is this rank's block of recv): Gloo then takes the block from recv.
      if (send != mine)
        std::memcpy(out + static_cast<std::size_t>(rank()) * count, send, count * sizeof(T));
      gloo::AllgatherOptions opts(context_);
      opts.setOutput(out, count * static_cast<std::size_t>(size()));
      gloo::allgather(opts);
      count_ring(static_cast<double>(size() - 1) * static_cast<double>(count * sizeof(T)));
    });
  });
}

void GlooCommunicator::do_broadcast(void* buffer, std::size_t count, DataType type, int root,
                                    const device::Stream& stream) {
  GPUBOX_EXPECTS(root >= 0 && root < size(), "broadcast root ", root, " is not in this group of ",
                 size());
  visit_type(type, [&](auto tag) {
    using T = decltype(tag);
    run_gloo("broadcast", stream, [&] {
      if (count == 0) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<T*>(buffer), count);
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
  });
}

void GlooCommunicator::do_barrier(const device::Stream& stream) {
  run_gloo("barrier", stream, [&] {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  });
}

void GlooCommunicator::do_exchange_counts(const std::size_t* send_counts, std::size_t* recv_counts,
                                          const device::Stream& stream) {
  GPUBOX_EXPECTS(send_counts != nullptr && recv_counts != nullptr, "exchange_counts on rank ",
                 rank(), ": null count array");
  const auto n = static_cast<std::size_t>(size());
  std::vector<uint64_t> in(send_counts, send_counts + n);
  run_gloo("exchange_counts", stream, [&] {
    gloo::AlltoallOptions opts(context_);
    opts.setInput(in.data(), n);
    opts.setOutput(reinterpret_cast<uint64_t*>(recv_counts), n);
    gloo::alltoall(opts);
  });
  for (int p = 0; p < size(); ++p) {
    if (other_process(p)) bytes_to_other_processes_ += sizeof(uint64_t);
  }
}

void GlooCommunicator::do_synchronize(const device::Stream& stream, const char* what) {
  device::detail::synchronize_uncounted(stream);
  throw_if_aborted(what);
}

void GlooCommunicator::do_wait_for(const device::Event& event, const char* what, OnAbort on_abort,
                                   device::HostWait counted_as) {
  event.synchronize(counted_as);
  if (on_abort == OnAbort::kFail) throw_if_aborted(what);
}

void GlooCommunicator::throw_if_aborted(const char* what) const {
  if (group_->aborted()) {
    const std::string reason = group_->reason();
    GPUBOX_GROUP_ABORTED(reason, "communicator aborted (rank ", rank(), " waiting for ", what,
                         " after ", last_collective(), "): ", reason);
  }
}

}  // namespace gpubox::comm
