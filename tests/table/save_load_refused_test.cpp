// Saves that load refuses, naming the file (and the line or byte offset of a bad record):
// corrupt, truncated or missing files, another layout or a foreign folder, malformed text
// records, a record whose slot is not an int32; what a refused load leaves (the table it was
// loading into as it was; an empty table read once); the dense table's round trip and corruption.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "table/dense_table.hpp"
#include "table/io/save_dir.hpp"
#include "tests/table/save_load_fixture.hpp"
#include "tests/table/slot_dims_config.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using save_load_test::Fixture;
using testing::RowMap;
using testing::ScratchDir;

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

// Replaces the text of `<path>/<name>` and its MANIFEST entry (bytes, records, checksum), so
// that only what the text says is wrong.
void rewrite_listed_file(const std::string& path, const std::string& name,
                         const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  std::ofstream(path + "/" + name, std::ios::trunc) << text;
  const std::string manifest_path = path + "/" + io::kManifestName;
  std::stringstream old;
  old << std::ifstream(manifest_path).rdbuf();
  auto manifest = io::Manifest::parse(old.str(), manifest_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
  for (io::ManifestFile& file : manifest->files) {
    if (file.name != name) continue;
    file =
        io::ManifestFile{name, lines.size(), text.size(), io::checksum(text.data(), text.size())};
  }
  std::ofstream(manifest_path, std::ios::trunc) << manifest->encode();
}

// A base's unseen file that does not pair with its part file (another key at a record, fewer or
// more records), each file sound on its own, is refused naming it before the table changes (its
// days are read along with the rows in the first pass too); an empty table is emptied again.
TEST(SaveLoad, AnUnseenFileThatDoesNotPairWithItsPartIsRefused) {
  Fixture f(SaveForm::kText, 1);
  std::mt19937_64 rng(3);
  f.mutate(rng, 40, 1000);
  const std::string saved = f.dir.sub("base");
  ASSERT_TRUE(f.table->save(saved, SaveKind::kBase).ok());
  std::vector<std::string> lines;
  std::ifstream in(saved + "/unseen-0");
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GT(lines.size(), 2u);
  std::vector<std::vector<std::string>> bad(3, lines);
  std::swap(bad[0][0], bad[0][1]);
  bad[1].pop_back();
  bad[2].push_back("123456789 0");
  for (std::size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE("damage " + std::to_string(i));
    const std::string path = f.dir.sub("bad" + std::to_string(i));
    std::filesystem::copy(saved, path);
    rewrite_listed_file(path, "unseen-0", bad[i]);
    auto other = f.fresh();
    const uint64_t key = 7777;
    std::vector<float> row(other->layout().stride());
    ASSERT_TRUE(other->pull(&key, nullptr, 1, row.data(), nullptr).ok());
    const RowMap before = testing::snapshot(*other);
    auto empty = f.fresh();
    for (SparseTable* table : {other.get(), empty.get()}) {
      const Status st = table->load(path);
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
      EXPECT_NE(st.message().find(path + "/unseen-0"), std::string::npos) << st.to_string();
      EXPECT_TRUE(
          testing::same_rows(testing::snapshot(*table), table == empty.get() ? RowMap{} : before));
    }
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
