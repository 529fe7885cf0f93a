// card_setup.hpp's decisions with given numbers (the CUDA calls around them are not run here):
// the card-memory budget check, the reserve it keeps for NCCL and cuBLAS, and what
// CUDA_MODULE_LOADING value the process ends up with.
#include "heterps/device/card_setup.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace gpubox::device {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(CardMemoryBudget, FitsUpToFreeLessTheReserve) {
  EXPECT_TRUE(check_card_memory_budget(0, 0, 0, 0).ok()) << "no budget: nothing to check";
  EXPECT_TRUE(check_card_memory_budget(-1, 10 * kMiB, 0, 0).ok());
  EXPECT_TRUE(check_card_memory_budget(700, 1000 * kMiB, 300 * kMiB, 0).ok()) << "exactly fits";
  EXPECT_FALSE(check_card_memory_budget(701, 1000 * kMiB, 300 * kMiB, 0).ok()) << "1 MiB over";
  EXPECT_FALSE(check_card_memory_budget(1, 100 * kMiB, 200 * kMiB, 0).ok()) << "reserve > free";
  // runner.card_memory_mb goes up to INT64_MAX: budgets whose bytes overflow 64 bits are refused,
  // 2^44 MiB (2^64 bytes, 0 once wrapped) included.
  EXPECT_FALSE(check_card_memory_budget(int64_t{1} << 44, 1000 * kMiB, 0, 0).ok()) << "2^44 MiB";
  EXPECT_FALSE(check_card_memory_budget((int64_t{1} << 44) + 1, 1000 * kMiB, 0, 0).ok());
  EXPECT_FALSE(check_card_memory_budget(INT64_MAX, SIZE_MAX, 0, 0).ok()) << "INT64_MAX MiB";
  EXPECT_TRUE(check_card_memory_budget(1000, 1000 * kMiB + kMiB - 1, 0, 0).ok()) << "a part MiB";
}

TEST(CardMemoryBudget, TheErrorNamesTheKeyTheCardAndWhatFits) {
  const Status st = check_card_memory_budget(80000, 79000 * kMiB, 800 * kMiB, 3);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  const std::string& m = st.message();
  EXPECT_NE(m.find("runner.card_memory_mb = 80000"), std::string::npos) << m;
  EXPECT_NE(m.find("card 3"), std::string::npos) << m;
  EXPECT_NE(m.find("79000 MiB free"), std::string::npos) << m;
  EXPECT_NE(m.find("800 MiB stay for NCCL"), std::string::npos) << m;
  EXPECT_NE(m.find("at most 78200"), std::string::npos) << m;
}

TEST(CardMemoryBudget, ReserveGrowsWithPeersOnCudaAndIsZeroOnCpu) {
#if defined(GPUBOX_BACKEND_CUDA)
  EXPECT_GE(library_reserve_bytes(1), 32 * kMiB) << "at least the cuBLAS workspace";
  EXPECT_GT(library_reserve_bytes(2), library_reserve_bytes(1));
  EXPECT_GT(library_reserve_bytes(8), library_reserve_bytes(2));
#else
  EXPECT_EQ(library_reserve_bytes(1), 0u);
  EXPECT_EQ(library_reserve_bytes(8), 0u);
#endif
}

TEST(ModuleLoading, EagerUnlessTheUserChoseOtherwise) {
  EXPECT_EQ(module_loading_choice(nullptr), ModuleLoading::kSetEager);
  EXPECT_EQ(module_loading_choice(""), ModuleLoading::kSetEager);
  EXPECT_EQ(module_loading_choice("EAGER"), ModuleLoading::kKeptEager);
  EXPECT_EQ(module_loading_choice("LAZY"), ModuleLoading::kKeptUser);
}

}  // namespace
}  // namespace gpubox::device
