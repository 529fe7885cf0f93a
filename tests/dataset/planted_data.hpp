// Planted, learnable train and held-out data for the tests that train end to end and compare
// with the planted model's AUC: configs/config_synthetic.yaml's data settings (Zipf 2, one
// planted factor) scaled down to 40,000 lines in 4 files under root/train (two trainers take two
// files each) and 5,000 held-out lines of the same planted model under root/test.
#pragma once

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

}  // namespace gpubox::testing
