#include "serving/serve_metrics.hpp"

#include <cstdio>
#include <sstream>

namespace gpubox::serving {
namespace {

std::string number(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  return buf;
}

void header(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

void ServeMetrics::record_request(const std::string& path, int status, double seconds) {
  MutexLock lock(mu_);
  ++requests_[{path, status}];
  if (path != "/predict") return;
  std::size_t bucket = 0;
  while (bucket < kLatencyBounds.size() && seconds > kLatencyBounds[bucket]) ++bucket;
  ++latency_buckets_[bucket];
  latency_sum_ += seconds;
  ++latency_count_;
}

void ServeMetrics::record_batch(uint64_t requests, uint64_t instances) {
  batches_.fetch_add(1);
  batch_requests_.fetch_add(requests);
  batch_instances_.fetch_add(instances);
}

uint64_t ServeMetrics::requests(const std::string& path, int status) const {
  MutexLock lock(mu_);
  const auto it = requests_.find({path, status});
  return it == requests_.end() ? 0 : it->second;
}

std::string ServeMetrics::render_prometheus() const {
  std::ostringstream out;
  MutexLock lock(mu_);
  header(out, "gpubox_serve_requests_total", "counter",
         "HTTP requests answered, by path and code.");
  uint64_t errors = 0;
  for (const auto& [key, count] : requests_) {
    out << "gpubox_serve_requests_total{path=\"" << key.first << "\",code=\"" << key.second
        << "\"} " << count << '\n';
    if (key.second >= 400) errors += count;
  }
  header(out, "gpubox_serve_errors_total", "counter",
         "HTTP requests answered with a 4xx or 5xx code.");
  out << "gpubox_serve_errors_total " << errors << '\n';
  header(out, "gpubox_serve_predict_seconds", "histogram",
         "POST /predict latency, from the request read to its response ready.");
  uint64_t cumulative = 0;
  for (std::size_t b = 0; b < kLatencyBounds.size(); ++b) {
    cumulative += latency_buckets_[b];
    out << "gpubox_serve_predict_seconds_bucket{le=\"" << number(kLatencyBounds[b]) << "\"} "
        << cumulative << '\n';
  }
  cumulative += latency_buckets_.back();
  out << "gpubox_serve_predict_seconds_bucket{le=\"+Inf\"} " << cumulative << '\n';
  out << "gpubox_serve_predict_seconds_sum " << number(latency_sum_) << '\n';
  out << "gpubox_serve_predict_seconds_count " << latency_count_ << '\n';
  header(out, "gpubox_serve_batches_total", "counter", "Micro-batches run through the model.");
  out << "gpubox_serve_batches_total " << batches_.load() << '\n';
  header(out, "gpubox_serve_batched_requests_total", "counter",
         "Requests answered by the micro-batches.");
  out << "gpubox_serve_batched_requests_total " << batch_requests_.load() << '\n';
  header(out, "gpubox_serve_instances_total", "counter", "Instances predicted.");
  out << "gpubox_serve_instances_total " << batch_instances_.load() << '\n';
  header(out, "gpubox_serve_predict_waiting", "gauge",
         "Requests in the micro-batcher now (queued or being predicted).");
  out << "gpubox_serve_predict_waiting " << predict_waiting_.load() << '\n';
  header(out, "gpubox_serve_connections", "gauge", "Connections open now.");
  out << "gpubox_serve_connections " << connections_open_.load() << '\n';
  header(out, "gpubox_serve_connections_refused_total", "counter",
         "Connections refused (over --max_connections or while stopping).");
  out << "gpubox_serve_connections_refused_total " << connections_refused_.load() << '\n';
  header(out, "gpubox_serve_model_rows", "gauge", "Sparse rows of the loaded model.");
  out << "gpubox_serve_model_rows " << model_rows_.load() << '\n';
  header(out, "gpubox_serve_model_dense_parameters", "gauge",
         "Dense parameters of the loaded model.");
  out << "gpubox_serve_model_dense_parameters " << model_dense_parameters_.load() << '\n';
  return out.str();
}

}  // namespace gpubox::serving
