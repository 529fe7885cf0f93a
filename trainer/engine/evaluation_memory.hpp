// An evaluation's batch is allocated at the run's first evaluation, an epoch of training in: a
// batch whose network input alone is more than a card can take is refused at start instead,
// naming runner.infer_batch_size (a helper's probe: it failed after the first epoch). Every mode
// checks it where it sets up its cards (Trainer, PsTrainer).
#pragma once

#include "heterps/device/card.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

// The bytes of one evaluation batch's network input on a card, a lower bound of what the
// evaluation allocates for any network: runner.infer_batch_size instances of every slot's pooled
// values (the narrowest slot's width) and the dense values.
double evaluation_input_bytes(const TrainerConfig& config);

// Throws naming runner.infer_batch_size, the bytes and the card when a run that evaluates (test
// data, or an evaluating job) has a batch whose input does not fit a local card's free memory.
void check_evaluation_batch(device::CardSet& cards, const TrainerConfig& config);

}  // namespace gpubox::trainer
