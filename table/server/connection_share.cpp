#include "table/server/connection_share.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

namespace gpubox::table::server {
namespace {

using Clock = std::chrono::steady_clock;

const char kLoopback[] = "loopback";

bool ipv4_loopback(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

// Who holds a connection: its client id, or (not bound yet) its share address.
using Holder = std::tuple<bool, uint64_t, std::string>;

Holder holder_of(const HeldConnection& c, const std::string& address) {
  return c.bound ? Holder{true, c.client_id, {}} : Holder{false, 0, address};
}

std::string holder_name(const Holder& h) {
  if (std::get<0>(h)) return "client " + std::to_string(std::get<1>(h));
  return "the unbound connections of " + std::get<2>(h);
}

// What one holder (or address) holds: how many connections, and its connection idle longest.
struct Tally {
  std::size_t count = 0;
  std::size_t idlest = SIZE_MAX;
};

struct Census {
  const std::vector<HeldConnection>& held;
  Clock::time_point now;
  Clock::duration long_idle;

  void add(Tally& t, std::size_t i) const {
    ++t.count;
    if (held[i].idle && (t.idlest == SIZE_MAX || held[i].idle_since < held[t.idlest].idle_since)) {
      t.idlest = i;
    }
  }
  bool idle_long(std::size_t i) const {
    return i != SIZE_MAX && now - held[i].idle_since >= long_idle;
  }
  // Whether an address holding `t` is over a newcomer whose address holds `newcomer`.
  bool address_over(const Tally& t, std::size_t newcomer) const {
    if (t.idlest == SIZE_MAX) return false;
    return t.count >= newcomer + 2 || (t.count >= newcomer + 1 && idle_long(t.idlest));
  }
  // Whether a holder of `count` connections gives connection `i` (SIZE_MAX: none idle) to a
  // newcomer client holding `newcomer`: never its last one.
  bool holder_gives(std::size_t count, std::size_t i, std::size_t newcomer) const {
    if (i == SIZE_MAX || count < 2) return false;
    return count >= newcomer + 2 || (count >= newcomer + 1 && idle_long(i));
  }
  // `tallies` by count, the most first (ties: the one idle longest first).
  template <class Key>
  std::vector<std::pair<Key, Tally>> by_count(const std::map<Key, Tally>& tallies) const {
    std::vector<std::pair<Key, Tally>> out(tallies.begin(), tallies.end());
    const auto idle_rank = [&](const Tally& t) {
      return t.idlest == SIZE_MAX ? Clock::time_point::max() : held[t.idlest].idle_since;
    };
    std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
      if (a.second.count != b.second.count) return a.second.count > b.second.count;
      return idle_rank(a.second) < idle_rank(b.second);
    });
    return out;
  }
  std::string idle_text(std::size_t i) const {
    char text[48];
    std::snprintf(text, sizeof(text), "%.3g s",
                  std::chrono::duration<double>(now - held[i].idle_since).count());
    return text;
  }
};

}  // namespace

std::string share_address(std::string_view address) {
  const std::string text(address);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return ipv4_loopback(v4) ? kLoopback : text;
  // A link-local address carries its interface ("fe80::1%eth0"), which inet_pton refuses: parsed
  // without it, and its link's /64 keeps it (one link's peers pick among fe80::/64 freely).
  const std::size_t percent = text.find('%');
  const std::string scope = percent == std::string::npos ? std::string() : text.substr(percent);
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.substr(0, percent).c_str(), &v6) != 1) return text;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return kLoopback;
  char out[INET6_ADDRSTRLEN] = {};
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4, v6.s6_addr + 12, sizeof(v4));
    if (ipv4_loopback(v4)) return kLoopback;
    return inet_ntop(AF_INET, &v4, out, sizeof(out)) != nullptr ? out : text;
  }
  std::memset(v6.s6_addr + 8, 0, 8);
  return inet_ntop(AF_INET6, &v6, out, sizeof(out)) != nullptr ? std::string(out) + "/64" + scope
                                                               : text;
}

ShareVictim fair_share_victim(const std::vector<HeldConnection>& held, const Newcomer& newcomer,
                              Clock::time_point now, Clock::duration long_idle) {
  const Census census{held, now, long_idle};
  std::map<std::string, Tally> addresses;
  std::map<Holder, Tally> holders;
  std::map<std::string, std::map<Holder, Tally>> holders_at;
  std::vector<std::pair<std::string, Holder>> of(held.size());  // share address, holder
  for (std::size_t i = 0; i < held.size(); ++i) {
    const std::string address = share_address(held[i].address);
    of[i] = {address, holder_of(held[i], address)};
    census.add(addresses[address], i);
    census.add(holders[of[i].second], i);
    census.add(holders_at[address][of[i].second], i);
  }
  const std::string own_address = share_address(newcomer.address);
  const auto own_at = addresses.find(own_address);
  const std::size_t at_address = own_at == addresses.end() ? 0 : own_at->second.count;
  // By client, a holder gives only a connection at an address holding at least as many as the
  // newcomer's: a host spread over one connection per id cannot take, id by id, the pooled
  // connections of a trainer on a host holding fewer.
  std::map<Holder, Tally> givable;
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (addresses.at(of[i].first).count >= at_address) census.add(givable[of[i].second], i);
  }
  const Holder own_holder{true, newcomer.client_id, {}};
  const auto own = newcomer.bound ? holders.find(own_holder) : holders.end();
  const std::size_t of_client = own == holders.end() ? 0 : own->second.count;
  const std::string taker =
      newcomer.bound ? "client " + std::to_string(newcomer.client_id) : std::string("a new client");
  const auto holds = [&](const Holder& holder, std::size_t count) {
    return holder_name(holder) + " holds " + std::to_string(count) + " connections against " +
           std::to_string(of_client) + " of " + taker;
  };
  ShareVictim victim;
  for (const auto& [address, tally] : census.by_count(addresses)) {
    if (address == own_address || !census.address_over(tally, at_address)) continue;
    for (const auto& [holder, there] : census.by_count(holders_at[address])) {
      const std::size_t count = holders.at(holder).count;
      if ((newcomer.bound && holder == own_holder) ||
          !census.holder_gives(count, there.idlest, of_client)) {
        continue;
      }
      victim.index = there.idlest;
      victim.why = "address " + address + " holds " + std::to_string(tally.count) +
                   " connections against " + std::to_string(at_address) + " of " + own_address +
                   "; of them " + holds(holder, count) + ", its connection there idle longest (" +
                   census.idle_text(there.idlest) + ") gives its slot";
      return victim;
    }
  }
  for (const auto& [holder, tally] : census.by_count(holders)) {
    const auto there = givable.find(holder);
    const std::size_t idlest = there == givable.end() ? SIZE_MAX : there->second.idlest;
    if ((newcomer.bound && holder == own_holder) ||
        !census.holder_gives(tally.count, idlest, of_client)) {
      continue;
    }
    victim.index = idlest;
    victim.why = holds(holder, tally.count) + ", its connection idle longest (" +
                 census.idle_text(idlest) + ") gives its slot";
    return victim;
  }
  return victim;
}

}  // namespace gpubox::table::server
