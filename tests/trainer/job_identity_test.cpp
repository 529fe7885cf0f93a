// job_identity (trainer/schedule/job_identity.hpp): the data files a job lists, and the refusal
// text that names the ones that differ between a save's job and this one.
#include "trainer/schedule/job_identity.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <time.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "tests/dataset/test_util.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using Job = std::map<std::string, std::string>;

void set_mtime(const std::string& file, time_t seconds, long nanos) {
  const struct timespec times[2] = {{seconds, nanos}, {seconds, nanos}};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0) << file;
}

class JobIdentity : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"a", "b"}) files_.push_back(scratch_.write(name, "x 1:1\n"));
    set_mtime(files_[0], 1'700'000'000, 5);  // 2023-11-14 22:13:20 UTC
    set_mtime(files_[1], 1'700'000'000, 5);
    plan_.pass_files = {{files_[0]}, {files_[1], files_[0]}};  // a file in two passes
    plan_.per_epoch = 2;
    plan_.total = 2;
  }
  Job identity() const { return job_identity(TrainerConfig(), plan_, 1, 1); }

  dataset::testing::ScratchDir scratch_;
  std::vector<std::string> files_;
  RunPlan plan_;
};

TEST_F(JobIdentity, ListsEachFileOnceBySizeTimeAndAbsoluteName) {
  const Job job = identity();
  ASSERT_EQ(job.count("data_file.0"), 1u);
  EXPECT_EQ(job.at("data_file.0"), "6 1700000000.000000005 " + fs::absolute(files_[0]).string());
  EXPECT_EQ(job.at("data_file.1"), "6 1700000000.000000005 " + fs::absolute(files_[1]).string());
  EXPECT_EQ(job.count("data_file.2"), 0u);
  EXPECT_EQ(job.at("data").rfind("3 files in 2 passes an epoch, digest ", 0), 0u) << job.at("data");
}

TEST_F(JobIdentity, NamesTheFileThatChangedAndTakesTheListsOut) {
  Job saved = identity();
  set_mtime(files_[1], 1'700'000'060, 0);
  Job now = identity();
  EXPECT_NE(saved.at("data"), now.at("data"));
  EXPECT_EQ(data_file_differences(&saved, &now),
            fs::absolute(files_[1]).string() +
                ": saved 6 bytes, modified 2023-11-14 22:13:20.000000005 UTC, now 6 bytes, "
                "modified 2023-11-14 22:14:20.000000000 UTC");
  for (const Job* job : {&saved, &now}) {
    EXPECT_EQ(job->count("data_file.0") + job->count("data_file.1"), 0u);
    EXPECT_EQ(job->count("data"), 1u);
  }
  // The same files: nothing named.
  saved = identity();
  now = identity();
  EXPECT_EQ(data_file_differences(&saved, &now), "");
}

TEST_F(JobIdentity, NamesFilesAddedAndGoneAndCountsPastThree) {
  Job saved = identity();
  for (const char* name : {"c", "d", "e"}) plan_.pass_files[0].push_back(scratch_.write(name, ""));
  plan_.pass_files[1] = {files_[0]};  // b gone
  Job now = identity();
  const std::string named = data_file_differences(&saved, &now);
  EXPECT_EQ(named.rfind(fs::absolute(files_[1]).string() + " (6 bytes, modified ", 0), 0u) << named;
  EXPECT_NE(named.find("is not in this job's data; "), std::string::npos) << named;
  EXPECT_NE(named.find(scratch_.file("c") + " (0 bytes, modified "), std::string::npos) << named;
  EXPECT_NE(named.find(") is new; "), std::string::npos) << named;
  EXPECT_EQ(named.find(scratch_.file("e")), std::string::npos) << named;
  EXPECT_NE(named.find("; and 1 more file(s)"), std::string::npos) << named;
}

TEST_F(JobIdentity, ASaveWithoutTheListNamesNoFile) {
  Job saved = identity();
  saved.erase("data_file.0");
  saved.erase("data_file.1");
  set_mtime(files_[1], 1'700'000'060, 0);
  Job now = identity();
  EXPECT_EQ(data_file_differences(&saved, &now), "");
  EXPECT_EQ(now.count("data_file.0"), 0u);  // taken out all the same: not compared as keys
}

TEST_F(JobIdentity, AJobOfMoreThanAThousandFilesListsNone) {
  plan_.pass_files = {{}};
  plan_.per_epoch = 1;
  for (int i = 0; i <= 1000; ++i) plan_.pass_files[0].push_back(files_[static_cast<size_t>(i % 2)]);
  const Job job = identity();
  EXPECT_EQ(job.count("data_file.0"), 0u);
  EXPECT_EQ(job.at("data").rfind("1001 files in 1 passes", 0), 0u) << job.at("data");
}

}  // namespace
}  // namespace gpubox::trainer
