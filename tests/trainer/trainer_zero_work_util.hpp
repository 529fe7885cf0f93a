// What trainer_zero_work_test.cpp and trainer_zero_local_save_test.cpp share: a job's nonce, a
// part by its place, and a wait's error.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox::trainer::zero_test {

constexpr uint64_t kJob = 0x123456789abull;
constexpr uint64_t kEarlierJob = 0x5555aaaaull;

inline TrainerZeroPart part_of(uint64_t job, int64_t run, int64_t recovery, int64_t index) {
  TrainerZeroPart part;
  part.job = job;
  part.run = run;
  part.recovery = recovery;
  part.index = index;
  return part;
}

// Waits for trainer 0 by `wait` through `client`: the error ("" when it returned).
inline std::string error_of_wait(table::server::RemoteHostTier& client,
                                 const TrainerZeroWait& wait) {
  try {
    wait_for_trainer_zero(client, wait);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace gpubox::trainer::zero_test
