// One training run at a time saves into a runner.model_save_path. Two runs writing one folder
// interleave their passes' halves: each MODEL_MANIFEST records the digests of the halves it
// finds, so a save could hold one run's sparse rows with the other's dense net and still load
// as complete. The trainer that writes the saves (trainer 0) holds an advisory lock on a file
// in the folder for its run, and removes the file when it ends; a second run is refused at
// start, naming the holder. The kernel drops the lock with its process (a crash or kill -9
// leaves an unlocked file, which the next run takes). Host-only; Linux.
#pragma once

#include <string>
#include <vector>

namespace gpubox::trainer {

class SaveFolderLock {
 public:
  // The lock's file inside the save folder while a run holds it (hidden: a data folder skips it
  // as it skips every hidden entry).
  static constexpr const char* kFileName = ".gpubox_train.lock";

  SaveFolderLock() = default;  // holds nothing
  // Creates `save_path` (runner.model_save_path) when missing and locks it for this object's
  // lifetime. Throws gpubox::Error naming the key and the path when the folder cannot be made
  // or written, and naming the process that holds it when another run does (in this process
  // too: each lock is its own open file). On a file system without locks it warns and holds
  // nothing.
  explicit SaveFolderLock(const std::string& save_path);
  // Removes the file and lets go; then removes the folders the constructor made that are still
  // empty (a run stopped before its first save leaves the file system as it found it), whether
  // it held the lock or not.
  ~SaveFolderLock();
  SaveFolderLock(SaveFolderLock&& other) noexcept;
  SaveFolderLock& operator=(SaveFolderLock&& other) noexcept;
  SaveFolderLock(const SaveFolderLock&) = delete;
  SaveFolderLock& operator=(const SaveFolderLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  void release();

  int fd_ = -1;
  std::string file_;
  std::vector<std::string> made_;  // the folders the constructor made, innermost first
};

}  // namespace gpubox::trainer
