// Reads text input in large blocks and hands out lines without copying them: a whole file, a
// byte range of a file (lines that *start* in the range), or the output of
// `sh -c "(<pipe_command>) < file"`. A command's standard error is kept (its last few KiB), so
// that a failing reader's error says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "dataset/dataset_types.hpp"

namespace gpubox::dataset {

// One line as handed out by LineReader. `text` has no '\n' and no trailing '\r' and stays valid
// until the next call to next(). `issue` is kOk, kLineTooLong (text is a prefix of the line) or
// kTruncatedLastLine (the input ended without '\n'; text is what was there).
struct Line {
  std::string_view text;
  std::uint64_t number = 0;  // 1-based within the reader's input
  ParseReason issue = ParseReason::kOk;
  // The input bytes it took: its newline, CR and byte order mark too (for a line_too_long, the
  // part handed out; the rest is consumed, counted in bytes(), by the next call).
  std::uint64_t consumed = 0;
};

// Not thread-safe: one reader per thread. Owns its file descriptor / pipe and closes it.
class LineReader {
 public:
  // Whole file, through `pipe_command` (a shell command line, run in the working directory)
  // when it is not empty. A missing or unreadable file is an IOError naming it.
  static StatusOr<std::unique_ptr<LineReader>> open(const std::string& path,
                                                    const std::string& pipe_command,
                                                    std::size_t max_line_bytes);
  // Lines of a regular file whose first byte lies in [begin, end). Ranges that tile a file
  // hand out each of its lines exactly once; line numbers count from the range's first line.
  static StatusOr<std::unique_ptr<LineReader>> open_range(const std::string& path,
                                                          std::uint64_t begin, std::uint64_t end,
                                                          std::size_t max_line_bytes);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Next line, or false at the end of the input or on a read error (see status()).
  bool next(Line* line);
  // A read error met by next(); OK otherwise.
  const Status& status() const { return status_; }
  // Closes the input. For a pipe, waits for the command: a non-zero exit status (or a signal)
  // is an IOError naming the command, the file, the status and the end of the command's
  // standard error. Call after next() returned false.
  Status finish();
  // The last bytes (at most kStderrTailBytes) the command wrote to its standard error.
  const std::string& stderr_tail() const { return stderr_tail_; }
  static constexpr std::size_t kStderrTailBytes = 4096;
  // Bytes of input consumed so far (of the range: bytes of the lines handed out).
  std::uint64_t bytes() const { return bytes_; }

 private:
  LineReader(std::string path, std::size_t max_line_bytes);
  bool fill();  // reads more input after the unconsumed tail; false at end of input or error
  // Pipe: reads what the command wrote to standard error into stderr_tail_; false at its end.
  bool drain_stderr();
  Status start_command(const std::string& command);

  std::string path_;
  std::string pipe_command_;
  std::size_t max_line_bytes_;
  int fd_ = -1;
  int stderr_fd_ = -1;  // pipe: the command's standard error, -1 once at its end
  int pid_ = -1;        // pipe: the shell running the command
  bool range_mode_ = false;
  std::uint64_t file_offset_ = 0;  // range mode: next byte of the file to read
  std::uint64_t range_end_ = 0;    // range mode: lines must start before this offset
  std::uint64_t base_offset_ = 0;  // range mode: file offset of buffer_[0]
  bool skip_to_newline_ = false;   // discarding up to the next '\n'
  bool count_skipped_ = true;      // whether the discarded bytes count as consumed input
  bool eof_ = false;
  bool done_ = false;
  std::unique_ptr<char[]> buffer_;  // not zero-filled: only the bytes read are touched
  std::size_t capacity_ = 0;
  std::size_t begin_ = 0;  // unconsumed data is buffer_[begin_, end_)
  std::size_t end_ = 0;
  std::uint64_t line_number_ = 0;
  std::uint64_t bytes_ = 0;
  Status status_;
  std::string stderr_tail_;
};

// `path` quoted for sh: 'it'\''s'.
std::string shell_quote(const std::string& path);

}  // namespace gpubox::dataset
