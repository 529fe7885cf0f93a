// Base and delta saves across shrinks that decay (show_click_decay_rate 0.9): each row's unseen
// days travel with it (unseen-<shard>), a delta records the shrinks since the previous save
// (delta+shrinks) instead of holding every row they aged, and a loader of the chain replays them.
// The oracle: an std::unordered_map of every row (show, click, unseen days) aged by the shrink
// rule (shrink_oracle.hpp) and written by each push; the chain loaded into a fresh table equals
// the live table bit for bit (model records and unseen days), in memory and with most rows on
// disk, and a job resumed from it deletes the rows the live job deletes. A shrink that failed
// part way makes the next delta hold every row; a table partly loaded refuses deltas; a save
// from before unseen files loads as before. (The server's LOAD of such a chain:
// tests/table/server/shrink_chain_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "table/io/forwarding_env.hpp"
#include "table/io/save_dir.hpp"
#include "tests/table/manifest_edit.hpp"
#include "tests/table/save_load_fixture.hpp"
#include "tests/table/shrink_oracle.hpp"
#include "tests/table/slot_dims_config.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using save_load_test::Fixture;
using testing::RowMap;
using Oracle = std::unordered_map<uint64_t, std::vector<float>>;

// What a base + delta chain must restore of every row: its model record, then its unseen days.
RowMap saved_state(SparseTable& table) {
  RowMap out;
  const RowLayout layout = table.layout();
  for (const auto& [key, row] : testing::snapshot(table)) {
    std::vector<float> rec(record_floats(RecordKind::kModel, layout));
    row_to_record(RecordKind::kModel, layout, row.data(), rec.data());
    rec.push_back(row[RowLayout::kUnseenDays]);
    out[key] = rec;
  }
  return out;
}

// The oracle's show, click and unseen days against the table's, key by key.
::testing::AssertionResult matches(const Oracle& oracle, SparseTable& table) {
  const RowMap rows = testing::snapshot(table);
  if (rows.size() != oracle.size()) {
    return ::testing::AssertionFailure()
           << rows.size() << " rows, the oracle has " << oracle.size();
  }
  for (const auto& [key, want] : oracle) {
    const auto it = rows.find(key);
    if (it == rows.end()) return ::testing::AssertionFailure() << "key " << key << " missing";
    for (int32_t field : {RowLayout::kShow, RowLayout::kClick, RowLayout::kUnseenDays}) {
      if (!testing::same_bits({it->second[field]}, {want[field]})) {
        return ::testing::AssertionFailure() << "key " << key << " field " << field << ": "
                                             << it->second[field] << ", oracle " << want[field];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Rows (part-*), deletions (delete-*) and unseen days (unseen-*) in the save at `path`, and its
// MANIFEST's mode.
struct SaveCounts {
  uint64_t rows = 0, deleted = 0, unseen = 0;
  std::string mode, shrinks;  // its MANIFEST's mode and shrinks
};
SaveCounts counts_of(const std::string& path) {
  SaveCounts out;
  auto manifest = io::read_manifest(io::FileEnv::posix(), path, "sparse");
  EXPECT_TRUE(manifest.ok()) << manifest.status().to_string();
  if (!manifest.ok()) return out;
  out.mode = manifest->properties["mode"];
  out.shrinks = manifest->properties["shrinks"];
  for (const auto& file : manifest->files) {
    if (file.name.rfind("part-", 0) == 0) out.rows += file.records;
    if (file.name.rfind("delete-", 0) == 0) out.deleted += file.records;
    if (file.name.rfind("unseen-", 0) == 0) out.unseen += file.records;
  }
  return out;
}

// A fixture of tables that decay (0.9) and delete rows unseen over 2 days (none by score), and
// an oracle of every row kept beside the live table.
struct DecayingChain {
  DecayingChain(SaveForm form, bool disk) : f(form, 8, disk) {
    f.opt.delete_after_unseen_days = 2.0f;
    f.table = f.fresh();
  }
  // Pushes random rows for `n` random keys of [0, key_space); returns the distinct keys.
  std::set<uint64_t> push(std::size_t n, uint64_t key_space) {
    const RowLayout layout = f.table->layout();
    std::vector<uint64_t> keys(n);
    std::vector<float> rows;
    for (auto& k : keys) {
      k = rng() % key_space;
      auto row = testing::random_row(rng, layout);
      oracle[k] = row;  // unseen 0; the last push of a key wins
      rows.insert(rows.end(), row.begin(), row.end());
    }
    EXPECT_TRUE(f.table->push(keys.data(), n, rows.data()).ok());
    return std::set<uint64_t>(keys.begin(), keys.end());
  }
  // Shrinks the live table and the oracle; returns how many rows it deleted (checked).
  uint64_t shrink() {
    const uint64_t deleted = testing::shrink_rows(&oracle, f.opt);
    auto got = f.table->shrink();
    EXPECT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got.ok() ? *got : 0, deleted);
    EXPECT_TRUE(matches(oracle, *f.table));
    return deleted;
  }
  // 600 rows saved as `base`, a shrink, 50 rows more, saved as `delta` (a delta+shrinks).
  void save_base_shrink_delta() {
    push(600, 2000);
    ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
    shrink();
    push(50, 2000);
    ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
  }

  Fixture f;
  std::mt19937_64 rng{29};
  Oracle oracle;
};

class SaveLoadShrinksTest : public ::testing::TestWithParam<std::tuple<SaveForm, bool>> {};

// base, shrink, delta, shrink x2, delta: each delta holds the rows pushed since the save before
// it (and their unseen days) plus the rows deleted, not the rows the shrinks aged; the chain
// loaded equals the live table, unseen days included; then both shrink alike.
TEST_P(SaveLoadShrinksTest, ChainReplaysTheShrinksAndKeepsUnseenDays) {
  const auto [form, disk] = GetParam();
  DecayingChain c(form, disk);
  Fixture& f = c.f;
  c.push(600, 2000);
  c.shrink();  // before the first save: every row unseen 1 in the base
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  const SaveCounts base = counts_of(f.dir.sub("base"));
  EXPECT_EQ(base.unseen, base.rows);
  EXPECT_EQ(base.mode, "base");

  ASSERT_EQ(c.shrink(), 0u);  // day 2: unseen 2 is not over 2
  std::set<uint64_t> pushed = c.push(100, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta1"), SaveKind::kDelta).ok());
  SaveCounts d1 = counts_of(f.dir.sub("delta1"));
  EXPECT_EQ(d1.mode, "delta+shrinks");
  EXPECT_EQ(d1.rows, pushed.size()) << "of " << c.oracle.size() << " rows";
  EXPECT_EQ(d1.unseen, pushed.size());
  EXPECT_EQ(d1.deleted, 0u);
  const RowMap after_d1 = saved_state(*f.table);

  uint64_t deleted = c.shrink();  // day 3: the base's rows not pushed since go
  ASSERT_GT(deleted, 0u);
  deleted += c.shrink();
  pushed = c.push(80, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta2"), SaveKind::kDelta).ok());
  const SaveCounts d2 = counts_of(f.dir.sub("delta2"));
  EXPECT_EQ(d2.mode, "delta+shrinks");
  EXPECT_EQ(d2.rows, pushed.size());
  EXPECT_EQ(d2.deleted, deleted);
  const RowMap after_d2 = saved_state(*f.table);

  auto loaded = f.fresh_loaded({"base", "delta1"});
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), after_d1));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta2")).ok());
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), after_d2));

  // Resumed from the chain: each shrink deletes what the live job's deletes.
  for (int day = 0; day < 3; ++day) {
    auto resumed = loaded->shrink();
    ASSERT_TRUE(resumed.ok());
    EXPECT_EQ(*resumed, c.shrink()) << "day " << day;
    EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table))) << "day " << day;
  }
}

INSTANTIATE_TEST_SUITE_P(FormsAndTiers, SaveLoadShrinksTest,
                         ::testing::Combine(::testing::Values(SaveForm::kText, SaveForm::kBinary),
                                            ::testing::Bool()));

// A shrink that fails part way (a disk write refused) aged some shards and not others: no whole
// day replays that, so the next delta holds every row (every_row), and the chain still equals
// the live table.
TEST(SaveLoadShrinks, AShrinkThatFailedMakesTheNextDeltaHoldEveryRow) {
  DecayingChain c(SaveForm::kBinary, /*disk=*/true);
  Fixture& f = c.f;
  c.push(600, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  f.table->disk_tier_for_tests()->fail_writes_after(2);
  EXPECT_FALSE(f.table->shrink().ok());
  f.table->disk_tier_for_tests()->fail_writes_after(-1);
  const std::set<uint64_t> pushed = c.push(50, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
  const SaveCounts d = counts_of(f.dir.sub("delta"));
  EXPECT_EQ(d.mode, "delta");
  EXPECT_EQ(d.rows, f.table->size().value());
  auto loaded = f.fresh_loaded({"base", "delta"});
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
  // The delta after it holds only what changed again.
  ASSERT_TRUE(f.table->shrink().ok());
  ASSERT_TRUE(f.table->save(f.dir.sub("delta2"), SaveKind::kDelta).ok());
  EXPECT_EQ(counts_of(f.dir.sub("delta2")).rows, 0u);
  ASSERT_TRUE(loaded->load(f.dir.sub("delta2")).ok());
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
}

// A shrink that throws part way (bad_alloc in a shard's aging: its progress hook throws here,
// after the first shard aged) is a failed shrink too: the next delta holds every row.
TEST(SaveLoadShrinks, AShrinkThatThrewPartWayMakesTheNextDeltaHoldEveryRow) {
  DecayingChain c(SaveForm::kBinary, /*disk=*/false);
  Fixture& f = c.f;
  c.push(600, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  int steps = 0;
  const auto throw_at_second_shard = [&] {
    if (++steps == 2) throw std::bad_alloc();
  };
  const auto shrunk = f.table->shrink(throw_at_second_shard);
  ASSERT_FALSE(shrunk.ok());
  EXPECT_EQ(shrunk.status().code(), Status::Code::kResourceExhausted)
      << shrunk.status().to_string();
  c.push(50, 2000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
  const SaveCounts d = counts_of(f.dir.sub("delta"));
  EXPECT_EQ(d.mode, "delta");
  EXPECT_EQ(d.rows, f.table->size().value());
  auto loaded = f.fresh_loaded({"base", "delta"});
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
}

// Forwards to the POSIX env; its `throw_at`-th step (note_progress: a shard cleared by a base
// load, or aged by a delta's replay) throws bad_alloc, after the steps before it changed the
// table.
class ThrowingStepEnv final : public io::ForwardingEnv {
 public:
  explicit ThrowingStepEnv(int throw_at)
      : io::ForwardingEnv(io::FileEnv::posix()), throw_at_(throw_at) {}
  void note_progress() override {
    if (++steps_ == throw_at_) throw std::bad_alloc();
  }

 private:
  const int throw_at_;
  std::atomic<int> steps_{0};
};

// Forwards to the POSIX env, but for a save's commit: throws bad_alloc or fails once it renamed
// the save in (the parent folder's sync, the step after), fails the rename itself, or fails an
// exchange with an earlier folder after swapping it (an exchange without RENAME_EXCHANGE is three
// renames: the last may fail with the new save in place).
enum class CommitFault { kThrowAfterRename, kFailAfterRename, kFailRename, kFailAfterExchange };
class CommitFaultEnv final : public io::ForwardingEnv {
 public:
  explicit CommitFaultEnv(CommitFault fault)
      : io::ForwardingEnv(io::FileEnv::posix()), fault_(fault) {}
  Status rename(const std::string& from, const std::string& to) override {
    if (fault_ == CommitFault::kFailRename) return Status::IOError("rename refused");
    return io::ForwardingEnv::rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    const Status swapped = io::ForwardingEnv::exchange(a, b);
    if (swapped.ok() && fault_ == CommitFault::kFailAfterExchange) {
      return Status::IOError("third rename refused");
    }
    return swapped;
  }
  Status sync_dir(const std::string& path) override {
    const bool staging = path.size() >= 4 && path.compare(path.size() - 4, 4, ".tmp") == 0;
    if (!staging && fault_ == CommitFault::kThrowAfterRename) throw std::bad_alloc();
    if (!staging && fault_ == CommitFault::kFailAfterRename) return Status::IOError("refused");
    return io::ForwardingEnv::sync_dir(path);
  }

 private:
  const CommitFault fault_;
};

// A delta whose commit threw or failed after its rename put it in place holds the shrink before
// it, and its bookkeeping was not done: the next delta holds every row, right onto it and onto
// the save before alike (no shrink replayed twice, none left out); so does an exchange with an
// earlier folder that failed after swapping the save in. A commit refused at its
// rename changed nothing: the next delta records both shrinks since the base.
TEST(SaveLoadShrinks, ACommitThatFailedAfterItsRenameMakesTheNextDeltaHoldEveryRow) {
  for (const CommitFault fault : {CommitFault::kThrowAfterRename, CommitFault::kFailAfterRename,
                                  CommitFault::kFailRename, CommitFault::kFailAfterExchange}) {
    SCOPED_TRACE("fault " + std::to_string(static_cast<int>(fault)));
    DecayingChain c(SaveForm::kBinary, /*disk=*/false);
    Fixture& f = c.f;
    c.push(600, 2000);
    ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
    c.shrink();
    c.push(50, 2000);
    CommitFaultEnv env(fault);
    const std::string delta1 = f.dir.sub("delta1");
    // An empty folder at the path: the commit exchanges the save with it.
    if (fault == CommitFault::kFailAfterExchange) std::filesystem::create_directories(delta1);
    if (fault == CommitFault::kThrowAfterRename) {
      EXPECT_THROW((void)f.table->save(delta1, SaveKind::kDelta, &env), std::bad_alloc);
    } else {
      EXPECT_FALSE(f.table->save(delta1, SaveKind::kDelta, &env).ok());
    }
    const bool in_place = fault != CommitFault::kFailRename;
    ASSERT_EQ(std::filesystem::exists(delta1 + "/" + io::kManifestName), in_place);
    c.shrink();
    c.push(30, 2000);
    ASSERT_TRUE(f.table->save(f.dir.sub("delta2"), SaveKind::kDelta).ok());
    const SaveCounts d2 = counts_of(f.dir.sub("delta2"));
    EXPECT_EQ(d2.mode, in_place ? "delta" : "delta+shrinks");
    EXPECT_EQ(d2.shrinks, in_place ? "" : "2");
    std::vector<std::vector<const char*>> chains = {{"base", "delta2"}};
    if (in_place) chains.push_back({"base", "delta1", "delta2"});
    for (const auto& chain : chains) {
      auto loaded = f.fresh_loaded(chain);
      ASSERT_TRUE(loaded);
      EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)))
          << chain.size() << " saves";
    }
  }
}

// A load that throws part way (a base's clear of the table, a delta's replay of its shrinks)
// leaves the table partly loaded: a delta on top is refused until a base loads whole.
TEST(SaveLoadShrinks, ALoadThatThrewPartWayRefusesDeltas) {
  DecayingChain c(SaveForm::kBinary, /*disk=*/false);
  Fixture& f = c.f;
  ASSERT_NO_FATAL_FAILURE(c.save_base_shrink_delta());
  ASSERT_EQ(counts_of(f.dir.sub("delta")).mode, "delta+shrinks");
  for (const char* failing : {"base", "delta"}) {
    SCOPED_TRACE(std::string("the load that throws: ") + failing);
    auto loaded = f.fresh_loaded({"base"});
    ASSERT_TRUE(loaded);
    // The base again onto a table that holds it (the clear throws after the first shard), or
    // the delta (its replay throws after the first shard aged).
    ThrowingStepEnv env(2);
    const Status failed = loaded->load(f.dir.sub(failing), &env);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.code(), Status::Code::kResourceExhausted) << failed.to_string();
    const Status refused = loaded->load(f.dir.sub("delta"));
    EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.to_string();
    EXPECT_NE(refused.message().find("holds only part of " + f.dir.sub(failing)), std::string::npos)
        << refused.to_string();
    // Nor is the part saved, as if it were a model: no save of any kind, and nothing written.
    for (const SaveKind kind : {SaveKind::kBase, SaveKind::kDelta, SaveKind::kCheckpoint}) {
      const std::string to = f.dir.sub(std::string("after_") + failing);
      const Status not_saved = loaded->save(to, kind);
      EXPECT_EQ(not_saved.code(), Status::Code::kInvalidArgument) << not_saved.to_string();
      EXPECT_NE(not_saved.message().find("holds only part of " + f.dir.sub(failing)),
                std::string::npos)
          << not_saved.to_string();
      EXPECT_FALSE(std::filesystem::exists(to + "/" + io::kManifestName));
    }
    for (const char* save : {"base", "delta"}) ASSERT_TRUE(loaded->load(f.dir.sub(save)).ok());
    EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
    ASSERT_TRUE(loaded->save(f.dir.sub(std::string("whole_") + failing), SaveKind::kBase).ok());
  }
}

// Two shrinks between the saves, decaying (0.9) rows of two width classes that the delta does
// not hold: its loader ages each row both days at once (SparseShard::replay_shrinks), in the
// arenas' order, to the bits the live table's two shrinks gave it (each rate in turn, not their
// product); rows the second shrink deleted are the delta's deletions. In memory and on disk.
TEST(SaveLoadShrinks, TwoShrinksOfRowsOfTwoWidthsReplayToTheLiveTablesBits) {
  for (const bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "with the disk tier" : "in memory");
    DecayingChain c(SaveForm::kBinary, disk);
    Fixture& f = c.f;
    f.opt = with_slot_dims(f.opt, {{100, 2}});  // slot 100 (pushed rows have slots < 26): 2 wide
    f.table = f.fresh();
    const std::set<uint64_t> first = c.push(400, 100000);  // unseen 3 at the 2nd shrink: deleted
    c.shrink();
    // Rows of slot 100 (created by the pull, not pushed: show 0) and rows pushed before the save
    // (show decays), both unseen 2 after the two shrinks: kept, aged only by the replay.
    std::vector<uint64_t> narrow(300);
    for (std::size_t i = 0; i < narrow.size(); ++i) narrow[i] = 200000 + i;
    const std::vector<int32_t> slots(narrow.size(), 100);
    std::vector<float> pulled(narrow.size() * f.table->layout().stride());
    const std::size_t stride = f.table->layout().stride();
    ASSERT_TRUE(
        f.table->pull(narrow.data(), slots.data(), narrow.size(), pulled.data(), nullptr).ok());
    for (std::size_t i = 0; i < narrow.size(); ++i) {
      c.oracle[narrow[i]].assign(&pulled[i * stride], &pulled[(i + 1) * stride]);
    }
    c.push(300, 100000);
    ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
    ASSERT_EQ(c.shrink(), 0u);
    ASSERT_GT(c.shrink(), 0u);  // the first push's rows not pushed again
    c.push(30, 100000);
    ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
    const SaveCounts d = counts_of(f.dir.sub("delta"));
    EXPECT_EQ(d.mode, "delta+shrinks");
    EXPECT_EQ(d.shrinks, "2");
    EXPECT_LE(d.rows, 30u);
    EXPECT_GT(d.deleted, 0u);
    EXPECT_LE(d.deleted, first.size());
    auto loaded = f.fresh_loaded({"base", "delta"});
    ASSERT_TRUE(loaded);
    EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
    EXPECT_TRUE(matches(c.oracle, *loaded));
    // And a day later alike.
    auto resumed = loaded->shrink();
    ASSERT_TRUE(resumed.ok());
    EXPECT_EQ(*resumed, c.shrink());
    EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
  }
}

// A checkpoint save is a base for deltas too: (base, shrink,) checkpoint, shrinks, delta+shrinks
// loads into the live table's rows and unseen days.
TEST(SaveLoadShrinks, ACheckpointThenADeltaWithShrinksEqualsTheLiveTable) {
  for (const bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "with the disk tier" : "in memory");
    DecayingChain c(SaveForm::kBinary, disk);
    Fixture& f = c.f;
    // The rows pushed first survive the 3 shrinks (unseen 3 days), aged by them.
    f.opt.delete_after_unseen_days = 4.0f;
    f.table = f.fresh();
    c.push(600, 2000);
    // An earlier save: the shrink after it is recorded, and the checkpoint (which holds it) must
    // leave it out of the next delta.
    ASSERT_TRUE(f.table->save(f.dir.sub("earlier"), SaveKind::kBase).ok());
    c.shrink();
    ASSERT_TRUE(f.table->save(f.dir.sub("checkpoint"), SaveKind::kCheckpoint).ok());
    c.shrink();
    const std::set<uint64_t> pushed = c.push(40, 2000);
    c.shrink();
    ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
    const SaveCounts d = counts_of(f.dir.sub("delta"));
    EXPECT_EQ(d.mode, "delta+shrinks");
    EXPECT_EQ(d.shrinks, "2");  // since the checkpoint
    EXPECT_LE(d.rows, pushed.size());
    auto loaded = f.fresh_loaded({"checkpoint", "delta"});
    ASSERT_TRUE(loaded);
    EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
    EXPECT_TRUE(matches(c.oracle, *loaded));
  }
}

// A delta whose load failed while applying it (the loader's disk refused a write) leaves the
// table partly loaded: a delta on top is refused, naming the save it holds part of, until a base
// load succeeds.
TEST(SaveLoadShrinks, APartlyLoadedTableRefusesDeltasUntilABaseLoads) {
  DecayingChain c(SaveForm::kBinary, /*disk=*/true);
  Fixture& f = c.f;
  ASSERT_NO_FATAL_FAILURE(c.save_base_shrink_delta());
  auto loaded = f.fresh_loaded({"base"});
  ASSERT_TRUE(loaded);
  loaded->disk_tier_for_tests()->fail_writes_after(1);
  const Status failed = loaded->load(f.dir.sub("delta"));
  loaded->disk_tier_for_tests()->fail_writes_after(-1);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("holds part of it"), std::string::npos) << failed.to_string();
  const Status refused = loaded->load(f.dir.sub("delta"));
  EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find(f.dir.sub("delta")), std::string::npos) << refused.to_string();
  for (const char* save : {"base", "delta"}) ASSERT_TRUE(loaded->load(f.dir.sub(save)).ok());
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
}

// A base load into a disk tier over its budget (64 rows in memory) writes each row it sends to
// disk once, its unseen days with it (read along from unseen-<shard>), not again for them; the
// rows and their days are the live table's.
TEST(SaveLoadShrinks, ABaseLoadWritesEachRowItSendsToDiskOnce) {
  DecayingChain c(SaveForm::kBinary, /*disk=*/true);
  Fixture& f = c.f;
  c.push(600, 100000);
  c.shrink();
  c.push(200, 100000);  // unseen 0 beside the others' 1
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  auto loaded = f.fresh_loaded({"base"});
  ASSERT_TRUE(loaded);
  const uint64_t on_disk = loaded->stats()->rows_on_disk;
  EXPECT_GT(on_disk, 600u);
  EXPECT_EQ(loaded->disk_tier_for_tests()->traffic().puts, on_disk);
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), saved_state(*f.table)));
  EXPECT_TRUE(matches(c.oracle, *loaded));
}

// Removes what a save from before unseen files lacks: the unseen-* files from the MANIFEST (the
// files stay, unlisted) and its unseen_files property.
void strip_unseen_files(const std::string& path) {
  const std::string manifest_path = path + "/" + io::kManifestName;
  std::stringstream text;
  text << std::ifstream(manifest_path).rdbuf();
  auto manifest = io::Manifest::parse(text.str(), manifest_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
  ASSERT_EQ(manifest->properties.erase("unseen_files"), 1u);
  auto& files = manifest->files;
  files.erase(std::remove_if(files.begin(), files.end(),
                             [](const auto& f) { return f.name.rfind("unseen-", 0) == 0; }),
              files.end());
  std::ofstream(manifest_path, std::ios::trunc) << manifest->encode();
}

// A base and a delta (no shrink between) from before unseen files load as before: the model
// as saved, every row unseen 0 days (a delta's rows held already keep theirs: 0 here too).
TEST(SaveLoadShrinks, SavesWithoutUnseenFilesLoadAsBefore) {
  DecayingChain c(SaveForm::kText, /*disk=*/false);
  Fixture& f = c.f;
  c.push(300, 1000);
  c.shrink();
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  c.push(40, 1000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
  EXPECT_EQ(counts_of(f.dir.sub("delta")).mode, "delta");
  for (const char* save : {"base", "delta"}) strip_unseen_files(f.dir.sub(save));
  auto loaded = f.fresh_loaded({"base", "delta"});
  ASSERT_TRUE(loaded);
  RowMap want = saved_state(*f.table);
  for (auto& [key, state] : want) state.back() = 0.0f;
  EXPECT_TRUE(testing::same_rows(saved_state(*loaded), want));
}

// A delta+shrinks MANIFEST whose shrinks and shrink_decay_rates disagree, or whose rate is no
// decay rate, is refused naming the MANIFEST, the table untouched.
TEST(SaveLoadShrinks, ABadShrinkRecordIsRefused) {
  DecayingChain c(SaveForm::kBinary, /*disk=*/false);
  Fixture& f = c.f;
  c.push(100, 1000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  c.shrink();
  c.shrink();
  ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
  const std::string manifest = f.dir.sub("delta") + "/" + io::kManifestName;
  auto loaded = f.fresh_loaded({"base"});
  ASSERT_TRUE(loaded);
  const RowMap before = saved_state(*loaded);
  for (const auto& bad :
       std::vector<std::pair<std::string, std::string>>{{"shrinks", "3"},
                                                        {"shrink_decay_rates", "0.9,x"},
                                                        {"shrink_decay_rates", "0.9,1.5"},
                                                        {"shrink_decay_rates", "0.9,"}}) {
    // Not a structured binding: C++17 lets no lambda capture one (g++ allows it, clang does not).
    const std::string& key = bad.first;
    const std::string& value = bad.second;
    const auto edit = [&](auto& properties) {
      properties["shrinks"] = "2";
      properties["shrink_decay_rates"] = "0.899999976,0.899999976";
      properties[key] = value;
    };
    gpubox::testing::edit_manifest_properties(manifest, key, edit);
    const Status st = loaded->load(f.dir.sub("delta"));
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << key << "=" << value;
    EXPECT_NE(st.message().find(manifest), std::string::npos) << st.to_string();
    EXPECT_TRUE(testing::same_rows(saved_state(*loaded), before));
  }
}

}  // namespace
}  // namespace gpubox::table
