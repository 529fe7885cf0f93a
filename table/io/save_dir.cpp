#include "table/io/save_dir.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <utility>

#include "table/io/model_manifest.hpp"

namespace gpubox::table::io {
namespace {

constexpr const char* kMagic = "gpubox-save 1";

bool parse_u64(const std::string& s, int base, uint64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, base);
  if (errno != 0 || end == nullptr || *end != '\0' || s[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace

uint64_t checksum(const void* data, std::size_t size) { return XXH64(data, size, 0); }

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, value);
  return buf;
}

bool parse_hex64(const std::string& text, uint64_t* value) {
  return text.size() <= 16 && parse_u64(text, 16, value);
}

std::string Manifest::encode() const {
  std::ostringstream out;
  out << kMagic << "\n";
  out << "kind " << kind << "\n";
  for (const auto& [key, value] : properties) out << "property " << key << " " << value << "\n";
  for (const auto& f : files) {
    out << "file " << f.name << " " << f.records << " " << f.bytes << " " << hex64(f.xxh64) << "\n";
  }
  std::string body = out.str();
  body += "checksum " + hex64(checksum(body.data(), body.size())) + "\n";
  return body;
}

StatusOr<Manifest> Manifest::parse(const std::string& text, const std::string& where) {
  const auto tail = text.rfind("checksum ");
  if (tail == std::string::npos || (tail > 0 && text[tail - 1] != '\n') || text.back() != '\n') {
    return Status::Corruption(where + ": truncated (no checksum line)");
  }
  uint64_t expected = 0;
  if (!parse_u64(text.substr(tail + 9, text.size() - tail - 10), 16, &expected) ||
      expected != checksum(text.data(), tail)) {
    return Status::Corruption(where + ": checksum mismatch");
  }
  std::istringstream in(text.substr(0, tail));
  std::string line;
  if (!std::getline(in, line) || line != kMagic) {
    return Status::Corruption(where + ": not a gpubox save manifest (first line '" + line + "')");
  }
  Manifest m;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    const std::string at = where + " line " + std::to_string(line_no);
    if (tag == "kind") {
      fields >> m.kind;
    } else if (tag == "property") {
      std::string key, value;
      fields >> key;
      std::getline(fields >> std::ws, value);
      m.properties[key] = value;
    } else if (tag == "file") {
      ManifestFile f;
      std::string records, bytes, hash;
      fields >> f.name >> records >> bytes >> hash;
      if (f.name.empty() || !parse_u64(records, 10, &f.records) ||
          !parse_u64(bytes, 10, &f.bytes) || !parse_u64(hash, 16, &f.xxh64)) {
        return Status::Corruption(at + ": malformed file entry '" + line + "'");
      }
      m.files.push_back(f);
    } else {
      return Status::Corruption(at + ": unknown entry '" + line + "'");
    }
  }
  return m;
}

StatusOr<std::string> Manifest::get(const std::string& key) const {
  auto it = properties.find(key);
  if (it == properties.end()) return Status::Corruption("manifest has no '" + key + "'");
  return it->second;
}

StatusOr<int64_t> Manifest::get_int(const std::string& key) const {
  auto value = get(key);
  if (!value.ok()) return value.status();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value->c_str(), &end, 10);
  if (value->empty() || errno != 0 || *end != '\0') {
    return Status::Corruption("manifest '" + key + "' is not an integer: '" + *value + "'");
  }
  return static_cast<int64_t>(v);
}

namespace {

// In a staging folder while its save is written (removed before the swap): what tells a stale
// staging folder, which the next save removes, from a folder of the user's that happens to be
// named `<path>.tmp`.
constexpr const char* kStagingMark = ".gpubox-staging";

// "a, b, c (and 2 more)" of `names`.
std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 5) out += " (and " + std::to_string(names.size() - 5) + " more)";
  return out;
}

// The entries of `dir` (listed: `entries`) that are not the save whose MANIFEST is `manifest`:
// anything beside its MANIFEST and the files it lists (the staging mark aside).
std::vector<std::string> foreign_entries(const std::vector<std::string>& entries,
                                         const Manifest& manifest) {
  std::vector<std::string> foreign;
  for (const std::string& name : entries) {
    const bool listed = std::any_of(manifest.files.begin(), manifest.files.end(),
                                    [&](const ManifestFile& f) { return f.name == name; });
    if (!listed && name != kManifestName && name != kStagingMark) foreign.push_back(name);
  }
  std::sort(foreign.begin(), foreign.end());
  return foreign;
}

// The save at `where` + "/MANIFEST", or why there is none: what a folder a save would replace
// (or a stale staging folder it would remove) must hold.
StatusOr<Manifest> manifest_at(FileEnv* env, const std::string& dir) {
  const std::string where = dir + "/" + kManifestName;
  auto text = env->read_file(where, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  return Manifest::parse(*text, where);
}

// OK when the non-empty folder `path` (its entries `entries`) is a save of `kind` and nothing
// else, which a save of `kind` may replace. Anything else is refused, naming what is there: a
// folder whose MANIFEST is another program's, or which holds files beside a save's, was deleted
// whole by the swap (an export over a source checkout's MANIFEST, a README beside an export).
Status check_replaceable(FileEnv* env, const std::string& path, const std::string& kind,
                         const std::vector<std::string>& entries) {
  const std::string refusing =
      "; refusing to replace it (and delete what it holds): remove it "
      "yourself or save elsewhere";
  if (!env->exists(path + "/" + kManifestName)) {
    // A model save (a pass's folder) is a gpubox save too, of another kind than this one.
    if (env->exists(path + "/" + kModelManifestName)) {
      return Status::InvalidArgument("save path " + path + " holds a model save (its " +
                                     kModelManifestName +
                                     "), not a part or an export; refusing to replace it");
    }
    return Status::InvalidArgument("save path " + path + " exists and is not a gpubox save (" +
                                   some_names(entries) + ")" + refusing);
  }
  StatusOr<Manifest> there = manifest_at(env, path);
  if (!there.ok()) {
    return Status::InvalidArgument("save path " + path + " holds a MANIFEST that is not a " +
                                   "gpubox save's (" + there.status().message() + ")" + refusing);
  }
  // A save of another kind (an export over a training save's dense or sparse half): refused, or
  // the save it belongs to would be left half another thing.
  if (there->kind != kind) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    const bool in_model_save = env->exists(parent + "/" + kModelManifestName);
    return Status::InvalidArgument(
        "save path " + path + " holds a " + there->kind + " save" +
        (in_model_save ? " (a half of the model save " + parent + ")" : "") + ", not a " + kind +
        " one; refusing to replace it");
  }
  const std::vector<std::string> foreign = foreign_entries(entries, *there);
  if (!foreign.empty()) {
    return Status::InvalidArgument("save path " + path + " holds a " + kind +
                                   " save and files that are not of it: " + some_names(foreign) +
                                   refusing);
  }
  return Status::OK();
}

// OK when `staging` (a save's `<path>.tmp`, which exists) may be removed: empty, marked by
// StagedSave (a save cut short), or a whole save and nothing else (an earlier save a crash left
// under the staging name after the swap). A folder of the user's that happens to bear the name
// was removed without a word.
Status check_stale_staging(FileEnv* env, const std::string& staging, const std::string& path) {
  auto entries = env->list_dir(staging);
  if (!entries.ok()) return entries.status();
  if (entries->empty() ||
      std::find(entries->begin(), entries->end(), kStagingMark) != entries->end()) {
    return Status::OK();
  }
  StatusOr<Manifest> there = manifest_at(env, staging);
  if (there.ok() && foreign_entries(*entries, *there).empty()) return Status::OK();
  return Status::InvalidArgument(staging + " (where a save of " + path +
                                 " is written before it is swapped in) exists and is not a "
                                 "gpubox staging folder (" +
                                 some_names(*entries) +
                                 "); refusing to remove it: move it, or save elsewhere");
}

}  // namespace

StatusOr<std::unique_ptr<StagedSave>> StagedSave::begin(FileEnv* env, const std::string& requested,
                                                        const std::string& kind) {
  // "model/" names the folder "model": its staging folder is "model.tmp", not "model/.tmp".
  std::string path = requested;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.empty()) return Status::InvalidArgument("save path is empty");
  if (path == "/" || path == "." || path == "..") {
    return Status::InvalidArgument("save path '" + path + "' is not a folder a save can replace");
  }
  if (env->exists(path)) {
    auto entries = env->list_dir(path);
    if (!entries.ok()) return entries.status();
    if (!entries->empty()) GPUBOX_RETURN_IF_ERROR(check_replaceable(env, path, kind, *entries));
  }
  const std::string staging = path + ".tmp";
  if (env->exists(staging)) GPUBOX_RETURN_IF_ERROR(check_stale_staging(env, staging, path));
  GPUBOX_RETURN_IF_ERROR(env->remove_all(staging));
  // From here its destructor removes the staging folder (never one the checks above refused).
  std::unique_ptr<StagedSave> save(new StagedSave(env, path));
  GPUBOX_RETURN_IF_ERROR(env->create_dir(staging));
  GPUBOX_RETURN_IF_ERROR(write_file(env, staging + "/" + kStagingMark, ""));
  return save;
}

StagedSave::~StagedSave() {
  if (!committed_) (void)env_->remove_all(path_ + ".tmp");
}

Status StagedSave::add_file(const std::string& name, const std::string& data, uint64_t records) {
  GPUBOX_RETURN_IF_ERROR(write_file(env_, path_ + ".tmp/" + name, data));
  MutexLock lock(files_mu_);
  files_.push_back(ManifestFile{name, records, data.size(), checksum(data.data(), data.size())});
  return Status::OK();
}

Status StagedSave::commit(const std::string& kind,
                          const std::map<std::string, std::string>& properties) {
  const std::string staging = path_ + ".tmp";
  Manifest manifest;
  manifest.kind = kind;
  manifest.properties = properties;
  {
    MutexLock lock(files_mu_);
    manifest.files = files_;
  }
  std::sort(manifest.files.begin(), manifest.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) { return a.name < b.name; });
  GPUBOX_RETURN_IF_ERROR(write_file(env_, staging + "/" + kManifestName, manifest.encode()));
  // A whole save from here on (check_stale_staging knows it by its MANIFEST): no mark in it.
  GPUBOX_RETURN_IF_ERROR(env_->remove_all(staging + "/" + kStagingMark));
  GPUBOX_RETURN_IF_ERROR(env_->sync_dir(staging));
  if (env_->exists(path_)) {
    // After the exchange the previous save sits under the staging name; the destructor drops it.
    exchange_tried_ = true;
    GPUBOX_RETURN_IF_ERROR(env_->exchange(staging, path_));
  } else {
    GPUBOX_RETURN_IF_ERROR(env_->rename(staging, path_));
  }
  committed_ = true;
  GPUBOX_RETURN_IF_ERROR(env_->sync_dir(parent_dir(path_)));
  return env_->remove_all(staging);
}

StatusOr<Manifest> read_manifest(FileEnv* env, const std::string& path, const std::string& kind,
                                 std::string* text_out) {
  const std::string where = path + "/" + kManifestName;
  if (!env->exists(where)) {
    // A save reached through a symbolic link, which a server's data_dir never follows: that
    // error (naming the link), not "missing" (a second look, on the failure path only).
    if (auto through = env->read_file(where, kMaxManifestBytes);
        through.status().code() == Status::Code::kPermissionDenied) {
      return through.status();
    }
    // A trainer's save (its MODEL_MANIFEST) keeps this part in a subfolder: name it.
    std::string hint;
    for (const char* part : {"sparse", "dense"}) {
      if (env->exists(path + "/MODEL_MANIFEST") &&
          env->exists(path + "/" + part + "/" + kManifestName)) {
        hint += std::string(hint.empty() ? "" : " or ") + path + "/" + part;
      }
    }
    return Status::NotFound(where + " is missing: no complete save at " + path +
                            (hint.empty() ? ""
                                          : " (a trainer's save: its parts are in " + hint +
                                                "; a server loads " + path + "/sparse)"));
  }
  auto text = env->read_file(where, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  auto manifest = Manifest::parse(*text, where);
  if (!manifest.ok()) return manifest.status();
  if (manifest->kind != kind) {
    return Status::InvalidArgument(where + ": a " + manifest->kind + " save, expected " + kind);
  }
  if (text_out != nullptr) *text_out = std::move(*text);
  return manifest;
}

namespace {
Status size_mismatch(const std::string& where, uint64_t bytes, const ManifestFile& file) {
  return Status::Corruption(where + ": " + std::to_string(bytes) + " bytes, MANIFEST says " +
                            std::to_string(file.bytes) + " (truncated or overwritten)");
}
}  // namespace

Status check_file_sizes(FileEnv* env, const std::string& path, const Manifest& manifest) {
  for (const ManifestFile& file : manifest.files) {
    const std::string where = path + "/" + file.name;
    if (!env->exists(where)) return Status::Corruption(where + ": listed in MANIFEST but missing");
    auto in = env->open_sequential(where, file.bytes);
    if (!in.ok()) return in.status();
    if ((*in)->size() != file.bytes) return size_mismatch(where, (*in)->size(), file);
  }
  return Status::OK();
}

StatusOr<std::string> read_verified(FileEnv* env, const std::string& path,
                                    const ManifestFile& file) {
  const std::string where = path + "/" + file.name;
  if (!env->exists(where)) return Status::Corruption(where + ": listed in MANIFEST but missing");
  auto data = env->read_file(where, file.bytes);
  if (!data.ok()) return data.status();
  if (data->size() != file.bytes) return size_mismatch(where, data->size(), file);
  if (checksum(data->data(), data->size()) != file.xxh64) {
    return Status::Corruption(where + ": checksum mismatch (file corrupted)");
  }
  return data;
}

StatusOr<std::unique_ptr<VerifiedChunkReader>> VerifiedChunkReader::open(FileEnv* env,
                                                                         const std::string& path,
                                                                         const ManifestFile& file,
                                                                         std::size_t chunk_bytes) {
  const std::string where = path + "/" + file.name;
  if (!env->exists(where)) return Status::Corruption(where + ": listed in MANIFEST but missing");
  auto in = env->open_sequential(where, file.bytes);
  if (!in.ok()) return in.status();
  if ((*in)->size() != file.bytes) return size_mismatch(where, (*in)->size(), file);
  std::unique_ptr<VerifiedChunkReader> reader(
      new VerifiedChunkReader(where, file, chunk_bytes, std::move(in).value()));
  if (!reader->hash_ || XXH64_reset(reader->hash_.get(), 0) != XXH_OK) {
    return Status::Internal("xxh64 state");
  }
  return reader;
}

VerifiedChunkReader::VerifiedChunkReader(std::string where, const ManifestFile& file,
                                         std::size_t chunk_bytes,
                                         std::unique_ptr<SequentialFile> in)
    : where_(std::move(where)),
      file_(file),
      chunk_bytes_(chunk_bytes),
      in_(std::move(in)),
      hash_(XXH64_createState()) {}

void VerifiedChunkReader::FreeHash::operator()(XXH64_state_s* state) const {
  XXH64_freeState(state);
}

StatusOr<bool> VerifiedChunkReader::next(const ChunkConsumer& consume) {
  if (ended_) return false;
  const std::size_t kept = buffer_.size();
  // No more than the entry's bytes left, and one past them (the read that finds the end): the
  // buffer's growth is zero-filled, and a small file (a delta's) is no reason to fill a chunk.
  const std::size_t want = static_cast<std::size_t>(
      std::min<uint64_t>(chunk_bytes_, (file_.bytes > read_ ? file_.bytes - read_ : 0) + 1));
  buffer_.resize(kept + want);
  auto got = in_->read(&buffer_[kept], want);
  if (!got.ok()) return got.status();
  buffer_.resize(kept + *got);
  XXH64_update(hash_.get(), buffer_.data() + kept, *got);
  read_ += *got;
  ended_ = *got == 0;
  if (!refused_.ok()) {
    buffer_.clear();  // only the checksum is still wanted
    return true;
  }
  auto took = consume(buffer_.data(), buffer_.size(), ended_);
  if (!took.ok()) {
    refused_ = took.status();
  } else if (ended_ && *took != buffer_.size()) {
    refused_ = Status::Internal(where_ + ": the reader left " +
                                std::to_string(buffer_.size() - *took) + " bytes at the end");
  } else if (*took == 0 && buffer_.size() > chunk_bytes_) {
    refused_ = Status::Corruption(where_ + ": a record longer than " +
                                  std::to_string(chunk_bytes_) + " bytes at byte " +
                                  std::to_string(read_ - buffer_.size()) + " (corrupt file)");
  } else {
    buffer_.erase(0, *took);
  }
  return true;
}

Status VerifiedChunkReader::finish() {
  if (read_ != file_.bytes) return size_mismatch(where_, read_, file_);
  if (XXH64_digest(hash_.get()) != file_.xxh64) {
    return Status::Corruption(where_ + ": checksum mismatch (file corrupted)");
  }
  return refused_;
}

Status read_verified_chunks(FileEnv* env, const std::string& path, const ManifestFile& file,
                            std::size_t chunk_bytes, const ChunkConsumer& consume) {
  auto reader = VerifiedChunkReader::open(env, path, file, chunk_bytes);
  if (!reader.ok()) return reader.status();
  for (;;) {
    auto more = (*reader)->next(consume);
    if (!more.ok()) return more.status();
    if (!*more) return (*reader)->finish();
  }
}

}  // namespace gpubox::table::io
