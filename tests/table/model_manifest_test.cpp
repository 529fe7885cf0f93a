// The model manifest (table/io/model_manifest.hpp): it round-trips, a damaged one is refused,
// it names each half by the same digest gpubox_server reports as the generation of a save, and
// check_halves refuses halves that are not the ones it names (a new sparse half beside an old
// dense half, the bug of issue #12 item 9), naming each half and both digests.
#include "table/io/model_manifest.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "table/dense_table.hpp"
#include "table/io/save_dir.hpp"
#include "table/server/model_path.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table::io {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

ModelManifest sample() {
  ModelManifest m;
  m.pass = 3;
  m.sequence = 12;
  m.mode = config::SaveKind::kDelta;
  m.parent = "../2";
  m.parent_digest = 0xabcdef0123456789ull;
  m.origin = "/data/models/day1";
  m.model_keys = {{"hyper_parameters.fc_sizes", "[512, 256]"}, {"runner.seed", "7"}};
  m.dense_precision = config::DensePrecision::kBf16;
  m.dense = 0x1111;
  m.sparse = {0x2222, 0x3333};
  return m;
}

void expect_same(const ModelManifest& a, const ModelManifest& b) {
  EXPECT_EQ(a.pass, b.pass);
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.parent, b.parent);
  EXPECT_EQ(a.parent_digest, b.parent_digest);
  EXPECT_EQ(a.origin, b.origin);
  EXPECT_EQ(a.model_keys, b.model_keys);
  EXPECT_EQ(a.dense_precision, b.dense_precision);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.sparse, b.sparse);
}

TEST(ModelManifest, RoundTripsThroughItsFile) {
  ScratchDir dir;
  uint64_t written = 0, read = 0;
  ASSERT_TRUE(write_model_manifest(FileEnv::posix(), dir.path(), sample(), &written).ok());
  EXPECT_FALSE(fs::exists(dir.sub("MODEL_MANIFEST.tmp")));
  auto back = read_model_manifest(FileEnv::posix(), dir.path(), &read);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same(*back, sample());
  EXPECT_EQ(written, read);
  EXPECT_EQ(back->config_hash(), sample().config_hash());

  // A base save with one part, no origin and no dense precision (made before it was recorded):
  // the optional fields stay empty.
  ModelManifest base = sample();
  base.mode = config::SaveKind::kCheckpoint;
  base.parent.clear();
  base.parent_digest = 0;
  base.origin.clear();
  base.dense_precision.reset();
  base.sparse = {0x4444};
  auto parsed = ModelManifest::parse(base.encode(), "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  expect_same(*parsed, base);

  ASSERT_TRUE(remove_model_manifest(FileEnv::posix(), dir.path()).ok());
  const auto gone = read_model_manifest(FileEnv::posix(), dir.path());
  EXPECT_EQ(gone.status().code(), Status::Code::kNotFound);
  EXPECT_NE(gone.status().message().find(dir.sub("MODEL_MANIFEST") + " is missing"),
            std::string::npos)
      << gone.status().message();
}

TEST(ModelManifest, ADamagedOrInconsistentManifestIsRefused) {
  const std::string text = sample().encode();
  // Every single-byte change is caught (the framing's checksum).
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bad = text;
    const std::size_t at = rng() % bad.size();
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    EXPECT_FALSE(ModelManifest::parse(bad, "m").ok()) << "byte " << at;
  }
  EXPECT_FALSE(ModelManifest::parse(text.substr(0, text.size() / 2), "m").ok());
  // A well-framed manifest whose config_hash does not match its keys (edited by hand).
  Manifest edited;
  auto framed = Manifest::parse(text, "m");
  ASSERT_TRUE(framed.ok());
  edited = *framed;
  edited.properties["config.runner.seed"] = "8";
  const auto refused = ModelManifest::parse(edited.encode(), "where");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("where: config_hash does not match"), std::string::npos)
      << refused.status().message();
  // A delta without its parent, a sparse part count of 0, another kind of manifest.
  edited = *framed;
  edited.properties.erase("parent");
  EXPECT_FALSE(ModelManifest::parse(edited.encode(), "m").ok());
  edited = *framed;
  edited.properties["sparse_parts"] = "0";
  EXPECT_FALSE(ModelManifest::parse(edited.encode(), "m").ok());
  edited = *framed;
  edited.kind = "dense";
  EXPECT_FALSE(ModelManifest::parse(edited.encode(), "m").ok());
  // A dense precision that is not one (the config_hash does not cover it).
  edited = *framed;
  edited.properties["dense_precision"] = "fp8";
  const auto bad_precision = ModelManifest::parse(edited.encode(), "where");
  ASSERT_FALSE(bad_precision.ok());
  EXPECT_EQ(bad_precision.status().code(), Status::Code::kCorruption);
  EXPECT_NE(bad_precision.status().message().find(
                "where: 'dense_precision': expected one of fp32|bf16, got 'fp8'"),
            std::string::npos)
      << bad_precision.status().message();
}

// A real save of both halves and its model manifest.
struct SavedModel {
  explicit SavedModel(const std::string& dir, float dense_value, uint64_t first_key) {
    auto table = testing::open_table(testing::test_optimizer(), HostTableConfig{});
    std::vector<uint64_t> keys = {first_key, first_key + 1, first_key + 2};
    std::vector<float> rows(keys.size() * table->layout().stride());
    EXPECT_TRUE(table->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
    EXPECT_TRUE(table->save(dir + "/sparse", SaveKind::kCheckpoint).ok());
    DenseTable dense;
    dense.put("dense", DenseBlock{{dense_value, 2.0f}, {}});
    EXPECT_TRUE(dense.save(dir + "/dense").ok());
    manifest.pass = 1;
    manifest.mode = SaveKind::kCheckpoint;
    manifest.dense = read_half_digest(FileEnv::posix(), dir + "/dense", kDenseHalf).value();
    manifest.sparse = {read_half_digest(FileEnv::posix(), dir + "/sparse", kSparseHalf).value()};
    EXPECT_TRUE(write_model_manifest(FileEnv::posix(), dir, manifest).ok());
  }
  ModelManifest manifest;
};

TEST(ModelManifest, AHalfDigestIsTheGenerationAServerReportsForTheSameSave) {
  ScratchDir dir;
  SavedModel model(dir.path(), 1.0f, 10);
  EXPECT_EQ(model.manifest.sparse[0], server::model_generation(dir.sub("sparse")));
  EXPECT_EQ(model.manifest.dense, server::model_generation(dir.sub("dense")));
  EXPECT_EQ(read_half_digest(FileEnv::posix(), dir.sub("dense"), kSparseHalf).status().code(),
            Status::Code::kInvalidArgument);  // a dense half is not a sparse one
}

TEST(ModelManifest, HalvesThatAreNotTheOnesNamedAreRefusedNamingEach) {
  ScratchDir a, b;
  SavedModel first(a.path(), 1.0f, 10);
  SavedModel second(b.path(), 5.0f, 20);
  EXPECT_TRUE(check_halves(FileEnv::posix(), a.path(), first.manifest, true).ok());

  // A new sparse half beside the old dense half (a save cut between its halves).
  fs::remove_all(a.sub("sparse"));
  fs::copy(b.sub("sparse"), a.sub("sparse"), fs::copy_options::recursive);
  Status st = check_halves(FileEnv::posix(), a.path(), first.manifest, true);
  ASSERT_FALSE(st.ok());
  const std::string named = hex64(first.manifest.sparse[0]);
  const std::string found = hex64(second.manifest.sparse[0]);
  EXPECT_NE(st.message().find("sparse/MANIFEST has digest " + found +
                              ", the model manifest names " + named),
            std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("dense/"), std::string::npos) << "the dense half matches";

  // Both halves replaced: both named; a missing half: named, unless a server holds it.
  fs::remove_all(a.sub("dense"));
  fs::copy(b.sub("dense"), a.sub("dense"), fs::copy_options::recursive);
  st = check_halves(FileEnv::posix(), a.path(), first.manifest, true);
  EXPECT_NE(st.message().find("dense/MANIFEST has digest"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("sparse/MANIFEST has digest"), std::string::npos) << st.message();
  fs::remove_all(b.sub("sparse"));
  st = check_halves(FileEnv::posix(), b.path(), second.manifest, true);
  EXPECT_NE(st.message().find("sparse: " + b.sub("sparse/MANIFEST") + " is missing"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(check_halves(FileEnv::posix(), b.path(), second.manifest, false).ok());
}

// A file of a half truncated (or removed) after the save, its MANIFEST intact: named with its
// sizes, so a resume skips the save instead of choosing it and failing in its load.
TEST(ModelManifest, AHalfWhoseFileIsTruncatedOrMissingIsRefusedNamingIt) {
  for (const char* half : {"sparse", "dense"}) {
    ScratchDir dir;
    SavedModel model(dir.path(), 1.0f, 10);
    auto listed = read_manifest(FileEnv::posix(), dir.sub(half), half);
    ASSERT_TRUE(listed.ok()) << listed.status().to_string();
    const ManifestFile* largest = &listed->files.front();
    for (const ManifestFile& f : listed->files) largest = f.bytes > largest->bytes ? &f : largest;
    ASSERT_GT(largest->bytes, 1u);
    const std::string file = dir.sub(half) + "/" + largest->name;
    fs::resize_file(file, largest->bytes / 2);
    Status st = check_halves(FileEnv::posix(), dir.path(), model.manifest, true);
    EXPECT_NE(st.message().find(file + ": " + std::to_string(largest->bytes / 2) +
                                " bytes, MANIFEST says " + std::to_string(largest->bytes) +
                                " (truncated or overwritten)"),
              std::string::npos)
        << st.message();
    fs::remove(file);
    st = check_halves(FileEnv::posix(), dir.path(), model.manifest, true);
    EXPECT_NE(st.message().find(file + ": listed in MANIFEST but missing"), std::string::npos)
        << st.message();
  }
}

TEST(ModelManifest, SparsePartFoldersFollowTheServersSubfolders) {
  EXPECT_EQ(sparse_part_folder(0, 1), "sparse");
  EXPECT_EQ(sparse_part_folder(0, 2), "sparse/server-0");
  EXPECT_EQ(sparse_part_folder(3, 4), "sparse/server-3");
}

}  // namespace
}  // namespace gpubox::table::io
