// A FileEnv that forwards every call to an inner one: the base of the envs that decorate another
// (FaultInjectingEnv, ProgressEnv, tests' counting and slow envs), each of which overrides only
// what it watches or changes, so that a method added to FileEnv is forwarded here, in one place
// (tests/table/forwarding_env_test.cpp checks that every one is). Files opened through it are
// the inner env's own. Thread-safe as the inner env is: `inner` is fixed at construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/io/file_env.hpp"

namespace gpubox::table::io {

class ForwardingEnv : public FileEnv {
 public:
  // `inner` is borrowed and must outlive this env and the files opened through it.
  explicit ForwardingEnv(FileEnv* inner) : inner_(inner) {
    GPUBOX_EXPECTS(inner != nullptr, "ForwardingEnv needs an inner env");
  }

  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) override {
    return inner_->new_writable_file(path);
  }
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override {
    return inner_->read_file(path, max_bytes);
  }
  StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                            uint64_t max_bytes) override {
    return inner_->open_sequential(path, max_bytes);
  }
  Status create_dir(const std::string& path) override { return inner_->create_dir(path); }
  Status remove_all(const std::string& path) override { return inner_->remove_all(path); }
  Status rename(const std::string& from, const std::string& to) override {
    return inner_->rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    return inner_->exchange(a, b);
  }
  Status sync_dir(const std::string& path) override { return inner_->sync_dir(path); }
  bool exists(const std::string& path) override { return inner_->exists(path); }
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override {
    return inner_->list_dir(path);
  }
  void note_progress() override { inner_->note_progress(); }

 protected:
  FileEnv* inner() const { return inner_; }

 private:
  FileEnv* const inner_;
};

}  // namespace gpubox::table::io
