// A save's part files read in chunks (a load holds one chunk per thread, not its files) parse as
// the whole files do; the row codec's text and binary records round-trip exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "table/io/forwarding_env.hpp"
#include "table/io/save_dir.hpp"
#include "tests/table/save_load_fixture.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using save_load_test::Fixture;
using testing::ScratchDir;

// A part file streamed in chunks (a load holds one chunk per thread, not its files) parses to
// the same records as the whole file, at every chunk size from a few records up, in both forms
// and both record kinds (and a base's unseen days); the size is checked before reading, the
// checksum at the end, and a record longer than a chunk is refused.
TEST(SaveLoad, PartFilesStreamedInChunksParseAsWholeFiles) {
  for (SaveForm form : {SaveForm::kBinary, SaveForm::kText}) {
    for (SaveKind save : {SaveKind::kCheckpoint, SaveKind::kBase}) {
      Fixture f(form, 2);
      std::mt19937_64 rng(5);
      f.mutate(rng, 3000, 100000);
      const std::string dir = f.dir.sub("m");
      ASSERT_TRUE(f.table->save(dir, save).ok());
      auto manifest = io::read_manifest(io::FileEnv::posix(), dir, "sparse");
      ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
      const RecordShape model_shape = record_shape(
          save == SaveKind::kCheckpoint ? RecordKind::kFullRow : RecordKind::kModel, f.opt);
      for (const io::ManifestFile& file : manifest->files) {
        // A base's unseen-<shard> files: a key and one float (its row's unseen days) a record.
        RecordShape shape = model_shape;
        if (file.name.rfind("unseen-", 0) == 0) shape.fixed = 1;
        auto whole = io::read_verified(io::FileEnv::posix(), dir, file);
        ASSERT_TRUE(whole.ok()) << whole.status().to_string();
        std::vector<uint64_t> keys;
        std::vector<float> recs;
        ASSERT_TRUE(parse_records(form, *whole, shape, file.name, &keys, &recs).ok());
        ASSERT_EQ(keys.size(), file.records);
        for (std::size_t chunk : {std::size_t{700}, std::size_t{4099}, std::size_t{1} << 20}) {
          std::vector<uint64_t> streamed_keys;
          std::vector<float> streamed_recs;
          RecordChunk at;
          std::size_t calls = 0;
          const Status st = io::read_verified_chunks(
              io::FileEnv::posix(), dir, file, chunk,
              [&](const char* data, std::size_t n, bool last) -> StatusOr<std::size_t> {
                ++calls;
                EXPECT_LE(n, 2 * chunk) << "a reader holds a chunk and a record left over";
                at.last = last;
                auto took = parse_record_chunk(form, data, n, shape, file.name, at, &streamed_keys,
                                               &streamed_recs);
                if (!took.ok()) return took.status();
                at.byte += took->bytes;
                at.line += took->lines;
                return took->bytes;
              });
          ASSERT_TRUE(st.ok()) << st.to_string() << " chunk " << chunk;
          EXPECT_GE(calls, file.bytes / chunk) << file.name;
          EXPECT_EQ(streamed_keys, keys) << file.name << " chunk " << chunk;
          EXPECT_TRUE(testing::same_bits(streamed_recs, recs)) << file.name << " chunk " << chunk;
        }
      }
    }
  }
  // A text record longer than the chunk is refused (not buffered without end); a file that
  // grew past its entry is refused unread; a damaged byte is the checksum's error even where
  // the parser refused it first.
  ScratchDir dir;
  const std::string line = "7" + std::string(3000, ' ') + "1\n";
  std::ofstream(dir.sub("long")) << line;
  const io::ManifestFile entry{"long", 1, line.size(), io::checksum(line.data(), line.size())};
  const auto take_lines = [](const char* data, std::size_t n, bool) -> StatusOr<std::size_t> {
    const void* eol = std::memchr(data, '\n', n);
    return eol == nullptr ? 0 : static_cast<const char*>(eol) - data + 1;
  };
  Status st = io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 512, take_lines);
  EXPECT_NE(st.message().find("a record longer than 512 bytes"), std::string::npos)
      << st.to_string();
  EXPECT_TRUE(
      io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 4096, take_lines).ok());
  std::ofstream(dir.sub("long"), std::ios::app) << "8 1\n";
  st = io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 4096, take_lines);
  EXPECT_NE(st.message().find("more than the " + std::to_string(line.size()) + " expected"),
            std::string::npos)
      << st.to_string();
  std::ofstream(dir.sub("long")) << "x" << line.substr(1);
  const auto refuse = [](const char*, std::size_t, bool) -> StatusOr<std::size_t> {
    return Status::Corruption("bad key");
  };
  st = io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 4096, refuse);
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.to_string();
}

// The POSIX env, keeping the largest read a sequential file was asked for.
class ReadSizeEnv final : public io::ForwardingEnv {
 public:
  ReadSizeEnv() : io::ForwardingEnv(io::FileEnv::posix()) {}
  StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                uint64_t max_bytes) override {
    auto inner = io::ForwardingEnv::open_sequential(path, max_bytes);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<io::SequentialFile>(new Sized(std::move(inner).value(), &largest_));
  }
  std::size_t largest() const { return largest_; }

 private:
  class Sized final : public io::SequentialFile {
   public:
    Sized(std::unique_ptr<io::SequentialFile> inner, std::size_t* largest)
        : inner_(std::move(inner)), largest_(largest) {}
    StatusOr<std::size_t> read(void* buf, std::size_t n) override {
      *largest_ = std::max(*largest_, n);
      return inner_->read(buf, n);
    }
    uint64_t size() const override { return inner_->size(); }

   private:
    std::unique_ptr<io::SequentialFile> inner_;
    std::size_t* largest_;
  };
  std::size_t largest_ = 0;
};

// A file smaller than a chunk (a delta's few records) is read, and its buffer filled, to its
// size and the one byte more that finds its end, not to the chunk: a load reads a file per shard
// and kind, twice, and a chunk is megabytes. A larger file is read a chunk at a time.
TEST(SaveLoad, AFileSmallerThanAChunkIsReadToItsSize) {
  ScratchDir dir;
  for (const std::size_t bytes : {std::size_t{0}, std::size_t{100}, std::size_t{10000}}) {
    const std::string text(bytes, 'x');
    std::ofstream(dir.sub("f"), std::ios::trunc) << text;
    const io::ManifestFile entry{"f", 1, bytes, io::checksum(text.data(), text.size())};
    ReadSizeEnv env;
    std::string got;
    const Status st = io::read_verified_chunks(&env, dir.path(), entry, 4096,
                                               [&](const char* data, std::size_t n, bool) {
                                                 got.append(data, n);
                                                 return StatusOr<std::size_t>(n);
                                               });
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(got, text);
    EXPECT_EQ(env.largest(), std::min<std::size_t>(bytes + 1, 4096)) << bytes << " bytes";
  }
}

// The POSIX env, counting the steps a save reports between its file operations.
class StepCountingEnv final : public io::ForwardingEnv {
 public:
  StepCountingEnv() : io::ForwardingEnv(io::FileEnv::posix()) {}
  void note_progress() override { steps_.fetch_add(1); }
  int64_t steps() const { return steps_.load(); }

 private:
  std::atomic<int64_t> steps_{0};
};

// A shard's save goes through its rows between two file operations (all of them when it is
// encoded, and those on disk read back first): it reports a step every kSnapshotProgressRows rows
// (gpubox_server's PROGRESS frames count them), from memory and from the disk tier alike.
TEST(SaveLoad, ASaveReportsStepsBetweenItsFileOperations) {
  for (bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "rows on disk" : "rows in memory");
    Fixture f(SaveForm::kBinary, 1, disk);
    const std::size_t n = 2 * SparseShard::kSnapshotProgressRows + 100;
    std::vector<uint64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = i + 1;
    std::vector<float> rows(n * f.table->layout().stride());
    ASSERT_TRUE(f.table->pull(keys.data(), nullptr, n, rows.data(), nullptr).ok());
    StepCountingEnv env;
    ASSERT_TRUE(f.table->save(f.dir.sub("m"), SaveKind::kBase, &env).ok());
    EXPECT_GE(env.steps(), 2);  // on disk: memory rows may have disk copies, looked at twice
  }
}

// A save replaces a save of its kind and nothing else, and removes a staging folder it knows:
// a folder whose MANIFEST is another program's (a source checkout's), or holding files beside a
// save (a README beside an export), or a `<path>.tmp` of the user's was deleted whole, exit 0.
TEST(StagedSave, ReplacesOnlyASaveAndRemovesOnlyItsOwnStaging) {
  ScratchDir dir;
  io::FileEnv* env = io::FileEnv::posix();
  const auto save = [&](const std::string& path) -> Status {
    auto staged = io::StagedSave::begin(env, path, "dense");
    if (!staged.ok()) return staged.status();
    GPUBOX_RETURN_IF_ERROR((*staged)->add_file("a", "1", 1));
    return (*staged)->commit("dense", {});
  };
  const auto write = [](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
  };
  const std::string x = dir.sub("x");
  ASSERT_TRUE(save(x).ok());
  ASSERT_TRUE(save(x).ok()) << "a save replaces its own kind";
  EXPECT_FALSE(std::filesystem::exists(x + "/.gpubox-staging"));
  EXPECT_FALSE(std::filesystem::exists(x + ".tmp"));
  write(x + "/README", "mine");
  Status refused = save(x);
  EXPECT_NE(refused.message().find("save path " + x +
                                   " holds a dense save and files that are "
                                   "not of it: README; refusing to replace it"),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(std::filesystem::exists(x + "/README"));

  const std::string checkout = dir.sub("checkout");
  write(checkout + "/MANIFEST", "lib/Foo.pm\n");
  write(checkout + "/important.txt", "keep");
  refused = save(checkout);
  EXPECT_NE(refused.message().find("holds a MANIFEST that is not a gpubox save's"),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(std::filesystem::exists(checkout + "/important.txt"));

  const std::string y = dir.sub("y");
  write(y + ".tmp/keep.txt", "keep");
  refused = save(y);
  EXPECT_NE(refused.message().find(y + ".tmp (where a save of " + y +
                                   " is written before it is swapped in) exists and is not a "
                                   "gpubox staging folder (keep.txt)"),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(std::filesystem::exists(y + ".tmp/keep.txt"));
  EXPECT_FALSE(std::filesystem::exists(y));
  // A save cut short (its staging mark) or a whole save left under the staging name (a crash
  // after the swap): removed, as before.
  std::filesystem::remove_all(y + ".tmp");
  write(y + ".tmp/.gpubox-staging", "");
  write(y + ".tmp/a", "partial");
  EXPECT_TRUE(save(y).ok());
  std::filesystem::copy(x, y + ".tmp");
  std::filesystem::remove(y + ".tmp/README");
  EXPECT_TRUE(save(y).ok());
  EXPECT_FALSE(std::filesystem::exists(y + ".tmp"));
}

TEST(RowCodec, TextAndBinaryRecordsRoundTripExactly) {
  const std::vector<float> values = {-0.0f,
                                     0.0f,
                                     1.0f / 3.0f,
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::min(),
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::lowest(),
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     123456.789f};
  std::mt19937_64 rng(2);
  std::vector<float> random(1000);
  for (auto& v : random) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&v, &bits, sizeof(v));
    if (std::isnan(v)) v = 1.5f;  // text keeps NaN, not its payload
  }
  for (const std::vector<float>* set :
       std::initializer_list<const std::vector<float>*>{&values, &random}) {
    for (SaveForm form : {SaveForm::kText, SaveForm::kBinary}) {
      std::string data;
      const int32_t floats = static_cast<int32_t>(set->size());
      append_record(form, 0, set->data(), floats, &data);
      append_record(form, ~uint64_t{0}, set->data(), floats, &data);
      std::vector<uint64_t> keys;
      std::vector<float> recs;
      ASSERT_TRUE(parse_records(form, data, floats, "x", &keys, &recs).ok());
      EXPECT_EQ(keys, (std::vector<uint64_t>{0, ~uint64_t{0}}));
      std::vector<float> twice = *set;
      twice.insert(twice.end(), set->begin(), set->end());
      EXPECT_TRUE(testing::same_bits(recs, twice)) << name_of(kSaveFormNames, form);
    }
  }
}

}  // namespace
}  // namespace gpubox::table
