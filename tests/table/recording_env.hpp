// A FileEnv that records every call made to it, and the list of FileEnv's methods: the oracle of
// the tests of the envs that decorate another (io::ForwardingEnv, FaultInjectingEnv,
// io::ProgressEnv, the slowed env of tests/table/server/slow_io_tier.hpp).
// forwarding_env_test checks kFileEnvMethods against the virtuals file_env.hpp declares, and
// call_file_env_method() fails the calling test on a name it does not know, so a method added to
// FileEnv fails every decorator's test until each says what it does with it.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "table/io/file_env.hpp"

namespace gpubox::table::testing {

// Every FileEnv method (its virtuals but the destructor).
inline const std::vector<std::string> kFileEnvMethods = {
    "new_writable_file", "read_file", "open_sequential", "create_dir", "remove_all",   "rename",
    "exchange",          "sync_dir",  "exists",          "list_dir",   "note_progress"};

class NullWritable final : public io::WritableFile {
 public:
  Status append(const void*, std::size_t) override { return Status::OK(); }
  Status sync() override { return Status::OK(); }
  Status close() override { return Status::OK(); }
};

class NullSequential final : public io::SequentialFile {
 public:
  StatusOr<std::size_t> read(void*, std::size_t) override { return std::size_t{0}; }
  uint64_t size() const override { return 0; }
};

// Records each call ("name arg arg") and answers with values that name it: an error status
// carrying the record, the record as read_file's text and list_dir's entry, and files whose
// addresses it keeps. `exists` is true of the path "present" alone.
class RecordingEnv final : public io::FileEnv {
 public:
  std::vector<std::string> calls;
  const io::WritableFile* last_writable = nullptr;
  const io::SequentialFile* last_sequential = nullptr;

  // The method each call so far went to.
  std::vector<std::string> methods() const {
    std::vector<std::string> names;
    for (const std::string& call : calls) names.push_back(call.substr(0, call.find(' ')));
    return names;
  }

  StatusOr<std::unique_ptr<io::WritableFile>> new_writable_file(const std::string& path) override {
    record("new_writable_file " + path);
    auto file = std::make_unique<NullWritable>();
    last_writable = file.get();
    return std::unique_ptr<io::WritableFile>(std::move(file));
  }
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override {
    return record("read_file " + path + " " + std::to_string(max_bytes));
  }
  StatusOr<std::unique_ptr<io::SequentialFile>> open_sequential(const std::string& path,
                                                                uint64_t max_bytes) override {
    record("open_sequential " + path + " " + std::to_string(max_bytes));
    auto file = std::make_unique<NullSequential>();
    last_sequential = file.get();
    return std::unique_ptr<io::SequentialFile>(std::move(file));
  }
  Status create_dir(const std::string& path) override { return failed("create_dir " + path); }
  Status remove_all(const std::string& path) override { return failed("remove_all " + path); }
  Status rename(const std::string& from, const std::string& to) override {
    return failed("rename " + from + " " + to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    return failed("exchange " + a + " " + b);
  }
  Status sync_dir(const std::string& path) override { return failed("sync_dir " + path); }
  bool exists(const std::string& path) override {
    record("exists " + path);
    return path == "present";
  }
  StatusOr<std::vector<std::string>> list_dir(const std::string& path) override {
    return std::vector<std::string>{record("list_dir " + path)};
  }
  void note_progress() override { record("note_progress"); }

 private:
  std::string record(std::string call) {
    calls.push_back(call);
    return call;
  }
  Status failed(const std::string& call) { return Status::IOError(record(call)); }
};

// Calls `method` (a name in kFileEnvMethods) of `env` once, with the arguments that
// forwarding_env_test expects RecordingEnv to record, and drops what comes back.
inline void call_file_env_method(io::FileEnv& env, const std::string& method) {
  if (method == "new_writable_file") {
    (void)env.new_writable_file("w");
  } else if (method == "read_file") {
    (void)env.read_file("r", 7);
  } else if (method == "open_sequential") {
    (void)env.open_sequential("s", 9);
  } else if (method == "create_dir") {
    (void)env.create_dir("d");
  } else if (method == "remove_all") {
    (void)env.remove_all("x");
  } else if (method == "rename") {
    (void)env.rename("a", "b");
  } else if (method == "exchange") {
    (void)env.exchange("c", "e");
  } else if (method == "sync_dir") {
    (void)env.sync_dir("f");
  } else if (method == "exists") {
    (void)env.exists("present");
  } else if (method == "list_dir") {
    (void)env.list_dir("l");
  } else if (method == "note_progress") {
    env.note_progress();
  } else {
    ADD_FAILURE() << "no call for FileEnv method " << method << " in tests/table/recording_env.hpp";
  }
}

}  // namespace gpubox::table::testing
