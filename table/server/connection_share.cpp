#include "table/server/connection_share.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

namespace gpubox::table::server {
namespace {

using Clock = std::chrono::steady_clock;

// Who holds a connection: its client id, or (not bound yet) its address.
using Holder = std::tuple<bool, uint64_t, std::string_view>;

Holder holder_of(const HeldConnection& c) {
  return c.bound ? Holder{true, c.client_id, {}} : Holder{false, 0, c.address};
}

std::string holder_name(const Holder& h) {
  if (std::get<0>(h)) return "client " + std::to_string(std::get<1>(h));
  return "the unbound connections of " + std::string(std::get<2>(h));
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
  // Whether `t` gives a slot to a newcomer whose side holds `newcomer` connections.
  bool gives_way(const Tally& t, std::size_t newcomer) const {
    if (t.idlest == SIZE_MAX) return false;
    if (t.count >= newcomer + 2) return true;
    return t.count >= newcomer + 1 && now - held[t.idlest].idle_since >= long_idle;
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

ShareVictim fair_share_victim(const std::vector<HeldConnection>& held, const Newcomer& newcomer,
                              Clock::time_point now, Clock::duration long_idle) {
  const Census census{held, now, long_idle};
  std::map<std::string_view, Tally> addresses;
  std::map<Holder, Tally> holders;
  std::map<std::string_view, std::map<Holder, Tally>> holders_at;
  for (std::size_t i = 0; i < held.size(); ++i) {
    census.add(addresses[held[i].address], i);
    census.add(holders[holder_of(held[i])], i);
    census.add(holders_at[held[i].address][holder_of(held[i])], i);
  }
  ShareVictim victim;
  const auto own_address = addresses.find(newcomer.address);
  const std::size_t at_address = own_address == addresses.end() ? 0 : own_address->second.count;
  for (const auto& [address, tally] : census.by_count(addresses)) {
    if (address == newcomer.address || !census.gives_way(tally, at_address)) continue;
    for (const auto& [holder, there] : census.by_count(holders_at[address])) {
      if (there.idlest == SIZE_MAX) continue;
      victim.index = there.idlest;
      victim.why = "address " + std::string(address) + " holds " + std::to_string(tally.count) +
                   " connections against " + std::to_string(at_address) + " of " +
                   std::string(newcomer.address) + "; of them " + holder_name(holder) + " holds " +
                   std::to_string(there.count) + ", its connection idle longest (" +
                   census.idle_text(there.idlest) + ") gives its slot";
      return victim;
    }
  }
  const Holder own_holder{true, newcomer.client_id, {}};
  const auto own = newcomer.bound ? holders.find(own_holder) : holders.end();
  const std::size_t of_client = own == holders.end() ? 0 : own->second.count;
  for (const auto& [holder, tally] : census.by_count(holders)) {
    if ((newcomer.bound && holder == own_holder) || !census.gives_way(tally, of_client)) continue;
    victim.index = tally.idlest;
    victim.why = holder_name(holder) + " holds " + std::to_string(tally.count) +
                 " connections against " + std::to_string(of_client) + " of " +
                 (newcomer.bound ? "client " + std::to_string(newcomer.client_id)
                                 : std::string("a new client")) +
                 ", its connection idle longest (" + census.idle_text(tally.idlest) +
                 ") gives its slot";
    return victim;
  }
  return victim;
}

}  // namespace gpubox::table::server
