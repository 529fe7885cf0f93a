// MergedPushes against an unordered_map oracle: every thread's share of a step's keys, each key
// summed over every thread's computed push, lies with the thread mix64(key) % threads names, once,
// in the order the threads' pushes name the keys, its sums taken in thread order (bit for bit).
#include "trainer/ps_modes/merged_pushes.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/trainer/ps_pipeline_util.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

constexpr int kPushDim = 3;

// One thread's computed push: distinct keys (as compute_step's), drawn from `key_range` so that
// threads share keys.
struct ThreadPush {
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  std::vector<float> values;
  ComputedPush view() const { return {keys.data(), slots.data(), values.data(), keys.size()}; }
};

ThreadPush make_push(std::size_t n, uint64_t key_range, std::mt19937_64& rng) {
  ThreadPush push;
  std::unordered_map<uint64_t, bool> seen;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  while (push.keys.size() < n) {
    const uint64_t key = rng() % key_range;
    if (!seen.emplace(key, true).second) continue;
    push.keys.push_back(key);
    push.slots.push_back(static_cast<int32_t>(key % 7));  // a key's slot is the same everywhere
    for (int f = 0; f < kPushDim; ++f) push.values.push_back(value(rng));
  }
  return push;
}

std::vector<ThreadPush> make_pushes(int threads, std::size_t keys_each, std::mt19937_64& rng) {
  std::vector<ThreadPush> pushes;
  for (int t = 0; t < threads; ++t) {
    // Keys from a range twice the count: about half of them in another thread's push too.
    pushes.push_back(make_push(keys_each, 2 * keys_each + 1, rng));
  }
  return pushes;
}

// One owner thread's expected share: its keys in the order merge() meets them (thread by thread,
// each thread's keys in its push's order), each with its slot and its records summed in float in
// thread order.
struct ExpectedShare {
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  std::vector<float> values;  // keys x kPushDim
};

std::vector<ExpectedShare> expected_shares(const std::vector<ThreadPush>& pushes) {
  const std::size_t threads = pushes.size();
  std::vector<ExpectedShare> shares(threads);
  std::unordered_map<uint64_t, std::size_t> at;  // a key's place in its owner's share
  for (const ThreadPush& p : pushes) {
    for (std::size_t i = 0; i < p.keys.size(); ++i) {
      ExpectedShare& share = shares[mix64(p.keys[i]) % threads];
      const auto [it, added] = at.emplace(p.keys[i], share.keys.size());
      if (added) {
        share.keys.push_back(p.keys[i]);
        share.slots.push_back(p.slots[i]);
        share.values.resize(share.values.size() + kPushDim, 0.0f);
      }
      for (int f = 0; f < kPushDim; ++f) {
        share.values[it->second * kPushDim + f] += p.values[i * kPushDim + f];
      }
    }
  }
  return shares;
}

void check_step(const std::vector<ThreadPush>& pushes, MergedPushes& merged) {
  const auto threads = static_cast<int>(pushes.size());
  const std::size_t keys_each = pushes.front().keys.size();
  SCOPED_TRACE("threads " + std::to_string(threads) + ", keys " + std::to_string(keys_each));
  const std::vector<ExpectedShare> expected = expected_shares(pushes);
  for (int t = 0; t < threads; ++t) merged.file(t, pushes[static_cast<std::size_t>(t)].view());
  std::size_t seen = 0;
  for (int t = 0; t < threads; ++t) {
    const ComputedPush share = merged.merge(t);
    const ExpectedShare& want = expected[static_cast<std::size_t>(t)];
    // Exactly: the same keys in the same order, the same float sums taken in thread order.
    ASSERT_EQ(std::vector<uint64_t>(share.keys, share.keys + share.n), want.keys) << "thread " << t;
    EXPECT_EQ(std::vector<int32_t>(share.slots, share.slots + share.n), want.slots);
    EXPECT_EQ(std::vector<float>(share.values, share.values + share.n * kPushDim), want.values);
    seen += share.n;
  }
  EXPECT_GE(seen, keys_each);
}

TEST(MergedPushes, EachThreadsShareSumsItsKeysOverEveryThread) {
  std::mt19937_64 rng(32);
  for (const int threads : {1, 2, 3}) {
    MergedPushes merged(threads, kPushDim);
    // Sizes 0, 1, n, n + 1 in turn through the same object (its buffers reused and regrown).
    for (const std::size_t keys : {std::size_t{0}, std::size_t{1}, std::size_t{500},
                                   std::size_t{501}, std::size_t{0}, std::size_t{37}}) {
      check_step(make_pushes(threads, keys, rng), merged);
    }
  }
}

// A step with the same keys as the one before grows nothing (the sync mode's steady step).
TEST(MergedPushes, ASteadyStepGrowsNothing) {
  std::mt19937_64 rng(7);
  MergedPushes merged(2, kPushDim);
  const std::vector<ThreadPush> pushes = make_pushes(2, 300, rng);
  check_step(pushes, merged);
  const uint64_t after_first = merged.growths();
  EXPECT_GT(after_first, 0u);
  check_step(pushes, merged);
  EXPECT_EQ(merged.growths(), after_first);
}

// A job of more parts (trainers x threads) than the servers take is refused when it is joined,
// naming both counts, not at its first push; kMaxStepParts parts are joined.
TEST(MergedPushes, AJobOfMorePartsThanTheServersTakeIsRefusedAtItsStart) {
  MergedPushes pushes(4, kPushDim);
  const int most = static_cast<int>(table::server::kMaxStepParts / 4);
  EXPECT_NO_THROW(pushes.join_job(1, most - 1, most));
  try {
    pushes.join_job(1, 0, most + 1);
    FAIL() << "joined a job of " << 4 * (most + 1) << " parts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(most + 1) + " trainers x 4"),
              std::string::npos)
        << e.what();
  }
}

// A step pushed twice in one sync job is refused before it is sent, naming the step (the
// servers would take its parts for copies of the step they applied and apply nothing, so a
// stopped pass trained again would lose its steps silently); a job joined anew starts over.
TEST(MergedPushes, AStepPushedTwiceInOneJobIsRefused) {
  const TrainerConfig cfg = ps_test_config({"runner.sync_mode=sync"});
  Servers shards(cfg, 1);
  const auto servers = connect(shards.endpoints(), cfg);
  const int dim = servers->layout().push_dim();
  MergedPushes pushes(1, dim);
  const std::vector<uint64_t> keys = {11, 12};
  const std::vector<int32_t> slots = {0, 1};
  const std::vector<float> values(keys.size() * static_cast<std::size_t>(dim), 0.5f);
  const auto push = [&](int64_t pass, int64_t step) {
    pushes.file(0, ComputedPush{keys.data(), slots.data(), values.data(), keys.size()});
    pushes.merge(0);
    pushes.push(0, *servers, pass, step);
  };
  pushes.join_job(7, 0, 2);  // two trainers: the parts are held, waiting for trainer 1's
  push(0, 0);
  push(0, 1);
  try {
    push(0, 1);
    FAIL() << "pushed pass 0, step 1 twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass 0, step 1 pushed again in sync job 7"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(push(0, 0), Error);
  pushes.join_job(8, 0, 2);
  EXPECT_NO_THROW(push(0, 0));
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
