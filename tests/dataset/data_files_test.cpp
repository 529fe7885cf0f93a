// The file list of a data folder: sorted, each skipped entry reported with its reason (hidden,
// metadata, folder, broken link, not a regular file, same file as a listed one), a link to a
// listed file read once, a link to a file elsewhere kept.
#include "dataset/data_files.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {
namespace fs = std::filesystem;
using testing::ScratchDir;

std::vector<std::pair<std::string, SkipReason>> reasons(const DataFileList& list) {
  std::vector<std::pair<std::string, SkipReason>> out;
  for (const SkippedEntry& e : list.skipped) {
    out.emplace_back(fs::path(e.path).filename().string(), e.reason);
  }
  return out;
}

TEST(DataFiles, ListsRegularFilesOnceAndReportsEverySkip) {
  ScratchDir dir;
  ScratchDir elsewhere;
  const std::string d = dir.file("d");
  fs::create_directories(d + "/sub");
  dir.write("d/b.txt", "x\n");
  dir.write("d/a.txt", "x\n");
  dir.write("d/.hidden", "x\n");
  dir.write("d/oracle.json", "{}");
  fs::create_symlink(d + "/a.txt", d + "/c_link_to_a");                     // same file as a.txt
  fs::create_symlink("b.txt", d + "/0_relative_link_to_b");                 // listed first
  fs::create_symlink(d + "/missing", d + "/e_broken");                      // broken
  fs::create_symlink(elsewhere.write("outside.txt", "y\n"), d + "/f_out");  // kept
  ASSERT_EQ(::mkfifo((d + "/g_fifo").c_str(), 0600), 0);

  StatusOr<DataFileList> list = list_data_files(d);
  ASSERT_TRUE(list.ok()) << list.status().to_string();
  EXPECT_EQ(list->files,
            (std::vector<std::string>{d + "/0_relative_link_to_b", d + "/a.txt", d + "/f_out"}));
  using R = SkipReason;
  EXPECT_EQ(reasons(*list),
            (std::vector<std::pair<std::string, SkipReason>>{{".hidden", R::kHidden},
                                                             {"b.txt", R::kSameFile},
                                                             {"c_link_to_a", R::kSameFile},
                                                             {"e_broken", R::kBrokenLink},
                                                             {"g_fifo", R::kNotRegularFile},
                                                             {"oracle.json", R::kMetadata},
                                                             {"sub", R::kFolder}}));
  EXPECT_EQ(list->skipped[1].to_string(),
            d + "/b.txt (same file as " + d + "/0_relative_link_to_b)");
  EXPECT_EQ(list->unexpected_skips().size(), 5u);
  const std::string text = skipped_text(d, list->unexpected_skips(), 2);
  EXPECT_EQ(text, "skipped 5 entries of " + d + ": " + d + "/b.txt (same file as " + d +
                      "/0_relative_link_to_b), " + d + "/c_link_to_a (same file as " + d +
                      "/a.txt), ...");
  EXPECT_EQ(skipped_text(d, {}), "");
}

TEST(DataFiles, OneFileEmptyFolderAndMissingFolder) {
  ScratchDir dir;
  const std::string f = dir.write("one.txt", "x\n");
  StatusOr<DataFileList> one = list_data_files(f);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->files, std::vector<std::string>{f});
  fs::create_directories(dir.file("empty"));
  StatusOr<DataFileList> empty = list_data_files(dir.file("empty"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->files.empty());
  EXPECT_TRUE(empty->skipped.empty());
  StatusOr<DataFileList> missing = list_data_files(dir.file("nowhere"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_NE(missing.status().message().find("nowhere"), std::string::npos);
  // A FIFO or a link loop named as the folder: what it is, not "does not exist".
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  StatusOr<DataFileList> fifo = list_data_files(dir.file("fifo"));
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("is neither a folder nor a regular file"),
            std::string::npos)
      << fifo.status().message();
  fs::create_symlink(dir.file("loop"), dir.file("loop"));
  StatusOr<DataFileList> loop = list_data_files(dir.file("loop"));
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.status().message().find("cannot read data folder '" + dir.file("loop") + "'"),
            std::string::npos)
      << loop.status().message();
}

// A hard link is the same file too (no path resolution shows it): read once.
TEST(DataFiles, AHardLinkToAListedFileIsReadOnce) {
  ScratchDir dir;
  const std::string d = dir.file("d");
  fs::create_directories(d);
  dir.write("d/a.txt", "x\n");
  fs::create_hard_link(d + "/a.txt", d + "/b_hard");
  StatusOr<DataFileList> list = list_data_files(d);
  ASSERT_TRUE(list.ok()) << list.status().to_string();
  EXPECT_EQ(list->files, std::vector<std::string>{d + "/a.txt"});
  ASSERT_EQ(list->skipped.size(), 1u);
  EXPECT_EQ(list->skipped[0].to_string(), d + "/b_hard (same file as " + d + "/a.txt)");
}

// A list of folders: each listed in order; a file met in an earlier folder (the folder named
// twice, by another spelling, a link into it, a file named beside its folder) is skipped as the
// same file, so that no file is read twice in a pass.
TEST(DataFiles, FoldersOfAListShareNoFile) {
  ScratchDir dir;
  const std::string a = dir.file("a");
  const std::string b = dir.file("b");
  fs::create_directories(a);
  fs::create_directories(b);
  dir.write("a/1.txt", "x\n");
  dir.write("a/2.txt", "x\n");
  dir.write("b/3.txt", "x\n");
  fs::create_symlink(a + "/2.txt", b + "/4_link_to_a2");
  StatusOr<std::vector<DataFileList>> listed =
      list_data_folders({a, b, dir.path() + "/./a", a + "/1.txt"});
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  ASSERT_EQ(listed->size(), 4u);
  EXPECT_EQ((*listed)[0].files, (std::vector<std::string>{a + "/1.txt", a + "/2.txt"}));
  EXPECT_EQ((*listed)[1].files, std::vector<std::string>{b + "/3.txt"});
  ASSERT_EQ((*listed)[1].skipped.size(), 1u);
  EXPECT_EQ((*listed)[1].skipped[0].to_string(),
            b + "/4_link_to_a2 (same file as " + a + "/2.txt)");
  EXPECT_TRUE((*listed)[2].files.empty());
  EXPECT_EQ((*listed)[2].skipped.size(), 2u);
  EXPECT_EQ((*listed)[2].unexpected_skips().size(), 2u);
  EXPECT_TRUE((*listed)[3].files.empty());
  ASSERT_EQ((*listed)[3].skipped.size(), 1u);
  EXPECT_EQ((*listed)[3].skipped[0].same_as, a + "/1.txt");
  // One folder alone: nothing is shared.
  StatusOr<std::vector<DataFileList>> alone = list_data_folders({b});
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*alone)[0].files.size(), 2u);
  EXPECT_FALSE(list_data_folders({a, dir.file("nowhere")}).ok());
}

}  // namespace
}  // namespace gpubox::dataset
