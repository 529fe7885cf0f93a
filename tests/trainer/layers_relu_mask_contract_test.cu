// What a linear layer whose input is a ReLU's output (LinearGemmSpec::input_is_relu) refuses, the
// same on both backends: cuBLASLt's DRELU reads the bit mask its producer's fused forward recorded
// for whole rows (linear_gemms_cublaslt.cpp); oneDNN masks by X itself and would run, so the cpu
// build checks the GPU's contract too (linear_gemms_onednn.cpp), and a misuse fails here first.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "tests/trainer/layers_test_fixture.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using testing::LayersTest;

// A producer a (in 2 -> 4, ReLU unless told) and a consumer b (4 -> 1, input_is_relu).
LinearGemmSpec producer_spec(bool relu, int out = 4) {
  LinearGemmSpec a;
  a.name = "a";
  a.in = 2;
  a.out = out;
  a.relu = relu;
  a.x_ld = 2;
  a.y_ld = a.dz_ld = out;
  return a;
}
LinearGemmSpec consumer_spec(int dx_cols = 4) {
  LinearGemmSpec b;
  b.name = "b";
  b.in = 4;
  b.out = 1;
  b.input_is_relu = true;
  b.dx_cols = dx_cols;
  b.x_ld = b.dx_ld = 4;
  b.y_ld = b.dz_ld = 1;
  return b;
}

// `run` throws an Error whose message contains `part`.
template <class Run>
void expect_error(Run run, const std::string& part) {
  try {
    run();
    ADD_FAILURE() << "no error; expected one saying \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_F(LayersTest, AReluMaskCoversWholeInputRows) {
  DenseParameters params(card_);
  for (const int cols : {0, 1, 3}) {
    expect_error([&] { const Linear refused(params, blas_, consumer_spec(cols)); },
                 "layer b: the ReLU mask covers whole input rows");
  }
  Linear whole(params, blas_, consumer_spec(4));
  EXPECT_EQ(whole.spec().dx_cols, 4);
}

// backward_data of b on batch `batch` after a's forward of `forward_batch` rows (none when < 0),
// both prepared for batches 2 and 3.
void consumer_backward(device::Card& card, Blas& blas, const LinearGemmSpec& producer,
                       int forward_batch, int batch) {
  DenseParameters params(card);
  Linear a(params, blas, producer);
  Linear b(params, blas, consumer_spec());
  params.finalize(1);
  for (const int rows : {2, 3}) {
    a.prepare(rows);
    b.prepare(rows);
  }
  const auto buffer = [&card](int n) {
    return device::to_device(std::vector<float>(static_cast<std::size_t>(n), 1.0f), card.memory(),
                             card.stream());
  };
  auto x = buffer(3 * 2), y = buffer(3 * producer.out), dz = buffer(3), dx = buffer(3 * 4);
  if (forward_batch >= 0) a.forward(params, x.data(), y.data(), forward_batch);
  b.backward_data(params, dz.data(), y.data(), &a, 1.0f, dx.data(), batch);
  card.stream().synchronize();
}

TEST_F(LayersTest, AReluMaskIsItsProducersLastForwardOfTheBatch) {
  consumer_backward(card_, blas_, producer_spec(true), 2, 2);  // the contract: runs
  expect_error([&] { consumer_backward(card_, blas_, producer_spec(false), 2, 2); },
               "layer b: its producer a records no matching ReLU mask");
  expect_error([&] { consumer_backward(card_, blas_, producer_spec(true, 5), 2, 2); },
               "layer b: its producer a records no matching ReLU mask");
  // Prepared but never run, or last run for another batch: no mask of these rows.
  expect_error([&] { consumer_backward(card_, blas_, producer_spec(true), -1, 2); },
               "layer b: its producer a ran no forward of batch 2 before it (its last: -1)");
  expect_error([&] { consumer_backward(card_, blas_, producer_spec(true), 3, 2); },
               "layer b: its producer a ran no forward of batch 2 before it (its last: 3)");
}

}  // namespace
}  // namespace gpubox::trainer
