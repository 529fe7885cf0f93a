#include "table/io/file_env.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace gpubox::table::io {
namespace {

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
    buffer_.reserve(kBufferBytes);
  }
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status append(const void* data, std::size_t size) override {
    if (buffer_.size() + size > kBufferBytes) {
      GPUBOX_RETURN_IF_ERROR(flush());
      if (size >= kBufferBytes) return write_all(static_cast<const char*>(data), size);
    }
    buffer_.append(static_cast<const char*>(data), size);
    return Status::OK();
  }
  Status sync() override {
    GPUBOX_RETURN_IF_ERROR(flush());
    if (::fsync(fd_) != 0) return posix_error("fsync", path_, errno);
    return Status::OK();
  }
  Status close() override {
    Status st = flush();
    if (fd_ >= 0 && ::close(fd_) != 0 && st.ok()) st = posix_error("close", path_, errno);
    fd_ = -1;
    return st;
  }

 private:
  static constexpr std::size_t kBufferBytes = 1 << 20;

  Status flush() {
    Status st = write_all(buffer_.data(), buffer_.size());
    buffer_.clear();
    return st;
  }
  Status write_all(const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t n = ::write(fd_, data, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return posix_error("write", path_, errno);
      }
      data += n;
      size -= static_cast<std::size_t>(n);
    }
    return Status::OK();
  }

  std::string path_;
  int fd_;
  std::string buffer_;
};

class PosixEnv final : public FileEnv {
 public:
  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return posix_error("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override {
    // O_NONBLOCK: a FIFO planted under a save's name must not hang the reader in open().
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return posix_error("open", path, errno);
    auto data = read_open_file(fd, path, max_bytes);
    ::close(fd);
    return data;
  }

  StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                            uint64_t max_bytes) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return posix_error("open", path, errno);
    return posix_sequential_file(fd, path, max_bytes);
  }

  Status create_dir(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return Status::IOError("create folder " + path + ": " + ec.message());
    return Status::OK();
  }

  Status remove_all(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Status::IOError("remove " + path + ": " + ec.message());
    return Status::OK();
  }

  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return posix_error("rename " + from + " to", to, errno);
    }
    return Status::OK();
  }

  Status exchange(const std::string& a, const std::string& b) override {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) {
      return Status::OK();
    }
    if (errno != EINVAL && errno != ENOSYS) return posix_error("exchange " + a + " with", b, errno);
#endif
    // No atomic exchange here: two renames. A crash between them leaves `b` missing and the
    // old content under `a`; load then reports that `b` holds no save rather than loading a
    // half-written one.
    const std::string aside = b + ".exchange";
    GPUBOX_RETURN_IF_ERROR(remove_all(aside));
    GPUBOX_RETURN_IF_ERROR(rename(b, aside));
    GPUBOX_RETURN_IF_ERROR(rename(a, b));
    return rename(aside, a);
  }

  Status sync_dir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return posix_error("open folder", path, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return posix_error("fsync folder", path, err);
    return Status::OK();
  }

  bool exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }

  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return posix_error("list folder", path, errno);
    std::vector<std::string> names;
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    return names;
  }
};

}  // namespace

Status posix_error(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " " + path + ": " + std::strerror(err));
}

std::unique_ptr<WritableFile> posix_writable_file(std::string path, int fd) {
  return std::make_unique<PosixWritableFile>(std::move(path), fd);
}

namespace {
class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(int fd, std::string path, uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}
  ~PosixSequentialFile() override { ::close(fd_); }
  PosixSequentialFile(const PosixSequentialFile&) = delete;
  PosixSequentialFile& operator=(const PosixSequentialFile&) = delete;

  StatusOr<std::size_t> read(void* buf, std::size_t n) override {
    // Asked for more than is left: one byte past the size tells a file that grew since open.
    const uint64_t left = size_ - got_;
    const std::size_t want = n > left ? static_cast<std::size_t>(left) + 1 : n;
    for (;;) {
      const ssize_t r = ::read(fd_, buf, want);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return posix_error("read", path_, errno);
      const auto got = static_cast<std::size_t>(r);
      if (got > left) {
        return Status::Corruption(path_ + ": grew past the " + std::to_string(size_) +
                                  " bytes it had when opened; not read");
      }
      got_ += got;
      return got;
    }
  }
  uint64_t size() const override { return size_; }

 private:
  const int fd_;
  const std::string path_;
  const uint64_t size_;
  uint64_t got_ = 0;
};
}  // namespace

StatusOr<std::unique_ptr<SequentialFile>> posix_sequential_file(int fd, std::string path,
                                                                uint64_t max_bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return posix_error("stat", path, err);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  Status refused;
  if (!S_ISREG(st.st_mode)) {
    refused = Status::IOError(path + ": not a regular file");
  } else if (size > max_bytes) {
    refused = Status::Corruption(path + ": " + std::to_string(size) + " bytes, more than the " +
                                 std::to_string(max_bytes) + " expected; not read");
  }
  if (!refused.ok()) {
    ::close(fd);
    return refused;
  }
  return std::unique_ptr<SequentialFile>(new PosixSequentialFile(fd, std::move(path), size));
}

StatusOr<std::string> read_open_file(int fd, const std::string& path, uint64_t max_bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return posix_error("stat", path, errno);
  if (!S_ISREG(st.st_mode)) return Status::IOError(path + ": not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Status::Corruption(path + ": " + std::to_string(size) + " bytes, more than the " +
                              std::to_string(max_bytes) + " expected; not read");
  }
  std::string data;
  data.resize(static_cast<std::size_t>(size));
  std::size_t got = 0;
  // One byte past the expectation tells a file that grew since fstat from one that did not.
  char extra = 0;
  for (;;) {
    const bool in_data = got < data.size();
    char* into = in_data ? &data[got] : &extra;
    const ssize_t n = ::read(fd, into, in_data ? data.size() - got : 1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return posix_error("read", path, errno);
    }
    if (n == 0) break;
    if (!in_data) {
      return Status::Corruption(path + ": grew past the " + std::to_string(size) +
                                " bytes it had when opened; not read");
    }
    got += static_cast<std::size_t>(n);
  }
  data.resize(got);  // shrank meanwhile: the caller's size check names it
  return data;
}

FileEnv* FileEnv::posix() {
  static PosixEnv* env = new PosixEnv();  // never destroyed: usable from static destructors
  return env;
}

Status write_file(FileEnv* env, const std::string& path, const std::string& data) {
  auto file = env->new_writable_file(path);
  if (!file.ok()) return file.status();
  GPUBOX_RETURN_IF_ERROR((*file)->append(data.data(), data.size()));
  GPUBOX_RETURN_IF_ERROR((*file)->sync());
  return (*file)->close();
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

}  // namespace gpubox::table::io
