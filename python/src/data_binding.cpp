// gpubox._core.register_data: instances from NumPy arrays (columns of a DataFrame) as an
// in-memory data set (dataset/memory_source.hpp) that training and evaluation load through the
// same InMemoryDataset as files; and the instance block both it and predict build.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "common/error_report.hpp"
#include "dataset/memory_source.hpp"
#include "dataset/stat.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace py = pybind11;

namespace gpubox::python {
namespace {

void check_columns(const std::vector<std::string>& slot_names, const std::vector<KeyArray>& keys,
                   const std::vector<OffsetArray>& offsets, const FloatArray& dense, int dense_dim,
                   std::size_t n) {
  if (keys.size() != slot_names.size() || offsets.size() != keys.size()) {
    raise(errors().engine_error, "the model has " + std::to_string(slot_names.size()) +
                                     " slots, given " + std::to_string(keys.size()) +
                                     " key arrays and " + std::to_string(offsets.size()) +
                                     " offset arrays");
  }
  if (dense.ndim() != 2 || static_cast<std::size_t>(dense.shape(0)) != n ||
      dense.shape(1) != dense_dim) {
    raise(errors().engine_error, "dense must be " + std::to_string(n) + " x " +
                                     std::to_string(dense_dim) + " (the model's dense_dim)");
  }
  for (std::size_t s = 0; s < keys.size(); ++s) {
    const auto& off = offsets[s];
    bool ok = off.ndim() == 1 && static_cast<std::size_t>(off.shape(0)) == n + 1 &&
              off.data()[0] == 0 && off.data()[n] == keys[s].size();
    for (std::size_t i = 0; ok && i < n; ++i) ok = off.data()[i] <= off.data()[i + 1];
    if (!ok) {
      raise(errors().engine_error, "slot " + slot_names[s] +
                                       ": offsets must rise from 0 to the key count, with one "
                                       "entry per instance and one more");
    }
  }
}

std::string register_data(const LoadedConfig& config, const std::vector<KeyArray>& keys,
                          const std::vector<OffsetArray>& offsets, const FloatArray& dense,
                          const FloatArray& labels) {
  const dataset::DatasetConfig& ds = config.config.dataset;
  const std::size_t n = dense.ndim() >= 1 ? static_cast<std::size_t>(dense.shape(0)) : 0;
  if (labels.ndim() != 1 || static_cast<std::size_t>(labels.shape(0)) != n) {
    raise(errors().engine_error, "labels must be one value per instance: " + std::to_string(n) +
                                     " instances (the dense rows), given " +
                                     std::to_string(labels.ndim() == 1 ? labels.shape(0) : 0) +
                                     " labels");
  }
  dataset::InstanceBlock block =
      build_block(ds.slots, ds.dense_dim, keys, offsets, dense, labels.data());
  return dataset::register_memory_source(std::move(block), ds.slots);
}

// gpubox_data stat of `dirs` (data folders, files or in-memory data sets; none: the config's
// runner.pass_dirs, else runner.train_data_dir): its JSON object's text; a load that fails
// raises its error, as gpubox_data stat exits 1.
std::string stat(const LoadedConfig& config, const std::vector<std::string>& dirs) {
  std::vector<std::string> sources = dirs;
  if (sources.empty()) {
    const trainer::RunnerConfig& runner = config.config.runner;
    sources = runner.pass_dirs.empty() ? std::vector<std::string>{runner.train_data_dir}
                                       : runner.pass_dirs;
  }
  std::string json;
  std::string failure;
  {
    py::gil_scoped_release released;
    try {
      std::vector<std::string> files;
      for (const std::string& dir : sources) {
        for (std::string& file : trainer::data_files(dir)) files.push_back(std::move(file));
      }
      const dataset::StatReport report = dataset::run_stat(config.config.dataset, files);
      if (report.load_status.ok()) {
        json = dataset::stat_json(report);
      } else {  // gpubox_data stat prints the report and exits 1
        failure = report.load_status.to_string();
      }
    } catch (const std::exception& e) {
      failure = user_message(e);
    }
  }
  if (!failure.empty()) raise(errors().engine_error, failure);
  return json;
}

}  // namespace

dataset::InstanceBlock build_block(const std::vector<std::string>& slot_names, int dense_dim,
                                   const std::vector<KeyArray>& keys,
                                   const std::vector<OffsetArray>& offsets, const FloatArray& dense,
                                   const float* labels) {
  const std::size_t n = dense.ndim() >= 1 ? static_cast<std::size_t>(dense.shape(0)) : 0;
  check_columns(slot_names, keys, offsets, dense, dense_dim, n);
  const int slots = static_cast<int>(slot_names.size());
  dataset::InstanceBlock block(slots, dense_dim);
  std::vector<uint64_t> instance_keys;
  std::vector<uint32_t> slot_sizes(slot_names.size());
  for (std::size_t i = 0; i < n; ++i) {
    instance_keys.clear();
    for (int s = 0; s < slots; ++s) {
      const int64_t* off = offsets[static_cast<std::size_t>(s)].data();
      const uint64_t* k = keys[static_cast<std::size_t>(s)].data();
      std::size_t kept = 0;
      for (int64_t j = off[i]; j < off[i + 1]; ++j) {
        if (k[j] == 0) continue;  // key 0 is padding, dropped as the parsers drop it
        instance_keys.push_back(k[j]);
        ++kept;
      }
      slot_sizes[static_cast<std::size_t>(s)] = static_cast<uint32_t>(kept);
    }
    block.append(labels != nullptr ? labels[i] : 0.0f,
                 dense.data() + i * static_cast<std::size_t>(dense_dim), instance_keys.data(),
                 instance_keys.size(), slot_sizes.data());
  }
  return block;
}

void register_data_sets(py::module_& m) {
  m.def("register_data", &register_data, py::arg("config"), py::arg("keys"), py::arg("offsets"),
        py::arg("dense"), py::arg("labels"),
        "Instances (CSR keys per slot in the config's slot order, n x dense_dim dense, n labels) "
        "as an in-memory data set; returns its name, for train_data/test_data/data_dir.");
  m.def("stat", &stat, py::arg("config"), py::arg("sources") = std::vector<std::string>{},
        "gpubox_data stat --json of `sources` (default: the config's training data).");
  m.def("release_data", &dataset::unregister_memory_source, py::arg("name"),
        "Drops an in-memory data set's name (a run under way keeps its copy).");
}

}  // namespace gpubox::python
