// TrainerEnv::from_environment (trainer/schedule/trainer_env.hpp): the launcher's variables,
// PaddleRec's names first, GPUBox's next, and a cluster launcher's rank and size (mpirun's
// OMPI_COMM_WORLD_*, srun's SLURM_*) when neither names the trainer.
#include "trainer/schedule/trainer_env.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "common/error.hpp"

namespace gpubox::trainer {
namespace {

// Sets exactly `values` among the variables from_environment reads (the others unset), and
// restores what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& values) {
    for (const char* name :
         {"PADDLE_TRAINER_ID", "GPUBOX_TRAINER_ID", "PADDLE_TRAINERS_NUM", "GPUBOX_TRAINERS_NUM",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) {
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

}  // namespace
}  // namespace gpubox::trainer
