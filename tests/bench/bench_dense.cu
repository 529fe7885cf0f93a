// gpubox_bench dense: the dense model's forward+backward throughput against the machine's GEMM
// limit, measured in the same run.
//
//   gpubox_bench dense --batch B [--precision fp32|bf16] [--config PATH] [--cards N] [--threads T]
//                      [--seconds S] [--json]
//
// 1. sgemm GFLOP/s through trainer::Blas (oneDNN on cpu, cuBLAS on cuda): a square
//    --gemm-n (default 1024) product, repeated on every card at once, summed over the cards.
//    Where the cards have bf16 GEMMs, the same square product in bf16 (fp32 accumulation)
//    through the layers' GEMM path (LinearGemms): the bf16 peak of this run.
// 2. The config_gpubox.yaml model (26 slots x (1 + 8) + 13 dense -> 512-256-128-32-1, dnn, no
//    cvm), or with --config the network a trainer config builds (a PaddleRec folder's
//    config.yaml: its network, widths and precision; --precision, when given, overrides it), doing
//    forward + backward (dense gradients and sparse push records) on a synthetic batch
//    of B instances per card, one key per slot, every card at once: examples/s of all cards.
//    --precision picks hyper_parameters.dense_precision (bf16 falls back to fp32, and says so,
//    where the cards have no bf16 GEMMs).
// 3. The limit: sgemm GFLOP/s / (model FLOPs per example: 2 x the multiply-adds of its linear
//    layers' forward, weight-gradient and input-gradient GEMMs) and the fraction of it the model
//    reaches: the fp32 FLOP limit, also for a bf16 run (above 1 = faster than any fp32 run).
// Figures are medians of --repeats timed windows of --seconds each, after a warm-up.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/timer.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/bench/bench_command.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::bench {
namespace {
using trainer::Blas;
using trainer::DenseBatchView;
using trainer::DenseModel;
using trainer::DenseModelConfig;
using trainer::GradScales;
using trainer::SlotBatchView;
using trainer::Transpose;

// Runs `step` on every card at once for about `seconds`; returns the summed rate of all cards
// (units per second, `units` per step per card). Every card does the same number of steps so
// none idles while the others finish.
template <class Step>
double timed_rate(device::CardSet& cards, double seconds, double units, Step&& step) {
  // Calibrate the step count on one step per card.
  Timer calibrate;
  cards.run_on_cards([&](device::Card& card) { step(card); });
  const double one = std::max(calibrate.seconds(), 1e-6);
  const int steps = std::max(1, static_cast<int>(seconds / one));
  Timer timer;
  cards.run_on_cards([&](device::Card& card) {
    for (int s = 0; s < steps; ++s) step(card);
    card.stream().synchronize();
  });
  return units * steps * cards.num_local_cards() / timer.seconds();
}

struct CardState {
  std::unique_ptr<Blas> blas;
  std::unique_ptr<trainer::LinearGemms> bf16_gemm;  // when the card has bf16 GEMMs
  device::device_buffer<trainer::Bf16> a16, b16;
  std::unique_ptr<DenseModel> model;
  device::device_buffer<float> a, b, c;
  device::device_buffer<float> records, dense, labels, push;
  device::device_buffer<uint32_t> offsets;
};

// The model to time: config_gpubox.yaml's default dnn in fp32, or the dense model that --config
// PATH (as gpubox_train reads it, no overrides) builds at its precision; --precision, when given,
// picks the precision either way.
DenseModelConfig bench_model_config(const BenchArgs& args) {
  DenseModelConfig config;
  const std::string path = args.get("config", "");
  if (!path.empty()) {
    auto loaded = trainer::load_trainer_config(path);
    GPUBOX_EXPECTS(loaded.ok(), "--config ", path, ": ", loaded.status().to_string());
    config = loaded->dense_model_config();
  }
  if (args.has("precision")) {
    const std::string precision_name = args.get("precision", "fp32");
    GPUBOX_EXPECTS(precision_name == "fp32" || precision_name == "bf16",
                   "--precision is fp32 or bf16, got ", precision_name);
    config.precision =
        precision_name == "bf16" ? trainer::DensePrecision::kBf16 : trainer::DensePrecision::kFp32;
  }
  return config;
}

// "dnn 26 slots x 9 + 13 dense", the network's name first.
std::string model_line(const DenseModelConfig& config) {
  return std::string(name_of(trainer::kModelKindNames, config.kind)) + " " +
         std::to_string(config.slots) + " slots x " + std::to_string(1 + config.mf_dim) + " + " +
         std::to_string(config.dense_dim) + " dense";
}

// Card `card`'s state: its BLAS handle and model, the square GEMM's operands (and, where the card
// has bf16 GEMMs, their bf16 copies and the bf16 GEMM), and a synthetic batch of `batch`
// instances, one key per slot, with its labels and push records. Seeded by the card.
void prepare_card(device::Card& card, const DenseModelConfig& config, int64_t batch, int64_t gemm_n,
                  CardState* state) {
  CardState& s = *state;
  s.blas = std::make_unique<Blas>(card);
  s.model = std::make_unique<DenseModel>(card, config);
  std::mt19937_64 rng(17 + card.local_index());
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return device::to_device(v, card.memory(), card.stream());
  };
  const std::size_t n2 = static_cast<std::size_t>(gemm_n) * gemm_n;
  s.a = random(n2);
  s.b = random(n2);
  s.c = random(n2);
  if (s.blas->bf16() != trainer::Bf16Support::kNone) {
    std::vector<trainer::Bf16> a16(n2), b16(n2);
    for (auto& x : a16) x = trainer::to_bf16(u(rng));
    for (auto& x : b16) x = trainer::to_bf16(u(rng));
    s.a16 = device::to_device(a16, card.memory(), card.stream());
    s.b16 = device::to_device(b16, card.memory(), card.stream());
    trainer::LinearGemmSpec spec;
    spec.name = "bf16 peak";
    spec.in = spec.out = static_cast<int>(gemm_n);
    spec.input = trainer::ElementType::kBf16;
    spec.x_ld = spec.y_ld = spec.dz_ld = gemm_n;
    s.bf16_gemm = std::make_unique<trainer::LinearGemms>(*s.blas, spec);
    s.bf16_gemm->prepare(gemm_n);
  }
  // One key per slot per instance (Criteo-like): slot-major offsets 0, 1, 2, ...
  const std::size_t occurrences = static_cast<std::size_t>(batch) * config.slots;
  const int pull_dim = s.model->pool().pull_dim();
  std::vector<float> records(occurrences * pull_dim);
  for (std::size_t j = 0; j < occurrences; ++j) {
    records[j * pull_dim] = 3.0f;
    records[j * pull_dim + 1] = 1.0f;
    for (int k = 2; k < pull_dim; ++k) records[j * pull_dim + k] = u(rng);
  }
  s.records = device::to_device(records, card.memory(), card.stream());
  std::vector<uint32_t> offsets(occurrences + 1);
  for (std::size_t j = 0; j <= occurrences; ++j) offsets[j] = static_cast<uint32_t>(j);
  s.offsets = device::to_device(offsets, card.memory(), card.stream());
  s.dense = random(static_cast<std::size_t>(batch) * config.dense_dim);
  std::vector<float> labels(batch);
  for (auto& y : labels) y = static_cast<float>(rng() % 4 == 0);
  s.labels = device::to_device(labels, card.memory(), card.stream());
  s.push = card.make_buffer<float>(occurrences * s.model->pool().push_dim());
}

// Each timed window's rate, one per repeat: the square sgemm's and the bf16 GEMM's GFLOP/s (the
// latter empty where the cards have no bf16 GEMMs) and the model's examples/s, all cards.
struct DenseRates {
  std::vector<double> gflops, bf16_gflops, examples;
};

// A warm-up of each, then `repeats` rounds of one window of `seconds` each: the sgemm, the bf16
// GEMM, the model's forward+backward on batches of `batch` per card.
DenseRates time_dense(device::CardSet& cards, std::vector<CardState>& state,
                      const DenseModelConfig& config, int64_t batch, int64_t gemm_n, double seconds,
                      int repeats) {
  auto gemm_step = [&](device::Card& card) {
    CardState& s = state[card.local_index()];
    s.blas->sgemm(Transpose::kNo, Transpose::kNo, gemm_n, gemm_n, gemm_n, 1.0f, s.a.data(), gemm_n,
                  s.b.data(), gemm_n, 0.0f, s.c.data(), gemm_n);
  };
  auto bf16_step = [&](device::Card& card) {
    CardState& s = state[card.local_index()];
    // C = A B + bias (any n floats: B's first row).
    s.bf16_gemm->forward(s.a16.data(), s.b16.data(), s.b.data(), nullptr, s.c.data(), gemm_n);
  };
  const bool has_bf16 = state[0].bf16_gemm != nullptr;
  const GradScales scales{1.0f / static_cast<float>(batch * cards.num_local_cards()), 1.0f};
  auto model_step = [&](device::Card& card) {
    CardState& s = state[card.local_index()];
    const DenseBatchView view{
        SlotBatchView{s.records.data(), s.offsets.data(), batch, config.slots}, s.dense.data(),
        s.labels.data(), batch};
    s.model->forward_backward(view, scales, s.push.data());
  };

  const double gemm_flops = 2.0 * gemm_n * gemm_n * gemm_n;
  timed_rate(cards, seconds * 0.25, gemm_flops, gemm_step);  // warm-up
  timed_rate(cards, seconds * 0.25, static_cast<double>(batch), model_step);
  if (has_bf16) timed_rate(cards, seconds * 0.25, gemm_flops, bf16_step);
  DenseRates rates;
  for (int r = 0; r < repeats; ++r) {
    rates.gflops.push_back(timed_rate(cards, seconds, gemm_flops, gemm_step) / 1e9);
    if (has_bf16) {
      rates.bf16_gflops.push_back(timed_rate(cards, seconds, gemm_flops, bf16_step) / 1e9);
    }
    rates.examples.push_back(timed_rate(cards, seconds, static_cast<double>(batch), model_step));
  }
  return rates;
}

// What gpubox_bench dense prints: the run's settings and machine, and the medians (with the
// extremes) of its rates.
struct DenseReport {
  const char* backend;
  std::string isa;
  std::string precision_asked;
  const char* precision;  // the model's
  const char* bf16_support;
  long long batch;
  int cards;
  int threads_per_card;
  int hardware_threads;
  std::string wait_policy;  // OMP_WAIT_POLICY
  long long gemm_n;
  std::string model;
  bool has_bf16;
  double gflops_median, gflops_min, gflops_max, bf16_median;
  double flops_per_example, limit;
  double examples_median, examples_min, examples_max;
};

DenseReport dense_report(const DenseRates& rates, const CardState& card0, device::Card& card,
                         const std::string& precision_asked, const std::string& model) {
  DenseReport r{};
  r.gflops_median = median(rates.gflops);
  r.examples_median = median(rates.examples);
  r.flops_per_example = card0.model->flops_per_example();
  r.limit = r.gflops_median * 1e9 / r.flops_per_example;
  r.has_bf16 = card0.bf16_gemm != nullptr;
  r.bf16_median = r.has_bf16 ? median(rates.bf16_gflops) : 0.0;
  r.precision = card0.model->precision() == trainer::DensePrecision::kBf16 ? "bf16" : "fp32";
  r.bf16_support = card0.blas->bf16() == trainer::Bf16Support::kHardware ? "hardware"
                   : card0.blas->bf16() == trainer::Bf16Support::kEmulated
                       ? "emulated (GPUBOX_BF16_EMULATION=1)"
                       : "none";
  r.isa = card0.blas->isa();
  r.threads_per_card = card.threads();
  r.hardware_threads = device::hardware_threads();
  // Spinning OpenMP workers decide multi-thread figures on a busy machine: say which was used.
  const char* wait_env = std::getenv("OMP_WAIT_POLICY");
  r.wait_policy = wait_env != nullptr ? wait_env : "default";
#if defined(GPUBOX_BACKEND_CUDA)
  r.backend = "cuda";
#else
  r.backend = "cpu";
#endif
  r.precision_asked = precision_asked;
  r.model = model;
  r.gflops_min = *std::min_element(rates.gflops.begin(), rates.gflops.end());
  r.gflops_max = *std::max_element(rates.gflops.begin(), rates.gflops.end());
  r.examples_min = *std::min_element(rates.examples.begin(), rates.examples.end());
  r.examples_max = *std::max_element(rates.examples.begin(), rates.examples.end());
  return r;
}

void print_dense_json(const DenseReport& r) {
  std::printf(
      "{\"bench\": \"dense\", \"backend\": \"%s\", \"isa\": \"%s\", "
      "\"precision_asked\": \"%s\", \"precision\": \"%s\", \"bf16_gemms\": \"%s\", "
      "\"batch\": %lld, \"cards\": %d, "
      "\"threads_per_card\": %d, \"hardware_threads\": %d, \"omp_wait_policy\": \"%s\", "
      "\"gemm_n\": %lld, "
      "\"sgemm_gflops\": %.2f, \"sgemm_gflops_min\": %.2f, \"sgemm_gflops_max\": %.2f, "
      "\"bf16_gemm_gflops\": %.2f, "
      "\"model\": \"%s\", "
      "\"flops_per_example\": %.0f, \"flop_limit_examples_per_sec\": %.1f, "
      "\"examples_per_sec\": %.1f, \"examples_per_sec_min\": %.1f, "
      "\"examples_per_sec_max\": %.1f, \"fraction_of_limit\": %.4f}\n",
      r.backend, r.isa.c_str(), r.precision_asked.c_str(), r.precision, r.bf16_support, r.batch,
      r.cards, r.threads_per_card, r.hardware_threads, r.wait_policy.c_str(), r.gemm_n,
      r.gflops_median, r.gflops_min, r.gflops_max, r.bf16_median, r.model.c_str(),
      r.flops_per_example, r.limit, r.examples_median, r.examples_min, r.examples_max,
      r.examples_median / r.limit);
}

void print_dense_text(const DenseReport& r) {
  std::printf(
      "dense bench (%s backend, %d card(s) x %d thread(s), %d hardware threads, "
      "OMP_WAIT_POLICY %s)\n",
      r.backend, r.cards, r.threads_per_card, r.hardware_threads, r.wait_policy.c_str());
  std::printf("  sgemm %lldx%lldx%lld: %.2f GFLOP/s (all cards; min %.2f, max %.2f)\n", r.gemm_n,
              r.gemm_n, r.gemm_n, r.gflops_median, r.gflops_min, r.gflops_max);
  std::printf("  GEMMs on %s; bf16 GEMMs: %s; dense net runs in %s (asked: %s)\n", r.isa.c_str(),
              r.bf16_support, r.precision, r.precision_asked.c_str());
  if (r.has_bf16) {
    std::printf("  bf16 gemm %lldx%lldx%lld: %.2f GFLOP/s (all cards)\n", r.gemm_n, r.gemm_n,
                r.gemm_n, r.bf16_median);
  }
  std::printf("  model %s: %.0f FLOPs/example\n", r.model.c_str(), r.flops_per_example);
  std::printf("  forward+backward, batch %lld per card: %.1f examples/s (min %.1f, max %.1f)\n",
              r.batch, r.examples_median, r.examples_min, r.examples_max);
  std::printf("  FLOP limit: %.1f examples/s; reached %.1f%% of it\n", r.limit,
              100.0 * r.examples_median / r.limit);
}

int run_dense(const BenchArgs& args) {
  args.expect_only(
      {"batch", "precision", "cards", "threads", "seconds", "repeats", "gemm-n", "config", "json"});
  const int64_t batch = args.get_int("batch", 512);
  const int num_cards = static_cast<int>(args.get_int("cards", 1));
  const int threads = static_cast<int>(args.get_int("threads", 0));
  const double seconds = args.get_double("seconds", 1.0);
  const int repeats = static_cast<int>(args.get_int("repeats", 3));
  const int64_t gemm_n = args.get_int("gemm-n", 1024);
  const bool json = args.has("json");
  const DenseModelConfig config = bench_model_config(args);
  const std::string precision_name =
      config.precision == trainer::DensePrecision::kBf16 ? "bf16" : "fp32";
  const std::string model = model_line(config);
  GPUBOX_EXPECTS(batch >= 1 && num_cards >= 1 && repeats >= 1 && gemm_n >= 1,
                 "--batch, --cards, --repeats and --gemm-n must be positive");

  std::string list;
  for (int c = 0; c < num_cards; ++c) list += (c ? "," : "") + std::to_string(c);
  device::CardSet cards = device::CardSet::from_list(list, 0, 1, threads);
  std::vector<CardState> state(num_cards);
  cards.run_on_cards([&](device::Card& card) {
    prepare_card(card, config, batch, gemm_n, &state[card.local_index()]);
  });
  const DenseRates rates = time_dense(cards, state, config, batch, gemm_n, seconds, repeats);
  DenseReport report = dense_report(rates, state[0], cards.card(0), precision_name, model);
  report.batch = static_cast<long long>(batch);
  report.cards = num_cards;
  report.gemm_n = static_cast<long long>(gemm_n);
  if (json) {
    print_dense_json(report);
  } else {
    print_dense_text(report);
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("dense",
                     "--batch B [--precision fp32|bf16] [--cards N] [--threads T] [--seconds S] "
                     "[--repeats R] [--gemm-n N] [--config PATH] [--json]: dense model "
                     "forward+backward examples/s vs the sgemm FLOP limit (--config: the network "
                     "a trainer config builds)",
                     run_dense);

}  // namespace
}  // namespace gpubox::bench
