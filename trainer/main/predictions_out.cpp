#include "trainer/main/predictions_out.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.hpp"
#include "common/temp_file.hpp"
#include "dataset/text_number.hpp"
#include "trainer/schedule/output_paths.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

// stdout or stderr when the path is the same file (/dev/stdout, or a file a shell redirected
// them to), else -1: a rename or a new descriptor at offset 0 would lose the printed lines.
int output_fd(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat out {};
    if (::fstat(fd, &out) == 0 && out.st_dev == st.st_dev && out.st_ino == st.st_ino) {
      return fd;
    }
  }
  return -1;
}

// A symlink to a regular file stands for its target: the target is replaced, the link kept.
std::string resolved(const std::string& path) {
  struct stat link {};
  struct stat st {};
  if (::lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode) ||
      ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || output_fd(path) >= 0) {
    return path;
  }
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  return ec ? path : real.string();
}

}  // namespace

void check_not_an_input(const std::string& path, const InferInputs& inputs,
                        const std::string& config_path) {
  const std::string refused = "--predictions_out '" + path + "' is ";
  const std::string remedy = ": it would be replaced by the predictions; name another file";
  for (const std::string& file : inputs.files) {
    GPUBOX_EXPECTS(!same_file(path, file), refused, "the data file '", file,
                   "' the evaluation reads", remedy);
  }
  GPUBOX_EXPECTS(config_path.empty() || !same_file(path, config_path), refused, "the config '",
                 config_path, "'", remedy);
  for (const SaveToEvaluate& save : inputs.saves) {
    GPUBOX_EXPECTS(!inside(path, save.dir), refused, "inside the save '", save.dir,
                   "' the evaluation loads (a save holds its own files only): name a file "
                   "outside it");
  }
}

PredictionsOut::PredictionsOut(const std::string& path)
    : flag_path_(path), target_(resolved(path)) {
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  const int output = output_fd(target_);
  if (output >= 0) {  // its lines follow the printed ones through the same descriptor
    fd_ = ::dup(output);
    check_open(target_);
    return;
  }
  if (!exists || S_ISREG(st.st_mode)) {
    const TempFile tmp = create_temp_beside(target_);  // another run's predictions: its own
    tmp_ = tmp.path;
    fd_ = tmp.fd;
    if (fd_ >= 0) {
      if (exists) (void)::fchmod(fd_, st.st_mode & 07777);  // the replaced file's mode
      return;
    }
    if (!exists) check_open(tmp_);
    tmp_.clear();  // a file in a folder that refuses new files: write the file itself
  }
  regular_in_place_ = exists && S_ISREG(st.st_mode);
  fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: not before the lines
  check_open(target_);
}

PredictionsOut::~PredictionsOut() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) std::remove(tmp_.c_str());
}

void PredictionsOut::write(const EvalResult& result) {
  std::string text;
  for (std::size_t i = 0; i < result.predictions.size(); ++i) {
    dataset::append_float(&text, result.labels[i]);
    text += ' ';
    dataset::append_float(&text, result.predictions[i]);
    text += '\n';
  }
  std::fflush(stdout);
  if (regular_in_place_) GPUBOX_EXPECTS(::ftruncate(fd_, 0) == 0, failed("truncate"));
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    GPUBOX_EXPECTS(n > 0, failed("write"));
    done += static_cast<std::size_t>(n);
  }
  const int fd = fd_;
  fd_ = -1;
  GPUBOX_EXPECTS(::close(fd) == 0, failed("close"));
  if (tmp_.empty()) return;
  GPUBOX_EXPECTS(std::rename(tmp_.c_str(), target_.c_str()) == 0, failed("rename"));
  tmp_.clear();
}

void PredictionsOut::check_open(const std::string& opened) const {
  GPUBOX_EXPECTS(fd_ >= 0, "cannot write --predictions_out '", flag_path_, "' (", opened, ": ",
                 std::strerror(errno), ")");
}

std::string PredictionsOut::failed(const char* step) const {
  return std::string("writing --predictions_out '") + flag_path_ + "' failed (" + step + " " +
         (tmp_.empty() ? target_ : tmp_) + ": " + std::strerror(errno) + ")";
}

}  // namespace gpubox::trainer
