// Metrics: bucketed AUC against an exact sort-based AUC (ties included), the other metrics
// against float64 references, merging of per-card buffers, and the pass line / JSON formats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <regex>

#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/metrics/metrics.hpp"

namespace gpubox::trainer {
namespace {

// Exact AUC: the probability that a random positive outranks a random negative, ties 1/2.
double exact_auc(const std::vector<float>& p, const std::vector<float>& y) {
  std::vector<std::size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  double negatives_below = 0, pairs = 0, positives = 0, negatives = 0;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    double pos = 0, neg = 0;
    while (j < order.size() && p[order[j]] == p[order[i]]) {
      (y[order[j]] > 0.5f ? pos : neg) += 1;
      ++j;
    }
    pairs += pos * (negatives_below + 0.5 * neg);
    negatives_below += neg;
    positives += pos;
    negatives += neg;
    i = j;
  }
  return pairs / (positives * negatives);
}

struct Data {
  std::vector<float> preds, labels;
};

// Labels drawn from the predictions (a calibrated model) so the AUC is well above 0.5.
Data make_data(std::size_t n, uint64_t seed, int quantize_levels = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Data d;
  for (std::size_t i = 0; i < n; ++i) {
    float p = u(rng) * u(rng);
    if (quantize_levels > 0) p = std::floor(p * quantize_levels) / quantize_levels;
    d.preds.push_back(p);
    d.labels.push_back(u(rng) < p ? 1.0f : 0.0f);
  }
  return d;
}

class MetricsTest : public ::testing::Test {
 protected:
  // Two cards where the machine has them (one test merges two cards' buffers; it skips on a
  // one-GPU machine).
  MetricsTest()
      : cards_(
            device::CardSet::from_list(device::testing::missing_cards(2).empty() ? "0,1" : "0")) {
    cards_.card(0).activate();
  }
  void add(MetricsAccumulator& acc, device::Card& card, const Data& d, std::size_t lo,
           std::size_t hi, bool steady = false) {
    std::vector<float> p(d.preds.begin() + lo, d.preds.begin() + hi);
    std::vector<float> y(d.labels.begin() + lo, d.labels.begin() + hi);
    auto dp = device::to_device(p, card.memory(), card.stream());
    auto dy = device::to_device(y, card.memory(), card.stream());
    acc.add(dp.data(), dy.data(), static_cast<int64_t>(hi - lo), steady);
    card.stream().synchronize();
  }
  device::CardSet cards_;
};

TEST_F(MetricsTest, BucketedAucMatchesExactAucOnContinuousPredictions) {
  for (uint64_t seed : {1, 2, 3}) {
    const Data d = make_data(20000, seed);
    MetricsAccumulator acc(cards_.card(0));
    EXPECT_GE(acc.buckets(), std::size_t{1} << 20);
    // Several batches, including empty and single-example ones.
    add(acc, cards_.card(0), d, 0, 0);
    add(acc, cards_.card(0), d, 0, 1);
    add(acc, cards_.card(0), d, 1, 5000);
    add(acc, cards_.card(0), d, 5000, d.preds.size());
    const MetricValues m = acc.compute();
    EXPECT_NEAR(m.auc, exact_auc(d.preds, d.labels), 1e-5) << "seed " << seed;
    EXPECT_GT(m.auc, 0.6);
  }
}

// The steady sums (the divergence check's) hold exactly the batches added as steady, against a
// float64 reference; the pass's other figures hold every batch.
TEST_F(MetricsTest, SteadyLossSumsOnlyTheSteadyBatches) {
  const Data d = make_data(9000, 5);
  MetricsAccumulator acc(cards_.card(0));
  add(acc, cards_.card(0), d, 0, 3000);  // the warm-up
  add(acc, cards_.card(0), d, 3000, 6000, true);
  add(acc, cards_.card(0), d, 6000, d.preds.size(), true);
  const MetricValues m = acc.compute();
  double positives = 0, logloss = 0;
  for (std::size_t i = 3000; i < d.preds.size(); ++i) {
    const double p = std::min(std::max(static_cast<double>(d.preds[i]), 1e-7), 1 - 1e-7);
    positives += d.labels[i];
    logloss -= d.labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  EXPECT_EQ(m.examples, 9000);
  EXPECT_EQ(m.steady.examples, 6000);
  EXPECT_EQ(m.steady.positives, positives);
  EXPECT_NEAR(m.steady.logloss_sum, logloss, 1e-9 * logloss);
  const double c = positives / 6000;
  const double entropy = -(c * std::log(c) + (1 - c) * std::log(1 - c));
  EXPECT_NEAR(m.steady.ratio_to_constant(), logloss / 6000 / entropy, 1e-12);
  acc.reset();
  EXPECT_EQ(acc.compute().steady.examples, 0);
}

// The dead-output check's neighbour pairs: a steady batch of n instances adds n - 1 pairs, and
// those whose predictions differ by less than one bucket as tied; the warm-up and empty batches
// add none, nor does one instance; a NaN ties with nothing; pairs across batches are not pairs.
TEST_F(MetricsTest, SteadyNeighbourPairsAndTiesAreCountedPerBatch) {
  MetricsAccumulator acc(cards_.card(0), 10);
  const float width = 1.0f / 1024;
  const auto put = [&](std::vector<float> preds, bool steady) {
    Data d;
    d.preds = std::move(preds);
    for (std::size_t i = 0; i < d.preds.size(); ++i) d.labels.push_back(i % 3 == 0 ? 1.0f : 0.0f);
    add(acc, cards_.card(0), d, 0, d.preds.size(), steady);
  };
  put({0.3f, 0.3f, 0.3f}, false);  // the warm-up: not counted
  put({}, true);
  put({0.3f}, true);  // one instance: no pair
  // 4 pairs: tied (within half a bucket), apart (1.5 buckets), NaN on either side.
  put({0.4f, 0.4f + 0.5f * width, 0.4f + 2.0f * width, std::nanf(""), 0.5f}, true);
  put({0.5f, 0.5f}, true);  // 1 tied pair (0.5 also ended the batch before: not a pair)
  std::vector<float> many(64, 0.25f);
  many[10] = 0.75f;  // one instance singled out: 2 of its 63 pairs not tied
  put(many, true);
  const MetricValues m = acc.compute();
  EXPECT_EQ(m.steady.pairs, 4 + 1 + 63);
  EXPECT_EQ(m.steady.tied_pairs, 1 + 1 + 61);
  EXPECT_EQ(m.steady.examples, 1 + 5 + 2 + 64);
  acc.reset();
  const MetricValues none = acc.compute();
  EXPECT_EQ(none.steady.pairs, 0);
  EXPECT_EQ(none.steady.tied_pairs, 0);
}

TEST_F(MetricsTest, TiesCountOneHalfLikeTheExactAuc) {
  // 17 distinct values, each on a bucket boundary: every tie falls in one bucket.
  const Data d = make_data(5000, 7, 16);
  MetricsAccumulator acc(cards_.card(0));
  add(acc, cards_.card(0), d, 0, d.preds.size());
  EXPECT_NEAR(acc.compute().auc, exact_auc(d.preds, d.labels), 1e-12);
  // All predictions equal: AUC 0.5 exactly.
  Data flat{std::vector<float>(100, 0.3f), {}};
  for (int i = 0; i < 100; ++i) flat.labels.push_back(static_cast<float>(i % 3 == 0));
  MetricsAccumulator acc2(cards_.card(0));
  add(acc2, cards_.card(0), flat, 0, 100);
  EXPECT_DOUBLE_EQ(acc2.compute().auc, 0.5);
}

TEST_F(MetricsTest, OtherMetricsMatchFloat64Reference) {
  Data d = make_data(3001, 11);
  d.preds[0] = 0.0f;  // clipped in the log loss
  d.labels[0] = 1.0f;
  d.preds[1] = 1.0f;
  d.labels[1] = 0.0f;
  MetricsAccumulator acc(cards_.card(0));
  add(acc, cards_.card(0), d, 0, d.preds.size());
  const MetricValues m = acc.compute();
  double n = d.preds.size(), pos = 0, psum = 0, ll = 0, ae = 0, se = 0;
  for (std::size_t i = 0; i < d.preds.size(); ++i) {
    const double p = std::min(std::max<double>(d.preds[i], 1e-7), 1 - 1e-7), y = d.labels[i];
    pos += y;
    psum += d.preds[i];
    ll += -(y * std::log(p) + (1 - y) * std::log(1 - p));
    ae += std::fabs(d.preds[i] - y);
    se += (d.preds[i] - y) * (d.preds[i] - y);
  }
  const double ctr = pos / n;
  EXPECT_EQ(m.examples, n);
  EXPECT_EQ(m.positives, pos);
  EXPECT_NEAR(m.actual_ctr, ctr, 1e-12);
  EXPECT_NEAR(m.predicted_ctr, psum / n, 1e-9);
  EXPECT_NEAR(m.logloss, ll / n, 1e-9);
  EXPECT_NEAR(m.ne, (ll / n) / -(ctr * std::log(ctr) + (1 - ctr) * std::log(1 - ctr)), 1e-9);
  EXPECT_NEAR(m.copc, pos / psum, 1e-9);
  EXPECT_NEAR(m.mae, ae / n, 1e-9);
  EXPECT_NEAR(m.rmse, std::sqrt(se / n), 1e-9);
}

// add() is the histogram and the sums' fold, which adds them in from its last level (issue 31,
// item 4: the one-thread tail kernel after the fold is gone): 1 + levels launches, no host wait,
// no allocation once reserve(n) ran; the sums over several batches, one of three fold levels,
// still match the float64 reference.
TEST_F(MetricsTest, AddIsTheHistogramAndTheFoldWithNoTailKernel) {
  device::Card& card = cards_.card(0);
  const Data d = make_data(70000, 21);
  MetricsAccumulator acc(card);
  acc.reserve(static_cast<int64_t>(d.preds.size()));
  auto dp = device::to_device(d.preds, card.memory(), card.stream());
  auto dy = device::to_device(d.labels, card.memory(), card.stream());
  struct Batch {
    std::size_t lo, hi;
    uint64_t launches;  // the histogram, then a launch per fold level
  };
  for (const Batch& b :
       {Batch{0, 1, 2}, Batch{1, 257, 2}, Batch{257, 2000, 3}, Batch{2000, d.preds.size(), 4}}) {
    const device::DeviceCounts before = card.counts();
    acc.add(dp.data() + b.lo, dy.data() + b.lo, static_cast<int64_t>(b.hi - b.lo));
    const device::DeviceCounts used = card.counts() - before;
    EXPECT_EQ(used.launches, b.launches) << b.hi - b.lo << " examples";
    EXPECT_EQ(used.host_syncs, 0u);
    EXPECT_EQ(used.allocations, 0u);
  }
  const MetricValues m = acc.compute();
  double pos = 0, psum = 0, se = 0;
  for (std::size_t i = 0; i < d.preds.size(); ++i) {
    pos += d.labels[i];
    psum += d.preds[i];
    se += (d.preds[i] - static_cast<double>(d.labels[i])) *
          (d.preds[i] - static_cast<double>(d.labels[i]));
  }
  const double n = static_cast<double>(d.preds.size());
  EXPECT_EQ(m.examples, n);
  EXPECT_EQ(m.positives, pos);
  EXPECT_NEAR(m.predicted_ctr, psum / n, 1e-9);
  EXPECT_NEAR(m.rmse, std::sqrt(se / n), 1e-9);
}

TEST_F(MetricsTest, TwoCardsMergedEqualOneCardWithEverything) {
  GPUBOX_REQUIRE_CARDS(2);
  const Data d = make_data(10001, 21);
  MetricsAccumulator whole(cards_.card(0));
  add(whole, cards_.card(0), d, 0, d.preds.size());
  MetricsAccumulator a(cards_.card(0)), b(cards_.card(1));
  add(a, cards_.card(0), d, 0, 4000);
  add(b, cards_.card(1), d, 4000, d.preds.size());
  // The all-reduce (sum) of the flat buffers, done here on the host.
  std::vector<double> fa = device::to_host(a.flat(), a.flat_size(), cards_.card(0).stream());
  std::vector<double> fb = device::to_host(b.flat(), b.flat_size(), cards_.card(1).stream());
  ASSERT_EQ(fa.size(), metrics_flat_size(a.buckets()));
  for (std::size_t i = 0; i < fa.size(); ++i) fa[i] += fb[i];
  const MetricValues merged = compute_metrics(fa.data(), a.buckets());
  const MetricValues w = whole.compute();
  EXPECT_EQ(merged.examples, w.examples);
  EXPECT_EQ(merged.positives, w.positives);
  EXPECT_DOUBLE_EQ(merged.auc, w.auc);
  EXPECT_NEAR(merged.logloss, w.logloss, 1e-12);
  EXPECT_NEAR(merged.predicted_ctr, w.predicted_ctr, 1e-12);
  EXPECT_NEAR(merged.rmse, w.rmse, 1e-12);
  EXPECT_NEAR(merged.mae, w.mae, 1e-12);
  EXPECT_NEAR(merged.ne, w.ne, 1e-12);
}

// The histogram is exact whatever the spread of the predictions: all equal (one slot takes
// every example: the old hot spot), a few values interleaved (more than the registers an item
// holds), all distinct, NaN and out-of-range values, and sizes around the item length.
TEST_F(MetricsTest, HistogramCountsExactlyForCollapsedAndSpreadPredictions) {
  std::mt19937_64 rng(5);
  std::vector<Data> cases;
  for (std::size_t n : {1, 63, 64, 65, 10007}) cases.push_back({std::vector<float>(n, 0.5f), {}});
  Data few;
  for (int i = 0; i < 5000; ++i) few.preds.push_back(0.1f * static_cast<float>(1 + i % 7));
  cases.push_back(few);
  cases.push_back(make_data(20000, 9));
  cases.push_back({{-1.0f, 2.0f, std::nanf(""), 1.0f, 0.0f, 0.99999994f}, {}});
  for (Data& d : cases) {
    d.labels.clear();
    for (std::size_t i = 0; i < d.preds.size(); ++i) d.labels.push_back(float(rng() % 3 == 0));
    MetricsAccumulator acc(cards_.card(0), 12);
    const std::size_t buckets = acc.buckets();
    add(acc, cards_.card(0), d, 0, d.preds.size());
    add(acc, cards_.card(0), d, 0, d.preds.size() / 2);
    std::vector<double> want(2 * buckets, 0.0);
    auto count = [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) {
        const float p = d.preds[i];
        std::size_t b = 0;
        if (p >= 1.0f) {
          b = buckets - 1;
        } else if (p > 0.0f) {
          b = std::min<std::size_t>(buckets - 1, static_cast<std::size_t>(double(p) * buckets));
        }
        want[(d.labels[i] > 0.5f ? buckets : 0) + b] += 1;
      }
    };
    count(0, d.preds.size());
    count(0, d.preds.size() / 2);
    const auto got = device::to_host(acc.flat(), 2 * buckets, cards_.card(0).stream());
    ASSERT_EQ(got, want) << d.preds.size() << " predictions";
  }
}

// Every figure of a batch is summed in a fixed order: the flat buffer has the same bits with one
// thread per card and with two.
TEST(MetricsDeterminism, SameBitsWithOneAndTwoThreads) {
  const Data d = make_data(50001, 13);
  std::vector<std::vector<double>> flats;
  for (int threads : {1, 2}) {
    device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
    device::Card& card = cards.card(0);
    card.activate();
    MetricsAccumulator acc(card);
    auto dp = device::to_device(d.preds, card.memory(), card.stream());
    auto dy = device::to_device(d.labels, card.memory(), card.stream());
    acc.add(dp.data(), dy.data(), static_cast<int64_t>(d.preds.size()));
    acc.add(dp.data(), dy.data(), 777);
    flats.push_back(device::to_host(acc.flat(), acc.flat_size(), card.stream()));
  }
  ASSERT_EQ(flats[0].size(), flats[1].size());
  EXPECT_EQ(0, std::memcmp(flats[0].data(), flats[1].data(), flats[0].size() * sizeof(double)));
}

TEST_F(MetricsTest, EmptyAndSingleClassAreUndefinedNotCrashes) {
  MetricsAccumulator acc(cards_.card(0));
  MetricValues m = acc.compute();
  EXPECT_EQ(m.examples, 0);
  EXPECT_TRUE(std::isnan(m.auc));
  EXPECT_TRUE(std::isnan(m.logloss));
  Data ones{{0.2f, 0.9f, std::nanf("")}, {1, 1, 1}};
  add(acc, cards_.card(0), ones, 0, 3);
  m = acc.compute();
  EXPECT_EQ(m.examples, 3);
  EXPECT_TRUE(std::isnan(m.auc));  // no negatives
  EXPECT_TRUE(std::isnan(m.ne));   // actual ctr 1
  acc.reset();
  EXPECT_EQ(acc.compute().examples, 0);
}

TEST(MetricsFormat, PassLineAndJson) {
  PassReport r;
  r.pass = 3;
  r.seconds = 2.0;
  r.cards = 2;
  r.metrics.examples = 1000;
  r.metrics.auc = 0.75;
  r.metrics.logloss = 0.5;
  r.metrics.ne = 0.9;
  r.metrics.actual_ctr = 0.25;
  r.metrics.predicted_ctr = 0.24;
  r.metrics.copc = 0.25 / 0.24;
  r.metrics.mae = 0.3;
  r.metrics.rmse = std::nan("");
  r.extra = {{"pulled_keys", 12345}};
  const std::string line = format_pass_line(r);
  EXPECT_EQ(line.rfind("pass: 3, using time: 2.000 second, ips: 500.0 example/sec, auc: 0.750000, "
                       "logloss: 0.500000, ne: 0.900000, actual_ctr: 0.250000, predicted_ctr: "
                       "0.240000",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find("ips_per_card: 250.0"), std::string::npos) << line;
  EXPECT_NE(line.find("rmse: nan"), std::string::npos) << line;
  EXPECT_NE(line.find(", pulled_keys: 12345"), std::string::npos) << line;
  const std::string json = format_pass_json(r);
  EXPECT_TRUE(std::regex_match(
      json, std::regex(R"(\{"pass": 3(, "[a-z_]+": [-0-9.e+]+|, "[a-z_]+": null)*\})")))
      << json;
  EXPECT_NE(json.find("\"auc\": 0.75"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rmse\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"ips\": 500"), std::string::npos) << json;
  EXPECT_EQ(json.find('\n'), std::string::npos);
}

// The test line of a one-class test set (AUC undefined) is JSON too: every metrics writer goes
// through the same number formatter.
TEST(MetricsFormat, TestJsonWritesUndefinedAsNull) {
  MetricValues test;
  test.auc = std::nan("");
  test.logloss = 0.25;
  test.examples = 40;
  EXPECT_EQ(format_test_json(2, test),
            "{\"epoch\": 2, \"test_auc\": null, \"test_logloss\": 0.25, \"test_examples\": 40}");
  test.logloss = std::numeric_limits<double>::infinity();
  EXPECT_NE(format_test_json(0, test).find("\"test_logloss\": null"), std::string::npos);
}

TEST(MetricsFormat, ProgressLine) {
  // 30 of 120 batches in 10 s: the other 90 take 30 s.
  EXPECT_EQ(format_progress_line(2, 30, 120, 12345.67, 0.70123, 10.0),
            "pass 2: 30/120 batches (25.0%), 12345.7 example/sec, auc: 0.701230, eta: 30s");
  EXPECT_EQ(format_progress_line(1, 0, 0, 0.0, std::nan(""), 0.0),
            "pass 1: 0/0 batches (nan%), 0.0 example/sec, auc: nan, eta: ?");
  const std::string slow = format_progress_line(0, 1, 100, 1.0, 0.5, 2.5);  // 99 x 2.5 s
  EXPECT_EQ(slow.substr(slow.rfind("eta: ")), "eta: 4m08s");
}

TEST(MetricsFormat, Durations) {
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(7325), "2h02m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
}

// The lines PaddleRec's trainers print, so that scrapers written for them read GPUBox's logs:
// static_gpubox_trainer.py's (ips per GPU) and trainer.py's / static_infer.py's.
TEST(MetricsFormat, PaddleRecLines) {
  EXPECT_EQ(format_paddlerec_epoch_line(0, 2.0, 1000, 4, 0.712345678),
            "Epoch: 0, using time: 2.000 second, ips: 125.0 example/sec. auc: 0.712346");
  const std::regex paddlerec(
      R"(Epoch: (\d+), using time: ([\d.]+) second, ips: ([\d.]+) example/sec\. auc: ([\d.]+))");
  std::smatch m;
  const std::string line = format_paddlerec_epoch_line(3, 0.5, 77, 1, 0.5);
  ASSERT_TRUE(std::regex_match(line, m, paddlerec)) << line;
  EXPECT_EQ(m[1], "3");
  EXPECT_EQ(std::stod(m[3]), 154.0);
  MetricValues v;
  v.auc = 0.75;
  v.logloss = 0.5;
  EXPECT_EQ(format_paddlerec_done_line(1, v, 12.345),
            "epoch: 1 done, auc: 0.750000, logloss: 0.500000, epoch time: 12.35 s");
}

TEST(MetricsFormat, AppendMetricsLineCreatesFoldersAndAppends) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("gpubox_metrics_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "log" / "metrics.jsonl").string();
  ASSERT_TRUE(append_metrics_line(path, "{\"pass\": 1}").ok());
  ASSERT_TRUE(append_metrics_line(path, "{\"pass\": 2}").ok());
  std::ifstream in(path);
  std::string a, b, c;
  std::getline(in, a);
  std::getline(in, b);
  EXPECT_EQ(a, "{\"pass\": 1}");
  EXPECT_EQ(b, "{\"pass\": 2}");
  EXPECT_FALSE(std::getline(in, c));
  // A folder where the file should be: an I/O error naming the path.
  const Status bad = append_metrics_line((dir / "log").string(), "{}");
  EXPECT_EQ(bad.code(), Status::Code::kIOError);
  EXPECT_NE(bad.message().find((dir / "log").string()), std::string::npos) << bad.message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpubox::trainer
