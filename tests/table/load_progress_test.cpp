// A load's steps between its file operations (FileEnv::note_progress, which a gpubox_server's LOAD
// shows its client as progress, table/server/bulk_work.hpp): clearing the table before a base or
// checkpoint save is applied is one step a shard, so that a LOAD whose clear takes long (a big
// disk tier) still reports progress (issue 32). The oracle: the steps noted before the load
// opens its first part file, one per shard (before, none: the clear was silent).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
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

}  // namespace
}  // namespace gpubox::table::save_load_test
