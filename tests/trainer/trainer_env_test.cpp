// TrainerEnv::from_environment (trainer/schedule/trainer_env.hpp): the launcher's variables,
// PaddleRec's names first, GPUBox's next, and a cluster launcher's rank and size (mpirun's
// OMPI_COMM_WORLD_*, srun's SLURM_*) when neither names the trainer. An in-memory data set
// given to every trainer of a job is split by rows as a file list is split by files; a streamed
// reader (QueueDataset) refuses one, naming the key.
#include "trainer/schedule/trainer_env.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "common/error.hpp"
#include "dataset/memory_source.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer {
namespace {

// Sets exactly `values` among the variables from_environment reads (the others unset), and
// restores what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& values) {
    for (const char* name : {"PADDLE_TRAINER_ID", "GPUBOX_TRAINER_ID", "PADDLE_TRAINERS_NUM",
                             "GPUBOX_TRAINERS_NUM", "PADDLE_TRAINERS", "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) {
      if (const char* old = std::getenv(name)) saved_[name] = old;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
    set_ = values;
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : set_) ::unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
  std::map<std::string, std::string> set_;
};

TEST(TrainerEnv, PaddleNamesWinOverGpuboxNamesAndLaunchers) {
  ScopedEnv env({{"PADDLE_TRAINER_ID", "2"},
                 {"GPUBOX_TRAINER_ID", "1"},
                 {"PADDLE_TRAINERS_NUM", "4"},
                 {"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "8"}});
  const TrainerEnv e = TrainerEnv::from_environment();
  EXPECT_EQ(e.trainer_id, 2);
  EXPECT_EQ(e.trainers, 4);
}

TEST(TrainerEnv, MpirunRankAndSizeNameTheTrainer) {
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "1"},
                 {"OMPI_COMM_WORLD_SIZE", "2"},
                 {"SLURM_PROCID", "5"},
                 {"SLURM_NTASKS", "6"}});
  const TrainerEnv e = TrainerEnv::from_environment();
  EXPECT_EQ(e.trainer_id, 1);
  EXPECT_EQ(e.trainers, 2);
}

TEST(TrainerEnv, SrunRankAndSizeWhenNoMpirun) {
  ScopedEnv env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}});
  const TrainerEnv e = TrainerEnv::from_environment();
  EXPECT_EQ(e.trainer_id, 3);
  EXPECT_EQ(e.trainers, 4);
}

TEST(TrainerEnv, NoLauncherIsOneTrainer) {
  ScopedEnv env(std::map<std::string, std::string>{});
  const TrainerEnv e = TrainerEnv::from_environment();
  EXPECT_EQ(e.trainer_id, 0);
  EXPECT_EQ(e.trainers, 1);
}

TEST(TrainerEnv, AMalformedLauncherValueNamesTheVariable) {
  ScopedEnv env(std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", "one"}});
  try {
    TrainerEnv::from_environment();
    FAIL() << "accepted OMPI_COMM_WORLD_RANK=one";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("OMPI_COMM_WORLD_RANK='one'"));
  }
}

// from_environment's error for `values`, or "" when it accepts them.
std::string refusal(const std::map<std::string, std::string>& values) {
  ScopedEnv env(values);
  try {
    TrainerEnv::from_environment();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainerEnv, PaddleRecsTrainersCountIsRead) {
  {
    ScopedEnv env({{"PADDLE_TRAINERS", "2"}, {"PADDLE_TRAINER_ID", "1"}});
    const TrainerEnv e = TrainerEnv::from_environment();
    EXPECT_EQ(e.trainers, 2);
    EXPECT_EQ(e.trainer_id, 1);
  }
  // Paddle's cloud launcher's PADDLE_TRAINERS, the trainers' addresses: not a count.
  ScopedEnv env({{"PADDLE_TRAINERS", "10.0.0.1,10.0.0.2"},
                 {"PADDLE_TRAINERS_NUM", "2"},
                 {"PADDLE_TRAINER_ID", "1"}});
  const TrainerEnv e = TrainerEnv::from_environment();
  EXPECT_EQ(e.trainers, 2);
  EXPECT_EQ(e.trainers_from, "PADDLE_TRAINERS_NUM");
}

TEST(TrainerEnv, AnIdOutsideTheJobOrCountsThatDisagreeNameTheirVariables) {
  using ::testing::HasSubstr;
  EXPECT_THAT(refusal({{"PADDLE_TRAINER_ID", "5"}, {"PADDLE_TRAINERS_NUM", "2"}}),
              HasSubstr("PADDLE_TRAINER_ID=5 is not a trainer of the job: ids run from 0 to 1 "
                        "(PADDLE_TRAINERS_NUM=2)"));
  EXPECT_THAT(refusal({{"GPUBOX_TRAINER_ID", "1"}}),
              HasSubstr("GPUBOX_TRAINER_ID=1 is not a trainer of the job: ids run from 0 to 0 "
                        "(PADDLE_TRAINERS_NUM unset: 1 trainer)"));
  EXPECT_THAT(refusal({{"PADDLE_TRAINER_ID", "-1"}, {"PADDLE_TRAINERS", "3"}}),
              HasSubstr("PADDLE_TRAINER_ID=-1 is not a trainer of the job: ids run from 0 to 2 "
                        "(PADDLE_TRAINERS=3)"));
  EXPECT_THAT(refusal({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
              HasSubstr("SLURM_PROCID=4 is not a trainer of the job"));
  EXPECT_THAT(refusal({{"PADDLE_TRAINERS_NUM", "0"}}),
              HasSubstr("PADDLE_TRAINERS_NUM=0: a job has at least one trainer"));
  EXPECT_THAT(refusal({{"PADDLE_TRAINERS", "3"}, {"PADDLE_TRAINERS_NUM", "2"}}),
              HasSubstr("PADDLE_TRAINERS=3 and PADDLE_TRAINERS_NUM=2 disagree"));
  EXPECT_EQ(refusal({{"PADDLE_TRAINERS", "2"}, {"PADDLE_TRAINERS_NUM", "2"}}), "");
  // A count with a typo is refused naming it (it was skipped as an address list: one trainer).
  EXPECT_THAT(refusal({{"PADDLE_TRAINERS", "2x"}, {"PADDLE_TRAINER_ID", "1"}}),
              HasSubstr("PADDLE_TRAINERS"));
  EXPECT_NE(refusal({{"PADDLE_TRAINERS", "2x"}, {"PADDLE_TRAINER_ID", "1"}}), "");
  // One host's name is an address list of one, not a count.
  EXPECT_EQ(refusal({{"PADDLE_TRAINERS", "localhost"}, {"PADDLE_TRAINERS_NUM", "1"}}), "");
  EXPECT_EQ(refusal({{"PADDLE_TRAINERS", "node7"}}), "");
  // A host whose name starts with a digit: with the count given it is the list it is; alone it is
  // refused, saying how to give the count.
  EXPECT_EQ(refusal({{"PADDLE_TRAINERS", "3node"}, {"PADDLE_TRAINERS_NUM", "1"}}), "");
  // Set but empty is unset (as env_int reads it): a typo in the count is still refused.
  EXPECT_NE(refusal({{"PADDLE_TRAINERS", "2x"}, {"PADDLE_TRAINERS_NUM", ""}}), "");
  EXPECT_THAT(refusal({{"PADDLE_TRAINERS", "3node"}}),
              HasSubstr("PADDLE_TRAINERS='3node' is not a whole number: it is read as the job's "
                        "trainer count"));
  EXPECT_THAT(refusal({{"PADDLE_TRAINERS", "3node"}}), HasSubstr("set PADDLE_TRAINERS_NUM"));
}

// Labels 0 .. n-1 in one slot each (key = label + 1): a share's labels say which rows it got.
std::string numbered_rows(int n) {
  dataset::InstanceBlock block(1, 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t key = static_cast<uint64_t>(i) + 1;
    const uint32_t sizes = 1;
    const float no_dense = 0.0f;  // dense_dim 0: none read
    block.append(static_cast<float>(i), &no_dense, &key, 1, &sizes);
  }
  return dataset::register_memory_source(std::move(block), {"1"});
}

TEST(TrainerFileShare, AnInMemoryDataSetIsSplitByRowsAsFilesAre) {
  const std::string name = numbered_rows(7);
  EXPECT_EQ(trainer_file_share({name}, 0, 1), std::vector<std::string>{name});  // one trainer
  for (int trainers : {2, 3, 8}) {
    std::vector<float> joined;
    for (int t = 0; t < trainers; ++t) {
      const std::vector<std::string> share = trainer_file_share({name}, t, trainers);
      ASSERT_EQ(share.size(), 1u);
      const dataset::MemorySource part = dataset::find_memory_source(share[0]);
      // As files: contiguous rows, the first 7 % T trainers one row more.
      EXPECT_EQ(part.block->size(), static_cast<std::size_t>(7 / trainers + (t < 7 % trainers)))
          << "trainer " << t << " of " << trainers;
      joined.insert(joined.end(), part.block->labels.begin(), part.block->labels.end());
      if (part.block->size() > 0) {
        EXPECT_EQ(part.block->keys.front(), part.block->labels[0] + 1);
      }
    }
    EXPECT_EQ(joined, (std::vector<float>{0, 1, 2, 3, 4, 5, 6})) << trainers << " trainers";
  }
  EXPECT_THROW(dataset::find_memory_source(name + "@2/2"), Error);
  dataset::unregister_memory_source(name);
}

// A dense transform named for an in-memory data set is refused (its values were taken as given,
// the transform unsaid, and the export would have applied it to served values); none, auto and
// files pass.
TEST(MemorySourceTransform, ANamedTransformIsRefusedForAnInMemoryDataSet) {
  const std::string name = numbered_rows(3);
  dataset::DatasetConfig c;
  for (const config::DenseTransform t :
       {config::DenseTransform::kNone, config::DenseTransform::kAuto}) {
    c.dense_transform = t;
    EXPECT_NO_THROW(check_memory_source_transform({name}, c));
  }
  c.dense_transform = config::DenseTransform::kLog1p;
  EXPECT_NO_THROW(check_memory_source_transform({"/data/part-0"}, c));
  EXPECT_NO_THROW(check_memory_source_transform({}, c));
  try {
    check_memory_source_transform({name}, c);
    FAIL() << "log1p named for an in-memory data set";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("runner.dense_transform is log1p, but the data set " + name +
                                     " is held in memory"));
  }
  dataset::unregister_memory_source(name);
}

TEST(PlanRun, AStreamedReaderRefusesAnInMemoryDataSetNamingTheKey) {
  const std::string name = numbered_rows(3);
  RunnerConfig runner;
  runner.train_data_dir = name;
  EXPECT_EQ(plan_run(runner).pass_files.at(0), std::vector<std::string>{name});
  runner.reader_type = ReaderType::kQueueDataset;
  try {
    plan_run(runner);
    FAIL() << "QueueDataset accepted an in-memory data set";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("runner.reader_type: QueueDataset"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(name));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("runner.reader_type: InmemoryDataset"));
  }
  dataset::unregister_memory_source(name);
}

}  // namespace
}  // namespace gpubox::trainer
