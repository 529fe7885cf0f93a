// Reading a save for export: only a complete save whose halves its model manifest names, and the
// dense precision it was trained in (export_serving_model's first step).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/sparse_table.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/nn/dense_model_types.hpp"

namespace gpubox::serving {

// A complete save's two halves, as export reads them, and the dense precision it was trained in.
struct SaveToExport {
  std::unique_ptr<table::SparseTable> table;
  std::vector<float> dense;
  trainer::DensePrecision precision = trainer::DensePrecision::kFp32;
};

// Only a complete save whose halves are the ones its model manifest names, as --mode infer and a
// resume require: a save cut short or with a replaced half is refused, naming it.
StatusOr<SaveToExport> read_save_to_export(const trainer::TrainerConfig& config,
                                           const std::string& save_dir);

}  // namespace gpubox::serving
