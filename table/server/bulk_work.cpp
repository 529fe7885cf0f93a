#include "table/server/bulk_work.hpp"

#include <utility>

namespace gpubox::table::server {
namespace {

// One file operation of a call: under way from construction to destruction, which counts it
// finished with the bytes it moved.
class IoScope {
 public:
  explicit IoScope(WorkProgress* progress) : progress_(progress) { progress_->begin_io(); }
  ~IoScope() { progress_->end_io(bytes_); }
  IoScope(const IoScope&) = delete;
  IoScope& operator=(const IoScope&) = delete;
  void moved(uint64_t bytes) { bytes_ = bytes; }

 private:
  WorkProgress* progress_;
  uint64_t bytes_ = 0;
};

class CountedWritableFile final : public io::WritableFile {
 public:
  CountedWritableFile(std::unique_ptr<io::WritableFile> base, WorkProgress* progress)
      : base_(std::move(base)), progress_(progress) {}
  Status append(const void* data, std::size_t size) override {
    IoScope io(progress_);
    io.moved(size);
    return base_->append(data, size);
  }
  Status sync() override {
    IoScope io(progress_);
    return base_->sync();
  }
  Status close() override {
    IoScope io(progress_);
    return base_->close();
  }

 private:
  std::unique_ptr<io::WritableFile> base_;
  WorkProgress* progress_;
};

class CountedSequentialFile final : public io::SequentialFile {
 public:
  CountedSequentialFile(std::unique_ptr<io::SequentialFile> base, WorkProgress* progress)
      : base_(std::move(base)), progress_(progress) {}
  StatusOr<std::size_t> read(void* buf, std::size_t n) override {
    IoScope io(progress_);
    auto got = base_->read(buf, n);
    if (got.ok()) io.moved(*got);
    return got;
  }
  uint64_t size() const override { return base_->size(); }

 private:
  std::unique_ptr<io::SequentialFile> base_;
  WorkProgress* progress_;
};

}  // namespace

StatusOr<std::unique_ptr<io::WritableFile>> ProgressEnv::new_writable_file(
    const std::string& path) {
  IoScope io(progress_);
  auto file = base_->new_writable_file(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<io::WritableFile>(
      std::make_unique<CountedWritableFile>(std::move(*file), progress_));
}

StatusOr<std::string> ProgressEnv::read_file(const std::string& path, uint64_t max_bytes) {
  IoScope io(progress_);
  auto text = base_->read_file(path, max_bytes);
  if (text.ok()) io.moved(text->size());
  return text;
}

StatusOr<std::unique_ptr<io::SequentialFile>> ProgressEnv::open_sequential(const std::string& path,
                                                                           uint64_t max_bytes) {
  IoScope io(progress_);
  auto file = base_->open_sequential(path, max_bytes);
  if (!file.ok()) return file.status();
  return std::unique_ptr<io::SequentialFile>(
      std::make_unique<CountedSequentialFile>(std::move(*file), progress_));
}

Status ProgressEnv::create_dir(const std::string& path) {
  IoScope io(progress_);
  return base_->create_dir(path);
}

Status ProgressEnv::remove_all(const std::string& path) {
  IoScope io(progress_);
  return base_->remove_all(path);
}

Status ProgressEnv::rename(const std::string& from, const std::string& to) {
  IoScope io(progress_);
  return base_->rename(from, to);
}

Status ProgressEnv::exchange(const std::string& a, const std::string& b) {
  IoScope io(progress_);
  return base_->exchange(a, b);
}

Status ProgressEnv::sync_dir(const std::string& path) {
  IoScope io(progress_);
  return base_->sync_dir(path);
}

bool ProgressEnv::exists(const std::string& path) {
  IoScope io(progress_);
  return base_->exists(path);
}

StatusOr<std::vector<std::string>> ProgressEnv::list_dir(const std::string& path) {
  IoScope io(progress_);
  return base_->list_dir(path);
}

// ---- BulkWorker -------------------------------------------------------------------------------

void BulkWorker::post(std::function<void()> job) {
  MutexLock lock(mu_);
  if (stopping_) return;  // `job` is destroyed here, unrun
  jobs_.push_back(std::move(job));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_one();
}

void BulkWorker::stop() {
  std::thread thread;
  std::deque<std::function<void()>> dropped;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    dropped.swap(jobs_);
    thread.swap(thread_);
    wake_.notify_one();
  }
  dropped.clear();  // outside the lock: a job's captures may take locks of their own
  if (thread.joinable()) thread.join();
}

void BulkWorker::run() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && jobs_.empty()) wake_.wait(lock);
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace gpubox::table::server
