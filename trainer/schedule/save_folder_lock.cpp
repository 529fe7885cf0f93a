#include "trainer/schedule/save_folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "common/error.hpp"
#include "common/logging.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKey = "runner.model_save_path";

// "pid P on host H", what the holder wrote into the lock file ("" when unreadable).
std::string holder_of(const std::string& lock_file) {
  std::ifstream in(lock_file);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string this_process() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::ostringstream out;
  out << "pid " << ::getpid() << " on host " << (host[0] != '\0' ? host : "?");
  return out.str();
}

}  // namespace

SaveFolderLock::SaveFolderLock(const std::string& save_path) {
  std::error_code ec;
  // The folders this makes, innermost first: a run that ends before its first save leaves
  // none of them behind.
  fs::path path = fs::absolute(save_path, ec).lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) {
    path = path.parent_path();  // "/x/a/b/": its parent is /x/a/b, not /x/a
  }
  for (fs::path p = path; !ec && !p.empty() && p != p.parent_path() && !fs::exists(p, ec);
       p = p.parent_path()) {
    made_.push_back(p.string());
  }
  fs::create_directories(save_path, ec);
  GPUBOX_EXPECTS(!ec && fs::is_directory(save_path), kKey, " '", save_path,
                 "': cannot make the folder the saves go to (",
                 ec ? ec.message() : std::string("not a folder"),
                 "); relative model paths are taken from the working directory");
  const std::string file = (fs::path(save_path) / kFileName).string();
  // The last holder removes the file as it lets go: a lock taken on a file that is no longer
  // the one under the name would be a second holder, so the name is checked after locking.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    GPUBOX_EXPECTS(attempt < 100, kKey, " '", save_path, "': ", file,
                   " keeps being removed and made again while it is locked");
    int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    // A file another user's run left (kill -9) is not writable, but flock needs no write access:
    // locked read-only, it is then replaced by this run's own where the folder allows.
    const bool read_only = fd < 0 && errno == EACCES;
    if (read_only) fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {  // the last holder removed the empty folder it had made
      fs::create_directories(save_path, ec);
      continue;
    }
    GPUBOX_EXPECTS(fd >= 0, kKey, " '", save_path, "': cannot write in it (", file, ": ",
                   std::strerror(errno), ")");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err != EWOULDBLOCK) {
        // A file system without locks (some network mounts): the run goes on, unguarded.
        GPUBOX_LOG(WARNING) << kKey << " '" << save_path << "': cannot lock " << file << " ("
                            << std::strerror(err) << "); another run saving into it at the "
                            << "same time would not be refused";
        ::unlink(file.c_str());
        return;
      }
      const std::string holder = holder_of(file);
      GPUBOX_FAIL(kKey, " '", save_path, "' is being saved into by another training run (",
                  holder.empty() ? std::string("its lock file ") + file : holder,
                  "): two runs saving into one folder would mix their passes' saves. Wait for "
                  "it to end, or set another ",
                  kKey);
    }
    struct stat locked = {}, named = {};
    if (::fstat(fd, &locked) == 0 && ::stat(file.c_str(), &named) == 0 &&
        locked.st_dev == named.st_dev && locked.st_ino == named.st_ino) {
      if (read_only && ::unlink(file.c_str()) == 0) {
        ::close(fd);  // the stale file is gone: the next attempt makes this run's own
        continue;
      }
      fd_ = fd;  // read-only where the folder keeps the file: the holder's name goes unwritten
    } else {
      ::close(fd);
    }
  }
  file_ = file;
  const std::string me = this_process() + "\n";
  // The holder's name is a courtesy for a refused run's message: a failed write loses only it.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, me.data(), me.size(), 0);
  }
}

SaveFolderLock::~SaveFolderLock() { release(); }

void SaveFolderLock::release() {
  if (fd_ >= 0) {
    // Removed while still locked (the folder keeps only saves), then closing drops the lock.
    ::unlink(file_.c_str());
    ::close(fd_);
    fd_ = -1;
  }
  // Unlocked too (a file system without locks): the folders made are still removed.
  for (const std::string& dir : made_) {
    if (::rmdir(dir.c_str()) != 0) break;  // not empty: the run saved into it
  }
  made_.clear();
}

SaveFolderLock::SaveFolderLock(SaveFolderLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      file_(std::move(other.file_)),
      made_(std::exchange(other.made_, {})) {}

SaveFolderLock& SaveFolderLock::operator=(SaveFolderLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    file_ = std::move(other.file_);
    made_ = std::exchange(other.made_, {});
  }
  return *this;
}

}  // namespace gpubox::trainer
