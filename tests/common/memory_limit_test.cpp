// usable_memory (common/memory_limit.hpp) against hand-written cgroup files: v2 "max" and a
// number, v1's huge "no limit", a limit above and below the physical memory, missing, empty and
// non-numeric files, and the lower of two limits; available_memory against hand-written meminfo
// and cgroup usage files.
#include "common/memory_limit.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace gpubox {
namespace {

class UsableMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpubox_memory_limit_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : written_) std::remove(f.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string file(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    written_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> written_;
};

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST_F(UsableMemoryTest, TheLowerOfPhysicalMemoryAndEachCgroupLimit) {
  const std::string v2_max = file("v2_max", "max\n");
  const std::string v2_4g = file("v2_4g", std::to_string(4 * kGiB) + "\n");
  const std::string v2_2g = file("v2_2g", std::to_string(2 * kGiB));
  const std::string v1_none = file("v1_none", "9223372036854771712\n");
  const std::string empty = file("empty", "");
  const std::string junk = file("junk", "lots\n");
  const std::string negative = file("negative", "-1\n");
  const std::string huge = file("huge", "99999999999999999999999\n");
  const std::string missing = dir_ + "/missing";
  struct Case {
    uint64_t physical;
    std::vector<std::string> files;
    uint64_t bytes;
    std::string source;
  };
  const std::vector<Case> cases = {
      {16 * kGiB, {}, 16 * kGiB, "physical memory"},
      {16 * kGiB, {v2_max, v1_none}, 16 * kGiB, "physical memory"},
      {16 * kGiB, {missing, empty, junk, negative, huge}, 16 * kGiB, "physical memory"},
      {16 * kGiB, {v2_4g, v1_none}, 4 * kGiB, "the cgroup limit in " + v2_4g},
      {16 * kGiB, {v2_max, v2_4g}, 4 * kGiB, "the cgroup limit in " + v2_4g},
      {16 * kGiB, {v2_4g, v2_2g}, 2 * kGiB, "the cgroup limit in " + v2_2g},
      {16 * kGiB, {v2_2g, v2_4g}, 2 * kGiB, "the cgroup limit in " + v2_2g},
      {3 * kGiB, {v2_4g}, 3 * kGiB, "physical memory"},
      {0, {v2_4g}, 4 * kGiB, "the cgroup limit in " + v2_4g},
      {0, {v2_max, missing}, 0, "physical memory"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const UsableMemory got = usable_memory(cases[i].physical, cases[i].files);
    EXPECT_EQ(got.bytes, cases[i].bytes) << "case " << i;
    EXPECT_EQ(got.source, cases[i].source) << "case " << i;
  }
}

// available_memory: MemAvailable in kB, each cgroup's limit less its usage without page cache,
// unlimited or unreadable cgroups skipped, and the lowest of them.
TEST_F(UsableMemoryTest, AvailableMemoryCountsOtherProcessesOfTheMachineAndTheCgroup) {
  const std::string meminfo =
      file("meminfo", "MemTotal:       16777216 kB\nMemAvailable:    8388608 kB\n");
  const std::string no_available = file("meminfo_old", "MemTotal:       16777216 kB\n");
  const std::string limit_6g = file("limit_6g", std::to_string(6 * kGiB) + "\n");
  const std::string limit_max = file("limit_max", "max\n");
  const std::string usage_5g = file("usage_5g", std::to_string(5 * kGiB) + "\n");
  const std::string usage_7g = file("usage_7g", std::to_string(7 * kGiB) + "\n");
  const std::string stat_2g =
      file("stat_2g", "anon 3221225472\nfile " + std::to_string(2 * kGiB) + "\nfile_mapped 1\n");
  const std::string stat_v1 =
      file("stat_v1", "cache 1\ntotal_cache " + std::to_string(4 * kGiB) + "\n");
  const std::string missing = dir_ + "/missing";
  struct Case {
    std::string meminfo;
    std::vector<CgroupUsageFiles> cgroups;
    uint64_t bytes;
  };
  const std::vector<Case> cases = {
      {missing, {}, UINT64_MAX},
      {no_available, {}, UINT64_MAX},
      {meminfo, {}, 8 * kGiB},
      // 6 GiB limit, 5 GiB used of which 2 GiB page cache: 3 GiB left.
      {meminfo, {{limit_6g, usage_5g, stat_2g, "file"}}, 3 * kGiB},
      {missing, {{limit_6g, usage_5g, stat_2g, "file"}}, 3 * kGiB},
      // No stat file: all of the usage counts.
      {meminfo, {{limit_6g, usage_5g, missing, "file"}}, 1 * kGiB},
      // Over the limit without its cache: none left.
      {meminfo, {{limit_6g, usage_7g, missing, "file"}}, 0},
      {meminfo, {{limit_6g, usage_7g, stat_v1, "total_cache"}}, 3 * kGiB},
      {meminfo, {{limit_max, usage_5g, stat_2g, "file"}}, 8 * kGiB},
      {meminfo, {{limit_6g, missing, stat_2g, "file"}}, 8 * kGiB},
      {meminfo,
       {{limit_max, usage_5g, stat_2g, "file"}, {limit_6g, usage_7g, stat_v1, "total_cache"}},
       3 * kGiB},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(available_memory(cases[i].meminfo, cases[i].cgroups), cases[i].bytes) << "case " << i;
  }
}

TEST(UsableMemory, ThisMachineHasSomeAndNoMoreThanItsPhysicalMemory) {
  const uint64_t physical =
      uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGE_SIZE));
  const UsableMemory got = usable_memory();
  EXPECT_GT(got.bytes, 0u);
  EXPECT_LE(got.bytes, physical);
  EXPECT_EQ(usable_memory_bytes(), got.bytes);
}

// Touching 64 MiB more raises the resident memory by about that, and the headroom stays below
// what the usable memory leaves beside it. (How much the headroom falls is not checked: its other
// bound, the machine's MemAvailable, moves with every other process.)
TEST(UsableMemory, ResidentMemoryAndHeadroomFollowWhatThisProcessTouches) {
  const uint64_t resident = resident_memory_bytes();
  EXPECT_GT(resident, 0u);
  EXPECT_LE(memory_headroom_bytes(), usable_memory_bytes() - resident);
  EXPECT_GT(available_memory_bytes(), 0u);
  std::vector<char> touched(std::size_t{64} << 20, 1);
  const uint64_t grown = resident_memory_bytes();
  EXPECT_GE(grown, resident + (std::size_t{60} << 20)) << int(touched.back());
  EXPECT_LE(memory_headroom_bytes(), usable_memory_bytes() - grown);
}

}  // namespace
}  // namespace gpubox
