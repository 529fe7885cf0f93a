// Host threads for the dataset's parallel loops (reading, key collection, generation). The
// dataset is host-side work on host memory, so it uses plain std::thread, not a card's stream.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

#include "common/thread_annotations.hpp"

namespace gpubox::dataset {

// Runs body(worker) for worker in [0, workers) on `workers` threads (worker 0 on the caller)
// and joins them. The first exception thrown by a body is rethrown here after the join.
template <class Body>
void run_workers(int workers, Body&& body) {
  if (workers <= 1) {
    body(0);
    return;
  }
  std::exception_ptr error;
  Mutex error_mu;
  auto guarded = [&](int worker) {
    try {
      body(worker);
    } catch (...) {
      MutexLock lock(error_mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) threads.emplace_back(guarded, w);
  guarded(0);
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

// Calls task(i) for i in [0, count), handing out indices in increasing order to `workers`
// threads as they become free (dynamic load balance).
template <class Task>
void parallel_tasks(int workers, std::size_t count, Task&& task) {
  std::atomic<std::size_t> next{0};
  const int used =
      static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(workers), count));
  run_workers(used < 1 ? 1 : used, [&](int) {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) task(i);
  });
}

}  // namespace gpubox::dataset
