// Writers and `convert`: every conversion round-trips to the same instances.
#include "dataset/format_writer.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>

#include "dataset/in_memory_dataset.hpp"
#include "dataset/line_parser.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::PlainInstance;
using testing::ScratchDir;
using testing::slot_config;
using testing::to_plain;

// The temporary files a convert to `out` left beside it ("<out>.tmp..."): none, when it ended.
int temps_beside(const std::string& out) {
  const std::filesystem::path target(out);
  const std::string prefix = target.filename().string() + ".tmp";
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(target.parent_path())) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) ++found;
  }
  return found;
}

std::vector<PlainInstance> load(const DatasetConfig& config, const std::string& path) {
  InMemoryDataset ds(config);
  ds.set_filelist({path});
  const Status st = ds.load_into_memory();
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(ds.load_stats().skipped_lines(), 0u) << path;
  std::vector<PlainInstance> out;
  for (std::size_t i = 0; i < ds.size(); ++i) out.push_back(to_plain(ds.instance(i)));
  return out;
}

// Random instances with awkward floats (shortest round trip matters) and empty slots.
InstanceBlock random_block(int slots, int dense, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  InstanceBlock block(slots, dense);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<float> d(dense);
    for (float& v : d) v = std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng) / 3.0f;
    std::vector<std::uint64_t> keys;
    std::vector<std::uint32_t> sizes(slots);
    for (int s = 0; s < slots; ++s) {
      sizes[s] = static_cast<std::uint32_t>(rng() % 3);
      for (std::uint32_t k = 0; k < sizes[s]; ++k) keys.push_back(1 + (rng() >> 1));
    }
    block.append(static_cast<float>(rng() % 2), d.data(), keys.data(), keys.size(), sizes.data());
  }
  return block;
}

TEST(FormatWriter, SlotLineLooksLikePaddleRecs) {
  DatasetConfig c = slot_config(2, 1);
  InstanceBlock block(2, 1);
  const float dense = 0.5f;
  const std::uint64_t keys[] = {7, 8, 9};
  const std::uint32_t sizes[] = {1, 2};
  block.append(1.0f, &dense, keys, 3, sizes);
  std::string out;
  append_line(c, DataFormat::kSlot, block.instance(0), &out);
  EXPECT_EQ(out, "click:1 dense_feature:0.5 1:7 2:8 2:9\n");
  out.clear();
  append_line(c, DataFormat::kMultiSlot, block.instance(0), &out);
  // PaddleRec's readers' order: label, sparse slots, dense.
  EXPECT_EQ(out, "1 1 1 7 2 8 9 1 0.5\n");
  c.multislot_order = {"click", "dense_feature", "1", "show", "2"};
  out.clear();
  append_line(c, DataFormat::kMultiSlot, block.instance(0), &out);
  EXPECT_EQ(out, "1 1 1 0.5 1 7 1 0 2 8 9\n");  // a skipped field: one padding key, 0
  c.multislot_order.clear();
  c.feasign_first = true;
  out.clear();
  append_line(c, DataFormat::kSlot, block.instance(0), &out);
  EXPECT_EQ(out, "1:click 0.5:dense_feature 7:1 8:2 9:2\n");
}

TEST(FormatWriter, WrittenLinesParseBackExactly) {
  for (DataFormat format : {DataFormat::kSlot, DataFormat::kMultiSlot}) {
    for (bool feasign_first : {false, true}) {
      DatasetConfig c = slot_config(5, 3);
      c.data_format = format;
      c.feasign_first = feasign_first;
      const InstanceBlock block = random_block(5, 3, 300, 11);
      LineParser parser(c);
      InstanceBlock back(5, 3);
      std::string line;
      for (std::size_t i = 0; i < block.size(); ++i) {
        line.clear();
        append_line(c, format, block.instance(i), &line);
        line.pop_back();
        const ParseResult r = parser.parse(line, &back);
        ASSERT_TRUE(r.ok()) << describe(r) << " in " << line;
        EXPECT_EQ(to_plain(back.instance(i)), to_plain(block.instance(i))) << line;
      }
    }
  }
}

TEST(Convert, SlotToMultiSlotToSlotRoundTrip) {
  ScratchDir dir;
  DatasetConfig slot = slot_config(4, 2);
  const InstanceBlock block = random_block(4, 2, 500, 12);
  std::string text;
  for (std::size_t i = 0; i < block.size(); ++i)
    append_line(slot, DataFormat::kSlot, block.instance(i), &text);
  const std::string a = dir.write("a.slot", text);
  ConvertSummary summary;
  ASSERT_TRUE(convert_file(slot, DataFormat::kMultiSlot, a, dir.file("b.multi"), &summary).ok());
  EXPECT_EQ(summary.written, 500u);
  DatasetConfig multi = slot;
  multi.data_format = DataFormat::kMultiSlot;
  ASSERT_TRUE(
      convert_file(multi, DataFormat::kSlot, dir.file("b.multi"), dir.file("c.slot"), &summary)
          .ok());
  const std::vector<PlainInstance> original = load(slot, a);
  ASSERT_EQ(original.size(), 500u);
  EXPECT_EQ(load(multi, dir.file("b.multi")), original);
  EXPECT_EQ(load(slot, dir.file("c.slot")), original);
}

// gpubox_data convert --from feat_idx (PaddleRec's LR/FM samples) and --from auto.
TEST(Convert, FeatIdxAndAutoInputsConvertToSlotText) {
  ScratchDir dir;
  DatasetConfig c = slot_config(2, 1);
  c.data_format = DataFormat::kFeatIdx;
  const std::string in = dir.write(
      "lr.txt",
      "feat_idx:1 feat_idx:17 feat_idx:0 feat_value:0.25 feat_value:1 feat_value:0 label:1\n"
      "feat_idx:1 feat_idx:18 feat_idx:40 feat_value:0.5 feat_value:1 feat_value:1 label:0\n");
  ConvertSummary summary;
  ASSERT_TRUE(convert_file(c, DataFormat::kSlot, in, dir.file("lr.slot"), &summary).ok());
  EXPECT_EQ(summary.written, 2u);
  std::ifstream out(dir.file("lr.slot"));
  std::stringstream text;
  text << out.rdbuf();
  EXPECT_EQ(text.str(), "click:1 dense_feature:0.25 1:17\nclick:0 dense_feature:0.5 1:18 2:40\n");
  c.data_format = DataFormat::kAuto;
  ASSERT_TRUE(convert_file(c, DataFormat::kMultiSlot, in, dir.file("lr.multi"), &summary).ok());
  EXPECT_EQ(summary.written, 2u);
  ASSERT_EQ(summary.stats.formats.size(), 1u);
  EXPECT_EQ(summary.stats.formats[0].format, "feat_idx text (PaddleRec's LR/FM samples)");
}

TEST(Convert, CriteoToSlotKeepsEveryInstanceAndSkipsBadLines) {
  ScratchDir dir;
  std::mt19937_64 rng(13);
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text += std::to_string(rng() % 2);
    for (int j = 0; j < 13; ++j) text += "\t" + (rng() % 5 ? std::to_string(rng() % 500) : "");
    for (int j = 0; j < 26; ++j) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%08x", static_cast<unsigned>(rng() % 300));
      text += "\t" + (rng() % 7 ? std::string(hex) : "");
    }
    text += i % 50 == 0 ? "\r\n" : "\n";
  }
  text += "1\t2\t3\n";  // too few fields
  const std::string in = dir.write("day_0", text);
  DatasetConfig criteo = slot_config(26, 13);
  criteo.data_format = DataFormat::kCriteo;
  ConvertSummary summary;
  ASSERT_TRUE(convert_file(criteo, DataFormat::kSlot, in, dir.file("day_0.slot"), &summary).ok());
  EXPECT_EQ(summary.written, 200u);
  EXPECT_EQ(summary.stats.skipped_by_reason[static_cast<std::size_t>(ParseReason::kFieldCount)],
            1u);
  ASSERT_EQ(summary.stats.errors.size(), 1u);
  EXPECT_EQ(summary.stats.errors[0].line, 201u);
  // Loading the Criteo file directly and the converted slot file give the same instances.
  DatasetConfig criteo_lenient = criteo;
  InMemoryDataset direct(criteo_lenient);
  direct.set_filelist({in});
  ASSERT_TRUE(direct.load_into_memory().ok());
  std::vector<PlainInstance> want;
  for (std::size_t i = 0; i < direct.size(); ++i) want.push_back(to_plain(direct.instance(i)));
  EXPECT_EQ(load(slot_config(26, 13), dir.file("day_0.slot")), want);
  // Criteo -> MultiSlot too.
  ASSERT_TRUE(
      convert_file(criteo, DataFormat::kMultiSlot, in, dir.file("day_0.multi"), &summary).ok());
  DatasetConfig multi = slot_config(26, 13);
  multi.data_format = DataFormat::kMultiSlot;
  EXPECT_EQ(load(multi, dir.file("day_0.multi")), want);
}

// An empty slot is written to MultiSlot as Paddle's readers take it, one padding key 0 (a count
// of 0 is refused there: "the number of ids can not be zero"), and reads back as empty.
TEST(Convert, AnEmptySlotIsWrittenAsOnePaddingKey) {
  ScratchDir dir;
  const DatasetConfig slot = slot_config(3, 0);
  const std::string in = dir.write("a.slot", "click:1 2:5 2:6\nclick:0 1:7\n");
  ConvertSummary summary;
  ASSERT_TRUE(convert_file(slot, DataFormat::kMultiSlot, in, dir.file("a.multi"), &summary).ok());
  std::ifstream out(dir.file("a.multi"));
  std::stringstream text;
  text << out.rdbuf();
  EXPECT_EQ(text.str(), "1 1 1 0 2 5 6 1 0\n1 0 1 7 1 0 1 0\n");
  DatasetConfig multi = slot;
  multi.data_format = DataFormat::kMultiSlot;
  EXPECT_EQ(load(multi, dir.file("a.multi")), load(slot, in));
}

TEST(Convert, ErrorsNameTheFileAndLeaveNoPartialOutput) {
  ScratchDir dir;
  const DatasetConfig slot = slot_config(1, 0);
  ConvertSummary summary;
  Status st =
      convert_file(slot, DataFormat::kMultiSlot, dir.file("none"), dir.file("out"), &summary);
  EXPECT_NE(st.message().find(dir.file("none")), std::string::npos);
  DatasetConfig strict = slot;
  strict.strict_parse = true;
  const std::string in = dir.write("bad", "click:1 1:5\nclick:1 1:x\n");
  st = convert_file(strict, DataFormat::kMultiSlot, in, dir.file("out"), &summary);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find(in + ":2: bad_key"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
  EXPECT_EQ(temps_beside(dir.file("out")), 0);
  EXPECT_FALSE(convert_file(slot, DataFormat::kCriteo, in, dir.file("out"), &summary).ok());
}

// Every line malformed: an error naming the input and the counts, and no (empty) output that
// would pass for a conversion; one good line is enough. An empty input converts to empty.
TEST(Convert, InputWithNoValidInstanceIsAnErrorAndWritesNothing) {
  ScratchDir dir;
  const DatasetConfig slot = slot_config(1, 0);
  ConvertSummary summary;
  const std::string bad = dir.write("bad", "garbage\nclick:1 1:x\nmore garbage\n");
  Status st = convert_file(slot, DataFormat::kMultiSlot, bad, dir.file("out"), &summary);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find(bad + ": no valid instance (3 lines, 3 malformed"), std::string::npos)
      << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
  EXPECT_EQ(temps_beside(dir.file("out")), 0);
  // An empty input (Spark's empty part files) converts to an empty output, which a caller's loop
  // over the parts needs.
  const std::string empty = dir.write("empty", "");
  st = convert_file(slot, DataFormat::kMultiSlot, empty, dir.file("out"), &summary);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(summary.written, 0u);
  EXPECT_EQ(summary.stats.lines, 0u);
  ASSERT_TRUE(std::filesystem::exists(dir.file("out")));
  EXPECT_EQ(std::filesystem::file_size(dir.file("out")), 0u);
  EXPECT_EQ(temps_beside(dir.file("out")), 0);
  std::filesystem::remove(dir.file("out"));
  // A pipe_command that gives no line from an input that is not empty is not an empty part file.
  DatasetConfig filtered = slot;
  filtered.pipe_command = "sed -n /nothing-matches/p";
  const std::string lines = dir.write("lines", "click:1 1:5\n");
  st = convert_file(filtered, DataFormat::kMultiSlot, lines, dir.file("out"), &summary);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find(lines + " (12 bytes): no line came from it through its pipe_command "
                                      "'sed -n /nothing-matches/p'"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
  // ... but a gzip of nothing through its decompressor is one (Spark's compressed empty parts).
  DatasetConfig gzipped = slot;
  gzipped.pipe_command = "gzip -dc";
  const std::string empty_gz =
      dir.write("empty.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x03\x00"
                                        "\x00\x00\x00\x00\x00\x00\x00\x00",
                                        20));
  st = convert_file(gzipped, DataFormat::kMultiSlot, empty_gz, dir.file("out"), &summary);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(summary.stats.lines, 0u);
  EXPECT_EQ(std::filesystem::file_size(dir.file("out")), 0u);
  std::filesystem::remove(dir.file("out"));
  // A gzip of a line the filter drops is still refused.
  gzipped.pipe_command = "gzip -dc | sed -n /nothing-matches/p";
  ASSERT_EQ(std::system(("printf 'click:1 1:5\\n' | gzip -c > " + dir.file("line.gz")).c_str()), 0);
  st =
      convert_file(gzipped, DataFormat::kMultiSlot, dir.file("line.gz"), dir.file("out"), &summary);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
  const std::string one = dir.write("one", "garbage\nclick:1 1:5\n");
  EXPECT_TRUE(convert_file(slot, DataFormat::kMultiSlot, one, dir.file("out"), &summary).ok());
  EXPECT_EQ(summary.written, 1u);
}

// Two converts to one OUT at once: each writes a file of its own and renames it over OUT, so OUT
// is one of the two whole (a fixed OUT.tmp was truncated and renamed by either while the other
// wrote into it: a mix of both, or the other's rename failing).
TEST(Convert, TwoConvertsToOneOutLeaveOneWholeOutput) {
  ScratchDir dir;
  const DatasetConfig slot = slot_config(1, 0);
  std::string a_text, b_text;
  for (int i = 0; i < 20000; ++i) {
    a_text += "click:1 1:" + std::to_string(i) + "\n";
    b_text += "click:0 1:" + std::to_string(1000000 + i) + "\n";
  }
  const std::string a = dir.write("a", a_text), b = dir.write("b", b_text);
  ConvertSummary alone;
  ASSERT_TRUE(convert_file(slot, DataFormat::kSlot, a, dir.file("a.out"), &alone).ok());
  ASSERT_TRUE(convert_file(slot, DataFormat::kSlot, b, dir.file("b.out"), &alone).ok());
  const auto text = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string want_a = text(dir.file("a.out")), want_b = text(dir.file("b.out"));
  const std::string out = dir.file("out");
  for (int round = 0; round < 8; ++round) {
    ConvertSummary sa, sb;
    Status st_a, st_b;
    std::thread other([&] { st_b = convert_file(slot, DataFormat::kSlot, b, out, &sb); });
    st_a = convert_file(slot, DataFormat::kSlot, a, out, &sa);
    other.join();
    EXPECT_TRUE(st_a.ok()) << st_a.to_string();
    EXPECT_TRUE(st_b.ok()) << st_b.to_string();
    const std::string got = text(out);
    EXPECT_TRUE(got == want_a || got == want_b)
        << "round " << round << ": " << got.size() << " bytes, neither input's whole conversion";
    EXPECT_EQ(temps_beside(out), 0);
  }
}

// A slot outside the slot list: dropped token by token when ignore_unknown_slots says so (a
// config's choice), else the list does not fit the file and nothing is written (the lines
// holding the slot would have been left out).
TEST(Convert, SlotsOutsideTheListStopTheConversionUnlessDropped) {
  ScratchDir dir;
  DatasetConfig slot = slot_config(2, 0);
  const std::string in = dir.write("in", "click:1 1:5 2:6\nclick:0 1:7 3:8 2:9\nclick:1 2:4\n");
  ConvertSummary summary;
  ASSERT_TRUE(convert_file(slot, DataFormat::kSlot, in, dir.file("out"), &summary).ok());
  EXPECT_EQ(summary.written, 3u);
  EXPECT_EQ(summary.stats.unknown_slot_tokens, 1u);
  slot.ignore_unknown_slots = false;
  const Status st = convert_file(slot, DataFormat::kSlot, in, dir.file("out2"), &summary);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find(in + ": 1 lines hold slots outside the 2 slots converted (first: " +
                              in + ":2: unknown_slot"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("--drop_unknown_slots"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out2")));
  EXPECT_EQ(temps_beside(dir.file("out2")), 0);
}

// OUT naming IN (by another spelling too) is refused and IN left as it was: converted in place,
// the file lost its skipped lines with no copy left to correct them from.
TEST(Convert, AFileIsNotConvertedOntoItself) {
  ScratchDir dir;
  const DatasetConfig slot = slot_config(1, 0);
  ConvertSummary summary;
  const std::string in = dir.write("in", "garbage\nclick:1 1:5\n");
  for (const std::string& out : {in, dir.path() + "/./in"}) {
    const Status same = convert_file(slot, DataFormat::kSlot, in, out, &summary);
    EXPECT_EQ(same.code(), Status::Code::kInvalidArgument) << out;
    EXPECT_NE(same.message().find("convert: OUT '" + out + "' is IN '" + in + "'"),
              std::string::npos)
        << same.message();
  }
  std::ifstream kept(in);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "garbage\nclick:1 1:5\n");
}

// OUT that is not a regular file is written, never replaced: a symlink's target (the link kept),
// a FIFO (a reader gets the lines), a device (/dev/null checks a conversion); a rename made each a
// regular file (a probe turned /dev/full into one). A folder is refused, naming it.
TEST(Convert, OutThatIsALinkFifoOrDeviceIsWrittenNotReplaced) {
  ScratchDir dir;
  const DatasetConfig slot = slot_config(1, 0);
  ConvertSummary summary;
  const std::string in = dir.write("in", "click:1 1:5\nclick:0 1:7\n");
  const std::string target = dir.write("target", "old\n");
  const std::string link = dir.file("link");
  std::filesystem::create_symlink(target, link);
  ASSERT_TRUE(convert_file(slot, DataFormat::kSlot, in, link, &summary).ok());
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(load(slot, target).size(), 2u);
  EXPECT_EQ(temps_beside(target), 0);

  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string read_back;
  std::thread reader([&] {
    std::ifstream f(fifo);
    read_back.assign(std::istreambuf_iterator<char>(f), {});
  });
  const Status to_fifo = convert_file(slot, DataFormat::kSlot, in, fifo, &summary);
  reader.join();
  ASSERT_TRUE(to_fifo.ok()) << to_fifo.message();
  EXPECT_EQ(std::count(read_back.begin(), read_back.end(), '\n'), 2) << read_back;
  EXPECT_EQ(std::filesystem::status(fifo).type(), std::filesystem::file_type::fifo);
  EXPECT_EQ(temps_beside(fifo), 0);

  ASSERT_TRUE(convert_file(slot, DataFormat::kSlot, in, "/dev/null", &summary).ok());
  EXPECT_EQ(std::filesystem::status("/dev/null").type(), std::filesystem::file_type::character);
  const Status folder = convert_file(slot, DataFormat::kSlot, in, dir.path(), &summary);
  EXPECT_EQ(folder.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(folder.message().find("'" + dir.path() + "' is a folder"), std::string::npos)
      << folder.message();
}

}  // namespace
}  // namespace gpubox::dataset
