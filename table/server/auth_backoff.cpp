#include "table/server/auth_backoff.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "table/server/connection_share.hpp"

namespace gpubox::table::server {
namespace {
constexpr auto kForgetAfter = std::chrono::hours(1);
}  // namespace

AuthBackoff::AuthBackoff(double base_delay_s, double max_delay_s)
    : base_delay_s_(std::max(0.0, base_delay_s)),
      max_delay_s_(std::max(base_delay_s_, max_delay_s)) {}

AuthBackoff::Clock::duration AuthBackoff::delay(uint64_t failures) const {
  const double exponent = static_cast<double>(std::min<uint64_t>(failures, 64) - 1);
  const double seconds = std::min(max_delay_s_, base_delay_s_ * std::pow(2.0, exponent));
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string AuthBackoff::host_of(const std::string& address) { return share_address(address); }

AuthBackoff::Clock::time_point AuthBackoff::reserve_check(const std::string& address,
                                                          Clock::time_point now,
                                                          Clock::time_point latest) {
  const std::string host = host_of(address);
  MutexLock lock(mu_);
  auto it = entries_.find(host);
  if (it == entries_.end()) return now;
  Entry& e = it->second;
  if (now - e.last_failure > kForgetAfter) {
    entries_.erase(it);
    return now;
  }
  // One check per slot: concurrent connections from one address do not guess in parallel.
  // A proof refused for its wait takes no slot: else a flood of them would push the host's next
  // check (a right proof's too) ever later.
  const Clock::time_point at = std::max(now, e.not_before);
  if (at <= latest) e.not_before = at + delay(e.failures);
  return at;
}

uint64_t AuthBackoff::failed(const std::string& address, Clock::time_point now, double* delay_s) {
  std::string host = host_of(address);
  MutexLock lock(mu_);
  auto it = entries_.find(host);
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxAddresses) evict_one(now);
    it = entries_.emplace(std::move(host), Entry{}).first;
    it->second.not_before = now;
  }
  Entry& e = it->second;
  ++e.failures;
  e.last_failure = now;
  const Clock::duration wait = delay(e.failures);
  e.not_before = std::max(e.not_before, now + wait);
  if (delay_s != nullptr) *delay_s = std::chrono::duration<double>(wait).count();
  return e.failures;
}

void AuthBackoff::succeeded(const std::string& address) {
  const std::string host = host_of(address);
  MutexLock lock(mu_);
  entries_.erase(host);
}

void AuthBackoff::evict_one(Clock::time_point now) {
  // Not the quietest alone: a host that failed often and then paused while a flood of new hosts
  // failed once each would be forgotten, its backoff reset.
  const auto cheaper = [](const Entry& a, const Entry& b) {
    return a.failures != b.failures ? a.failures < b.failures : a.last_failure < b.last_failure;
  };
  auto cheapest = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (now - it->second.last_failure > kForgetAfter) {
      entries_.erase(it);
      return;
    }
    if (cheaper(it->second, cheapest->second)) cheapest = it;
  }
  if (cheapest != entries_.end()) entries_.erase(cheapest);
}

}  // namespace gpubox::table::server
