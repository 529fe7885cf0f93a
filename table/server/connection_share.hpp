// Fair shares of gpubox_server's connection cap: which open connection gives its slot to a new
// one when the server is at --max_connections (the same rule as the held ranged DENSE writes'
// fair share, ps_store.hpp). A pure function over a snapshot of the connections, so that its
// rule is tested apart from the sockets (connection_share_test.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpubox::table::server {

// Connections beyond --max_connections that may wait, each at most --auth_timeout_s, to
// authenticate (or, without a token, send their first frame) and then take a slot by
// fair_share_victim. A new one beyond takes the place of the oldest waiting of its own share
// address when that address has kMaxWaitingPerAddress waiting, else (the room full) of the address
// waiting with the most. A connection refused when it bound keeps its place until it closes (a new
// one may take it). Within the descriptors a server keeps free of connections (kReservedFds,
// connection_limits.hpp).
inline constexpr std::size_t kMaxWaitingOverCap = 16;
// Of them, from one share address (share_address) at most: a new one beyond takes the slot of the
// oldest of its own address (a full room: of the address waiting with the most).
inline constexpr std::size_t kMaxWaitingPerAddress = kMaxWaitingOverCap / 2;
// How long a server at its cap that found no slot for a new connection refuses the next ones
// without looking again (a flood of refusals costs no census each).
inline constexpr std::chrono::milliseconds kShareRecheck{50};

// One open connection as the cap's fair share sees it.
struct HeldConnection {
  std::string_view address;  // the peer's address, without the port
  // The client id it is bound to (its AUTH's, or its first frame's without a token); connections
  // not bound yet count as one holder per address ("unbound connections of ADDRESS").
  bool bound = false;
  uint64_t client_id = 0;
  // Between calls (no frame started, no reply being written, no BARRIER wait) for a frame's grace
  // at least (Session::holding): the only connections that may give their slot. idle_since:
  // since when.
  bool idle = false;
  std::chrono::steady_clock::time_point idle_since;
};

// Who asks for a slot: its address, and its client id once bound (unbound: a client holding
// nothing yet, as at accept time).
struct Newcomer {
  std::string_view address;
  bool bound = false;
  uint64_t client_id = 0;
};

struct ShareVictim {
  std::size_t index = SIZE_MAX;  // into the snapshot; SIZE_MAX: none
  std::string why;               // names the holder, what it holds and what the newcomer holds
  bool found() const { return index != SIZE_MAX; }
};

// The address one host is counted under (its "share address"), by the connection cap and by what
// PsStore keeps per peer (held ranged DENSE writes, the record of dropped ones, ps_store.hpp):
// every loopback address (127/8, ::1, and IPv4-mapped loopback) is one, as any local process
// picks among them freely; an IPv6 address counts by its /64 (a host is given a whole /64), a
// link-local one by its link's ("fe80::/64%eth0": the peers of one link pick among it freely); an
// IPv4 one (IPv4-mapped included) by itself, as hosts of one cluster share a /24. Anything else
// (unparsed): itself.
std::string share_address(std::string_view address);

// The connection of `held` that gives its slot to `newcomer` (the snapshot excludes it), or none.
// Only a holder (client id) that holds at least two connections more than the newcomer's client
// gives one (or one more, when the connection given has been idle `long_idle`): so a holder never
// gives its last connection, and never ends up holding fewer than the newcomer (no ping-pong
// between equals). Which of them gives, first by address (share_address): of the other
// addresses, the one holding the most connections, when it holds at least two more than the
// newcomer's (or one more, its longest idle connection idle `long_idle`); within it, the
// qualifying holder holding the most there, its connection there idle longest. Else the
// qualifying holder holding the most, its connection idle longest of those at an address holding
// at least as many as the newcomer's (so a host spread over one connection per id cannot take, id
// by id, the pool of a trainer on a host holding fewer). A connection in a call is
// never chosen (a stalled one is closed at its own deadline). So one client (or one address)
// hoarding connections gives way to a trainer holding fewer; but holders of one connection each
// are indistinguishable from trainers and keep their slots: a newcomer finding only those is
// refused, as before the fair share.
ShareVictim fair_share_victim(const std::vector<HeldConnection>& held, const Newcomer& newcomer,
                              std::chrono::steady_clock::time_point now,
                              std::chrono::steady_clock::duration long_idle);

}  // namespace gpubox::table::server
