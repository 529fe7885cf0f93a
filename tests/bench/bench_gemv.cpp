// gpubox_bench gemv: Blas::sgemv (on cpu the fixed-order GEMV, trainer/nn/detail/
// fixed_order_gemv.hpp) against the same product as a one-column Blas::sgemm (on cpu oneDNN's
// gemv path, whose bits change with the thread count), per shape the dense net's GEMVs take:
// sums over the batch into few outputs (A^T x: the dense net's bias-like sums, the wide part's
// dense gradient) and one dot product per instance (A x). Microseconds per call, the median of
// --repeats timings of --calls calls each, and the bytes of A read per second.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/bench/bench_command.hpp"
#include "tests/bench/bench_timing.hpp"
#include "trainer/nn/blas.hpp"

namespace gpubox::bench {
namespace {

using trainer::Blas;
using trainer::Transpose;

struct GemvShape {
  bool trans;
  int64_t rows;
  int64_t cols;
};

// The dense net's shapes at batch 4096 (config_gpubox.yaml: 13 dense features, a 400-wide
// layer), and one large square.
const std::vector<GemvShape> kShapes = {{true, 4096, 1},    {true, 4096, 13},   {true, 4096, 64},
                                        {true, 4096, 400},  {false, 4096, 13},  {false, 4096, 400},
                                        {true, 2048, 2048}, {false, 2048, 2048}};

int run_gemv(const BenchArgs& args) {
  args.expect_only({"threads", "calls", "repeats", "json"});
  const int threads = static_cast<int>(args.get_int("threads", 0));
  const int calls = static_cast<int>(args.get_int("calls", 200));
  const int repeats = static_cast<int>(args.get_int("repeats", 7));
  const bool json = args.has("json");
  GPUBOX_EXPECTS(calls >= 1 && repeats >= 1, "--calls and --repeats must be positive");
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  Blas blas(card);
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& value : v) value = u(rng);
    return device::to_device(v, card.memory(), card.stream());
  };
  if (!json) {
    std::printf("gemv on %s, %d thread(s) a card, 1-minute load average %.2f\n", blas.isa().c_str(),
                card.threads(), load_average());
  }
  for (const GemvShape& shape : kShapes) {
    const int64_t in = shape.trans ? shape.rows : shape.cols;
    const int64_t out = shape.trans ? shape.cols : shape.rows;
    const auto a = random(shape.rows * shape.cols);
    const auto x = random(in);
    auto y = random(out);
    const Transpose t = shape.trans ? Transpose::kYes : Transpose::kNo;
    const double gemv_us = time_calls(card, calls, repeats, [&] {
                             blas.sgemv(t, shape.rows, shape.cols, 1.0f, a.data(), shape.cols,
                                        x.data(), 0.0f, y.data());
                           }).median_us;
    // op(A) [out x in] times x [in x 1] as a GEMM.
    const double gemm_us = time_calls(card, calls, repeats, [&] {
                             blas.sgemm(t, Transpose::kNo, out, 1, in, 1.0f, a.data(), shape.cols,
                                        x.data(), 1, 0.0f, y.data(), 1);
                           }).median_us;
    const double gb = 1e-9 * static_cast<double>(shape.rows * shape.cols) * sizeof(float);
    if (json) {
      std::printf(
          "{\"bench\": \"gemv\", \"trans\": %d, \"rows\": %lld, \"cols\": %lld, \"threads\": %d, "
          "\"sgemv_us\": %.3f, \"sgemm_n1_us\": %.3f, \"loadavg_1m\": %.2f}\n",
          shape.trans ? 1 : 0, static_cast<long long>(shape.rows),
          static_cast<long long>(shape.cols), card.threads(), gemv_us, gemm_us, load_average());
    } else {
      std::printf("  %s %5lld x %-5lld sgemv %9.2f us (%6.1f GB/s)  sgemm n=1 %9.2f us  (%.2fx)\n",
                  shape.trans ? "A^T x" : "A x  ", static_cast<long long>(shape.rows),
                  static_cast<long long>(shape.cols), gemv_us, gb / (gemv_us * 1e-6), gemm_us,
                  gemv_us / gemm_us);
    }
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("gemv",
                     "[--threads T] [--calls N] [--repeats R] [--json]: Blas::sgemv (the "
                     "fixed-order GEMV on cpu) against a one-column sgemm, per dense-net shape",
                     run_gemv);

}  // namespace
}  // namespace gpubox::bench
