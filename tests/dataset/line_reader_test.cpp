// LineReader: line splitting, CRLF, over-long and truncated lines, byte ranges that tile a file,
// pipe_command (cat, gzip -dc, a failing command), missing files.
#include "dataset/line_reader.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <random>
#include <string>

#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::ScratchDir;

struct ReadAll {
  std::vector<std::string> lines;
  std::vector<ParseReason> issues;
  std::vector<std::uint64_t> numbers;
  Status status;
  std::uint64_t bytes = 0;
};

ReadAll read_all(StatusOr<std::unique_ptr<LineReader>> opened) {
  ReadAll out;
  if (!opened.ok()) {
    out.status = opened.status();
    return out;
  }
  LineReader& reader = **opened;
  Line line;
  while (reader.next(&line)) {
    out.lines.emplace_back(line.text);
    out.issues.push_back(line.issue);
    out.numbers.push_back(line.number);
  }
  out.status = reader.status();
  if (out.status.ok()) out.status = reader.finish();
  out.bytes = reader.bytes();
  return out;
}

ReadAll read_file(const std::string& path, const std::string& pipe = "",
                  std::size_t max = 1 << 20) {
  return read_all(LineReader::open(path, pipe, max));
}

TEST(LineReader, SplitsLinesStripsCrAndKeepsBlankLines) {
  ScratchDir dir;
  const std::string path = dir.write("a.txt", "one\r\ntwo\n\n  \nthree\n");
  const ReadAll r = read_file(path);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.lines, (std::vector<std::string>{"one", "two", "", "  ", "three"}));
  EXPECT_EQ(r.numbers, (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
  for (ParseReason issue : r.issues) EXPECT_EQ(issue, ParseReason::kOk);
  EXPECT_EQ(r.bytes, 19u);
}

// A UTF-8 byte order mark before the first line (an editor's) is not part of it (the line was
// rejected, its first token a BOM and a label); read whole, in ranges (only the range at the
// file's start has it), or through a pipe. Further lines keep such bytes.
TEST(LineReader, AByteOrderMarkBeforeTheFirstLineIsDropped) {
  ScratchDir dir;
  const std::string bom = "\xEF\xBB\xBF";
  const std::string text = bom + "click:1 1:5\r\n" + bom + "x\nlast\n";
  const std::string path = dir.write("bom.txt", text);
  const std::vector<std::string> want = {"click:1 1:5", bom + "x", "last"};
  EXPECT_EQ(read_file(path).lines, want);
  EXPECT_EQ(read_file(path, "cat").lines, want);
  EXPECT_EQ(read_file(path).bytes, text.size());  // the bytes read, the mark's too
  for (std::uint64_t step : {1ull, 2ull, 5ull, 16ull}) {
    std::vector<std::string> got;
    for (std::uint64_t begin = 0; begin < text.size(); begin += step) {
      const ReadAll part = read_all(LineReader::open_range(
          path, begin, std::min<std::uint64_t>(text.size(), begin + step), 1 << 20));
      got.insert(got.end(), part.lines.begin(), part.lines.end());
    }
    EXPECT_EQ(got, want) << "step " << step;
  }
  EXPECT_EQ(read_file(dir.write("only.txt", bom)).lines, std::vector<std::string>{""});
}

TEST(LineReader, EmptyFileHasNoLines) {
  ScratchDir dir;
  const ReadAll r = read_file(dir.write("empty.txt", ""));
  EXPECT_TRUE(r.status.ok());
  EXPECT_TRUE(r.lines.empty());
}

TEST(LineReader, LastLineWithoutNewlineIsReportedTruncated) {
  ScratchDir dir;
  ReadAll r = read_file(dir.write("t.txt", "a b\nc d"));
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.issues[1], ParseReason::kTruncatedLastLine);
  EXPECT_EQ(r.lines[1], "c d");
  // Only whitespace after the last newline is just a blank line.
  r = read_file(dir.write("u.txt", "a b\n \r"));
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.issues[1], ParseReason::kOk);
}

TEST(LineReader, OverLongLinesAreSkippedWhole) {
  ScratchDir dir;
  const std::string long_line(100, 'x');
  const ReadAll r =
      read_file(dir.write("l.txt", "short\n" + long_line + "\nafter\n" + long_line), "", 32);
  ASSERT_EQ(r.lines.size(), 4u);
  EXPECT_EQ(r.issues[0], ParseReason::kOk);
  EXPECT_EQ(r.issues[1], ParseReason::kLineTooLong);
  EXPECT_EQ(r.lines[2], "after");
  EXPECT_EQ(r.numbers[2], 3u);
  EXPECT_EQ(r.issues[3], ParseReason::kLineTooLong);
  // A line of exactly max bytes is fine.
  const ReadAll exact = read_file(dir.write("e.txt", std::string(32, 'y') + "\n"), "", 32);
  ASSERT_EQ(exact.lines.size(), 1u);
  EXPECT_EQ(exact.issues[0], ParseReason::kOk);
}

TEST(LineReader, LinesLongerThanOneReadBlock) {
  ScratchDir dir;
  // Lines of several MiB cross the 4 MiB read blocks.
  const std::string big(6 << 20, 'z');
  const ReadAll r = read_file(dir.write("big.txt", "a\n" + big + "\nb\n"), "", 8 << 20);
  ASSERT_TRUE(r.status.ok());
  ASSERT_EQ(r.lines.size(), 3u);
  EXPECT_EQ(r.lines[1].size(), big.size());
  EXPECT_EQ(r.lines[2], "b");
}

TEST(LineReader, MissingFileAndFolderAreErrorsNamingThem) {
  ScratchDir dir;
  ReadAll r = read_file(dir.file("nope.txt"));
  EXPECT_EQ(r.status.code(), Status::Code::kIOError);
  EXPECT_NE(r.status.message().find("nope.txt"), std::string::npos);
  r = read_file(dir.path());
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find(dir.path()), std::string::npos);
  r = read_file(dir.file("nope.txt"), "cat");
  EXPECT_NE(r.status.message().find("nope.txt"), std::string::npos);
}

TEST(LineReader, RangesTileTheFileExactlyOnce) {
  ScratchDir dir;
  std::mt19937_64 rng(3);
  std::string text;
  std::vector<std::string> want;
  for (int i = 0; i < 500; ++i) {
    std::string line(rng() % 40, 'a' + static_cast<char>(i % 26));
    want.push_back(line);
    text += line + "\n";
  }
  const std::string path = dir.write("r.txt", text);
  for (std::uint64_t step : {1ull, 7ull, 40ull, 41ull, 1000ull, 1ull << 20}) {
    std::vector<std::string> got;
    for (std::uint64_t begin = 0; begin < text.size(); begin += step) {
      const ReadAll part = read_all(LineReader::open_range(
          path, begin, std::min<std::uint64_t>(text.size(), begin + step), 1 << 20));
      ASSERT_TRUE(part.status.ok());
      for (std::size_t k = 0; k < part.lines.size(); ++k) {
        EXPECT_EQ(part.numbers[k], k + 1) << "numbers count from the range's first line";
      }
      got.insert(got.end(), part.lines.begin(), part.lines.end());
    }
    EXPECT_EQ(got, want) << "step " << step;
  }
}

TEST(LineReader, PipeCommandCatAndGzip) {
  ScratchDir dir;
  const std::string path = dir.write("p.txt", "x 1\ny 2\n");
  ReadAll r = read_file(path, "cat");
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.lines, (std::vector<std::string>{"x 1", "y 2"}));
  const std::string gz = dir.write("q.txt", "gz line\n");
  ASSERT_EQ(std::system(("gzip -f " + gz).c_str()), 0);
  r = read_file(gz + ".gz", "gzip -dc");
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.lines, std::vector<std::string>{"gz line"});
  // A file name with a quote and a blank survives the shell.
  const std::string odd = dir.write("it's a file.txt", "odd\n");
  r = read_file(odd, "cat");
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.lines, std::vector<std::string>{"odd"});
}

TEST(LineReader, FailingPipeCommandNamesFileAndExitStatus) {
  ScratchDir dir;
  const std::string path = dir.write("plain.txt", "not gzip\n");
  ReadAll r = read_file(path, "gzip -dc 2>/dev/null");
  EXPECT_EQ(r.status.code(), Status::Code::kIOError);
  EXPECT_NE(r.status.message().find("plain.txt"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("exit status 1"), std::string::npos) << r.status.message();
  r = read_file(path, "cat; exit 3");
  EXPECT_NE(r.status.message().find("exit status 3"), std::string::npos) << r.status.message();
  EXPECT_EQ(r.lines, std::vector<std::string>{"not gzip"});
}

// A command's standard error is read while its output is: one writing far more to stderr than a
// pipe holds (64 KiB) before and between its output lines neither blocks nor loses output, and
// its failure ends with the last of what it said.
TEST(LineReader, PipeCommandStderrIsDrainedAndItsTailKept) {
  ScratchDir dir;
  const std::string path = dir.write("in.txt", "a\nb\n");
  const std::string noisy =
      "head -c 300000 /dev/zero | tr '\\0' x >&2; cat; head -c 300000 /dev/zero | tr '\\0' y >&2;"
      " echo last words >&2; exit 4";
  const ReadAll r = read_file(path, noisy);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.status.code(), Status::Code::kIOError);
  const std::string& m = r.status.message();
  EXPECT_NE(m.find("exit status 4; its standard error ends with:\n"), std::string::npos) << m;
  EXPECT_NE(m.find("last words"), std::string::npos) << m.substr(0, 200);
  EXPECT_LT(m.size(), 2 * LineReader::kStderrTailBytes);  // a bounded tail, not 600 KB
  // A command that succeeds says nothing, whatever it wrote to stderr.
  const ReadAll quiet = read_file(path, "echo chatter >&2; cat");
  EXPECT_TRUE(quiet.status.ok()) << quiet.status.to_string();
  EXPECT_EQ(quiet.lines, (std::vector<std::string>{"a", "b"}));
}

// gpubox_train ignores SIGPIPE (a dead peer's socket must be an error, not a silent death); the
// commands it starts for data files get the default action back, so one whose reader stopped
// early ends at its next write. Its ignored-signal mask, read from /proc, must not hold SIGPIPE.
TEST(LineReader, PipeCommandGetsSigpipeDefaultFromAnIgnoringParent) {
  ScratchDir dir;
  const std::string path = dir.write("in.txt", "a\n");
  const auto previous = std::signal(SIGPIPE, SIG_IGN);
  const ReadAll r = read_file(path, "cat >/dev/null; grep SigIgn /proc/self/status");
  std::signal(SIGPIPE, previous);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_EQ(r.lines.size(), 1u);
  const std::string& line = r.lines[0];  // "SigIgn:\t<hex mask>", bit s-1 for signal s
  const unsigned long long ignored =
      std::stoull(line.substr(line.find_last_of(" \t:") + 1), nullptr, 16);
  EXPECT_EQ(ignored & (1ULL << (SIGPIPE - 1)), 0u) << line;
}

TEST(LineReader, ShellQuote) {
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

}  // namespace
}  // namespace gpubox::dataset
