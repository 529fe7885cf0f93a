#include "table/server/bulk_work.hpp"

#include <system_error>
#include <utility>

namespace gpubox::table::server {
namespace {

// One file operation of a call: under way from construction to destruction, which counts it
// finished with the bytes it moved.
class IoScope {
 public:
  IoScope(WorkProgress* progress, const char* what, const std::string& path) : progress_(progress) {
    progress_->begin_io(what, path);
  }
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
  CountedWritableFile(std::unique_ptr<io::WritableFile> base, WorkProgress* progress,
                      std::string path)
      : base_(std::move(base)), progress_(progress), path_(std::move(path)) {}
  Status append(const void* data, std::size_t size) override {
    IoScope io(progress_, "append to", path_);
    io.moved(size);
    return base_->append(data, size);
  }
  Status sync() override {
    IoScope io(progress_, "fsync of", path_);
    return base_->sync();
  }
  Status close() override {
    IoScope io(progress_, "close of", path_);
    return base_->close();
  }

 private:
  std::unique_ptr<io::WritableFile> base_;
  WorkProgress* progress_;
  std::string path_;
};

class CountedSequentialFile final : public io::SequentialFile {
 public:
  CountedSequentialFile(std::unique_ptr<io::SequentialFile> base, WorkProgress* progress,
                        std::string path)
      : base_(std::move(base)), progress_(progress), path_(std::move(path)) {}
  StatusOr<std::size_t> read(void* buf, std::size_t n) override {
    IoScope io(progress_, "read of", path_);
    auto got = base_->read(buf, n);
    if (got.ok()) io.moved(*got);
    return got;
  }
  uint64_t size() const override { return base_->size(); }

 private:
  std::unique_ptr<io::SequentialFile> base_;
  WorkProgress* progress_;
  std::string path_;
};

}  // namespace

StatusOr<std::unique_ptr<io::WritableFile>> ProgressEnv::new_writable_file(
    const std::string& path) {
  IoScope io(progress_, "create", path);
  auto file = ForwardingEnv::new_writable_file(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<io::WritableFile>(
      std::make_unique<CountedWritableFile>(std::move(*file), progress_, path));
}

StatusOr<std::string> ProgressEnv::read_file(const std::string& path, uint64_t max_bytes) {
  IoScope io(progress_, "read of", path);
  auto text = ForwardingEnv::read_file(path, max_bytes);
  if (text.ok()) io.moved(text->size());
  return text;
}

StatusOr<std::unique_ptr<io::SequentialFile>> ProgressEnv::open_sequential(const std::string& path,
                                                                           uint64_t max_bytes) {
  IoScope io(progress_, "open of", path);
  auto file = ForwardingEnv::open_sequential(path, max_bytes);
  if (!file.ok()) return file.status();
  return std::unique_ptr<io::SequentialFile>(
      std::make_unique<CountedSequentialFile>(std::move(*file), progress_, path));
}

Status ProgressEnv::create_dir(const std::string& path) {
  IoScope io(progress_, "mkdir", path);
  return ForwardingEnv::create_dir(path);
}

Status ProgressEnv::remove_all(const std::string& path) {
  IoScope io(progress_, "remove of", path);
  return ForwardingEnv::remove_all(path);
}

Status ProgressEnv::rename(const std::string& from, const std::string& to) {
  IoScope io(progress_, "rename of", from);
  return ForwardingEnv::rename(from, to);
}

Status ProgressEnv::exchange(const std::string& a, const std::string& b) {
  IoScope io(progress_, "exchange of", a);
  return ForwardingEnv::exchange(a, b);
}

Status ProgressEnv::sync_dir(const std::string& path) {
  IoScope io(progress_, "fsync of folder", path);
  return ForwardingEnv::sync_dir(path);
}

bool ProgressEnv::exists(const std::string& path) {
  IoScope io(progress_, "stat of", path);
  return ForwardingEnv::exists(path);
}

StatusOr<std::vector<std::string>> ProgressEnv::list_dir(const std::string& path) {
  IoScope io(progress_, "listing of", path);
  return ForwardingEnv::list_dir(path);
}

// ---- BulkWorker -------------------------------------------------------------------------------

bool BulkWorker::Job::wanted() const {
  for (const BulkWaiter& w : waiters) {
    if (!w.abandoned->load(std::memory_order_acquire)) return true;
  }
  return false;
}

Status BulkWorker::start(const std::function<void()>& fault) {
  MutexLock lock(mu_);
  if (thread_.joinable() || stopping_)
    return Status::Internal("the SAVE/LOAD worker was started twice");
  try {
    if (fault) fault();
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    return Status::Internal(std::string("cannot start the SAVE/LOAD worker thread: ") + e.what());
  }
  return Status::OK();
}

BulkWorker::Admit BulkWorker::submit(const Key& key, std::function<Reply()> work,
                                     BulkWaiter waiter) {
  MutexLock lock(mu_);
  if (stopping_ || !thread_.joinable()) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Admit::kBusy;
  }
  std::size_t active = jobs_.size();
  std::vector<std::shared_ptr<Job>*> all;
  for (auto& job : jobs_) all.push_back(&job);
  if (running_) {
    all.push_back(&running_);
    ++active;
  }
  for (std::shared_ptr<Job>* job : all) {
    if ((*job)->key == key) {
      (*job)->waiters.push_back(std::move(waiter));
      attached_.fetch_add(1, std::memory_order_relaxed);
      return Admit::kAttached;
    }
  }
  // One call a client queued behind what runs: a client's own call still running (a SAVE it gave
  // up on after another server failed) does not refuse its next one (the reload of a recovery),
  // which waits behind it with the worker's progress.
  bool client_busy = false;
  for (const auto& job : jobs_) client_busy |= job->key.client_id == key.client_id;
  if (client_busy || active >= kMaxJobs) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Admit::kBusy;
  }
  auto job = std::make_shared<Job>();
  job->key = key;
  job->work = std::move(work);
  job->waiters.push_back(std::move(waiter));
  jobs_.push_back(std::move(job));
  wake_.notify_one();
  return Admit::kQueued;
}

void BulkWorker::abandoned() {
  std::vector<std::shared_ptr<Job>> dropped;  // destroyed outside the lock
  MutexLock lock(mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if ((*it)->wanted()) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(*it));
    it = jobs_.erase(it);
    skipped_.fetch_add(1, std::memory_order_relaxed);
  }
}

void BulkWorker::stop() {
  std::thread thread;
  std::deque<std::shared_ptr<Job>> dropped;
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
    std::shared_ptr<Job> job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && jobs_.empty()) wake_.wait(lock);
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      if (!job->wanted()) {  // every session waiting for it closed before it started
        skipped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      running_ = job;
    }
    runs_.fetch_add(1, std::memory_order_relaxed);
    const Reply reply = job->work();
    std::vector<BulkWaiter> waiters;
    {
      MutexLock lock(mu_);
      waiters.swap(job->waiters);  // no session attaches once running_ is reset
      running_.reset();
    }
    for (const BulkWaiter& w : waiters) {
      if (!w.abandoned->load(std::memory_order_acquire)) w.deliver(reply);
    }
  }
}

}  // namespace gpubox::table::server
