// A save's dense half (trainer/schedule/dense_state.hpp) with fat_deepffm's undropped bias
// (kFatDeepffmBiasBlock): kept in a block of its own beside "dense", which holds the values before
// it; read back bit for bit; a half without it (an older save, or one at p = 0) loads with the
// bias at 0 and says so at INFO; a half with it is refused by a model without it, and a block of
// an unknown name by every model.
#include "trainer/schedule/dense_state.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/dense_table.hpp"
#include "trainer/nn/dense_model_types.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

// A model of 17 values before the bias, which the 16-float alignment puts at 32.
constexpr UndroppedBias kBias{32, 17};
constexpr std::size_t kParameters = 33;

// A state as DenseState::of gives it: every value and moment distinct, the padding [17, 32) 0.
DenseState state_with_bias() {
  DenseState state;
  state.undropped_bias = kBias;
  for (auto* part : {&state.values, &state.moment1, &state.moment2}) part->assign(kParameters, 0);
  for (std::size_t i = 0; i < kBias.before; ++i) {
    state.values[i] = 0.25f * static_cast<float>(i) - 1.0f;
    state.moment1[i] = 0.01f * static_cast<float>(i);
    state.moment2[i] = 0.5f + static_cast<float>(i);
  }
  state.values[kBias.at] = -0.375f;
  state.moment1[kBias.at] = 0.125f;
  state.moment2[kBias.at] = 3.5f;
  state.steps = 41;
  return state;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

class DenseStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpubox_dense_state_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string save(const std::string& name, const DenseState& state) {
    const std::string dir = (dir_ / name).string();
    save_dense_half(dir, state);
    return dir;
  }
  static void load_table(const std::string& dir, table::DenseTable* dense) {
    throw_if_error(dense->load((fs::path(dir) / "dense").string()));
  }
  fs::path dir_;
};

TEST_F(DenseStateTest, TheUndroppedBiasIsItsOwnBlockAndReadsBackBitForBit) {
  const DenseState want = state_with_bias();
  const std::string dir = save("with", want);
  table::DenseTable dense;
  load_table(dir, &dense);
  EXPECT_EQ(dense.names(), (std::vector<std::string>{"dense", kFatDeepffmBiasBlock}));
  const auto shared = dense.get("dense");
  ASSERT_TRUE(shared.has_value());
  EXPECT_EQ(shared->values, std::vector<float>(want.values.begin(), want.values.begin() + 17));
  EXPECT_EQ(shared->state.at("moment2").size(), 17u);
  const auto bias = dense.get(kFatDeepffmBiasBlock);
  ASSERT_TRUE(bias.has_value());
  EXPECT_EQ(bias->values, std::vector<float>{-0.375f});
  EXPECT_EQ(bias->state.at("moment1"), std::vector<float>{0.125f});
  EXPECT_EQ(bias->state.at("moment2"), std::vector<float>{3.5f});

  const DenseState got = load_dense_half(dir, kParameters, "", kBias);
  EXPECT_EQ(got.values, want.values);
  EXPECT_EQ(got.moment1, want.moment1);
  EXPECT_EQ(got.moment2, want.moment2);
  EXPECT_EQ(got.steps, want.steps);
  EXPECT_FALSE(got.undropped_bias_missing);
  ASSERT_TRUE(got.undropped_bias.has_value());
  EXPECT_EQ(got.undropped_bias->at, kBias.at);
  EXPECT_EQ(got.digest(), want.digest());
}

// A save made before the bias (or at p = 0): "dense" alone, of the values before it.
TEST_F(DenseStateTest, AHalfWithoutTheBlockLoadsTheBiasAtZeroAndSaysSo) {
  DenseState older = state_with_bias();
  older.undropped_bias.reset();
  for (auto* part : {&older.values, &older.moment1, &older.moment2}) part->resize(kBias.before);
  const std::string dir = save("older", older);
  ::testing::internal::CaptureStderr();
  const DenseState got = load_dense_half(dir, kParameters, "", kBias);
  const std::string said = ::testing::internal::GetCapturedStderr();
  const std::string phrase = "save " + dir + " has no dense block fat_deepffm.bias";
  const std::size_t line = said.find(phrase);
  ASSERT_NE(line, std::string::npos) << said;
  EXPECT_EQ(said.rfind('I', line), said.rfind('\n', line) + 1) << "not at INFO: " << said;
  EXPECT_EQ(said.find(phrase, line + 1), std::string::npos) << "said twice: " << said;
  EXPECT_NE(said.find("that bias starts at 0"), std::string::npos) << said;
  EXPECT_TRUE(got.undropped_bias_missing);
  ASSERT_EQ(got.values.size(), kParameters);
  std::vector<float> want = older.values;
  want.resize(kParameters, 0.0f);
  EXPECT_EQ(got.values, want);
  EXPECT_EQ(got.moment1.size(), kParameters);
  EXPECT_EQ(got.steps, older.steps);
}

TEST_F(DenseStateTest, AHalfWithTheBlockIsRefusedByAModelWithoutIt) {
  const std::string dir = save("with", state_with_bias());
  const std::string why = error_of([&] { load_dense_half(dir, kBias.before); });
  EXPECT_NE(why.find("save " + dir + " holds the dense block fat_deepffm.bias"), std::string::npos)
      << why;
  EXPECT_NE(why.find("hyper_parameters.dnn_dropout"), std::string::npos) << why;
}

TEST_F(DenseStateTest, ABlockOfAnUnknownNameIsRefused) {
  const std::string dir = save("with", state_with_bias());
  table::DenseTable dense;
  load_table(dir, &dense);
  dense.put("fat_deepffm.bias2", table::DenseBlock{{1.0f}, {}});
  throw_if_error(dense.save((fs::path(dir) / "dense").string()));
  const std::string why = error_of([&] { load_dense_half(dir, kParameters, "", kBias); });
  EXPECT_NE(why.find("dense block 'fat_deepffm.bias2' this build does not know"), std::string::npos)
      << why;
}

TEST_F(DenseStateTest, ABiasBlockOfAnotherSizeIsRefused) {
  const std::string dir = save("with", state_with_bias());
  table::DenseTable dense;
  load_table(dir, &dense);
  dense.put(kFatDeepffmBiasBlock, table::DenseBlock{{1.0f, 2.0f}, {}});
  throw_if_error(dense.save((fs::path(dir) / "dense").string()));
  const std::string why = error_of([&] { load_dense_half(dir, kParameters, "", kBias); });
  EXPECT_NE(why.find("fat_deepffm.bias holds 2 values, not 1"), std::string::npos) << why;
}

}  // namespace
}  // namespace gpubox::trainer
