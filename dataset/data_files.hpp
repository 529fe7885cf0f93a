// The file list of a data folder, as training and `gpubox_data stat` read it.
//
// A folder's entries, sorted by name, become the list except (each reported, never skipped
// silently): hidden entries (".name"), metadata (*.json, e.g. gen's oracle.json), subfolders,
// broken links, entries that are not regular files (FIFOs, sockets, devices), and entries that
// are the same file as an earlier one (a symlink to a file of the folder: read once, under the
// first name). A regular file given instead of a folder is a one-file list.
#pragma once

#include <string>
#include <vector>

#include "common/enum_names.hpp"
#include "common/status.hpp"

namespace gpubox::dataset {

enum class SkipReason { kHidden, kMetadata, kFolder, kBrokenLink, kNotRegularFile, kSameFile };
inline constexpr EnumName<SkipReason> kSkipReasonNames[] = {
    {SkipReason::kHidden, "hidden"},
    {SkipReason::kMetadata, "metadata"},
    {SkipReason::kFolder, "folder"},
    {SkipReason::kBrokenLink, "broken link"},
    {SkipReason::kNotRegularFile, "not a regular file"},
    {SkipReason::kSameFile, "same file as"},
};

struct SkippedEntry {
  std::string path;
  SkipReason reason = SkipReason::kHidden;
  std::string same_as;  // kSameFile: the listed path that is the same file

  // "DIR/b.txt (same file as DIR/a.txt)", "DIR/sub (folder)".
  std::string to_string() const;
};

struct DataFileList {
  std::vector<std::string> files;     // sorted by name
  std::vector<SkippedEntry> skipped;  // sorted by name

  // Skipped entries other than the expected kinds (hidden, metadata): what a user should hear
  // about.
  std::vector<SkippedEntry> unexpected_skips() const;
};

// "skipped 2 entries of DIR: DIR/sub (folder), DIR/p (not a regular file)", listing at most
// `max_names` names; "" when `skipped` is empty.
std::string skipped_text(const std::string& dir, const std::vector<SkippedEntry>& skipped,
                         std::size_t max_names = 10);

// Lists `dir` (see above). A missing folder is NotFound naming it; an unreadable one IOError.
// An empty list is not an error here (training refuses it, stat warns).
StatusOr<DataFileList> list_data_files(const std::string& dir);

// Lists every folder of `dirs` in order, one list each, as list_data_files does; a file listed
// from an earlier folder (a folder named twice, by another spelling, or through a link) is
// skipped as the same file, so that no file is read twice in a pass.
StatusOr<std::vector<DataFileList>> list_data_folders(const std::vector<std::string>& dirs);

}  // namespace gpubox::dataset
