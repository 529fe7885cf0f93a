// Blas: row-major sgemm / sgemv, and gemm_bf16 on bf16 operands, with every transpose against a
// float64 reference.
#include "trainer/nn/blas.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/log_sink.hpp"
#include "common/thread_annotations.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/step_graph.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/bf16_speed.hpp"
#include "trainer/nn/dense_model.hpp"
#if !defined(GPUBOX_BACKEND_CUDA)
#include "trainer/nn/detail/fixed_order_gemv.hpp"
#endif

namespace gpubox::trainer {
namespace {
using device::CardSet;

// Element (r, c) of op(M) where M is stored row-major with row stride ld.
double at(const std::vector<float>& m, int64_t ld, bool trans, int64_t r, int64_t c) {
  return trans ? m[c * ld + r] : m[r * ld + c];
}

class SgemmTest
    : public ::testing::TestWithParam<std::tuple<bool, bool, std::tuple<int, int, int>>> {};

// Checks one sgemm on a card with `threads` threads (cpu: GEMMs of >= 1e6 multiply-adds split
// their rows over the card's threads, so large shapes with 3 threads cover the split path).
// `bf16`: gemm_bf16 instead, on A and B rounded to bf16 (the reference reads the rounded values:
// their products are exact, so only the fp32 sums differ from it).
// check_gemm_on: the same on a given card and Blas (its plans kept from earlier calls), with the
// operands `offset` elements into their buffers (other pointers for the same shape).
void check_gemm_on(device::Card& card, const Blas& blas, bool ta, bool tb, int m, int n, int k,
                   bool bf16, float alpha, float beta, int offset = 0);

void check_sgemm(bool ta, bool tb, int m, int n, int k, int threads, bool bf16 = false,
                 float alpha = 0.75f, float beta = -0.5f) {
  CardSet cards = CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  check_gemm_on(card, blas, ta, tb, m, n, k, bf16, alpha, beta);
}

// A copy of `v` with `offset` leading zeros, on the card; its data() + offset is v.
template <class T>
device::device_buffer<T> on_card(const std::vector<T>& v, int offset, device::Card& card) {
  std::vector<T> padded(offset, T{});
  padded.insert(padded.end(), v.begin(), v.end());
  return device::to_device(padded, card.memory(), card.stream());
}

void check_gemm_on(device::Card& card, const Blas& blas, bool ta, bool tb, int m, int n, int k,
                   bool bf16, float alpha, float beta, int offset) {
  std::mt19937_64 rng(m * 1000 + n * 10 + k + ta * 7 + tb * 13 + offset);
  // Padded leading dimensions: the stride is honoured, not assumed to equal the width.
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = n + 2;
  std::vector<float> a = testing::random_vector(a_rows * lda, rng);
  std::vector<float> b = testing::random_vector(b_rows * ldb, rng);
  std::vector<float> c = testing::random_vector(static_cast<std::size_t>(m) * ldc, rng);
  const Transpose op_a = ta ? Transpose::kYes : Transpose::kNo;
  const Transpose op_b = tb ? Transpose::kYes : Transpose::kNo;
  auto dc = on_card(c, offset, card);
  if (bf16) {
    ASSERT_NE(blas.bf16(), Bf16Support::kNone);
    std::vector<Bf16> a16(a.size()), b16(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = to_float(a16[i] = to_bf16(a[i]));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = to_float(b16[i] = to_bf16(b[i]));
    auto da = on_card(a16, offset, card);
    auto db = on_card(b16, offset, card);
    blas.gemm_bf16(op_a, op_b, m, n, k, alpha, da.data() + offset, lda, db.data() + offset, ldb,
                   beta, dc.data() + offset, ldc);
  } else {
    auto da = on_card(a, offset, card);
    auto db = on_card(b, offset, card);
    blas.sgemm(op_a, op_b, m, n, k, alpha, da.data() + offset, lda, db.data() + offset, ldb, beta,
               dc.data() + offset, ldc);
  }
  std::vector<float> got = device::to_host(dc);
  got.erase(got.begin(), got.begin() + offset);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t col = 0; col < ldc; ++col) {
      double want = c[r * ldc + col];
      if (col < n) {
        double dot = 0;
        for (int64_t x = 0; x < k; ++x) dot += at(a, lda, ta, r, x) * at(b, ldb, tb, x, col);
        want = alpha * dot + beta * want;
      }  // else: padding columns must be untouched
      ASSERT_NEAR(got[r * ldc + col], want, 1e-4 * (1 + std::fabs(want)))
          << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " at " << r
          << "," << col;
    }
  }
}

TEST_P(SgemmTest, MatchesFloat64Reference) {
  const auto [ta, tb, dims] = GetParam();
  const auto [m, n, k] = dims;
  check_sgemm(ta, tb, m, n, k, 0);
}

// gemm_bf16 (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs) on the same shapes, with
// the scales the cross networks use (1 and 0, 1 and 1) and others.
TEST_P(SgemmTest, Bf16MatchesFloat64ReferenceOfTheRoundedOperands) {
  const auto [ta, tb, dims] = GetParam();
  const auto [m, n, k] = dims;
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  check_sgemm(ta, tb, m, n, k, 0, true);
  check_sgemm(ta, tb, m, n, k, 0, true, 1.0f, 0.0f);
  check_sgemm(ta, tb, m, n, k, 3, true, 1.0f, 1.0f);
  unsetenv("GPUBOX_BF16_EMULATION");
}

// One Blas keeps gemm_bf16's plans (cpu: a oneDNN primitive per shape and scales): a plan is
// reused only for the same shape and scales, with any operands, and the cache starting over past
// its 256 shapes changes no result.
TEST(GemmBf16, OneBlasMatchesTheReferenceAcrossScalesPointersAndManyShapes) {
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  CardSet cards = CardSet::from_list("0", 0, 1, 0);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  unsetenv("GPUBOX_BF16_EMULATION");
  const std::tuple<float, float> scales[] = {
      {1.0f, 0.0f}, {1.0f, 1.0f}, {0.75f, 1.0f}, {0.75f, -0.5f}, {1.0f, 0.0f}};
  for (const auto& [alpha, beta] : scales) {
    check_gemm_on(card, blas, false, true, 33, 17, 65, true, alpha, beta);
  }
  for (int offset : {1, 5, 0})
    check_gemm_on(card, blas, false, true, 33, 17, 65, true, 1, 0, offset);
  for (int m = 1; m <= 300; ++m) {
    check_gemm_on(card, blas, m % 2 == 1, m % 3 == 1, m, 3, 5, true, 1.0f,
                  m % 2 == 0 ? 1.0f : 0.0f);
    if (::testing::Test::HasFatalFailure()) return;
  }
  check_gemm_on(card, blas, false, true, 33, 17, 65, true, 0.75f, 1.0f);
}

// A shape first met inside a step-graph capture (the cross networks plan none ahead): the capture
// allocates nothing on the card, and each replay computes C = A B + C against the reference.
TEST(GemmBf16, AShapeFirstMetInACaptureReplaysWithoutAllocating) {
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  CardSet cards = CardSet::from_list("0", 0, 1, 0);
  device::Card& card = cards.card(0);
  card.activate();
  const Blas blas(card);
  unsetenv("GPUBOX_BF16_EMULATION");
  constexpr int kN = 192;
  std::mt19937_64 rng(3);
  std::vector<float> a = testing::random_vector(kN * kN, rng);
  std::vector<Bf16> a16(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = to_float(a16[i] = to_bf16(a[i]));
  auto da = device::to_device(a16, card.memory(), card.stream());
  auto dc = device::to_device(std::vector<float>(kN * kN, 0.0f), card.memory(), card.stream());
  device::StepGraph graph("gemm_bf16 step");
  graph.capture(card.stream(), [&] {
    blas.gemm_bf16(Transpose::kNo, Transpose::kYes, kN, kN, kN, 1.0f, da.data(), kN, da.data(), kN,
                   1.0f, dc.data(), kN);
  });
  for (int replays = 1; replays <= 2; ++replays) {
    graph.replay(card.stream());
    const std::vector<float> got = device::to_host(dc);
    for (int r = 0; r < kN; r += 7) {
      for (int col = 0; col < kN; col += 5) {
        double dot = 0;
        for (int x = 0; x < kN; ++x) dot += static_cast<double>(a[r * kN + x]) * a[col * kN + x];
        ASSERT_NEAR(got[r * kN + col], replays * dot, 1e-4 * (1 + std::fabs(replays * dot)))
            << r << "," << col << " replay " << replays;
      }
    }
  }
}

TEST(Sgemm, RowsSplitOverTheCardThreadsMatchTheReference) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_sgemm(ta, tb, 200, 100, 60, 3);  // 3 even blocks
      check_sgemm(ta, tb, 97, 300, 40, 3);   // uneven blocks
      check_sgemm(ta, tb, 40, 500, 100, 3);  // too few rows to split
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SgemmTest,
    ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(std::make_tuple(0, 3, 4), std::make_tuple(3, 0, 4),
                                         std::make_tuple(3, 4, 0), std::make_tuple(1, 1, 1),
                                         std::make_tuple(7, 5, 3), std::make_tuple(33, 17, 65),
                                         std::make_tuple(64, 1, 129))));

TEST(Sgemv, BothTransposesAndEmptyInnerSize) {
  CardSet cards = CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  std::mt19937_64 rng(5);
  for (const auto& [rows, cols] : {std::pair<int, int>{6, 4}, {1, 9}, {0, 5}, {5, 0}}) {
    for (bool trans : {false, true}) {
      const int64_t lda = cols + 2;
      const int64_t in = trans ? rows : cols, out = trans ? cols : rows;
      std::vector<float> a = testing::random_vector(static_cast<std::size_t>(rows) * lda + 1, rng);
      std::vector<float> x = testing::random_vector(in + 1, rng);
      std::vector<float> y = testing::random_vector(out + 1, rng);
      auto da = device::to_device(a, card.memory(), card.stream());
      auto dx = device::to_device(x, card.memory(), card.stream());
      auto dy = device::to_device(y, card.memory(), card.stream());
      blas.sgemv(trans ? Transpose::kYes : Transpose::kNo, rows, cols, 2.0f, da.data(), lda,
                 dx.data(), 0.25f, dy.data());
      std::vector<float> got = device::to_host(dy);
      for (int64_t i = 0; i < out; ++i) {
        double dot = 0;
        for (int64_t j = 0; j < in; ++j) dot += (trans ? a[j * lda + i] : a[i * lda + j]) * x[j];
        const double want = 2.0 * dot + 0.25 * y[i];
        EXPECT_NEAR(got[i], want, 1e-4 * (1 + std::fabs(want)))
            << rows << "x" << cols << " trans=" << trans << " i=" << i;
      }
      EXPECT_EQ(got[out], y[out]) << "wrote past the end";
    }
  }
}

// y = 1.5 op(A) x - 0.5 y on a card of `threads` threads, A [rows x cols] with row stride
// cols + 3; checks it against a float64 reference (each output within 1e-5 of the sum of its
// terms' magnitudes) and the element after y untouched. Returns y.
std::vector<float> check_sgemv(bool trans, int64_t rows, int64_t cols, int threads) {
  CardSet cards = CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  std::mt19937_64 rng(rows * 131 + cols * 7 + trans);
  const int64_t lda = cols + 3;
  const int64_t in = trans ? rows : cols, out = trans ? cols : rows;
  const std::vector<float> a = testing::random_vector(rows * lda, rng);
  const std::vector<float> x = testing::random_vector(in, rng);
  const std::vector<float> y = testing::random_vector(out + 1, rng);
  auto da = device::to_device(a, card.memory(), card.stream());
  auto dx = device::to_device(x, card.memory(), card.stream());
  auto dy = device::to_device(y, card.memory(), card.stream());
  blas.sgemv(trans ? Transpose::kYes : Transpose::kNo, rows, cols, 1.5f, da.data(), lda, dx.data(),
             -0.5f, dy.data());
  std::vector<float> got = device::to_host(dy);
  for (int64_t i = 0; i < out; ++i) {
    double dot = 0, magnitude = 0;
    for (int64_t j = 0; j < in; ++j) {
      const double term = (trans ? a[j * lda + i] : a[i * lda + j]) * double{x[j]};
      dot += term;
      magnitude += std::fabs(term);
    }
    const double want = 1.5 * dot - 0.5 * y[i];
    EXPECT_NEAR(got[i], want, 1e-5 * (1.5 * magnitude + 1))
        << rows << "x" << cols << " trans=" << trans << " i=" << i << " threads=" << threads;
  }
  EXPECT_EQ(got[out], y[out]) << "wrote past the end";
  got.pop_back();
  return got;
}

// Shapes that take every path of the cpu GEMV: A^T x with one output over a long batch, outputs
// not a multiple of the 16-float vectors, 1 to 4 vectors and more, blocks of 256 outputs and
// part of one more, row ranges summed
// apart (the long batches); A x over column counts below, at and past 32, rows not a multiple of
// the 4-row tiles or the 64-row items. Each output's sum has one order: the bits at 2 and 3
// threads are those at 1.
TEST(Sgemv, LongAndWideShapesMatchTheReferenceAndNotTheThreadCount) {
#if !defined(GPUBOX_BACKEND_CUDA)
  // The long batches below are summed in several row ranges (else the test misses that path).
  EXPECT_GT(detail::transposed_row_chunks(4096, 1), 1);
  EXPECT_GT(detail::transposed_row_chunks(5001, 130), 1);
  EXPECT_GT(detail::transposed_row_chunks(2100, 600), 1);  // and several blocks
  EXPECT_EQ(detail::transposed_row_chunks(511, 1), 1);
#endif
  const std::tuple<bool, int64_t, int64_t> shapes[] = {
      {true, 4096, 1},   {true, 5001, 13},  {true, 1537, 64},  {true, 1025, 65}, {true, 5001, 130},
      {true, 3, 400},    {true, 511, 17},   {true, 40000, 2},  {true, 300, 257}, {true, 2100, 600},
      {true, 1024, 256}, {false, 4097, 13}, {false, 301, 400}, {false, 7, 33},   {false, 2001, 31},
      {false, 1, 1},     {false, 130, 32},  {false, 65, 64}};
  for (const auto& [trans, rows, cols] : shapes) {
    const std::vector<float> one = check_sgemv(trans, rows, cols, 1);
    for (int threads : {2, 3}) {
      EXPECT_EQ(check_sgemv(trans, rows, cols, threads), one)
          << rows << "x" << cols << " trans=" << trans << " at " << threads << " threads";
    }
  }
}

// sgemm_batched over `batch` matrices laid out with gaps (strides past each matrix), on a card of
// `threads` threads; returns C after the call and checks it against a float64 reference, the
// gaps untouched.
std::vector<float> check_batched(bool ta, bool tb, int m, int n, int k, int batch, int threads) {
  CardSet cards = CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  std::mt19937_64 rng(m * 1000 + n * 10 + k + batch * 100000 + ta * 7 + tb * 13);
  const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 1;
  const int64_t stride_a = (ta ? k : m) * lda + 3, stride_b = (tb ? n : k) * ldb + 1,
                stride_c = m * ldc + 2;
  std::vector<float> a = testing::random_vector(batch * stride_a + 1, rng);
  std::vector<float> b = testing::random_vector(batch * stride_b + 1, rng);
  std::vector<float> c = testing::random_vector(batch * stride_c + 1, rng);
  const float alpha = -1.25f, beta = 0.5f;
  auto da = device::to_device(a, card.memory(), card.stream());
  auto db = device::to_device(b, card.memory(), card.stream());
  auto dc = device::to_device(c, card.memory(), card.stream());
  blas.sgemm_batched(ta ? Transpose::kYes : Transpose::kNo, tb ? Transpose::kYes : Transpose::kNo,
                     m, n, k, alpha, da.data(), lda, stride_a, db.data(), ldb, stride_b, beta,
                     dc.data(), ldc, stride_c, batch);
  std::vector<float> got = device::to_host(dc);
  std::vector<double> want(c.begin(), c.end());  // the gaps and the padding stay as they were
  for (int64_t t = 0; t < batch; ++t) {
    const std::vector<float> at_a(a.begin() + t * stride_a, a.end());
    const std::vector<float> at_b(b.begin() + t * stride_b, b.end());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t col = 0; col < n; ++col) {
        double dot = 0;
        for (int64_t x = 0; x < k; ++x) dot += at(at_a, lda, ta, r, x) * at(at_b, ldb, tb, x, col);
        double& w = want[t * stride_c + r * ldc + col];
        w = alpha * dot + beta * w;
      }
    }
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
        << "m=" << m << " n=" << n << " k=" << k << " batch=" << batch << " ta=" << ta
        << " tb=" << tb << " at " << i;
  }
  return got;
}

TEST(SgemmBatched, MatchesFloat64ReferenceAndNotTheThreadCount) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (const auto& [m, n, k] :
           {std::tuple<int, int, int>{3, 4, 5}, {1, 1, 1}, {4, 3, 0}, {39, 32, 39}}) {
        for (int batch : {0, 1, 2, 7}) {
          const std::vector<float> one = check_batched(ta, tb, m, n, k, batch, 1);
          // Each matrix is one thread's: the bits do not depend on how many the card has.
          EXPECT_EQ(check_batched(ta, tb, m, n, k, batch, 2), one)
              << "m=" << m << " n=" << n << " k=" << k << " batch=" << batch;
        }
      }
    }
  }
}

// The start-up warning of a bf16 dense net whose GEMMs are slower than fp32's (bf16_speed.hpp):
// below a speedup of 1 only, naming the figure, the ISA and what to ask for instead.
TEST(Bf16Speed, WarnsOnlyWhereBf16IsTheSlowerChoice) {
  const std::string slower = bf16_speed_warning(0.54, "avx512_core_bf16");
  EXPECT_NE(slower.find("0.54x"), std::string::npos) << slower;
  EXPECT_NE(slower.find("avx512_core_bf16"), std::string::npos) << slower;
  EXPECT_NE(slower.find("dense_precision: fp32"), std::string::npos) << slower;
  EXPECT_FALSE(bf16_speed_warning(0.999, "avx512_core_bf16").empty());
  EXPECT_EQ(bf16_speed_warning(1.0, "avx512_core_bf16"), "");
  EXPECT_EQ(bf16_speed_warning(1.9, "avx512_core_bf16"), "");
}

// The measurement: a positive ratio, measured once a process (what DenseModel logs at start).
TEST(Bf16Speed, MeasuredOnceAProcessWhereTheCardHasBf16Gemms) {
  CardSet cards = CardSet::from_list("0", 0, 1, 1);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  if (blas.bf16() == Bf16Support::kNone) GTEST_SKIP() << "no bf16 GEMMs on " << blas.isa();
  const double speedup = bf16_gemm_speedup(blas, 64);
  EXPECT_TRUE(std::isfinite(speedup) && speedup > 0) << speedup;
  EXPECT_EQ(bf16_gemm_speedup(blas, 32), speedup);  // kept, not measured again
}

// A bf16 dense net on card 0 logs the warning at start exactly where the process's measured
// speedup calls for it (on this project's Intel avx512_core_bf16 VM it does: 0.4-0.6).
TEST(Bf16Speed, ABf16DenseNetWarnsAtStartWhereItsGemmsAreSlower) {
  CardSet cards = CardSet::from_list("0", 0, 1, 1);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  if (blas.bf16() != Bf16Support::kHardware) GTEST_SKIP() << "no bf16 hardware: " << blas.isa();
  const std::string expected = bf16_speed_warning(bf16_gemm_speedup(blas), blas.isa());
  Mutex mutex;
  std::vector<std::string> lines;
  set_log_sink([&](LogLevel, const std::string& line) {
    MutexLock lock(mutex);
    lines.push_back(line);
  });
  DenseModelConfig cfg;
  cfg.slots = 3;
  cfg.mf_dim = 2;
  cfg.fc_sizes = {4};
  cfg.precision = DensePrecision::kBf16;
  {
    const DenseModel model(card, cfg);
    EXPECT_EQ(model.precision(), DensePrecision::kBf16);
  }
  set_log_sink(nullptr);
  const bool logged = std::any_of(lines.begin(), lines.end(), [&](const std::string& line) {
    return !expected.empty() && line.find(expected) != std::string::npos;
  });
  EXPECT_EQ(logged, !expected.empty()) << expected;
}

}  // namespace
}  // namespace gpubox::trainer
