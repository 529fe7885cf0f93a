#include "serving/micro_batcher.hpp"

#include <algorithm>
#include <exception>

#include "common/error_report.hpp"
#include "dataset/batch.hpp"
#include "dataset/in_memory_dataset.hpp"

namespace gpubox::serving {

MicroBatcher::MicroBatcher(Predictor& predictor, int num_slots, int dense_dim,
                           BatcherOptions options, ServeMetrics* metrics)
    : predictor_(predictor),
      num_slots_(num_slots),
      dense_dim_(dense_dim),
      options_(options),
      metrics_(metrics) {
  if (options_.max_batch_instances == 0) options_.max_batch_instances = 1;
  worker_ = std::thread([this] { run(); });
}

MicroBatcher::~MicroBatcher() {
  stop();
  join();
}

void MicroBatcher::join() {
  MutexLock lock(join_mu_);
  if (worker_.joinable()) worker_.join();
}

bool queue_admits(std::size_t queued, std::size_t n, const BatcherOptions& options) {
  if (queued == 0) return true;
  const std::size_t reserve = options.max_queued_instances / 8;
  const std::size_t heavy_limit = options.max_queued_instances - reserve;
  // A request over one batch stops at seven eighths, or, were it large, at its own size and the
  // last eighth (a large request held to seven eighths would wait for an empty queue, which
  // steady light traffic never leaves; and a larger one never finds room a smaller one lacks).
  const std::size_t limit =
      n > options.max_batch_instances
          ? std::min(options.max_queued_instances, std::max(heavy_limit, n + reserve))
          : options.max_queued_instances;
  return queued + n <= limit;
}

bool MicroBatcher::submit(std::shared_ptr<const dataset::InstanceBlock> instances, Done done) {
  const std::size_t n = instances->size();
  {
    MutexLock lock(mu_);
    if (stopping_ || !queue_admits(queued_instances_, n, options_)) return false;
    queued_instances_ += n;
    queue_.push_back(
        Pending{std::move(instances), std::move(done), std::chrono::steady_clock::now()});
    metrics_->predict_queued();  // after the push: a push that throws counted nothing
  }
  wake_.notify_one();
  return true;
}

void MicroBatcher::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
}

void MicroBatcher::run() {
  std::vector<Pending> taken;
  for (;;) {
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) wake_.wait(lock);
      if (queue_.empty()) return;  // stopping, nothing left
      // Wait for more requests until the batch is full or the oldest has waited max_wait.
      const auto deadline = queue_.front().arrived + options_.max_wait;
      while (!stopping_ && queued_instances_ < options_.max_batch_instances &&
             wake_.wait_until(lock, deadline) != std::cv_status::timeout) {
      }
      std::size_t instances = 0;
      while (!queue_.empty()) {
        const std::size_t n = queue_.front().instances->size();
        if (!taken.empty() && instances + n > options_.max_batch_instances) break;
        instances += n;
        taken.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_instances_ -= instances;
    }
    run_batch(taken);
    taken.clear();
  }
}

void MicroBatcher::run_batch(std::vector<Pending>& taken) {
  std::vector<dataset::InstanceRef> refs;
  for (const Pending& p : taken) {
    for (std::size_t i = 0; i < p.instances->size(); ++i) refs.push_back(p.instances->instance(i));
  }
  dataset::Batch batch;
  std::vector<float> predictions;
  Status status;
  try {
    dataset::assemble_batch(refs.data(), refs.size(), num_slots_, dense_dim_, &batch);
    predictor_.predict(batch, &predictions);
  } catch (const std::exception& e) {
    status = Status::Internal("prediction failed: " + user_message(e));
  }
  metrics_->record_batch(taken.size(), refs.size());
  std::size_t at = 0;
  for (Pending& p : taken) {
    const std::size_t n = p.instances->size();
    std::vector<float> own;
    if (status.ok()) own.assign(predictions.begin() + at, predictions.begin() + at + n);
    at += n;
    metrics_->predict_done();
    p.done(status, std::move(own));
  }
}

}  // namespace gpubox::serving
