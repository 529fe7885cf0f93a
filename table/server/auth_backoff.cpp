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

AuthBackoff::Entry* AuthBackoff::entry_of(const std::string& host, Clock::time_point now) {
  auto it = entries_.find(host);
  if (it != entries_.end()) {
    if (now - it->second.last_failure <= kForgetAfter) return &it->second;
    entries_.erase(it);
    return nullptr;
  }
  if (overflow_.failures > 0 && now - overflow_.last_failure > kForgetAfter) overflow_ = Entry{};
  return entries_.size() >= kMaxHosts && overflow_.failures > 0 ? &overflow_ : nullptr;
}

AuthBackoff::Clock::time_point AuthBackoff::reserve_check(const std::string& address,
                                                          Clock::time_point now,
                                                          Clock::time_point latest) {
  const std::string host = host_of(address);
  MutexLock lock(mu_);
  Entry* e = entry_of(host, now);
  if (e == nullptr) return now;
  // One check per slot: concurrent connections from one host do not guess in parallel, late
  // ones (past `latest`, checked at once) neither. A proof refused for its wait takes no slot:
  // else a flood of them would push the host's next check (a right proof's too) ever later.
  const Clock::time_point at = std::max(now, e->not_before);
  if (at <= std::max(now, latest)) e->not_before = at + delay(e->failures);
  return at;
}

uint64_t AuthBackoff::failed(const std::string& address, Clock::time_point now, double* delay_s) {
  std::string host = host_of(address);
  MutexLock lock(mu_);
  Entry* e = nullptr;
  auto it = entries_.find(host);
  if (it != entries_.end()) {
    e = &it->second;
  } else if (entries_.size() < kMaxHosts || evict_one(now)) {
    e = &entries_.emplace(std::move(host), Entry{}).first->second;
    e->not_before = now;
  } else {
    if (overflow_.failures > 0 && now - overflow_.last_failure > kForgetAfter) overflow_ = Entry{};
    e = &overflow_;
  }
  ++e->failures;
  e->last_failure = now;
  const Clock::duration wait = delay(e->failures);
  e->not_before = std::max(e->not_before, now + wait);
  if (delay_s != nullptr) *delay_s = std::chrono::duration<double>(wait).count();
  return e->failures;
}

void AuthBackoff::succeeded(const std::string& address) {
  const std::string host = host_of(address);
  MutexLock lock(mu_);
  auto it = entries_.find(host);
  if (it == entries_.end()) return;  // the overflow's failures are not this host's to halve
  it->second.failures /= 2;
  if (it->second.failures == 0) entries_.erase(it);
}

bool AuthBackoff::evict_one(Clock::time_point now) {
  // Never a host still backing off: two hosts failing in turn would evict each other and guess
  // unslowed (each found no entry). Of the others, the one that failed last the longest ago.
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (now - it->second.last_failure > kForgetAfter) {
      entries_.erase(it);
      return true;
    }
    if (it->second.not_before > now) continue;
    if (oldest == entries_.end() || it->second.last_failure < oldest->second.last_failure) {
      oldest = it;
    }
  }
  if (oldest == entries_.end()) return false;
  entries_.erase(oldest);
  return true;
}

}  // namespace gpubox::table::server
