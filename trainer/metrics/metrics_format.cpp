#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "common/json.hpp"
#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double ratio(double num, double den) { return den > 0 ? num / den : kNaN; }

// "%.6f", or "nan"/"inf" as printf spells them.
std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

// The logloss of predicting the CTR c for everything: NaN unless 0 < c < 1.
double entropy_of(double c) {
  return c > 0 && c < 1 ? -(c * std::log(c) + (1 - c) * std::log(1 - c)) : kNaN;
}

}  // namespace

double SteadyLoss::constant_logloss() const { return entropy_of(ratio(positives, examples)); }

double SteadyLoss::ratio_to_constant() const {
  return ratio(logloss_sum, examples) / constant_logloss();
}

MetricValues compute_metrics(const double* flat, std::size_t buckets) {
  const double* negatives = flat;
  const double* positives = flat + buckets;
  const double* sums = flat + 2 * buckets;
  MetricValues m;
  // AUC: sweep the threshold from the highest bucket down; each bucket adds a trapezoid, so the
  // pairs tied inside one bucket count one half (as the exact AUC counts tied predictions).
  double tp = 0, fp = 0, area = 0;
  for (std::size_t b = buckets; b-- > 0;) {
    if (positives[b] + negatives[b] > 0) {
      ++m.prediction_buckets;
      if (m.highest_bucket < 0) m.highest_bucket = static_cast<double>(b);
      m.lowest_bucket = static_cast<double>(b);
    }
    const double new_tp = tp + positives[b];
    const double new_fp = fp + negatives[b];
    area += (new_fp - fp) * (tp + new_tp) * 0.5;
    tp = new_tp;
    fp = new_fp;
  }
  m.auc = tp > 0 && fp > 0 ? area / (tp * fp) : kNaN;
  const double count = sums[metric_sums::kCount];
  m.examples = count;
  m.positives = sums[metric_sums::kLabels];
  m.actual_ctr = ratio(sums[metric_sums::kLabels], count);
  m.predicted_ctr = ratio(sums[metric_sums::kPredictions], count);
  m.logloss = ratio(sums[metric_sums::kLogLoss], count);
  m.ne = m.logloss / entropy_of(m.actual_ctr);
  m.copc = ratio(sums[metric_sums::kLabels], sums[metric_sums::kPredictions]);
  m.mae = ratio(sums[metric_sums::kAbsError], count);
  m.rmse = std::sqrt(ratio(sums[metric_sums::kSquaredError], count));
  m.steady.examples = sums[metric_sums::kSteadyCount];
  m.steady.positives = sums[metric_sums::kSteadyLabels];
  m.steady.logloss_sum = sums[metric_sums::kSteadyLogLoss];
  m.steady.pairs = sums[metric_sums::kSteadyPairs];
  m.steady.tied_pairs = sums[metric_sums::kSteadyTiedPairs];
  return m;
}

std::string format_pass_line(const PassReport& r) {
  const MetricValues& m = r.metrics;
  const double ips = ratio(m.examples, r.seconds);
  std::string line =
      "pass: " + std::to_string(r.pass) + ", using time: " + fixed(r.seconds, 3) +
      " second, ips: " + fixed(ips, 1) + " example/sec, auc: " + fixed(m.auc, 6) +
      ", logloss: " + fixed(m.logloss, 6) + ", ne: " + fixed(m.ne, 6) +
      ", actual_ctr: " + fixed(m.actual_ctr, 6) + ", predicted_ctr: " + fixed(m.predicted_ctr, 6) +
      ", copc: " + fixed(m.copc, 6) + ", mae: " + fixed(m.mae, 6) + ", rmse: " + fixed(m.rmse, 6) +
      ", ips_per_card: " + fixed(r.cards > 0 ? ips / r.cards : kNaN, 1);
  for (const auto& [name, value] : r.extra) line += ", " + name + ": " + json_number(value);
  return line;
}

std::string format_pass_json(const PassReport& r) {
  const MetricValues& m = r.metrics;
  const double ips = ratio(m.examples, r.seconds);
  std::string out = "{\"pass\": " + std::to_string(r.pass);
  auto add = [&out](const std::string& name, double value) {
    out += ", " + json_quote(name) + ": " + json_number(value);
  };
  add("seconds", r.seconds);
  add("examples", m.examples);
  add("cards", r.cards);
  add("ips", ips);
  add("ips_per_card", r.cards > 0 ? ips / r.cards : kNaN);
  add("auc", m.auc);
  add("logloss", m.logloss);
  add("ne", m.ne);
  add("actual_ctr", m.actual_ctr);
  add("predicted_ctr", m.predicted_ctr);
  add("copc", m.copc);
  add("mae", m.mae);
  add("rmse", m.rmse);
  add("positives", m.positives);
  for (const auto& [name, value] : r.extra) add(name, value);
  return out + "}";
}

std::string format_test_json(int64_t epoch, const MetricValues& test) {
  return "{\"epoch\": " + std::to_string(epoch) + ", \"test_auc\": " + json_number(test.auc) +
         ", \"test_logloss\": " + json_number(test.logloss) +
         ", \"test_examples\": " + json_number(test.examples) + "}";
}

std::string one_class_note(const MetricValues& metrics) {
  if (!(metrics.examples > 0) || (metrics.positives > 0 && metrics.positives < metrics.examples)) {
    return "";
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "its %.0f instances are all %s: AUC is undefined with one class (nan); logloss "
                "is measured",
                metrics.examples,
                metrics.positives > 0 ? "positive (label 1)" : "negative (label 0)");
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto whole = static_cast<int64_t>(std::llround(seconds));
  char buf[48];
  if (whole < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(whole));
  } else if (whole < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(whole / 60),
                  static_cast<long long>(whole % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(whole / 3600),
                  static_cast<long long>(whole / 60 % 60));
  }
  return buf;
}

std::string format_progress_line(int64_t pass, int64_t batches_done, int64_t batches_total,
                                 double examples_per_sec, double running_auc,
                                 double elapsed_seconds) {
  const double percent =
      batches_total > 0 ? 100.0 * static_cast<double>(batches_done) / batches_total : kNaN;
  const double eta = batches_done > 0 ? elapsed_seconds / static_cast<double>(batches_done) *
                                            static_cast<double>(batches_total - batches_done)
                                      : kNaN;
  return "pass " + std::to_string(pass) + ": " + std::to_string(batches_done) + "/" +
         std::to_string(batches_total) + " batches (" + fixed(percent, 1) + "%), " +
         fixed(examples_per_sec, 1) + " example/sec, auc: " + fixed(running_auc, 6) +
         ", eta: " + format_duration(eta);
}

std::string format_paddlerec_epoch_line(int64_t epoch, double seconds, double examples, int cards,
                                        double auc) {
  const double ips_per_card = cards > 0 ? ratio(examples, seconds) / cards : kNaN;
  return "Epoch: " + std::to_string(epoch) + ", using time: " + fixed(seconds, 3) +
         " second, ips: " + fixed(ips_per_card, 1) + " example/sec. auc: " + fixed(auc, 6);
}

std::string format_paddlerec_done_line(int64_t epoch, const MetricValues& m, double seconds) {
  return "epoch: " + std::to_string(epoch) + " done, auc: " + fixed(m.auc, 6) +
         ", logloss: " + fixed(m.logloss, 6) + ", epoch time: " + fixed(seconds, 2) + " s";
}

Status append_metrics_line(const std::string& path, const std::string& json_line) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) {
    return Status::IOError("cannot create the folder of metrics file '" + path +
                           "': " + ec.message());
  }
  std::ofstream out(path, std::ios::app);
  if (!out) {
    return Status::IOError("cannot open metrics file '" + path + "': " + std::strerror(errno));
  }
  const std::string line = json_line + "\n";
  out.write(line.data(), static_cast<std::streamsize>(line.size()));
  out.flush();
  if (!out) return Status::IOError("cannot write metrics file '" + path + "'");
  return Status::OK();
}

}  // namespace gpubox::trainer
