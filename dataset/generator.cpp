#include "dataset/generator.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <utility>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/timer.hpp"
#include "dataset/parallel.hpp"
#include "dataset/text_number.hpp"

namespace gpubox::dataset {
namespace {

// Independent hash streams of one seed.
constexpr std::uint64_t kWeightStream = 0x1b873593a2c7e1f1ULL;
constexpr std::uint64_t kFactorStream = 0x85ebca6b3d4c9a27ULL;
constexpr std::uint64_t kDenseStream = 0xc2b2ae3554f2a6c3ULL;
constexpr std::uint64_t kLineStream = 0x27d4eb2f165667c5ULL;
constexpr const char* kOracleFile = "oracle.json";  // beside the part files: what gen wrote
// Written before the part files, so a folder a run left unfinished (killed before oracle.json,
// which is written last) is still known as gen's own; hidden, so no reader takes it for data.
constexpr const char* kGenMarkerFile = ".gpubox_gen";

// Uniform on [-sqrt(3), sqrt(3)): mean 0, variance 1.
inline double unit_uniform(std::uint64_t bits) {
  constexpr double kSqrt3 = 1.7320508075688772;
  return (static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0) * kSqrt3;
}

// Per-line random stream.
class LineRng {
 public:
  LineRng(std::uint64_t seed, std::uint64_t line)
      : state_(hash_with_seed(line, seed ^ kLineStream)) {}
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }

 private:
  std::uint64_t state_;
};

inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";  // JSON has no NaN (one class: no AUC)
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

}  // namespace

PlantedModel::PlantedModel(const GeneratorOptions& o)
    : slots_(o.slots),
      dense_(o.dense),
      factor_dim_(o.factor_dim),
      vocab_(o.vocab),
      seed_(o.seed),
      bias_(o.bias),
      sigma_w_(o.sigma_w),
      sigma_v_(o.sigma_v) {
  if (sigma_v_ <= 0.0) {
    // Var(<v_s, v_t>) = factor_dim * sigma_v^4 per pair; aim the sum over pairs at 1.
    const double pairs = std::max(1.0, 0.5 * slots_ * (slots_ - 1));
    sigma_v_ = std::pow(1.0 / (pairs * std::max(1, factor_dim_)), 0.25);
  }
  dense_weight_.resize(static_cast<std::size_t>(dense_));
  for (int j = 0; j < dense_; ++j) {
    dense_weight_[j] = o.sigma_u * unit_uniform(hash_with_seed(j, seed_ ^ kDenseStream));
  }
}

double PlantedModel::weight(std::uint64_t key) const {
  return sigma_w_ * unit_uniform(hash_with_seed(key, seed_ ^ kWeightStream));
}

double PlantedModel::factor(std::uint64_t key, int j) const {
  return sigma_v_ * unit_uniform(hash_with_seed(key * 64 + static_cast<std::uint64_t>(j),
                                                seed_ ^ kFactorStream));
}

template <class SlotSize>
double PlantedModel::logit_of(const std::uint64_t* keys, SlotSize slot_size,
                              const float* dense) const {
  double z = bias_;
  for (int j = 0; j < dense_; ++j) z += dense_weight_[j] * dense[j];
  // Σ_{s<t} <e_s, e_t> = (|Σ_s e_s|² - Σ_s |e_s|²) / 2, per factor dimension, e_s the sum of
  // slot s's key vectors (for one key a slot, exactly the sums of single vectors as before).
  double sum[64] = {0};
  double slot_sum[64];
  double square = 0.0;
  const int k = std::min(factor_dim_, 64);
  std::size_t at = 0;
  for (int s = 0; s < slots_; ++s) {
    std::fill_n(slot_sum, k, 0.0);
    for (const std::size_t end = at + slot_size(s); at < end; ++at) {
      if (keys[at] == 0) continue;
      z += weight(keys[at]);
      for (int j = 0; j < k; ++j) slot_sum[j] += factor(keys[at], j);
    }
    for (int j = 0; j < k; ++j) {
      sum[j] += slot_sum[j];
      square += slot_sum[j] * slot_sum[j];
    }
  }
  double pair = -square;
  for (int j = 0; j < k; ++j) pair += sum[j] * sum[j];
  return z + 0.5 * pair;
}

double PlantedModel::logit(const std::uint64_t* keys, const float* dense) const {
  return logit_of(
      keys, [](int) { return std::size_t{1}; }, dense);
}

double PlantedModel::logit(const std::uint64_t* keys, const std::uint32_t* slot_sizes,
                           const float* dense) const {
  return logit_of(
      keys, [slot_sizes](int s) { return std::size_t{slot_sizes[s]}; }, dense);
}

Status parse_keys_per_slot(const std::string& text, GeneratorOptions* options) {
  const auto bad = [&] {
    return Status::InvalidArgument(
        "gen: --keys_per_slot is MIN:MAX or N with 0 <= MIN <= MAX "
        "<= 1000 and MAX >= 1, got '" +
        text + "'");
  };
  const std::size_t colon = text.find(':');
  const std::string low = text.substr(0, colon);
  const std::string high = colon == std::string::npos ? low : text.substr(colon + 1);
  const auto number = [](const std::string& digits, int* value) {
    if (digits.empty() || digits.size() > 4 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    *value = std::stoi(digits);
    return true;
  };
  int min = 0, max = 0;
  if (!number(low, &min) || !number(high, &max) || min > max || max < 1 || max > 1000) {
    return bad();
  }
  options->keys_per_slot_min = min;
  options->keys_per_slot_max = max;
  return Status::OK();
}

ZipfSampler::ZipfSampler(std::uint64_t n, double exponent) {
  GPUBOX_EXPECTS(n >= 1 && n <= 0xffffffffULL, "Zipf vocabulary must be in [1, 2^32), got ", n);
  std::vector<double> p(n);
  double total = 0.0;
  for (std::uint64_t r = 0; r < n; ++r)
    total += (p[r] = std::pow(static_cast<double>(r + 1), -exponent));
  for (double& x : p) x = x * static_cast<double>(n) / total;  // mean 1
  threshold_.assign(n, 0xffffffffu);
  alias_.resize(n);
  std::iota(alias_.begin(), alias_.end(), 0u);
  std::vector<std::uint32_t> small, large;
  for (std::uint64_t r = 0; r < n; ++r)
    (p[r] < 1.0 ? small : large).push_back(static_cast<std::uint32_t>(r));
  while (!small.empty() && !large.empty()) {
    const std::uint32_t s = small.back();
    small.pop_back();
    const std::uint32_t l = large.back();
    threshold_[s] = static_cast<std::uint32_t>(std::min(p[s] * 4294967296.0, 4294967295.0));
    alias_[s] = l;
    p[l] -= 1.0 - p[s];
    if (p[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // Leftovers are 1 up to rounding: always accept.
}

std::uint64_t ZipfSampler::operator()(std::uint64_t bits) const {
  const auto column = static_cast<std::uint64_t>(
      (static_cast<unsigned __int128>(bits >> 32) * threshold_.size()) >> 32);
  const auto low = static_cast<std::uint32_t>(bits);
  return low < threshold_[column] || threshold_[column] == 0xffffffffu ? column : alias_[column];
}

PowerLawSampler::PowerLawSampler(std::uint64_t n, double exponent)
    : n_(n),
      one_minus_exponent_(std::abs(1.0 - exponent) < 1e-12 ? 0.0 : 1.0 - exponent),
      log_top_(std::log(static_cast<double>(n) + 1.0)),
      top_term_(std::expm1(one_minus_exponent_ * log_top_)) {
  GPUBOX_EXPECTS(n >= 1, "power-law vocabulary must be >= 1, got ", n);
}

std::uint64_t PowerLawSampler::operator()(std::uint64_t bits) const {
  const double u = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  // x = F^-1(u) on [1, n + 1): (1 + u ((n+1)^(1-a) - 1))^(1/(1-a)), or (n+1)^u when a = 1.
  const double log_x =
      one_minus_exponent_ == 0.0 ? u * log_top_ : std::log1p(u * top_term_) / one_minus_exponent_;
  const double rank = std::floor(std::exp(log_x)) - 1.0;
  if (!(rank > 0.0)) return 0;
  return std::min(n_ - 1, static_cast<std::uint64_t>(rank));
}

RankSampler::RankSampler(KeySampler kind, std::uint64_t n, double exponent)
    : power_law_(n, exponent) {
  if (kind == KeySampler::kAlias) alias_.emplace(n, exponent);
}

double exact_auc(const std::vector<double>& scores, const std::vector<std::uint8_t>& labels) {
  GPUBOX_EXPECTS(scores.size() == labels.size(), "scores and labels differ in size");
  // Sorting (score, label) pairs directly: an index sort chases pointers on every compare.
  std::vector<std::pair<double, std::uint8_t>> ranked(scores.size());
  for (std::size_t i = 0; i < scores.size(); ++i) ranked[i] = {scores[i], labels[i] ? 1 : 0};
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // Mann-Whitney: sum of positive ranks, ties given their average rank.
  double positive_rank_sum = 0.0;
  std::uint64_t positives = 0;
  std::size_t i = 0;
  while (i < ranked.size()) {
    std::size_t j = i;
    std::uint64_t group_pos = 0;
    while (j < ranked.size() && ranked[j].first == ranked[i].first) group_pos += ranked[j++].second;
    const double average_rank = 0.5 * static_cast<double>(i + 1 + j);  // ranks i+1 .. j
    positive_rank_sum += average_rank * static_cast<double>(group_pos);
    positives += group_pos;
    i = j;
  }
  const double p = static_cast<double>(positives);
  const double n = static_cast<double>(scores.size()) - p;
  if (p == 0 || n == 0) return std::nan("");  // undefined, as training's AUC of one class
  return (positive_rank_sum - p * (p + 1) / 2) / (p * n);
}

double mean_logloss(const std::vector<double>& logits, const std::vector<std::uint8_t>& labels) {
  if (logits.empty()) return 0.0;
  double total = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    // -log(sigmoid(z)) = log1p(exp(-z)), computed without overflow.
    const double softplus_neg = z > 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z));
    total += labels[i] ? softplus_neg : softplus_neg + z;
  }
  return total / static_cast<double>(logits.size());
}

namespace {

// Dense values and keys (slot by slot, sizes[s] of them in slot s) of one line; advances `rng`
// past them. A fixed count (MIN == MAX, the default 1:1) draws no count: the stream, and so the
// data, of a fixed count is what it was before counts could vary.
void draw_features(const GeneratorOptions& o, const PlantedModel& model, const RankSampler& zipf,
                   LineRng& rng, std::vector<std::uint64_t>* keys, std::uint32_t* sizes,
                   float* dense) {
  for (int j = 0; j < o.dense; ++j) dense[j] = static_cast<float>(rng.next() % 1000) / 1000.0f;
  const auto low = static_cast<std::uint32_t>(o.keys_per_slot_min);
  const auto spread = static_cast<std::uint64_t>(o.keys_per_slot_max - o.keys_per_slot_min) + 1;
  keys->clear();
  for (int s = 0; s < o.slots; ++s) {
    const auto n = spread == 1 ? low : low + static_cast<std::uint32_t>(rng.next() % spread);
    sizes[s] = n;
    for (std::uint32_t i = 0; i < n; ++i) keys->push_back(model.key(s, zipf(rng.next())));
  }
}

constexpr std::uint64_t kCalibrationLines = 20000;

}  // namespace

PlantedModel planted_model(const GeneratorOptions& o) {
  PlantedModel model(o);
  if (o.ctr <= 0.0) return model;
  GPUBOX_EXPECTS(o.ctr < 1.0, "ctr must be in (0, 1), got ", o.ctr);
  const RankSampler zipf(o.key_sampler, o.vocab, o.zipf);
  model.set_bias(0.0);
  std::vector<double> logits;
  std::vector<std::uint64_t> keys;
  std::vector<std::uint32_t> sizes(static_cast<std::size_t>(o.slots));
  std::vector<float> dense(static_cast<std::size_t>(o.dense));
  // Always the same calibration lines, whatever --lines and --first_line: a held-out set drawn
  // with --first_line comes from exactly the same planted model as the training set.
  for (std::uint64_t i = 0; i < kCalibrationLines; ++i) {
    LineRng rng(o.seed, i);
    draw_features(o, model, zipf, rng, &keys, sizes.data(), dense.data());
    logits.push_back(model.logit(keys.data(), sizes.data(), dense.data()));
  }
  // mean sigmoid(z + b) grows with b: bisect.
  double lo = -50.0, hi = 50.0;
  for (int iteration = 0; iteration < 100; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    double mean = 0.0;
    for (double z : logits) mean += sigmoid(z + mid);
    mean /= static_cast<double>(logits.size());
    (mean < o.ctr ? lo : hi) = mid;
  }
  model.set_bias(0.5 * (lo + hi));
  return model;
}

namespace {

// The options are sane and out_dir exists without part files of an earlier, larger run.
Status prepare_output(const GeneratorOptions& o) {
  if (o.out_dir.empty()) return Status::InvalidArgument("gen: --out is required");
  if (o.files < 1) return Status::InvalidArgument("gen: --files must be >= 1");
  if (o.slots < 1 || o.dense < 0 || o.factor_dim < 1 || o.factor_dim > 64) {
    return Status::InvalidArgument("gen: need slots >= 1, dense >= 0, 1 <= factor_dim <= 64");
  }
  if (o.keys_per_slot_min < 0 || o.keys_per_slot_min > o.keys_per_slot_max ||
      o.keys_per_slot_max < 1 || o.keys_per_slot_max > 1000) {
    return Status::InvalidArgument(
        "gen: --keys_per_slot needs 0 <= MIN <= MAX <= 1000 and MAX >= 1, got " +
        std::to_string(o.keys_per_slot_min) + ":" + std::to_string(o.keys_per_slot_max));
  }
  if (o.key_sampler == KeySampler::kAlias && (o.vocab < 1 || o.vocab > 0xffffffffULL)) {
    return Status::InvalidArgument(
        "gen: --vocab must be in [1, 2^32) (larger: --key_sampler closed_form)");
  }
  if (o.vocab < 1 || o.vocab >= (std::uint64_t{1} << 40)) {
    return Status::InvalidArgument("gen: --vocab must be in [1, 2^40)");
  }
  if (static_cast<double>(o.vocab) * o.slots >= 1.8e19) {
    return Status::InvalidArgument("gen: --vocab times --slots must stay below 2^64 (keys)");
  }
  if (!(o.zipf >= 0.0)) return Status::InvalidArgument("gen: --zipf must be >= 0");
  if (!(o.ctr < 1.0)) return Status::InvalidArgument("gen: --ctr must be < 1 (<= 0: fixed bias)");
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return Status::IOError("cannot create '" + o.out_dir + "': " + ec.message());
  // Only a folder an earlier run wrote (its part files beside oracle.json or the marker) is
  // written into: other files would join this data set in a data folder, and another tool's
  // part files (Spark and Hadoop name theirs part-00000 too) would be overwritten. Hidden
  // entries and lost+found are not data (the reader skips them) and stay.
  const std::filesystem::path out(o.out_dir);
  const bool earlier_run =
      std::filesystem::exists(out / kOracleFile) || std::filesystem::exists(out / kGenMarkerFile);
  for (const auto& entry : std::filesystem::directory_iterator(o.out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kOracleFile || name[0] == '.' || name == "lost+found") continue;
    unsigned index = 0;
    char tail = 0;
    const bool part = std::sscanf(name.c_str(), "part-%u%c", &index, &tail) == 1;
    if (!part || !earlier_run) {
      return Status::InvalidArgument(
          "--out '" + o.out_dir + "' holds '" + name + "', which gpubox_data gen did not write" +
          (part ? " (no " + std::string(kOracleFile) + " beside it)" : std::string()) +
          ": its files would be overwritten or read with the generated data; use a new or empty "
          "folder");
    }
    // Part files of an earlier, larger run would silently join this data set.
    if (index >= static_cast<unsigned>(o.files)) {
      return Status::InvalidArgument("'" + entry.path().string() +
                                     "' is left from an earlier run with more files: remove it "
                                     "or use another --out");
    }
  }
  if (ec) return Status::IOError("cannot list '" + o.out_dir + "': " + ec.message());
  const std::string marker = (out / kGenMarkerFile).string();
  std::FILE* f = std::fopen(marker.c_str(), "w");
  if (f == nullptr || std::fclose(f) != 0) {
    return Status::IOError("cannot write '" + marker + "': " + std::strerror(errno));
  }
  return Status::OK();
}

// Part file `f` of o.files: its share of the lines, with each line's logit and label kept for
// the oracle's metrics.
Status write_part_file(const GeneratorOptions& o, const PlantedModel& model,
                       const RankSampler& zipf, const std::vector<std::string>& slot_names,
                       std::size_t f, std::vector<double>* logits_out,
                       std::vector<std::uint8_t>* labels_out, std::uint64_t* bytes) {
  std::vector<double>& logits = *logits_out;
  std::vector<std::uint8_t>& labels = *labels_out;
  Status status;
  char name[32];
  std::snprintf(name, sizeof(name), "part-%05zu", f);
  const std::string path = (std::filesystem::path(o.out_dir) / name).string();
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) {
    return Status::IOError("cannot create '" + path + "': " + std::strerror(errno));
  }
  const std::uint64_t first = o.lines * f / static_cast<std::uint64_t>(o.files);
  const std::uint64_t last = o.lines * (f + 1) / static_cast<std::uint64_t>(o.files);
  std::vector<std::uint64_t> keys;
  std::vector<std::uint32_t> sizes(static_cast<std::size_t>(o.slots));
  std::vector<float> dense(static_cast<std::size_t>(o.dense));
  std::string text;
  text.reserve(std::size_t{5} << 20);
  for (std::uint64_t i = first; i < last; ++i) {
    LineRng rng(o.seed, o.first_line + i);
    draw_features(o, model, zipf, rng, &keys, sizes.data(), dense.data());
    const double z = model.logit(keys.data(), sizes.data(), dense.data());
    const bool positive = unit_float(rng.next()) < sigmoid(z);
    logits[i] = z;
    labels[i] = positive ? 1 : 0;
    text.append(positive ? "click:1" : "click:0");
    for (int j = 0; j < o.dense; ++j) {
      text.append(" dense_feature:");
      append_float(&text, dense[j]);
    }
    std::size_t at = 0;
    for (int s = 0; s < o.slots; ++s) {
      for (const std::size_t end = at + sizes[s]; at < end; ++at) {
        text.push_back(' ');
        text.append(slot_names[s]);
        text.push_back(':');
        append_u64(&text, keys[at]);
      }
    }
    text.push_back('\n');
    if (text.size() >= (std::size_t{4} << 20) || i + 1 == last) {
      if (std::fwrite(text.data(), 1, text.size(), out) != text.size()) {
        status = Status::IOError("write error on '" + path + "': " + std::strerror(errno));
        break;
      }
      *bytes += text.size();
      text.clear();
    }
  }
  if (std::fclose(out) != 0 && status.ok()) {
    status = Status::IOError("write error on '" + path + "': " + std::strerror(errno));
  }
  return status;
}

// oracle.json: what the planted model scores on the data, and the options that made it.
Status write_oracle(const GeneratorOptions& o, const PlantedModel& model, const OracleSummary& s) {
  const std::string oracle_path = (std::filesystem::path(o.out_dir) / kOracleFile).string();
  std::FILE* out = std::fopen(oracle_path.c_str(), "wb");
  if (out == nullptr) {
    return Status::IOError("cannot create '" + oracle_path + "': " + std::strerror(errno));
  }
  const std::string json =
      "{\"lines\": " + std::to_string(s.lines) + ", \"files\": " + std::to_string(o.files) +
      ", \"positives\": " + std::to_string(s.positives) +
      ", \"positive_rate\": " + json_number(s.positive_rate) + ", \"auc\": " + json_number(s.auc) +
      ", \"logloss\": " + json_number(s.logloss) + ", \"bytes\": " + std::to_string(s.bytes) +
      ", \"seed\": " + std::to_string(o.seed) + ", \"slots\": " + std::to_string(o.slots) +
      ", \"dense\": " + std::to_string(o.dense) + ", \"vocab\": " + std::to_string(o.vocab) +
      ", \"zipf\": " + json_number(o.zipf) +
      // Named only when not the default, so the default's oracle.json stays as it was.
      (o.key_sampler == KeySampler::kClosedForm ? ", \"key_sampler\": \"closed_form\"" : "") +
      (o.keys_per_slot_min == 1 && o.keys_per_slot_max == 1
           ? ""
           : ", \"keys_per_slot\": \"" + std::to_string(o.keys_per_slot_min) + ":" +
                 std::to_string(o.keys_per_slot_max) + "\"") +
      ", \"factor_dim\": " + std::to_string(o.factor_dim) + ", \"ctr\": " + json_number(o.ctr) +
      ", \"bias\": " + json_number(model.bias()) + ", \"sigma_w\": " + json_number(o.sigma_w) +
      ", \"sigma_v\": " + json_number(model.sigma_v()) +
      ", \"sigma_u\": " + json_number(o.sigma_u) +
      ", \"format\": \"slot\", \"label_name\": \"click\", \"dense_name\": \"dense_feature\"}\n";
  const bool written = std::fwrite(json.data(), 1, json.size(), out) == json.size();
  if (std::fclose(out) != 0 || !written) {
    return Status::IOError("write error on '" + oracle_path + "'");
  }
  return Status::OK();
}

}  // namespace

Status generate(const GeneratorOptions& o, OracleSummary* summary) {
  GPUBOX_RETURN_IF_ERROR(prepare_output(o));
  Timer timer;
  const PlantedModel model = planted_model(o);
  const RankSampler zipf(o.key_sampler, o.vocab, o.zipf);
  std::vector<double> logits(o.lines);
  std::vector<std::uint8_t> labels(o.lines);
  std::vector<std::string> slot_names(static_cast<std::size_t>(o.slots));
  for (int s = 0; s < o.slots; ++s) slot_names[s] = std::to_string(s + 1);
  std::vector<Status> file_status(static_cast<std::size_t>(o.files));
  std::vector<std::uint64_t> file_bytes(static_cast<std::size_t>(o.files), 0);

  parallel_tasks(o.threads, static_cast<std::size_t>(o.files), [&](std::size_t f) {
    file_status[f] =
        write_part_file(o, model, zipf, slot_names, f, &logits, &labels, &file_bytes[f]);
  });
  for (const Status& st : file_status) GPUBOX_RETURN_IF_ERROR(st);

  OracleSummary s;
  s.lines = o.lines;
  for (std::uint8_t y : labels) s.positives += y;
  s.positive_rate = o.lines ? static_cast<double>(s.positives) / static_cast<double>(o.lines) : 0.0;
  s.auc = exact_auc(logits, labels);
  s.logloss = mean_logloss(logits, labels);
  for (std::uint64_t b : file_bytes) s.bytes += b;
  s.seconds = timer.seconds();

  GPUBOX_RETURN_IF_ERROR(write_oracle(o, model, s));
  *summary = s;
  return Status::OK();
}

}  // namespace gpubox::dataset
