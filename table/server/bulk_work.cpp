#include "table/server/bulk_work.hpp"

#include <system_error>
#include <utility>

namespace gpubox::table::server {

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
  queued_.fetch_add(1, std::memory_order_relaxed);
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
