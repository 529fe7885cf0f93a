#include "heterps/pass/host_call_workers.hpp"

#include <atomic>
#include <utility>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/thread_priority.hpp"

namespace gpubox::pass {
namespace {
std::atomic<std::uint64_t> g_threads_started{0};
}  // namespace

HostCallWorkers::HostCallWorkers(std::size_t threads, int nice) {
  GPUBOX_EXPECTS(threads >= 1, "host call workers: no thread to run the calls");
  try {
    for (std::size_t i = 0; i < threads; ++i) {
      threads_.emplace_back([this, nice] { work(nice); });
      g_threads_started.fetch_add(1, std::memory_order_relaxed);
    }
  } catch (...) {
    close_and_join();  // the threads made so far (a thread that could not start: an error)
    throw;
  }
}

HostCallWorkers::~HostCallWorkers() { close_and_join(); }

std::uint64_t HostCallWorkers::threads_started() {
  return g_threads_started.load(std::memory_order_relaxed);
}

std::future<Status> HostCallWorkers::submit(std::function<Status()> call) {
  std::packaged_task<Status()> task(std::move(call));
  std::future<Status> done = task.get_future();
  {
    MutexLock lock(mu_);
    GPUBOX_EXPECTS(!closed_, "host call workers: a call submitted while they are joined");
    calls_.push_back(std::move(task));
  }
  ready_.notify_one();
  return done;
}

void HostCallWorkers::work(int nice) {
  const Status lowered = lower_thread_priority(nice);
  if (!lowered.ok()) GPUBOX_LOG(WARNING) << "host call workers: " << lowered.to_string();
  for (;;) {
    std::packaged_task<Status()> call;
    {
      MutexLock lock(mu_);
      while (calls_.empty() && !closed_) ready_.wait(lock);
      if (calls_.empty()) return;  // closed, and nothing left to run
      call = std::move(calls_.front());
      calls_.pop_front();
    }
    call();
  }
}

void HostCallWorkers::close_and_join() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

CallWindow::CallWindow(HostCallWorkers& workers, std::size_t limit)
    : workers_(workers), limit_(std::max<std::size_t>(limit, 1)) {}

CallWindow::~CallWindow() {
  for (std::future<Status>& call : calls_) call.wait();
}

Status CallWindow::retire() {
  std::future<Status> oldest = std::move(calls_.front());
  calls_.pop_front();
  return oldest.get();
}

}  // namespace gpubox::pass
