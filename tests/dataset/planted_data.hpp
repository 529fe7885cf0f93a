// Planted, learnable train and held-out data for the tests that train end to end and compare
// with the planted model's AUC: configs/config_synthetic.yaml's data settings (Zipf 2, one
// planted factor) scaled down to 40,000 lines in 4 files under root/train (two trainers take two
// files each) and 5,000 held-out lines of the same planted model under root/test.
#pragma once

#include <cstdint>
#include <filesystem>

#include "common/status.hpp"
#include "dataset/generator.hpp"

namespace gpubox::testing {

// Writes root/train and root/test; *oracle holds the planted model's summary of the held-out
// lines (oracle->auc). Returns the held-out generation's options, for more data of the same model.
inline dataset::GeneratorOptions write_planted_train_test(const std::filesystem::path& root,
                                                          dataset::OracleSummary* oracle) {
  dataset::GeneratorOptions gen;
  gen.lines = 40000;
  gen.files = 4;
  gen.seed = 7;
  gen.slots = 8;
  gen.dense = 3;
  gen.vocab = 10000;
  gen.zipf = 2.0;
  gen.factor_dim = 1;
  gen.out_dir = (root / "train").string();
  throw_if_error(dataset::generate(gen, oracle));
  gen.first_line = gen.lines;  // held-out lines of the same planted model
  gen.lines = 5000;
  gen.files = 1;
  gen.out_dir = (root / "test").string();
  throw_if_error(dataset::generate(gen, oracle));
  return gen;
}

// Small data for the tests that drive the binaries: `train_lines` lines of seed `seed`'s planted
// model (`slots` sparse slots, `dense` values, `vocab` keys a slot) in root/train and the
// `test_lines` after them (held out) in root/test, each in `files` files.
inline void write_small_train_test(const std::filesystem::path& root, uint64_t train_lines,
                                   uint64_t test_lines, uint64_t seed, int slots, int dense,
                                   uint64_t vocab, int files) {
  dataset::GeneratorOptions gen;
  gen.files = files;
  gen.seed = seed;
  gen.slots = slots;
  gen.dense = dense;
  gen.vocab = vocab;
  gen.threads = 1;
  dataset::OracleSummary oracle;
  gen.lines = train_lines;
  gen.out_dir = (root / "train").string();
  throw_if_error(dataset::generate(gen, &oracle));
  gen.first_line = train_lines;
  gen.lines = test_lines;
  gen.out_dir = (root / "test").string();
  throw_if_error(dataset::generate(gen, &oracle));
}

}  // namespace gpubox::testing
