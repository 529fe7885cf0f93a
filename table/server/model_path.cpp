#include "table/server/model_path.hpp"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "table/io/save_dir.hpp"

namespace gpubox::table::server {
namespace {

namespace fs = std::filesystem;

// The files a model folder without a MANIFEST is digested from (a test tier's) are small;
// anything larger is not a model this server wrote.
constexpr uint64_t kMaxDigestedFileBytes = uint64_t{1} << 30;

// Whether `inner` starts with `root` (both normalized); `*rest` = the parts after it.
bool relative_inside(const fs::path& inner, const fs::path& root, fs::path* rest) {
  auto i = inner.begin();
  for (const auto& part : root) {
    if (part.empty()) continue;  // the trailing "" of "/tmp/"
    if (i == inner.end() || *i != part) return false;
    ++i;
  }
  fs::path out;
  for (; i != inner.end(); ++i) out /= *i;
  *rest = out;
  return true;
}

class Digest {
 public:
  Digest() : state_(XXH3_createState(), &XXH3_freeState) { XXH3_64bits_reset(state_.get()); }
  void add(const void* data, std::size_t n) { XXH3_64bits_update(state_.get(), data, n); }
  uint64_t value() const { return XXH3_64bits_digest(state_.get()); }

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

}  // namespace

StatusOr<std::string> model_path_in_data_dir(const std::string& data_dir, const std::string& path,
                                             const std::string& subfolder) {
  if (path.empty()) return Status::InvalidArgument("empty model path");
  if (path.find('\0') != std::string::npos) {
    return Status::InvalidArgument("model path contains a NUL byte");
  }
  const fs::path requested = fs::path(path).lexically_normal();
  for (const auto& part : fs::path(path)) {
    if (part == "..") return Status::InvalidArgument("model path '" + path + "' contains '..'");
  }
  fs::path relative = requested;
  if (requested.is_absolute()) {
    std::error_code ec;
    const fs::path given = data_dir.empty() ? fs::current_path(ec) : fs::absolute(data_dir, ec);
    if (ec) return Status::IOError("data_dir '" + data_dir + "': " + ec.message());
    const fs::path real = fs::weakly_canonical(given, ec);
    if (!relative_inside(requested, given.lexically_normal(), &relative) &&
        (ec || !relative_inside(requested, real, &relative))) {
      return Status::PermissionDenied("model path '" + path +
                                      "' is outside the server's data_dir '" + given.string() +
                                      "' (paths are relative to --data_dir and may not leave it)");
    }
  }
  std::string out = relative.lexically_normal().generic_string();
  while (!out.empty() && out.back() == '/') out.pop_back();
  if (out.empty() || out == ".") {
    return Status::InvalidArgument(
        "model path '" + path +
        "' names the server's --data_dir itself: a save is a folder inside it (e.g. 'model'), "
        "written beside its staging folder '<folder>.tmp'");
  }
  if (!subfolder.empty()) out += "/" + subfolder;
  return out;
}

uint64_t model_generation(io::FileEnv* env, const std::string& folder) {
  Digest digest;
  const std::string manifest = folder + "/" + io::kManifestName;
  if (env->exists(manifest)) {
    auto text = env->read_file(manifest, io::kMaxManifestBytes);
    if (!text.ok()) return 1;
    digest.add(text->data(), text->size());
  } else {
    auto names = env->list_dir(folder);
    if (!names.ok()) return 1;
    std::sort(names->begin(), names->end());
    for (const std::string& name : *names) {
      const std::string file = folder + "/" + name;
      if (env->list_dir(file).ok()) continue;  // a folder: only the files count
      auto bytes = env->read_file(file, kMaxDigestedFileBytes);
      if (!bytes.ok()) return 1;
      digest.add(name.c_str(), name.size() + 1);
      digest.add(bytes->data(), bytes->size());
    }
  }
  const uint64_t g = digest.value();
  return g == 0 ? 1 : g;
}

}  // namespace gpubox::table::server
