// gpubox_data gen: determinism, the planted model's oracle recomputed from the written data, the
// Zipf sampler's distribution and the exact AUC against a pairwise count.
#include "dataset/generator.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/hash.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::ScratchDir;
using testing::slot_config;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The number after `"key": ` in a flat JSON object.
double json_value(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": ");
  EXPECT_NE(at, std::string::npos) << key;
  return at == std::string::npos ? NAN : std::stod(json.substr(at + key.size() + 4));
}

// O(n^2) AUC: P(score_pos > score_neg) + 0.5 P(equal).
double pairwise_auc(const std::vector<double>& s, const std::vector<std::uint8_t>& y) {
  double wins = 0, pairs = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!y[i]) continue;
    for (std::size_t j = 0; j < s.size(); ++j) {
      if (y[j]) continue;
      pairs += 1;
      wins += s[i] > s[j] ? 1.0 : (s[i] == s[j] ? 0.5 : 0.0);
    }
  }
  return wins / pairs;
}

GeneratorOptions small_options(const std::string& dir, int threads) {
  GeneratorOptions o;
  o.out_dir = dir;
  o.lines = 1500;
  o.files = 4;
  o.seed = 99;
  o.slots = 6;
  o.dense = 3;
  o.vocab = 50;
  o.zipf = 1.05;
  o.threads = threads;
  return o;
}

TEST(Generator, DeterministicForASeedWhateverTheThreadCount) {
  ScratchDir a, b, c;
  OracleSummary sa, sb, sc;
  ASSERT_TRUE(generate(small_options(a.path(), 1), &sa).ok());
  ASSERT_TRUE(generate(small_options(b.path(), 3), &sb).ok());
  GeneratorOptions other = small_options(c.path(), 2);
  other.seed = 100;
  ASSERT_TRUE(generate(other, &sc).ok());
  for (const std::string name : {"part-00000", "part-00001", "part-00002", "part-00003"}) {
    EXPECT_EQ(slurp(a.file(name)), slurp(b.file(name))) << name;
    EXPECT_NE(slurp(a.file(name)), slurp(c.file(name))) << name;
  }
  EXPECT_EQ(slurp(a.file("oracle.json")), slurp(b.file("oracle.json")));
  EXPECT_EQ(sa.auc, sb.auc);
  // Line i goes to file i * files / lines: 375 lines each.
  const std::string part = slurp(a.file("part-00002"));
  EXPECT_EQ(std::count(part.begin(), part.end(), '\n'), 375);
}

TEST(Generator, OracleMatchesThePlantedModelRecomputedFromTheFiles) {
  ScratchDir dir;
  const GeneratorOptions o = small_options(dir.path(), 2);
  OracleSummary summary;
  ASSERT_TRUE(generate(o, &summary).ok());
  const std::string json = slurp(dir.file("oracle.json"));

  DatasetConfig c = slot_config(o.slots, o.dense);
  c.thread_num = 2;
  InMemoryDataset ds(c);
  for (int f = 0; f < o.files; ++f) {
    char name[32];
    std::snprintf(name, sizeof(name), "part-%05d", f);
    ds.set_filelist({dir.file(name)});
    ASSERT_TRUE(ds.load_into_memory().ok());
    EXPECT_EQ(ds.load_stats().skipped_lines(), 0u);
  }
  ASSERT_EQ(ds.size(), o.lines);

  const PlantedModel model = planted_model(o);
  std::vector<double> logits;
  std::vector<std::uint8_t> labels;
  std::uint64_t positives = 0;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const InstanceRef r = ds.instance(i);
    std::vector<std::uint64_t> keys(o.slots, 0);
    for (int s = 0; s < o.slots; ++s) {
      ASSERT_EQ(r.slot_sizes[s], 1u);
      keys[s] = r.keys[s];
      // key = slot * vocab + rank + 1
      ASSERT_GE(keys[s], static_cast<std::uint64_t>(s) * o.vocab + 1);
      ASSERT_LE(keys[s], static_cast<std::uint64_t>(s + 1) * o.vocab);
    }
    logits.push_back(model.logit(keys.data(), r.dense));
    labels.push_back(r.label > 0.5f ? 1 : 0);
    positives += labels.back();
  }
  const double auc = pairwise_auc(logits, labels);
  double logloss = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-logits[i]));
    logloss -= labels[i] ? std::log(p) : std::log(1 - p);
  }
  logloss /= static_cast<double>(logits.size());
  EXPECT_NEAR(json_value(json, "auc"), auc, 1e-8);
  EXPECT_NEAR(json_value(json, "logloss"), logloss, 1e-8);
  EXPECT_EQ(json_value(json, "positives"), static_cast<double>(positives));
  EXPECT_NEAR(json_value(json, "positive_rate"), static_cast<double>(positives) / o.lines, 1e-9);
  EXPECT_NEAR(summary.auc, auc, 1e-12);
  // The planted model predicts its own labels well above chance, and the bias was calibrated
  // to the target positive rate (1500 lines: within a few standard errors).
  EXPECT_GT(auc, 0.7);
  EXPECT_NEAR(static_cast<double>(positives) / o.lines, o.ctr, 0.05);
  EXPECT_NEAR(json_value(json, "bias"), model.bias(), 1e-6 * (1 + std::abs(model.bias())));
}

// Held-out data: the same seed with --first_line past the training lines is the continuation of
// the same stream from the same planted model (the bias calibration does not depend on --lines).
TEST(Generator, FirstLineContinuesTheSameModelsStream) {
  ScratchDir whole_dir, train_dir, test_dir;
  GeneratorOptions whole = small_options(whole_dir.path(), 1);
  whole.files = 1;
  whole.lines = 1500;
  GeneratorOptions train = whole;
  train.out_dir = train_dir.path();
  train.lines = 1000;
  GeneratorOptions test = whole;
  test.out_dir = test_dir.path();
  test.lines = 500;
  test.first_line = 1000;
  OracleSummary summary;
  ASSERT_TRUE(generate(whole, &summary).ok());
  ASSERT_TRUE(generate(train, &summary).ok());
  ASSERT_TRUE(generate(test, &summary).ok());
  const std::string all = slurp(whole_dir.file("part-00000"));
  EXPECT_EQ(slurp(train_dir.file("part-00000")) + slurp(test_dir.file("part-00000")), all);
}

TEST(Generator, BiasIsCalibratedOnlyWhenAskedTo) {
  GeneratorOptions o = small_options("unused", 1);
  o.ctr = 0;
  EXPECT_EQ(planted_model(o).bias(), o.bias);
  o.ctr = 0.1;
  const double low = planted_model(o).bias();
  o.ctr = 0.5;
  EXPECT_LT(low, planted_model(o).bias());
}

TEST(Generator, RejectsBadOptions) {
  ScratchDir dir;
  OracleSummary s;
  GeneratorOptions o = small_options(dir.path(), 1);
  o.files = 0;
  EXPECT_FALSE(generate(o, &s).ok());
  o = small_options("", 1);
  EXPECT_FALSE(generate(o, &s).ok());
  o = small_options(dir.path(), 1);
  o.vocab = 0;
  EXPECT_FALSE(generate(o, &s).ok());
  o = small_options(dir.path(), 1);
  o.ctr = 1.0;
  EXPECT_FALSE(generate(o, &s).ok());
  // Re-running into the same folder with fewer files would mix runs.
  o = small_options(dir.path(), 1);
  ASSERT_TRUE(generate(o, &s).ok());
  ASSERT_TRUE(generate(o, &s).ok()) << "same shape: overwritten";
  o.files = 2;
  const Status st = generate(o, &s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("earlier run"), std::string::npos) << st.message();
}

// --out into a folder gen did not write is refused naming what is there, and nothing in it is
// touched: another tool's part-00000 (Spark's name too) was overwritten, and other files were
// left to be read with the generated data. An empty folder, or gen's own, is written into.
TEST(Generator, OutIntoAFolderItDidNotWriteIsRefusedAndTouched) {
  OracleSummary s;
  for (const std::string name : {"part-00000", "day1.txt"}) {
    ScratchDir dir;
    const std::string theirs = dir.write(name, "click:1 1:5\n");
    const Status st = generate(small_options(dir.path(), 1), &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << name;
    EXPECT_NE(st.message().find("holds '" + name + "', which gpubox_data gen did not write"),
              std::string::npos)
        << st.message();
    EXPECT_EQ(slurp(theirs), "click:1 1:5\n") << name;
    EXPECT_FALSE(std::filesystem::exists(dir.file("oracle.json"))) << name;
  }
  ScratchDir empty;
  ASSERT_TRUE(generate(small_options(empty.path(), 1), &s).ok());
  EXPECT_TRUE(generate(small_options(empty.path(), 1), &s).ok()) << "its own folder";
}

// A run cut short (its part files written, oracle.json, written last, not yet) is re-run into the
// same folder: it was refused as "holds 'part-00000', which gpubox_data gen did not write", and
// the scripts that re-run gen when oracle.json is missing were stuck. Hidden entries and
// lost+found are not data and do not stop it.
TEST(Generator, ReRunsIntoAFolderItsKilledRunLeft) {
  OracleSummary s;
  ScratchDir dir;
  ASSERT_TRUE(generate(small_options(dir.path(), 2), &s).ok());
  std::filesystem::remove(dir.file("oracle.json"));
  dir.write(".DS_Store", "x");
  std::filesystem::create_directory(dir.file("lost+found"));
  const Status st = generate(small_options(dir.path(), 2), &s);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(std::filesystem::exists(dir.file("oracle.json")));
}

// --keys_per_slot MIN:MAX: each slot of a line holds MIN..MAX keys (0: the slot is left out),
// every count appears, the data loads as training loads it, and the oracle is the planted model
// (its slots sum-pooled) recomputed from what was loaded; the same seed gives the same files
// whatever the thread count.
TEST(Generator, KeysPerSlotVaryPerLineAndSlot) {
  ScratchDir a, b;
  GeneratorOptions o = small_options(a.path(), 1);
  o.keys_per_slot_min = 0;
  o.keys_per_slot_max = 3;
  OracleSummary sa, sb;
  ASSERT_TRUE(generate(o, &sa).ok());
  GeneratorOptions again = o;
  again.out_dir = b.path();
  again.threads = 3;
  ASSERT_TRUE(generate(again, &sb).ok());
  EXPECT_EQ(slurp(a.file("part-00002")), slurp(b.file("part-00002")));
  EXPECT_EQ(sa.auc, sb.auc);
  const std::string json = slurp(a.file("oracle.json"));
  EXPECT_NE(json.find("\"keys_per_slot\": \"0:3\""), std::string::npos) << json;

  DatasetConfig c = slot_config(o.slots, o.dense);
  InMemoryDataset ds(c);
  ds.set_filelist(
      {a.file("part-00000"), a.file("part-00001"), a.file("part-00002"), a.file("part-00003")});
  ASSERT_TRUE(ds.load_into_memory().ok());
  ASSERT_EQ(ds.size(), o.lines);
  EXPECT_EQ(ds.load_stats().skipped_lines(), 0u);
  std::vector<std::uint64_t> count_of(4, 0);
  std::set<std::size_t> keys_per_line;
  std::vector<double> logits;
  std::vector<std::uint8_t> labels;
  const PlantedModel model = planted_model(o);
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const InstanceRef r = ds.instance(i);
    std::size_t at = 0;
    for (int s = 0; s < o.slots; ++s) {
      ASSERT_LE(r.slot_sizes[s], 3u);
      ++count_of[r.slot_sizes[s]];
      for (std::uint32_t k = 0; k < r.slot_sizes[s]; ++k, ++at) {
        ASSERT_GE(r.keys[at], static_cast<std::uint64_t>(s) * o.vocab + 1);
        ASSERT_LE(r.keys[at], static_cast<std::uint64_t>(s + 1) * o.vocab);
      }
    }
    keys_per_line.insert(r.num_keys());
    logits.push_back(model.logit(r.keys, r.slot_sizes, r.dense));
    labels.push_back(r.label > 0.5f ? 1 : 0);
  }
  // Counts uniform on 0..3: each about a quarter of the 9000 slots (5 sigma ~ 200).
  for (int n = 0; n <= 3; ++n) {
    EXPECT_NEAR(static_cast<double>(count_of[n]), o.lines * o.slots / 4.0, 200.0) << n << " keys";
  }
  EXPECT_GT(keys_per_line.size(), 10u) << "keys per line should vary";
  EXPECT_NEAR(json_value(json, "auc"), pairwise_auc(logits, labels), 1e-8);
  EXPECT_GT(sa.auc, 0.7);

  // A fixed count of N draws no count: every slot holds exactly N keys.
  ScratchDir fixed_dir;
  GeneratorOptions fixed = small_options(fixed_dir.path(), 1);
  fixed.keys_per_slot_min = fixed.keys_per_slot_max = 2;
  ASSERT_TRUE(generate(fixed, &sa).ok());
  InMemoryDataset fixed_ds(c);
  fixed_ds.set_filelist({fixed_dir.file("part-00000")});
  ASSERT_TRUE(fixed_ds.load_into_memory().ok());
  for (std::size_t i = 0; i < fixed_ds.size(); ++i) {
    ASSERT_EQ(fixed_ds.instance(i).num_keys(), 2u * o.slots) << "line " << i;
  }
}

TEST(Generator, ParsesKeysPerSlot) {
  GeneratorOptions o;
  ASSERT_TRUE(parse_keys_per_slot("2:5", &o).ok());
  EXPECT_EQ(o.keys_per_slot_min, 2);
  EXPECT_EQ(o.keys_per_slot_max, 5);
  ASSERT_TRUE(parse_keys_per_slot("3", &o).ok());
  EXPECT_EQ(o.keys_per_slot_min, 3);
  EXPECT_EQ(o.keys_per_slot_max, 3);
  ASSERT_TRUE(parse_keys_per_slot("0:1000", &o).ok());
  for (const char* bad : {"", ":", "5:2", "0:0", "0", "1:1001", "a:b", "-1:2", "1:2:3", " 1:2"}) {
    const Status st = parse_keys_per_slot(bad, &o);
    EXPECT_FALSE(st.ok()) << "'" << bad << "'";
    EXPECT_NE(st.message().find("--keys_per_slot"), std::string::npos) << st.message();
  }
  // generate() checks options set directly, too.
  ScratchDir dir;
  OracleSummary s;
  GeneratorOptions direct = small_options(dir.path(), 1);
  direct.keys_per_slot_min = 4;
  direct.keys_per_slot_max = 2;
  EXPECT_FALSE(generate(direct, &s).ok());
}

TEST(ZipfSampler, FrequenciesFollowThePowerLaw) {
  const std::uint64_t n = 200;
  const double exponent = 1.2;
  const ZipfSampler zipf(n, exponent);
  double total = 0;
  for (std::uint64_t r = 0; r < n; ++r) total += std::pow(r + 1.0, -exponent);
  const int draws = 400000;
  std::vector<int> count(n, 0);
  for (int i = 0; i < draws; ++i) {
    const std::uint64_t r = zipf(mix64(static_cast<std::uint64_t>(i) + 12345));
    ASSERT_LT(r, n);
    ++count[r];
  }
  for (std::uint64_t r : {0, 1, 2, 5, 20, 100, 199}) {
    const double p = std::pow(r + 1.0, -exponent) / total;
    const double sigma = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(count[r], draws * p, 5 * sigma + 1) << "rank " << r;
  }
  const ZipfSampler one(1, 1.0);
  EXPECT_EQ(one(~0ull), 0u);
}

// FNV-1a of a string: a fingerprint for the golden check below.
std::uint64_t fnv1a(const std::string& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

TEST(Generator, DefaultSamplerOutputIsUnchanged) {
  // Files and oracle of small_options as written before closed_form existed (tests and
  // benchmarks compare against data generated with the default sampler).
  ScratchDir dir;
  OracleSummary s;
  ASSERT_TRUE(generate(small_options(dir.path(), 2), &s).ok());
  std::string all;
  for (const std::string name :
       {"part-00000", "part-00001", "part-00002", "part-00003", "oracle.json"}) {
    all += slurp(dir.file(name));
  }
  EXPECT_EQ(all.size(), 151862u);
  EXPECT_EQ(fnv1a(all), 0x46748536767b430ULL);
}

TEST(Generator, ClosedFormSamplerStreamsAHugeVocabulary) {
  ScratchDir a, b;
  GeneratorOptions o = small_options(a.path(), 1);
  o.key_sampler = KeySampler::kClosedForm;
  o.vocab = std::uint64_t{1} << 36;  // 2^36 keys a slot: no table could hold it
  o.zipf = 0.9;
  OracleSummary sa, sb;
  ASSERT_TRUE(generate(o, &sa).ok());
  o.out_dir = b.path();
  o.threads = 3;
  ASSERT_TRUE(generate(o, &sb).ok());
  EXPECT_EQ(slurp(a.file("part-00001")), slurp(b.file("part-00001")));
  EXPECT_EQ(sa.auc, sb.auc);
  EXPECT_NE(slurp(a.file("oracle.json")).find("\"key_sampler\": \"closed_form\""),
            std::string::npos);
  // Keys stay in their slot's range, and a heavy tail makes most of them distinct.
  DatasetConfig c = slot_config(o.slots, o.dense);
  InMemoryDataset ds(c);
  ds.set_filelist(
      {a.file("part-00000"), a.file("part-00001"), a.file("part-00002"), a.file("part-00003")});
  ASSERT_TRUE(ds.load_into_memory().ok());
  ASSERT_EQ(ds.size(), o.lines);
  std::set<std::uint64_t> distinct;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const InstanceRef r = ds.instance(i);
    for (int s = 0; s < o.slots; ++s) {
      ASSERT_GE(r.keys[s], static_cast<std::uint64_t>(s) * o.vocab + 1);
      ASSERT_LE(r.keys[s], static_cast<std::uint64_t>(s + 1) * o.vocab);
      distinct.insert(r.keys[s]);
    }
  }
  EXPECT_GT(distinct.size(), o.lines * o.slots * 9 / 10);
  // The alias table refuses such a vocabulary and names the way out.
  o.key_sampler = KeySampler::kAlias;
  const Status st = generate(o, &sa);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("closed_form"), std::string::npos) << st.message();
}

TEST(PowerLawSampler, FrequenciesFollowTheContinuousLaw) {
  const std::uint64_t n = 200;
  const int draws = 400000;
  for (const double exponent : {0.0, 0.8, 1.0, 1.2}) {
    const PowerLawSampler law(n, exponent);
    // P(r) = ∫_{r+1}^{r+2} x^-a dx / ∫_1^{n+1} x^-a dx.
    const auto integral = [&](double lo, double hi) {
      return exponent == 1.0
                 ? std::log(hi / lo)
                 : (std::pow(hi, 1 - exponent) - std::pow(lo, 1 - exponent)) / (1 - exponent);
    };
    const double total = integral(1.0, n + 1.0);
    std::vector<int> count(n, 0);
    for (int i = 0; i < draws; ++i) {
      const std::uint64_t r = law(mix64(static_cast<std::uint64_t>(i) + 777));
      ASSERT_LT(r, n);
      ++count[r];
    }
    for (std::uint64_t r : {0, 1, 2, 5, 20, 100, 199}) {
      const double p = integral(r + 1.0, r + 2.0) / total;
      const double sigma = std::sqrt(draws * p * (1 - p));
      EXPECT_NEAR(count[r], draws * p, 5 * sigma + 1) << "exponent " << exponent << " rank " << r;
    }
  }
  const PowerLawSampler one(1, 1.1);
  EXPECT_EQ(one(~0ull), 0u);
  EXPECT_EQ(one(0), 0u);
  const PowerLawSampler big(std::uint64_t{1} << 39, 1.05);
  EXPECT_LT(big(~0ull), std::uint64_t{1} << 39);
}

TEST(ExactAuc, MatchesPairwiseCountWithTies) {
  std::mt19937_64 rng(5);
  for (int n : {1, 2, 10, 300}) {
    std::vector<double> s(n);
    std::vector<std::uint8_t> y(n);
    for (int i = 0; i < n; ++i) {
      s[i] = static_cast<double>(rng() % 20);  // many ties
      y[i] = rng() % 3 == 0;
    }
    const bool both =
        std::count(y.begin(), y.end(), 1) > 0 && std::count(y.begin(), y.end(), 0) > 0;
    if (both) {
      EXPECT_NEAR(exact_auc(s, y), pairwise_auc(s, y), 1e-12) << n;
    } else {
      EXPECT_TRUE(std::isnan(exact_auc(s, y))) << n;
    }
  }
  EXPECT_TRUE(std::isnan(exact_auc({}, {})));
  EXPECT_DOUBLE_EQ(mean_logloss({0.0}, {1}), std::log(2.0));
  EXPECT_NEAR(mean_logloss({800.0, -800.0}, {1, 0}), 0.0, 1e-12);
  EXPECT_NEAR(mean_logloss({-800.0}, {1}), 800.0, 1e-9);
}

}  // namespace
}  // namespace gpubox::dataset
