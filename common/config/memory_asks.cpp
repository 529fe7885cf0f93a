#include "common/config/memory_asks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace gpubox::config {

std::string bytes_text(double bytes) {
  char text[32];
  if (bytes >= 1e9) {
    std::snprintf(text, sizeof(text), "%.1f GB", bytes / 1e9);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1e6);
  }
  return text;
}

namespace {

// The dense layers between hidden widths and into the 1-wide logit: weights and biases.
MemoryAsk dense_layers(const ConfigDocument& doc) {
  const std::vector<int> fc = doc.get_int_list("hyper_parameters.fc_sizes");
  double weights = 0, largest = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < fc.size(); ++i) {
    const double out = i + 1 < fc.size() ? fc[i + 1] : 1.0;
    const double layer = static_cast<double>(fc[i]) * out;
    weights += layer + out;
    if (layer > largest) {
      largest = layer;
      at = i;
    }
  }
  MemoryAsk ask{"hyper_parameters.fc_sizes", doc.value_text("hyper_parameters.fc_sizes"),
                weights * sizeof(float), "of dense weights per card"};
  if (at + 1 < fc.size()) {
    ask.what += " (a " + std::to_string(fc[at]) + " x " + std::to_string(fc[at + 1]) +
                " layer; the optimizer's moments take as much again each)";
  }
  return ask;
}

// A step's activations (and, training, their gradients): the batch key's x every hidden width.
MemoryAsk activations(const ConfigDocument& doc, const char* batch_key, double copies,
                      const char* what) {
  double widths = 0;
  for (int w : doc.get_int_list("hyper_parameters.fc_sizes")) widths += w;
  const double batch = doc.get_int<int64_t>(batch_key);
  return {batch_key, doc.value_text(batch_key), copies * batch * widths * sizeof(float), what};
}

}  // namespace

std::vector<MemoryAsk> memory_asks(const ConfigDocument& doc) {
  std::vector<MemoryAsk> asks = {
      dense_layers(doc),
      activations(doc, "runner.train_batch_size", 2,
                  "of activations and their gradients per card and step (with "
                  "hyper_parameters.fc_sizes)"),
      activations(doc, "runner.infer_batch_size", 1,
                  "of activations per card and evaluation step (test_data_dir, --mode infer; "
                  "with hyper_parameters.fc_sizes)"),
      // Two AUC histograms (positives, negatives) of 2^log2 doubles each (metric_values.hpp).
      {"runner.auc_buckets_log2", doc.value_text("runner.auc_buckets_log2"),
       2.0 * sizeof(double) * std::ldexp(1.0, doc.get_int("runner.auc_buckets_log2")),
       "of AUC histograms per card"}};
  for (const char* key : {"runner.card_memory_mb", "runner.host_memory_mb"}) {
    const int64_t mb = doc.get_int<int64_t>(key);
    if (mb > 0) asks.push_back({key, doc.value_text(key), mb * 1048576.0, "as budgeted"});
  }
  std::stable_sort(asks.begin(), asks.end(),
                   [](const MemoryAsk& a, const MemoryAsk& b) { return a.bytes > b.bytes; });
  return asks;
}

std::string out_of_memory_text(const ConfigDocument& doc, const std::string& what) {
  std::string text =
      "out of memory (" + what + "); what " + doc.source() + " asks for, largest first:";
  for (const MemoryAsk& a : memory_asks(doc)) {
    text += "\n  " + a.key + " = " + a.value + ": at least " + bytes_text(a.bytes) + " " + a.what;
  }
  return text;
}

}  // namespace gpubox::config
