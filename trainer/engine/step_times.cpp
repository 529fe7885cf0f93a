#include "trainer/engine/step_times.hpp"

#include <algorithm>
#include <cmath>

namespace gpubox::trainer {

double nearest_rank_quantile(std::vector<double>* values, double q) {
  if (values->empty()) return 0.0;
  std::sort(values->begin(), values->end());
  const double n = static_cast<double>(values->size());
  const auto rank = static_cast<std::size_t>(std::max(1.0, std::ceil(q * n - 1e-9)));
  return (*values)[std::min(rank, values->size()) - 1];
}

void append_step_times(const std::vector<std::vector<double>>& seconds_per_card,
                       PassReport* report) {
  std::vector<double> all;
  for (const auto& card : seconds_per_card) all.insert(all.end(), card.begin(), card.end());
  if (all.empty()) return;
  const double p50 = nearest_rank_quantile(&all, 0.50);
  const double p99 = nearest_rank_quantile(&all, 0.99);
  report->extra.emplace_back("step_ms_p50", p50 * 1e3);
  report->extra.emplace_back("step_ms_p99", p99 * 1e3);
  report->extra.emplace_back("step_ms_max", all.back() * 1e3);
}

void append_card_memory_peak(device::CardSet& cards, PassReport* report) {
  std::size_t peak = 0;
  for (int c = 0; c < cards.num_local_cards(); ++c) {
    peak = std::max(peak, cards.card(c).memory().peak_bytes());
  }
  report->extra.emplace_back("card_memory_peak_mb", static_cast<double>(peak) / (1 << 20));
}

}  // namespace gpubox::trainer
