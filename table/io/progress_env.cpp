#include "table/io/progress_env.hpp"

#include <algorithm>
#include <utility>

namespace gpubox::table::io {

// ---- FileWorkProgress -------------------------------------------------------------------------

void FileWorkProgress::begin_io(const char* what, const std::string& path) {
  {
    MutexLock lock(mu_);
    current_op_ = std::string(what) + " " + path;
  }
  changed();
  // Release: a reader that sees the operation under way sees its begin's time too.
  in_io_.fetch_add(1, std::memory_order_release);
}

void FileWorkProgress::end_io(uint64_t bytes) {
  bytes_.fetch_add(bytes, std::memory_order_release);
  ops_.fetch_add(1, std::memory_order_release);
  in_io_.fetch_sub(1, std::memory_order_release);
  changed();
}

void FileWorkProgress::step() {
  ops_.fetch_add(1, std::memory_order_release);
  changed();
}

bool FileWorkProgress::moved(uint64_t* seen_ops, Clock::time_point now, Clock::duration max_stall,
                             std::string* stalled) {
  const uint64_t ops = ops_.load(std::memory_order_acquire);
  const bool any = ops != *seen_ops;
  *seen_ops = ops;
  if (any || in_io_.load(std::memory_order_acquire) <= 0) return any;
  const Clock::time_point last(Clock::duration(last_change_.load(std::memory_order_acquire)));
  if (now - last < max_stall) return true;
  if (stalled != nullptr && !stall_told_.exchange(true, std::memory_order_acq_rel)) {
    MutexLock lock(mu_);
    *stalled = current_op_;
  }
  return false;
}

void FileWorkProgress::changed() {
  last_change_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
  stall_told_.store(false, std::memory_order_release);
}

// ---- ProgressEnv ------------------------------------------------------------------------------

namespace {

// One file operation: under way from construction to destruction, which reports it finished
// with the bytes it moved.
class IoScope {
 public:
  IoScope(ProgressSink* sink, const char* what, const std::string& path) : sink_(sink) {
    sink_->begin_io(what, path);
  }
  ~IoScope() { sink_->end_io(bytes_); }
  IoScope(const IoScope&) = delete;
  IoScope& operator=(const IoScope&) = delete;
  void moved(uint64_t bytes) { bytes_ = bytes; }

 private:
  ProgressSink* sink_;
  uint64_t bytes_ = 0;
};

class CountedWritableFile final : public WritableFile {
 public:
  CountedWritableFile(std::unique_ptr<WritableFile> base, ProgressSink* sink, std::string path)
      : base_(std::move(base)), sink_(sink), path_(std::move(path)) {}
  // Chunk by chunk, each an operation: a write of gigabytes moves as it goes.
  Status append(const void* data, std::size_t size) override {
    const auto* bytes = static_cast<const char*>(data);
    std::size_t done = 0;
    do {
      const std::size_t chunk = std::min(ProgressEnv::kChunkBytes, size - done);
      IoScope io(sink_, "append to", path_);
      GPUBOX_RETURN_IF_ERROR(base_->append(bytes + done, chunk));
      io.moved(chunk);
      done += chunk;
    } while (done < size);
    return Status::OK();
  }
  Status sync() override {
    IoScope io(sink_, "fsync of", path_);
    return base_->sync();
  }
  Status close() override {
    IoScope io(sink_, "close of", path_);
    return base_->close();
  }

 private:
  std::unique_ptr<WritableFile> base_;
  ProgressSink* sink_;
  std::string path_;
};

class CountedSequentialFile final : public SequentialFile {
 public:
  CountedSequentialFile(std::unique_ptr<SequentialFile> base, ProgressSink* sink, std::string path)
      : base_(std::move(base)), sink_(sink), path_(std::move(path)) {}
  StatusOr<std::size_t> read(void* buf, std::size_t n) override {
    IoScope io(sink_, "read of", path_);
    auto got = base_->read(buf, n);
    if (got.ok()) io.moved(*got);
    return got;
  }
  uint64_t size() const override { return base_->size(); }

 private:
  std::unique_ptr<SequentialFile> base_;
  ProgressSink* sink_;
  std::string path_;
};

}  // namespace

ProgressEnv::ProgressEnv(FileEnv* base, ProgressSink* sink) : ForwardingEnv(base), sink_(sink) {
  GPUBOX_EXPECTS(sink != nullptr, "ProgressEnv needs a sink");
}

StatusOr<std::unique_ptr<WritableFile>> ProgressEnv::new_writable_file(const std::string& path) {
  IoScope io(sink_, "create", path);
  auto file = ForwardingEnv::new_writable_file(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(
      std::make_unique<CountedWritableFile>(std::move(*file), sink_, path));
}

StatusOr<std::string> ProgressEnv::read_file(const std::string& path, uint64_t max_bytes) {
  IoScope io(sink_, "read of", path);
  auto text = ForwardingEnv::read_file(path, max_bytes);
  if (text.ok()) io.moved(text->size());
  return text;
}

StatusOr<std::unique_ptr<SequentialFile>> ProgressEnv::open_sequential(const std::string& path,
                                                                       uint64_t max_bytes) {
  IoScope io(sink_, "open of", path);
  auto file = ForwardingEnv::open_sequential(path, max_bytes);
  if (!file.ok()) return file.status();
  return std::unique_ptr<SequentialFile>(
      std::make_unique<CountedSequentialFile>(std::move(*file), sink_, path));
}

Status ProgressEnv::create_dir(const std::string& path) {
  IoScope io(sink_, "mkdir", path);
  return ForwardingEnv::create_dir(path);
}

Status ProgressEnv::remove_all(const std::string& path) {
  IoScope io(sink_, "remove of", path);
  return ForwardingEnv::remove_all(path);
}

Status ProgressEnv::rename(const std::string& from, const std::string& to) {
  IoScope io(sink_, "rename of", from);
  return ForwardingEnv::rename(from, to);
}

Status ProgressEnv::exchange(const std::string& a, const std::string& b) {
  IoScope io(sink_, "exchange of", a);
  return ForwardingEnv::exchange(a, b);
}

Status ProgressEnv::sync_dir(const std::string& path) {
  IoScope io(sink_, "fsync of folder", path);
  return ForwardingEnv::sync_dir(path);
}

bool ProgressEnv::exists(const std::string& path) {
  IoScope io(sink_, "stat of", path);
  return ForwardingEnv::exists(path);
}

StatusOr<std::vector<std::string>> ProgressEnv::list_dir(const std::string& path) {
  IoScope io(sink_, "listing of", path);
  return ForwardingEnv::list_dir(path);
}

void ProgressEnv::note_progress() {
  sink_->step();
  ForwardingEnv::note_progress();
}

}  // namespace gpubox::table::io
