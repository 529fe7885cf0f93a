// flen's logit in float64, written from the network's definition (PaddleRec's models/rank/flen
// net.py), for flen_test and dropout_test: the DNN over every field's embedding; the fields summed
// per group, r_p g_a * g_b over the group pairs in itertools.combinations order
// (FieldWiseBiInteraction's h_mf, what its forward returns), a ReLU'd k x k layer, and the last
// Linear over [that | the DNN's last layer]; with `drop`, PaddleRec's Dropouts after the DNN's
// hidden layers and the bi-interaction's layer (their batch norms are not built).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/trainer/dropout_reference.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "trainer/nn/dense_model_types.hpp"

namespace gpubox::trainer::testing {

// flen's logit of instance i in float64. A field's embedding is its pooled embed_w and embedx
// (k = 1 + mf_dim values, the row's whole embedding); the DNN reads the dnn's input rows (with
// cvm, each slot's show/click features first; then the dense features).
inline double flen_logit(const DenseModelConfig& cfg, const HostBatch& h, int64_t i,
                         const NamedParams& p, const std::vector<double>& rec,
                         const DropoutReference& drop = {}) {
  const std::size_t k = 1 + cfg.mf_dim;
  std::vector<std::vector<double>> e;
  std::vector<double> x;  // the DNN input
  for (const std::vector<double>& sum : pooled_slots(h, cfg, i, rec)) {
    if (cfg.use_cvm) {
      x.push_back(std::log(sum[0] + 1));
      x.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
    }
    e.emplace_back(sum.begin() + 2, sum.end());
    x.insert(x.end(), sum.begin() + 2, sum.end());
  }
  for (int d = 0; d < cfg.dense_dim; ++d) x.push_back(h.dense[i * cfg.dense_dim + d]);
  for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
    x = p.linear("fc_" + std::to_string(l), x, l < cfg.fc_sizes.size());
    if (l < cfg.fc_sizes.size()) drop(l, false, i, x);
  }
  std::vector<std::vector<double>> g;
  std::size_t slot = 0;
  for (int size : cfg.flen_groups) {
    std::vector<double> sum(k, 0.0);
    for (int s = 0; s < size; ++s, ++slot) {
      for (std::size_t c = 0; c < k; ++c) sum[c] += e[slot][c];
    }
    g.push_back(sum);
  }
  std::vector<double> bi(k, 0.0);
  std::size_t pair = 0;
  for (std::size_t a = 0; a < g.size(); ++a) {
    for (std::size_t b = a + 1; b < g.size(); ++b, ++pair) {
      for (std::size_t c = 0; c < k; ++c) bi[c] += p("flen.kernel_mf", pair) * g[a][c] * g[b][c];
    }
  }
  std::vector<double> a(k);
  for (std::size_t o = 0; o < k; ++o) {
    double u = p("flen.fc_b", o);
    for (std::size_t c = 0; c < k; ++c) u += bi[c] * p("flen.fc_w", c * k + o);
    a[o] = std::max(u, 0.0);
  }
  drop.side(i, a);
  double logit = x.at(0);
  for (std::size_t o = 0; o < k; ++o) logit += a[o] * p("flen.out_w", o);
  return logit;
}

}  // namespace gpubox::trainer::testing
