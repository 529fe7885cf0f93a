#include "trainer/engine/evaluation_memory.hpp"

#include <algorithm>
#include <cstdio>

#include "common/config/memory_asks.hpp"
#include "common/error.hpp"
#include "heterps/device/card_setup.hpp"

namespace gpubox::trainer {

double evaluation_input_bytes(const TrainerConfig& config) {
  const DenseModelConfig m = config.dense_model_config();
  const int narrowest =
      m.slot_dims.empty() ? m.mf_dim : *std::min_element(m.slot_dims.begin(), m.slot_dims.end());
  // A slot pools to its embed_w, its embedx and (use_cvm) two show/click features.
  const double per_instance =
      static_cast<double>(m.slots) * (1.0 + narrowest + (m.use_cvm ? 2 : 0)) + m.dense_dim;
  return per_instance * sizeof(float) * static_cast<double>(config.runner.infer_batch_size);
}

void check_evaluation_batch(device::CardSet& cards, const TrainerConfig& config) {
  const bool evaluates = !config.runner.test_data_dir.empty() ||
                         !config.runner.test_data_dirs.empty() ||
                         config.evaluated_files.has_value();
  if (!evaluates) return;
  const double bytes = evaluation_input_bytes(config);
  for (int c = 0; c < cards.num_local_cards(); ++c) {
    const std::size_t free = device::card_free_bytes(cards.card(c), cards.num_local_cards());
    GPUBOX_EXPECTS(free == 0 || bytes <= static_cast<double>(free), config.config_path,
                   ": runner.infer_batch_size = ", config.runner.infer_batch_size, ": at least ",
                   config::bytes_text(bytes),
                   " of the network's input per card and evaluation step, more than the ",
                   config::bytes_text(static_cast<double>(free)), " card ", cards.card(c).rank(),
                   " can take: the run would fail at its first evaluation; lower "
                   "runner.infer_batch_size");
  }
}

}  // namespace gpubox::trainer
