// A FileEnv that forwards every call to another (the POSIX env by default): a test's env derives
// from it and overrides only what it watches or changes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "table/io/file_env.hpp"

namespace gpubox::table::testing {

class ForwardingEnv : public io::FileEnv {
 public:
  explicit ForwardingEnv(io::FileEnv* base = io::FileEnv::posix()) : base_(base) {}

  StatusOr<std::unique_ptr<io::WritableFile>> new_writable_file(const std::string& path) override {
    return base_->new_writable_file(path);
  }
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override {
    return base_->read_file(path, max_bytes);
  }
  StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                uint64_t max_bytes) override {
    return base_->open_sequential(path, max_bytes);
  }
  Status create_dir(const std::string& path) override { return base_->create_dir(path); }
  Status remove_all(const std::string& path) override { return base_->remove_all(path); }
  Status rename(const std::string& from, const std::string& to) override {
    return base_->rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    return base_->exchange(a, b);
  }
  Status sync_dir(const std::string& path) override { return base_->sync_dir(path); }
  bool exists(const std::string& path) override { return base_->exists(path); }
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override {
    return base_->list_dir(path);
  }
  void note_progress() override { base_->note_progress(); }

 private:
  io::FileEnv* base_;
};

}  // namespace gpubox::table::testing
