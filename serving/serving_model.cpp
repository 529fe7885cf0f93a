#include "serving/serving_model.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/config/slot_dims.hpp"
#include "common/enum_names.hpp"
#include "common/half.hpp"
#include "common/json.hpp"
#include "common/logging.hpp"
#include "serving/save_to_export.hpp"
#include "table/io/model_manifest.hpp"
#include "table/io/save_dir.hpp"
#include "table/sparse_table.hpp"

namespace gpubox::serving {
namespace {

constexpr const char* kDenseFile = "dense";
constexpr const char* kSparsePrefix = "sparse-";

// A float16 export keeps a record's counts (show, click) in float32 (ServingSpec::float32_counts).
constexpr int kFloat32Counts = 2;

std::size_t value_bytes(ValueType type) { return type == ValueType::kFloat16 ? 2 : 4; }
// A key and its record: its first `float32_counts` values float32, the rest of `type`.
std::size_t record_bytes(ValueType type, int pull_dim, int float32_counts) {
  return sizeof(uint64_t) + 4 * static_cast<std::size_t>(float32_counts) +
         value_bytes(type) * static_cast<std::size_t>(pull_dim - float32_counts);
}

// Little-endian appends (the exporters and readers of this format run on little-endian hosts,
// as every save of the repo assumes; the memcpy keeps them free of alignment assumptions).
template <class T>
void append_raw(std::string* out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}
template <class T>
T read_raw(const char* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

std::string number_text(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", value);
  return buf;
}

std::string join_ints(const std::vector<int>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out;
}

std::string json_strings(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + json_quote(names[i]);
  return out + "]";
}

std::string part_name(uint64_t part) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%05llu", kSparsePrefix, static_cast<unsigned long long>(part));
  return buf;
}

// The MANIFEST's description of the model, parsed back; errors name the property.
class SpecReader {
 public:
  SpecReader(const table::io::Manifest& manifest, std::string where)
      : manifest_(manifest), where_(std::move(where)) {}

  Status error() const { return error_; }

  std::string text(const std::string& key) {
    auto value = manifest_.get(key);
    if (!value.ok()) fail(value.status().message());
    return value.ok() ? value.value() : std::string();
  }
  int64_t integer(const std::string& key, int64_t min, int64_t max) {
    auto value = manifest_.get_int(key);
    if (!value.ok()) {
      fail(value.status().message());
      return min;
    }
    if (*value < min || *value > max) {
      fail("'" + key + "' = " + std::to_string(*value) + " is out of range");
      return min;
    }
    return *value;
  }
  double real(const std::string& key) {
    const std::string value = text(key);
    char* end = nullptr;
    const double parsed = std::strtod(value.c_str(), &end);
    if (error_.ok() && (value.empty() || *end != '\0' || !std::isfinite(parsed))) {
      fail("'" + key + "' is not a finite number: '" + value + "'");
    }
    return parsed;
  }
  std::vector<std::string> strings(const std::string& key) {
    std::vector<std::string> out;
    const nlohmann::json parsed = nlohmann::json::parse(text(key), nullptr, false);
    if (!parsed.is_array()) {
      fail("'" + key + "' is not a list of names");
      return out;
    }
    for (const auto& item : parsed) {
      if (!item.is_string()) {
        fail("'" + key + "' holds a value that is not a name");
        return {};
      }
      out.push_back(item.get<std::string>());
    }
    return out;
  }
  // "512,256,128" (empty: no hidden layer).
  std::vector<int> sizes(const std::string& key) {
    std::vector<int> out;
    const std::string value = text(key);
    std::size_t at = 0;
    while (error_.ok() && at < value.size()) {
      const std::size_t comma = std::min(value.find(',', at), value.size());
      const std::string item = value.substr(at, comma - at);
      char* end = nullptr;
      const long size = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || size < 1 || size > (1 << 20)) {
        fail("'" + key + "' is not a list of layer sizes: '" + value + "'");
      }
      out.push_back(static_cast<int>(size));
      at = comma + 1;
    }
    return out;
  }
  std::string quoted(const std::string& key) {
    const nlohmann::json parsed = nlohmann::json::parse(text(key), nullptr, false);
    if (!parsed.is_string()) fail("'" + key + "' is not a quoted name");
    return parsed.is_string() ? parsed.get<std::string>() : std::string();
  }
  template <class E, std::size_t N>
  E choice(const std::string& key, const EnumName<E> (&names)[N]) {
    auto parsed = parse_enum(names, text(key));
    if (!parsed.ok()) {
      fail("'" + key + "': " + parsed.status().message());
      return names[0].value;
    }
    return parsed.value();
  }

 private:
  void fail(const std::string& message) {
    if (error_.ok()) error_ = Status::Corruption(where_ + ": " + message);
  }
  const table::io::Manifest& manifest_;
  std::string where_;
  Status error_;
};

constexpr EnumName<ValueType> kValueTypeNames[] = {{ValueType::kFloat32, "float32"},
                                                   {ValueType::kFloat16, "float16"}};

// The network's own shape keys beyond fc_sizes, for the networks that have them: the one place
// where an export writes them and a load reads them back.
void write_network_keys(const trainer::DenseModelConfig& model,
                        std::map<std::string, std::string>* properties) {
  // Slots of several embedx widths (hyper_parameters.slot_dims): each slot's width, in slot
  // order; mf_dim is then the records' (the widest class's).
  if (!model.slot_dims.empty()) (*properties)["slot_dims"] = join_ints(model.slot_dims);
  // Batch norm after the MLPs' hidden layers (its running statistics are dense parameters).
  if (model.batch_norm) (*properties)["dnn_batch_norm"] = "1";
  // PaddleRec's two-class output layer (absent: the one logit, and exports from before it).
  if (model.dlrm_output != trainer::DlrmOutput::kLogit) {
    (*properties)["dlrm_output"] = name_of(trainer::kDlrmOutputNames, model.dlrm_output);
  }
  if (model.kind == trainer::ModelKind::kDcnV2 || model.kind == trainer::ModelKind::kDcn) {
    (*properties)["cross_layers"] = std::to_string(model.cross_layers);
  }
  if (model.kind == trainer::ModelKind::kDcnV2) {
    (*properties)["cross_rank"] = std::to_string(model.cross_rank);
    (*properties)["dcn_structure"] = name_of(trainer::kDcnStructureNames, model.dcn_structure);
    (*properties)["cross_experts"] = std::to_string(model.cross_experts);
  }
  if (model.kind == trainer::ModelKind::kDlrm) {
    (*properties)["bot_layer_sizes"] = join_ints(model.bot_layer_sizes);
  }
  if (model.kind == trainer::ModelKind::kXdeepfm) {
    (*properties)["layer_sizes_cin"] = join_ints(model.cin_layer_sizes);
  }
  if (model.kind == trainer::ModelKind::kAutoint) {
    (*properties)["attn_layer_sizes"] = join_ints(model.attn_layer_sizes);
    (*properties)["head_num"] = std::to_string(model.attn_heads);
    (*properties)["use_residual"] = model.attn_residual ? "1" : "0";
    (*properties)["scaling"] = model.attn_scaling ? "1" : "0";
    (*properties)["use_wide"] = model.attn_use_wide ? "1" : "0";
  }
  if (model.kind == trainer::ModelKind::kFlen) {
    (*properties)["field_group_sizes"] = join_ints(model.flen_groups);
  }
}

// write_network_keys' keys back into `model` (kind and slots already read); a malformed one is
// reported through `read` or returned.
Status read_network_keys(SpecReader& read, const table::io::Manifest& manifest,
                         const std::string& where, trainer::DenseModelConfig* model) {
  // dnn_batch_norm is absent from exports without batch norm (and from older ones).
  if (manifest.properties.count("dnn_batch_norm") != 0) {
    model->batch_norm = read.integer("dnn_batch_norm", 0, 1) != 0;
  }
  if (manifest.properties.count("dlrm_output") != 0) {
    model->dlrm_output = read.choice("dlrm_output", trainer::kDlrmOutputNames);
  }
  // cross_experts (DCN-Mix) is absent from older dcn_v2 exports.
  if (model->kind == trainer::ModelKind::kDcnV2 || model->kind == trainer::ModelKind::kDcn) {
    model->cross_layers = static_cast<int>(read.integer("cross_layers", 1, 64));
  }
  if (model->kind == trainer::ModelKind::kDcnV2) {
    model->cross_rank = static_cast<int>(read.integer("cross_rank", 0, 100000));
    model->dcn_structure = read.choice("dcn_structure", trainer::kDcnStructureNames);
    if (manifest.properties.count("cross_experts") != 0) {
      model->cross_experts = static_cast<int>(read.integer("cross_experts", 0, 64));
    }
  }
  if (model->kind == trainer::ModelKind::kDlrm) {
    model->bot_layer_sizes = read.sizes("bot_layer_sizes");
  }
  if (model->kind == trainer::ModelKind::kXdeepfm) {
    model->cin_layer_sizes = read.sizes("layer_sizes_cin");
  }
  if (model->kind == trainer::ModelKind::kAutoint) {
    model->attn_layer_sizes = read.sizes("attn_layer_sizes");
    model->attn_heads = static_cast<int>(read.integer("head_num", 1, 1024));
    model->attn_residual = read.integer("use_residual", 0, 1) != 0;
    model->attn_scaling = read.integer("scaling", 0, 1) != 0;
    model->attn_use_wide = read.integer("use_wide", 0, 1) != 0;
  }
  if (model->kind == trainer::ModelKind::kFlen) {
    model->flen_groups = read.sizes("field_group_sizes");
  }
  const auto widths = manifest.properties.find("slot_dims");
  if (widths == manifest.properties.end()) return Status::OK();
  auto dims = config::parse_slot_widths_text(widths->second, model->mf_dim, where);
  if (!dims.ok()) return dims.status();
  model->slot_dims.assign(dims->begin(), dims->end());
  if (static_cast<int>(model->slot_dims.size()) != model->slots) {
    return Status::Corruption(where + ": 'slot_dims' has " +
                              std::to_string(model->slot_dims.size()) + " widths for " +
                              std::to_string(model->slots) + " slots");
  }
  return Status::OK();
}

// The rows shown at least options.show_threshold times, as sparse-NNNNN files of `staged`.
Status write_sparse_parts(table::SparseTable& table, const ExportOptions& options,
                          table::io::StagedSave& staged, ExportSummary* summary) {
  const table::RowLayout& layout = table.layout();
  const float threshold = static_cast<float>(options.show_threshold);
  std::string part;
  uint64_t part_rows = 0;
  std::vector<float> record(static_cast<std::size_t>(layout.pull_dim()));
  Status written;
  auto flush = [&] {
    if (part_rows == 0 || !written.ok()) return;
    summary->bytes += part.size();
    written = staged.add_file(part_name(summary->parts++), part, part_rows);
    part.clear();
    part_rows = 0;
  };
  GPUBOX_RETURN_IF_ERROR(table.for_each_row([&](uint64_t key, const float* row) {
    ++summary->rows_in_save;
    if (row[table::RowLayout::kShow] < threshold || !written.ok()) return;
    table::fill_pull_record(row, layout, record.data());
    append_raw(&part, key);
    for (std::size_t f = 0; f < record.size(); ++f) {
      const float v = record[f];
      if (options.value_type != ValueType::kFloat16 || f < kFloat32Counts) {
        append_raw(&part, v);
        continue;
      }
      const uint16_t half = float_to_half(v);
      if (!std::isfinite(half_to_float(half)) && written.ok()) {
        // Served as inf, a weight would give every instance with the key one prediction.
        written = Status::InvalidArgument(
            "--export_fp16: key " + std::to_string(key) + "'s value " + std::to_string(f) +
            " of its pull record is " + std::to_string(v) +
            ", beyond float16's range (65504): export without --export_fp16");
      }
      append_raw(&part, half);
    }
    ++summary->rows_exported;
    if (++part_rows == options.rows_per_part) flush();
  }));
  flush();
  return written;
}

// What a serving MANIFEST says of the model, its input and the export.
std::map<std::string, std::string> export_properties(const trainer::TrainerConfig& config,
                                                     const std::string& save_dir,
                                                     const ExportOptions& options,
                                                     const ExportSummary& summary) {
  const trainer::DenseModelConfig model = config.dense_model_config();
  const table::AccessorConfig& sparse = config.sparse;
  std::map<std::string, std::string> properties = {
      {"format", kServingFormat},
      {"source_save", save_dir},
      {"model", name_of(trainer::kModelKindNames, model.kind)},
      {"slot_names", json_strings(config.sparse_slot_names())},
      {"mf_dim", std::to_string(model.mf_dim)},
      {"use_cvm", model.use_cvm ? "1" : "0"},
      {"dense_dim", std::to_string(model.dense_dim)},
      {"fc_sizes", join_ints(model.fc_sizes)},
      {"dense_precision", name_of(trainer::kDensePrecisionNames, summary.precision)},
      {"label_name", json_quote(config.dataset.label_name)},
      {"dense_name", json_quote(config.dataset.dense_name)},
      {"feasign_first", config.dataset.feasign_first ? "1" : "0"},
      {"dense_transform", name_of(config::kDenseTransformNames, config.dataset.dense_transform)},
      {"value_type", name_of(kValueTypeNames, options.value_type)},
      {"counts_type", "float32"},
      {"show_threshold", number_text(options.show_threshold)},
      {"rows", std::to_string(summary.rows_exported)},
      {"dense_parameters", std::to_string(summary.dense_parameters)},
      {"sparse_optimizer", name_of(table::kSparseOptimizerKindNames, sparse.optimizer.kind)},
      {"initial_range", number_text(sparse.optimizer.initial_range)},
      {"sparse_seed", std::to_string(sparse.seed)},
      // An unseen key's row starts as training stores it (rounded to bf16 or fp16).
      {"sparse_storage", name_of(table::kSparseStorageNames, sparse.storage)}};
  write_network_keys(model, &properties);
  return properties;
}

// The MANIFEST's description of the model and its input (not its files).
StatusOr<ServingSpec> read_spec(const table::io::Manifest& manifest, const std::string& where) {
  ServingSpec spec;
  SpecReader read(manifest, where);
  if (const std::string format = read.text("format");
      read.error().ok() && format != kServingFormat) {
    return Status::Corruption(where + ": format '" + format + "' is not " + kServingFormat);
  }
  spec.model.kind = read.choice("model", trainer::kModelKindNames);
  spec.slot_names = read.strings("slot_names");
  spec.model.slots = static_cast<int>(spec.slot_names.size());
  spec.model.mf_dim = static_cast<int>(read.integer("mf_dim", 0, 1 << 16));
  spec.model.use_cvm = read.integer("use_cvm", 0, 1) != 0;
  spec.model.dense_dim = static_cast<int>(read.integer("dense_dim", 0, 1 << 20));
  spec.model.fc_sizes = read.sizes("fc_sizes");
  GPUBOX_RETURN_IF_ERROR(read_network_keys(read, manifest, where, &spec.model));
  // dense_precision is absent from exports made before it: those were served in fp32.
  if (manifest.properties.count("dense_precision") != 0) {
    spec.model.precision = read.choice("dense_precision", trainer::kDensePrecisionNames);
  }
  spec.label_name = read.quoted("label_name");
  spec.dense_name = read.quoted("dense_name");
  spec.feasign_first = read.integer("feasign_first", 0, 1) != 0;
  // Absent from exports made before it: their server read the dense values as given.
  if (manifest.properties.count("dense_transform") != 0) {
    spec.dense_transform = read.choice("dense_transform", config::kDenseTransformNames);
  }
  spec.value_type = read.choice("value_type", kValueTypeNames);
  // Absent from exports made before it: a float16 export's counts were float16 too.
  if (manifest.properties.count("counts_type") != 0) {
    const std::string counts = read.text("counts_type");
    if (counts != "float32") {
      return Status::Corruption(where + ": 'counts_type' is '" + counts + "', not float32");
    }
    if (spec.value_type == ValueType::kFloat16) spec.float32_counts = kFloat32Counts;
  }
  spec.show_threshold = read.real("show_threshold");
  spec.rows = static_cast<uint64_t>(read.integer("rows", 0, INT64_MAX));
  spec.dense_parameters = static_cast<uint64_t>(read.integer("dense_parameters", 0, INT64_MAX));
  spec.sparse.optimizer.kind = read.choice("sparse_optimizer", table::kSparseOptimizerKindNames);
  spec.sparse.mf_dim = spec.model.mf_dim;
  spec.sparse.optimizer.initial_range = static_cast<float>(read.real("initial_range"));
  spec.sparse.seed =
      static_cast<uint64_t>(std::strtoull(read.text("sparse_seed").c_str(), nullptr, 10));
  // Exports made before it was recorded: fp32, as they were served.
  if (manifest.properties.count("sparse_storage") != 0) {
    spec.sparse.storage = read.choice("sparse_storage", table::kSparseStorageNames);
  }
  GPUBOX_RETURN_IF_ERROR(read.error());
  if (spec.slot_names.empty()) return Status::Corruption(where + ": the model has no slot");
  if (spec.rows >= table::KeyIndexMap::kAbsent) {
    return Status::Corruption(where + ": " + std::to_string(spec.rows) + " rows is over the limit");
  }
  return spec;
}

// The sparse files' sizes against the MANIFEST and the disk, before any is read: the record
// storage is then reserved once, from sizes that hold.
Status check_sparse_sizes(const std::string& dir, const table::io::Manifest& manifest,
                          const ServingSpec& spec, const std::string& where) {
  const std::size_t rec_bytes = record_bytes(spec.value_type, spec.pull_dim(), spec.float32_counts);
  uint64_t rows_listed = 0;
  for (const table::io::ManifestFile& file : manifest.files) {
    if (file.name.rfind(kSparsePrefix, 0) != 0) continue;
    const std::string path = dir + "/" + file.name;
    std::error_code ec;
    const uintmax_t on_disk = std::filesystem::file_size(path, ec);
    if (ec || file.bytes != file.records * rec_bytes || on_disk != file.bytes) {
      return Status::Corruption(path + ": " +
                                (ec ? "missing" : std::to_string(on_disk) + " bytes") +
                                ", the MANIFEST says " + std::to_string(file.records) +
                                " records of " + std::to_string(rec_bytes) + " bytes");
    }
    rows_listed += file.records;
  }
  if (rows_listed != spec.rows) {
    return Status::Corruption(where + ": says " + std::to_string(spec.rows) +
                              " rows, its files hold " + std::to_string(rows_listed));
  }
  return Status::OK();
}

}  // namespace

StatusOr<ExportSummary> export_serving_model(const trainer::TrainerConfig& config,
                                             const std::string& save_dir,
                                             const std::string& out_dir,
                                             const ExportOptions& options) {
  if (!std::isfinite(options.show_threshold) || options.show_threshold < 0) {
    return Status::InvalidArgument("--show_threshold must be a finite number >= 0, got " +
                                   number_text(options.show_threshold));
  }
  if (options.rows_per_part == 0) return Status::InvalidArgument("rows_per_part must be >= 1");
  // Inside a training save (beside or within its halves) an export would make the save hold
  // files its MANIFESTs do not list. The save itself and its halves are refused by StagedSave,
  // saying which they are.
  std::error_code ec;
  std::filesystem::path target = std::filesystem::absolute(out_dir, ec).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "a/b/" names b
  for (std::filesystem::path up = target.parent_path(); !ec && up.has_relative_path();
       up = up.parent_path()) {
    const bool a_half = up == target.parent_path() &&
                        (target.filename() == "sparse" || target.filename() == "dense");
    if (!a_half && std::filesystem::exists(up / table::io::kModelManifestName, ec)) {
      return Status::InvalidArgument("export --out " + out_dir + " is inside the training save " +
                                     up.string() + ": name a folder outside it");
    }
  }
  auto save = read_save_to_export(config, save_dir);
  if (!save.ok()) return save.status();
  // Exports into one folder take turns (an exclusive flock on it, released as this returns):
  // two to one --out at once removed each other's staging folder, one failing with "open folder
  // <out>.tmp: No such file or directory". Each then writes its whole export; the last stays.
  std::filesystem::path out = std::filesystem::path(out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "a/b/" names b
  const std::string folder = out.has_parent_path() ? out.parent_path().string() : ".";
  struct FolderTurn {
    int fd;
    ~FolderTurn() {
      if (fd >= 0) ::close(fd);
    }
  } turn{::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (turn.fd >= 0) (void)::flock(turn.fd, LOCK_EX);
  auto staged = table::io::StagedSave::begin(table::io::FileEnv::posix(), out_dir, kServingKind);
  if (!staged.ok()) return staged.status().with_context("exporting to " + out_dir);
  ExportSummary summary;
  GPUBOX_RETURN_IF_ERROR(write_sparse_parts(*save->table, options, **staged, &summary)
                             .with_context("exporting to " + out_dir));
  std::string dense_bytes;
  dense_bytes.reserve(save->dense.size() * sizeof(float));
  for (const float v : save->dense) append_raw(&dense_bytes, v);
  summary.dense_parameters = save->dense.size();
  summary.precision = save->precision;
  summary.bytes += dense_bytes.size();
  GPUBOX_RETURN_IF_ERROR((*staged)->add_file(kDenseFile, dense_bytes, save->dense.size()));
  GPUBOX_RETURN_IF_ERROR(
      (*staged)->commit(kServingKind, export_properties(config, save_dir, options, summary)));
  return summary;
}

StatusOr<ServingModel> ServingModel::load(const std::string& dir) {
  table::io::FileEnv* env = table::io::FileEnv::posix();
  auto manifest = table::io::read_manifest(env, dir, kServingKind);
  if (!manifest.ok()) {
    if (manifest.status().code() == Status::Code::kNotFound &&
        env->exists(dir + "/" + table::io::kModelManifestName)) {
      // A training save (<model_save_path>/<pass>): what gpubox_train --mode export reads.
      return Status::NotFound("loading serving model " + dir + ": it is a training save (" +
                              table::io::kModelManifestName +
                              "), not an export: make one with gpubox_train --config <its "
                              "config> --mode export --load " +
                              dir + " --out <folder>, and serve that folder");
    }
    return manifest.status().with_context("loading serving model " + dir);
  }
  const std::string where = dir + "/" + table::io::kManifestName;
  ServingModel out;
  auto spec = read_spec(*manifest, where);
  if (!spec.ok()) return spec.status();
  out.spec_ = std::move(*spec);
  GPUBOX_RETURN_IF_ERROR(check_sparse_sizes(dir, *manifest, out.spec_, where));
  out.records_.reserve(out.spec_.rows * static_cast<std::size_t>(out.spec_.pull_dim()));
  bool has_dense = false;
  uint64_t rows_read = 0;
  for (const table::io::ManifestFile& file : manifest->files) {
    const std::string path = dir + "/" + file.name;
    auto data = table::io::read_verified(env, dir, file);
    if (!data.ok()) return data.status().with_context("loading serving model " + dir);
    if (file.name == kDenseFile) {
      if (data->size() != file.records * sizeof(float) ||
          file.records != out.spec_.dense_parameters) {
        return Status::Corruption(path + ": " + std::to_string(data->size()) + " bytes for " +
                                  std::to_string(file.records) + " parameters, the MANIFEST says " +
                                  std::to_string(out.spec_.dense_parameters));
      }
      out.dense_.resize(file.records);
      if (!data->empty()) std::memcpy(out.dense_.data(), data->data(), data->size());
      has_dense = true;
      continue;
    }
    if (file.name.rfind(kSparsePrefix, 0) != 0) {
      return Status::Corruption(where + ": unexpected file '" + file.name + "'");
    }
    rows_read += file.records;
    if (rows_read > out.spec_.rows) {
      return Status::Corruption(path + ": more rows than the MANIFEST's " +
                                std::to_string(out.spec_.rows));
    }
    GPUBOX_RETURN_IF_ERROR(out.add_sparse_part(path, *data, file.records));
  }
  if (!has_dense) return Status::Corruption(where + ": no '" + kDenseFile + "' file");
  if (rows_read != out.spec_.rows) {
    return Status::Corruption(where + ": says " + std::to_string(out.spec_.rows) +
                              " rows, the files hold " + std::to_string(rows_read));
  }
  return out;
}

Status ServingModel::add_sparse_part(const std::string& path, const std::string& data,
                                     uint64_t records) {
  const std::size_t rec_bytes =
      record_bytes(spec_.value_type, spec_.pull_dim(), spec_.float32_counts);
  const std::size_t pull_dim = static_cast<std::size_t>(spec_.pull_dim());
  if (data.size() != records * rec_bytes) {
    return Status::Corruption(path + ": " + std::to_string(data.size()) + " bytes is not " +
                              std::to_string(records) + " records of " + std::to_string(rec_bytes) +
                              " bytes");
  }
  for (uint64_t r = 0; r < records; ++r) {
    const char* at = data.data() + r * rec_bytes;
    const uint64_t key = read_raw<uint64_t>(at);
    at += sizeof(uint64_t);
    if (index_.find(key) != table::KeyIndexMap::kAbsent) {
      return Status::Corruption(path + ": key " + std::to_string(key) + " appears twice");
    }
    index_.insert(key, static_cast<uint32_t>(records_.size() / pull_dim));
    const std::size_t counts = static_cast<std::size_t>(spec_.float32_counts);
    for (std::size_t f = 0; f < pull_dim; ++f) {
      const float v = spec_.value_type == ValueType::kFloat32 || f < counts
                          ? read_raw<float>(at + 4 * f)
                          : half_to_float(read_raw<uint16_t>(at + 4 * counts + 2 * (f - counts)));
      if (!std::isfinite(v)) {
        // An inf weight (an older float16 export's count past 65504) served one prediction for
        // every instance holding the key.
        return Status::Corruption(path + ": key " + std::to_string(key) + "'s value " +
                                  std::to_string(f) + " is " + std::to_string(v) +
                                  " (not finite): export the model again");
      }
      records_.push_back(v);
    }
  }
  return Status::OK();
}

void ServingModel::initial_record(uint64_t key, float* out) const {
  const table::RowLayout layout = table::RowLayout::make(spec_.sparse.optimizer.kind,
                                                         spec_.sparse.mf_dim, spec_.sparse.storage);
  thread_local std::vector<float> row;  // one scratch row per thread: no allocation per key
  row.resize(static_cast<std::size_t>(layout.stride()));
  table::init_row(row.data(), layout, spec_.sparse, key, 0);
  table::fill_pull_record(row.data(), layout, out);
}

}  // namespace gpubox::serving
