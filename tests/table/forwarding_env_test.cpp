// io::ForwardingEnv (the base of the decorating envs: FaultInjectingEnv, gpubox_server's
// ProgressEnv, the tests' counting and slow envs) forwards every FileEnv method to its inner env,
// with its arguments, and hands back the inner env's results (statuses, values, the very files it
// opened). The oracle is a recording env that answers each call with values naming it. A method
// missing from ForwardingEnv would silently take FileEnv's own behaviour in every decorator, so
// the list of methods checked here is itself checked against the virtuals that file_env.hpp
// declares in FileEnv: a method added there fails this test until it is forwarded and listed.
#include "table/io/forwarding_env.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "table/io/file_env.hpp"

namespace gpubox::table::io {
namespace {

// Every FileEnv method (its virtuals but the destructor), as the test below calls them.
const std::vector<std::string> kMethods = {
    "new_writable_file", "read_file", "open_sequential", "create_dir", "remove_all",   "rename",
    "exchange",          "sync_dir",  "exists",          "list_dir",   "note_progress"};

class NullWritable final : public WritableFile {
 public:
  Status append(const void*, std::size_t) override { return Status::OK(); }
  Status sync() override { return Status::OK(); }
  Status close() override { return Status::OK(); }
};

class NullSequential final : public SequentialFile {
 public:
  StatusOr<std::size_t> read(void*, std::size_t) override { return std::size_t{0}; }
  uint64_t size() const override { return 0; }
};

// Records each call ("name arg arg") and answers with values that name it: an error status
// carrying the record, the record as read_file's text and list_dir's entry, and files whose
// addresses it keeps.
class RecordingEnv final : public FileEnv {
 public:
  std::vector<std::string> calls;
  const WritableFile* last_writable = nullptr;
  const SequentialFile* last_sequential = nullptr;

  StatusOr<std::unique_ptr<WritableFile>> new_writable_file(const std::string& path) override {
    record("new_writable_file " + path);
    auto file = std::make_unique<NullWritable>();
    last_writable = file.get();
    return std::unique_ptr<WritableFile>(std::move(file));
  }
  StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes) override {
    return record("read_file " + path + " " + std::to_string(max_bytes));
  }
  StatusOr<std::unique_ptr<SequentialFile>> open_sequential(const std::string& path,
                                                            uint64_t max_bytes) override {
    record("open_sequential " + path + " " + std::to_string(max_bytes));
    auto file = std::make_unique<NullSequential>();
    last_sequential = file.get();
    return std::unique_ptr<SequentialFile>(std::move(file));
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

// Calls every method of `env` once, in kMethods' order, checking what comes back against what
// `inner` answered.
void call_every_method(FileEnv& env, const RecordingEnv& inner) {
  auto writable = env.new_writable_file("w");
  ASSERT_TRUE(writable.ok());
  EXPECT_EQ(writable->get(), inner.last_writable);
  EXPECT_EQ(env.read_file("r", 7).value(), "read_file r 7");
  auto sequential = env.open_sequential("s", 9);
  ASSERT_TRUE(sequential.ok());
  EXPECT_EQ(sequential->get(), inner.last_sequential);
  EXPECT_EQ(env.create_dir("d").message(), "create_dir d");
  EXPECT_EQ(env.remove_all("x").message(), "remove_all x");
  EXPECT_EQ(env.rename("a", "b").message(), "rename a b");
  EXPECT_EQ(env.exchange("c", "e").message(), "exchange c e");
  EXPECT_EQ(env.sync_dir("f").message(), "sync_dir f");
  EXPECT_TRUE(env.exists("present"));
  EXPECT_EQ(env.list_dir("l").value(), std::vector<std::string>{"list_dir l"});
  env.note_progress();
}

TEST(ForwardingEnv, ForwardsEveryMethodWithItsArgumentsAndResults) {
  RecordingEnv inner;
  ForwardingEnv env(&inner);
  call_every_method(env, inner);
  const std::vector<std::string> want = {
      "new_writable_file w", "read_file r 7", "open_sequential s 9", "create_dir d",
      "remove_all x",        "rename a b",    "exchange c e",        "sync_dir f",
      "exists present",      "list_dir l",    "note_progress"};
  EXPECT_EQ(inner.calls, want);
  // Each record names its method: every method in kMethods was reached, in order.
  ASSERT_EQ(inner.calls.size(), kMethods.size());
  for (std::size_t i = 0; i < kMethods.size(); ++i) {
    EXPECT_EQ(inner.calls[i].substr(0, inner.calls[i].find(' ')), kMethods[i]);
  }
}

// The virtuals FileEnv declares in file_env.hpp (every `virtual ... name(` between `class FileEnv
// {` and its closing `};`, the destructor aside).
std::vector<std::string> declared_virtuals() {
  std::ifstream in(std::string(GPUBOX_SOURCE_DIR) + "/table/io/file_env.hpp");
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  const std::size_t begin = all.find("class FileEnv {");
  const std::size_t end = all.find("\n};", begin);
  if (begin == std::string::npos || end == std::string::npos) return {};
  const std::string body = all.substr(begin, end - begin);
  const std::regex decl(R"(virtual\s+[^;{}()]*?([A-Za-z_~]\w*)\s*\()");
  std::vector<std::string> names;
  for (std::sregex_iterator it(body.begin(), body.end(), decl), stop; it != stop; ++it) {
    if ((*it)[1].str() != "~FileEnv") names.push_back((*it)[1].str());
  }
  return names;
}

TEST(ForwardingEnv, ChecksEveryMethodThatFileEnvDeclares) {
  std::vector<std::string> declared = declared_virtuals();
  std::vector<std::string> checked = kMethods;
  std::sort(declared.begin(), declared.end());
  std::sort(checked.begin(), checked.end());
  EXPECT_EQ(declared, checked) << "a FileEnv method is missing from ForwardingEnv's test: forward "
                                  "it in table/io/forwarding_env.hpp and list it in kMethods";
}

}  // namespace
}  // namespace gpubox::table::io
