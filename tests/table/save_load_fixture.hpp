// The fixture of the save/load tests (save_load_test.cpp, save_load_refused_test.cpp,
// save_load_parts_test.cpp: one binary, save_load_test): a host table of 8 (or `shards`) shards in
// a scratch folder, in memory or with the disk tier, saving in one form, and random pushes and
// pulls that change it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "table/io/fault_env.hpp"
#include "table/sparse_table.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table::save_load_test {

// Real files without fsync: these tests take many saves, and durability is not what they check
// (the tests that pass env = nullptr below use the plain POSIX env, fsync included).
inline io::FileEnv* no_sync_env() {
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
  // A fresh() table that loaded the saves `chain` names (folders under `dir`), in order; null,
  // the failing load's save and status a test failure, when one fails.
  std::unique_ptr<SparseTable> fresh_loaded(const std::vector<const char*>& chain) {
    auto loaded = fresh();
    for (const char* save : chain) {
      const Status st = loaded->load(dir.sub(save));
      if (!st.ok()) {
        ADD_FAILURE() << "loading " << save << ": " << st.to_string();
        return nullptr;
      }
    }
    return loaded;
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

  testing::ScratchDir dir;
  AccessorConfig opt;
  HostTableConfig cfg;
  std::unique_ptr<SparseTable> table;
  int fresh_count = 0;
};

}  // namespace gpubox::table::save_load_test
