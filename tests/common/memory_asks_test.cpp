// What a config asks memory for (common/config/memory_asks.hpp): the key that sized a failed
// allocation comes first, with its value and a lower bound computed by hand here.
#include "common/config/memory_asks.hpp"

#include <gtest/gtest.h>

namespace gpubox::config {
namespace {

ConfigDocument parse_ok(const std::string& yaml) {
  StatusOr<ConfigDocument> doc = ConfigDocument::parse(yaml, "", {}, "test.yaml");
  EXPECT_TRUE(doc.ok()) << doc.status().to_string();
  return doc.ok() ? std::move(doc).value() : ConfigDocument::defaults();
}

TEST(MemoryAsks, HugeDenseLayersAreNamedFirst) {
  const ConfigDocument doc = parse_ok(
      "runner:\n  train_batch_size: 512\nhyper_parameters:\n  fc_sizes: [100000, 100000]\n");
  const std::vector<MemoryAsk> asks = memory_asks(doc);
  ASSERT_EQ(asks.size(), 4u);
  EXPECT_EQ(asks[0].key, "hyper_parameters.fc_sizes");
  EXPECT_EQ(asks[0].value, "[100000, 100000]");
  // 100000 x 100000 + 100000 biases, then 100000 x 1 + 1 into the logit; 4 bytes each.
  EXPECT_DOUBLE_EQ(asks[0].bytes, (1e10 + 1e5 + 1e5 + 1) * 4);
  EXPECT_EQ(asks[1].key, "runner.train_batch_size");
  EXPECT_DOUBLE_EQ(asks[1].bytes, 2.0 * 512 * 200000 * 4);
  const std::string text = out_of_memory_text(doc, "std::bad_alloc");
  EXPECT_EQ(text.rfind("out of memory (std::bad_alloc); what test.yaml asks for, largest first:\n"
                       "  hyper_parameters.fc_sizes = [100000, 100000]: at least 40.0 GB of dense "
                       "weights per card (a 100000 x 100000 layer",
                       0),
            0u)
      << text;
}

TEST(MemoryAsks, BudgetsAreListedWhenSetAndOrderedBySize) {
  const ConfigDocument doc = parse_ok("runner:\n  card_memory_mb: 100000\n");
  const std::vector<MemoryAsk> asks = memory_asks(doc);
  ASSERT_EQ(asks.size(), 5u);
  EXPECT_EQ(asks[0].key, "runner.card_memory_mb");
  EXPECT_DOUBLE_EQ(asks[0].bytes, 100000.0 * 1048576);
  for (std::size_t i = 1; i < asks.size(); ++i) EXPECT_GE(asks[i - 1].bytes, asks[i].bytes);
}

// An evaluation's batch too large: named (a failed allocation of --mode infer named
// runner.train_batch_size, which it does not use).
TEST(MemoryAsks, AHugeEvaluationBatchIsNamedFirst) {
  const ConfigDocument doc = parse_ok(
      "runner:\n  infer_batch_size: 2000000000\nhyper_parameters:\n  fc_sizes: [32, 16]\n");
  const std::vector<MemoryAsk> asks = memory_asks(doc);
  ASSERT_FALSE(asks.empty());
  EXPECT_EQ(asks[0].key, "runner.infer_batch_size");
  EXPECT_EQ(asks[0].value, "2000000000");
  EXPECT_DOUBLE_EQ(asks[0].bytes, 2e9 * 48 * 4);
}

// The AUC histograms at their largest (2^28 buckets: 4 GiB a card, unsaid when it ran out): named
// first, at two histograms of doubles.
TEST(MemoryAsks, TheAucHistogramsAreAnAsk) {
  const ConfigDocument doc = parse_ok("runner:\n  auc_buckets_log2: 28\n");
  const std::vector<MemoryAsk> asks = memory_asks(doc);
  ASSERT_FALSE(asks.empty());
  EXPECT_EQ(asks[0].key, "runner.auc_buckets_log2");
  EXPECT_EQ(asks[0].value, "28");
  EXPECT_DOUBLE_EQ(asks[0].bytes, 2.0 * 8 * 268435456);
  EXPECT_NE(out_of_memory_text(doc, "x").find("runner.auc_buckets_log2 = 28: at least 4.3 GB of "
                                              "AUC histograms per card"),
            std::string::npos);
}

}  // namespace
}  // namespace gpubox::config
