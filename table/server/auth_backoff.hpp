// Failed AUTH proofs slowed per peer host (an exponential backoff): after the k-th wrong proof
// from a host, that host's next proofs are checked one at a time, the next one no sooner than
// base * 2^(k-1) seconds later (at most max_delay). A host is a peer address's share address
// (connection_share.hpp: an IPv4-mapped IPv6 address is its IPv4 one, an IPv6 address counts by
// its /64, every loopback address is one), so that a client cannot escape its backoff by
// connecting from another address of its own. A right proof halves its host's failures (a guesser
// beside busy trainers is not reset by each trainer's connection); an hour without failures
// forgets the host. Thread-safe; remembers at most kMaxHosts hosts, so a flood from many costs
// bounded memory. To make room it forgets a host quiet for an hour, else of the hosts no longer
// backing off the one that failed last the longest ago; it never forgets a host still backing
// off: when all are, the hosts it has no room for share one overflow entry (their failures count
// there, and its backoff slows them), so that two hosts cannot take turns evicting each other to
// guess unslowed. A host without an entry is slowed by the overflow only while no entry could be
// forgotten (every host still backing off): once an attack pauses, new hosts go unslowed. The
// overflow halves on a right proof through it, which also gives back the slot it took, and is
// forgotten after an hour without failures, like an entry.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/thread_annotations.hpp"

namespace gpubox::table::server {

class AuthBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxHosts = 4096;

  AuthBackoff(double base_delay_s, double max_delay_s);

  // A proof's check: when, and whether the shared overflow entry slowed it.
  struct Check {
    Clock::time_point at;
    bool shared = false;        // its host had no entry, and the full table no room for one
    Clock::duration pushed{0};  // how far it pushed the next check of its entry
  };

  // When a proof from peer `address` that arrived `now` may be checked: `now` for a host without
  // recent failures; else its host's next slot, which this call takes when it is at `latest`
  // (>= now) at the latest (a proof that cannot wait that long, refused, leaves the slot to the
  // next one).
  Check reserve_check(const std::string& address, Clock::time_point now,
                      Clock::time_point latest = Clock::time_point::max());
  // A wrong proof from peer `address`: its host's failures so far; *delay_s the wait before the
  // host's next check.
  uint64_t failed(const std::string& address, Clock::time_point now, double* delay_s);
  // A right proof from peer `address`, checked by `check`: its host's failures are halved
  // (forgotten at 0); through the overflow, the overflow's are, and the slot it took is given back.
  void succeeded(const std::string& address, const Check& check);
  // What a proof refused for `check`'s wait waits for: "host H" or the full table's overflow.
  static std::string cause(const std::string& address, const Check& check);

  // The host a peer address's failures are counted under (its share address).
  static std::string host_of(const std::string& address);

 private:
  struct Entry {
    uint64_t failures = 0;
    Clock::time_point not_before;
    Clock::time_point last_failure;
  };
  Clock::duration delay(uint64_t failures) const;
  // The entry `host`'s proofs are slowed by at `now`: its own, else the overflow's while the
  // table is full of hosts still backing off and the overflow remembers failures; null when none
  // (forgetting an hour-old).
  Entry* entry_of(const std::string& host, Clock::time_point now) GPUBOX_REQUIRES(mu_);
  // The overflow, forgotten first when its last failure is over an hour old.
  Entry& overflow(Clock::time_point now) GPUBOX_REQUIRES(mu_);
  // The entry a full table would forget to make room at `now` (see the top); end() when every
  // host is still backing off.
  std::unordered_map<std::string, Entry>::iterator evictable(Clock::time_point now)
      GPUBOX_REQUIRES(mu_);

  const double base_delay_s_;
  const double max_delay_s_;
  Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ GPUBOX_GUARDED_BY(mu_);  // by host
  Entry overflow_ GPUBOX_GUARDED_BY(mu_);  // the hosts a full table had no room for
};

}  // namespace gpubox::table::server
