#include "trainer/nn/bf16_speed.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"
#include "common/timer.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/blas.hpp"

namespace gpubox::trainer {
namespace {

// Seconds of the fastest of `calls` runs of `run` (each ended by the card's stream), after one
// untimed run (a primitive made at a shape's first call).
template <class Run>
double fastest_seconds(device::Card& card, int calls, Run run) {
  run();
  card.stream().synchronize();
  double best = 0;
  for (int i = 0; i < calls; ++i) {
    Timer timer;
    run();
    card.stream().synchronize();
    best = i == 0 ? timer.seconds() : std::min(best, timer.seconds());
  }
  return best;
}

double measure(Blas& blas, int n) {
  device::Card& card = blas.card();
  const auto count = static_cast<std::size_t>(n) * n;
  std::vector<float> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 7) * 0.125f - 0.375f;
  std::vector<Bf16> host16(count);
  std::transform(host.begin(), host.end(), host16.begin(), [](float x) { return to_bf16(x); });
  const auto a = device::to_device(host, card.memory(), card.stream());
  const auto a16 = device::to_device(host16, card.memory(), card.stream());
  auto c = card.make_buffer<float>(count);
  const auto fp32 = [&] {
    blas.sgemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f,
               c.data(), n);
  };
  const auto bf16 = [&] {
    blas.gemm_bf16(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a16.data(), n, a16.data(), n,
                   0.0f, c.data(), n);
  };
  // Interleaved rounds, so that a busy moment of the machine (another card's thread) hits both;
  // 3 rounds of one call each gave 0.22-0.26 in 2 of 10 runs where the rest gave 0.59-0.64 (2
  // cards on a loaded 2-core VM); 5 rounds of 2 calls gave 0.43-0.63 in 8 runs.
  constexpr int kRounds = 5;
  constexpr int kCalls = 2;
  double fp32_s = 0, bf16_s = 0;
  for (int round = 0; round < kRounds; ++round) {
    const double f = fastest_seconds(card, kCalls, fp32), b = fastest_seconds(card, kCalls, bf16);
    fp32_s = round == 0 ? f : std::min(fp32_s, f);
    bf16_s = round == 0 ? b : std::min(bf16_s, b);
  }
  return bf16_s > 0 ? fp32_s / bf16_s : 1.0;
}

// The process's measurement (0: none yet).
Mutex kept_mutex;
double kept_speedup GPUBOX_GUARDED_BY(kept_mutex) = 0;

}  // namespace

double bf16_gemm_speedup(Blas& blas, int n) {
  GPUBOX_EXPECTS(blas.bf16() != Bf16Support::kNone, "bf16_gemm_speedup on ", blas.isa(),
                 ", which has no bf16 GEMMs");
  GPUBOX_EXPECTS(n > 0, "bf16_gemm_speedup: size ", n);
  MutexLock lock(kept_mutex);
  if (kept_speedup == 0) kept_speedup = measure(blas, n);
  return kept_speedup;
}

std::string bf16_speed_warning(double speedup, const std::string& isa) {
  if (!(speedup < 1.0)) return "";
  char line[400];
  std::snprintf(line, sizeof(line),
                "this card's bf16 GEMMs run at %.2fx the rate of its fp32 GEMMs (%s, measured at "
                "start on a square GEMM; AVX512-BF16 without AMX on Intel CPUs does half fp32's "
                "work a cycle): the dense net will likely train slower in bf16 than in fp32 here "
                "(hyper_parameters.dense_precision: fp32; BENCHMARKS.md)",
                speedup, isa.c_str());
  return line;
}

}  // namespace gpubox::trainer
