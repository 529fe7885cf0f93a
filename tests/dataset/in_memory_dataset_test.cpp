// InMemoryDataset: loading (threads, byte ranges, pipes), bad input accounting, strict mode,
// shuffle, batch iteration and its tail policy, unique keys — each against a plain oracle.
#include "dataset/in_memory_dataset.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "tests/dataset/in_memory_dataset_test_util.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using namespace text_sets;  // NOLINT: the shared text sets and their helpers

TEST(InMemoryDataset, LoadsEveryValidLineInFileOrderWithAnyThreadCount) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 5, 300, 0.0, 1);
  for (int threads = 1; threads <= 8; ++threads) {
    for (std::uint64_t split : {std::uint64_t{32} << 20, std::uint64_t{997}}) {
      DatasetConfig c = config(threads);
      c.split_bytes = split;  // small: files are read as many byte ranges
      InMemoryDataset ds(c);
      ds.set_filelist(text.files);
      ASSERT_TRUE(ds.load_into_memory().ok());
      EXPECT_EQ(contents(ds), text.instances) << threads << " threads, split " << split;
      EXPECT_EQ(ds.load_stats().instances, text.instances.size());
      EXPECT_EQ(ds.load_stats().files, text.files.size());
      EXPECT_EQ(ds.load_stats().skipped_lines(), 0u);
    }
  }
}

TEST(InMemoryDataset, LargeFilesReservedFromTheirSizeLoadTheSame) {
  // Past a few thousand instances the block is reserved from the input size; the result must
  // not change, whether the file is read whole or as ranges.
  ScratchDir dir;
  const TextSet text = make_text(dir, 1, 12000, 0.0, 11);
  for (std::uint64_t split : {std::uint64_t{32} << 20, std::uint64_t{200000}}) {
    DatasetConfig c = config(2);
    c.split_bytes = split;
    InMemoryDataset ds(c);
    ds.set_filelist(text.files);
    ASSERT_TRUE(ds.load_into_memory().ok());
    EXPECT_EQ(contents(ds), text.instances) << "split " << split;
  }
}

TEST(InMemoryDataset, PipeCommandGivesTheSameInstances) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 3, 100, 0.0, 2);
  std::vector<std::string> gz;
  for (const std::string& f : text.files) {
    ASSERT_EQ(std::system(("gzip -k " + f).c_str()), 0);
    gz.push_back(f + ".gz");
  }
  DatasetConfig c = config(2);
  c.pipe_command = "gzip -dc";
  InMemoryDataset ds(c);
  ds.set_filelist(gz);
  const Status st = ds.load_into_memory();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(contents(ds), text.instances);
}

TEST(InMemoryDataset, AStopFlagEndsTheLoadWithAbortedAndAddsNothing) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 2, 12000, 0.0, 5);
  std::atomic<bool> stop{true};
  {
    InMemoryDataset ds(config(2));
    ds.set_filelist(text.files);
    ds.set_stop_flag(&stop);  // set before the load: nothing is read
    EXPECT_EQ(ds.load_into_memory().code(), Status::Code::kAborted);
    EXPECT_EQ(ds.size(), 0u);
  }
  // Set while a slow pipe feeds the readers (>= 6 s of input each): the load ends within the
  // next 4,096 lines of each reader (a third of its file), well before the whole load's time.
  stop = false;
  DatasetConfig c = config(2);
  c.pipe_command = "awk '{print} NR % 100 == 0 {system(\"sleep 0.05\")}'";
  InMemoryDataset ds(c);
  ds.set_filelist(text.files);
  ds.set_stop_flag(&stop);
  std::thread stopper([&stop] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  const Status st = ds.load_into_memory();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stopper.join();
  EXPECT_EQ(st.code(), Status::Code::kAborted) << st.to_string();
  EXPECT_EQ(ds.size(), 0u);
  // Cleared, the same data set loads in full; the stopped load took a fraction of its time
  // (about 0.4 of it; a ratio, as a loaded machine slows both).
  stop = false;
  const auto full_start = std::chrono::steady_clock::now();
  ASSERT_TRUE(ds.load_into_memory().ok());
  const double full_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - full_start).count();
  EXPECT_EQ(contents(ds), text.instances);
  EXPECT_LT(seconds, 0.75 * full_seconds) << "stopped " << seconds << " s, whole " << full_seconds;
}

TEST(InMemoryDataset, MalformedLinesAreSkippedCountedAndReportedWithFileAndLine) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 4, 400, 0.05, 3);
  for (std::uint64_t split : {std::uint64_t{32} << 20, std::uint64_t{1500}}) {
    DatasetConfig c = config(3);
    c.split_bytes = split;
    c.max_reported_errors = 1000;
    InMemoryDataset ds(c);
    ds.set_filelist(text.files);
    ASSERT_TRUE(ds.load_into_memory().ok());
    EXPECT_EQ(contents(ds), text.instances);
    const LoadStats& st = ds.load_stats();
    for (const auto& [reason, count] : text.bad) {
      EXPECT_EQ(st.skipped_by_reason[static_cast<std::size_t>(reason)], count)
          << name_of(kParseReasonNames, reason);
    }
    ASSERT_EQ(st.errors.size(), text.bad_lines.size());
    for (std::size_t k = 0; k < st.errors.size(); ++k) {
      EXPECT_EQ(st.errors[k].file, text.bad_lines[k].first);
      EXPECT_EQ(st.errors[k].line, text.bad_lines[k].second) << "split " << split;
    }
    EXPECT_EQ(st.lines, 1600u);
  }
  // Only the first max_reported_errors are kept, the counts stay complete.
  DatasetConfig c = config(2);
  c.max_reported_errors = 3;
  InMemoryDataset ds(c);
  ds.set_filelist(text.files);
  ASSERT_TRUE(ds.load_into_memory().ok());
  EXPECT_EQ(ds.load_stats().errors.size(), 3u);
  EXPECT_EQ(ds.load_stats().skipped_lines(), text.bad_lines.size());
  EXPECT_EQ(ds.load_stats().errors[0].to_string().rfind(
                text.bad_lines[0].first + ":" + std::to_string(text.bad_lines[0].second) + ": ", 0),
            0u);
}

TEST(InMemoryDataset, StrictParseFailsOnTheFirstBadLineAndAddsNothing) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 4, 300, 0.01, 4);
  ASSERT_FALSE(text.bad_lines.empty());
  for (std::uint64_t split : {std::uint64_t{32} << 20, std::uint64_t{1200}}) {
    DatasetConfig c = config(4);
    c.strict_parse = true;
    c.split_bytes = split;
    InMemoryDataset ds(c);
    ds.set_filelist(text.files);
    const Status st = ds.load_into_memory();
    ASSERT_EQ(st.code(), Status::Code::kCorruption);
    const std::string where =
        text.bad_lines[0].first + ":" + std::to_string(text.bad_lines[0].second) + ": ";
    EXPECT_NE(st.message().find(where), std::string::npos) << st.message() << " want " << where;
    EXPECT_EQ(ds.size(), 0u);
  }
}

TEST(InMemoryDataset, TruncatedLastLineAndOverLongLinesAreCounted) {
  ScratchDir dir;
  const std::string good = "click:1 dense_feature:1 dense_feature:2 1:5\n";
  const std::string a =
      dir.write("a", good + std::string(300, '9') + "\n" + good + "click:0 dense");
  DatasetConfig c = config();
  c.max_line_bytes = 100;
  InMemoryDataset ds(c);
  ds.set_filelist({a});
  ASSERT_TRUE(ds.load_into_memory().ok());
  EXPECT_EQ(ds.size(), 2u);
  const LoadStats& st = ds.load_stats();
  EXPECT_EQ(st.skipped_by_reason[static_cast<std::size_t>(ParseReason::kLineTooLong)], 1u);
  EXPECT_EQ(st.skipped_by_reason[static_cast<std::size_t>(ParseReason::kTruncatedLastLine)], 1u);
  ASSERT_EQ(st.errors.size(), 2u);
  EXPECT_EQ(st.errors[0].line, 2u);
  EXPECT_EQ(st.errors[1].line, 4u);
  EXPECT_EQ(st.errors[1].to_string(),
            a + ":4: truncated_last_line: no newline at the end of the file");
  // A file whose lines end in CR alone reads as one line without a newline: the load stops
  // naming it (as one malformed line of many it was lost under any max_malformed_share).
  const std::string mac = dir.write("mac",
                                    "click:1 dense_feature:1 dense_feature:2 1:5\rclick:0 "
                                    "dense_feature:1 dense_feature:2 1:6\r");
  c.max_line_bytes = 1 << 20;
  InMemoryDataset cr_ds(c);
  cr_ds.set_filelist({a, mac});
  const Status cr = cr_ds.load_into_memory();
  EXPECT_EQ(cr.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(cr.message().find(mac + ": no newline in the whole file, whose 2 lines end in CR "
                                    "alone: convert them (tr '\\r' '\\n')"),
            std::string::npos)
      << cr.message();
  // One line ending in CR without a newline is a truncated last line, as any other.
  const std::string one = dir.write("one", "click:1 dense_feature:1 dense_feature:2 1:5\r");
  InMemoryDataset one_ds(c);
  one_ds.set_filelist({a, one});
  ASSERT_TRUE(one_ds.load_into_memory().ok());
  ASSERT_EQ(one_ds.load_stats().errors.size(), 3u);
  EXPECT_EQ(one_ds.load_stats().errors[2].to_string(),
            one + ":1: truncated_last_line: no newline at the end of the file");
}

TEST(InMemoryDataset, UnreadableFileIsAnErrorNamingItAndKeepsEarlierPasses) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 2, 50, 0.0, 5);
  InMemoryDataset ds(config(2));
  ds.set_filelist(text.files);
  ASSERT_TRUE(ds.load_into_memory().ok());
  const std::size_t loaded = ds.size();
  ds.set_filelist({text.files[0], dir.file("missing-part")});
  const Status st = ds.load_into_memory();
  EXPECT_EQ(st.code(), Status::Code::kIOError);
  EXPECT_NE(st.message().find("missing-part"), std::string::npos);
  EXPECT_EQ(ds.size(), loaded) << "a failed load adds nothing and loses nothing";
  // A failing pipe_command names the file and the exit status.
  DatasetConfig c = config();
  c.pipe_command = "gzip -dc 2>/dev/null";
  InMemoryDataset piped(c);
  piped.set_filelist({text.files[1]});
  const Status pst = piped.load_into_memory();
  EXPECT_NE(pst.message().find(text.files[1]), std::string::npos) << pst.message();
  EXPECT_NE(pst.message().find("exit status"), std::string::npos) << pst.message();
}

TEST(InMemoryDataset, EmptyPassIsNotACrash) {
  ScratchDir dir;
  InMemoryDataset ds(config(3));
  ASSERT_TRUE(ds.load_into_memory().ok());
  ds.set_filelist({dir.write("empty", ""), dir.write("blank", "\n\n \r\n")});
  ASSERT_TRUE(ds.load_into_memory().ok());
  EXPECT_EQ(ds.size(), 0u);
  EXPECT_EQ(ds.load_stats().blank_lines, 3u);
  EXPECT_EQ(ds.num_batches_per_card(4), 0u);
  EXPECT_TRUE(ds.unique_keys().empty());
  EXPECT_EQ(ds.unique_keys_per_slot(), std::vector<std::size_t>(kSlots, 0));
  ds.local_shuffle(1);
}

TEST(InMemoryDataset, ShuffleIsASeededPermutation) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 2, 500, 0.0, 6, 1u << 30);
  InMemoryDataset ds(config(2));
  ds.set_filelist(text.files);
  ASSERT_TRUE(ds.load_into_memory().ok());
  ds.local_shuffle(42);
  const std::vector<PlainInstance> first = contents(ds);
  EXPECT_NE(first, text.instances);
  std::vector<PlainInstance> sorted = first, want = text.instances;
  std::sort(sorted.begin(), sorted.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(sorted, want);
  // Same seed from the same order: same permutation; another seed: another one.
  InMemoryDataset again(config(5));
  again.set_filelist(text.files);
  ASSERT_TRUE(again.load_into_memory().ok());
  again.local_shuffle(42);
  EXPECT_EQ(contents(again), first);
  InMemoryDataset other(config(1));
  other.set_filelist(text.files);
  ASSERT_TRUE(other.load_into_memory().ok());
  other.local_shuffle(43);
  EXPECT_NE(contents(other), first);
}

TEST(InMemoryDataset, BatchesCoverEveryInstanceOnceWithEqualCountsPerCard) {
  ScratchDir dir;
  for (std::size_t n : {0, 1, 2, 5, 31, 32, 33, 100, 257}) {
    const auto files = indexed_files(dir, n);
    for (int batch_size : {1, 4, 8, 32}) {
      for (int cards : {1, 2, 3, 8}) {
        DatasetConfig c = config();
        c.batch_size = batch_size;
        InMemoryDataset ds(c);
        ds.set_filelist(files);
        ASSERT_TRUE(ds.load_into_memory().ok());
        ds.local_shuffle(n);
        const std::size_t per_card = ds.num_batches_per_card(cards);
        const std::size_t round = static_cast<std::size_t>(batch_size) * cards;
        EXPECT_EQ(per_card, (n + round - 1) / round);
        std::vector<int> seen(n, 0);
        Batch batch;
        for (int card = 0; card < cards; ++card) {
          for (std::size_t b = 0; b < per_card; ++b) {
            ds.fill_batch(card, cards, b, &batch);
            const std::size_t size = batch.size();
            EXPECT_LE(size, static_cast<std::size_t>(batch_size));
            if (b + 1 < per_card) {
              EXPECT_EQ(size, static_cast<std::size_t>(batch_size));
            } else {
              // Last round: spread evenly; empty only when fewer instances than cards remain.
              const std::size_t left = n - b * round;
              EXPECT_EQ(size,
                        left / cards + (static_cast<std::size_t>(card) < left % cards ? 1 : 0));
            }
            ASSERT_EQ(batch.offsets.size(), static_cast<std::size_t>(kSlots) * size + 1);
            ASSERT_EQ(batch.dense.size(), size * kDense);
            EXPECT_EQ(batch.offsets.back(), batch.keys.size());
            const BatchSpan span = ds.batch_span(card, cards, b);
            for (std::size_t i = 0; i < size; ++i) {
              const PlainInstance want = to_plain(ds.instance(span.begin + i));
              EXPECT_EQ(batch.labels[i], want.label);
              EXPECT_EQ(batch.dense[i * kDense], want.dense[0]);
              for (int s = 0; s < kSlots; ++s) {
                EXPECT_EQ(std::vector<std::uint64_t>(batch.slot_begin(s, i), batch.slot_end(s, i)),
                          want.slots[s]);
              }
              const std::uint64_t id = *batch.slot_begin(0, i);
              ASSERT_GE(id, 1u);
              ++seen[id - 1];
            }
          }
        }
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "instance " << i;
      }
    }
  }
}

// store_in_order keeps every position's instance, so every batch, and the distinct keys: over
// more instances than one stored block takes (two blocks and a part), on 1 and 3 threads, twice
// (already in order), and on an empty data set.
TEST(InMemoryDataset, UniqueKeysMatchASetOracle) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 3, 700, 0.0, 7, 5000);
  std::set<std::uint64_t> all;
  std::vector<std::set<std::uint64_t>> per_slot(kSlots);
  for (const PlainInstance& p : text.instances) {
    for (int s = 0; s < kSlots; ++s) {
      all.insert(p.slots[s].begin(), p.slots[s].end());
      per_slot[s].insert(p.slots[s].begin(), p.slots[s].end());
    }
  }
  std::vector<std::uint64_t> first_order;
  for (int threads : {1, 2, 3, 8}) {
    InMemoryDataset ds(config(threads));
    ds.set_filelist(text.files);
    ASSERT_TRUE(ds.load_into_memory().ok());
    const std::vector<std::uint64_t> keys = ds.unique_keys();
    if (first_order.empty()) first_order = keys;
    EXPECT_EQ(keys, first_order) << "order independent of thread_num";
    std::vector<std::uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, std::vector<std::uint64_t>(all.begin(), all.end()));
    const std::vector<std::size_t> counts = ds.unique_keys_per_slot();
    for (int s = 0; s < kSlots; ++s) EXPECT_EQ(counts[s], per_slot[s].size());
  }
}

// The pass's keys come back sorted, each with the slot of its first occurrence in load order,
// whatever the keys look like: small dense ids, slot-prefixed ids, hashed-looking ones and
// outliers near 2^64 in one data set (the dedup cuts its buckets at quantiles of the keys).
TEST(InMemoryDataset, UniqueKeysAreSortedWithTheirFirstSlotWhateverTheKeysLookLike) {
  ScratchDir dir;
  std::mt19937_64 rng(11);
  std::vector<PlainInstance> instances;
  std::string text;
  for (int i = 0; i < 3000; ++i) {
    PlainInstance p;
    p.label = static_cast<float>(i % 2);
    p.dense.assign(kDense, 0.0f);
    p.slots.resize(kSlots);
    for (int s = 0; s < kSlots; ++s) {
      const int n = static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) {
        std::uint64_t key = 0;
        switch (rng() % 4) {
          case 0:
            key = 1 + rng() % 50;
            break;  // small, hot
          case 1:
            key = (static_cast<std::uint64_t>(1 + rng() % 3) << 40) | (rng() % 2000);
            break;
          case 2:
            key = rng() | 1;
            break;  // hashed
          default:
            key = ~std::uint64_t{0} - rng() % 5;
            break;  // near 2^64
        }
        p.slots[s].push_back(key);
      }
    }
    text += line_of(p) + "\n";
    instances.push_back(p);
  }
  const std::string file = dir.write("mixed", text);
  std::map<std::uint64_t, std::int32_t> first_slot;  // the oracle: load order, slot by slot
  for (const PlainInstance& p : instances) {
    for (int s = 0; s < kSlots; ++s) {
      for (std::uint64_t key : p.slots[s]) first_slot.emplace(key, s + 1);
    }
  }
  for (int threads : {1, 3}) {
    InMemoryDataset ds(config(threads));
    ds.set_filelist({file});
    ASSERT_TRUE(ds.load_into_memory().ok());
    const UniqueKeys got = ds.unique_keys_and_slots();
    ASSERT_EQ(got.keys.size(), first_slot.size());
    ASSERT_EQ(got.slots.size(), first_slot.size());
    std::size_t i = 0;
    for (const auto& [key, slot] : first_slot) {
      ASSERT_EQ(got.keys[i], key) << "position " << i << ", " << threads << " threads";
      ASSERT_EQ(got.slots[i], slot) << "key " << key;
      ++i;
    }
    EXPECT_EQ(ds.unique_keys(), got.keys);
  }
}

TEST(InMemoryDataset, KeyZeroNeverReachesBatchesOrUniqueKeys) {
  ScratchDir dir;
  const std::string f = dir.write("z", "click:1 dense_feature:0 dense_feature:0 1:0 2:0 2:9\n");
  InMemoryDataset ds(config());
  ds.set_filelist({f});
  ASSERT_TRUE(ds.load_into_memory().ok());
  EXPECT_EQ(ds.load_stats().zero_keys_dropped, 2u);
  EXPECT_EQ(ds.unique_keys(), std::vector<std::uint64_t>{9});
  Batch batch;
  ds.fill_batch(0, 1, 0, &batch);
  EXPECT_EQ(batch.keys, std::vector<std::uint64_t>{9});
}

TEST(InMemoryDataset, MemoryIsReportedAndReleased) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 2, 200, 0.0, 8);
  InMemoryDataset ds(config(2));
  ds.set_filelist(text.files);
  ASSERT_TRUE(ds.load_into_memory().ok());
  std::size_t keys = 0;
  for (const PlainInstance& p : text.instances) {
    for (const auto& s : p.slots) keys += s.size();
  }
  EXPECT_GE(ds.memory_bytes(),
            keys * sizeof(std::uint64_t) + text.instances.size() * (1 + kDense) * sizeof(float));
  ds.release_memory();
  EXPECT_EQ(ds.size(), 0u);
  EXPECT_EQ(ds.memory_bytes(), 0u);
  // Loading again after a release works and appends from scratch.
  ASSERT_TRUE(ds.load_into_memory().ok());
  EXPECT_EQ(contents(ds), text.instances);
}

}  // namespace
}  // namespace gpubox::dataset
