#include "dataset/data_files.hpp"

#include <algorithm>
#include <filesystem>
#include <map>

namespace gpubox::dataset {
namespace {
namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string SkippedEntry::to_string() const {
  std::string out = path + " (" + name_of(kSkipReasonNames, reason);
  if (reason == SkipReason::kSameFile) out += " " + same_as;
  return out + ")";
}

std::vector<SkippedEntry> DataFileList::unexpected_skips() const {
  std::vector<SkippedEntry> out;
  for (const SkippedEntry& e : skipped) {
    if (e.reason != SkipReason::kHidden && e.reason != SkipReason::kMetadata) out.push_back(e);
  }
  return out;
}

std::string skipped_text(const std::string& dir, const std::vector<SkippedEntry>& skipped,
                         std::size_t max_names) {
  if (skipped.empty()) return "";
  std::string out = "skipped " + std::to_string(skipped.size()) +
                    (skipped.size() == 1 ? " entry of " : " entries of ") + dir + ":";
  for (std::size_t i = 0; i < skipped.size() && i < max_names; ++i) {
    out += (i ? ", " : " ") + skipped[i].to_string();
  }
  if (skipped.size() > max_names) out += ", ...";
  return out;
}

namespace {

using ListedAs = std::map<std::string, std::string>;  // canonical path -> the listed path

// Lists `dir` into `out`; `listed_as` holds the files listed before (this folder's and, for a
// list of folders, the earlier folders').
Status list_into(const std::string& dir, ListedAs* listed_as, DataFileList* out) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    const std::string canonical = fs::canonical(dir, ec).string();
    if (ec) return Status::IOError("cannot resolve '" + dir + "': " + ec.message());
    const auto [it, inserted] = listed_as->emplace(canonical, dir);
    if (inserted) {
      out->files.push_back(dir);
    } else {
      out->skipped.push_back({dir, SkipReason::kSameFile, it->second});
    }
    return Status::OK();
  }
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("data folder '" + dir + "' does not exist or is not a folder");
  }
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(it->path());
  }
  if (ec) return Status::IOError("cannot list '" + dir + "': " + ec.message());
  std::sort(entries.begin(), entries.end());

  for (const fs::path& entry : entries) {
    const std::string path = entry.string();
    const std::string name = entry.filename().string();
    const auto skip = [&](SkipReason reason, std::string same_as = "") {
      out->skipped.push_back({path, reason, std::move(same_as)});
    };
    if (name.empty() || name[0] == '.') {
      skip(SkipReason::kHidden);
      continue;
    }
    if (ends_with(name, ".json")) {
      skip(SkipReason::kMetadata);
      continue;
    }
    std::error_code status_ec;
    const fs::file_status target = fs::status(entry, status_ec);  // follows links
    if (status_ec || !fs::exists(target)) {
      if (fs::is_symlink(fs::symlink_status(entry, status_ec))) {
        skip(SkipReason::kBrokenLink);
        continue;
      }
      return Status::IOError("cannot read '" + path + "'");
    }
    if (fs::is_directory(target)) {
      skip(SkipReason::kFolder);
      continue;
    }
    if (!fs::is_regular_file(target)) {
      skip(SkipReason::kNotRegularFile);
      continue;
    }
    std::error_code canonical_ec;
    const std::string canonical = fs::canonical(entry, canonical_ec).string();
    if (canonical_ec)
      return Status::IOError("cannot resolve '" + path + "': " + canonical_ec.message());
    const auto [it, inserted] = listed_as->emplace(canonical, path);
    if (!inserted) {
      skip(SkipReason::kSameFile, it->second);
      continue;
    }
    out->files.push_back(path);
  }
  return Status::OK();
}

}  // namespace

StatusOr<DataFileList> list_data_files(const std::string& dir) {
  ListedAs listed_as;
  DataFileList out;
  GPUBOX_RETURN_IF_ERROR(list_into(dir, &listed_as, &out));
  return out;
}

StatusOr<std::vector<DataFileList>> list_data_folders(const std::vector<std::string>& dirs) {
  ListedAs listed_as;
  std::vector<DataFileList> out(dirs.size());
  for (std::size_t d = 0; d < dirs.size(); ++d) {
    GPUBOX_RETURN_IF_ERROR(list_into(dirs[d], &listed_as, &out[d]));
  }
  return out;
}

}  // namespace gpubox::dataset
