// One simulated card for the trainer tests' fixtures (layers, networks, the dense model): card
// "0", active on the test's thread, and host vectors uploaded to it.
#pragma once

#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::trainer::testing {

class OneCard {
 protected:
  OneCard() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) { card_.activate(); }

  template <class T>
  device::device_buffer<T> up(const std::vector<T>& host) {
    return device::to_device(host, card_.memory(), card_.stream());
  }

  device::CardSet cards_;
  device::Card& card_;
};

}  // namespace gpubox::trainer::testing
