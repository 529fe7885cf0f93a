#include "dataset/data_files.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

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

using ListedAs = std::map<std::string, std::string>;  // the file's identity -> the listed path

// A file's identity, its device and inode ("dev:ino"): a link to a listed file, or a hard link
// (which no path resolution shows: it was read twice), is the same file.
Status identity_of(const std::string& path, std::string* id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::IOError("cannot read '" + path + "': " + std::strerror(errno));
  }
  *id = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  return Status::OK();
}

// Lists `dir` into `out`; `listed_as` holds the files listed before (this folder's and, for a
// list of folders, the earlier folders').
Status list_into(const std::string& dir, ListedAs* listed_as, DataFileList* out) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    std::string id;
    GPUBOX_RETURN_IF_ERROR(identity_of(dir, &id));
    const auto [it, inserted] = listed_as->emplace(id, dir);
    if (inserted) {
      out->files.push_back(dir);
    } else {
      out->skipped.push_back({dir, SkipReason::kSameFile, it->second});
    }
    return Status::OK();
  }
  if (!fs::is_directory(dir, ec)) {
    std::error_code link_ec;
    if (fs::symlink_status(dir, link_ec).type() == fs::file_type::not_found || link_ec) {
      return Status::NotFound("data folder '" + dir + "' does not exist");
    }
    if (ec) return Status::IOError("cannot read data folder '" + dir + "': " + ec.message());
    return Status::InvalidArgument("data path '" + dir +
                                   "' is neither a folder nor a regular file (a FIFO, a device or "
                                   "a socket): name a folder of data files, or a file");
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
    std::string id;
    GPUBOX_RETURN_IF_ERROR(identity_of(path, &id));
    const auto [it, inserted] = listed_as->emplace(id, path);
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
