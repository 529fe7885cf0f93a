// Files written whole.
//
// create_temp_beside: a file beside the one it replaces, under a name no other writer takes
// ("<target>.tmp.<pid>.<16 hex digits>", created with O_EXCL, mode 0666 less the umask), so that
// two writers of one target each leave a whole file (the last rename's), never a mix of both (a
// fixed "<target>.tmp" was truncated and renamed by either while the other wrote into it).
//
// ReplacedFile: an output a command writes whole (gpubox_data convert's OUT, gpubox_train's
// --predictions_out). A regular file, or a new one, is written beside it (create_temp_beside) and
// renamed over it at commit(), so a failed run leaves an earlier file whole; a symlink to a
// regular file replaces its target, not the link. Anything else is written where it is, never
// replaced: a device (/dev/null, to check a conversion), a FIFO, the file stdout or stderr already
// write (/dev/stdout, or a file a shell redirected them to: written through their descriptor, after
// the printed lines), a file in a folder the process cannot create files in (opened without
// truncating; truncated at the first write). A rename over those replaced the device node or
// the FIFO with a regular file, or lost the printed lines.
//
// Host-only; a ReplacedFile is used by one thread.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.hpp"

namespace gpubox {

struct TempFile {
  int fd = -1;       // open for writing (O_CLOEXEC); < 0 when it could not be created
  std::string path;  // its name; the last name tried when fd < 0 (errno says why)
};

// Creates the temporary file for `target` in target's folder; fd < 0 and errno set on failure.
TempFile create_temp_beside(const std::string& target);

class ReplacedFile {
 public:
  ReplacedFile() = default;
  ReplacedFile(const ReplacedFile&) = delete;
  ReplacedFile& operator=(const ReplacedFile&) = delete;
  ~ReplacedFile();  // an uncommitted temporary file is removed

  // Opens `path` as above; an error names the file that could not be opened and why. A
  // folder is refused.
  Status open(const std::string& path);
  // Appends `size` bytes (retrying short writes and EINTR).
  Status write(const char* data, std::size_t size);
  // Closes, and renames the temporary file over the target (when there is one).
  Status commit();

  const std::string& target() const { return target_; }  // the file written: links resolved

 private:
  Status failed(const char* step) const;

  std::string target_;
  std::string tmp_;              // empty: target_ is written in place
  bool truncate_first_ = false;  // a regular file written in place: emptied at the first write
  int fd_ = -1;
};

}  // namespace gpubox
