// hyper_parameters.sparse_storage (issue 15): embed_w and embedx_w kept as fp16 / bf16, two per
// float slot. The packed layout against a per-value oracle (every value where it belongs, the
// other fields untouched), the optimizer rules against the fp32 rules with one rounding per
// written weight, and saves: byte-identical round trips in each storage, and a save loaded into
// another storage converted (widened exactly, or rounded to nearest even).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.hpp"
#include "table/io/save_dir.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::RowMap;
using testing::ScratchDir;

constexpr SparseOptimizerKind kKinds[] = {SparseOptimizerKind::kSgd, SparseOptimizerKind::kAdagrad,
                                          SparseOptimizerKind::kAdam,
                                          SparseOptimizerKind::kSharedAdam};
constexpr SparseStorage kSixteenBit[] = {SparseStorage::kFp16, SparseStorage::kBf16};

float round_to(SparseStorage storage, float v) {
  return storage == SparseStorage::kFp16 ? half_to_float(float_to_half(v))
                                         : bf16_to_float(float_to_bf16(v));
}

uint32_t bits_of(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// The 16-bit row is as small as its contents allow: the fp32 fields, then 2 bytes per value, at
// most 2 bytes of padding; fp32 storage keeps the layout it always had.
TEST(SparseStorage, PackedRowsHoldTwoValuesPerSlot) {
  for (SparseOptimizerKind kind : kKinds) {
    for (int32_t mf_dim : {0, 1, 2, 7, 8, 64}) {
      const RowLayout fp32 = RowLayout::make(kind, mf_dim);
      EXPECT_EQ(fp32.stride(), fp32.embedx_w() + mf_dim);
      EXPECT_EQ(fp32.unpacked().stride(), fp32.stride());
      for (SparseStorage storage : kSixteenBit) {
        const RowLayout packed = RowLayout::make(kind, mf_dim, storage);
        const int32_t fields_bytes = 4 * (fp32.stride() - 1 - mf_dim);  // all but the values
        const int32_t bytes = 4 * packed.stride();
        EXPECT_GE(bytes, fields_bytes + 2 * (1 + mf_dim)) << mf_dim;
        EXPECT_LE(bytes, fields_bytes + 2 * (1 + mf_dim) + 2) << mf_dim;
        EXPECT_EQ(packed.unpacked().stride(), fp32.stride());
        // Every field but the values keeps its offset.
        EXPECT_EQ(packed.embedx_w(), fp32.embedx_w());
        EXPECT_EQ(packed.mf_size(), fp32.mf_size());
      }
    }
  }
}

// Values written in random order land where they belong: each reads back as its rounding, and
// no other field (or neighbouring value) changes.
TEST(SparseStorage, EveryValueReadsBackRoundedAndLeavesTheRestAlone) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (SparseStorage storage : kSixteenBit) {
    for (int32_t mf_dim : {1, 2, 5, 8}) {
      const RowLayout layout = RowLayout::make(SparseOptimizerKind::kAdam, mf_dim, storage);
      std::vector<float> row(layout.stride(), 0.0f);
      for (int32_t i = 0; i < layout.embedx_w(); ++i) {
        if (i != RowLayout::kEmbedW) row[i] = 100.0f + static_cast<float>(i);  // sentinels
      }
      std::vector<float> want(1 + mf_dim, 0.0f);  // embed_w, embedx_w[...]
      for (int round = 0; round < 200; ++round) {
        const int32_t lane = static_cast<int32_t>(rng() % want.size());
        const float v = value(rng) * (round % 3 == 0 ? 1e-3f : 1.0f);
        if (lane == 0) {
          write_embed_w(row.data(), layout, v);
        } else {
          write_embedx_w(row.data(), layout, lane - 1, v);
        }
        want[lane] = round_to(storage, v);
        ASSERT_EQ(bits_of(read_embed_w(row.data(), layout)), bits_of(want[0]));
        for (int32_t i = 0; i < mf_dim; ++i) {
          ASSERT_EQ(bits_of(read_embedx_w(row.data(), layout, i)), bits_of(want[1 + i]))
              << "mf_dim " << mf_dim << " value " << i << " round " << round;
        }
      }
      for (int32_t i = 0; i < layout.embedx_w(); ++i) {
        if (i != RowLayout::kEmbedW) {
          EXPECT_EQ(row[i], 100.0f + static_cast<float>(i));
        }
      }
      // Unpacking widens exactly; packing again gives the same bits.
      const RowLayout fp32 = layout.unpacked();
      std::vector<float> wide(fp32.stride()), back(layout.stride());
      convert_row(row.data(), layout, wide.data(), fp32);
      EXPECT_EQ(wide[RowLayout::kEmbedW], want[0]);
      for (int32_t i = 0; i < mf_dim; ++i) EXPECT_EQ(wide[fp32.embedx_w() + i], want[1 + i]);
      convert_row(wide.data(), fp32, back.data(), layout);
      EXPECT_TRUE(testing::same_bits(back, row)) << "mf_dim " << mf_dim;
    }
  }
}

// A push or a geo delta on a 16-bit row is the fp32 rule on the widened row, each written
// weight rounded once: every optimizer, odd and even mf_dim, creation of embedx included.
TEST(SparseStorage, RulesAreTheFp32RulesRoundedOnWrite) {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> grad(-0.5f, 0.5f);
  for (SparseOptimizerKind kind : kKinds) {
    for (SparseStorage storage : kSixteenBit) {
      for (int32_t mf_dim : {3, 8}) {
        AccessorConfig cfg = testing::test_optimizer(kind, mf_dim, storage);
        cfg.embedx_threshold = 2.0f;
        cfg.optimizer.weight_decay = 0.01f;
        const RowLayout layout = RowLayout::make(kind, mf_dim, storage);
        const RowLayout fp32 = layout.unpacked();
        for (uint64_t key = 1; key <= 20; ++key) {
          std::vector<float> row(layout.stride()), wide(fp32.stride()), want(layout.stride());
          init_row(row.data(), layout, cfg, key, 3);
          for (int step = 0; step < 12; ++step) {
            std::vector<float> push(layout.push_dim());
            push[0] = static_cast<float>(1 + rng() % 3);
            push[1] = static_cast<float>(rng() % 2);
            for (int32_t f = 2; f < layout.push_dim(); ++f) push[f] = grad(rng);
            convert_row(row.data(), layout, wide.data(), fp32);
            const bool geo = step % 4 == 3;
            if (geo) {
              table::optimizer::apply_delta(wide.data(), fp32, cfg, key, push.data());
              table::optimizer::apply_delta(row.data(), layout, cfg, key, push.data());
            } else {
              const bool a = table::optimizer::apply_push(wide.data(), fp32, cfg, key, push.data());
              const bool b =
                  table::optimizer::apply_push(row.data(), layout, cfg, key, push.data());
              ASSERT_EQ(a, b);
            }
            convert_row(wide.data(), fp32, want.data(), layout);
            ASSERT_TRUE(testing::same_bits(row, want))
                << "optimizer " << static_cast<int>(kind) << " storage "
                << static_cast<int>(storage) << " mf_dim " << mf_dim << " key " << key << " step "
                << step;
          }
          EXPECT_GT(row[layout.mf_size()], 0.0f) << "embedx was never created: test too weak";
        }
      }
    }
  }
}

// The pull record carries the stored (rounded) values, widened.
TEST(SparseStorage, PullRecordReadsTheStoredValues) {
  const AccessorConfig cfg =
      testing::test_optimizer(SparseOptimizerKind::kAdagrad, 3, SparseStorage::kBf16);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim, cfg.storage);
  std::vector<float> row(layout.stride());
  init_row(row.data(), layout, cfg, 42, 1);
  row[RowLayout::kShow] = 50.0f;
  row[RowLayout::kClick] = 10.0f;
  ASSERT_TRUE(maybe_create_embedx(row.data(), layout, cfg, 42));
  std::vector<float> rec(layout.pull_dim());
  fill_pull_record(row.data(), layout, rec.data());
  EXPECT_EQ(rec[0], 50.0f);
  EXPECT_EQ(rec[2], round_to(SparseStorage::kBf16,
                             detail::init_value(42, cfg.seed ^ 0x5bd1e995ULL, 0, 0.01f)));
  for (int32_t i = 0; i < 3; ++i) {
    const float v = detail::init_value(42, cfg.seed, static_cast<uint32_t>(i + 1),
                                       cfg.optimizer.mf_initial_range);
    EXPECT_EQ(rec[3 + i], round_to(SparseStorage::kBf16, v)) << i;
    EXPECT_NE(rec[3 + i], 0.0f);
  }
}

// The record-at-a-time pull (pull_record_fields, what the cpu's pull fills a record with) against
// the per-field form, bit for bit, over every range of fields: each storage and rule, rows as wide
// as the record and narrower ones in a mixed-width record (slot_dims), with and without embedx,
// and no embedx at all (mf_dim 0).
TEST(SparseStorage, PullRecordFieldsMatchThePerFieldForm) {
  for (const SparseStorage storage :
       {SparseStorage::kFp32, SparseStorage::kFp16, SparseStorage::kBf16}) {
    for (SparseOptimizerKind kind : kKinds) {
      for (const int32_t mf_dim : {0, 5}) {
        AccessorConfig cfg = testing::test_optimizer(kind, mf_dim, storage);
        if (mf_dim > 0) {  // slot 2's rows hold 2 values in records of 5
          cfg.slot_dims.count = 1;
          cfg.slot_dims.slot[0] = 2;
          cfg.slot_dims.dim[0] = 2;
        }
        const RowLayout record = record_layout(cfg);
        for (const int32_t slot : {1, 2}) {
          for (const bool created : {false, true}) {
            SCOPED_TRACE("storage " + std::to_string(static_cast<int>(storage)) + " kind " +
                         std::to_string(static_cast<int>(kind)) + " mf_dim " +
                         std::to_string(mf_dim) + " slot " + std::to_string(slot) +
                         (created ? " created" : ""));
            std::vector<float> row(record.stride() + 4, 0.0f);
            init_row(row.data(), record, cfg, 42, slot);
            row[RowLayout::kShow] = 50.0f;
            row[RowLayout::kClick] = 10.0f;
            if (created) maybe_create_embedx(row.data(), record, cfg, 42);
            const int32_t dim = record.pull_dim();
            std::vector<float> want(dim);
            for (int32_t f = 0; f < dim; ++f) want[f] = pull_record_field(row.data(), record, f);
            for (int32_t begin = 0; begin <= dim; ++begin) {
              for (int32_t end = begin; end <= dim; ++end) {
                std::vector<float> got(dim + 1, -7.0f);
                pull_record_fields(row.data(), record, begin, end, got.data());
                for (int32_t f = begin; f < end; ++f) {
                  ASSERT_EQ(bits_of(got[f - begin]), bits_of(want[f]))
                      << "field " << f << " of [" << begin << ", " << end << ")";
                }
                ASSERT_EQ(got[end - begin], -7.0f) << "wrote past [" << begin << ", " << end << ")";
              }
            }
          }
        }
      }
    }
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every record of the part files of save folder `dir`, by key. (A part file lists its rows in
// the order of the shard's hash index, which a load does not reproduce: the records are what
// must not change.)
RowMap records_of(const std::string& dir, SaveForm form, int32_t floats) {
  RowMap out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("part-", 0) != 0) continue;
    std::vector<uint64_t> keys;
    std::vector<float> recs;
    const Status st =
        parse_records(form, read_bytes(e.path().string()), floats, e.path().string(), &keys, &recs);
    EXPECT_TRUE(st.ok()) << st.to_string();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      out[keys[i]].assign(recs.begin() + i * floats, recs.begin() + (i + 1) * floats);
    }
  }
  return out;
}

std::unique_ptr<SparseTable> table_with(SparseStorage storage, SaveForm form) {
  HostTableConfig cfg;
  cfg.shards = 4;
  cfg.save_form = form;
  return testing::open_table(testing::test_optimizer(SparseOptimizerKind::kAdam, 5, storage), cfg);
}

// Pushes `n` random rows under random keys; returns the keys.
std::vector<uint64_t> push_random_rows(SparseTable& table, std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys(n);
  std::vector<float> rows;
  for (auto& k : keys) {
    k = rng();
    const auto row = testing::random_row(rng, table.layout());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  EXPECT_TRUE(table.push(keys.data(), keys.size(), rows.data()).ok());
  return keys;
}

// In each storage and form, a checkpoint and a base save load back into the same rows (the
// checkpoint: every bit) and saving again writes the same records, bit for bit (the same bytes
// per record in either form).
TEST(SparseStorage, SaveLoadSaveWritesTheSameRecordsInEachStorage) {
  for (SparseStorage storage : {SparseStorage::kFp32, SparseStorage::kFp16, SparseStorage::kBf16}) {
    for (SaveForm form : {SaveForm::kBinary, SaveForm::kText}) {
      for (SaveKind mode : {SaveKind::kCheckpoint, SaveKind::kBase}) {
        ScratchDir dir;
        auto table = table_with(storage, form);
        const std::vector<uint64_t> keys = push_random_rows(*table, 300, 3);
        ASSERT_TRUE(table->save(dir.sub("a"), mode).ok());
        auto loaded = table_with(storage, form);
        ASSERT_TRUE(loaded->load(dir.sub("a")).ok());
        const RowMap before = testing::snapshot(*table);
        const RowMap after = testing::snapshot(*loaded);
        if (mode == SaveKind::kCheckpoint) {
          EXPECT_TRUE(testing::same_rows(before, after));
        } else {
          EXPECT_TRUE(testing::same_rows(testing::model_of(before, table->layout()),
                                         testing::model_of(after, table->layout())));
        }
        ASSERT_TRUE(loaded->save(dir.sub("b"), mode).ok());
        const RecordKind kind =
            mode == SaveKind::kCheckpoint ? RecordKind::kFullRow : RecordKind::kModel;
        const int32_t floats = record_floats(kind, table->layout());
        const RowMap a = records_of(dir.sub("a"), form, floats);
        EXPECT_EQ(a.size(), keys.size());
        EXPECT_TRUE(testing::same_rows(a, records_of(dir.sub("b"), form, floats)))
            << "storage " << static_cast<int>(storage);
        EXPECT_NE(read_bytes(dir.sub("a/MANIFEST"))
                      .find(std::string("sparse_storage ") + name_of(kSparseStorageNames, storage)),
                  std::string::npos);
      }
    }
  }
}

// A save loads into another storage: values widen exactly (16-bit into fp32) or round to
// nearest even (fp32 into 16 bits, fp16 into bf16); everything else is the saved row's.
TEST(SparseStorage, ASaveLoadsIntoAnotherStorageConverted) {
  const SparseStorage all[] = {SparseStorage::kFp32, SparseStorage::kFp16, SparseStorage::kBf16};
  for (SparseStorage from : all) {
    for (SparseStorage to : all) {
      ScratchDir dir;
      auto table = table_with(from, SaveForm::kBinary);
      push_random_rows(*table, 100, 4);
      ASSERT_TRUE(table->save(dir.sub("s"), SaveKind::kCheckpoint).ok());
      auto other = table_with(to, SaveForm::kBinary);
      const Status st = other->load(dir.sub("s"));
      ASSERT_TRUE(st.ok()) << st.to_string();
      const RowLayout in = table->layout();
      const RowLayout out = other->layout();
      const RowMap saved = testing::snapshot(*table);
      const RowMap got = testing::snapshot(*other);
      ASSERT_EQ(saved.size(), got.size());
      for (const auto& [key, row] : saved) {
        const std::vector<float>& r = got.at(key);
        for (int32_t f = 0; f < in.embedx_w(); ++f) {
          if (f != RowLayout::kEmbedW) {
            ASSERT_EQ(bits_of(r[f]), bits_of(row[f])) << f;
          }
        }
        auto expect = [&](float saved_value) {
          return to == SparseStorage::kFp32 ? saved_value : round_to(to, saved_value);
        };
        ASSERT_EQ(bits_of(read_embed_w(r.data(), out)),
                  bits_of(expect(read_embed_w(row.data(), in))));
        for (int32_t i = 0; i < in.mf_dim; ++i) {
          ASSERT_EQ(bits_of(read_embedx_w(r.data(), out, i)),
                    bits_of(expect(read_embedx_w(row.data(), in, i))))
              << "from " << static_cast<int>(from) << " to " << static_cast<int>(to);
        }
      }
    }
  }
}

// An unknown storage in a MANIFEST is refused, naming it.
TEST(SparseStorage, UnknownStorageInAManifestIsRefused) {
  ScratchDir dir;
  auto table = table_with(SparseStorage::kFp16, SaveForm::kText);
  ASSERT_TRUE(table->save(dir.sub("s"), SaveKind::kBase).ok());
  const std::string manifest = dir.sub("s/MANIFEST");
  std::string text = read_bytes(manifest);
  const std::size_t at = text.find("fp16");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 4, "fp12");
  text.erase(text.rfind("checksum "));  // the MANIFEST's own checksum, taken again
  text += "checksum " + io::hex64(io::checksum(text.data(), text.size())) + "\n";
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
  const Status st = table_with(SparseStorage::kFp16, SaveForm::kText)->load(dir.sub("s"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("fp12"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace gpubox::table
