// MicroBatcher: concurrent /predict requests become one model batch. Requests queue up; one
// worker thread takes the queue's head as soon as it holds max_batch_instances instances, or
// max_wait after the oldest queued request arrived, whichever comes first, assembles the
// requests' instances into one batch (dataset::assemble_batch, as the trainer's steps are),
// runs the predictor once and hands each request its own predictions.
//
// Bounded: at most max_queued_instances instances wait at once (submit refuses more; requests
// over one batch stop at seven eighths of it, queue_admits), and a batch takes whole requests up
// to max_batch_instances (a larger request runs alone).
// Thread-safety: submit() and stop() may be called from any thread; `done` callbacks run on the
// worker thread and must not block.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/instance_block.hpp"
#include "serving/predictor.hpp"
#include "serving/serve_metrics.hpp"

namespace gpubox::serving {

struct BatcherOptions {
  std::size_t max_batch_instances = 256;
  std::chrono::microseconds max_wait{1000};
  std::size_t max_queued_instances = 1 << 16;
};

// Whether a request of `n` instances joins a queue holding `queued`: a request into an empty
// queue always does (a larger one than the queue runs alone), else the queue may not pass
// max_queued_instances, and a request over max_batch_instances may not pass seven eighths of it:
// the last eighth is kept for requests of one batch or less, so that a client sending large
// requests on many connections does not shut out a light one (20 connections of 4,096 instances
// each refused a 1-instance client 9 tries in 10). A request larger than six eighths stops at its
// own size and the last eighth (held to seven eighths, only an empty queue would take one larger
// than that), so a larger request never finds room a smaller one lacks.
bool queue_admits(std::size_t queued, std::size_t n, const BatcherOptions& options);

class MicroBatcher {
 public:
  using Done = std::function<void(const Status& status, std::vector<float> predictions)>;

  // `predictor` and `metrics` must outlive the batcher. Starts the worker thread.
  MicroBatcher(Predictor& predictor, int num_slots, int dense_dim, BatcherOptions options,
               ServeMetrics* metrics);
  // stop(), then join().
  ~MicroBatcher();
  MicroBatcher(const MicroBatcher&) = delete;
  MicroBatcher& operator=(const MicroBatcher&) = delete;

  // Queues `instances`; `done` gets their predictions in order, or the error that stopped the
  // batch. Returns false without queueing (and without calling `done`) when the queue is full
  // or the batcher is stopping.
  bool submit(std::shared_ptr<const dataset::InstanceBlock> instances, Done done);
  // No more submits; what is queued still runs. Returns at once.
  void stop();
  // After stop(): returns when the queue has run and the worker has exited. Idempotent.
  void join();

 private:
  struct Pending {
    std::shared_ptr<const dataset::InstanceBlock> instances;
    Done done;
    std::chrono::steady_clock::time_point arrived;
  };
  void run();
  void run_batch(std::vector<Pending>& taken);

  Predictor& predictor_;
  int num_slots_;
  int dense_dim_;
  BatcherOptions options_;
  ServeMetrics* metrics_;
  Mutex mu_;
  CondVar wake_;
  std::deque<Pending> queue_ GPUBOX_GUARDED_BY(mu_);
  std::size_t queued_instances_ GPUBOX_GUARDED_BY(mu_) = 0;
  bool stopping_ GPUBOX_GUARDED_BY(mu_) = false;
  Mutex join_mu_;
  std::thread worker_ GPUBOX_GUARDED_BY(join_mu_);
};

}  // namespace gpubox::serving
