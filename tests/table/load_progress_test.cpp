// A load's steps between its file operations (FileEnv::note_progress, which a gpubox_server's LOAD
// shows its client as progress, table/server/bulk_work.hpp): clearing the table before a base or
// checkpoint save is applied is one step a shard, so that a LOAD whose clear takes long (a big
// disk tier) still reports progress (issue 32). The oracle: the steps noted before the load
// opens its first part file, one per shard (before, none: the clear was silent). Likewise a delta's
// replay of the shrinks it records (its rows aged, on disk too) is a step a shard: the steps
// noted between the last deletion file read and the first part file applied, in parallel on a
// table of many rows however small the delta.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "table/io/file_env.hpp"
#include "table/io/forwarding_env.hpp"
#include "tests/table/save_load_fixture.hpp"

namespace gpubox::table::save_load_test {
namespace {

// Forwards to the POSIX env, counting the steps noted before the first part file was opened.
class StepCountingEnv final : public io::ForwardingEnv {
 public:
  StepCountingEnv() : io::ForwardingEnv(io::FileEnv::posix()) {}
  int steps_before_first_part() const { return steps_before_first_part_.load(); }
  StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                uint64_t max_bytes) override {
    opened_part_ = true;
    return ForwardingEnv::open_sequential(path, max_bytes);
  }
  void note_progress() override {
    if (!opened_part_.load()) ++steps_before_first_part_;  // the clear may run a thread a shard
  }

 private:
  std::atomic<bool> opened_part_{false};
  std::atomic<int> steps_before_first_part_{0};
};

TEST(LoadProgress, EachShardClearedBeforeABaseSaveIsAppliedIsAStep) {
  for (const bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "with the disk tier" : "in memory");
    Fixture f(SaveForm::kBinary, 4, disk);
    std::mt19937_64 rng(7);
    f.mutate(rng, 2000, 5000);
    const std::string base = f.dir.sub(disk ? "base_disk" : "base");
    ASSERT_TRUE(f.table->save(base, SaveKind::kBase).ok());
    // An empty table: no check pass opens the parts before the clear.
    std::unique_ptr<SparseTable> target = f.fresh();
    StepCountingEnv env;
    ASSERT_TRUE(target->load(base, &env).ok());
    EXPECT_EQ(env.steps_before_first_part(), 4);
  }
}

// Forwards to the POSIX env, counting the steps noted while the last file opened was a deletion
// file of the second (applying) pass: a delta's load opens every file once to verify it, then
// its deletion files, replays its shrinks, then opens its part files. Single-threaded (a small
// save: no file read in parallel).
class ReplayStepEnv final : public io::ForwardingEnv {
 public:
  explicit ReplayStepEnv(int shards) : io::ForwardingEnv(io::FileEnv::posix()), shards_(shards) {}
  int steps_after_deletions() const { return steps_after_deletions_; }
  StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                uint64_t max_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    const bool deletions = path.find("/delete-") != std::string::npos;
    deletions_opened_ += deletions;
    after_deletions_ = deletions && deletions_opened_ > shards_;
    return ForwardingEnv::open_sequential(path, max_bytes);
  }
  void note_progress() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (after_deletions_ && deletions_opened_ == 2 * shards_) ++steps_after_deletions_;
  }

 private:
  const int shards_;
  std::mutex mu_;
  int deletions_opened_ = 0;
  bool after_deletions_ = false;
  int steps_after_deletions_ = 0;
};

TEST(LoadProgress, EachShardsReplayOfADeltasShrinksIsAStep) {
  for (const bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "with the disk tier" : "in memory");
    Fixture f(SaveForm::kBinary, 4, disk);
    std::mt19937_64 rng(9);
    f.mutate(rng, 500, 2000);
    const std::string base = f.dir.sub(disk ? "base_disk" : "base");
    ASSERT_TRUE(f.table->save(base, SaveKind::kBase).ok());
    const std::string plain = f.dir.sub(disk ? "plain_disk" : "plain");
    ASSERT_TRUE(f.table->save(plain, SaveKind::kDelta).ok());  // no shrink: nothing to replay
    ASSERT_TRUE(f.table->shrink().ok());
    const std::string aged = f.dir.sub(disk ? "aged_disk" : "aged");
    ASSERT_TRUE(f.table->save(aged, SaveKind::kDelta).ok());
    std::unique_ptr<SparseTable> target = f.fresh();
    ASSERT_TRUE(target->load(base).ok());
    ReplayStepEnv plain_env(4);
    ASSERT_TRUE(target->load(plain, &plain_env).ok());
    EXPECT_EQ(plain_env.steps_after_deletions(), 0);
    ReplayStepEnv aged_env(4);
    ASSERT_TRUE(target->load(aged, &aged_env).ok());
    // A step a shard, and (disk) one more a shard for its batch of disk rows written back.
    EXPECT_EQ(aged_env.steps_after_deletions(), disk ? 8 : 4);
  }
}

// Forwards to the POSIX env, counting the steps noted inside a parallel region (of more than one
// thread) and outside one.
class ParallelStepEnv final : public io::ForwardingEnv {
 public:
  ParallelStepEnv() : io::ForwardingEnv(io::FileEnv::posix()) {}
  std::atomic<int> in_parallel{0}, inline_steps{0};
  void note_progress() override { ++(omp_in_parallel() ? in_parallel : inline_steps); }
};

// The replay walks every row the table holds: a big table's replay runs its shards in parallel
// however few records the delta holds (none here, but its deletions).
TEST(LoadProgress, AReplayOnABigTableRunsInParallelHoweverSmallTheDelta) {
  Fixture f(SaveForm::kBinary, 4);
  std::mt19937_64 rng(11);
  f.mutate(rng, 12000, 1u << 30);
  const std::string base = f.dir.sub("base");
  ASSERT_TRUE(f.table->save(base, SaveKind::kBase).ok());
  ASSERT_TRUE(f.table->shrink().ok());
  const std::string aged = f.dir.sub("aged");
  ASSERT_TRUE(f.table->save(aged, SaveKind::kDelta).ok());
  std::unique_ptr<SparseTable> target = f.fresh();
  ASSERT_TRUE(target->load(base).ok());
  ASSERT_GE(target->size().value(), 8192u);
  ParallelStepEnv env;
  ASSERT_TRUE(target->load(aged, &env).ok());
  EXPECT_EQ(env.in_parallel.load(), 4);  // a step a shard
  EXPECT_EQ(env.inline_steps.load(), 0);
}

}  // namespace
}  // namespace gpubox::table::save_load_test
