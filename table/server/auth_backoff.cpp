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

std::string AuthBackoff::cause(const std::string& address, const Check& check) {
  if (!check.shared) return "host " + host_of(address);
  return "hosts the server has no room to track (its full table of " + std::to_string(kMaxHosts) +
         " hosts all still back off; host " + host_of(address) + " shares their one backoff)";
}

AuthBackoff::Entry& AuthBackoff::overflow(Clock::time_point now) {
  if (overflow_.failures > 0 && now - overflow_.last_failure > kForgetAfter) overflow_ = Entry{};
  return overflow_;
}

AuthBackoff::Entry* AuthBackoff::entry_of(const std::string& host, Clock::time_point now) {
  auto it = entries_.find(host);
  if (it != entries_.end()) {
    if (now - it->second.last_failure <= kForgetAfter) return &it->second;
    entries_.erase(it);
    return nullptr;
  }
  if (entries_.size() < kMaxHosts || overflow(now).failures == 0) return nullptr;
  // A host that would get an entry of its own at its first failure is not slowed by the others'.
  return evictable(now) == entries_.end() ? &overflow_ : nullptr;
}

AuthBackoff::Check AuthBackoff::reserve_check(const std::string& address, Clock::time_point now,
                                              Clock::time_point latest) {
  const std::string host = host_of(address);
  MutexLock lock(mu_);
  Check check{now};
  Entry* e = entry_of(host, now);
  if (e == nullptr) return check;
  check.shared = e == &overflow_;
  // One check per slot: concurrent connections from one host do not guess in parallel. A proof
  // refused for its wait takes no slot: else a flood of them would push the host's next check (a
  // right proof's too) ever later.
  check.at = std::max(now, e->not_before);
  if (check.at <= latest) {
    check.pushed = delay(e->failures);
    e->not_before = check.at + check.pushed;
  }
  return check;
}

uint64_t AuthBackoff::failed(const std::string& address, Clock::time_point now, double* delay_s) {
  std::string host = host_of(address);
  MutexLock lock(mu_);
  Entry* e = nullptr;
  auto it = entries_.find(host);
  if (it != entries_.end()) {
    e = &it->second;
  } else {
    if (entries_.size() >= kMaxHosts) {
      const auto victim = evictable(now);
      if (victim != entries_.end()) entries_.erase(victim);
    }
    if (entries_.size() < kMaxHosts) {
      e = &entries_.emplace(std::move(host), Entry{}).first->second;
      e->not_before = now;
    } else {
      e = &overflow(now);
    }
  }
  ++e->failures;
  e->last_failure = now;
  const Clock::duration wait = delay(e->failures);
  e->not_before = std::max(e->not_before, now + wait);
  if (delay_s != nullptr) *delay_s = std::chrono::duration<double>(wait).count();
  return e->failures;
}

void AuthBackoff::succeeded(const std::string& address, const Check& check) {
  const std::string host = host_of(address);
  MutexLock lock(mu_);
  if (check.shared) {
    // A trainer's right proof through the overflow costs the others no slot.
    overflow_.failures /= 2;
    overflow_.not_before = std::max(check.at, overflow_.not_before - check.pushed);
    return;
  }
  auto it = entries_.find(host);
  if (it == entries_.end()) return;
  it->second.failures /= 2;
  if (it->second.failures == 0) entries_.erase(it);
}

std::unordered_map<std::string, AuthBackoff::Entry>::iterator AuthBackoff::evictable(
    Clock::time_point now) {
  // Never a host still backing off: two hosts failing in turn would evict each other and guess
  // unslowed (each found no entry). Of the others, the one that failed last the longest ago.
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (now - it->second.last_failure > kForgetAfter) return it;
    if (it->second.not_before > now) continue;
    if (oldest == entries_.end() || it->second.last_failure < oldest->second.last_failure) {
      oldest = it;
    }
  }
  return oldest;
}

}  // namespace gpubox::table::server
