// PredictionServer: gpubox_serve's HTTP/1.1 front (Boost.Beast over Asio, keep-alive).
//   POST /predict   body: JSON or slot text (request_parser.hpp) -> {"predictions": [p, ...]}
//   GET  /health    {"status": "ok", "rows": R, "dense_parameters": D, "precision": "fp32"|"bf16"}
//                   (what the dense net computes in; 503 while stopping)
//   GET  /metrics   Prometheus text (serve_metrics.hpp)
// Bad input gets a 4xx with {"error": "..."}: 400 (unparsable request, bad JSON, unknown slot,
// bad key or dense value), 404 (another path), 405 (another method), 413 (body over
// max_body_bytes, or more than max_instances instances), 503 (the batch queue is full). Each
// connection is bounded (header 8 KiB, body max_body_bytes, idle_timeout), and connections
// past max_connections are answered 503 and closed at once.
//
// Stop: request_stop() (any thread, e.g. a SIGTERM handler) closes the listening socket and the
// idle connections; requests being served are answered (with Connection: close), queued
// predictions run; wait() returns when that is done or drain_timeout has passed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.hpp"
#include "serving/micro_batcher.hpp"
#include "serving/serve_metrics.hpp"
#include "serving/serving_model.hpp"

namespace gpubox::serving {

struct ServerOptions {
  std::string bind = "127.0.0.1";
  uint16_t port = 0;     // 0: an ephemeral port (port() says which)
  int threads = 2;       // HTTP threads (parsing, responses)
  int card_threads = 0;  // cpu backend: host threads of the model's card (0 = cores)
  // The dense net's precision; unset: the one the MANIFEST records (Predictor).
  std::optional<trainer::DensePrecision> precision;
  std::size_t max_body_bytes = std::size_t{1} << 20;
  std::size_t max_instances = 4096;  // per request
  std::size_t max_connections = 256;
  std::chrono::milliseconds idle_timeout{30000};
  std::chrono::milliseconds drain_timeout{10000};
  BatcherOptions batcher;
};

class PredictionServer {
 public:
  // Builds the predictor (throws gpubox::Error when the model's dense parameters do not fit
  // the model its MANIFEST describes). `model` must outlive the server.
  PredictionServer(const ServingModel& model, ServerOptions options);
  ~PredictionServer();
  PredictionServer(const PredictionServer&) = delete;
  PredictionServer& operator=(const PredictionServer&) = delete;

  // Binds and starts serving on options.threads threads. An address or port that cannot be
  // bound is an error naming it.
  Status start();
  uint16_t port() const;
  void request_stop();
  // Blocks until request_stop() was called and the server has drained (or drain_timeout).
  void wait();
  ServeMetrics& metrics();
  // What the dense net computes in (Predictor::precision).
  trainer::DensePrecision precision() const;

  // The server's state, shared with its connections (http_server.cpp only).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpubox::serving
