// The host's waits in a steady step, as a pass report (or an evaluation's, its names prefixed
// "eval_") gives them per card per step: no round trip, host_syncs_per_step 0 (issue 31, item 2:
// nothing the host enqueues waits for a value of the card's), and at most one pipeline wait in
// any step, max_pipeline_waits_in_a_step <= 1 (heterps/device/counters.hpp): once the host has
// run a late readback's whole ring (4 steps) ahead of a card slower than itself, as a GPU is at
// a small batch, it waits for that oldest step (the card still holds the 3 after it), once a
// step; the sparse check of the same step was recorded before its status, so it has passed by
// then. The cpu backend's card has run a step's work when its enqueue returns: 0 there, but for
// GPUBOX_DEVICE_CHECK=defer's deferred streams (its steps with collectives run in order).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gpubox::trainer::step_test {

inline void expect_no_round_trip(const std::map<std::string, double>& counts,
                                 const std::string& prefix = "", const std::string& where = "") {
  const std::string syncs = prefix + "host_syncs_per_step";
  const std::string pipeline = prefix + "max_pipeline_waits_in_a_step";
  ASSERT_TRUE(counts.count(syncs) && counts.count(pipeline))
      << where << ": the report has no " << syncs << " or " << pipeline;
  EXPECT_EQ(counts.at(syncs), 0.0) << where << ": a wait came back into the steady step";
  // Per step (the most one card's step counted), not on the average.
  EXPECT_LE(counts.at(pipeline), 1.0) << where << ": more than one wait in a step for a full ring";
}

}  // namespace gpubox::trainer::step_test
