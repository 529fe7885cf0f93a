// The dense net's dropout (hyper_parameters.dnn_dropout) in float64, for the networks' reference
// logits: the mask from the model's own hash (trainer/nn/dropout.hpp) at a fixed step, the scale
// from the rate (1 / (1-p)^2 for a hidden layer, PaddleRec's two Dropouts, 1 / (1-p)^3 for flen's
// three; 1 / (1-p) for the output and flen's bi-interaction layer), not from the model.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "trainer/nn/dropout.hpp"

namespace gpubox::trainer::testing {

struct DropoutReference {
  const MlpDropout* dropout = nullptr;  // null or off: identity
  double p = 0.0;
  uint64_t step = 1;
  int hidden_dropouts = 2;  // PaddleRec's Dropouts per hidden unit: flen's net has 3

  // Instance i's outputs x of hidden layer l (output: the dnn's 1-wide output, l = the hidden
  // count), in place.
  void operator()(std::size_t l, bool output, int64_t i, std::vector<double>& x) const {
    if (dropout == nullptr || !dropout->on() || (output && !dropout->drops_output())) return;
    const double keep = output ? 1.0 - p : std::pow(1.0 - p, hidden_dropouts);
    apply(dropout->mask(l), keep, i, x);
  }
  // Instance i's side layer (flen's bi-interaction, mask hidden + 1), in place.
  void side(int64_t i, std::vector<double>& x) const {
    if (dropout == nullptr || !dropout->drops_side()) return;
    apply(dropout->mask(static_cast<std::size_t>(dropout->hidden()) + 1), 1.0 - p, i, x);
  }

 private:
  void apply(const DropoutMask& mask, double keep, int64_t i, std::vector<double>& x) const {
    const uint64_t key = mask.step_key(step);
    for (std::size_t c = 0; c < x.size(); ++c) {
      x[c] = mask.keeps(key, static_cast<uint64_t>(i) * x.size() + c) ? x[c] / keep : 0.0;
    }
  }
};

}  // namespace gpubox::trainer::testing
