// Reads the dataset part of a PaddleRec-style config (config_gpubox.yaml) into a DatasetConfig.
// Kept in one small file so the trainer's config loader can reuse or replace it.
//
// Keys read (all optional; defaults are DatasetConfig's):
//   runner.train_data_dir       folder whose regular files (sorted; hidden and *.json files
//                               skipped) are the file list, or a single file; a relative path is
//                               tried against the config file's folder first, then the working
//                               directory
//   runner.data_format          slot | multislot | criteo
//   runner.thread_num           reader threads
//   runner.train_batch_size     instances per batch per card
//   runner.pipe_command         e.g. "gzip -dc"
//   runner.strict_parse         true: the first malformed line fails the load
//   runner.max_line_bytes       longer lines are malformed
//   runner.label_name           slot format: label token name (default "click")
//   runner.dense_name           slot format: dense token name (default "dense_feature")
//   runner.feasign_first        slot format: tokens are `value:name`
//   runner.ignore_unknown_slots slot format: skip tokens of undeclared slots
//   runner.criteo_dense         minmax | log | none
//   hyper_parameters.sparse_inputs_slots  a count N (PaddleRec: the label counts, slots are
//                               named "1".."N-1") or a list of slot names
//   hyper_parameters.dense_input_dim      dense floats per instance
// Overrides `key=value` (as given to `-o`) replace or add scalar keys before reading; a value
// of the form [a, b] is read as a YAML list.
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"
#include "dataset/dataset_types.hpp"

namespace gpubox::dataset {

struct DatasetYamlConfig {
  DatasetConfig dataset;
  std::string train_data_dir;      // as resolved
  std::vector<std::string> files;  // regular files of train_data_dir, sorted
};

StatusOr<DatasetYamlConfig> load_dataset_config(const std::string& path,
                                                const std::vector<std::string>& overrides);

// The regular files of `dir`, sorted by name; hidden files and *.json (metadata such as gen's
// oracle.json) skipped. A regular file given as `dir` is the one file of the list. A missing folder
// is an error naming it.
StatusOr<std::vector<std::string>> list_data_files(const std::string& dir);

}  // namespace gpubox::dataset
