// gpubox_serve --model DIR [--port P] [--bind IP] [--threads N] ...
//
// Serves a model exported by `gpubox_train --mode export` over HTTP/1.1 (http_server.hpp):
// POST /predict, GET /health, GET /metrics. Binds loopback unless --bind says otherwise (there
// is no authentication: put a proxy in front of it for other hosts). SIGTERM, SIGINT or SIGHUP
// stops it gracefully: no new connection, the requests in flight are answered, then it exits 0.
#include <gflags/gflags.h>
#include <signal.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "common/cli.hpp"
#include "common/cli_flags.hpp"
#include "common/enum_names.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "heterps/device/card.hpp"
#include "serving/http_server.hpp"
#include "serving/serving_model.hpp"

// Every numeric flag's range is declared next to it and checked by the front end
// (common/cli_flags.hpp), which names the flag and its range when a value is outside it.
DEFINE_string(model, "", "folder written by gpubox_train --mode export; required");
DEFINE_int32(port, 29080, "TCP port (0: any free port; the listening line says which)");
GPUBOX_FLAG_RANGE(port, 0, 65535);
DEFINE_string(bind, "127.0.0.1", "address to listen on (loopback by default)");
DEFINE_int32(threads, 2, "HTTP threads (request parsing and responses)");
GPUBOX_FLAG_RANGE(threads, 1, 1024);
DEFINE_string(precision, "",
              "the dense net's precision, fp32 or bf16 (bf16 runs in fp32, logged, where the "
              "card has no bf16 GEMMs); empty: the one the model was trained in (its MANIFEST)");
GPUBOX_FLAG_KEY(precision, "hyper_parameters.dense_precision");  // its choices, checked
DEFINE_int32(card_threads, 0, "cpu build: host threads of the model's card (0 = cores)");
GPUBOX_FLAG_RANGE(card_threads, 0, 4096);
DEFINE_int32(max_body_kb, 1024, "largest request body in KiB (413 past it)");
GPUBOX_FLAG_RANGE(max_body_kb, 1, 1 << 20);  // 1 GiB
DEFINE_int32(max_instances, 4096, "most instances in one request (413 past it)");
GPUBOX_FLAG_RANGE(max_instances, 1, 1 << 24);
DEFINE_int32(max_connections, 256, "connections served at once; more are answered 503 and closed");
GPUBOX_FLAG_RANGE(max_connections, 1, 1 << 20);
DEFINE_int32(idle_timeout_s, 30, "a connection idle this long is closed");
GPUBOX_FLAG_RANGE(idle_timeout_s, 1, 1000000);
DEFINE_int32(batch_max_instances, 256, "micro-batch: most instances in one model batch");
GPUBOX_FLAG_RANGE(batch_max_instances, 1, 1 << 24);
DEFINE_int32(batch_wait_us, 1000,
             "micro-batch: longest wait for more requests after the oldest queued one arrived");
GPUBOX_FLAG_RANGE(batch_wait_us, 0, 10000000);  // 10 s
DEFINE_int32(max_queued_instances, 65536, "instances waiting at most (503 past it)");
GPUBOX_FLAG_RANGE(max_queued_instances, 1, 1 << 30);
DEFINE_int32(drain_timeout_s, 10, "on SIGTERM: longest wait for the requests in flight");
GPUBOX_FLAG_RANGE(drain_timeout_s, 0, 1000000);

namespace {

bool is_loopback(const std::string& address) {
  return address == "127.0.0.1" || address == "::1" || address.rfind("127.", 0) == 0;
}

std::string usage_text() {
  gpubox::cli::Usage u;
  u.synopsis =
      "gpubox_serve --model DIR [--port P] [--bind IP] [--threads N] [--precision fp32|bf16] "
      "[options]";
  u.summary =
      "Serves a model exported by gpubox_train --mode export over HTTP/1.1: POST /predict, GET "
      "/health, GET /metrics. Binds loopback unless --bind says otherwise (no authentication: "
      "put a proxy in front of it for other hosts). SIGTERM, SIGINT or SIGHUP stops it "
      "gracefully.";
  u.options = gpubox::cli::gflags_options(__FILE__);
  u.options.push_back({"--help, -h", "", "print this text and exit"});
  u.options.push_back({"--version", "", "print the version, commit and backend and exit"});
  u.examples = {"gpubox_serve --model serving_model --port 29080"};
  return gpubox::cli::render_usage(u);
}

}  // namespace

int main(int argc, char** argv) {
  gpubox::device::use_passive_cpu_waits(argv);
  // The one front end (common/cli_args.hpp): flags, --help, --version, every range checked.
  gpubox::cli::CommandSpec spec;
  spec.tool = "gpubox_serve";
  spec.flags = gpubox::cli::gflags_flag_specs(__FILE__);
  spec.usage = usage_text;
  const gpubox::cli::CommandLine line = gpubox::cli::parse_gflags_command_line(spec, argc, argv);
  if (line.exit_code) return *line.exit_code;
  if (FLAGS_model.empty()) {
    std::fprintf(stderr,
                 "gpubox_serve: --model is required (a gpubox_train --mode export folder)\n");
    return 2;
  }
  std::optional<gpubox::trainer::DensePrecision> precision;  // a value given was checked above
  if (!FLAGS_precision.empty()) {
    precision = gpubox::parse_enum(gpubox::trainer::kDensePrecisionNames, FLAGS_precision).value();
  }
  // SIGTERM and SIGINT are taken by sigwait below: blocked here, before any thread starts, so
  // every thread inherits the mask and none of them is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  // A closed terminal's SIGHUP ended the process at once (exit 129), the requests in flight
  // unanswered: it stops as SIGTERM does (there is no reload). Not when started ignoring it
  // (nohup): a blocked signal is delivered to sigwait even when its action is to ignore it.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) != 0 || hup.sa_handler != SIG_IGN) {
    sigaddset(&stop_signals, SIGHUP);
  }
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    auto model = gpubox::serving::ServingModel::load(FLAGS_model);
    if (!model.ok()) {
      std::fprintf(stderr, "gpubox_serve: %s\n", model.status().to_string().c_str());
      return 1;
    }
    gpubox::serving::ServerOptions options;
    options.bind = FLAGS_bind;
    options.port = static_cast<uint16_t>(FLAGS_port);
    options.threads = FLAGS_threads;
    options.card_threads = FLAGS_card_threads;
    options.precision = precision;
    options.max_body_bytes = static_cast<std::size_t>(FLAGS_max_body_kb) << 10;
    options.max_instances = static_cast<std::size_t>(FLAGS_max_instances);
    options.max_connections = static_cast<std::size_t>(FLAGS_max_connections);
    options.idle_timeout = std::chrono::seconds(FLAGS_idle_timeout_s);
    options.drain_timeout = std::chrono::seconds(FLAGS_drain_timeout_s);
    options.batcher.max_batch_instances = static_cast<std::size_t>(FLAGS_batch_max_instances);
    options.batcher.max_wait = std::chrono::microseconds(FLAGS_batch_wait_us);
    options.batcher.max_queued_instances = static_cast<std::size_t>(FLAGS_max_queued_instances);
    gpubox::serving::PredictionServer server(model.value(), options);
    if (const gpubox::Status started = server.start(); !started.ok()) {
      std::fprintf(stderr, "gpubox_serve: %s\n", started.to_string().c_str());
      return 1;
    }
    if (!is_loopback(FLAGS_bind)) {
      GPUBOX_LOG(WARNING) << "gpubox_serve listens on " << FLAGS_bind
                          << ", not loopback: it has no authentication, anyone who can reach "
                             "the port can query the model";
    }
    std::printf(
        "gpubox_serve: listening on %s:%u (model %s: %zu rows, %zu dense parameters, trained "
        "in %s, served in %s)\n",
        FLAGS_bind.c_str(), static_cast<unsigned>(server.port()), FLAGS_model.c_str(),
        model->rows(), model->dense_values().size(),
        name_of(gpubox::trainer::kDensePrecisionNames, model->spec().model.precision),
        name_of(gpubox::trainer::kDensePrecisionNames, server.precision()));
    std::fflush(stdout);
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    std::printf("gpubox_serve: %s received, stopping\n", signal_number == SIGTERM  ? "SIGTERM"
                                                         : signal_number == SIGHUP ? "SIGHUP"
                                                                                   : "SIGINT");
    std::fflush(stdout);
    server.request_stop();
    server.wait();
    std::printf("gpubox_serve: stopped\n");
    return 0;
  } catch (const std::exception& e) {
    gpubox::report_top_level("gpubox_serve", e);
    return 1;
  }
}
