// A small file-system interface for everything the table writes or reads on disk (saves,
// manifests). Saves go through it so that tests can substitute a fault-injecting env
// (table/io/fault_env.hpp) and check that a save interrupted at any step leaves the previous
// save loadable. RocksDB keeps its own env.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::io {

// An open file being written. Not thread-safe; owned by one writer.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status append(const void* data, std::size_t size) = 0;
  // Flushes buffered bytes and fsyncs the file.
  virtual Status sync() = 0;
  virtual Status close() = 0;
};

// An open file being read in order. Not thread-safe; owned by one reader.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Up to `n` bytes into `buf`, 0 at the end. Reading past the size the file had when opened is
  // an error (Corruption: it grew meanwhile), so a reader never takes more than it was told.
  virtual StatusOr<std::size_t> read(void* buf, std::size_t n) = 0;
  // The file's size when opened.
  virtual uint64_t size() const = 0;
};

// File-system operations. Implementations are thread-safe (several shards save at once).
class FileEnv {
 public:
  virtual ~FileEnv() = default;
  // Creates (or truncates) `path` for writing.
  virtual StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) = 0;
  // The whole file, refused (Corruption naming both sizes) before anything is read when it holds
  // more than `max_bytes`, and after reading `max_bytes + 1` when it grew meanwhile: a file
  // larger than its reader expects never takes more memory than the expectation.
  virtual StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) = 0;
  // `path` to read in order, with read_file's refusals (not a regular file; more than
  // `max_bytes`, before anything is read): what a reader that holds one chunk at a time uses.
  virtual StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                                    uint64_t max_bytes) = 0;
  virtual Status create_dir(const std::string& path) = 0;
  // Removes a file or a folder tree; OK when nothing is there.
  virtual Status remove_all(const std::string& path) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE where the file system has it).
  virtual Status exchange(const std::string& a, const std::string& b) = 0;
  // fsyncs a folder, so renames and new entries in it are durable.
  virtual Status sync_dir(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual StatusOr<std::vector<std::string>> list_dir(const std::string& path) = 0;
  // A long operation through this env (a save or load) still works between its file operations
  // (a shard being encoded, rows read from a disk tier): an env that reports progress
  // (gpubox_server's, table/server/bulk_work.hpp) counts it. Default: nothing. Thread-safe.
  virtual void note_progress() {}

  // The process-wide POSIX env (never null, never destroyed).
  static FileEnv* posix();
};

// For FileEnv implementations over POSIX descriptors (file_env.cpp, rooted_env.cpp).
// A WritableFile over `fd` (owned from here on); `path` names it in errors.
std::unique_ptr<WritableFile> posix_writable_file(std::string path, int fd);
// read_file's contract over an open `fd` (not closed here); `path` names it in errors.
StatusOr<std::string> read_open_file(int fd, const std::string& path, uint64_t max_bytes);
// open_sequential's contract over an open `fd` (owned from here on); `path` names it in errors.
StatusOr<std::unique_ptr<SequentialFile>> posix_sequential_file(int fd, std::string path,
                                                                uint64_t max_bytes);
// An IOError "<what> <path>: <strerror(err)>".
Status posix_error(const std::string& what, const std::string& path, int err);

// Writes `data` to `path` through `env`: create, append, sync, close.
Status write_file(FileEnv* env, const std::string& path, const std::string& data);

// The folder that holds `path` ("." for a bare name).
std::string parent_dir(const std::string& path);

}  // namespace gpubox::table::io
