#include "common/temp_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

namespace gpubox {
namespace {

// stdout or stderr when `st` is the file they write (/dev/stdout, or a file a shell redirected
// them to), else -1.
int output_fd(const struct stat& st) {
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat out {};
    if (::fstat(fd, &out) == 0 && out.st_dev == st.st_dev && out.st_ino == st.st_ino) return fd;
  }
  return -1;
}

// A symlink to a regular file stands for its target: the target is replaced, the link kept.
std::string resolved(const std::string& path) {
  struct stat link {};
  struct stat st {};
  if (::lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode) ||
      ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return path;
  }
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  return ec ? path : real.string();
}

}  // namespace

TempFile create_temp_beside(const std::string& target) {
  std::random_device device;
  std::mt19937_64 draw(
      (uint64_t{device()} << 32) ^ device() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  TempFile file;
  for (int attempt = 0; attempt < 16; ++attempt) {
    char suffix[48];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%ld.%016llx", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(draw()));
    file.path = target + suffix;
    file.fd = ::open(file.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (file.fd >= 0 || errno != EEXIST) return file;
  }
  return file;
}

ReplacedFile::~ReplacedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) std::remove(tmp_.c_str());
}

Status ReplacedFile::open(const std::string& path) {
  target_ = resolved(path);
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("'" + target_ + "' is a folder: name a file");
  }
  const int output = exists ? output_fd(st) : -1;
  if (output >= 0) {  // its lines follow the printed ones through the same descriptor
    std::fflush(output == STDOUT_FILENO ? stdout : stderr);
    fd_ = ::dup(output);
    return fd_ >= 0 ? Status::OK() : failed("dup");
  }
  if (!exists || S_ISREG(st.st_mode)) {
    TempFile tmp = create_temp_beside(target_);
    if (tmp.fd >= 0) {
      if (exists) (void)::fchmod(tmp.fd, st.st_mode & 07777);  // the replaced file's mode
      tmp_ = tmp.path;
      fd_ = tmp.fd;
      return Status::OK();
    }
    if (!exists) {
      return Status::IOError("cannot create '" + tmp.path + "': " + std::strerror(errno));
    }
    // A file in a folder that refuses new files: the file itself.
  }
  truncate_first_ = exists && S_ISREG(st.st_mode);
  fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: not before the output
  return fd_ >= 0 ? Status::OK() : failed("open");
}

Status ReplacedFile::write(const char* data, std::size_t size) {
  if (fd_ < 0) return Status::InvalidArgument("'" + target_ + "' is not open for writing");
  if (truncate_first_) {
    if (::ftruncate(fd_, 0) != 0) return failed("truncate");
    truncate_first_ = false;
  }
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd_, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed("write");
    done += static_cast<std::size_t>(n);
  }
  return Status::OK();
}

Status ReplacedFile::commit() {
  if (truncate_first_) GPUBOX_RETURN_IF_ERROR(write(nullptr, 0));  // no output: an empty file
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) return failed("close");
  if (tmp_.empty()) return Status::OK();
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) return failed("rename");
  tmp_.clear();
  return Status::OK();
}

Status ReplacedFile::failed(const char* step) const {
  const int error = errno;
  return Status::IOError(std::string(step) + " '" + (tmp_.empty() ? target_ : tmp_) +
                         "': " + std::strerror(error));
}

}  // namespace gpubox
