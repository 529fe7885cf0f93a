// Failed AUTH proofs slowed per peer host (an exponential backoff): after the k-th wrong proof
// from a host, that host's next proofs are checked one at a time, the next one no sooner than
// base * 2^(k-1) seconds later (at most max_delay). A host is a peer address's share address
// (connection_share.hpp: an IPv4-mapped IPv6 address is its IPv4 one, an IPv6 address counts by
// its /64, every loopback address is one), so that a client cannot escape its backoff by
// connecting from another address of its own. A right proof forgets the host; so does an hour
// without failures. Thread-safe; remembers at most kMaxAddresses hosts, so a flood from many
// costs bounded memory: the one forgotten to make room is the one with the fewest failures (the
// quietest of them), so that a flood of new hosts cannot reset the backoff of one that failed
// often.
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
  static constexpr std::size_t kMaxAddresses = 4096;

  AuthBackoff(double base_delay_s, double max_delay_s);

  // When a proof from peer `address` that arrived `now` may be checked: `now` for a host without
  // recent failures; else its host's next slot, which this call takes when it is at `latest` at
  // the latest (a proof that cannot wait that long, refused, leaves the slot to the next one).
  Clock::time_point reserve_check(const std::string& address, Clock::time_point now,
                                  Clock::time_point latest = Clock::time_point::max());
  // A wrong proof from peer `address`: its host's failures so far; *delay_s the wait before the
  // host's next check.
  uint64_t failed(const std::string& address, Clock::time_point now, double* delay_s);
  // A right proof from peer `address`: its host is forgotten.
  void succeeded(const std::string& address);

  // The host a peer address's failures are counted under (its share address).
  static std::string host_of(const std::string& address);

 private:
  struct Entry {
    uint64_t failures = 0;
    Clock::time_point not_before;
    Clock::time_point last_failure;
  };
  Clock::duration delay(uint64_t failures) const;
  // Makes room for one more host: forgets one failing for the last time over an hour ago, else
  // the one with the fewest failures, the quietest of them.
  void evict_one(Clock::time_point now) GPUBOX_REQUIRES(mu_);

  const double base_delay_s_;
  const double max_delay_s_;
  Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ GPUBOX_GUARDED_BY(mu_);  // by host
};

}  // namespace gpubox::table::server
