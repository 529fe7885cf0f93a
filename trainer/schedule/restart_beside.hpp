// What else failed on a trainer where it found a server restart: the failures that name no
// restarted server (a device fault, another server down), named beside the restart in what the
// user sees (docs/operations.md, "Durability and resume"). Every mode's recovery names them the
// same way (engine/trainer_recovery.cpp, ps_modes/ps_trainer_recovery.cpp).
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "table/host_tier.hpp"

namespace gpubox::trainer {

// Beside a restart, at most this many distinct card failures are named; the rest are counted.
inline constexpr std::size_t kCardFailuresNamed = 4;

// The failures of `failures` (every card that failed in a phase) that name no restart `host`
// found, each distinct failure once with the cards that met it ("card 0: ...; cards 1, 2:
// ..."), the first kCardFailuresNamed of them, then how many cards more ("; and 2 more cards");
// "" when none. A card whose error only tells of another failure (Failure::told: another
// thread's, another trainer's restart heard at a sync barrier, the communicator's abort for
// another card's failure) failed because of it: left out.
std::string card_failures_beside_restart(const std::vector<device::CardsFailed::Failure>& failures,
                                         table::HostTier& host);

// What `failure` (a trainer's, in the phase where it found a server restart) holds beside the
// restart: "" when it is the restart's own (the call that found the restart, or one cut off as
// the server went down, names a restarted server: SaveLineage::names_a_restart); with several
// cards (device::CardsFailed), card_failures_beside_restart; "" for a FailureTold;
// else its message.
std::string failure_beside_restart(const std::exception& failure, table::HostTier& host);

}  // namespace gpubox::trainer
