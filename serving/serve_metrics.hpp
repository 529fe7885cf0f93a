// gpubox_serve's counters, rendered for GET /metrics in the Prometheus text format (version
// 0.0.4): requests by path and status code, errors, the /predict latency histogram, batches and
// instances, requests waiting in the micro-batcher, connections, and the model's size.
//
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/thread_annotations.hpp"

namespace gpubox::serving {

class ServeMetrics {
 public:
  // Upper bounds (seconds) of the latency histogram's buckets; +Inf follows.
  static constexpr std::array<double, 12> kLatencyBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};

  // One answered request. `path` is one of the served paths or "other"; `seconds` from the
  // request read whole to its response ready (only /predict's go to the histogram).
  void record_request(const std::string& path, int status, double seconds);
  // One micro-batch of `instances` instances from `requests` requests.
  void record_batch(uint64_t requests, uint64_t instances);
  // A /predict request queued in the micro-batcher, and its predictions (or error) handed back.
  void predict_queued() { predict_waiting_.fetch_add(1); }
  void predict_done() { predict_waiting_.fetch_sub(1); }
  void connection_opened() { connections_open_.fetch_add(1); }
  void connection_closed() { connections_open_.fetch_sub(1); }
  void connection_refused() { connections_refused_.fetch_add(1); }
  void set_model(uint64_t rows, uint64_t dense_parameters) {
    model_rows_ = rows;
    model_dense_parameters_ = dense_parameters;
  }

  uint64_t requests(const std::string& path, int status) const;
  uint64_t batches() const { return batches_.load(); }
  int64_t connections_open() const { return connections_open_.load(); }
  // /predict requests in the micro-batcher now: queued or being predicted.
  int64_t predict_waiting() const { return predict_waiting_.load(); }

  std::string render_prometheus() const;

 private:
  mutable Mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_ GPUBOX_GUARDED_BY(mu_);
  std::array<uint64_t, kLatencyBounds.size() + 1> latency_buckets_ GPUBOX_GUARDED_BY(mu_){};
  double latency_sum_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t latency_count_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> batch_requests_{0};
  std::atomic<uint64_t> batch_instances_{0};
  std::atomic<int64_t> connections_open_{0};
  std::atomic<int64_t> predict_waiting_{0};
  std::atomic<uint64_t> connections_refused_{0};
  std::atomic<uint64_t> model_rows_{0};
  std::atomic<uint64_t> model_dense_parameters_{0};
};

}  // namespace gpubox::serving
