// io::ProgressEnv and io::FileWorkProgress (table/io/progress_env.hpp), the one env through which
// gpubox_server's SAVE and LOAD and trainer 0's local writes of a save show that they move:
// every FileEnv method reaches the inner env once and is one operation (begun, then ended with
// its bytes) or, note_progress, one step; an append longer than a chunk is passed on chunk by
// chunk; and an operation under way counts as moving up to the stall bound, then is named once.
// The methods come from kFileEnvMethods (tests/table/recording_env.hpp), which
// forwarding_env_test checks against file_env.hpp.
#include "table/io/progress_env.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/table/recording_env.hpp"

namespace gpubox::table::io {
namespace {

using std::chrono::seconds;
using testing::call_file_env_method;
using testing::kFileEnvMethods;
using testing::RecordingEnv;

constexpr std::size_t kChunk = ProgressEnv::kChunkBytes;

// What a sink was told, in order: "begin WHAT PATH", "end BYTES", "step".
class RecordingSink final : public ProgressSink {
 public:
  std::vector<std::string> events;
  void begin_io(const char* what, const std::string& path) override {
    events.push_back(std::string("begin ") + what + " " + path);
  }
  void end_io(uint64_t bytes) override { events.push_back("end " + std::to_string(bytes)); }
  void step() override { events.push_back("step"); }
};

// Each method's events through ProgressEnv over RecordingEnv (its arguments:
// call_file_env_method; read_file's text is its record, "read_file r 7").
const std::map<std::string, std::vector<std::string>> kEvents = {
    {"new_writable_file", {"begin create w", "end 0"}},
    {"read_file", {"begin read of r", "end 13"}},
    {"open_sequential", {"begin open of s", "end 0"}},
    {"create_dir", {"begin mkdir d", "end 0"}},
    {"remove_all", {"begin remove of x", "end 0"}},
    {"rename", {"begin rename of a", "end 0"}},
    {"exchange", {"begin exchange of c", "end 0"}},
    {"sync_dir", {"begin fsync of folder f", "end 0"}},
    {"exists", {"begin stat of present", "end 0"}},
    {"list_dir", {"begin listing of l", "end 0"}},
    {"note_progress", {"step"}},
};

TEST(ProgressEnv, ReportsEachFileEnvMethodAsItBeginsAndEndsAndForwardsIt) {
  ASSERT_EQ(kEvents.size(), kFileEnvMethods.size());
  for (const std::string& method : kFileEnvMethods) {
    SCOPED_TRACE(method);
    RecordingEnv inner;
    RecordingSink sink;
    ProgressEnv env(&inner, &sink);
    call_file_env_method(env, method);
    EXPECT_EQ(sink.events, kEvents.at(method));
    EXPECT_EQ(inner.methods(), std::vector<std::string>{method});
  }
}

TEST(ProgressEnv, CountsEveryMethodTogetherAndTheBytesItRead) {
  RecordingEnv inner;
  FileWorkProgress progress;
  ProgressEnv env(&inner, &progress);
  for (const std::string& method : kFileEnvMethods) call_file_env_method(env, method);
  EXPECT_EQ(progress.ops(), kFileEnvMethods.size());                 // all 11
  EXPECT_EQ(progress.bytes(), std::string("read_file r 7").size());  // read_file's text
  EXPECT_EQ(inner.methods(), kFileEnvMethods);
}

// The files a ProgressEnv opens report their own operations: a sequential read, a sync, a close.
TEST(ProgressEnv, ReportsTheOperationsOfTheFilesItOpened) {
  RecordingEnv inner;
  RecordingSink sink;
  ProgressEnv env(&inner, &sink);
  auto writable = env.new_writable_file("w");
  ASSERT_TRUE(writable.ok());
  EXPECT_TRUE((*writable)->sync().ok());
  EXPECT_TRUE((*writable)->close().ok());
  auto sequential = env.open_sequential("s", 9);
  ASSERT_TRUE(sequential.ok());
  char byte = 0;
  EXPECT_TRUE((*sequential)->read(&byte, 1).ok());
  EXPECT_EQ(sink.events,
            (std::vector<std::string>{"begin create w", "end 0", "begin fsync of w", "end 0",
                                      "begin close of w", "end 0", "begin open of s", "end 0",
                                      "begin read of s", "end 0"}));
}

// A file that keeps the size of every append it is given; the `fail_at`-th (from 0) fails.
class AppendSizes final : public WritableFile {
 public:
  AppendSizes(std::vector<std::size_t>* sizes, int fail_at) : sizes_(sizes), fail_at_(fail_at) {}
  Status append(const void*, std::size_t size) override {
    if (static_cast<int>(sizes_->size()) == fail_at_) return Status::IOError("disk full");
    sizes_->push_back(size);
    return Status::OK();
  }
  Status sync() override { return Status::OK(); }
  Status close() override { return Status::OK(); }

 private:
  std::vector<std::size_t>* sizes_;
  int fail_at_;
};

class AppendSizesEnv final : public ForwardingEnv {
 public:
  explicit AppendSizesEnv(FileEnv* inner, int fail_at = -1)
      : ForwardingEnv(inner), fail_at_(fail_at) {}
  std::vector<std::size_t> sizes;
  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string&) override {
    return std::unique_ptr<WritableFile>(std::make_unique<AppendSizes>(&sizes, fail_at_));
  }

 private:
  int fail_at_;
};

// An append is passed on in chunks of at most kChunkBytes, each one operation with its bytes:
// 0 bytes is one empty operation, a chunk's size one, a byte more two, 2.5 chunks three.
TEST(ProgressEnv, PassesALongAppendOnInChunksEachAnOperation) {
  const std::vector<std::pair<std::size_t, std::vector<std::size_t>>> cases = {
      {0, {0}},
      {1, {1}},
      {kChunk, {kChunk}},
      {kChunk + 1, {kChunk, 1}},
      {kChunk * 5 / 2, {kChunk, kChunk, kChunk / 2}}};
  const std::vector<char> bytes(kChunk * 5 / 2, 'x');
  for (const auto& [size, chunks] : cases) {
    SCOPED_TRACE(size);
    RecordingEnv recording;
    AppendSizesEnv inner(&recording);
    FileWorkProgress progress;
    ProgressEnv env(&inner, &progress);
    auto file = env.new_writable_file("w");
    ASSERT_TRUE(file.ok());
    const uint64_t ops = progress.ops();
    EXPECT_TRUE((*file)->append(bytes.data(), size).ok());
    EXPECT_EQ(inner.sizes, chunks);
    EXPECT_EQ(progress.ops() - ops, chunks.size());
    EXPECT_EQ(progress.bytes(), size);
  }
}

// A chunk that fails ends the append with its error; the chunks before it were moved, the
// failed one ended with no bytes, none after it is tried.
TEST(ProgressEnv, AFailedChunkEndsTheAppend) {
  RecordingEnv recording;
  AppendSizesEnv inner(&recording, /*fail_at=*/1);
  RecordingSink sink;
  ProgressEnv env(&inner, &sink);
  auto file = env.new_writable_file("w");
  ASSERT_TRUE(file.ok());
  const std::vector<char> bytes(kChunk * 3, 'x');
  const Status st = (*file)->append(bytes.data(), bytes.size());
  EXPECT_EQ(st.message(), "disk full");
  EXPECT_EQ(inner.sizes, std::vector<std::size_t>{kChunk});
  EXPECT_EQ(sink.events, (std::vector<std::string>{"begin create w", "end 0", "begin append to w",
                                                   "end " + std::to_string(kChunk),
                                                   "begin append to w", "end 0"}));
}

// An operation under way counts as moving only up to the stall bound (a hung mount is no
// progress), and the hang is named once; its end is a move again.
TEST(FileWorkProgress, AnOperationUnderWayMovesUntilTheStallBoundThenIsNamedOnce) {
  FileWorkProgress progress;
  uint64_t seen = progress.ops();
  EXPECT_FALSE(progress.moved(&seen, FileWorkProgress::Clock::now(), seconds(600)));  // idle
  progress.begin_io("fsync of", "m/shard-0");
  const auto t0 = FileWorkProgress::Clock::now();
  EXPECT_TRUE(progress.moved(&seen, t0, seconds(600)));
  EXPECT_TRUE(progress.moved(&seen, t0 + seconds(500), seconds(600)));
  std::string stalled;
  EXPECT_FALSE(progress.moved(&seen, t0 + seconds(601), seconds(600), &stalled));
  EXPECT_EQ(stalled, "fsync of m/shard-0");
  stalled.clear();
  EXPECT_FALSE(progress.moved(&seen, t0 + seconds(700), seconds(600), &stalled));
  EXPECT_EQ(stalled, "");  // named once
  progress.end_io(10);     // it finished: progress again
  EXPECT_TRUE(progress.moved(&seen, t0 + seconds(700), seconds(600)));
  EXPECT_FALSE(progress.moved(&seen, t0 + seconds(700), seconds(600)));  // idle: nothing moved
  EXPECT_EQ(progress.bytes(), 10u);
}

// A step, or another operation's end, while one hangs is a move, and a later hang is named again.
TEST(FileWorkProgress, AStepWhileAnOperationHangsIsAMoveAndStartsANewStall) {
  FileWorkProgress progress;
  uint64_t seen = progress.ops();
  progress.begin_io("append to", "m/a");
  auto t0 = FileWorkProgress::Clock::now();
  std::string stalled;
  EXPECT_FALSE(progress.moved(&seen, t0 + seconds(11), seconds(10), &stalled));
  EXPECT_EQ(stalled, "append to m/a");
  progress.step();
  EXPECT_TRUE(progress.moved(&seen, t0 + seconds(11), seconds(10)));
  t0 = FileWorkProgress::Clock::now();
  EXPECT_TRUE(progress.moved(&seen, t0 + seconds(9), seconds(10)));  // still under way, recent
  stalled.clear();
  EXPECT_FALSE(progress.moved(&seen, t0 + seconds(11), seconds(10), &stalled));
  EXPECT_EQ(stalled, "append to m/a");
}

// An inner env whose sync_dir blocks until released.
class BlockingSyncEnv final : public ForwardingEnv {
 public:
  using ForwardingEnv::ForwardingEnv;
  Status sync_dir(const std::string& path) override {
    std::unique_lock<std::mutex> lock(mu_);
    blocked_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    return ForwardingEnv::sync_dir(path);
  }
  void wait_blocked() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return blocked_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool blocked_ = false;
  bool released_ = false;
};

// Through the env: an fsync that blocks is under way (a move) until the bound, then named; its
// end is counted.
TEST(ProgressEnv, AnFsyncThatBlocksMovesUntilTheStallBound) {
  RecordingEnv recording;
  BlockingSyncEnv inner(&recording);
  FileWorkProgress progress;
  ProgressEnv env(&inner, &progress);
  uint64_t seen = progress.ops();
  std::thread fsync([&] { (void)env.sync_dir("save/dense"); });
  inner.wait_blocked();
  const auto now = FileWorkProgress::Clock::now();
  EXPECT_TRUE(progress.moved(&seen, now, seconds(10)));
  std::string stalled;
  EXPECT_FALSE(progress.moved(&seen, now + seconds(11), seconds(10), &stalled));
  EXPECT_EQ(stalled, "fsync of folder save/dense");
  EXPECT_EQ(progress.ops(), 0u);
  inner.release();
  fsync.join();
  EXPECT_EQ(progress.ops(), 1u);
  EXPECT_TRUE(progress.moved(&seen, now + seconds(11), seconds(10)));
}

}  // namespace
}  // namespace gpubox::table::io
