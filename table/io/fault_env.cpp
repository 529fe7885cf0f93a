#include "table/io/fault_env.hpp"

namespace gpubox::table::io {
namespace {

class FaultyWritableFile final : public WritableFile {
 public:
  FaultyWritableFile(FaultInjectingEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  Status append(const void* data, std::size_t size) override {
    GPUBOX_RETURN_IF_ERROR(env_->step("append", path_));
    return base_->append(data, size);
  }
  Status sync() override {
    GPUBOX_RETURN_IF_ERROR(env_->step("sync", path_));
    return env_->real_syncs() ? base_->sync() : Status::OK();  // close() still flushes
  }
  Status close() override {
    Status st = env_->step("close", path_);
    Status closed = base_->close();  // the descriptor is released either way
    return st.ok() ? closed : st;
  }

 private:
  FaultInjectingEnv* env_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

Status FaultInjectingEnv::step(const char* what, const std::string& path) {
  const int64_t index = steps_.fetch_add(1);
  if (index >= fail_from_.load()) {
    return Status::IOError(std::string("injected failure at step ") + std::to_string(index) + ": " +
                           what + " " + path);
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<WritableFile>> FaultInjectingEnv::new_writable_file(
    const std::string& path) {
  GPUBOX_RETURN_IF_ERROR(step("create", path));
  auto file = ForwardingEnv::new_writable_file(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(new FaultyWritableFile(this, path, std::move(file).value()));
}

Status FaultInjectingEnv::create_dir(const std::string& path) {
  GPUBOX_RETURN_IF_ERROR(step("create_dir", path));
  return ForwardingEnv::create_dir(path);
}
Status FaultInjectingEnv::remove_all(const std::string& path) {
  GPUBOX_RETURN_IF_ERROR(step("remove", path));
  return ForwardingEnv::remove_all(path);
}
Status FaultInjectingEnv::rename(const std::string& from, const std::string& to) {
  GPUBOX_RETURN_IF_ERROR(step("rename", from));
  return ForwardingEnv::rename(from, to);
}
Status FaultInjectingEnv::exchange(const std::string& a, const std::string& b) {
  GPUBOX_RETURN_IF_ERROR(step("exchange", a));
  return ForwardingEnv::exchange(a, b);
}
Status FaultInjectingEnv::sync_dir(const std::string& path) {
  GPUBOX_RETURN_IF_ERROR(step("sync_dir", path));
  return real_syncs_ ? ForwardingEnv::sync_dir(path) : Status::OK();
}

}  // namespace gpubox::table::io
