// A row's slot, end to end: data -> begin_pass -> card row -> end_pass -> host-tier row -> save
// file. Every row a pass creates carries the slot id of its key's first occurrence in load order
// (files in list order, lines in file order, slots in data order), whatever the shuffle, the
// reader threads and the number of cards. Oracle: one std::unordered_map pass over the text in
// that order. Slot ids: a numeric slot name is its number, another name is its position.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/device/memory.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kSlotNames = {"7", "19", "user"};
const std::vector<int32_t> kSlotIds = {7, 19, 2};  // "user" is not a number: its position

// Writes `files` files of seeded lines (every key from a small vocabulary, so keys repeat within
// and across slots) and returns each key's expected slot id: its first occurrence's.
std::unordered_map<uint64_t, int32_t> write_data(const fs::path& dir, int files, int lines,
                                                 uint64_t seed) {
  fs::create_directories(dir);
  std::mt19937_64 rng(seed);
  std::unordered_map<uint64_t, int32_t> first_slot;
  for (int f = 0; f < files; ++f) {
    std::ofstream out(dir / ("part-" + std::to_string(f) + ".txt"));
    for (int l = 0; l < lines; ++l) {
      out << "click:" << (rng() % 2) << " dense_feature:0." << (rng() % 10);
      for (std::size_t s = 0; s < kSlotNames.size(); ++s) {
        const int values = 1 + static_cast<int>(rng() % 2);
        for (int v = 0; v < values; ++v) {
          const uint64_t key = 1 + rng() % 300;
          out << ' ' << kSlotNames[s] << ':' << key;
          first_slot.emplace(key, kSlotIds[s]);  // keeps the first
        }
      }
      out << '\n';
    }
  }
  return first_slot;
}

TrainerConfig config(const fs::path& data, int cards) {
  const std::vector<std::string> overrides = {
      "runner.train_data_dir=" + data.string(),
      "runner.train_batch_size=" + std::to_string(32 / cards),
      "runner.epochs=1",
      "runner.shuffle=true",
      "runner.thread_num=3",
      "runner.metrics_path=",
      "runner.model_save_path=",
      "runner.save_form=text",
      "hyper_parameters.sparse_inputs_slots=4",
      "hyper_parameters.slot_names=[\"7\", \"19\", \"user\"]",
      "hyper_parameters.sparse_feature_dim=3",
      "hyper_parameters.dense_input_dim=1",
      "hyper_parameters.fc_sizes=[8]"};
  auto cfg = load_trainer_config(std::string(GPUBOX_SOURCE_DIR) + "/configs/config_gpubox.yaml",
                                 overrides);
  throw_if_error(cfg.status());
  return cfg.value();
}

class SlotPath : public ::testing::TestWithParam<int> {};

TEST_P(SlotPath, EveryRowCarriesItsKeysFirstSlotOnEachTier) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const fs::path root =
      fs::temp_directory_path() /
      ("gpubox_slot_path_" + std::to_string(::getpid()) + "_" + std::to_string(cards));
  fs::remove_all(root);
  const auto want = write_data(root / "data", 3, 120, 41);
  TrainerEnv env;
  env.selected_cards = cards == 1 ? "0" : "0,1";
  env.threads_per_card = 1;
  Trainer trainer(config(root / "data", cards), env);
  trainer.train_pass(data_files((root / "data").string()));  // begin_pass .. end_pass
  const table::RowLayout& layout = trainer.host_tier().layout();
  const int stride = layout.stride();

  // Card tier: every row on its owner card.
  std::size_t on_cards = 0;
  tier_owner::CardTier& tier = trainer.card_tier();
  for (int c = 0; c < tier.num_cards(); ++c) {
    device::Card& card = tier.store(c).card();
    device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
    device::device_buffer<float> rows(0, card.memory(), card.stream());
    const std::size_t n = tier.store(c).collect_all(keys, rows, card.stream());
    const auto host_keys = device::to_host(keys.data(), n, card.stream());
    const auto host_rows = device::to_host(rows.data(), n * stride, card.stream());
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(want.count(host_keys[i]), 1u)
          << "card " << c << ": unexpected key " << host_keys[i];
      EXPECT_EQ(host_rows[i * stride + layout.slot()], want.at(host_keys[i]))
          << "card " << c << ", key " << host_keys[i];
    }
    on_cards += n;
  }
  EXPECT_EQ(on_cards, want.size());

  // Host tier after end_pass.
  auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
  ASSERT_NE(table, nullptr);
  std::size_t on_host = 0;
  throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
    ++on_host;
    ASSERT_EQ(want.count(key), 1u) << "host: unexpected key " << key;
    EXPECT_EQ(row[layout.slot()], want.at(key)) << "host, key " << key;
  }));
  EXPECT_EQ(on_host, want.size());

  // Save file: text model records `key show click slot embed_w ...` (table/row_codec.hpp).
  trainer.save((root / "save").string());
  std::size_t saved = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "save" / "sparse")) {
    if (!entry.is_regular_file() || entry.path().filename().string().rfind("part-", 0) != 0) {
      continue;
    }
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      uint64_t key = 0;
      float show = 0, click = 0, slot = -1;
      ASSERT_TRUE(fields >> key >> show >> click >> slot) << entry.path() << ": " << line;
      ASSERT_EQ(want.count(key), 1u) << "save: unexpected key " << key;
      EXPECT_EQ(slot, want.at(key)) << entry.path() << ", key " << key;
      ++saved;
    }
  }
  EXPECT_EQ(saved, want.size());
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Cards, SlotPath, ::testing::Values(1, 2));

}  // namespace
}  // namespace gpubox::trainer
