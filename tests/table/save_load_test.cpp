// save/load: round trips in every mode and both forms, base + deltas reproduce the model,
// checkpoints reproduce everything bit-exact, a save interrupted at every step leaves the
// previous save loadable, a delta carries a delete then a re-create, saves while pushing stay
// loadable. Saves refused: save_load_refused_test.cpp; part files read in chunks and the row
// codec: save_load_parts_test.cpp (the same binary, their fixture save_load_fixture.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "table/io/fault_env.hpp"
#include "table/io/save_dir.hpp"
#include "tests/table/save_load_fixture.hpp"
#include "tests/table/shrink_oracle.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using save_load_test::Fixture;
using testing::RowMap;

class SaveLoadTest : public ::testing::TestWithParam<std::tuple<SaveForm, bool>> {};

TEST_P(SaveLoadTest, CheckpointRestoresEveryRowAndTheDay) {
  const auto [form, disk] = GetParam();
  for (std::size_t n : {0, 1, 500}) {
    Fixture f(form, 8, disk);
    std::mt19937_64 rng(n + 1);
    if (n > 0) f.mutate(rng, n, 1u << 30);
    ASSERT_TRUE(f.table->shrink().ok());
    const RowMap before = testing::snapshot(*f.table);
    ASSERT_TRUE(f.table->save(f.dir.sub("ckpt"), SaveKind::kCheckpoint).ok());
    for (uint32_t shards : {8u, 3u}) {  // another shard count re-shards the keys
      if (n < 2 && shards != 8) continue;
      auto loaded = f.fresh(shards);
      const Status st = loaded->load(f.dir.sub("ckpt"));
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_TRUE(testing::same_rows(testing::snapshot(*loaded), before)) << "n=" << n;
      EXPECT_EQ(loaded->day(), 1);
    }
  }
}

TEST_P(SaveLoadTest, BaseThenDeltasReproduceTheModel) {
  const auto [form, disk] = GetParam();
  Fixture f(form, 8, disk);
  const RowLayout layout = f.table->layout();
  std::mt19937_64 rng(42);
  f.mutate(rng, 800, 3000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  RowMap expected_after_base = testing::model_of(testing::snapshot(*f.table), layout);

  // Delta 1: pushes, new rows, erasures; delta 2: a shrink that deletes old rows.
  f.mutate(rng, 200, 3000);
  std::vector<uint64_t> gone = {rng() % 3000, rng() % 3000, rng() % 3000};
  ASSERT_TRUE(f.table->erase(gone.data(), gone.size()).ok());
  ASSERT_TRUE(f.table->save(f.dir.sub("delta1"), SaveKind::kDelta).ok());
  const RowMap expected_after_d1 = testing::model_of(testing::snapshot(*f.table), layout);
  f.mutate(rng, 50, 3000);
  for (int d = 0; d < 4; ++d) ASSERT_TRUE(f.table->shrink().ok());  // unseen > 3: all deleted
  f.mutate(rng, 30, 3000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta2"), SaveKind::kDelta).ok());
  const RowMap expected_after_d2 = testing::model_of(testing::snapshot(*f.table), layout);
  ASSERT_LT(expected_after_d2.size(), 200u);

  // A delta holds only what changed: nothing changed since delta2.
  ASSERT_TRUE(f.table->save(f.dir.sub("delta3"), SaveKind::kDelta).ok());
  auto manifest = io::read_manifest(io::FileEnv::posix(), f.dir.sub("delta3"), "sparse");
  ASSERT_TRUE(manifest.ok());
  for (const auto& file : manifest->files) EXPECT_EQ(file.records, 0u) << file.name;

  auto loaded = f.fresh();
  ASSERT_TRUE(loaded->load(f.dir.sub("base")).ok());
  EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout),
                                 expected_after_base));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta1")).ok());
  EXPECT_TRUE(
      testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), expected_after_d1));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta2")).ok());
  EXPECT_TRUE(
      testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), expected_after_d2));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta3")).ok());
  EXPECT_TRUE(
      testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), expected_after_d2));
}

// A shrink without decay (show_click_decay_rate 1) changes no row's model record, only its
// unseen days, which no delta holds: the delta after it holds the rows pushed since the last
// save, not the whole table (before, the shrink marked every row changed), and the keys it
// deleted as deletions. The oracle: the keys pushed since the last save, and the shrink rule
// (shrink_oracle.hpp) over the table's rows before each shrink. Base + deltas reproduce the
// unbroken table's model, the deleted rows included (they do not come back). In memory and with
// most rows on disk (the disk rows' aging keeps their epochs too).
TEST_P(SaveLoadTest, DeltaAfterAShrinkWithoutDecayHoldsOnlyTheChangedRows) {
  const auto [form, disk] = GetParam();
  Fixture f(form, 8, disk);
  f.opt.show_click_decay_rate = 1.0f;
  f.opt.delete_threshold = -1.0f;
  f.opt.delete_after_unseen_days = 2.0f;
  f.table = f.fresh();
  const RowLayout layout = f.table->layout();
  std::mt19937_64 rng(17);
  f.mutate(rng, 600, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  // Pushes `n` random rows of keys from [0, 2000); returns the distinct keys.
  const auto push = [&](std::size_t n) {
    std::vector<uint64_t> keys(n);
    std::vector<float> rows;
    for (auto& k : keys) {
      k = rng() % 2000;
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    EXPECT_TRUE(f.table->push(keys.data(), n, rows.data()).ok());
    return std::set<uint64_t>(keys.begin(), keys.end());
  };
  // Shrinks once, checked against the rule over the rows before; returns the keys left.
  const auto shrink = [&] {
    const RowMap before = testing::snapshot(*f.table);
    std::unordered_map<uint64_t, std::vector<float>> oracle(before.begin(), before.end());
    const uint64_t deleted = testing::shrink_rows(&oracle, f.opt);
    auto got = f.table->shrink();
    EXPECT_TRUE(got.ok());
    EXPECT_EQ(got.ok() ? *got : 0, deleted);
    std::set<uint64_t> left;
    for (const auto& entry : oracle) left.insert(entry.first);
    return std::make_pair(left, deleted);
  };
  // The records of the save at `name`: rows and deletions.
  const auto records = [&](const std::string& name) {
    auto manifest = io::read_manifest(io::FileEnv::posix(), f.dir.sub(name), "sparse");
    EXPECT_TRUE(manifest.ok());
    std::pair<uint64_t, uint64_t> out{0, 0};
    if (!manifest.ok()) return out;
    for (const auto& file : manifest->files) {
      if (file.name.rfind("part-", 0) == 0) out.first += file.records;
      if (file.name.rfind("delete-", 0) == 0) out.second += file.records;
    }
    return out;
  };
  const std::size_t table_rows = f.table->size().value();
  shrink();  // day 1: every row unseen 1, none deleted
  std::set<uint64_t> pushed = push(150);
  std::set<uint64_t> left;
  uint64_t deleted = 0;
  std::tie(left, deleted) = shrink();  // day 2: unseen 2 is not over 2: none deleted
  ASSERT_EQ(deleted, 0u);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta1"), SaveKind::kDelta).ok());
  EXPECT_EQ(records("delta1"), std::make_pair(static_cast<uint64_t>(pushed.size()), uint64_t{0}))
      << "of " << table_rows << " rows";
  const RowMap after_d1 = testing::model_of(testing::snapshot(*f.table), layout);
  pushed = push(150);
  std::tie(left, deleted) = shrink();  // day 3: the rows of the base pushed in neither go
  ASSERT_GT(deleted, 0u);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta2"), SaveKind::kDelta).ok());
  uint64_t kept_pushed = 0;
  for (uint64_t key : pushed) kept_pushed += left.count(key);
  EXPECT_EQ(records("delta2"), std::make_pair(kept_pushed, deleted));
  const RowMap after_d2 = testing::model_of(testing::snapshot(*f.table), layout);
  ASSERT_EQ(after_d2.size(), left.size());

  auto loaded = f.fresh();
  for (const char* save : {"base", "delta1"}) ASSERT_TRUE(loaded->load(f.dir.sub(save)).ok());
  EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), after_d1));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta2")).ok());
  EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), after_d2));
  EXPECT_EQ(loaded->size().value(), left.size());
}

TEST_P(SaveLoadTest, BaseLoadInitializesOptimizerState) {
  const auto [form, disk] = GetParam();
  Fixture f(form, 4, disk);
  const RowLayout layout = f.table->layout();
  std::mt19937_64 rng(8);
  f.mutate(rng, 100, 1000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  auto loaded = f.fresh();
  ASSERT_TRUE(loaded->load(f.dir.sub("base")).ok());
  for (const auto& [key, row] : testing::snapshot(*loaded)) {
    // The row a fresh pull creates, with the saved model fields written over it.
    std::vector<float> want(layout.stride());
    std::vector<float> rec(record_floats(RecordKind::kModel, layout));
    row_to_record(RecordKind::kModel, layout, row.data(), rec.data());
    record_to_row(RecordKind::kModel, layout, f.opt, key, rec.data(), false, want.data());
    ASSERT_TRUE(testing::same_bits(row, want)) << "key " << key;
    EXPECT_EQ(row[RowLayout::kEmbedState], 0.0f);  // adagrad g2sum, fresh as Paddle's
    if (row[layout.mf_size()] > 0) {
      EXPECT_EQ(row[layout.embedx_state()], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FormsAndTiers, SaveLoadTest,
                         ::testing::Combine(::testing::Values(SaveForm::kText, SaveForm::kBinary),
                                            ::testing::Bool()));

TEST(SaveLoad, TextPartsAreKeyThenValuesPerLine) {
  Fixture f(SaveForm::kText, 1, false, nullptr);  // POSIX env, fsync included
  const RowLayout layout = f.table->layout();
  const uint64_t key = 18446744073709551615ull;
  std::vector<float> row(layout.stride(), 0.0f);
  row[RowLayout::kShow] = 3.0f;
  row[RowLayout::kClick] = 0.5f;
  row[layout.slot()] = 12.0f;
  row[RowLayout::kEmbedW] = -0.25f;
  ASSERT_TRUE(f.table->push(&key, 1, row.data()).ok());
  ASSERT_TRUE(f.table->save(f.dir.sub("m"), SaveKind::kBase).ok());
  std::ifstream in(f.dir.sub("m/part-0"));
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "18446744073709551615 3 0.5 12 -0.25 0 0 0 0 0");
  EXPECT_FALSE(std::getline(in, line));
}

TEST(SaveLoad, InterruptedSaveLeavesThePreviousSaveLoadable) {
  for (SaveForm form : {SaveForm::kBinary, SaveForm::kText}) {
    for (SaveKind mode : {SaveKind::kCheckpoint, SaveKind::kBase}) {
      io::FaultInjectingEnv env(io::FileEnv::posix(), /*real_syncs=*/false);
      Fixture f(form, 4, false, &env);
      const RowLayout layout = f.table->layout();
      std::mt19937_64 rng(11);
      f.mutate(rng, 300, 1u << 20);
      const std::string path = f.dir.sub("model");
      ASSERT_TRUE(f.table->save(path, mode).ok());
      const bool full = mode == SaveKind::kCheckpoint;
      auto view = [&](SparseTable& t) {
        RowMap rows = testing::snapshot(t);
        return full ? rows : testing::model_of(rows, layout);
      };
      const RowMap old_state = view(*f.table);
      f.mutate(rng, 300, 1u << 20);
      const RowMap new_state = view(*f.table);
      ASSERT_FALSE(testing::same_rows(old_state, new_state));

      int failures = 0, old_loaded = 0;
      for (int64_t step = 0;; ++step) {
        env.reset_steps();
        env.fail_from(step);
        const Status st = f.table->save(path, mode);
        env.fail_from(io::FaultInjectingEnv::kNever);
        auto loaded = f.fresh();
        const Status load_st = loaded->load(path);
        ASSERT_TRUE(load_st.ok()) << "after failing step " << step << ": " << load_st.to_string();
        const RowMap got = view(*loaded);
        if (st.ok()) {
          EXPECT_TRUE(testing::same_rows(got, new_state));
          break;
        }
        ++failures;
        EXPECT_NE(st.message().find("injected failure"), std::string::npos) << st.to_string();
        // Failing before the commit point leaves the old save; after it, the new one is complete.
        if (testing::same_rows(got, old_state)) {
          ++old_loaded;
        } else {
          EXPECT_TRUE(testing::same_rows(got, new_state)) << "step " << step;
        }
        ASSERT_LT(step, 500);
      }
      EXPECT_GT(failures, 10);
      EXPECT_GE(old_loaded, failures - 3);  // only the last steps (after the exchange) differ
    }
  }
}

TEST(SaveLoad, DeltaCarriesADeleteThenRecreate) {
  for (SaveForm form : {SaveForm::kText, SaveForm::kBinary}) {
    Fixture f(form, 2);
    const RowLayout layout = f.table->layout();
    std::mt19937_64 rng(21);
    std::vector<uint64_t> keys = {10, 11, 12};
    std::vector<float> rows;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(f.table->push(keys.data(), keys.size(), rows.data()).ok());
    ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
    // 10: deleted and created again by a pull; 11: deleted; 12: untouched.
    ASSERT_TRUE(f.table->erase(keys.data(), 2).ok());
    std::vector<float> out(layout.stride());
    ASSERT_TRUE(f.table->pull(&keys[0], nullptr, 1, out.data(), nullptr).ok());
    ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
    auto manifest = io::read_manifest(io::FileEnv::posix(), f.dir.sub("delta"), "sparse");
    ASSERT_TRUE(manifest.ok());
    uint64_t part_rows = 0, deleted = 0;
    for (const auto& file : manifest->files) {
      if (file.name.rfind("part-", 0) == 0) part_rows += file.records;
      if (file.name.rfind("delete-", 0) == 0) deleted += file.records;
    }
    EXPECT_EQ(part_rows, 1u);  // key 10 again
    EXPECT_EQ(deleted, 2u);    // keys 10 and 11
    auto loaded = f.fresh();
    ASSERT_TRUE(loaded->load(f.dir.sub("base")).ok());
    ASSERT_TRUE(loaded->load(f.dir.sub("delta")).ok());
    EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout),
                                   testing::model_of(testing::snapshot(*f.table), layout)));
    EXPECT_EQ(loaded->size().value(), 2u);
  }
}

TEST(SaveLoad, SavesWhilePushingStayLoadable) {
  Fixture f(SaveForm::kBinary, 8);
  const RowLayout layout = f.table->layout();
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::mt19937_64 rng(4);
    std::vector<uint64_t> keys(256);
    std::vector<float> rows;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    while (!stop.load()) {
      for (auto& k : keys) k = rng() % 5000;
      ASSERT_TRUE(f.table->push(keys.data(), keys.size(), rows.data()).ok());
    }
  });
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(f.table->save(f.dir.sub("ckpt"), SaveKind::kCheckpoint).ok());
    auto loaded = f.fresh();
    ASSERT_TRUE(loaded->load(f.dir.sub("ckpt")).ok());
    EXPECT_LE(loaded->size().value(), f.table->size().value());
  }
  stop.store(true);
  pusher.join();
  ASSERT_TRUE(f.table->save(f.dir.sub("ckpt"), SaveKind::kCheckpoint).ok());
  auto loaded = f.fresh();
  ASSERT_TRUE(loaded->load(f.dir.sub("ckpt")).ok());
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*loaded), testing::snapshot(*f.table)));
}

}  // namespace
}  // namespace gpubox::table
