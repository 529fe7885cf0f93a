// Compressed files in a data folder (gzip, zstd, xz, lz4, zip, bzip2): named by their magic bytes
// and refused, or read through a pipe_command that decompresses them. Read as text, their bytes
// were a few malformed lines and the whole file lost beside the other files, exit 0.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "dataset/format_detect.hpp"
#include "tests/dataset/loaded_instances.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::load;
using testing::Loaded;
using testing::ScratchDir;
using testing::slot_config;

// A gzip-compressed file read as text is said to be one, with how to read it (its bytes were
// described as "tab-separated with 9 fields"), auto or explicit alike.
TEST(FormatDetect, AGzipFileIsSaidToBeOne) {
  const std::string gzip("\x1f\x8b\x08\x08\x4d\x95\x44\x0c\x6b\x00\x03part\tx\ty", 17);
  for (const DataFormat format : {DataFormat::kAuto, DataFormat::kSlot}) {
    DatasetConfig c = slot_config(3, 2);
    c.data_format = format;
    FormatChooser chooser(c);
    FormatNote note;
    chooser.choose("f.gz", {gzip, "\x95\x12\tq\tr"}, &note);
    EXPECT_EQ(note.sample_parsed, 0u);
    EXPECT_EQ(note.hint,
              "it is gzip-compressed: decompress it, or read it through runner.pipe_command: "
              "\"gzip -dc\"");
  }
}

// A gzip file among text files stops the load naming it (its bytes were skipped as a few dozen
// "malformed lines" and its instances lost, exit 0 beside the other files); through a pipe that
// decompresses it, it reads.
TEST(FormatDetect, AGzipFileAmongTextFilesStopsTheLoad) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "click:" + std::to_string(i % 2) + " 1:" + std::to_string(i + 1) + "\n";
  const std::string plain = dir.write("a", text);
  dir.write("b", text);
  ASSERT_EQ(std::system(("gzip -c " + dir.file("b") + " > " + dir.file("b.gz")).c_str()), 0);
  DatasetConfig c = slot_config(1, 0);
  const Loaded got = load(c, {plain, dir.file("b.gz")});
  ASSERT_FALSE(got.status.ok());
  EXPECT_NE(got.status.message().find(dir.file("b.gz") + ": it is gzip-compressed"),
            std::string::npos)
      << got.status.to_string();
  c.pipe_command = "gzip -dcf";
  const Loaded piped = load(c, {plain, dir.file("b.gz")});
  ASSERT_TRUE(piped.status.ok()) << piped.status.to_string();
  EXPECT_EQ(piped.instances.size(), 600u);
}

// The other compressed formats a data folder meets are named as gzip is (zstd's bytes were
// "tab-separated with 3 fields", xz's "lines end in CR alone", and the file lost, exit 0).
TEST(FormatDetect, EveryCompressedFormatIsNamed) {
  const std::pair<std::string, std::string> files[] = {
      {std::string("\x28\xb5\x2f\xfd\x24\x0b\x59", 7), "zstd"},
      {std::string("\xfd\x37\x7a\x58\x5a\x00\x00\x04", 8), "xz"},
      {std::string("\x04\x22\x4d\x18\x64\x40\xa7", 7), "lz4"},
      {std::string("PK\x03\x04\x14\x00", 6), "zip"},
      {std::string("BZh91AY&SY\x8c\x1e", 12), "bzip2"},
  };
  for (const auto& [bytes, name] : files) {
    EXPECT_NE(compressed_refusal(bytes).find("it is " + name + "-compressed"), std::string::npos)
        << name;
  }
  EXPECT_EQ(compressed_refusal("BZh9 is not bzip2"), "");
  EXPECT_EQ(compressed_refusal("PK 1:5"), "");
  ScratchDir dir;
  dir.write("a", "click:1 1:5\n");
  dir.write("b.zst", files[0].first + "\n1\t2\t3\n");
  const Loaded got = load(slot_config(1, 0), {dir.file("a"), dir.file("b.zst")});
  EXPECT_NE(got.status.message().find(dir.file("b.zst") + ": it is zstd-compressed: decompress "
                                                          "it, or read it through "
                                                          "runner.pipe_command: \"zstd -dc\""),
            std::string::npos)
      << got.status.to_string();
}

}  // namespace
}  // namespace gpubox::dataset
