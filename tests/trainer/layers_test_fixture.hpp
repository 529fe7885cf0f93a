// The fixture of the layer tests (layers_test.cu, layers_slot_pool_test.cu,
// layers_cross_net_test.cu: one binary, trainer_nn_test): one simulated card, its BLAS handle, and
// host vectors uploaded to it. One class for every file, so that gtest sees one fixture type for
// the suite LayersTest.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/blas.hpp"

namespace gpubox::trainer::testing {

class LayersTest : public ::testing::Test {
 protected:
  LayersTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)), blas_(card_) {
    card_.activate();
  }
  template <class T>
  device::device_buffer<T> up(const std::vector<T>& host) {
    return device::to_device(host, card_.memory(), card_.stream());
  }
  device::CardSet cards_;
  device::Card& card_;
  Blas blas_;
};

}  // namespace gpubox::trainer::testing
