// plan_step_sizes (trainer/engine/step_sizes.hpp) against an oracle: each batch as the steps
// build it (InMemoryDataset::fill_batch), its distinct keys in a std::set, their owners counted
// one by one. Lines with 0 to 4 keys per slot, repeated keys, a short last round (empty batches
// on some cards), 1, 2 and 3 local cards of up to 8, sharded and replicated.
#include "trainer/engine/step_sizes.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/hash.hpp"
#include "dataset/batch.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/instance_block.hpp"
#include "dataset/pass_data_cache.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

// `lines` lines in three files (three blocks as loaded: a batch may span two), loaded through
// `cache` when not null; `write` false: the files written by the last call loaded again.
dataset::InMemoryDataset varying_lines(const fs::path& dir, int lines, int slots,
                                       dataset::PassDataCache* cache = nullptr, bool write = true) {
  fs::create_directories(dir);
  std::mt19937 rng(5);
  std::vector<std::string> files;
  for (int file = 0; file < 3; ++file) {
    files.push_back((dir / ("part-" + std::to_string(file))).string());
    if (!write) continue;
    std::ofstream out(files.back());
    for (int line = lines * file / 3; line < lines * (file + 1) / 3; ++line) {
      out << "click:" << (rng() % 2);
      for (int slot = 1; slot <= slots; ++slot) {
        for (int k = static_cast<int>(rng() % 5); k > 0; --k)
          out << ' ' << slot << ':' << 1 + rng() % 40;
      }
      out << '\n';
    }
  }
  dataset::DatasetConfig config;
  config.data_format = dataset::DataFormat::kSlot;
  for (int s = 1; s <= slots; ++s) config.slots.push_back(std::to_string(s));
  dataset::InMemoryDataset data(config);
  data.set_filelist(files);
  data.set_pass_cache(cache);
  EXPECT_TRUE(data.load_into_memory().ok());
  return data;
}

// The distinct-key table against std::unordered_set over batches of growing and shrinking size
// on one reused table (0, 1, the 16-slot minimum and past it, many duplicates, key 0 and the
// largest key, keys that collide in the low bits): the first offer of a key is new, every later
// one in the batch is not, and a new batch forgets the previous one.
TEST(StepSizes, DistinctKeysMatchesAnUnorderedSet) {
  detail::DistinctKeys distinct;
  std::mt19937_64 rng(9);
  for (std::size_t n : {0, 1, 7, 8, 9, 16, 17, 1000, 3, 5000, 0, 2}) {
    std::vector<uint64_t> keys(n);
    for (auto& key : keys) {
      switch (rng() % 4) {
        case 0:
          key = rng() % 8;
          break;  // duplicates, key 0 among them
        case 1:
          key = (rng() % 64) << 40;
          break;  // equal low bits
        case 2:
          key = ~uint64_t{0} - rng() % 3;
          break;  // the largest keys
        default:
          key = rng();
          break;
      }
    }
    distinct.reset(n);
    std::unordered_set<uint64_t> seen;
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(distinct.insert(keys[i]), seen.insert(keys[i]).second)
          << "key " << keys[i] << " at " << i << " of " << n;
    }
  }
}

// Every batch's plan against the batch fill_batch builds of `data`.
void expect_plan_matches_batches(dataset::InMemoryDataset& data) {
  for (int local : {1, 2, 3}) {
    for (int total : {local, 8}) {
      for (bool per_owner : {true, false}) {
        for (std::size_t batch : {std::size_t{1}, std::size_t{16}, std::size_t{500}}) {
          SCOPED_TRACE("local " + std::to_string(local) + " of " + std::to_string(total) +
                       ", batch " + std::to_string(batch) + (per_owner ? ", sharded" : ""));
          data.set_batch_size(static_cast<int>(batch));  // fill_batch's batches
          const int first_rank = total - local;          // the last trainer's cards
          const PassStepSizes sizes =
              plan_step_sizes(data, batch, local, first_rank, total, per_owner, /*threads=*/3);
          ASSERT_EQ(sizes.batches, data.num_batches_per_card(local));
          dataset::Batch filled;
          for (int card = 0; card < local; ++card) {
            std::size_t largest = 0;
            for (std::size_t b = 0; b < sizes.batches; ++b) {
              data.fill_batch(card, local, b, &filled);
              const std::set<uint64_t> distinct(filled.keys.begin(), filled.keys.end());
              const std::size_t at = sizes.index(card, b);
              EXPECT_EQ(sizes.occurrences[at], filled.keys.size());
              EXPECT_EQ(sizes.unique[at], distinct.size());
              largest = std::max(largest, filled.keys.size());
              if (!per_owner) continue;
              std::vector<uint32_t> owners(static_cast<std::size_t>(total), 0);
              for (uint64_t key : distinct) ++owners[owner_card(key, total)];
              for (int o = 0; o < total; ++o) {
                EXPECT_EQ(sizes.owner_counts[at * total + o], owners[o]) << "owner " << o;
              }
            }
            EXPECT_EQ(sizes.max_occurrences(card), largest);
          }
          if (!per_owner) {
            EXPECT_TRUE(sizes.owner_counts.empty());
          }
        }
      }
    }
  }
}

// The plan reads each batch's keys where the data set stores them: as loaded (a batch in one
// run, or two across a file's end), stored as loaded, shuffled (a run an instance), shuffled and
// stored in that order; no line, one, and a short last batch.
TEST(StepSizes, EveryBatchMatchesTheOracle) {
  const fs::path dir =
      fs::temp_directory_path() / ("gpubox_step_sizes_" + std::to_string(::getpid()));
  for (int lines : {0, 1, 203}) {
    for (const bool shuffled : {false, true}) {
      for (const bool stored : {false, true}) {
        SCOPED_TRACE(std::to_string(lines) + " lines, shuffled " + std::to_string(shuffled) +
                     ", stored " + std::to_string(stored));
        dataset::InMemoryDataset data = varying_lines(dir, lines, 4);
        ASSERT_EQ(data.size(), static_cast<std::size_t>(lines));
        if (shuffled) data.local_shuffle(11);
        if (stored) {
          ASSERT_TRUE(data.store_in_order());
        }
        expect_plan_matches_batches(data);
      }
    }
  }
  fs::remove_all(dir);
}

void expect_same_plan(const PassStepSizes& got, const PassStepSizes& want) {
  EXPECT_EQ(got.batches, want.batches);
  EXPECT_EQ(got.batch_size, want.batch_size);
  EXPECT_EQ(got.local_cards, want.local_cards);
  EXPECT_EQ(got.occurrences, want.occurrences);
  EXPECT_EQ(got.unique, want.unique);
  EXPECT_EQ(got.owner_counts, want.owner_counts);
}

// A plan kept is served to a data set of the same blocks read in sequence (a load the pass cache
// serves again, unshuffled) for the same batch, cards, first rank, card total and per-owner
// counts, and to nothing else: not to the same files loaded again without the cache, nor
// shuffled, nor stored in order, nor once the blocks are gone. What it serves equals a fresh
// plan. Only plans of blocks something else holds too (here the cache) are kept: a data set's
// own blocks (a load without the cache, a store in the shuffled order) are never seen again.
TEST(StepSizes, KeptPlansServeOnlyTheSameInstancesInTheSameOrder) {
  const fs::path dir =
      fs::temp_directory_path() / ("gpubox_step_plans_" + std::to_string(::getpid()));
  StepPlanMemo memo;
  auto cache = std::make_unique<dataset::PassDataCache>(std::size_t{64} << 20);
  auto planned = [&memo](const dataset::InMemoryDataset& data, std::size_t batch, int cards,
                         int first_rank = 0, int total = 4, bool per_owner = true) {
    const std::shared_ptr<const PassStepSizes> got =
        memo.plan(data, batch, cards, first_rank, total, per_owner, 2);
    ASSERT_NE(got, nullptr);
    expect_same_plan(*got, plan_step_sizes(data, batch, cards, first_rank, total, per_owner, 2));
  };
  dataset::InMemoryDataset first = varying_lines(dir, 203, 4, cache.get());
  planned(first, 16, 2);
  EXPECT_EQ(memo.served(), 0u);
  dataset::InMemoryDataset served = varying_lines(dir, 203, 4, cache.get(), /*write=*/false);
  ASSERT_EQ(served.load_stats().cached_instances, 203u);
  planned(served, 16, 2);
  EXPECT_EQ(memo.served(), 1u);
  planned(served, 17, 2);  // another batch
  planned(served, 16, 1);  // other cards
  EXPECT_EQ(memo.served(), 1u);
  planned(served, 16, 1);
  EXPECT_EQ(memo.served(), 2u);
  // Another first rank, card total or per-owner choice: planned afresh, each kept on its own.
  planned(served, 16, 2, /*first_rank=*/2, /*total=*/4, /*per_owner=*/true);
  planned(served, 16, 2, /*first_rank=*/0, /*total=*/8, /*per_owner=*/true);
  planned(served, 16, 2, /*first_rank=*/0, /*total=*/4, /*per_owner=*/false);
  planned(served, 16, 2, /*first_rank=*/2, /*total=*/8, /*per_owner=*/false);
  EXPECT_EQ(memo.served(), 2u);
  planned(served, 16, 2, /*first_rank=*/2, /*total=*/8, /*per_owner=*/false);
  EXPECT_EQ(memo.served(), 3u);
  EXPECT_EQ(memo.kept(), 7u);
  dataset::InMemoryDataset uncached = varying_lines(dir, 203, 4, nullptr, /*write=*/false);
  planned(uncached, 16, 2);
  planned(uncached, 16, 2);
  EXPECT_EQ(memo.served(), 3u);
  EXPECT_EQ(memo.kept(), 7u);  // its own blocks: not kept
  served.local_shuffle(3);
  planned(served, 16, 2);
  EXPECT_EQ(memo.served(), 3u);
  ASSERT_TRUE(served.store_in_order());  // new blocks of its own, in sequence
  planned(served, 16, 2);
  planned(served, 16, 2);
  EXPECT_EQ(memo.served(), 3u);
  EXPECT_EQ(memo.kept(), 7u);
  // The blocks freed: a new load of the same files is planned afresh, the old plans dropped.
  first.release_memory();
  served.release_memory();
  cache = std::make_unique<dataset::PassDataCache>(std::size_t{64} << 20);
  dataset::InMemoryDataset again = varying_lines(dir, 203, 4, cache.get(), /*write=*/false);
  ASSERT_EQ(again.load_stats().cached_instances, 0u);
  planned(again, 16, 2);
  EXPECT_EQ(memo.served(), 3u);
  EXPECT_EQ(memo.kept(), 1u);
  // No instance (no block): an empty plan, kept like any other.
  dataset::InMemoryDataset empty = varying_lines(dir, 0, 4);
  planned(empty, 16, 2);
  planned(empty, 16, 2);
  EXPECT_EQ(memo.served(), 4u);
  fs::remove_all(dir);
}

// Data sets planned at once by several threads (read_pass on the pipeline's thread, evaluate):
// two misses on the same blocks keep one plan between them, and each gets the fresh plan.
TEST(StepSizes, ConcurrentMissesKeepOnePlan) {
  const fs::path dir =
      fs::temp_directory_path() / ("gpubox_step_plans_race_" + std::to_string(::getpid()));
  dataset::PassDataCache cache(std::size_t{64} << 20);
  const dataset::InMemoryDataset first = varying_lines(dir, 2000, 4, &cache);
  const dataset::InMemoryDataset served = varying_lines(dir, 2000, 4, &cache, /*write=*/false);
  const PassStepSizes want = plan_step_sizes(first, 16, 2, 0, 4, true, 1);
  for (int round = 0; round < 20; ++round) {
    StepPlanMemo memo;
    std::shared_ptr<const PassStepSizes> got[2];
    std::atomic<int> ready{0};
    auto plan = [&](int t) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      got[t] = memo.plan(t == 0 ? first : served, 16, 2, 0, 4, true, 1);
    };
    std::thread other(plan, 1);
    plan(0);
    other.join();
    EXPECT_EQ(memo.kept(), 1u) << "round " << round;
    EXPECT_EQ(memo.served() + (got[0] == got[1] ? 0 : 1), 1u) << "round " << round;
    for (const auto& plan : got) expect_same_plan(*plan, want);
  }
  fs::remove_all(dir);
}

// A stream's sizes (PassStepSizer over the instances in order, in chunks of any size, as
// QueueDataset::scan hands them) equal the in-memory plan of the same instances: full rounds,
// the short last round's even split (empty batches on some cards), chunks that cut rounds.
TEST(StepSizes, StreamedSizesEqualTheInMemoryPlan) {
  const fs::path dir =
      fs::temp_directory_path() / ("gpubox_stream_sizes_" + std::to_string(::getpid()));
  const dataset::InMemoryDataset data = varying_lines(dir, 203, 4);
  for (int local : {1, 2, 3}) {
    for (int total : {local, 8}) {
      for (bool per_owner : {true, false}) {
        for (std::size_t batch : {std::size_t{1}, std::size_t{16}, std::size_t{500}}) {
          for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
            SCOPED_TRACE("local " + std::to_string(local) + " of " + std::to_string(total) +
                         ", batch " + std::to_string(batch) + ", chunks of " +
                         std::to_string(chunk) + (per_owner ? ", sharded" : ""));
            const int first_rank = total - local;
            const PassStepSizes want =
                plan_step_sizes(data, batch, local, first_rank, total, per_owner, 2);
            PassStepSizer sizer(batch, local, first_rank, total, per_owner);
            dataset::InstanceBlock block(4, 0);
            for (std::size_t i = 0; i < data.size(); ++i) {
              block.append(data.instance(i));
              if (block.size() == chunk || i + 1 == data.size()) {
                sizer.add(block);
                block.clear();
              }
            }
            const PassStepSizes got = sizer.finish();
            EXPECT_EQ(got.batches, want.batches);
            EXPECT_EQ(got.local_cards, want.local_cards);
            EXPECT_EQ(got.first_rank, want.first_rank);
            EXPECT_EQ(got.total_cards, want.total_cards);
            EXPECT_EQ(got.occurrences, want.occurrences);
            EXPECT_EQ(got.unique, want.unique);
            EXPECT_EQ(got.owner_counts, want.owner_counts);
          }
        }
      }
    }
  }
  // No instance: no batch.
  PassStepSizer empty(16, 2, 0, 2, true);
  const PassStepSizes none = empty.finish();
  EXPECT_EQ(none.batches, 0u);
  EXPECT_TRUE(none.occurrences.empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpubox::trainer
