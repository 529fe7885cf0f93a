// Card counts in tests. The cpu backend simulates any number of cards; on the cuda backend a
// test runs on the GPUs the machine has and skips, saying why, when it needs more (the CUDA
// build's tests run on whatever GPU machine gpu_check.sh lands on: 1 GPU or 8).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "heterps/device/card.hpp"

namespace gpubox::device::testing {

// The first `cards` cards as CardSet::from_list takes them: "0,1,...".
inline std::string card_list(int cards) {
  std::string list;
  for (int c = 0; c < cards; ++c) list += (c ? "," : "") + std::to_string(c);
  return list;
}

// "" when `cards` cards can be made here, else the reason a test needing them is skipped.
inline std::string missing_cards(int cards) {
  const int gpus = visible_gpus();
  if (gpus < 0 || cards <= gpus) return "";
  return "needs " + std::to_string(cards) + " GPUs, this machine has " + std::to_string(gpus);
}

// The cards a test that checks the same thing on fewer cards runs on here: `cards` on the cpu
// backend, as many of them as this machine has GPUs on cuda (a 1-GPU machine runs it on one card
// rather than skipping it). A test whose check needs `cards` cards skips instead
// (GPUBOX_REQUIRE_CARDS).
inline int cards_here(int cards) {
  const int gpus = visible_gpus();
  return gpus < 0 ? cards : std::max(1, std::min(cards, gpus));
}

// The card of trainer `w` of a job of several trainers in one process: on cuda a GPU each, as a
// launcher gives them (FLAGS_selected_gpus=w: NCCL refuses two ranks on one GPU); the cpu
// backend's simulated card 0 for every trainer.
inline std::string trainer_card(int w) { return visible_gpus() < 0 ? "0" : std::to_string(w); }

}  // namespace gpubox::device::testing

// At the top of a test body (or SetUp): skips the test when the machine lacks `cards` cards.
#define GPUBOX_REQUIRE_CARDS(cards)                                                            \
  do {                                                                                         \
    const std::string gpubox_missing_cards_ = ::gpubox::device::testing::missing_cards(cards); \
    if (!gpubox_missing_cards_.empty()) GTEST_SKIP() << gpubox_missing_cards_;                 \
  } while (0)

// Skips a test that exercises the in-process communicator's own semantics (mismatch detection,
// its messages, its allocation behaviour) on the cuda backend, where the group is NCCL's.
#if defined(GPUBOX_BACKEND_CUDA)
#define GPUBOX_IN_PROCESS_ONLY(why) GTEST_SKIP() << "in-process communicator only: " << (why)
#else
#define GPUBOX_IN_PROCESS_ONLY(why) \
  do {                              \
  } while (0)
#endif
