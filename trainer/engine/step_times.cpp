#include "trainer/engine/step_times.hpp"

#include <algorithm>
#include <cmath>

#include "trainer/engine/trainer.hpp"

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

// Declared in trainer.hpp (its tests use it); defined here with the rest of the pass report's
// step figures.
void append_step_counts(const std::vector<device::DeviceCounts>& per_card, std::size_t steps,
                        uint64_t max_pipeline_waits, PassReport* report) {
  if (steps == 0 || per_card.empty()) return;
  device::DeviceCounts total;
  for (const auto& counts : per_card) total += counts;
  const double per_step = 1.0 / (static_cast<double>(steps) * static_cast<double>(per_card.size()));
  auto& extra = report->extra;
  extra.emplace_back("steady_steps", static_cast<double>(steps));
  extra.emplace_back("host_syncs_per_step", total.host_syncs * per_step);
  // The host's waits for the step a late readback's full ring holds (the card behind its host:
  // at most 1 a step; counters.hpp), apart from the round trips above.
  extra.emplace_back("pipeline_waits_per_step", total.pipeline_waits * per_step);
  // The most of them one card's step counted (the bound is per step, not on the average).
  extra.emplace_back("max_pipeline_waits_in_a_step", static_cast<double>(max_pipeline_waits));
  extra.emplace_back("allocations_per_step", total.allocations * per_step);
  extra.emplace_back("frees_per_step", total.frees * per_step);
  extra.emplace_back("pinned_allocations_per_step", total.pinned_allocations * per_step);
  extra.emplace_back("pageable_copies_per_step", total.pageable_copies * per_step);
  extra.emplace_back("pinned_copies_per_step", total.pinned_copies * per_step);
  // Of those, on the card's copy stream (overlapping the compute stream's work), and the waits
  // one stream of the card made for another's event (the card orders them; not a host wait).
  extra.emplace_back("copy_stream_copies_per_step", total.copy_stream_copies * per_step);
  extra.emplace_back("stream_waits_per_step", total.stream_waits * per_step);
  // Launches and collectives the host enqueued itself, outside step graphs; the graphs' work is
  // in graph_nodes (heterps/device/step_graph.hpp). Both count the same work on either backend
  // except a batch norm's (trainer/nn/batch_norm.hpp): CUDA stages its column sums, 2 launches
  // (or nodes) more per norm layer and step than the cpu backend's one pass counts.
  extra.emplace_back("launches_per_step", total.launches * per_step);
  extra.emplace_back("launches_outside_graph_per_step", total.launches * per_step);
  extra.emplace_back("collectives_per_step", total.collectives * per_step);
  extra.emplace_back("card_copies_per_step", total.card_copies * per_step);
  extra.emplace_back("graph_launches_per_step", total.graph_launches * per_step);
  extra.emplace_back("graph_nodes_per_step", total.graph_nodes * per_step);
  // Captures, not replays: a steady step replays, so a capture there means something a graph
  // bakes in (a batch shape, a buffer, a host scalar) changed (heterps/device/step_graph.hpp).
  extra.emplace_back("graph_captures_per_step", total.graph_captures * per_step);
  // The same captures summed over the cards and steady steps (a growth between the steps makes
  // the card's graphs captured again).
  extra.emplace_back("steady_graph_captures", static_cast<double>(total.graph_captures));
}

void append_eval_step_counts(const std::vector<device::DeviceCounts>& per_card, std::size_t steps,
                             uint64_t max_pipeline_waits,
                             std::vector<std::pair<std::string, double>>* extra) {
  PassReport counts;
  append_step_counts(per_card, steps, max_pipeline_waits, &counts);
  for (auto& [name, value] : counts.extra) extra->emplace_back("eval_" + name, value);
}

}  // namespace gpubox::trainer
