#include "trainer/schedule/part_progress_env.hpp"

#include <algorithm>
#include <utility>

namespace gpubox::trainer {
namespace {

// A file of the env: appends in chunks of kChunkBytes, a move after each, after a sync and after
// the close.
class ChunkedFile final : public table::io::WritableFile {
 public:
  ChunkedFile(std::unique_ptr<table::io::WritableFile> inner, const std::function<void()>& on_move)
      : inner_(std::move(inner)), on_move_(on_move) {}

  Status append(const void* data, std::size_t size) override {
    const auto* bytes = static_cast<const char*>(data);
    for (std::size_t done = 0; done < size;) {
      const std::size_t chunk = std::min(PartProgressEnv::kChunkBytes, size - done);
      GPUBOX_RETURN_IF_ERROR(inner_->append(bytes + done, chunk));
      done += chunk;
      on_move_();
    }
    return Status::OK();
  }
  Status sync() override { return moved(inner_->sync()); }
  Status close() override { return moved(inner_->close()); }

 private:
  Status moved(Status status) {
    on_move_();
    return status;
  }

  std::unique_ptr<table::io::WritableFile> inner_;
  const std::function<void()>& on_move_;  // the env's, which outlives its files
};

}  // namespace

PartProgressEnv::PartProgressEnv(table::io::FileEnv* inner, std::function<void()> on_move)
    : ForwardingEnv(inner), on_move_(std::move(on_move)) {}

StatusOr<std::unique_ptr<table::io::WritableFile>> PartProgressEnv::new_writable_file(
    const std::string& path) {
  auto file = inner()->new_writable_file(path);
  on_move_();
  if (!file.ok()) return file.status();
  return std::unique_ptr<table::io::WritableFile>(
      std::make_unique<ChunkedFile>(std::move(*file), on_move_));
}

StatusOr<std::string> PartProgressEnv::read_file(const std::string& path, uint64_t max_bytes) {
  return moved(inner()->read_file(path, max_bytes));
}

StatusOr<std::unique_ptr<table::io::SequentialFile>> PartProgressEnv::open_sequential(
    const std::string& path, uint64_t max_bytes) {
  return moved(inner()->open_sequential(path, max_bytes));
}

Status PartProgressEnv::create_dir(const std::string& path) {
  return moved(inner()->create_dir(path));
}

Status PartProgressEnv::remove_all(const std::string& path) {
  return moved(inner()->remove_all(path));
}

Status PartProgressEnv::rename(const std::string& from, const std::string& to) {
  return moved(inner()->rename(from, to));
}

Status PartProgressEnv::exchange(const std::string& a, const std::string& b) {
  return moved(inner()->exchange(a, b));
}

Status PartProgressEnv::sync_dir(const std::string& path) { return moved(inner()->sync_dir(path)); }

bool PartProgressEnv::exists(const std::string& path) { return moved(inner()->exists(path)); }

StatusOr<std::vector<std::string>> PartProgressEnv::list_dir(const std::string& path) {
  return moved(inner()->list_dir(path));
}

void PartProgressEnv::note_progress() {
  inner()->note_progress();
  on_move_();
}

}  // namespace gpubox::trainer
