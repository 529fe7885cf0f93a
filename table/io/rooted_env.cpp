#include "table/io/rooted_env.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else  // headers older than Linux 5.6: the walk only (openat2_works answers no)
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08
#endif

namespace gpubox::table::io {
namespace {

// Folders a remove_all descends at most: a save is two levels deep; a tree deeper than this
// inside data_dir is someone's attempt to exhaust descriptors.
constexpr int kMaxRemoveDepth = 32;

int sys_openat2(int dirfd, const char* path, int flags, mode_t mode, uint64_t resolve) {
#if defined(SYS_openat2) && __has_include(<linux/openat2.h>)
  struct open_how how {};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = flags & O_CREAT ? mode : 0;
  how.resolve = resolve;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path, &how, sizeof(how)));
#else
  (void)dirfd, (void)path, (void)flags, (void)mode, (void)resolve;
  errno = ENOSYS;
  return -1;
#endif
}

constexpr uint64_t kBeneath = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

// Whether openat2 works here (a kernel before 5.6 or a seccomp filter answers ENOSYS/EPERM).
bool openat2_works(int root_fd) {
  const int fd = sys_openat2(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, kBeneath);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// `path` split into components; InvalidArgument for an absolute path, "..", or a NUL byte.
StatusOr<std::vector<std::string>> split(const std::string& path) {
  if (path.find('\0') != std::string::npos) {
    return Status::InvalidArgument("path contains a NUL byte");
  }
  if (!path.empty() && path[0] == '/') {
    return Status::InvalidArgument("absolute path '" + path + "' where a relative one is needed");
  }
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    std::size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(begin, end - begin);
    if (part == "..") return Status::InvalidArgument("path '" + path + "' contains '..'");
    if (!part.empty() && part != ".") parts.push_back(std::move(part));
    begin = end + 1;
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts, std::size_t count) {
  std::string out;
  for (std::size_t i = 0; i < count; ++i) out += (i ? "/" : "") + parts[i];
  return out.empty() ? "." : out;
}

}  // namespace

// An owned descriptor.
class RootedEnv::Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

struct RootedEnv::Parent {
  Fd dir;
  std::string leaf;
};

StatusOr<std::unique_ptr<RootedEnv>> RootedEnv::open(const std::string& root, Resolve resolve) {
  const std::string name = root.empty() ? "." : root;
  const int fd = ::open(name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return posix_error("open folder", name, errno);
  const bool openat2 = resolve == Resolve::kAuto && openat2_works(fd);
  return std::unique_ptr<RootedEnv>(new RootedEnv(fd, name, openat2));
}

RootedEnv::~RootedEnv() { ::close(root_fd_); }

std::string RootedEnv::where(const std::string& path) const {
  return root_ + (root_.back() == '/' ? "" : "/") + path;
}

Status RootedEnv::failure(const std::string& what, const std::string& path, int err) const {
  if (err == ELOOP || err == ENOTDIR || err == EXDEV) {
    // Say which component is a link (a second look, for the message only: stat never writes).
    auto parts = split(path);
    for (std::size_t i = 1; parts.ok() && i <= parts->size(); ++i) {
      struct stat st {};
      const std::string prefix = join(*parts, i);
      if (::fstatat(root_fd_, prefix.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode)) {
        return Status::PermissionDenied(what + " " + where(path) + ": " + where(prefix) +
                                        " is a symbolic link, and paths beneath " + root_ +
                                        " never go through one");
      }
    }
  }
  return posix_error(what, where(path), err);
}

StatusOr<RootedEnv::Fd> RootedEnv::open_dir(const std::vector<std::string>& parts,
                                            std::size_t count, const std::string& path) const {
  constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  if (use_openat2_) {
    Fd fd(sys_openat2(root_fd_, join(parts, count).c_str(), kDirFlags, 0, kBeneath));
    if (fd.get() < 0) {
      const int err = errno;
      return failure("open folder", join(parts, count), err);
    }
    return fd;
  }
  Fd dir(::openat(root_fd_, ".", kDirFlags));
  if (dir.get() < 0) return posix_error("open folder", root_, errno);
  for (std::size_t i = 0; i < count; ++i) {
    Fd next(::openat(dir.get(), parts[i].c_str(), kDirFlags));
    if (next.get() < 0) {
      const int err = errno;
      return failure("open folder", join(parts, i + 1), err);
    }
    dir = std::move(next);
  }
  return dir;
}

StatusOr<RootedEnv::Parent> RootedEnv::parent_of(const std::string& path) const {
  auto parts = split(path);
  if (!parts.ok()) return parts.status().with_context(root_);
  if (parts->empty()) {
    return Status::InvalidArgument("'" + path + "' names the folder " + root_ +
                                   " itself, where an entry inside it is needed");
  }
  auto dir = open_dir(*parts, parts->size() - 1, path);
  if (!dir.ok()) return dir.status();
  return Parent{std::move(dir).value(), parts->back()};
}

StatusOr<std::unique_ptr<WritableFile>> RootedEnv::new_writable_file(const std::string& path) {
  auto parent = parent_of(path);
  if (!parent.ok()) return parent.status();
  const int fd = ::openat(parent->dir.get(), parent->leaf.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return failure("open", path, errno);
  return posix_writable_file(where(path), fd);
}

StatusOr<std::string> RootedEnv::read_file(const std::string& path, uint64_t max_bytes) {
  auto parent = parent_of(path);
  if (!parent.ok()) return parent.status();
  // O_NONBLOCK: a FIFO planted under a save's name must not hang the reader in open().
  Fd fd(::openat(parent->dir.get(), parent->leaf.c_str(),
                 O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return failure("open", path, errno);
  return read_open_file(fd.get(), where(path), max_bytes);
}

StatusOr<std::unique_ptr<SequentialFile>> RootedEnv::open_sequential(const std::string& path,
                                                                     uint64_t max_bytes) {
  auto parent = parent_of(path);
  if (!parent.ok()) return parent.status();
  const int fd = ::openat(parent->dir.get(), parent->leaf.c_str(),
                          O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return failure("open", path, errno);
  return posix_sequential_file(fd, where(path), max_bytes);
}

Status RootedEnv::create_dir(const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return parts.status().with_context(root_);
  constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  Fd dir(::openat(root_fd_, ".", kDirFlags));
  if (dir.get() < 0) return posix_error("open folder", root_, errno);
  for (std::size_t i = 0; i < parts->size(); ++i) {
    const char* name = (*parts)[i].c_str();
    if (::mkdirat(dir.get(), name, 0755) != 0 && errno != EEXIST) {
      return posix_error("create folder", where(join(*parts, i + 1)), errno);
    }
    Fd next(::openat(dir.get(), name, kDirFlags));
    if (next.get() < 0) {
      const int err = errno;
      return failure("open folder", join(*parts, i + 1), err);
    }
    dir = std::move(next);
  }
  return Status::OK();
}

namespace {

// Removes everything inside the folder `dir_fd` (not the folder), by descriptors.
Status remove_contents(int dir_fd, const std::string& where, int depth) {
  if (depth > kMaxRemoveDepth) {
    return Status::IOError(where + ": folders nested deeper than " +
                           std::to_string(kMaxRemoveDepth) + "; not removed");
  }
  const int list_fd = ::dup(dir_fd);
  if (list_fd < 0) return posix_error("dup", where, errno);
  DIR* dir = ::fdopendir(list_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(list_fd);
    return posix_error("list folder", where, err);
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  for (const std::string& name : names) {
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return posix_error("stat", where + "/" + name, errno);
    }
    int flags = 0;
    if (S_ISDIR(st.st_mode)) {
      const int sub =
          ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) return posix_error("open folder", where + "/" + name, errno);
      const Status inner = remove_contents(sub, where + "/" + name, depth + 1);
      ::close(sub);
      GPUBOX_RETURN_IF_ERROR(inner);
      flags = AT_REMOVEDIR;
    }
    if (::unlinkat(dir_fd, name.c_str(), flags) != 0 && errno != ENOENT) {
      return posix_error("remove", where + "/" + name, errno);
    }
  }
  return Status::OK();
}

}  // namespace

Status RootedEnv::remove_all(const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return parts.status().with_context(root_);
  // Nothing there (or a link on the way: nothing there beneath the root) is nothing to remove.
  if (!exists(path)) return Status::OK();
  auto parent = parent_of(path);
  if (!parent.ok()) return parent.status();
  const int dir = parent->dir.get();
  const char* leaf = parent->leaf.c_str();
  struct stat st {};
  if (::fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? Status::OK() : posix_error("stat", where(path), errno);
  }
  int flags = 0;
  if (S_ISDIR(st.st_mode)) {
    Fd sub(::openat(dir, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub.get() < 0) return posix_error("open folder", where(path), errno);
    GPUBOX_RETURN_IF_ERROR(remove_contents(sub.get(), where(path), 1));
    flags = AT_REMOVEDIR;
  }
  if (::unlinkat(dir, leaf, flags) != 0 && errno != ENOENT) {
    return posix_error("remove", where(path), errno);
  }
  return Status::OK();
}

Status RootedEnv::rename(const std::string& from, const std::string& to) {
  auto a = parent_of(from);
  if (!a.ok()) return a.status();
  auto b = parent_of(to);
  if (!b.ok()) return b.status();
  if (::renameat(a->dir.get(), a->leaf.c_str(), b->dir.get(), b->leaf.c_str()) != 0) {
    return posix_error("rename " + where(from) + " to", where(to), errno);
  }
  return Status::OK();
}

Status RootedEnv::exchange(const std::string& a, const std::string& b) {
  auto pa = parent_of(a);
  if (!pa.ok()) return pa.status();
  auto pb = parent_of(b);
  if (!pb.ok()) return pb.status();
#ifdef RENAME_EXCHANGE
  if (::renameat2(pa->dir.get(), pa->leaf.c_str(), pb->dir.get(), pb->leaf.c_str(),
                  RENAME_EXCHANGE) == 0) {
    return Status::OK();
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return posix_error("exchange " + where(a) + " with", where(b), errno);
  }
#endif
  // As FileEnv::posix(): two renames where the file system cannot exchange.
  const std::string aside = b + ".exchange";
  GPUBOX_RETURN_IF_ERROR(remove_all(aside));
  GPUBOX_RETURN_IF_ERROR(rename(b, aside));
  GPUBOX_RETURN_IF_ERROR(rename(a, b));
  return rename(aside, a);
}

Status RootedEnv::sync_dir(const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return parts.status().with_context(root_);
  auto dir = open_dir(*parts, parts->size(), path);
  if (!dir.ok()) return dir.status();
  if (::fsync(dir->get()) != 0) return posix_error("fsync folder", where(path), errno);
  return Status::OK();
}

bool RootedEnv::exists(const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return false;
  if (parts->empty()) return true;
  auto parent = parent_of(path);
  if (!parent.ok()) return false;
  struct stat st {};
  return ::fstatat(parent->dir.get(), parent->leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

StatusOr<std::vector<std::string>> RootedEnv::list_dir(const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return parts.status().with_context(root_);
  auto dir = open_dir(*parts, parts->size(), path);
  if (!dir.ok()) return dir.status();
  DIR* listing = ::fdopendir(dir->get());
  if (listing == nullptr) return posix_error("list folder", where(path), errno);
  dir->release();  // closedir closes it
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(listing);
  return names;
}

}  // namespace gpubox::table::io
