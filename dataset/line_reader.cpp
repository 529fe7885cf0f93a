#include "dataset/line_reader.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.hpp"

extern char** environ;

namespace gpubox::dataset {
namespace {

// Every read asks for at least this much; a line may additionally need max_line_bytes.
constexpr std::size_t kReadBlock = std::size_t{4} << 20;
// How long a pipe_command may write nothing before the wait is said (then each such span again).
constexpr int kSilentPipeNoteMs = 60 * 1000;

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
  if (fd_ >= 0) ::close(fd_);
  if (stderr_fd_ >= 0) ::close(stderr_fd_);
  // A command whose output was not read to its end gets SIGPIPE at its next write.
  if (pid_ > 0) {
    int wait_status = 0;
    while (::waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
}

Status LineReader::start_command(const std::string& command) {
  // Close-on-exec pipes, so that commands started by other reader threads do not hold them;
  // dup2 onto the child's 1 and 2 clears the flag there.
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0)
    return Status::IOError(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    return Status::IOError(std::string("pipe: ") + std::strerror(e));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  std::string shell = "/bin/sh";
  std::string dash_c = "-c";
  std::string line = command;
  char* argv[] = {shell.data(), dash_c.data(), line.data(), nullptr};
  // The command gets SIGPIPE's default action back: a process that ignores it (gpubox_train
  // does, so a dead peer's socket is an error rather than a silent death) would pass SIG_IGN
  // on, and a command whose reader stopped early should end at its next write, not carry on.
  posix_spawnattr_t attr;
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  pid_t pid = -1;
  int rc = posix_spawnattr_init(&attr);  // each call returns an error number, 0 when done
  if (rc == 0) {
    rc = posix_spawnattr_setsigdefault(&attr, &defaults);
    if (rc == 0) rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    if (rc == 0) rc = ::posix_spawn(&pid, shell.c_str(), &actions, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
  }
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return Status::IOError("cannot start /bin/sh: " + std::string(std::strerror(rc)));
  }
  pid_ = pid;
  fd_ = out[0];
  stderr_fd_ = err[0];
  return Status::OK();
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
  const Status started = reader->start_command("(" + pipe_command + ") < " + shell_quote(path));
  if (!started.ok()) {
    return Status::IOError("cannot start pipe_command '" + pipe_command + "' on '" + path +
                           "': " + started.message());
  }
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
  int silent_minutes = 0;
  for (;;) {
    if (stderr_fd_ >= 0) {
      // Wait for output or for standard error, draining the latter so that a command writing
      // much to it never blocks on a full pipe while we wait for its output. A minute without
      // either is said (a reader that never ends held the load without a word), and the wait
      // goes on: a slow command is not failed.
      pollfd fds[2] = {{fd_, POLLIN, 0}, {stderr_fd_, POLLIN, 0}};
      const int ready = ::poll(fds, 2, kSilentPipeNoteMs);
      if (ready < 0) {
        if (errno == EINTR) continue;
        status_ = Status::IOError("poll on the pipe of '" + path_ + "': " + std::strerror(errno));
        return false;
      }
      if (ready == 0) {
        GPUBOX_LOG(WARNING) << "runner.pipe_command '" << pipe_command_ << "' on '" << path_
                            << "' has written nothing for " << ++silent_minutes << " min ("
                            << line_number_ << " lines read from it): still waiting for it";
        continue;
      }
      silent_minutes = 0;
      if (fds[1].revents != 0) drain_stderr();
      if (fds[0].revents == 0) continue;
    }
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
      line->consumed = window;
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
    line->consumed = nl != nullptr ? length + 1 : length;
    if (length > 0 && start[length - 1] == '\r') --length;
    // A UTF-8 byte order mark before the file's first line (an editor's) is no part of it.
    const bool file_start =
        line_number_ == 0 && (!range_mode_ || base_offset_ + (start - buffer_.get()) == 0);
    if (file_start && length >= 3 && std::memcmp(start, "\xEF\xBB\xBF", 3) == 0) {
      start += 3;
      length -= 3;
    }
    line->text = std::string_view(start, length);
    line->number = ++line_number_;
    return true;
  }
  return false;
}

bool LineReader::drain_stderr() {
  char chunk[4096];
  const ssize_t n = ::read(stderr_fd_, chunk, sizeof(chunk));
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) {
    ::close(stderr_fd_);
    stderr_fd_ = -1;
    return false;
  }
  stderr_tail_.append(chunk, static_cast<std::size_t>(n));
  if (stderr_tail_.size() > kStderrTailBytes) {
    stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
  }
  return true;
}

Status LineReader::finish() {
  if (pid_ <= 0) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return status_;
  }
  const bool read_to_end = eof_;
  ::close(fd_);
  fd_ = -1;
  // The rest of standard error, up to its end (the command's exit), when it ran to its end.
  if (read_to_end) {
    while (stderr_fd_ >= 0 && drain_stderr()) {
    }
  }
  if (stderr_fd_ >= 0) ::close(stderr_fd_);
  stderr_fd_ = -1;
  int wait_status = 0;
  pid_t waited = -1;
  while ((waited = ::waitpid(pid_, &wait_status, 0)) < 0 && errno == EINTR) {
  }
  const int wait_errno = errno;
  pid_ = -1;
  if (!status_.ok()) return status_;
  // A reader stopped early (strict parse error) closes the pipe under the command: its exit
  // status then says nothing about the file.
  if (!read_to_end) return Status::OK();
  if (waited < 0) {
    return Status::IOError("pipe_command '" + pipe_command_ + "' on '" + path_ +
                           "': cannot wait: " + std::strerror(wait_errno));
  }
  std::string why;
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0) {
    why = "exit status " + std::to_string(WEXITSTATUS(wait_status));
  } else if (WIFSIGNALED(wait_status)) {
    why = "killed by signal " + std::to_string(WTERMSIG(wait_status));
  } else {
    return Status::OK();
  }
  std::string message = "pipe_command '" + pipe_command_ + "' failed on '" + path_ + "': " + why;
  // The end of what it said, a traceback's last lines: enough to say why.
  constexpr int kTailLines = 12;
  std::string_view tail = stderr_tail_;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.remove_suffix(1);
  std::size_t from = tail.size();
  for (int lines = 0; from > 0 && lines < kTailLines; ++lines) {
    const std::size_t nl = tail.rfind('\n', from - 1);
    from = nl == std::string_view::npos ? 0 : nl;
  }
  tail.remove_prefix(from == 0 ? 0 : from + 1);
  if (!tail.empty()) message += "; its standard error ends with:\n" + std::string(tail);
  return Status::IOError(message);
}

}  // namespace gpubox::dataset
