// What a client knows about each server it talks to: which process (instance id) and which save
// it last loaded (generation), learned on the first connection and checked on every new one, so
// that a server that restarted mid-training is never mistaken for the one that held the rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::table::server {

struct ServerIdentity {
  uint64_t instance_id = 0;  // 0: not known yet
  uint64_t generation = 0;   // 0: the server loaded nothing since it started
};

// A server found running as another instance than the one this client wrote to.
struct ServerRestart {
  std::size_t endpoint = 0;  // position in the endpoint list
  std::string where;         // "ip:port"
  ServerIdentity before, after;
  // "server 127.0.0.1:29011 restarted (instance 1a.. -> 2b.., now empty): ...; rerun to resume
  // from the last save" (a failed call's error).
  std::string describe() const;
  // describe() without the advice, for a message that says itself what follows (a recovery, or
  // what a rerun does).
  std::string what_was_lost() const;
};

// Per endpoint: its identity, the generation of the last state this client knows the server
// held without its later writes (the save it made or loaded, or what it found at first contact),
// and the mutations it sent since. A restarted server that loaded exactly that state, with no
// mutation since, lost nothing of this client's: it is adopted quietly. Any other restart is an
// error until accept_restarts(). Thread-safe.
class ServerIdentityBook {
 public:
  explicit ServerIdentityBook(std::vector<std::string> endpoints);

  // A new connection to `endpoint` found `seen`. OK: first contact (learned), the same instance,
  // or a restart that lost nothing. Aborted naming the endpoint: a restart that may have lost
  // this client's writes; it stays pending (and every later connection fails the same way) until
  // accept_restarts().
  Status observe(std::size_t endpoint, ServerIdentity seen);

  // Mutations (PUSH, ERASE, SHRINK) sent to `endpoint`: begin before sending, end after the call.
  void mutation_begins(std::size_t endpoint);
  void mutation_ends(std::size_t endpoint);
  // For a SAVE or LOAD: a token taken before sending it, and its successful reply's generation.
  // The state is synced (clean at `generation`) when no mutation was in flight at the token and
  // none began since.
  uint64_t sync_token(std::size_t endpoint) const;
  void synced(std::size_t endpoint, uint64_t token, uint64_t generation);

  std::vector<ServerRestart> pending_restarts() const;
  // Adopts every pending restart's new instance as it is now (the caller restored it, or chose
  // to go on without what was lost); later connections to it succeed.
  void accept_restarts();
  ServerIdentity identity(std::size_t endpoint) const;

 private:
  struct Entry {
    std::string where;
    ServerIdentity known;
    bool clean = false;  // `clean_generation` holds the server's state as of `clean_at`
    uint64_t clean_generation = 0;
    uint64_t clean_at = 0;   // value of `begun` when the state was clean
    uint64_t begun = 0;      // mutations begun
    uint64_t ended = 0;      // mutations ended
    bool restarted = false;  // a pending restart: `found` is the new identity
    ServerIdentity found;
  };
  ServerRestart restart_of(std::size_t endpoint, const Entry& e) const;

  mutable Mutex mu_;
  std::vector<Entry> entries_ GPUBOX_GUARDED_BY(mu_);
};

// Marks the endpoints a mutation is sent to for its duration (ServerIdentityBook).
class MutationScope {
 public:
  MutationScope(ServerIdentityBook* book, std::vector<std::size_t> endpoints)
      : book_(book), endpoints_(std::move(endpoints)) {
    for (std::size_t e : endpoints_) book_->mutation_begins(e);
  }
  ~MutationScope() {
    for (std::size_t e : endpoints_) book_->mutation_ends(e);
  }
  MutationScope(const MutationScope&) = delete;
  MutationScope& operator=(const MutationScope&) = delete;

 private:
  ServerIdentityBook* book_;
  std::vector<std::size_t> endpoints_;
};

}  // namespace gpubox::table::server
