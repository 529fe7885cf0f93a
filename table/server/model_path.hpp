// Where the model folders named in SAVE/LOAD requests (and --load) may be, and how the server
// names the model it loaded on the wire (its generation).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"
#include "table/io/file_env.hpp"

namespace gpubox::table::server {

// The folder a request's `path` names, relative to `data_dir` (the working directory when
// empty), with `subfolder` (`server-<shard>`) appended when not empty: what the server's
// data_dir env (io::RootedEnv, opened on data_dir at start) then resolves beneath data_dir's
// descriptor without following any link. `path` is relative to data_dir, or absolute and
// lexically inside it (data_dir made absolute, or with its own links resolved: the two
// spellings a trainer given the server's --data_dir uses). Lexical only, so it cannot race with
// the file system: links are refused later, at every use. Refused (InvalidArgument): "", NUL
// bytes, "..", data_dir itself (a save is a folder inside data_dir, beside its
// `<folder>.tmp` staging folder); PermissionDenied: an absolute path elsewhere.
StatusOr<std::string> model_path_in_data_dir(const std::string& data_dir, const std::string& path,
                                             const std::string& subfolder);

// The generation of the model in `folder` (read through `env`): a digest of its MANIFEST (which
// holds the checksums of every file), or of every regular file in it when it has none. Never 0
// (0 means "nothing loaded"); 1 when the folder cannot be read.
uint64_t model_generation(io::FileEnv* env, const std::string& folder);
// The same through the POSIX env.
inline uint64_t model_generation(const std::string& folder) {
  return model_generation(io::FileEnv::posix(), folder);
}

}  // namespace gpubox::table::server
