// gpubox_bench ps-merge: what a PS training thread spends per step to gather a batch's keys
// (BatchKeys::gather) and sum its pushes per key, in the card's order (merge_by_key) against
// the left-to-right merge it replaced (trainer/ps_modes/batch_keys.hpp): microseconds a batch,
// the median of --repeats timings, for a batch without hot keys and one with keys of 32, 33, 100,
// 1090 and 2000 occurrences (tests/trainer/ps_merge_batches.hpp's batches).
#include <cstdio>
#include <random>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "tests/bench/bench_command.hpp"
#include "tests/bench/bench_timing.hpp"
#include "tests/trainer/ps_merge_batches.hpp"
#include "trainer/ps_modes/batch_keys.hpp"

namespace gpubox::bench {
namespace {

using trainer::ps_modes::BatchKeys;
using trainer::ps_modes::BufferGrowth;

int run_ps_merge(const BenchArgs& args) {
  args.expect_only({"instances", "push-dim", "repeats", "json"});
  const auto instances = static_cast<std::size_t>(args.get_int("instances", 4096));
  const auto dim = static_cast<int32_t>(args.get_int("push-dim", 11));
  const int repeats = static_cast<int>(args.get_int("repeats", 50));
  const bool json = args.has("json");
  GPUBOX_EXPECTS(instances >= 1 && dim >= 1 && repeats >= 1,
                 "--instances, --push-dim and --repeats must be positive");
  const std::vector<int32_t> slot_ids = {3, 7};
  std::mt19937_64 rng(7);
  for (const std::size_t hot : {std::size_t{0}, std::size_t{2000}}) {
    const dataset::Batch batch = trainer::ps_modes::testing::make_batch(instances, hot, 12000, rng);
    const std::vector<float> push = trainer::ps_modes::testing::make_push(
        batch.keys.size() * static_cast<std::size_t>(dim), rng);
    BatchKeys keys;
    BufferGrowth growth;
    std::vector<float> merged(batch.keys.size() * static_cast<std::size_t>(dim));
    double us[2];
    for (const bool card_order : {false, true}) {
      std::vector<double> runs;
      for (int r = 0; r < repeats; ++r) {
        Timer timer;
        keys.gather(batch, slot_ids, growth);
        if (card_order) {
          trainer::ps_modes::merge_by_key(keys, push.data(), dim, merged.data());
        } else {
          trainer::ps_modes::testing::left_to_right(keys, push.data(), dim, merged.data());
        }
        runs.push_back(timer.seconds() * 1e6);
      }
      us[card_order ? 1 : 0] = median(runs);
    }
    if (json) {
      std::printf(
          "{\"bench\": \"ps-merge\", \"occurrences\": %zu, \"keys\": %zu, \"hot_keys\": %zu, "
          "\"push_dim\": %d, \"left_to_right_us\": %.1f, \"card_order_us\": %.1f, "
          "\"loadavg_1m\": %.2f}\n",
          batch.keys.size(), keys.size(), keys.hot_keys().size(), dim, us[0], us[1],
          load_average());
    } else {
      std::printf(
          "gather + merge of %zu occurrences, %zu keys (%zu hot), push_dim %d: left to right "
          "%.0f us, in the card's order %.0f us (%.2fx; load %.2f)\n",
          batch.keys.size(), keys.size(), keys.hot_keys().size(), dim, us[0], us[1], us[1] / us[0],
          load_average());
    }
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("ps-merge",
                     "[--instances N] [--push-dim D] [--repeats R] [--json]: a PS thread's "
                     "gather and per-key merge of a batch's pushes, in the card's order against "
                     "left to right",
                     run_ps_merge);

}  // namespace
}  // namespace gpubox::bench
