// hyper_parameters.slot_dims end to end, on generated data (6 numbered slots, default embedx
// width 4, slot 1 at 8 and slot 2 at 16):
//  - training on 1 and 2 cards gives every row the width of its slot (an unlisted slot the
//    default), in the card tier and in the host tier, and 2 cards train like 1;
//  - every slot listed at the default is bit-identical to no slot_dims;
//  - checkpoint and base saves round-trip exactly: the loaded table equals the saved one (an
//    std::unordered_map oracle of every row) and a re-save is byte-identical;
//  - a load under other widths is refused naming the slot; a slot_dims naming no slot of the
//    data, and deepfm over unequal widths, are refused;
//  - the same training against a gpubox_server process, which refuses a trainer of other widths.
// Bytes per key of each width class are printed (host tier rows at their own width).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/device/memory.hpp"
#include "table/detail/row_arena.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/folder_bytes.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/child_process.hpp"
#include "tests/table/manifest_edit.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

const std::string kMixed = "hyper_parameters.slot_dims={1: 8, 2: 16}";

class SlotDims : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_slot_dims_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::GeneratorOptions gen;
    gen.out_dir = (root_ / "train").string();
    gen.lines = 2000;
    gen.files = 2;
    gen.seed = 11;
    gen.slots = 6;
    gen.dense = 3;
    gen.vocab = 300;
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::vector<std::string> overrides(int batch, const std::vector<std::string>& extra) {
    std::vector<std::string> o = testing::small_dnn_overrides((root_ / "train").string(), batch,
                                                              {"runner.host_table_shards=4"});
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  }
  static TrainerConfig config(int batch, const std::vector<std::string>& extra = {}) {
    return testing::load_test_config(overrides(batch, extra));
  }
  static std::string config_path() {
    return std::string(GPUBOX_SOURCE_DIR) + "/configs/config_gpubox.yaml";
  }
  static TrainerEnv env(const std::string& cards, const std::string& servers = "") {
    TrainerEnv e;
    e.selected_cards = cards;
    e.threads_per_card = 1;
    e.servers = servers;
    return e;
  }
  static std::vector<std::string> train_files() { return data_files((root_ / "train").string()); }

  static fs::path root_;
};
fs::path SlotDims::root_;

using Rows = std::unordered_map<uint64_t, std::vector<float>>;

// Every host-tier row at its own width (RowLayout::of_row of the table's record layout).
Rows host_rows(Trainer& trainer) {
  auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
  GPUBOX_EXPECTS(table != nullptr, "the in-process host tier");
  const table::RowLayout record = table->layout();
  Rows rows;
  throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
    rows[key].assign(row, row + record.of_row(row).stride());
  }));
  return rows;
}

// Every row of one card (read back as records of the widest layout), per key.
Rows card_rows_of(const card_table::CardSparseStore& store) {
  Rows rows;
  device::Card& card = store.card();
  device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
  device::device_buffer<float> records(0, card.memory(), card.stream());
  const std::size_t n = store.collect_all(keys, records, card.stream());
  const auto host_keys = device::to_host(keys.data(), n, card.stream());
  const std::size_t stride = store.layout().stride();
  const auto host_records = device::to_host(records.data(), n * stride, card.stream());
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = host_records.data() + i * stride;
    rows[host_keys[i]].assign(row, row + store.layout().of_row(row).stride());
  }
  return rows;
}

// Every card row, per key.
Rows card_rows(tier_owner::CardTier& tier) {
  Rows rows;
  for (int c = 0; c < tier.num_cards(); ++c) rows.merge(card_rows_of(tier.store(c)));
  return rows;
}

// Checks every row's width against its slot's; returns rows per width.
std::map<int32_t, std::size_t> check_widths(const Rows& rows, const table::AccessorConfig& cfg,
                                            const std::string& tier) {
  const table::RowLayout record = table::record_layout(cfg);
  std::map<int32_t, std::size_t> per_width;
  for (const auto& [key, row] : rows) {
    const table::RowLayout own = record.of_row(row.data());
    const auto slot = static_cast<int32_t>(row[record.slot()]);
    EXPECT_EQ(own.mf_dim, table::slot_mf_dim(cfg, slot)) << tier << " key " << key;
    EXPECT_EQ(row.size(), static_cast<std::size_t>(own.stride())) << tier << " key " << key;
    ++per_width[own.mf_dim];
  }
  return per_width;
}

using gpubox::testing::folder_bytes;

TEST_F(SlotDims, EveryRowTakesItsSlotsWidthOnOneAndTwoCards) {
  GPUBOX_REQUIRE_CARDS(2);
  const TrainerConfig cfg1 = config(64, {kMixed});
  Trainer one(cfg1, env("0"));
  Trainer two(config(32, {kMixed}), env("0,1"));
  const PassReport r1 = one.train_pass(train_files());
  const PassReport r2 = two.train_pass(train_files());
  EXPECT_EQ(r1.metrics.examples, 2000);
  EXPECT_EQ(r2.metrics.examples, 2000);
  EXPECT_NEAR(r1.metrics.logloss, r2.metrics.logloss, 1e-4);
  EXPECT_EQ(two.dense_values(0), two.dense_values(1));
  EXPECT_GT(r1.metrics.auc, 0.55);  // it learns

  const table::AccessorConfig& sparse = cfg1.sparse;
  const Rows host = host_rows(two);
  const auto per_width = check_widths(host, sparse, "host tier");
  // Slots 3..6 are not listed: the default width (sparse_feature_dim - 1 = 4).
  ASSERT_EQ(per_width.size(), 3u);
  EXPECT_GT(per_width.at(4), 0u);
  EXPECT_GT(per_width.at(8), 0u);
  EXPECT_GT(per_width.at(16), 0u);
  // The card tier holds the same rows, bit for bit (end_pass wrote every dirty row back).
  const Rows cards = card_rows(two.card_tier());
  check_widths(cards, sparse, "card tier");
  EXPECT_EQ(cards, host);

  // Each card keeps each width's rows in that width's pool, at its own stride: the row bytes
  // are the sum over the widths, not every row at the widest stride.
  std::size_t own_bytes = 0;
  std::size_t widest_bytes = 0;
  for (int c = 0; c < two.card_tier().num_cards(); ++c) {
    const card_table::CardSparseStore& store = two.card_tier().store(c);
    ASSERT_EQ(store.pool_count(), 3);
    std::map<int32_t, std::size_t> on_card;
    for (const auto& [dim, rows] : check_widths(card_rows_of(store), sparse, "card")) {
      on_card[dim] = rows;
    }
    for (int32_t p = 0; p < store.pool_count(); ++p) {
      const int32_t dim = store.classes().dims[p];
      EXPECT_EQ(store.pool(p).in_use(), on_card[dim]) << "card " << c << " width " << dim;
      EXPECT_EQ(store.bytes_per_row(p),
                sizeof(float) * table::RowLayout::make(sparse.optimizer.kind, dim).stride());
      own_bytes += store.pool(p).in_use() * store.bytes_per_row(p);
    }
    widest_bytes += store.size() * store.bytes_per_row();
  }
  EXPECT_LT(own_bytes, widest_bytes * 3 / 4);
  std::printf("card tier rows: %zu bytes at their own widths, %zu at the widest stride\n",
              own_bytes, widest_bytes);

  const table::RowLayout record = table::record_layout(sparse);
  for (const auto& [dim, rows] : per_width) {
    const table::RowLayout own = table::RowLayout::make(sparse.optimizer.kind, dim);
    std::printf(
        "width class %2d: %5zu keys, %3zu bytes per key in a host arena (row %zu + epoch "
        "%zu; %zu at the widest class's stride)\n",
        dim, rows, sizeof(float) * own.stride() + table::detail::RowArena::kMetadataBytes,
        sizeof(float) * own.stride(), table::detail::RowArena::kMetadataBytes,
        sizeof(float) * record.stride() + table::detail::RowArena::kMetadataBytes);
  }
}

TEST_F(SlotDims, EverySlotAtTheDefaultIsBitIdenticalToNoSlotDims) {
  const std::string all_default = "hyper_parameters.slot_dims={1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4}";
  Trainer plain(config(50), env("0"));
  Trainer listed(config(50, {all_default}), env("0"));
  const PassReport a = plain.train_pass(train_files());
  const PassReport b = listed.train_pass(train_files());
  EXPECT_EQ(a.metrics.logloss, b.metrics.logloss);
  EXPECT_EQ(a.metrics.auc, b.metrics.auc);
  EXPECT_EQ(plain.dense_values(0), listed.dense_values(0));
  EXPECT_EQ(host_rows(plain), host_rows(listed));
}

TEST_F(SlotDims, SavesRoundTripExactly) {
  GPUBOX_REQUIRE_CARDS(2);
  for (const std::string mode : {"checkpoint", "base"}) {
    for (const std::string form : {"binary", "text"}) {
      SCOPED_TRACE(mode + " " + form);
      const std::vector<std::string> extra = {kMixed, "runner.save_mode=" + mode,
                                              "runner.save_form=" + form};
      const fs::path first = root_ / ("save_" + mode + "_" + form);
      const fs::path again = root_ / ("resave_" + mode + "_" + form);
      Trainer trained(config(40, extra), env("0,1"));
      trained.train_pass(train_files());
      trained.save(first.string());

      Trainer loaded(config(40, extra), env("0,1"));
      loaded.load(first.string());
      const Rows want = host_rows(trained);
      const Rows got = host_rows(loaded);
      ASSERT_EQ(got.size(), want.size());
      if (mode == "checkpoint") {
        EXPECT_EQ(got, want);  // full rows, optimizer state included
      } else {
        // A base save keeps the model fields; a loaded row starts its optimizer state afresh.
        const table::RowLayout record = table::record_layout(config(40, extra).sparse);
        for (const auto& [key, row] : want) {
          const auto it = got.find(key);
          ASSERT_NE(it, got.end()) << key;
          const table::RowLayout own = record.of_row(row.data());
          ASSERT_EQ(it->second.size(), row.size()) << key;
          EXPECT_EQ(it->second[table::RowLayout::kShow], row[table::RowLayout::kShow]);
          EXPECT_EQ(it->second[table::RowLayout::kEmbedW], row[table::RowLayout::kEmbedW]);
          for (int32_t d = 0; d < own.mf_dim; ++d) {
            EXPECT_EQ(it->second[own.embedx_w() + d], row[own.embedx_w() + d]) << key;
          }
        }
      }
      loaded.save(again.string());
      auto a = folder_bytes(first);
      auto b = folder_bytes(again);
      ASSERT_EQ(a.erase("MODEL_MANIFEST"), 1u);
      ASSERT_EQ(b.erase("MODEL_MANIFEST"), 1u);
      EXPECT_EQ(a.size(), b.size());
      for (const auto& [path, bytes] : a) {
        if (path.rfind("dense", 0) == 0) continue;  // the dense half is the dense net's own
        const auto it = b.find(path);
        ASSERT_NE(it, b.end()) << path;
        EXPECT_TRUE(it->second == bytes) << path << " differs in the re-save";
      }
    }
  }
}

// slot_dims with 16-bit sparse_storage (issue 15): the two change the same rows (widths per
// slot, values packed two per float), so each width class's packed rows are checked on both
// tiers, and a checkpoint round-trips them exactly and re-saves the same bytes.
TEST_F(SlotDims, MixedWidthsWithSixteenBitStorage) {
  GPUBOX_REQUIRE_CARDS(2);
  for (const std::string storage : {"fp16", "bf16"}) {
    SCOPED_TRACE(storage);
    const std::vector<std::string> extra = {kMixed, "hyper_parameters.sparse_storage=" + storage,
                                            "runner.save_mode=checkpoint"};
    const TrainerConfig cfg = config(40, extra);
    Trainer trained(cfg, env("0,1"));
    const PassReport report = trained.train_pass(train_files());
    EXPECT_GT(report.metrics.auc, 0.55);  // it learns
    const Rows host = host_rows(trained);
    const auto per_width = check_widths(host, cfg.sparse, "host tier");
    EXPECT_EQ(per_width.size(), 3u);
    const Rows cards = card_rows(trained.card_tier());
    check_widths(cards, cfg.sparse, "card tier");
    EXPECT_EQ(cards, host);

    const fs::path first = root_ / ("save_mixed_" + storage);
    const fs::path again = root_ / ("resave_mixed_" + storage);
    trained.save(first.string());
    Trainer loaded(cfg, env("0,1"));
    loaded.load(first.string());
    EXPECT_EQ(host_rows(loaded), host);
    loaded.save(again.string());
    auto a = folder_bytes(first);
    auto b = folder_bytes(again);
    for (const auto& [path, bytes] : a) {
      if (path.rfind("dense", 0) == 0 || path == "MODEL_MANIFEST") continue;
      const auto it = b.find(path);
      ASSERT_NE(it, b.end()) << path;
      EXPECT_TRUE(it->second == bytes) << path << " differs in the re-save";
    }
  }
}

// Keys seen in slots of different widths (the generated data's slots never share a key): each
// key's row takes the slot it is seen in first in load order (table/sparse_row/accessor.hpp),
// on the host tier that creates it at begin_pass and on the cards, after the pass's pushes and
// write-back, and through a base save (rows re-created from each record's slot) and a
// checkpoint save loaded into a fresh trainer, on 1 and 2 cards: against an oracle of each
// key's first (line, slot).
TEST_F(SlotDims, AKeyInSlotsOfDifferentWidthsTakesItsFirstSlotEverywhere) {
  GPUBOX_REQUIRE_CARDS(2);
  const fs::path data = root_ / "shared_keys";
  fs::create_directories(data);
  std::map<uint64_t, int32_t> first_slot;
  {
    std::ofstream out(data / "part-00000");
    std::mt19937_64 rng(17);
    for (int line = 0; line < 400; ++line) {
      out << "click:" << (rng() % 3 == 0 ? 1 : 0);
      for (int d = 0; d < 3; ++d) out << " dense_feature:0." << rng() % 10;
      for (int32_t slot = 1; slot <= 6; ++slot) {
        // Half the tokens from 40 keys that every slot uses, the rest the slot's own.
        const uint64_t key = rng() % 2 ? 1 + rng() % 40 : 1000 * slot + rng() % 50;
        out << ' ' << slot << ':' << key;
        first_slot.emplace(key, slot);
      }
      out << '\n';
    }
  }
  const auto check = [&](const Rows& rows, const table::AccessorConfig& cfg, const char* tier) {
    const table::RowLayout record = table::record_layout(cfg);
    EXPECT_EQ(rows.size(), first_slot.size()) << tier;
    std::size_t shared = 0;
    for (const auto& [key, row] : rows) {
      ASSERT_TRUE(first_slot.count(key)) << tier << " key " << key;
      const int32_t slot = first_slot.at(key);
      EXPECT_EQ(row[record.slot()], static_cast<float>(slot)) << tier << " key " << key;
      EXPECT_EQ(record.of_row(row.data()).mf_dim, table::slot_mf_dim(cfg, slot))
          << tier << " key " << key;
      shared += key <= 40;
    }
    EXPECT_EQ(shared, 40u) << tier;  // the keys of several slots are all there
  };
  const std::vector<std::string> files = data_files(data.string());
  for (const std::string cards : {"0", "0,1"}) {
    for (const std::string mode : {"base", "checkpoint"}) {
      SCOPED_TRACE(cards + ", " + mode);
      const TrainerConfig cfg = config(32, {kMixed, "runner.save_mode=" + mode});
      Trainer trained(cfg, env(cards));
      trained.train_pass(files);
      check(host_rows(trained), cfg.sparse, "host tier");
      check(card_rows(trained.card_tier()), cfg.sparse, "card tier");
      const fs::path save = root_ / ("shared_keys_save_" + mode + std::to_string(cards.size()));
      trained.save(save.string());
      Trainer loaded(cfg, env(cards));
      loaded.load(save.string());
      check(host_rows(loaded), cfg.sparse, "loaded host tier");
    }
  }
}

TEST_F(SlotDims, RefusesOtherWidthsAndUnknownSlotsAndUnequalDeepfm) {
  const fs::path save = root_ / "save_widths";
  {
    Trainer trainer(config(100, {kMixed, "runner.save_mode=checkpoint"}), env("0"));
    trainer.train_pass(train_files());
    trainer.save(save.string());
  }
  Trainer other(config(100, {"hyper_parameters.slot_dims={1: 8, 2: 4}"}), env("0"));
  try {
    other.load(save.string());
    ADD_FAILURE() << "a save of other widths loaded";
  } catch (const Error& e) {
    // The save's model keys name the widths before its rows would (slot 2 was saved with
    // embedx width 16).
    EXPECT_NE(std::string(e.what()).find(
                  "hyper_parameters.slot_dims: saved {1: 8, 2: 16}, now {1: 8, 2: 4}"),
              std::string::npos)
        << e.what();
  }
  // A table MANIFEST whose slot_dims has junk after a number (read as 1:8 before) is refused
  // naming the file and the item.
  const fs::path manifest = save / "sparse" / "MANIFEST";
  ASSERT_TRUE(
      gpubox::testing::set_manifest_property(manifest.string(), "slot_dims", "1:8junk,2:16"))
      << manifest;
  const TrainerConfig same = config(100, {kMixed});
  auto table = table::SparseTable::open(same.sparse, same.host_tier.table);
  throw_if_error(table.status());
  const Status junk = (*table)->load((save / "sparse").string());
  EXPECT_NE(
      junk.to_string().find(manifest.string() + ": slot_dims item 1 '1:8junk' is not slot:width"),
      std::string::npos)
      << junk.to_string();
  try {
    config(100, {"hyper_parameters.slot_dims={9: 8}"});
    ADD_FAILURE() << "slot_dims naming no slot was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot '9'"), std::string::npos) << e.what();
  }
  try {
    Trainer deepfm(config(100, {kMixed, "hyper_parameters.model=deepfm"}), env("0"));
    ADD_FAILURE() << "deepfm over unequal widths was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepfm"), std::string::npos) << e.what();
  }
}

// The host tier as a gpubox_server process: rows of three widths cross the wire and are stored
// there at their own width; the trainer's card tier holds each at its slot's.
TEST_F(SlotDims, TrainsAgainstAGpuboxServer) {
  const fs::path dir = root_ / "server";
  fs::create_directories(dir);
  // The server reads the trainer's config and overrides (its rows' widths and their rule: the
  // trainer is refused at connect when either differs).
  std::vector<std::string> args = {"--port",      "0",          "--config",
                                   config_path(), "--data_dir", dir.string()};
  for (const std::string& o : overrides(64, {kMixed})) {
    args.push_back("-o");
    args.push_back(o);
  }
  gpubox::testing::ChildProcess server(GPUBOX_SERVER_BIN, args);
  ASSERT_TRUE(server.wait_for(" (shard ", 20)) << server.output();
  const std::string& out = server.output();
  const auto at = out.find("listening on ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string endpoint = out.substr(at + 13, out.find(' ', at + 13) - at - 13);

  const TrainerConfig cfg = config(64, {kMixed});
  Trainer remote(cfg, env("0", endpoint));
  Trainer local(cfg, env("0"));
  const PassReport r = remote.train_pass(train_files());
  const PassReport l = local.train_pass(train_files());
  EXPECT_NEAR(r.metrics.logloss, l.metrics.logloss, 1e-6);
  EXPECT_EQ(remote.dense_values(0), local.dense_values(0));
  const Rows cards = card_rows(remote.card_tier());
  EXPECT_EQ(cards, host_rows(local));
  check_widths(cards, cfg.sparse, "card tier against the server");

  // A trainer whose slots the server would create at other widths is refused at start (here
  // the default and the widest width are the server's, so only slot 1's width tells them apart).
  try {
    Trainer narrower(config(64, {"hyper_parameters.slot_dims={1: 2, 2: 16}"}), env("0", endpoint));
    ADD_FAILURE() << "a trainer with other slot widths than the server's started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other embedx widths"), std::string::npos) << e.what();
  }
  // Another optimizer: named by its config name (it printed the enum's number), and the servers
  // said to refuse the trainer, not to be out of reach.
  try {
    Trainer other(config(64, {kMixed, "hyper_parameters.sparse_optimizer.class=sgd"}),
                  env("0", endpoint));
    ADD_FAILURE() << "a trainer with another optimizer than the server's started";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("do not match this trainer"), std::string::npos) << what;
    EXPECT_EQ(what.find("cannot reach"), std::string::npos) << what;
    EXPECT_NE(what.find("this trainer uses optimizer sgd"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace gpubox::trainer
