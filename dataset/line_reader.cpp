#include "dataset/line_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpubox::dataset {
namespace {

// Every read asks for at least this much; a line may additionally need max_line_bytes.
constexpr std::size_t kReadBlock = std::size_t{4} << 20;

Status open_error(const std::string& path, int err) {
  return Status::IOError("cannot open '" + path + "': " + std::strerror(err));
}

// Opens a regular file for reading; a directory or a missing file is an error naming it.
StatusOr<int> open_regular(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return open_error(path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::IOError("cannot read '" + path + "': it is a directory");
  }
  return fd;
}

}  // namespace

std::string shell_quote(const std::string& path) {
  std::string out = "'";
  for (char c : path) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

LineReader::LineReader(std::string path, std::size_t max_line_bytes)
    : path_(std::move(path)), max_line_bytes_(max_line_bytes) {
  capacity_ = kReadBlock + max_line_bytes_ + 1;
  buffer_.reset(new char[capacity_]);
}

LineReader::~LineReader() {
  if (pipe_ != nullptr) {
    ::pclose(pipe_);
  } else if (fd_ >= 0) {
    ::close(fd_);
  }
}

StatusOr<std::unique_ptr<LineReader>> LineReader::open(const std::string& path,
                                                       const std::string& pipe_command,
                                                       std::size_t max_line_bytes) {
  std::unique_ptr<LineReader> reader(new LineReader(path, max_line_bytes));
  StatusOr<int> fd = open_regular(path);
  if (!fd.ok()) return fd.status();
  if (pipe_command.empty()) {
    reader->fd_ = *fd;
    return reader;
  }
  // The file was checked above so that a missing file is reported as such, not as the shell's
  // redirection failure.
  ::close(*fd);
  reader->pipe_command_ = pipe_command;
  // The parentheses make the redirection apply to the whole command ("cat; exit 3" too).
  const std::string command = "(" + pipe_command + ") < " + shell_quote(path);
  // "e": close-on-exec, so commands started by other reader threads do not hold this pipe.
  reader->pipe_ = ::popen(command.c_str(), "re");
  if (reader->pipe_ == nullptr) {
    return Status::IOError("cannot start pipe_command '" + pipe_command + "' on '" + path +
                           "': " + std::strerror(errno));
  }
  reader->fd_ = ::fileno(reader->pipe_);
  return reader;
}

StatusOr<std::unique_ptr<LineReader>> LineReader::open_range(const std::string& path,
                                                             std::uint64_t begin, std::uint64_t end,
                                                             std::size_t max_line_bytes) {
  std::unique_ptr<LineReader> reader(new LineReader(path, max_line_bytes));
  StatusOr<int> fd = open_regular(path);
  if (!fd.ok()) return fd.status();
  reader->fd_ = *fd;
  reader->range_mode_ = true;
  reader->range_end_ = end;
  if (begin > 0) {
    // The line holding byte begin-1 belongs to the previous range: start after its '\n'.
    reader->file_offset_ = begin - 1;
    reader->base_offset_ = begin - 1;
    reader->skip_to_newline_ = true;
    reader->count_skipped_ = false;
  }
  return reader;
}

bool LineReader::fill() {
  if (eof_ || !status_.ok()) return false;
  if (begin_ > 0) {
    std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
    base_offset_ += begin_;
    end_ -= begin_;
    begin_ = 0;
  }
  const std::size_t room = capacity_ - end_;
  for (;;) {
    const ssize_t n =
        range_mode_ ? ::pread(fd_, buffer_.get() + end_, room, static_cast<off_t>(file_offset_))
                    : ::read(fd_, buffer_.get() + end_, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status_ = Status::IOError("read error on '" + path_ + "': " + std::strerror(errno));
      return false;
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    end_ += static_cast<std::size_t>(n);
    file_offset_ += static_cast<std::uint64_t>(n);
    return true;
  }
}

bool LineReader::next(Line* line) {
  while (!done_) {
    if (skip_to_newline_) {
      // Discard the rest of an over-long line (or, in range mode, the previous range's line).
      const void* nl = std::memchr(buffer_.get() + begin_, '\n', end_ - begin_);
      if (nl == nullptr) {
        if (count_skipped_) bytes_ += end_ - begin_;
        begin_ = end_;
        if (!fill()) done_ = true;
        continue;
      }
      const std::size_t stop = static_cast<const char*>(nl) - buffer_.get() + 1;
      if (count_skipped_) bytes_ += stop - begin_;
      begin_ = stop;
      skip_to_newline_ = false;
      count_skipped_ = true;
      continue;
    }
    if (range_mode_ && base_offset_ + begin_ >= range_end_) {
      done_ = true;
      break;
    }
    const std::size_t avail = end_ - begin_;
    char* start = buffer_.get() + begin_;
    const std::size_t window = std::min(avail, max_line_bytes_ + 1);
    const void* nl = std::memchr(start, '\n', window);
    line->issue = ParseReason::kOk;
    std::size_t length = 0;
    if (nl != nullptr) {
      length = static_cast<const char*>(nl) - start;
      begin_ += length + 1;
      bytes_ += length + 1;
    } else if (avail > max_line_bytes_) {
      // Hand out a prefix, skip the rest on the next call.
      line->issue = ParseReason::kLineTooLong;
      length = std::min<std::size_t>(window, 64);
      // The rest of this line, up to its '\n', is discarded by the next call.
      bytes_ += window;
      begin_ += window;
      skip_to_newline_ = true;
      count_skipped_ = true;
      // The prefix stays valid until the next call, which refills the buffer.
      line->text = std::string_view(start, length);
      line->number = ++line_number_;
      return true;
    } else {
      if (fill()) continue;
      if (!status_.ok()) {
        done_ = true;
        break;
      }
      if (avail == 0) {
        done_ = true;
        break;
      }
      // End of input without '\n'.
      length = avail;
      begin_ = end_;
      bytes_ += avail;
      done_ = true;
      std::string_view text(start, length);
      const bool blank = text.find_first_not_of(" \t\r") == std::string_view::npos;
      line->issue = blank ? ParseReason::kOk : ParseReason::kTruncatedLastLine;
    }
    if (length > 0 && start[length - 1] == '\r') --length;
    line->text = std::string_view(start, length);
    line->number = ++line_number_;
    return true;
  }
  return false;
}

Status LineReader::finish() {
  if (pipe_ == nullptr) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return status_;
  }
  const bool read_to_end = eof_;
  const int wait_status = ::pclose(pipe_);
  pipe_ = nullptr;
  fd_ = -1;
  if (!status_.ok()) return status_;
  // A reader stopped early (strict parse error) closes the pipe under the command: its exit
  // status then says nothing about the file.
  if (!read_to_end) return Status::OK();
  if (wait_status == -1) {
    return Status::IOError("pipe_command '" + pipe_command_ + "' on '" + path_ +
                           "': cannot wait: " + std::strerror(errno));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0) {
    return Status::IOError("pipe_command '" + pipe_command_ + "' failed on '" + path_ +
                           "': exit status " + std::to_string(WEXITSTATUS(wait_status)));
  }
  if (WIFSIGNALED(wait_status)) {
    return Status::IOError("pipe_command '" + pipe_command_ + "' failed on '" + path_ +
                           "': killed by signal " + std::to_string(WTERMSIG(wait_status)));
  }
  return Status::OK();
}

}  // namespace gpubox::dataset
