// `gpubox_data gen`: slot-format data drawn from a planted model, and that model's own AUC and
// logloss on the data it drew (the ceiling a trained model can approach).
//
// The planted model, for line i (all randomness from counter-based hashes of (seed, i), so the
// output does not depend on the number of threads):
//   slot s (0-based, named "s+1") holds one key (or, with --keys_per_slot MIN:MAX, n_s keys,
//   n_s uniform in [MIN, MAX] per line and slot; 0 leaves the slot out of the line), each of rank
//   r ~ Zipf(vocab, zipf) (P(r) ∝ (r+1)^-zipf),
//   key = s * vocab + r + 1 (never 0; distinct across slots); with key_sampler closed_form the
//   rank is floor(x) - 1 for x drawn from the continuous power law ∝ x^-zipf on [1, vocab + 1)
//   (by its inverse CDF: no table, so vocabularies of 10^8 and more per slot cost no memory);
//   dense feature j: x_j = k / 1000 with k uniform in [0, 1000);
//   logit = bias + Σ_keys w(key) + Σ_j u_j x_j + Σ_{s<t} <e_s, e_t>, e_s = Σ_{key in slot s} v(key)
//   (the slot's sum-pooled vector: one key a slot makes it v(key_s)), with per-key weight w,
//   per-key vector v of factor_dim entries and per-feature u_j drawn uniform with standard
//   deviation sigma_w, sigma_v, sigma_u (hashes of (seed, key)); label ~ Bernoulli(sigmoid(logit));
//   bias is calibrated to a target positive rate (--ctr).
// The pairwise term is what an embedding model can learn and a linear one cannot.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::dataset {

// How a slot's key rank is drawn (--key_sampler): alias = the exact Zipf law from an alias table
// (8 bytes a vocabulary entry, built once); closed_form = the continuous power law's inverse CDF
// (nothing held; the head ranks differ slightly from Zipf). The planted weights are hashes of
// the key either way, so closed_form generates any vocabulary in constant memory.
enum class KeySampler { kAlias, kClosedForm };

struct GeneratorOptions {
  std::string out_dir;
  std::uint64_t lines = 1000;
  int files = 1;
  std::uint64_t seed = 1;
  int slots = 26;
  // Keys in each slot of a line: uniform in [keys_per_slot_min, keys_per_slot_max], drawn per
  // line and slot (data whose keys per batch vary, as PaddleRec's slot data and Criteo's do).
  // 1:1 draws no count, so the default's output is what it always was.
  int keys_per_slot_min = 1;
  int keys_per_slot_max = 1;
  int dense = 13;
  std::uint64_t vocab = 100000;  // distinct keys per slot (alias: < 2^32; closed_form: < 2^40)
  double zipf = 1.1;
  KeySampler key_sampler = KeySampler::kAlias;
  int factor_dim = 4;
  // Target positive rate: the bias is set so that the mean predicted probability over the first
  // 20000 lines equals it (deterministic for a seed). <= 0: use `bias` as given.
  double ctr = 0.25;
  // Lines are drawn as lines first_line .. first_line + lines - 1 of the seed's stream: the same
  // seed with a first_line past the training lines gives held-out data of the same model.
  std::uint64_t first_line = 0;
  double bias = -2.0;
  double sigma_w = 0.25;
  double sigma_v = 0.0;  // 0: chosen so the pairwise term has variance about 1
  double sigma_u = 1.0;
  int threads = 1;
};

// The planted model's parameters as functions of (seed, key); cheap to copy.
class PlantedModel {
 public:
  explicit PlantedModel(const GeneratorOptions& options);
  std::uint64_t key(int slot, std::uint64_t rank) const {
    return static_cast<std::uint64_t>(slot) * vocab_ + rank + 1;
  }
  // Logit of an instance: keys[s] is slot s's key (0 = absent), dense has `dense` values.
  double logit(const std::uint64_t* keys, const float* dense) const;
  // Logit of an instance with slot_sizes[s] keys in slot s, the keys slot by slot (as
  // InstanceRef holds them).
  double logit(const std::uint64_t* keys, const std::uint32_t* slot_sizes,
               const float* dense) const;
  double sigma_v() const { return sigma_v_; }
  double bias() const { return bias_; }
  void set_bias(double bias) { bias_ = bias; }

 private:
  // The logit with slot s's keys keys[begin(s)] .. keys[end(s) - 1], zeros skipped.
  template <class SlotBounds>
  double logit_of(const std::uint64_t* keys, SlotBounds bounds, const float* dense) const;
  double weight(std::uint64_t key) const;
  double factor(std::uint64_t key, int j) const;

  int slots_;
  int dense_;
  int factor_dim_;
  std::uint64_t vocab_;
  std::uint64_t seed_;
  double bias_;
  double sigma_w_;
  double sigma_v_;
  std::vector<double> dense_weight_;
};

// Sampler of ranks in [0, n) with P(r) ∝ (r+1)^-exponent (Vose's alias method: O(1) a draw).
class ZipfSampler {
 public:
  ZipfSampler(std::uint64_t n, double exponent);
  std::uint64_t operator()(std::uint64_t random_bits) const;

 private:
  std::vector<std::uint32_t> threshold_;  // accept column c when the low 32 bits < threshold
  std::vector<std::uint32_t> alias_;
};

// Ranks in [0, n) with P(r) ∝ ∫_{r+1}^{r+2} x^-exponent dx: the continuous power law's inverse
// CDF, O(1) memory and time a draw.
class PowerLawSampler {
 public:
  PowerLawSampler(std::uint64_t n, double exponent);
  std::uint64_t operator()(std::uint64_t random_bits) const;

 private:
  std::uint64_t n_;
  double one_minus_exponent_;  // 0 for exponent 1 (the logarithmic form)
  double log_top_;             // log(n + 1)
  double top_term_;            // expm1((1 - exponent) * log(n + 1))
};

// The rank sampler of options.key_sampler.
class RankSampler {
 public:
  RankSampler(KeySampler kind, std::uint64_t n, double exponent);
  std::uint64_t operator()(std::uint64_t random_bits) const {
    return alias_ ? (*alias_)(random_bits) : power_law_(random_bits);
  }

 private:
  std::optional<ZipfSampler> alias_;  // kAlias only
  PowerLawSampler power_law_;
};

// "MIN:MAX" or "N" (N:N) of --keys_per_slot into options; 0 <= MIN <= MAX <= 1000, MAX >= 1.
Status parse_keys_per_slot(const std::string& text, GeneratorOptions* options);

// The model `generate` draws from: PlantedModel(options) with its bias calibrated to
// options.ctr when that is > 0.
PlantedModel planted_model(const GeneratorOptions& options);

struct OracleSummary {
  std::uint64_t lines = 0;
  std::uint64_t positives = 0;
  double positive_rate = 0.0;
  double auc = 0.0;
  double logloss = 0.0;
  double seconds = 0.0;
  std::uint64_t bytes = 0;
};

// Writes options.files files `part-00000`.. (line i goes to file i * files / lines) and
// `oracle.json` into options.out_dir (created if missing). Only a folder an earlier run wrote
// (oracle.json or the hidden marker .gpubox_gen, written before the part files, so a run cut
// short counts) is written into, its part files overwritten: any other entry but hidden ones
// and lost+found, or part files with neither beside them, is an error naming it, as is a part
// file beyond `files` from an earlier run.
Status generate(const GeneratorOptions& options, OracleSummary* summary);

// Exact ROC AUC by sorting; tied scores count one half. NaN when one class is absent (as the
// trainer's metrics: 0.5 read as a ceiling a one-class test set could be held to).
double exact_auc(const std::vector<double>& scores, const std::vector<std::uint8_t>& labels);
// Mean binary cross-entropy of sigmoid(logit) against labels.
double mean_logloss(const std::vector<double>& logits, const std::vector<std::uint8_t>& labels);

}  // namespace gpubox::dataset
