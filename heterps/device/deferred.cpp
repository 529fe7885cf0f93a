#include "heterps/device/deferred.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/error_report.hpp"

namespace gpubox::device {
namespace {

struct Mode {
  std::atomic<bool> enabled{false};
  std::atomic<uint64_t> seed{0};
  std::atomic<unsigned> poll_lag{1};
};

// GPUBOX_DEVICE_CHECK=defer or defer:<seed> (memory_registry.cpp reads the same variable: any
// value but 0 also turns its pointer checks on).
Mode& mode() {
  static Mode* instance = [] {
    auto* m = new Mode();
    const char* value = std::getenv("GPUBOX_DEVICE_CHECK");
    if (value != nullptr && std::strncmp(value, "defer", 5) == 0) {
      m->enabled = true;
      if (value[5] == ':') m->seed = std::strtoull(value + 6, nullptr, 10);
    }
    return m;
  }();
  return *instance;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

bool deferred_execution_enabled() { return mode().enabled.load(std::memory_order_relaxed); }
uint64_t deferred_execution_seed() { return mode().seed.load(std::memory_order_relaxed); }
void set_deferred_execution(bool enabled, uint64_t seed) {
  mode().seed.store(seed, std::memory_order_relaxed);
  mode().enabled.store(enabled, std::memory_order_relaxed);
}
unsigned deferred_poll_lag() { return mode().poll_lag.load(std::memory_order_relaxed); }
void set_deferred_poll_lag(unsigned polls) {
  GPUBOX_EXPECTS(polls >= 1, "set_deferred_poll_lag: ", polls, " polls (at least 1)");
  mode().poll_lag.store(polls, std::memory_order_relaxed);
}

namespace detail {

class DeferredQueue : public std::enable_shared_from_this<DeferredQueue> {
 public:
  DeferredQueue(int device, const char* role, uint64_t seed)
      : device_(device), role_(role), seeded_(seed != 0), coin_(seed) {}

  // Appends `work`; returns its sequence number (1, 2, ...).
  uint64_t push(const char* what, std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(Item{++last_, what, std::move(work)});
    return last_;
  }
  uint64_t last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  bool passed(uint64_t seq) const { return executed_.load(std::memory_order_acquire) >= seq; }
  // A poll found work pending: whether the card goes on now, i.e. whether this is the poll lag's
  // n-th such poll since the queue last ran (run_through resets the count).
  bool lagged_poll_runs() {
    const unsigned lag = deferred_poll_lag();
    return lag <= 1 || pending_polls_.fetch_add(1, std::memory_order_relaxed) + 1 >= lag;
  }
  // The seeded coin (the enqueueing thread's; a queue is enqueued on by its card's thread).
  bool flip() {
    if (!seeded_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return (coin_() & 1) != 0;
  }

  // Runs the queue's work through `seq`, in order, on the calling thread; or, while another
  // thread runs the queue, waits until that one passes `seq` or stops (a thread blocked here
  // sees its target pass: holding a bare lock, it would not, and two queues each run by the
  // other's waiter would hang where a GPU's streams go on).
  void run_through(uint64_t seq) {
    if (passed(seq)) return;
    if (runner_.load(std::memory_order_acquire) == std::this_thread::get_id()) {
      GPUBOX_FAIL("GPUBOX_DEVICE_CHECK=defer: card ", device_, "'s ", role_,
                  " stream waits for its own later work (a cycle of event waits between streams: "
                  "it would hang on a GPU)");
    }
    {
      std::unique_lock<std::mutex> run(run_mu_);
      run_cv_.wait(run, [&] { return passed(seq) || !running_; });
      if (passed(seq)) return;
      running_ = true;
      runner_.store(std::this_thread::get_id(), std::memory_order_release);
    }
    struct Release {
      DeferredQueue& queue;
      ~Release() {
        {
          std::lock_guard<std::mutex> run(queue.run_mu_);
          queue.running_ = false;
          queue.runner_.store(std::thread::id(), std::memory_order_release);
        }
        queue.run_cv_.notify_all();
      }
    } release{*this};
    while (!passed(seq)) {
      Item item;
      {
        std::lock_guard<std::mutex> lock(mu_);
        GPUBOX_EXPECTS(!items_.empty(), "GPUBOX_DEVICE_CHECK=defer: card ", device_, "'s ", role_,
                       " stream has no work ", seq, " (", last_, " enqueued)");
        item = std::move(items_.front());
        items_.pop_front();
      }
      // The work has run (or failed) either way: later waits do not run it again.
      struct Advance {
        DeferredQueue& queue;
        uint64_t seq;
        ~Advance() {
          {  // under run_mu_, so a waiter between its check and its wait cannot miss it
            std::lock_guard<std::mutex> run(queue.run_mu_);
            queue.executed_.store(seq, std::memory_order_release);
          }
          // The card went on: later work is n polls behind from here (the poll lag).
          queue.pending_polls_.store(0, std::memory_order_relaxed);
          queue.run_cv_.notify_all();
        }
      } advance{*this, item.seq};
      try {
        item.work();
      } catch (const Error& e) {
        throw_with_context(::gpubox::detail::concat("deferred ", item.what, " on card ", device_,
                                                    "'s ", role_, " stream: "),
                           e);
      }
    }
  }

 private:
  struct Item {
    uint64_t seq = 0;
    const char* what = "";
    std::function<void()> work;
  };

  const int device_;
  const char* const role_;
  const bool seeded_;
  std::mutex mu_;  // items_, last_, coin_
  std::deque<Item> items_;
  uint64_t last_ = 0;
  std::mt19937_64 coin_;
  std::atomic<uint64_t> executed_{0};
  std::atomic<unsigned> pending_polls_{0};  // polls that found work pending since it last ran
  std::mutex run_mu_;                       // running_; one thread runs the queue at a time
  std::condition_variable run_cv_;          // running_ cleared or executed_ advanced
  bool running_ = false;
  std::atomic<std::thread::id> runner_{};
};

namespace {
// Every live queue, for run_all_deferred.
struct AllQueues {
  std::mutex mu;
  std::vector<std::weak_ptr<DeferredQueue>> queues;
};
AllQueues& all_queues() {
  static AllQueues* instance = new AllQueues();  // never destroyed: streams may outlive statics
  return *instance;
}
}  // namespace

std::shared_ptr<DeferredQueue> make_deferred_queue(int device, const char* role) {
  // Each queue its own coin, from the seed and the queue's place: runs repeat with the seed.
  AllQueues& all = all_queues();
  std::lock_guard<std::mutex> lock(all.mu);
  const uint64_t seed = deferred_execution_seed();
  auto queue = std::make_shared<DeferredQueue>(
      device, role, seed == 0 ? 0 : seed * 0x9e3779b97f4a7c15ULL + all.queues.size() + 1);
  all.queues.erase(
      std::remove_if(all.queues.begin(), all.queues.end(),
                     [](const std::weak_ptr<DeferredQueue>& q) { return q.expired(); }),
      all.queues.end());
  all.queues.push_back(queue);
  return queue;
}

void defer(DeferredQueue& queue, const char* what, std::function<void()> work, bool may_run_now) {
  const uint64_t seq = queue.push(what, std::move(work));
  if (may_run_now && queue.flip()) queue.run_through(seq);
}

void run_deferred(DeferredQueue& queue) { queue.run_through(queue.last()); }

void run_all_deferred() {
  std::vector<std::shared_ptr<DeferredQueue>> live;
  {
    AllQueues& all = all_queues();
    std::lock_guard<std::mutex> lock(all.mu);
    for (const auto& weak : all.queues) {
      if (auto queue = weak.lock()) live.push_back(std::move(queue));
    }
  }
  for (const auto& queue : live) run_deferred(*queue);
}

bool deferred_idle(DeferredQueue& queue) { return queue.passed(queue.last()); }

std::shared_ptr<DeferredMark> mark_deferred(DeferredQueue& queue, bool timed) {
  auto mark = std::make_shared<DeferredMark>();
  mark->queue = queue.weak_from_this();
  mark->seq = queue.last();
  if (!timed) return mark;
  if (queue.passed(mark->seq)) {  // an idle stream passes the record as it is made
    mark->at = now_seconds();
    return mark;
  }
  // The mark's own work stamps the time the stream reached it (what cudaEventElapsedTime reads).
  DeferredMark* stamp = mark.get();
  std::shared_ptr<DeferredMark> keep = mark;
  mark->seq = queue.push("Event::record", [stamp, keep] { stamp->at = now_seconds(); });
  return mark;
}

bool poll_deferred(const DeferredMark& mark) {
  std::shared_ptr<DeferredQueue> queue = mark.queue.lock();
  if (queue == nullptr || queue->passed(mark.seq)) return true;
  if (queue->lagged_poll_runs()) queue->run_through(mark.seq);  // the card went on meanwhile
  return false;
}

bool poll_deferred(DeferredQueue& queue) {
  const uint64_t last = queue.last();
  if (queue.passed(last)) return true;
  if (queue.lagged_poll_runs()) queue.run_through(last);
  return false;
}

bool passed(const DeferredMark& mark) {
  std::shared_ptr<DeferredQueue> queue = mark.queue.lock();
  return queue == nullptr || queue->passed(mark.seq);
}

void run_through(const DeferredMark& mark) {
  if (std::shared_ptr<DeferredQueue> queue = mark.queue.lock()) queue->run_through(mark.seq);
}

void defer_wait(DeferredQueue& queue, std::shared_ptr<const DeferredMark> mark) {
  defer(queue, "Stream::wait", [mark = std::move(mark)] { run_through(*mark); });
}

}  // namespace detail
}  // namespace gpubox::device
