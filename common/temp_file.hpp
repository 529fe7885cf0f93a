// A file written whole beside the file it replaces, then renamed over it: under a name no other
// writer takes ("<target>.tmp.<pid>.<16 hex digits>", created with O_EXCL, mode 0666 less the
// umask), so that two writers of one target each leave a whole file (the last rename's), never a
// mix of both (a fixed "<target>.tmp" was truncated and renamed by either while the other wrote
// into it).
//
// Host-only, no state.
#pragma once

#include <string>

namespace gpubox {

struct TempFile {
  int fd = -1;       // open for writing (O_CLOEXEC); < 0 when it could not be created
  std::string path;  // its name; the last name tried when fd < 0 (errno says why)
};

// Creates the temporary file for `target` in target's folder; fd < 0 and errno set on failure.
TempFile create_temp_beside(const std::string& target);

}  // namespace gpubox
