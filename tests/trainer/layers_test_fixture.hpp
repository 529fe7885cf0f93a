// The fixture of the layer tests (layers_test.cu, layers_slot_pool_test.cu,
// layers_cross_net_test.cu: one binary, trainer_nn_test): one simulated card (OneCard) and its
// BLAS handle. One class for every file, so that gtest sees one fixture type for the suite
// LayersTest.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/blas.hpp"

namespace gpubox::trainer::testing {

class LayersTest : public ::testing::Test, protected OneCard {
 protected:
  LayersTest() : blas_(card_) {}
  Blas blas_;
};

}  // namespace gpubox::trainer::testing
