// Failed AUTH proofs slowed per peer address (an exponential backoff): after the k-th wrong proof
// from an address, that address's next proofs are checked one at a time, the next one no sooner
// than base * 2^(k-1) seconds later (at most max_delay). A right proof forgets the address; so
// does an hour without failures. Thread-safe; remembers at most kMaxAddresses addresses (the
// quietest are forgotten first), so a flood from many addresses costs bounded memory.
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

  // When a proof from `address` that arrived `now` may be checked: `now` for an address without
  // recent failures; else the address's next slot, which this call takes.
  Clock::time_point reserve_check(const std::string& address, Clock::time_point now);
  // A wrong proof from `address`: its failures so far; *delay_s the wait before the next check.
  uint64_t failed(const std::string& address, Clock::time_point now, double* delay_s);
  void succeeded(const std::string& address);

 private:
  struct Entry {
    uint64_t failures = 0;
    Clock::time_point not_before;
    Clock::time_point last_failure;
  };
  Clock::duration delay(uint64_t failures) const;
  // Makes room for one more address.
  void evict_one(Clock::time_point now) GPUBOX_REQUIRES(mu_);

  const double base_delay_s_;
  const double max_delay_s_;
  Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::table::server
