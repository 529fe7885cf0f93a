// runner.shrink_every's values (its own header: the config enums' header is read by every
// library, this one only by the config keys and the trainer's config).
#pragma once

#include "common/config/config_enums.hpp"

namespace gpubox::config {

// runner.shrink_every: when the epoch loop shrinks the sparse table (HostTier::shrink: decay,
// deletion, cold rows to disk; one shrink is one "day" of the *_days keys): never, after every
// pass, or after the last pass of every epoch (trainer/schedule/epoch_loop.hpp).
enum class ShrinkEvery { kNever, kPass, kEpoch };
inline constexpr EnumName<ShrinkEvery> kShrinkEveryNames[] = {
    {ShrinkEvery::kNever, "never"}, {ShrinkEvery::kPass, "pass"}, {ShrinkEvery::kEpoch, "epoch"}};

}  // namespace gpubox::config
