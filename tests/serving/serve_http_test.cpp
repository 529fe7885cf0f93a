// gpubox_serve's HTTP server on the model the suite trains (serve_test_fixture.hpp): concurrent
// requests micro-batched, each with its own predictions; /health, the /metrics counters, every
// 4xx; connections past the limit refused; a graceful stop that answers the request in flight;
// and the binaries: gpubox_train --mode export, then gpubox_serve stopped by SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "serving/http_server.hpp"
#include "serving/serving_model.hpp"
#include "tests/serving/http_client.hpp"
#include "tests/serving/serve_test_fixture.hpp"

namespace gpubox::serving {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using serve_test::config_overrides;
using serve_test::parse_predictions;
using serve_test::Serving;
using testing::HttpClient;
using testing::HttpReply;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(Serving, ConcurrentRequestsAreMicroBatched) {
  ServerOptions o = options();
  o.batcher.max_wait = std::chrono::milliseconds(300);
  o.batcher.max_batch_instances = 64;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  const std::vector<std::string> lines = test_lines();
  constexpr int kClients = 8;
  std::vector<std::vector<float>> got(kClients);
  std::atomic<int> ready{0};  // every client connected before any sends
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      HttpClient client(server.port());
      client.connect();
      ready.fetch_add(1);
      while (ready.load() < kClients) std::this_thread::yield();
      const std::string body = lines[static_cast<std::size_t>(c) * 2] + "\n" +
                               lines[static_cast<std::size_t>(c) * 2 + 1] + "\n";
      const HttpReply reply = client.send(http::verb::post, "/predict", body, "text/plain");
      if (reply.status == 200) got[static_cast<std::size_t>(c)] = parse_predictions(reply.body);
    });
  }
  for (auto& t : clients) t.join();
  for (int c = 0; c < kClients; ++c) {
    ASSERT_EQ(got[static_cast<std::size_t>(c)].size(), 2u) << c;
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(got[static_cast<std::size_t>(c)][i],
                  (*infer_)[static_cast<std::size_t>(c) * 2 + i], 1e-6);
    }
  }
  // 8 requests inside one 300 ms window: fewer batches than requests.
  EXPECT_LT(server.metrics().batches(), static_cast<uint64_t>(kClients));
  const std::string metrics = server.metrics().render_prometheus();
  EXPECT_NE(metrics.find("gpubox_serve_batched_requests_total 8\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpubox_serve_instances_total 16\n"), std::string::npos) << metrics;
}

TEST_F(Serving, HealthMetricsAndClearErrors) {
  ServerOptions o = options();
  o.max_body_bytes = 4096;
  o.max_instances = 3;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  HttpClient client(server.port());
  HttpReply r = client.send(http::verb::get, "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"status\": \"ok\""), std::string::npos);
  EXPECT_NE(r.body.find("\"rows\": " + std::to_string(model_->rows())), std::string::npos);

  const std::string line = test_lines()[0];
  r = client.send(http::verb::post, "/predict", line, "text/plain");
  EXPECT_EQ(r.status, 200) << r.body;
  r = client.send(http::verb::post, "/predict", "{\"instances\": [", "application/json");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("invalid JSON"), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict", R"({"slots": {"42": [1]}, "dense": [0, 0, 0]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown slot \\\"42\\\""), std::string::npos) << r.body;
  // A dense value past float's range, and a repeated key: 400 naming them, not a prediction.
  r = client.send(http::verb::post, "/predict", R"({"slots": {}, "dense": [0, 3.5e38, 0]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("dense value 1 (3.5e+38)"), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict",
                  R"({"slots": {}, "dense": [0, 0, 0], "dense": [1, 1, 1]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("duplicate JSON key \\\"dense\\\""), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict", "click:1 7:5", "text/plain");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("line 1: unknown slot in '7:5'"), std::string::npos) << r.body;
  r = client.send(http::verb::post, "/predict",
                  line + "\n" + line + "\n" + line + "\n" + line + "\n", "text/plain");
  EXPECT_EQ(r.status, 413) << r.body;
  r = client.send(http::verb::get, "/predict");
  EXPECT_EQ(r.status, 405);
  r = client.send(http::verb::get, "/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(r.keep_alive);  // a clean 4xx keeps the connection
  r = client.send(http::verb::post, "/predict", std::string(5000, ' '), "text/plain");
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("over --max_body_kb"), std::string::npos) << r.body;
  HttpClient raw(server.port());
  r = raw.send_raw("GARBAGE / HTTP/9\r\n\r\n");
  EXPECT_EQ(r.status, 400) << r.error;

  HttpClient scraper(server.port());
  r = scraper.send(http::verb::get, "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.content_type.find("text/plain; version=0.0.4"), std::string::npos);
  for (const char* line_want :
       {"gpubox_serve_requests_total{path=\"/predict\",code=\"200\"} 1\n",
        "gpubox_serve_requests_total{path=\"/predict\",code=\"400\"} 5\n",
        "gpubox_serve_requests_total{path=\"/predict\",code=\"413\"} 2\n",
        "gpubox_serve_requests_total{path=\"/predict\",code=\"405\"} 1\n",
        "gpubox_serve_requests_total{path=\"other\",code=\"404\"} 1\n",
        "gpubox_serve_requests_total{path=\"other\",code=\"400\"} 1\n",
        "gpubox_serve_requests_total{path=\"/health\",code=\"200\"} 1\n",
        "gpubox_serve_errors_total 10\n", "gpubox_serve_predict_seconds_count 9\n",
        "gpubox_serve_predict_seconds_bucket{le=\"+Inf\"} 9\n", "gpubox_serve_instances_total 1\n",
        "gpubox_serve_predict_waiting 0\n", "gpubox_serve_model_rows "}) {
    EXPECT_NE(r.body.find(line_want), std::string::npos) << line_want << " in\n" << r.body;
  }
}

TEST_F(Serving, ConnectionsPastTheLimitAreRefused) {
  ServerOptions o = options();
  o.max_connections = 2;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  HttpClient a(server.port()), b(server.port()), c(server.port());
  EXPECT_EQ(a.send(http::verb::get, "/health").status, 200);
  EXPECT_EQ(b.send(http::verb::get, "/health").status, 200);
  const HttpReply refused = c.send(http::verb::get, "/health");
  EXPECT_EQ(refused.status, 503) << refused.error;
  EXPECT_NE(refused.body.find("too many connections"), std::string::npos);
  EXPECT_NE(server.metrics().render_prometheus().find("gpubox_serve_connections_refused_total 1\n"),
            std::string::npos);
  // A connection that closes frees its place (when the server's read sees the end: waited for,
  // up to 30 s on a loaded machine).
  a.socket().close();
  for (int i = 0; i < 3000 && server.metrics().connections_open() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_LE(server.metrics().connections_open(), 1u) << "the closed connection's place not freed";
  HttpClient d(server.port());
  EXPECT_EQ(d.send(http::verb::get, "/health").status, 200);
}

// request_stop() (what SIGTERM does): the request in flight is answered, then nothing listens.
TEST_F(Serving, StopAnswersTheRequestInFlightThenStopsListening) {
  ServerOptions o = options();
  // The request waits in the batcher well past the stop below (which lets it run at its time,
  // under the drain timeout, then closes its connection).
  o.batcher.max_wait = std::chrono::seconds(3);
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  const uint16_t port = server.port();
  HttpClient idle(port);
  ASSERT_EQ(idle.send(http::verb::get, "/health").status, 200);  // an idle keep-alive connection
  HttpReply in_flight;
  std::thread client([&] {
    HttpClient c(port);
    in_flight = c.send(http::verb::post, "/predict", test_lines()[0], "text/plain");
  });
  // Stopped once the request is in the batcher (max_wait keeps it there): a stop before the
  // request was read would close its connection as idle.
  for (int i = 0; i < 6000 && server.metrics().predict_waiting() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server.metrics().predict_waiting(), 1) << "the request never reached the batcher";
  server.request_stop();
  server.wait();
  client.join();
  EXPECT_EQ(in_flight.status, 200) << in_flight.error;
  EXPECT_EQ(server.metrics().predict_waiting(), 0);
  EXPECT_FALSE(in_flight.keep_alive);
  EXPECT_NEAR(parse_predictions(in_flight.body).at(0), (*infer_)[0], 1e-6);
  EXPECT_EQ(idle.send(http::verb::get, "/health").status, 0);  // closed
  HttpClient late(port);
  EXPECT_FALSE(late.connect());
}

// A request part-way received when the stop comes is read to its end and answered (it was
// closed as idle, the client told nothing); a connection that has sent nothing is closed.
TEST_F(Serving, StopAnswersARequestPartWayReceived) {
  PredictionServer server(*model_, options());
  ASSERT_TRUE(server.start().ok());
  const uint16_t port = server.port();
  HttpClient idle(port);
  ASSERT_TRUE(idle.connect());
  HttpClient part(port);
  ASSERT_TRUE(part.connect());
  const std::string body = test_lines()[0];
  const std::string head =
      "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  const std::string first = head + body.substr(0, body.size() / 2);
  boost::asio::write(part.socket(), boost::asio::buffer(first));
  // The server has the first half when the stop comes (its read holds it, or has parsed it).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server.request_stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const HttpReply answered = part.send_raw(body.substr(body.size() / 2));
  server.wait();
  EXPECT_EQ(answered.status, 200) << answered.error;
  EXPECT_FALSE(answered.keep_alive);
  EXPECT_NEAR(parse_predictions(answered.body).at(0), (*infer_)[0], 1e-6);
  EXPECT_EQ(idle.send(http::verb::get, "/health").status, 0);  // closed
}

// "Expect: 100-continue" (curl sends it with bodies over 1 MiB, then waits a second for the
// interim answer): answered 100 before the body comes, then the request as any; a body over
// max_body_bytes is answered 413 at once, with no 100 (the client need not send it).
TEST_F(Serving, ExpectContinueIsAnsweredBeforeTheBody) {
  ServerOptions o = options();
  o.max_body_bytes = 64 * 1024;
  PredictionServer server(*model_, o);
  ASSERT_TRUE(server.start().ok());
  const std::string body = test_lines()[0];
  const auto head = [](std::size_t length) {
    return "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nExpect: "
           "100-continue\r\nContent-Length: " +
           std::to_string(length) + "\r\n\r\n";
  };
  HttpClient client(server.port(), "127.0.0.1", std::chrono::seconds(5));
  const HttpReply interim = client.send_raw(head(body.size()));
  ASSERT_EQ(interim.status, 100) << interim.error;
  const HttpReply answered = client.send_raw(body);
  ASSERT_EQ(answered.status, 200) << answered.error << answered.body;
  EXPECT_NEAR(parse_predictions(answered.body).at(0), (*infer_)[0], 1e-6);
  HttpClient large(server.port(), "127.0.0.1", std::chrono::seconds(5));
  const HttpReply refused = large.send_raw(head(o.max_body_bytes + 1));
  EXPECT_EQ(refused.status, 413) << refused.error;
  server.request_stop();
  server.wait();
}

// The queue's last eighth is kept for requests of one batch or less: requests over one batch (a
// heavy client's) stop at seven eighths, small ones fill it; an empty queue takes any request.
TEST(MicroBatcherQueue, ItsLastEighthIsKeptForRequestsOfOneBatch) {
  BatcherOptions o;
  o.max_batch_instances = 8;
  o.max_queued_instances = 64;  // seven eighths: 56
  EXPECT_TRUE(queue_admits(0, 1000, o));
  EXPECT_TRUE(queue_admits(40, 16, o));   // 56
  EXPECT_FALSE(queue_admits(41, 16, o));  // 57: past 56 for a heavy request
  EXPECT_TRUE(queue_admits(56, 8, o));    // one batch: the last eighth is its
  EXPECT_TRUE(queue_admits(63, 1, o));
  EXPECT_FALSE(queue_admits(63, 2, o));  // past the whole queue
  EXPECT_FALSE(queue_admits(57, 9, o));
  // Over seven eighths on its own: the whole queue, not only an empty one (light traffic never
  // leaves it empty).
  EXPECT_TRUE(queue_admits(4, 60, o));
  EXPECT_FALSE(queue_admits(5, 60, o));
  // Large ones at their size and the last eighth: a larger request never finds room a smaller
  // one lacks (one of 56 was refused behind 1 where one of 57 was taken behind 7).
  EXPECT_TRUE(queue_admits(8, 56, o));
  EXPECT_FALSE(queue_admits(9, 56, o));
  EXPECT_TRUE(queue_admits(7, 57, o));
  for (std::size_t n = 9; n < 64; ++n) {
    for (std::size_t queued = 1; queued < 64; ++queued) {
      if (queue_admits(queued, n + 1, o)) {
        EXPECT_TRUE(queue_admits(queued, n, o)) << queued << " " << n;
      }
    }
  }
}

// A child process; its stdout is read through a pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out >= 0) ::close(out);
  }
  // Reads stdout until `marker` appears (true) or `seconds` pass / the child exits (false).
  bool read_until(const std::string& marker, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (text.find(marker) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[512];
      const ssize_t k = ::read(out, buf, sizeof(buf));
      if (k <= 0) return text.find(marker) != std::string::npos;
      text.append(buf, static_cast<std::size_t>(k));
    }
    return true;
  }
};

Child spawn(const std::vector<std::string>& args, const fs::path& log) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  Child child;
  child.pid = ::fork();
  if (child.pid == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    ::close(pipe_fds[0]);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  child.out = pipe_fds[0];
  return child;
}

TEST_F(Serving, BinariesExportThenServeUntilSigterm) {
  const fs::path out = root_ / "export_by_binary";
  std::vector<std::string> train = {
      GPUBOX_TRAIN_BIN,          "--config", config_path_, "--mode", "export", "--load",
      (root_ / "save").string(), "--out",    out.string()};
  for (const auto& o : config_overrides(root_)) {
    train.push_back("-o");
    train.push_back(o);
  }
  {
    Child exporter = spawn(train, root_ / "export.log");
    ASSERT_TRUE(exporter.read_until("parameters (trained in fp32)", 60))
        << exporter.text << read_text(root_ / "export.log");
    int status = 0;
    ASSERT_EQ(::waitpid(exporter.pid, &status, 0), exporter.pid);
    exporter.pid = -1;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_text(root_ / "export.log");
  }
  Child serve =
      spawn({GPUBOX_SERVE_BIN, "--model", out.string(), "--port", "0", "--card_threads", "1"},
            root_ / "serve.log");
  ASSERT_TRUE(serve.read_until("\n", 60)) << read_text(root_ / "serve.log");
  const auto at = serve.text.find("listening on 127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << serve.text << read_text(root_ / "serve.log");
  EXPECT_NE(serve.text.find("trained in fp32, served in fp32)"), std::string::npos) << serve.text;
  const uint16_t port = static_cast<uint16_t>(std::stoi(serve.text.substr(at + 23)));
  HttpClient client(port);
  EXPECT_EQ(client.send(http::verb::get, "/health").status, 200);
  const HttpReply reply = client.send(http::verb::post, "/predict", test_lines()[3], "text/plain");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_NEAR(parse_predictions(reply.body).at(0), (*infer_)[3], 1e-6);
  ASSERT_EQ(::kill(serve.pid, SIGTERM), 0);
  EXPECT_TRUE(serve.read_until("gpubox_serve: stopped", 20)) << serve.text;
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = ::waitpid(serve.pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(done, serve.pid) << "gpubox_serve did not exit within 10 s of SIGTERM";
  serve.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // SIGHUP (a closed terminal) stops it the same way (it exited 129 at once).
  Child hung =
      spawn({GPUBOX_SERVE_BIN, "--model", out.string(), "--port", "0", "--card_threads", "1"},
            root_ / "serve_hup.log");
  ASSERT_TRUE(hung.read_until("\n", 60)) << read_text(root_ / "serve_hup.log");
  ASSERT_EQ(::kill(hung.pid, SIGHUP), 0);
  EXPECT_TRUE(hung.read_until("gpubox_serve: stopped", 20)) << hung.text;
  EXPECT_NE(hung.text.find("SIGHUP received, stopping"), std::string::npos) << hung.text;
  done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = ::waitpid(hung.pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(done, hung.pid) << "gpubox_serve did not exit within 10 s of SIGHUP";
  hung.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Started under nohup (SIGHUP ignored): a SIGHUP leaves it serving.
  Child kept = spawn({"/usr/bin/nohup", GPUBOX_SERVE_BIN, "--model", out.string(), "--port", "0",
                      "--card_threads", "1"},
                     root_ / "serve_nohup.log");
  ASSERT_TRUE(kept.read_until("\n", 60)) << read_text(root_ / "serve_nohup.log");
  const auto kept_at = kept.text.find("listening on 127.0.0.1:");
  ASSERT_NE(kept_at, std::string::npos) << kept.text << read_text(root_ / "serve_nohup.log");
  ASSERT_EQ(::kill(kept.pid, SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(::waitpid(kept.pid, &status, WNOHANG), 0) << "gpubox_serve under nohup ended on SIGHUP";
  HttpClient kept_client(static_cast<uint16_t>(std::stoi(kept.text.substr(kept_at + 23))));
  EXPECT_EQ(kept_client.send(http::verb::get, "/health").status, 200);
  EXPECT_EQ(read_text(root_ / "serve_nohup.log").find("SIGHUP received"), std::string::npos);
  ASSERT_EQ(::kill(kept.pid, SIGTERM), 0);
  EXPECT_TRUE(kept.read_until("gpubox_serve: stopped", 20)) << kept.text;
}

// --precision bf16 asked of a model trained in fp32 is served in bf16 where the CPU has bf16
// GEMMs, else in fp32 with the trainer's log line. (An unknown value: cli_rules_test.)
TEST_F(Serving, BinaryServesInThePrecisionAsked) {
  Child serve = spawn({GPUBOX_SERVE_BIN, "--model", (root_ / "export").string(), "--port", "0",
                       "--card_threads", "1", "--precision", "bf16"},
                      root_ / "serve_bf16.log");
  ASSERT_TRUE(serve.read_until("\n", 60)) << read_text(root_ / "serve_bf16.log");
  const std::string log = read_text(root_ / "serve_bf16.log");
  if (serve.text.find("trained in fp32, served in fp32)") != std::string::npos) {
    EXPECT_NE(log.find("has no bf16 GEMMs in hardware"), std::string::npos) << log;
  } else {
    EXPECT_NE(serve.text.find("trained in fp32, served in bf16)"), std::string::npos)
        << serve.text << log;
  }
}

}  // namespace
}  // namespace gpubox::serving
