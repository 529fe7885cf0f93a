#include "dataset/dataset_config_yaml.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>

namespace gpubox::dataset {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// yaml-cpp nodes are handles: a copy refers to the same node, and a child created through a
// non-const operator[] is attached once it is assigned.
void set_path(YAML::Node node, const std::vector<std::string>& parts, std::size_t i,
              const YAML::Node& value) {
  if (i + 1 == parts.size()) {
    node[parts[i]] = value;
    return;
  }
  set_path(node[parts[i]], parts, i + 1, value);
}

// Read-only lookup: const operator[] never creates nodes, and copies share the node.
YAML::Node find_parts(const YAML::Node& node, const std::vector<std::string>& parts,
                      std::size_t i) {
  if (i == parts.size()) return node;
  if (!node.IsMap()) return YAML::Node();
  const YAML::Node child = node[parts[i]];
  if (!child) return YAML::Node();
  return find_parts(child, parts, i + 1);
}

YAML::Node find(const YAML::Node& root, const std::string& key) {
  return find_parts(root, split_key(key), 0);
}

template <class T>
Status read_scalar(const YAML::Node& root, const std::string& key, T* out) {
  const YAML::Node node = find(root, key);
  if (!node || node.IsNull()) return Status::OK();
  try {
    *out = node.as<T>();
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(key + ": cannot read '" + YAML::Dump(node) + "' (" + e.msg +
                                   ")");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::vector<std::string>> list_data_files(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return std::vector<std::string>{dir};
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("data folder '" + dir + "' does not exist or is not a folder");
  }
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // Hidden files and JSON metadata (gen's oracle.json) are not data.
    if (name.empty() || name[0] == '.') continue;
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0) continue;
    if (entry.is_regular_file(ec)) files.push_back(entry.path().string());
  }
  if (ec) return Status::IOError("cannot list '" + dir + "': " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

StatusOr<DatasetYamlConfig> load_dataset_config(const std::string& path,
                                                const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status::IOError("cannot read config '" + path + "'");
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("config '" + path + "': " + e.what());
  }
  if (!root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  std::string override_data_dir;
  for (const std::string& kv : overrides) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument("override '" + kv + "' is not key=value");
    }
    const std::string key = kv.substr(0, eq);
    YAML::Node value;
    try {
      value = YAML::Load(kv.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument("override '" + kv + "': " + e.what());
    }
    set_path(root, split_key(key), 0, value);
    if (key == "runner.train_data_dir") override_data_dir = kv.substr(eq + 1);
  }

  DatasetYamlConfig out;
  DatasetConfig& c = out.dataset;
  std::string format = format_name(c.data_format);
  std::string criteo = criteo_dense_name(c.criteo_dense);
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.data_format", &format));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.thread_num", &c.thread_num));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.train_batch_size", &c.batch_size));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.pipe_command", &c.pipe_command));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.strict_parse", &c.strict_parse));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.max_line_bytes", &c.max_line_bytes));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.label_name", &c.label_name));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.dense_name", &c.dense_name));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.feasign_first", &c.feasign_first));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.ignore_unknown_slots", &c.ignore_unknown_slots));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.criteo_dense", &criteo));
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "hyper_parameters.dense_input_dim", &c.dense_dim));

  StatusOr<DataFormat> parsed_format = parse_format(format);
  if (!parsed_format.ok()) return parsed_format.status().with_context("runner.data_format");
  c.data_format = *parsed_format;
  StatusOr<CriteoDense> parsed_criteo = parse_criteo_dense(criteo);
  if (!parsed_criteo.ok()) return parsed_criteo.status().with_context("runner.criteo_dense");
  c.criteo_dense = *parsed_criteo;

  const YAML::Node slots = find(root, "hyper_parameters.sparse_inputs_slots");
  try {
    if (slots && slots.IsSequence()) {
      for (const YAML::Node& name : slots) c.slots.push_back(name.as<std::string>());
    } else if (slots && slots.IsScalar()) {
      c.slots = numbered_slots(slots.as<int>());
    }
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("hyper_parameters.sparse_inputs_slots: " + e.msg);
  }
  GPUBOX_RETURN_IF_ERROR(validate(c).with_context("config '" + path + "'"));

  std::string data_dir;
  GPUBOX_RETURN_IF_ERROR(read_scalar(root, "runner.train_data_dir", &data_dir));
  if (!data_dir.empty()) {
    fs::path dir(data_dir);
    if (dir.is_relative() && data_dir != override_data_dir) {
      const fs::path beside = fs::path(path).parent_path() / dir;
      std::error_code ec;
      if (fs::exists(beside, ec)) dir = beside;
    }
    out.train_data_dir = dir.string();
    StatusOr<std::vector<std::string>> files = list_data_files(out.train_data_dir);
    if (!files.ok()) return files.status().with_context("runner.train_data_dir");
    out.files = std::move(*files);
  }
  return out;
}

}  // namespace gpubox::dataset
