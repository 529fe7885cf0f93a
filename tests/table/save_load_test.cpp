// save/load: round trips in every mode and both forms, base + deltas reproduce the model,
// checkpoints reproduce everything bit-exact, a save interrupted at every step leaves the
// previous save loadable, and corrupt, truncated or partial saves are refused naming the file.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>
#include <tuple>

#include "table/dense_table.hpp"
#include "table/io/fault_env.hpp"
#include "table/io/save_dir.hpp"
#include "tests/table/slot_dims_config.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::RowMap;
using testing::ScratchDir;

// Real files without fsync: these tests take many saves, and durability is not what they check
// (the tests that pass env = nullptr below use the plain POSIX env, fsync included).
io::FileEnv* no_sync_env() {
  static io::FaultInjectingEnv env(io::FileEnv::posix(), /*real_syncs=*/false);
  return &env;
}

struct Fixture {
  explicit Fixture(SaveForm form, uint32_t shards = 8, bool disk = false,
                   io::FileEnv* env = no_sync_env())
      : opt(testing::test_optimizer()) {
    opt.delete_threshold = 0.0f;
    cfg.shards = shards;
    cfg.threads = 2;
    cfg.save_form = form;
    cfg.env = env;
    if (disk) {
      cfg.rocksdb_path = dir.sub("rocksdb");
      cfg.memory_row_budget = 64;
    }
    table = testing::open_table(opt, cfg);
  }
  std::unique_ptr<SparseTable> fresh(uint32_t shards = 0) {
    HostTableConfig c = cfg;
    if (shards != 0) c.shards = shards;
    c.env = nullptr;
    if (!c.rocksdb_path.empty()) c.rocksdb_path += std::to_string(++fresh_count);
    return testing::open_table(opt, c);
  }
  // Pushes random rows for `n` random keys from [0, key_space) and pulls `n / 2` others.
  void mutate(std::mt19937_64& rng, std::size_t n, uint64_t key_space) {
    const RowLayout layout = table->layout();
    std::vector<uint64_t> keys(n);
    std::vector<float> rows;
    for (auto& k : keys) {
      k = rng() % key_space;
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(table->push(keys.data(), n, rows.data()).ok());
    for (auto& k : keys) k = rng() % key_space;
    std::vector<float> out(n * layout.stride());
    ASSERT_TRUE(table->pull(keys.data(), nullptr, n / 2, out.data(), nullptr).ok());
  }

  ScratchDir dir;
  AccessorConfig opt;
  HostTableConfig cfg;
  std::unique_ptr<SparseTable> table;
  int fresh_count = 0;
};

class SaveLoadTest : public ::testing::TestWithParam<std::tuple<SaveForm, bool>> {};

TEST_P(SaveLoadTest, CheckpointRestoresEveryRowAndTheDay) {
  const auto [form, disk] = GetParam();
  for (std::size_t n : {0, 1, 500}) {
    Fixture f(form, 8, disk);
    std::mt19937_64 rng(n + 1);
    if (n > 0) f.mutate(rng, n, 1u << 30);
    ASSERT_TRUE(f.table->shrink().ok());
    const RowMap before = testing::snapshot(*f.table);
    ASSERT_TRUE(f.table->save(f.dir.sub("ckpt"), SaveKind::kCheckpoint).ok());
    for (uint32_t shards : {8u, 3u}) {  // another shard count re-shards the keys
      if (n < 2 && shards != 8) continue;
      auto loaded = f.fresh(shards);
      const Status st = loaded->load(f.dir.sub("ckpt"));
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_TRUE(testing::same_rows(testing::snapshot(*loaded), before)) << "n=" << n;
      EXPECT_EQ(loaded->day(), 1);
    }
  }
}

TEST_P(SaveLoadTest, BaseThenDeltasReproduceTheModel) {
  const auto [form, disk] = GetParam();
  Fixture f(form, 8, disk);
  const RowLayout layout = f.table->layout();
  std::mt19937_64 rng(42);
  f.mutate(rng, 800, 3000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  RowMap expected_after_base = testing::model_of(testing::snapshot(*f.table), layout);

  // Delta 1: pushes, new rows, erasures; delta 2: a shrink that deletes old rows.
  f.mutate(rng, 200, 3000);
  std::vector<uint64_t> gone = {rng() % 3000, rng() % 3000, rng() % 3000};
  ASSERT_TRUE(f.table->erase(gone.data(), gone.size()).ok());
  ASSERT_TRUE(f.table->save(f.dir.sub("delta1"), SaveKind::kDelta).ok());
  const RowMap expected_after_d1 = testing::model_of(testing::snapshot(*f.table), layout);
  f.mutate(rng, 50, 3000);
  for (int d = 0; d < 4; ++d) ASSERT_TRUE(f.table->shrink().ok());  // unseen > 3: all deleted
  f.mutate(rng, 30, 3000);
  ASSERT_TRUE(f.table->save(f.dir.sub("delta2"), SaveKind::kDelta).ok());
  const RowMap expected_after_d2 = testing::model_of(testing::snapshot(*f.table), layout);
  ASSERT_LT(expected_after_d2.size(), 200u);

  // A delta holds only what changed: nothing changed since delta2.
  ASSERT_TRUE(f.table->save(f.dir.sub("delta3"), SaveKind::kDelta).ok());
  auto manifest = io::read_manifest(io::FileEnv::posix(), f.dir.sub("delta3"), "sparse");
  ASSERT_TRUE(manifest.ok());
  for (const auto& file : manifest->files) EXPECT_EQ(file.records, 0u) << file.name;

  auto loaded = f.fresh();
  ASSERT_TRUE(loaded->load(f.dir.sub("base")).ok());
  EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout),
                                 expected_after_base));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta1")).ok());
  EXPECT_TRUE(
      testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), expected_after_d1));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta2")).ok());
  EXPECT_TRUE(
      testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), expected_after_d2));
  ASSERT_TRUE(loaded->load(f.dir.sub("delta3")).ok());
  EXPECT_TRUE(
      testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout), expected_after_d2));
}

TEST_P(SaveLoadTest, BaseLoadInitializesOptimizerState) {
  const auto [form, disk] = GetParam();
  Fixture f(form, 4, disk);
  const RowLayout layout = f.table->layout();
  std::mt19937_64 rng(8);
  f.mutate(rng, 100, 1000);
  ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
  auto loaded = f.fresh();
  ASSERT_TRUE(loaded->load(f.dir.sub("base")).ok());
  for (const auto& [key, row] : testing::snapshot(*loaded)) {
    // The row a fresh pull creates, with the saved model fields written over it.
    std::vector<float> want(layout.stride());
    std::vector<float> rec(record_floats(RecordKind::kModel, layout));
    row_to_record(RecordKind::kModel, layout, row.data(), rec.data());
    record_to_row(RecordKind::kModel, layout, f.opt, key, rec.data(), false, want.data());
    ASSERT_TRUE(testing::same_bits(row, want)) << "key " << key;
    EXPECT_EQ(row[RowLayout::kEmbedState], 0.0f);  // adagrad g2sum, fresh as Paddle's
    if (row[layout.mf_size()] > 0) {
      EXPECT_EQ(row[layout.embedx_state()], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FormsAndTiers, SaveLoadTest,
                         ::testing::Combine(::testing::Values(SaveForm::kText, SaveForm::kBinary),
                                            ::testing::Bool()));

TEST(SaveLoad, TextPartsAreKeyThenValuesPerLine) {
  Fixture f(SaveForm::kText, 1, false, nullptr);  // POSIX env, fsync included
  const RowLayout layout = f.table->layout();
  const uint64_t key = 18446744073709551615ull;
  std::vector<float> row(layout.stride(), 0.0f);
  row[RowLayout::kShow] = 3.0f;
  row[RowLayout::kClick] = 0.5f;
  row[layout.slot()] = 12.0f;
  row[RowLayout::kEmbedW] = -0.25f;
  ASSERT_TRUE(f.table->push(&key, 1, row.data()).ok());
  ASSERT_TRUE(f.table->save(f.dir.sub("m"), SaveKind::kBase).ok());
  std::ifstream in(f.dir.sub("m/part-0"));
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "18446744073709551615 3 0.5 12 -0.25 0 0 0 0 0");
  EXPECT_FALSE(std::getline(in, line));
}

TEST(SaveLoad, InterruptedSaveLeavesThePreviousSaveLoadable) {
  for (SaveForm form : {SaveForm::kBinary, SaveForm::kText}) {
    for (SaveKind mode : {SaveKind::kCheckpoint, SaveKind::kBase}) {
      io::FaultInjectingEnv env(io::FileEnv::posix(), /*real_syncs=*/false);
      Fixture f(form, 4, false, &env);
      const RowLayout layout = f.table->layout();
      std::mt19937_64 rng(11);
      f.mutate(rng, 300, 1u << 20);
      const std::string path = f.dir.sub("model");
      ASSERT_TRUE(f.table->save(path, mode).ok());
      const bool full = mode == SaveKind::kCheckpoint;
      auto view = [&](SparseTable& t) {
        RowMap rows = testing::snapshot(t);
        return full ? rows : testing::model_of(rows, layout);
      };
      const RowMap old_state = view(*f.table);
      f.mutate(rng, 300, 1u << 20);
      const RowMap new_state = view(*f.table);
      ASSERT_FALSE(testing::same_rows(old_state, new_state));

      int failures = 0, old_loaded = 0;
      for (int64_t step = 0;; ++step) {
        env.reset_steps();
        env.fail_from(step);
        const Status st = f.table->save(path, mode);
        env.fail_from(io::FaultInjectingEnv::kNever);
        auto loaded = f.fresh();
        const Status load_st = loaded->load(path);
        ASSERT_TRUE(load_st.ok()) << "after failing step " << step << ": " << load_st.to_string();
        const RowMap got = view(*loaded);
        if (st.ok()) {
          EXPECT_TRUE(testing::same_rows(got, new_state));
          break;
        }
        ++failures;
        EXPECT_NE(st.message().find("injected failure"), std::string::npos) << st.to_string();
        // Failing before the commit point leaves the old save; after it, the new one is complete.
        if (testing::same_rows(got, old_state)) {
          ++old_loaded;
        } else {
          EXPECT_TRUE(testing::same_rows(got, new_state)) << "step " << step;
        }
        ASSERT_LT(step, 500);
      }
      EXPECT_GT(failures, 10);
      EXPECT_GE(old_loaded, failures - 3);  // only the last steps (after the exchange) differ
    }
  }
}

// Saves a small model, then damages it with `damage` and expects load to fail naming `file`.
void expect_refused(SaveForm form, const std::string& file,
                    const std::function<void(const std::string&)>& damage) {
  Fixture f(form, 4, false, nullptr);
  std::mt19937_64 rng(5);
  f.mutate(rng, 200, 1u << 20);
  const std::string path = f.dir.sub("model");
  ASSERT_TRUE(f.table->save(path, SaveKind::kCheckpoint).ok());
  damage(path + "/" + file);
  // The table being loaded into keeps what it had.
  auto other = f.fresh();
  const uint64_t key = 77;
  std::vector<float> row(other->layout().stride());
  ASSERT_TRUE(other->pull(&key, nullptr, 1, row.data(), nullptr).ok());
  const RowMap before = testing::snapshot(*other);
  const Status st = other->load(path);
  ASSERT_FALSE(st.ok()) << file;
  EXPECT_NE(st.message().find(file), std::string::npos) << st.to_string();
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*other), before));
  // An empty table, read once and applied as read, is emptied again.
  auto empty = f.fresh();
  const Status into_empty = empty->load(path);
  ASSERT_FALSE(into_empty.ok()) << file;
  EXPECT_NE(into_empty.message().find(file), std::string::npos) << into_empty.to_string();
  EXPECT_TRUE(testing::snapshot(*empty).empty()) << file;
}

void flip_byte(const std::string& file) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(io.good()) << file;
  io.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(io.tellg());
  ASSERT_GT(size, 0);
  io.seekg(size / 2);
  char c = 0;
  io.read(&c, 1);
  c ^= 0x10;
  io.seekp(size / 2);
  io.write(&c, 1);
}

void truncate_file(const std::string& file) {
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
}

TEST(SaveLoad, CorruptTruncatedOrMissingFilesAreRefusedByName) {
  for (SaveForm form : {SaveForm::kBinary, SaveForm::kText}) {
    expect_refused(form, "part-2", flip_byte);
    expect_refused(form, "part-1", truncate_file);
    expect_refused(form, "part-3", [](const std::string& f) { std::filesystem::remove(f); });
    expect_refused(form, "MANIFEST", flip_byte);
    expect_refused(form, "MANIFEST", truncate_file);
    expect_refused(form, "MANIFEST", [](const std::string& f) { std::filesystem::remove(f); });
  }
}

// Loading into a table that holds rows reads each part twice (verified before anything is
// lost); into an empty one, once.
TEST(SaveLoad, AnEmptyTableReadsEachPartOnce) {
  Fixture f(SaveForm::kBinary, 4);
  std::mt19937_64 rng(9);
  f.mutate(rng, 300, 1u << 20);
  const std::string path = f.dir.sub("model");
  ASSERT_TRUE(f.table->save(path, SaveKind::kCheckpoint).ok());
  io::FaultInjectingEnv counting(io::FileEnv::posix());
  auto empty = f.fresh();
  ASSERT_TRUE(empty->load(path, &counting).ok());
  EXPECT_EQ(counting.sequential_opens(), 4);
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*empty), testing::snapshot(*f.table)));
  ASSERT_TRUE(empty->load(path, &counting).ok());
  EXPECT_EQ(counting.sequential_opens(), 4 + 2 * 4);
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*empty), testing::snapshot(*f.table)));
}

TEST(SaveLoad, RefusesAnotherLayoutAndForeignFolders) {
  Fixture f(SaveForm::kBinary, 2);
  std::mt19937_64 rng(1);
  f.mutate(rng, 10, 100);
  ASSERT_TRUE(f.table->save(f.dir.sub("m"), SaveKind::kCheckpoint).ok());
  AccessorConfig wide = f.opt;
  wide.mf_dim = 8;
  auto other = testing::open_table(wide, HostTableConfig{});
  const Status st = other->load(f.dir.sub("m"));
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("mf_dim"), std::string::npos) << st.to_string();
  // Rows saved under another rule (a PaddleRec config's rows took its Adam since): refused
  // naming both rules and the override that loads them.
  AccessorConfig other_rule = f.opt;
  const SparseOptimizerKind saved = f.opt.optimizer.kind;
  other_rule.optimizer.kind = saved == SparseOptimizerKind::kAdam ? SparseOptimizerKind::kAdagrad
                                                                  : SparseOptimizerKind::kAdam;
  const Status rule = testing::open_table(other_rule, HostTableConfig{})->load(f.dir.sub("m"));
  EXPECT_EQ(rule.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(rule.message().find(std::string("-o hyper_parameters.sparse_optimizer.class=") +
                                name_of(kSparseOptimizerKindNames, saved)),
            std::string::npos)
      << rule.to_string();
  EXPECT_NE(rule.message().find(name_of(kSparseOptimizerKindNames, other_rule.optimizer.kind)),
            std::string::npos)
      << rule.to_string();
  // A dense save is not a sparse one.
  DenseTable dense;
  ASSERT_TRUE(dense.save(f.dir.sub("dense")).ok());
  EXPECT_FALSE(f.table->load(f.dir.sub("dense")).ok());
  // Saving over a folder that is not a save is refused, and the folder kept.
  std::filesystem::create_directories(f.dir.sub("mine"));
  std::ofstream(f.dir.sub("mine/notes.txt")) << "keep me";
  EXPECT_FALSE(f.table->save(f.dir.sub("mine"), SaveKind::kBase).ok());
  EXPECT_TRUE(std::filesystem::exists(f.dir.sub("mine/notes.txt")));
  // A trailing slash names the same folder.
  ASSERT_TRUE(f.table->save(f.dir.sub("slash/"), SaveKind::kBase).ok());
  ASSERT_TRUE(f.table->save(f.dir.sub("slash/"), SaveKind::kBase).ok());
  EXPECT_TRUE(f.table->load(f.dir.sub("slash")).ok());
  EXPECT_FALSE(std::filesystem::exists(f.dir.sub("slash.tmp")));
  EXPECT_FALSE(std::filesystem::exists(f.dir.sub("slash/.tmp")));
}

TEST(SaveLoad, MalformedTextRecordsNameTheLine) {
  const RowLayout layout = RowLayout::make(SparseOptimizerKind::kSgd, 1);
  std::vector<uint64_t> keys;
  std::vector<float> recs;
  const int32_t floats = record_floats(RecordKind::kModel, layout);
  EXPECT_TRUE(parse_records(SaveForm::kText, "1 1 2 3 4 5 6\n", floats, "f", &keys, &recs).ok());
  EXPECT_EQ(keys, std::vector<uint64_t>{1});
  const struct {
    const char* text;
    const char* where;
  } bad[] = {{"1 1 2 3 4 5 6\n2 1 2 3\n", "f line 2"},
             {"1 1 2 3 4 5 6 7\n", "f line 1"},
             {"x 1 2 3 4 5 6\n", "f line 1"},
             {"1 1 2 3 4 5 6", "f line 1"},
             {"1 1 2 zz 4 5 6\n", "f line 1"}};
  for (const auto& b : bad) {
    const Status st = parse_records(SaveForm::kText, b.text, floats, "f", &keys, &recs);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << b.text;
    EXPECT_NE(st.message().find(b.where), std::string::npos) << st.to_string();
  }
  EXPECT_FALSE(parse_records(SaveForm::kBinary, std::string(27, 'a'), 4, "b", &keys, &recs).ok());
}

// A model record's slot (a float in the file) becomes a row's int32 slot: a value that is not a
// whole number in int32's range (NaN, infinite, fractional, out of range) is refused as corrupt,
// naming the file and the line (text) or byte offset (binary), with one width and with slot_dims
// (where the slot also decides the record's length). The good record before it parses.
TEST(SaveLoad, ARecordWithABadSlotIsRefusedByFileAndRecord) {
  const AccessorConfig one_width = testing::test_optimizer(SparseOptimizerKind::kSgd, 4);
  const AccessorConfig mixed = with_slot_dims(one_width, {{3, 2}});
  const float bad_slots[] = {std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             1.5f,
                             2147483648.0f,
                             -2147483904.0f,
                             3e38f};
  for (const RecordKind kind : {RecordKind::kModel, RecordKind::kFullRow}) {
    for (const AccessorConfig& cfg : {one_width, mixed}) {
      const RecordShape shape = record_shape(kind, cfg);
      const RowLayout layout = RowLayout::for_slot(cfg, 1);
      const int32_t floats = record_floats(kind, layout);
      // Where the record keeps its slot (and, a full row, its width).
      const std::size_t slot_at = kind == RecordKind::kModel ? 2 : layout.unpacked().slot();
      std::vector<float> good(static_cast<std::size_t>(floats), 0.5f);
      if (kind == RecordKind::kFullRow) good[layout.unpacked().mf_dim_offset()] = layout.mf_dim;
      const std::string label = kind == RecordKind::kModel ? "model" : "full-row";
      for (const SaveForm form : {SaveForm::kText, SaveForm::kBinary}) {
        for (const float slot : bad_slots) {
          SCOPED_TRACE(label + ", " + name_of(kSaveFormNames, form) + ", slot " +
                       std::to_string(slot) + (shape.uniform ? ", one width" : ", slot_dims"));
          std::vector<float> rec = good;
          rec[slot_at] = 1.0f;  // a good record first
          std::string data;
          append_record(form, 7, rec.data(), floats, &data);
          const std::size_t second = data.size();
          rec[slot_at] = slot;
          append_record(form, 8, rec.data(), floats, &data);
          std::vector<uint64_t> keys;
          std::vector<float> recs;
          const Status st = parse_records(form, data, shape, "part-00003", &keys, &recs);
          ASSERT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
          const std::string at = form == SaveForm::kText
                                     ? "part-00003 line 2"
                                     : "part-00003 at byte " + std::to_string(second);
          EXPECT_NE(st.message().find(at), std::string::npos) << st.to_string();
          EXPECT_NE(st.message().find(label + " record of key 8 has slot"), std::string::npos)
              << st.to_string();
        }
        // Slots at int32's ends are slots.
        for (const float slot : {-2147483648.0f, 2147483520.0f, 0.0f}) {
          std::vector<float> rec = good;
          rec[slot_at] = slot;
          std::string data;
          append_record(form, 9, rec.data(), floats, &data);
          std::vector<uint64_t> keys;
          std::vector<float> recs;
          const Status st = parse_records(form, data, shape, "p", &keys, &recs);
          EXPECT_TRUE(st.ok()) << label << " " << slot << ": " << st.to_string();
          EXPECT_EQ(keys, std::vector<uint64_t>{9});
        }
      }
    }
  }
}

TEST(DenseTable, SaveLoadRoundTripAndCorruption) {
  ScratchDir dir;
  DenseTable dense;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int b = 0; b < 5; ++b) {
    DenseBlock block;
    block.values.resize(b * 37);  // block 0 is empty
    for (auto& v : block.values) v = u(rng);
    if (b % 2) {
      block.state["moment1"] = std::vector<float>(block.values.size(), 0.5f);
      block.state["beta1_pow"] = {0.9f};
    }
    dense.put("fc" + std::to_string(b) + ".w", block);
  }
  ASSERT_TRUE(dense.save(dir.sub("dense")).ok());
  DenseTable loaded;
  loaded.put("stale", DenseBlock{{1.0f}, {}});
  ASSERT_TRUE(loaded.load(dir.sub("dense")).ok());
  EXPECT_EQ(loaded.names(), dense.names());
  for (const auto& name : dense.names()) EXPECT_TRUE(*loaded.get(name) == *dense.get(name)) << name;
  EXPECT_FALSE(loaded.get("stale").has_value());

  // Saving again replaces the save; an empty table saves and loads too.
  DenseTable empty;
  ASSERT_TRUE(empty.save(dir.sub("dense")).ok());
  ASSERT_TRUE(loaded.load(dir.sub("dense")).ok());
  EXPECT_EQ(loaded.size(), 0u);

  ASSERT_TRUE(dense.save(dir.sub("dense")).ok());
  flip_byte(dir.sub("dense/blocks"));
  const Status st = loaded.load(dir.sub("dense"));
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("blocks"), std::string::npos) << st.to_string();
  EXPECT_EQ(loaded.size(), 0u);  // unchanged
}

}  // namespace
}  // namespace gpubox::table

namespace gpubox::table {
namespace {

TEST(SaveLoad, DeltaCarriesADeleteThenRecreate) {
  for (SaveForm form : {SaveForm::kText, SaveForm::kBinary}) {
    Fixture f(form, 2);
    const RowLayout layout = f.table->layout();
    std::mt19937_64 rng(21);
    std::vector<uint64_t> keys = {10, 11, 12};
    std::vector<float> rows;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(f.table->push(keys.data(), keys.size(), rows.data()).ok());
    ASSERT_TRUE(f.table->save(f.dir.sub("base"), SaveKind::kBase).ok());
    // 10: deleted and created again by a pull; 11: deleted; 12: untouched.
    ASSERT_TRUE(f.table->erase(keys.data(), 2).ok());
    std::vector<float> out(layout.stride());
    ASSERT_TRUE(f.table->pull(&keys[0], nullptr, 1, out.data(), nullptr).ok());
    ASSERT_TRUE(f.table->save(f.dir.sub("delta"), SaveKind::kDelta).ok());
    auto manifest = io::read_manifest(io::FileEnv::posix(), f.dir.sub("delta"), "sparse");
    ASSERT_TRUE(manifest.ok());
    uint64_t part_rows = 0, deleted = 0;
    for (const auto& file : manifest->files) {
      (file.name.rfind("part-", 0) == 0 ? part_rows : deleted) += file.records;
    }
    EXPECT_EQ(part_rows, 1u);  // key 10 again
    EXPECT_EQ(deleted, 2u);    // keys 10 and 11
    auto loaded = f.fresh();
    ASSERT_TRUE(loaded->load(f.dir.sub("base")).ok());
    ASSERT_TRUE(loaded->load(f.dir.sub("delta")).ok());
    EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout),
                                   testing::model_of(testing::snapshot(*f.table), layout)));
    EXPECT_EQ(loaded->size().value(), 2u);
  }
}

TEST(SaveLoad, SavesWhilePushingStayLoadable) {
  Fixture f(SaveForm::kBinary, 8);
  const RowLayout layout = f.table->layout();
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::mt19937_64 rng(4);
    std::vector<uint64_t> keys(256);
    std::vector<float> rows;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    while (!stop.load()) {
      for (auto& k : keys) k = rng() % 5000;
      ASSERT_TRUE(f.table->push(keys.data(), keys.size(), rows.data()).ok());
    }
  });
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(f.table->save(f.dir.sub("ckpt"), SaveKind::kCheckpoint).ok());
    auto loaded = f.fresh();
    ASSERT_TRUE(loaded->load(f.dir.sub("ckpt")).ok());
    EXPECT_LE(loaded->size().value(), f.table->size().value());
  }
  stop.store(true);
  pusher.join();
  ASSERT_TRUE(f.table->save(f.dir.sub("ckpt"), SaveKind::kCheckpoint).ok());
  auto loaded = f.fresh();
  ASSERT_TRUE(loaded->load(f.dir.sub("ckpt")).ok());
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*loaded), testing::snapshot(*f.table)));
}

}  // namespace
}  // namespace gpubox::table

namespace gpubox::table {
namespace {

// A part file streamed in chunks (a load holds one chunk per thread, not its files) parses to
// the same records as the whole file, at every chunk size from a few records up, in both forms
// and both record kinds; the size is checked before reading, the checksum at the end, and a
// record longer than a chunk is refused.
TEST(SaveLoad, PartFilesStreamedInChunksParseAsWholeFiles) {
  for (SaveForm form : {SaveForm::kBinary, SaveForm::kText}) {
    for (SaveKind save : {SaveKind::kCheckpoint, SaveKind::kBase}) {
      Fixture f(form, 2);
      std::mt19937_64 rng(5);
      f.mutate(rng, 3000, 100000);
      const std::string dir = f.dir.sub("m");
      ASSERT_TRUE(f.table->save(dir, save).ok());
      auto manifest = io::read_manifest(io::FileEnv::posix(), dir, "sparse");
      ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
      const RecordShape shape = record_shape(
          save == SaveKind::kCheckpoint ? RecordKind::kFullRow : RecordKind::kModel, f.opt);
      for (const io::ManifestFile& file : manifest->files) {
        auto whole = io::read_verified(io::FileEnv::posix(), dir, file);
        ASSERT_TRUE(whole.ok()) << whole.status().to_string();
        std::vector<uint64_t> keys;
        std::vector<float> recs;
        ASSERT_TRUE(parse_records(form, *whole, shape, file.name, &keys, &recs).ok());
        ASSERT_EQ(keys.size(), file.records);
        for (std::size_t chunk : {std::size_t{700}, std::size_t{4099}, std::size_t{1} << 20}) {
          std::vector<uint64_t> streamed_keys;
          std::vector<float> streamed_recs;
          RecordChunk at;
          std::size_t calls = 0;
          const Status st = io::read_verified_chunks(
              io::FileEnv::posix(), dir, file, chunk,
              [&](const char* data, std::size_t n, bool last) -> StatusOr<std::size_t> {
                ++calls;
                EXPECT_LE(n, 2 * chunk) << "a reader holds a chunk and a record left over";
                at.last = last;
                auto took = parse_record_chunk(form, data, n, shape, file.name, at, &streamed_keys,
                                               &streamed_recs);
                if (!took.ok()) return took.status();
                at.byte += took->bytes;
                at.line += took->lines;
                return took->bytes;
              });
          ASSERT_TRUE(st.ok()) << st.to_string() << " chunk " << chunk;
          EXPECT_GE(calls, file.bytes / chunk) << file.name;
          EXPECT_EQ(streamed_keys, keys) << file.name << " chunk " << chunk;
          EXPECT_TRUE(testing::same_bits(streamed_recs, recs)) << file.name << " chunk " << chunk;
        }
      }
    }
  }
  // A text record longer than the chunk is refused (not buffered without end); a file that
  // grew past its entry is refused unread; a damaged byte is the checksum's error even where
  // the parser refused it first.
  ScratchDir dir;
  const std::string line = "7" + std::string(3000, ' ') + "1\n";
  std::ofstream(dir.sub("long")) << line;
  const io::ManifestFile entry{"long", 1, line.size(), io::checksum(line.data(), line.size())};
  const auto take_lines = [](const char* data, std::size_t n, bool) -> StatusOr<std::size_t> {
    const void* eol = std::memchr(data, '\n', n);
    return eol == nullptr ? 0 : static_cast<const char*>(eol) - data + 1;
  };
  Status st = io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 512, take_lines);
  EXPECT_NE(st.message().find("a record longer than 512 bytes"), std::string::npos)
      << st.to_string();
  EXPECT_TRUE(
      io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 4096, take_lines).ok());
  std::ofstream(dir.sub("long"), std::ios::app) << "8 1\n";
  st = io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 4096, take_lines);
  EXPECT_NE(st.message().find("more than the " + std::to_string(line.size()) + " expected"),
            std::string::npos)
      << st.to_string();
  std::ofstream(dir.sub("long")) << "x" << line.substr(1);
  const auto refuse = [](const char*, std::size_t, bool) -> StatusOr<std::size_t> {
    return Status::Corruption("bad key");
  };
  st = io::read_verified_chunks(io::FileEnv::posix(), dir.path(), entry, 4096, refuse);
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.to_string();
}

TEST(RowCodec, TextAndBinaryRecordsRoundTripExactly) {
  const std::vector<float> values = {-0.0f,
                                     0.0f,
                                     1.0f / 3.0f,
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::min(),
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::lowest(),
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     123456.789f};
  std::mt19937_64 rng(2);
  std::vector<float> random(1000);
  for (auto& v : random) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&v, &bits, sizeof(v));
    if (std::isnan(v)) v = 1.5f;  // text keeps NaN, not its payload
  }
  for (const std::vector<float>* set :
       std::initializer_list<const std::vector<float>*>{&values, &random}) {
    for (SaveForm form : {SaveForm::kText, SaveForm::kBinary}) {
      std::string data;
      const int32_t floats = static_cast<int32_t>(set->size());
      append_record(form, 0, set->data(), floats, &data);
      append_record(form, ~uint64_t{0}, set->data(), floats, &data);
      std::vector<uint64_t> keys;
      std::vector<float> recs;
      ASSERT_TRUE(parse_records(form, data, floats, "x", &keys, &recs).ok());
      EXPECT_EQ(keys, (std::vector<uint64_t>{0, ~uint64_t{0}}));
      std::vector<float> twice = *set;
      twice.insert(twice.end(), set->begin(), set->end());
      EXPECT_TRUE(testing::same_bits(recs, twice)) << name_of(kSaveFormNames, form);
    }
  }
}

}  // namespace
}  // namespace gpubox::table
