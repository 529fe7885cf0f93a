// QueueDataset against InMemoryDataset (no shuffle) as its oracle: the same batches per card in
// the same order, the same counts of malformed lines, the same unique keys, on every input format
// and through pipe_command, at edge sizes around a round and around the queue's bound; the
// queue never holds more than its bound; failures, strict_parse and abort end a stream cleanly.
#include "dataset/queue_dataset.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "dataset/format_writer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::ScratchDir;
using testing::slot_config;

// Random lines of `format` (with blank and malformed ones among them), `lines_per_file` per file.
std::vector<std::string> write_files(const ScratchDir& dir, const DatasetConfig& config,
                                     const std::vector<std::size_t>& lines_per_file,
                                     std::uint64_t seed, bool with_bad) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> files;
  const int slots = static_cast<int>(config.slots.size());
  for (std::size_t f = 0; f < lines_per_file.size(); ++f) {
    std::string text;
    for (std::size_t i = 0; i < lines_per_file[f]; ++i) {
      if (with_bad && rng() % 13 == 0) {
        text += "click:7 this is not a line\n";
        continue;
      }
      if (with_bad && rng() % 17 == 0) {
        text += "\n";
        continue;
      }
      const int label = static_cast<int>(rng() % 2);
      switch (config.data_format) {
        case DataFormat::kSlot:
        case DataFormat::kMultiSlot: {
          InstanceBlock block(slots, config.dense_dim);
          std::vector<float> dense(static_cast<std::size_t>(config.dense_dim));
          for (float& v : dense) v = static_cast<float>(rng() % 100) / 8.0f;
          std::vector<std::uint64_t> keys;
          std::vector<std::uint32_t> sizes;
          for (int s = 0; s < slots; ++s) {
            // MultiSlot needs at least one value per slot.
            const std::uint32_t n = static_cast<std::uint32_t>(rng() % 3) +
                                    (config.data_format == DataFormat::kMultiSlot ? 1 : 0);
            for (std::uint32_t k = 0; k < n; ++k) keys.push_back(1 + rng() % 300);
            sizes.push_back(n);
          }
          block.append(static_cast<float>(label), dense.data(), keys.data(), keys.size(),
                       sizes.data());
          append_line(config, config.data_format, block.instance(0), &text);
          break;
        }
        case DataFormat::kCriteo: {
          text += std::to_string(label);
          for (int d = 0; d < 13; ++d) text += "\t" + std::to_string(rng() % 50);
          for (int s = 0; s < 26; ++s) {
            char hex[16];
            std::snprintf(hex, sizeof(hex), "%08x", static_cast<unsigned>(rng() % 500));
            text += "\t" + std::string(rng() % 9 == 0 ? "" : hex);
          }
          text += "\n";
          break;
        }
        case DataFormat::kFeatIdx:
        default: {  // 1 dense value and 2 sparse slots
          text += "feat_idx:1 feat_idx:" + std::to_string(1 + rng() % 200) +
                  " feat_idx:" + std::to_string(rng() % 200) + " feat_value:0.5 feat_value:1 " +
                  "feat_value:1 label:" + std::to_string(label) + "\n";
          break;
        }
      }
    }
    const std::string path = dir.file("part-" + std::to_string(f));
    std::ofstream(path, std::ios::binary) << text;
    files.push_back(path);
  }
  return files;
}

void expect_same_batch(const Batch& want, const Batch& got, const std::string& where) {
  EXPECT_EQ(want.labels, got.labels) << where;
  EXPECT_EQ(want.dense, got.dense) << where;
  EXPECT_EQ(want.keys, got.keys) << where;
  EXPECT_EQ(want.offsets, got.offsets) << where;
}

// Streams `files` to `cards` card threads and checks every batch against InMemoryDataset's.
void expect_same_as_in_memory(const DatasetConfig& config, const std::vector<std::string>& files,
                              int cards, std::size_t queue_rounds = 2) {
  InMemoryDataset oracle(config);
  oracle.set_filelist(files);
  const Status loaded = oracle.load_into_memory();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  const std::size_t batches = oracle.num_batches_per_card(cards);

  QueueDataset queue(config);
  queue.set_filelist(files);
  queue.set_queue_rounds(queue_rounds);
  queue.start(cards);
  std::vector<std::size_t> got_batches(static_cast<std::size_t>(cards), 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < cards; ++c) {
    threads.emplace_back([&, c] {
      Batch got, want;
      std::size_t& k = got_batches[static_cast<std::size_t>(c)];
      while (queue.next_batch(c, &got)) {
        if (k < batches) {
          oracle.fill_batch(c, cards, k, &want);
          expect_same_batch(want, got, "card " + std::to_string(c) + " batch " + std::to_string(k));
        }
        ++k;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const Status finished = queue.finish();
  ASSERT_TRUE(finished.ok()) << finished.to_string();
  for (int c = 0; c < cards; ++c) EXPECT_EQ(got_batches[static_cast<std::size_t>(c)], batches);
  const LoadStats& want = oracle.load_stats();
  const LoadStats& got = queue.load_stats();
  EXPECT_EQ(got.files, want.files);
  EXPECT_EQ(got.lines, want.lines);
  EXPECT_EQ(got.instances, want.instances);
  EXPECT_EQ(got.blank_lines, want.blank_lines);
  EXPECT_EQ(got.positives, want.positives);
  EXPECT_EQ(got.skipped_by_reason, want.skipped_by_reason);
  ASSERT_EQ(got.errors.size(), want.errors.size());
  for (std::size_t e = 0; e < got.errors.size(); ++e)
    EXPECT_EQ(got.errors[e].to_string(), want.errors[e].to_string());
  EXPECT_LE(queue.peak_queued_instances(), queue.bound_instances());

  // scan(): the count and the unique keys with their slots, as InMemoryDataset has them.
  UniqueKeys keys;
  const Status scanned = queue.scan(&keys);
  ASSERT_TRUE(scanned.ok()) << scanned.to_string();
  EXPECT_EQ(queue.size(), oracle.size());
  EXPECT_EQ(queue.num_batches_per_card(cards), batches);
  const UniqueKeys want_keys = oracle.unique_keys_and_slots();
  EXPECT_EQ(keys.keys, want_keys.keys);
  EXPECT_EQ(keys.slots, want_keys.slots);
  EXPECT_EQ(queue.load_stats().skipped_lines(), want.skipped_lines());
}

DatasetConfig format_config(DataFormat format) {
  DatasetConfig c = format == DataFormat::kCriteo    ? slot_config(26, 13)
                    : format == DataFormat::kFeatIdx ? slot_config(2, 1)
                                                     : slot_config(3, 2);
  c.data_format = format;
  c.batch_size = 5;
  c.thread_num = 3;
  return c;
}

TEST(QueueDataset, EveryFormatGivesInMemoryDatasetsBatchesAndCounts) {
  for (DataFormat format :
       {DataFormat::kSlot, DataFormat::kMultiSlot, DataFormat::kCriteo, DataFormat::kFeatIdx}) {
    SCOPED_TRACE(name_of(config::kDataFormatNames, format));
    ScratchDir dir;
    const DatasetConfig c = format_config(format);
    const auto files = write_files(dir, c, {120, 0, 37, 1, 300}, 7, true);
    for (int cards : {1, 3}) expect_same_as_in_memory(c, files, cards);
    DatasetConfig automatic = c;
    automatic.data_format = DataFormat::kAuto;
    expect_same_as_in_memory(automatic, files, 2);
  }
}

TEST(QueueDataset, ThroughPipeCommand) {
  ScratchDir dir;
  DatasetConfig c = format_config(DataFormat::kSlot);
  const auto plain = write_files(dir, c, {200, 33, 450}, 11, true);
  std::vector<std::string> gz;
  for (const std::string& f : plain) {
    ASSERT_EQ(std::system(("gzip -k " + f).c_str()), 0);
    gz.push_back(f + ".gz");
  }
  c.pipe_command = "gzip -dc";
  expect_same_as_in_memory(c, gz, 2);
}

// A scan whose visitor throws (the streamed pass's step sizer) ends with that exception once
// the reader threads are stopped and joined, not with the process (a joinable thread left).
TEST(QueueDataset, AVisitorThatThrowsStopsTheReadersAndPropagates) {
  ScratchDir dir;
  DatasetConfig c = format_config(DataFormat::kSlot);
  c.thread_num = 2;
  const auto files = write_files(dir, c, {300, 300, 300, 300}, 5, true);
  QueueDataset queue(c);
  queue.set_filelist(files);
  int visited = 0;
  EXPECT_THROW(queue.scan(nullptr,
                          [&](const InstanceBlock&) {
                            if (++visited == 2) throw std::runtime_error("visitor failed");
                          }),
               std::runtime_error);
  EXPECT_EQ(visited, 2);
  // The stream is usable again afterwards.
  const Status again = queue.scan();
  EXPECT_TRUE(again.ok()) << again.to_string();
}

// 0, 1, a round (batch x cards), a round + 1, and around the queue's bound (rounds x round).
TEST(QueueDataset, EdgeSizesAroundABatchARoundAndTheQueueBound) {
  constexpr int kCards = 2;
  constexpr std::size_t kRounds = 3;
  DatasetConfig c = format_config(DataFormat::kSlot);
  const std::size_t round = static_cast<std::size_t>(c.batch_size) * kCards;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{5}, std::size_t{6}, round - 1,
        round, round + 1, kRounds * round - 1, kRounds * round, kRounds * round + 1,
        (kRounds + 1) * round + 3, QueueDataset::kChunkInstances + 1}) {
    SCOPED_TRACE("instances " + std::to_string(n));
    ScratchDir dir;
    const auto files = write_files(dir, c, {n}, n + 3, false);
    expect_same_as_in_memory(c, files, kCards, kRounds);
    expect_same_as_in_memory(c, files, 1, 1);
  }
  ScratchDir dir;
  const auto none = write_files(dir, c, {0, 0}, 1, false);
  expect_same_as_in_memory(c, none, 3);
}

// A consumer that does not take anything: the readers stop at the bound, and the queue holds at
// least its ready rounds (so the bound is what limits it), never more than bound_instances().
TEST(QueueDataset, TheQueueNeverHoldsMoreThanItsBound) {
  ScratchDir dir;
  DatasetConfig c = format_config(DataFormat::kSlot);
  c.batch_size = 16;
  c.thread_num = 2;
  const auto files = write_files(dir, c, {10000, 10000, 10000, 10000}, 5, false);
  QueueDataset queue(c);
  queue.set_filelist(files);
  queue.set_queue_rounds(3);
  queue.start(2);
  std::size_t peak = 0;
  for (int i = 0; i < 200; ++i) {  // until the readers have stopped growing the queue
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::size_t now = queue.peak_queued_instances();
    if (now == peak && now >= 3 * 32) break;
    peak = now;
  }
  EXPECT_GE(queue.peak_queued_instances(), 3u * 32u);
  EXPECT_LE(queue.peak_queued_instances(), queue.bound_instances());
  EXPECT_LT(queue.bound_instances(), 40000u);  // far less than the pass
  std::size_t taken = 0;
  Batch batch;
  std::thread other([&] {
    Batch b;
    while (queue.next_batch(1, &b)) {
    }
  });
  while (queue.next_batch(0, &batch)) taken += batch.size();
  other.join();
  ASSERT_TRUE(queue.finish().ok());
  EXPECT_EQ(queue.load_stats().instances, 40000u);
  EXPECT_EQ(taken, 20000u);
  EXPECT_LE(queue.peak_queued_instances(), queue.bound_instances());
  EXPECT_NE(queue.memory_note().find("instances queued"), std::string::npos);
}

TEST(QueueDataset, StrictParseAndUnreadableFilesEndTheStreamNamingTheFile) {
  ScratchDir dir;
  DatasetConfig c = format_config(DataFormat::kSlot);
  c.dense_dim = 0;
  const std::string good = dir.write("good", "click:1 1:5\nclick:0 2:6\n");
  const std::string bad = dir.write("bad", "click:1 1:5\nclick:9 1:5\n");
  c.strict_parse = true;
  {
    QueueDataset queue(c);
    queue.set_filelist({good, bad});
    queue.start(1);
    Batch batch;
    while (queue.next_batch(0, &batch)) {
    }
    const Status st = queue.finish();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(bad + ":2"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("strict_parse"), std::string::npos) << st.to_string();
  }
  c.strict_parse = false;
  QueueDataset queue(c);
  queue.set_filelist({good, dir.file("missing")});
  const Status scanned = queue.scan();
  EXPECT_FALSE(scanned.ok());
  EXPECT_NE(scanned.message().find("missing"), std::string::npos) << scanned.to_string();
  c.pipe_command = "exit 3";
  QueueDataset piped(c);
  piped.set_filelist({good});
  piped.start(1);
  Batch batch;
  EXPECT_FALSE(piped.next_batch(0, &batch));
  EXPECT_FALSE(piped.finish().ok());
}

TEST(QueueDataset, AbortWakesTheCardsAndADroppedStreamStopsItsReaders) {
  ScratchDir dir;
  DatasetConfig c = format_config(DataFormat::kSlot);
  c.pipe_command = "cat";
  const auto files = write_files(dir, c, {5000, 5000}, 3, false);
  {
    QueueDataset queue(c);
    queue.set_filelist(files);
    queue.set_queue_rounds(1);
    queue.start(2);
    Batch batch;
    ASSERT_TRUE(queue.next_batch(0, &batch));
    // Card 1 never takes its part, so card 0 waits for room: the abort wakes it.
    std::thread waiter([&] {
      while (queue.next_batch(0, &batch)) {
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    queue.abort("card 1 failed");
    waiter.join();
    const Status st = queue.finish();
    EXPECT_EQ(st.code(), Status::Code::kAborted);
    EXPECT_NE(st.message().find("card 1 failed"), std::string::npos);
  }
  QueueDataset dropped(c);
  dropped.set_filelist(files);
  dropped.start(1);  // the destructor stops it mid-stream
}

// A pipe_command that gives other lines the second time (fewer, or more: the stream stops at
// once rather than wait for card threads that took the scanned count): the stream says so.
TEST(QueueDataset, ASecondReadThatDiffersFromTheScanIsAnError) {
  for (const char* second : {"head -n 1", "cat"}) {
    SCOPED_TRACE(second);
    ScratchDir dir;
    DatasetConfig c = format_config(DataFormat::kSlot);
    c.dense_dim = 0;
    c.batch_size = 1;
    std::string text;
    for (int i = 0; i < 3000; ++i) text += "click:1 1:" + std::to_string(i + 1) + "\n";
    const std::string data = dir.write("d", text);
    const std::string counter = dir.file("count");
    const std::string first = std::string(second) == "cat" ? "head -n 2" : "cat";
    c.pipe_command = "if [ -e " + counter + " ]; then " + second + "; else touch " + counter +
                     "; " + first + "; fi";
    QueueDataset queue(c);
    queue.set_filelist({data});
    queue.set_queue_rounds(1);
    ASSERT_TRUE(queue.scan().ok());
    const std::size_t scanned = queue.size();
    queue.start(1);
    Batch batch;
    for (std::size_t b = 0; b < scanned && queue.next_batch(0, &batch); ++b) {
    }
    const Status st = queue.finish();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("same lines"), std::string::npos) << st.to_string();
  }
}

// The same count of lines but not the same lines (here: in reverse order the second time; a
// shuffling pipe_command does this): the pass's keys and step plan came from the scan, so the
// stream stops at the first batch that differs, before a card takes it, naming the instances.
// The batch sizes 1, n and n+1 and a short last batch; and a second read equal to the first
// (no shuffle) streams every batch.
TEST(QueueDataset, ASecondReadWithOtherLinesOfTheSameCountStopsBeforeACardTakesThem) {
  for (const int batch : {1, 7, 10, 11}) {
    for (const bool reversed : {true, false}) {
      SCOPED_TRACE(std::to_string(batch) + (reversed ? " reversed" : " same"));
      ScratchDir dir;
      DatasetConfig c = format_config(DataFormat::kSlot);
      c.dense_dim = 0;
      c.batch_size = batch;
      std::string text;
      for (int i = 0; i < 25; ++i)
        text += "click:" + std::to_string(i % 2) + " 1:" + std::to_string(i + 1) + "\n";
      // Lines 0..9 as they are, then 10..24 reversed: the first batches agree.
      const std::string data = dir.write("d", text);
      const std::string counter = dir.file("count");
      const std::string second = reversed ? "(head -n 10; tail -n 15 | tac)" : "cat";
      c.pipe_command =
          "if [ -e " + counter + " ]; then " + second + "; else touch " + counter + "; cat; fi";
      QueueDataset queue(c);
      queue.set_filelist({data});
      queue.set_queue_rounds(1);
      ASSERT_TRUE(queue.scan().ok());
      ASSERT_EQ(queue.size(), 25u);
      queue.start(1);
      Batch b;
      std::vector<std::uint64_t> taken;
      for (std::size_t k = 0; k < queue.num_batches_per_card(1) && queue.next_batch(0, &b); ++k) {
        taken.insert(taken.end(), b.keys.begin(), b.keys.end());
      }
      const Status st = queue.finish();
      if (!reversed) {
        EXPECT_TRUE(st.ok()) << st.to_string();
        EXPECT_EQ(taken.size(), 25u);
        continue;
      }
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.code(), Status::Code::kCorruption);
      const int first_bad = 10 / batch * batch;  // the batch holding line 10
      EXPECT_NE(st.message().find("differs from the first in its instances " +
                                  std::to_string(first_bad) + ".."),
                std::string::npos)
          << st.to_string();
      EXPECT_NE(st.message().find("must give the same lines, in the same order"),
                std::string::npos);
      // No key of the differing lines reached the card.
      for (const std::uint64_t key : taken) EXPECT_LE(key, 10u) << st.to_string();
    }
  }
}

}  // namespace
}  // namespace gpubox::dataset
