// A FileEnv confined to one folder, for files that someone else may be tampering with
// (gpubox_server's saves and loads inside its --data_dir, where any local user who can write
// there may swap a folder for a symbolic link while a save runs).
//
// The folder is opened once (open) and every path is resolved beneath that descriptor, never
// through a symbolic link: with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) where the kernel
// has it (Linux 5.6+), else by a walk of openat(O_NOFOLLOW | O_DIRECTORY) calls, one component
// at a time. The last component is then used through its parent's descriptor by the *at calls
// (openat with O_NOFOLLOW, mkdirat, unlinkat, renameat, renameat2), which act on a link itself,
// never on what it points to. So however another process interleaves renames, links and
// removals, no operation creates, writes, reads, exchanges or removes anything outside the
// folder: a link met on the way is an error (PermissionDenied naming it), not a detour.
//
// Paths are relative to the folder, '/'-separated; "" and "." name the folder itself; absolute
// paths and ".." components are refused (InvalidArgument). Errors name the folder and the path.
// Thread-safe: the root descriptor is only read after open.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "table/io/file_env.hpp"

namespace gpubox::table::io {

class RootedEnv final : public FileEnv {
 public:
  // How paths are resolved beneath the root: kAuto uses openat2 when the kernel has it and walks
  // otherwise; kWalk always walks (so tests cover the fallback on kernels that have openat2).
  enum class Resolve { kAuto, kWalk };

  // Opens `root` (a folder; "" means the working directory) and keeps its descriptor. The root
  // itself is opened following links: it is the operator's choice, fixed from here on.
  static StatusOr<std::unique_ptr<RootedEnv>> open(const std::string& root,
                                                   Resolve resolve = Resolve::kAuto);
  ~RootedEnv() override;
  RootedEnv(const RootedEnv&) = delete;
  RootedEnv& operator=(const RootedEnv&) = delete;

  // The root as given to open, for messages.
  const std::string& root() const { return root_; }
  // Whether paths are resolved by openat2 (false: the component walk).
  bool uses_openat2() const { return use_openat2_; }

  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) override;
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override;
  StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                            uint64_t max_bytes) override;
  // Creates every missing folder of `path`, beneath the root.
  Status create_dir(const std::string& path) override;
  // Removes `path` (a file, a link, or a folder tree, by descriptors: links inside are removed,
  // never followed). Refuses the root itself.
  Status remove_all(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status exchange(const std::string& a, const std::string& b) override;
  Status sync_dir(const std::string& path) override;
  // Whether `path` names an entry (a link counts: it is not followed).
  bool exists(const std::string& path) override;
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override;

 private:
  RootedEnv(int root_fd, std::string root, bool use_openat2)
      : root_fd_(root_fd), root_(std::move(root)), use_openat2_(use_openat2) {}
  class Fd;
  struct Parent;
  // The folder that `count` first components of `parts` name, opened beneath the root.
  StatusOr<Fd> open_dir(const std::vector<std::string>& parts, std::size_t count,
                        const std::string& path) const;
  // The folder that holds `path`'s last component, and that component.
  StatusOr<Parent> parent_of(const std::string& path) const;
  std::string where(const std::string& path) const;
  // The error of `what` on `path` failing with `err`: PermissionDenied naming the link when a
  // component of `path` is a symbolic link, else IOError.
  Status failure(const std::string& what, const std::string& path, int err) const;

  const int root_fd_;
  const std::string root_;
  const bool use_openat2_;
};

}  // namespace gpubox::table::io
