// gpubox_train's config loader (trainer/config/config_loader.hpp: ConfigDocument plus every
// part) on any text. The input is YAML text, then optionally a NUL byte and `-o` overrides, one
// `key=value` per line. Beyond not crashing and not throwing:
//  - a refusal is a Status naming the source ("<fuzz>...") with a message;
//  - an accepted config holds every value inside the key table's bounds (what each part relies
//    on: at least one epoch, card batch and fc layer; mf_dim = sparse_feature_dim - 1 (ffm: times
//    its fields), at most 1023; slots = sparse_inputs_slots - 1; bounds ordered);
//  - loading the same input again gives the same model keys (no hidden state);
//  - every non-text model key's value_text, given back as `-o key=value` to an empty config,
//    reads as the same value (what a save records can be set again).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/config_keys.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer {
namespace {

constexpr const char* kSource = "<fuzz>";

void check_bounds(const TrainerConfig& c) {
  FUZZ_CHECK(c.runner.epochs >= 1, "epochs < 1");
  FUZZ_CHECK(c.runner.infer_batch_size >= 1 && c.dataset.batch_size >= 1, "batch size < 1");
  FUZZ_CHECK(c.runner.print_interval >= 1, "print_interval < 1");
  FUZZ_CHECK(c.runner.auc_buckets_log2 >= 20 && c.runner.auc_buckets_log2 <= 28, "auc buckets");
  FUZZ_CHECK(c.runner.card_memory_mb >= 0, "card_memory_mb < 0");
  FUZZ_CHECK(c.runner.prefetch_passes >= 0 && c.runner.prefetch_passes <= 8, "prefetch_passes");
  FUZZ_CHECK(c.runner.collective_timeout_s > 0, "collective_timeout_s <= 0");
  FUZZ_CHECK(!c.hyper.fc_sizes.empty(), "no fc layer");
  for (int size : c.hyper.fc_sizes) FUZZ_CHECK(size >= 1, "fc layer narrower than 1");
  FUZZ_CHECK(c.dataset.thread_num >= 1 && c.dataset.thread_num <= 1024, "thread_num");
  FUZZ_CHECK(c.dataset.dense_dim >= 0, "dense_input_dim < 0");
  FUZZ_CHECK(c.num_sparse_slots() >= 1, "no sparse slot");
  FUZZ_CHECK(c.sparse.mf_dim >= 0 && c.sparse.mf_dim <= 1023, "mf_dim out of range");
  FUZZ_CHECK(c.sparse.optimizer.min_bound <= c.sparse.optimizer.max_bound,
             "embed_w bounds out of order");
  FUZZ_CHECK(c.sparse.optimizer.mf_min_bound <= c.sparse.optimizer.mf_max_bound,
             "embedx bounds out of order");
  FUZZ_CHECK(!c.model_keys.empty(), "no model keys");
}

// value_text -> `-o key=value` -> the same value_text, for keys whose text is not free text.
void check_value_text_round_trip(const TrainerConfig& c) {
  std::vector<std::string> overrides;
  for (const auto& [key, text] : c.model_keys) {
    const config::KeySpec* spec = config::find_key(key);
    FUZZ_CHECK(spec != nullptr, "a model key that is not in the table");
    if (spec->type == config::KeyType::kString || spec->type == config::KeyType::kPath ||
        spec->type == config::KeyType::kStringList || spec->type == config::KeyType::kPathList) {
      continue;
    }
    overrides.push_back(key + "=" + text);
  }
  auto again = config::ConfigDocument::parse("runner: {}\n", "/", overrides, kSource);
  FUZZ_CHECK(again.ok(), "a model key's value_text is refused as -o key=value_text");
  for (const std::string& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    FUZZ_CHECK(again->value_text(key) == c.model_keys.at(key), "value_text does not round-trip");
  }
}

}  // namespace
}  // namespace gpubox::trainer

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace gpubox::trainer;  // NOLINT: the entry point is outside the namespace
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    std::string rest = input.substr(nul + 1);
    for (std::size_t begin = 0; begin <= rest.size();) {
      const std::size_t eol = std::min(rest.find('\n', begin), rest.size());
      overrides.push_back(rest.substr(begin, eol - begin));
      begin = eol + 1;
    }
  }
  auto config = parse_trainer_config(yaml, "/nonexistent/base", overrides, kSource);
  if (!config.ok()) {
    const std::string& message = config.status().message();
    FUZZ_CHECK(message.rfind(kSource, 0) == 0, "an error that does not name the source");
    FUZZ_CHECK(message.size() > std::string(kSource).size(), "an error without a message");
    return 0;
  }
  check_bounds(*config);
  auto again = parse_trainer_config(yaml, "/nonexistent/base", overrides, kSource);
  FUZZ_CHECK(again.ok() && again->model_keys == config->model_keys, "a second load differs");
  check_value_text_round_trip(*config);
  return 0;
}
