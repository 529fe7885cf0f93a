// The fixture of the step-accounting tests (step_accounting_test.cpp, step_varying_keys_test.cpp:
// one binary): seeded data made once per run (the default model's shape; per-card unique key
// counts that grow after the warm-up; slot data whose keys per line vary) and the default model
// trained over it, the pass reports' per-step counts returned.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "tests/integration/trainer_rows.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer::step_test {

namespace fs = std::filesystem;

using gpubox::trainer::testing::cards_env;
using gpubox::trainer::testing::generate_lines;

class StepAccounting : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_step_accounting_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    generate_lines((root_ / "train").string(), 4000, /*seed=*/3, /*vocab=*/5000);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Data whose per-card unique key count grows after the warm-up steps, by less than the
  // exchange buffers' 1.5x headroom: a first batch per card at zipf 1.2, a second one with fewer
  // unique keys (zipf 1.4), then batches with more (zipf 1.1). Without headroom a buffer sized
  // to the first batch grows at the first steady step that has more keys. Made once per run.
  static std::string growing_keys_dir(int cards) {
    const fs::path dir = root_ / ("growing_" + std::to_string(cards));
    if (fs::exists(dir)) return dir.string();
    const struct {
      uint64_t lines;
      double zipf;
    } parts[] = {{100u * cards, 1.2}, {100u * cards, 1.4}, {2000u * cards, 1.1}};
    int index = 0;
    for (const auto& part : parts) {
      generate_lines((root_ / "part").string(), part.lines, /*seed=*/5, /*vocab=*/5000, "",
                     part.zipf);
      fs::create_directories(dir);
      fs::rename(root_ / "part" / "part-00000", dir / ("part-0000" + std::to_string(index++)));
      fs::remove_all(root_ / "part");
    }
    return dir.string();
  }

  // Slot-format data whose keys per line VARY (Criteo's and PaddleRec's slot data do): each of
  // the 26 slots holds 0 to 3 keys (zipf-like ranks), so every batch has its own occurrence,
  // distinct-key and per-owner counts. The generator's default data has 26 keys a line: only the
  // distinct counts vary there. Made once per run.
  static std::string varying_keys_dir() {
    const fs::path dir = root_ / "varying";
    if (fs::exists(dir)) return dir.string();
    fs::create_directories(dir);
    std::ofstream out(dir / "part-00000");
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const int keys_per_slot[] = {0, 1, 1, 1, 2, 3};
    for (int line = 0; line < 4037; ++line) {  // a short last round: smaller batches
      out << "click:" << (unit(rng) < 0.25 ? 1 : 0);
      for (int d = 0; d < 13; ++d) out << " dense_feature:" << unit(rng);
      for (int slot = 1; slot <= 26; ++slot) {
        for (int k = keys_per_slot[rng() % 6]; k > 0; --k) {
          const auto rank = static_cast<uint64_t>(std::pow(unit(rng) + 1e-9, -1.0) * 3) % 3000;
          out << ' ' << slot << ':' << (static_cast<uint64_t>(slot) * 100000 + rank + 1);
        }
      }
      out << '\n';
    }
    return dir.string();
  }

  // The default model (configs/config_gpubox.yaml's: fc 512-256-128-32, 26 slots x 9) at a
  // small batch, so a pass has many steps.
  using Counts = std::map<std::string, double>;
  static Counts second_pass(int cards, bool collective = false) {
    return both_passes(cards, {std::string("runner.use_fleet=") + (collective ? "true" : "false")})
        .second;
  }
  // The counts of the first and the second pass.
  // `eval` (optional): the counts of an evaluation over the same data after the two passes.
  static std::pair<Counts, Counts> both_passes(int cards, const std::vector<std::string>& extra,
                                               const std::string& data_dir = "",
                                               Counts* eval = nullptr) {
    // The default config (every key at its table default) with a small batch, so a pass has
    // many steps; print_interval 7 puts progress readbacks inside the counted steps too.
    std::vector<std::string> overrides = {
        "runner.train_data_dir=" + (data_dir.empty() ? (root_ / "train").string() : data_dir),
        "runner.train_batch_size=100", "runner.shuffle=false",
        "runner.metrics_path=", "runner.print_interval=7"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto parsed = parse_trainer_config("runner: {}\n", ".", overrides);
    throw_if_error(parsed.status());
    TrainerConfig config = std::move(parsed).value();
    Trainer trainer(config, cards_env(cards));
    const auto files = data_files(config.runner.train_data_dir);
    const PassReport first = trainer.train_pass(files);
    const PassReport second = trainer.train_pass(files);
    if (eval != nullptr) {
      const EvalResult result = trainer.evaluate(files, /*keep_predictions=*/false);
      *eval = Counts(result.extra.begin(), result.extra.end());
    }
    return {Counts(first.extra.begin(), first.extra.end()),
            Counts(second.extra.begin(), second.extra.end())};
  }

  inline static fs::path root_;
};

}  // namespace gpubox::trainer::step_test
