#include "table/io/model_manifest.hpp"

#include <xxhash.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/enum_names.hpp"
#include "table/io/save_dir.hpp"

namespace gpubox::table::io {
namespace {

// The model manifest is a save_dir Manifest of kind "model" (same framing and checksum); its
// fields are properties, the model keys under "config.<key>".
constexpr const char* kModelKind = "model";
constexpr const char* kConfigPrefix = "config.";
constexpr const char* kJobPrefix = "job.";
constexpr const char* kDensePrecisionKey = "dense_precision";

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

Status bad_field(const std::string& where, const std::string& key, const std::string& value) {
  return Status::Corruption(where + ": bad '" + key + "' value '" + value + "'");
}

}  // namespace

uint64_t half_digest(const std::string& manifest_bytes) {
  const uint64_t d = XXH3_64bits(manifest_bytes.data(), manifest_bytes.size());
  return d == 0 ? 1 : d;
}

StatusOr<uint64_t> read_half_digest(FileEnv* env, const std::string& folder,
                                    const std::string& kind) {
  std::string text;
  auto manifest = read_manifest(env, folder, kind, &text);
  if (!manifest.ok()) return manifest.status();
  return half_digest(text);
}

std::string sparse_part_folder(std::size_t i, std::size_t n) {
  return n > 1 ? std::string(kSparseHalf) + "/server-" + std::to_string(i) : kSparseHalf;
}

uint64_t ModelManifest::config_hash() const {
  std::string text;
  for (const auto& [key, value] : model_keys) text += key + '=' + value + '\n';
  return checksum(text.data(), text.size());
}

std::string ModelManifest::encode() const {
  Manifest m;
  m.kind = kModelKind;
  m.properties["pass"] = std::to_string(pass);
  m.properties["sequence"] = std::to_string(sequence);
  m.properties["save_mode"] = name_of(config::kSaveKindNames, mode);
  if (!parent.empty()) {
    m.properties["parent"] = parent;
    m.properties["parent_digest"] = hex64(parent_digest);
  }
  if (!origin.empty()) m.properties["origin"] = origin;
  m.properties["config_hash"] = hex64(config_hash());
  for (const auto& [key, value] : model_keys) m.properties[kConfigPrefix + key] = value;
  if (dense_precision.has_value()) {
    m.properties[kDensePrecisionKey] = name_of(config::kDensePrecisionNames, *dense_precision);
  }
  if (job_passes > 0) m.properties["job_passes"] = std::to_string(job_passes);
  for (const auto& [key, value] : job) m.properties[kJobPrefix + key] = value;
  m.properties["dense"] = hex64(dense);
  m.properties["sparse_parts"] = std::to_string(sparse.size());
  for (std::size_t i = 0; i < sparse.size(); ++i) {
    m.properties["sparse." + std::to_string(i)] = hex64(sparse[i]);
  }
  return m.encode();
}

StatusOr<ModelManifest> ModelManifest::parse(const std::string& text, const std::string& where) {
  auto m = Manifest::parse(text, where);
  if (!m.ok()) return m.status();
  if (m->kind != kModelKind) {
    return Status::InvalidArgument(where + ": a " + m->kind + " manifest, expected a model one");
  }
  const auto context = [&](const Status& st) { return st.with_context(where); };
  ModelManifest out;
  auto pass = m->get_int("pass");
  if (!pass.ok()) return context(pass.status());
  out.pass = *pass;
  auto sequence = m->get_int("sequence");
  if (!sequence.ok()) return context(sequence.status());
  out.sequence = static_cast<uint64_t>(*sequence);
  auto mode_text = m->get("save_mode");
  if (!mode_text.ok()) return context(mode_text.status());
  auto mode = parse_enum(config::kSaveKindNames, *mode_text);
  if (!mode.ok() || *mode == config::SaveKind::kNone) {
    return bad_field(where, "save_mode", *mode_text);
  }
  out.mode = *mode;
  const auto optional = [&](const char* key) {
    auto it = m->properties.find(key);
    return it == m->properties.end() ? std::string() : it->second;
  };
  out.parent = optional("parent");
  out.origin = optional("origin");
  if (!out.parent.empty() && !parse_hex64(optional("parent_digest"), &out.parent_digest)) {
    return bad_field(where, "parent_digest", optional("parent_digest"));
  }
  if (out.mode == config::SaveKind::kDelta && out.parent.empty()) {
    return Status::Corruption(where + ": a delta save that names no parent save");
  }
  auto dense = m->get("dense");
  if (!dense.ok()) return context(dense.status());
  if (!parse_hex64(*dense, &out.dense)) return bad_field(where, "dense", *dense);
  auto parts = m->get_int("sparse_parts");
  if (!parts.ok()) return context(parts.status());
  if (*parts < 1 || *parts > 65536) {
    return bad_field(where, "sparse_parts", std::to_string(*parts));
  }
  for (int64_t i = 0; i < *parts; ++i) {
    const std::string key = "sparse." + std::to_string(i);
    auto digest = m->get(key);
    if (!digest.ok()) return context(digest.status());
    uint64_t value = 0;
    if (!parse_hex64(*digest, &value)) return bad_field(where, key, *digest);
    out.sparse.push_back(value);
  }
  const std::string prefix = kConfigPrefix;
  const std::string job_prefix = kJobPrefix;
  for (const auto& [key, value] : m->properties) {
    if (key.compare(0, prefix.size(), prefix) == 0)
      out.model_keys[key.substr(prefix.size())] = value;
    if (key.compare(0, job_prefix.size(), job_prefix) == 0)
      out.job[key.substr(job_prefix.size())] = value;
  }
  if (m->properties.count("job_passes") != 0) {
    auto job_passes = m->get_int("job_passes");
    if (!job_passes.ok() || *job_passes < 1)
      return bad_field(where, "job_passes", optional("job_passes"));
    out.job_passes = *job_passes;
  }
  if (m->properties.count(kDensePrecisionKey) != 0) {
    auto precision = parse_enum(config::kDensePrecisionNames, optional(kDensePrecisionKey));
    if (!precision.ok()) {
      return Status::Corruption(where + ": '" + kDensePrecisionKey +
                                "': " + precision.status().message());
    }
    out.dense_precision = *precision;
  }
  uint64_t recorded = 0;
  if (!parse_hex64(optional("config_hash"), &recorded) || recorded != out.config_hash()) {
    return Status::Corruption(where + ": config_hash does not match the config keys it lists");
  }
  return out;
}

Status write_model_manifest(FileEnv* env, const std::string& dir, const ModelManifest& manifest,
                            uint64_t* digest) {
  const std::string text = manifest.encode();
  const std::string path = join(dir, kModelManifestName);
  const std::string staging = path + ".tmp";
  GPUBOX_RETURN_IF_ERROR(write_file(env, staging, text).with_context("writing " + staging));
  GPUBOX_RETURN_IF_ERROR(env->rename(staging, path).with_context("renaming " + staging));
  GPUBOX_RETURN_IF_ERROR(env->sync_dir(dir).with_context("syncing " + dir));
  if (digest != nullptr) *digest = half_digest(text);
  return Status::OK();
}

Status remove_model_manifest(FileEnv* env, const std::string& dir) {
  const std::string path = join(dir, kModelManifestName);
  if (!env->exists(path)) return Status::OK();
  GPUBOX_RETURN_IF_ERROR(env->remove_all(path).with_context("removing " + path));
  return env->sync_dir(dir).with_context("syncing " + dir);
}

namespace {

// Why a folder without a MODEL_MANIFEST is none: an export (its MANIFEST names the serving
// format), a folder of saves (the saves it holds), or a save cut short / no gpubox save.
std::string what_else_is_there(FileEnv* env, const std::string& dir) {
  const std::string exported = join(dir, "MANIFEST");
  if (env->exists(exported)) {
    auto text = env->read_file(exported, kMaxManifestBytes);
    if (text.ok() && text->find("gpubox-serving") != std::string::npos) {
      return "it is an export, which gpubox_serve reads: name the training save it was made from";
    }
  }
  auto entries = env->list_dir(dir);
  std::vector<std::string> saves;
  if (entries.ok()) {
    for (const std::string& name : *entries) {
      if (env->exists(join(join(dir, name), kModelManifestName))) saves.push_back(name);
    }
  }
  if (!saves.empty()) {
    std::sort(saves.begin(), saves.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;  // 2 before 10
    });
    return "it is a folder of " + std::to_string(saves.size()) + " saves (" + saves.front() +
           (saves.size() > 1 ? " .. " + saves.back() : std::string()) + "): name one, e.g. " +
           join(dir, saves.back());
  }
  return "a save cut short, or not a gpubox save";
}

}  // namespace

StatusOr<ModelManifest> read_model_manifest(FileEnv* env, const std::string& dir,
                                            uint64_t* digest) {
  const std::string path = join(dir, kModelManifestName);
  if (!env->exists(path)) {
    return Status::NotFound(path + " is missing: " + dir + " holds no complete save (" +
                            what_else_is_there(env, dir) + ")");
  }
  auto text = env->read_file(path, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  auto manifest = ModelManifest::parse(*text, path);
  if (manifest.ok() && digest != nullptr) *digest = half_digest(*text);
  return manifest;
}

Status check_halves(FileEnv* env, const std::string& dir, const ModelManifest& manifest,
                    bool sparse_required) {
  std::string differences;
  const auto check = [&](const std::string& folder, const char* kind, uint64_t named,
                         bool required) {
    const std::string path = join(dir, folder);
    std::string text;
    auto half = read_manifest(env, path, kind, &text);
    if (!half.ok()) {
      if (half.status().code() == Status::Code::kNotFound && !required) return;
      differences += "; " + folder + ": " + half.status().message();
    } else if (const uint64_t found = half_digest(text); found != named) {
      differences += "; " + folder + "/" + kManifestName + " has digest " + hex64(found) +
                     ", the model manifest names " + hex64(named);
    } else if (const Status sizes = check_file_sizes(env, path, *half); !sizes.ok()) {
      differences += "; " + sizes.message();  // a file truncated or missing since the save
    }
  };
  check(kDenseHalf, kDenseHalf, manifest.dense, true);
  for (std::size_t i = 0; i < manifest.sparse.size(); ++i) {
    check(sparse_part_folder(i, manifest.sparse.size()), kSparseHalf, manifest.sparse[i],
          sparse_required);
  }
  if (differences.empty()) return Status::OK();
  return Status::InvalidArgument(
      "the halves of " + dir + " do not match its " + kModelManifestName + " (saved after " +
      std::to_string(manifest.pass) + " passes)" + differences.replace(0, 1, ":"));
}

}  // namespace gpubox::table::io
