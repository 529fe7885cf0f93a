// How a parameter-server job ends when something fails: a dead server or trainer (also one dead
// within a sync step) ends it with an error naming it within its timeout, a failed dense exchange
// left at the end is logged naming the server, data without a valid instance is an error in every
// mode, a diverged job stops on every trainer before its save, and so does a job whose network's
// output died (neither trainer reported failed by the other's watch); a save that fails and is
// not repaired ends the job with its pass line logged; a trainer that fails for good is reported
// failed by the others' watches, naming what it reported.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/log_sink.hpp"
#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/generator.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "table/sparse_table.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/forwarding_schedule.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_parameters.hpp"
#include "trainer/ps_modes/geo_rows.hpp"
#include "trainer/ps_modes/job_steady_loss.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

using ps_test::PsModes;

// A server that dies mid-job: the trainer's next call fails after runner.server_timeout_s,
// naming the server, never a hang.
TEST_F(PsModes, ADeadServerEndsTheJobWithAnErrorNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=async", "runner.server_timeout_s=1"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  const auto train = data_files((root_ / "train").string());
  trainer.train_pass(train);
  shards.stop(1);
  const auto started = std::chrono::steady_clock::now();
  try {
    trainer.train_pass(train);
    ADD_FAILURE() << "a pass against a dead server succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string dead = shards.endpoints().substr(shards.endpoints().find(',') + 1);
    EXPECT_NE(what.find(dead), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

// An async dense exchange still under way when its worker is destroyed (a step threw before the
// pass's last sync_dense took it) that then fails is logged naming the server, not dropped.
TEST_F(PsModes, AFailedDenseExchangeLeftAtTheEndIsLoggedNamingTheServer) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  Servers shards(cfg, 1);
  table::server::RemoteHostTierOptions options;
  options.endpoints = shards.endpoints();
  options.config = cfg.sparse;
  options.deadline_s = 1.0;
  options.connect_timeout_s = 0.5;
  auto servers = table::server::RemoteHostTier::connect(std::move(options));
  throw_if_error(servers.status());
  device::Card card(0, 0, 0, 1);
  auto worker = std::make_unique<PsWorker>(card, **servers, cfg);
  worker->sync_dense(0.0f);  // the servers' dense table
  shards.stop(0);
  worker->exchange_dense();  // fails on its own thread: nothing takes its status
  ::testing::internal::CaptureStderr();
  worker.reset();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("the dense exchange under way when the thread stopped failed"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(shards.endpoints()), std::string::npos) << log;
}

// In sync mode a trainer that stops coming ends the others' job at the next barrier, after
// runner.collective_timeout_s, with an error naming it.
TEST_F(PsModes, ADeadTrainerEndsASyncJobWithAnErrorNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=sync", "runner.collective_timeout_s=1"});
  Servers shards(cfg, 1);
  const auto train = data_files((root_ / "train").string());
  std::string error;
  std::thread survivor([&] {
    try {
      TrainerEnv env;
      env.servers = shards.endpoints();
      env.trainers = 2;
      PsTrainer trainer(cfg, env);
      trainer.train_pass(train);
      trainer.train_pass(train);  // trainer 1 is gone by now
    } catch (const Error& e) {
      error = e.what();
    }
  });
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.trainers = 2;
    env.trainer_id = 1;
    PsTrainer trainer(cfg, env);
    trainer.train_pass(train);
  }  // trainer 1 dies after its first pass
  const auto started = std::chrono::steady_clock::now();
  survivor.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(error.find("missing: trainer 1"), std::string::npos) << error;
  EXPECT_NE(error.find("runner.collective_timeout_s"), std::string::npos) << error;
}

// A sync trainer that dies between a step's pull barrier and its step barrier (its push made,
// here thrown by its progress callback, which runs on trainer 0 between the two) ends the
// other's job at that step's barrier after runner.collective_timeout_s, naming it and the step.
TEST_F(PsModes, ATrainerDeadWithinASyncStepEndsTheJobNamingItAndTheStep) {
  constexpr std::size_t kDeathStep = 3;  // from 0
  const TrainerConfig cfg = config({"runner.sync_mode=sync", "runner.collective_timeout_s=1",
                                    "runner.thread_num=2", "runner.print_interval=1"});
  Servers shards(cfg, 1);
  const auto train = data_files((root_ / "train").string());
  std::string error;
  std::thread survivor([&] {
    try {
      TrainerEnv env;
      env.servers = shards.endpoints();
      env.trainers = 2;
      env.trainer_id = 1;
      PsTrainer trainer(cfg, env);
      trainer.train_pass(train);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::string death;
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.trainers = 2;
    PsTrainer trainer(cfg, env);
    StepHooks hooks;
    hooks.on_progress = [&](const StepProgress& progress) {
      if (progress.step == kDeathStep + 1) GPUBOX_FAIL("trainer 0 dies after step ", kDeathStep);
    };
    trainer.set_step_hooks(hooks);
    try {
      trainer.train_pass(train);
    } catch (const Error& e) {
      death = e.what();
    }
  }
  const auto started = std::chrono::steady_clock::now();
  survivor.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(death.find("trainer 0 dies after step 3"), std::string::npos) << death;
  EXPECT_NE(error.find("pass 0, step 3:"), std::string::npos) << error;
  EXPECT_NE(error.find("missing: trainer 0"), std::string::npos) << error;
  EXPECT_NE(error.find("runner.collective_timeout_s=1"), std::string::npos) << error;
}

// Data whose every line is malformed (here PaddleRec's slot_dnn lines, which start with a show
// field the config does not name) trains nothing: every PS mode and both readers end with the
// same error naming the file and why its lines were skipped, and write no save.
TEST_F(PsModes, DataWithoutAValidInstanceIsAnErrorInEveryMode) {
  const fs::path bad = root_ / "all_malformed";
  fs::create_directories(bad);
  {
    std::ofstream out(bad / "part-0");
    for (int i = 0; i < 10; ++i) out << "1 0 1:" << 100 + i << " 2:" << 200 + i << "\n";
  }
  for (const char* mode : {"async", "sync", "geo"}) {
    for (const char* reader : {"InmemoryDataset", "QueueDataset"}) {
      const fs::path saves = root_ / (std::string("malformed_saves_") + mode + reader);
      const TrainerConfig cfg =
          config({"runner.train_data_dir=" + bad.string(),
                  "runner.test_data_dir=", std::string("runner.sync_mode=") + mode,
                  std::string("runner.reader_type=") + reader, "runner.save_mode=base",
                  "runner.model_save_path=" + saves.string()});
      Servers shards(cfg, 1);
      TrainerEnv env;
      env.servers = shards.endpoints();
      PsTrainer trainer(cfg, env);
      try {
        trainer.train();
        ADD_FAILURE() << mode << " " << reader << " trained on nothing";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("pass 0: no valid instance in 1 file(s) (10 lines, 10 malformed): " +
                            (bad / "part-0").string()),
                  std::string::npos)
            << mode << " " << reader << ": " << what;
      }
      EXPECT_FALSE(fs::exists(saves / "0")) << mode << " " << reader;
    }
  }
}

// Two trainers of one job (threads of this process) train `cfg` against one in-process server:
// each one's error ("" for none) and pass reports, and the lines logged as errors meanwhile.
struct TwoTrainers {
  std::vector<std::string> errors = std::vector<std::string>(2);
  std::vector<std::vector<PassReport>> reports = std::vector<std::vector<PassReport>>(2);
  std::vector<std::string> error_lines;
};
TwoTrainers train_two_trainers(const TrainerConfig& cfg) {
  Servers shards(cfg, 1);
  TwoTrainers job;
  Mutex mu;
  set_log_sink([&](LogLevel level, const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    if (level != LogLevel::ERROR) return;
    MutexLock lock(mu);
    job.error_lines.push_back(line);
  });
  job.errors = ps_test::run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int w) {
                 job.reports[static_cast<std::size_t>(w)] = trainer.train();
               }).errors;
  set_log_sink(nullptr);
  MutexLock lock(mu);
  return job;
}

// A failure both trainers hit at once (divergence, a dead output) is marked by one of them at
// most, and neither watch reports the other lost (which would end this process exit_grace_s
// later). A watch may still report the other's mark when it beats before its own trainer starts
// telling (a window of a few milliseconds in a beat interval): that end is cancelled as the
// watch ends, so it is allowed.
void expect_no_trainer_reported_failed(const TwoTrainers& job) {
  for (const std::string& line : job.error_lines) {
    EXPECT_EQ(line.find("lost trainer"), std::string::npos) << line;
  }
}

// The divergence check (trainer/schedule/divergence.hpp) judges the job's steady loss, added up
// over the trainers through the servers: two async trainers forced to diverge (deepfm with summed
// steps per hot key and sparse SGD at 50) both stop with the error after pass 0, before its save; a
// healthy job's passes end under the constant predictor on both trainers, with the same figure.
TEST_F(PsModes, EveryTrainerStopsADivergedJobBeforeItsSave) {
  for (const bool diverging : {true, false}) {
    SCOPED_TRACE(diverging ? "diverging" : "healthy");
    const fs::path saves = root_ / (diverging ? "diverged_saves" : "healthy_saves");
    std::vector<std::string> extra = {"runner.sync_mode=async",
                                      "runner.print_interval=10",
                                      "runner.save_mode=base",
                                      "runner.model_save_path=" + saves.string(),
                                      "runner.train_data_dir=" + (root_ / "train").string(),
                                      "runner.test_data_dir="};
    if (diverging) {
      extra.push_back("hyper_parameters.model=deepfm");
      extra.push_back("hyper_parameters.sparse_optimizer.class=sgd");
      extra.push_back("hyper_parameters.sparse_optimizer.learning_rate=50");
      extra.push_back("hyper_parameters.sparse_optimizer.mf_learning_rate=50");
    }
    const TrainerConfig cfg = config(extra);
    const TwoTrainers job = train_two_trainers(cfg);
    expect_no_trainer_reported_failed(job);
    const std::vector<std::string>& errors = job.errors;
    const std::vector<std::vector<PassReport>>& reports = job.reports;
    for (int w = 0; w < 2; ++w) {
      const std::string& error = errors[static_cast<std::size_t>(w)];
      if (diverging) {
        EXPECT_NE(error.find("pass 0 is not saved"), std::string::npos) << w << ": " << error;
      } else {
        EXPECT_EQ(error, "") << "trainer " << w;
      }
    }
    EXPECT_EQ(fs::exists(saves / "0"), !diverging);
    if (diverging) continue;
    ASSERT_EQ(reports[0].size(), 1u);
    ASSERT_EQ(reports[1].size(), 1u);
    const SteadyLoss& a = reports[0][0].metrics.steady;
    const SteadyLoss& b = reports[1][0].metrics.steady;
    EXPECT_DOUBLE_EQ(a.ratio_to_constant(), b.ratio_to_constant());
    EXPECT_LT(a.ratio_to_constant(), 1.0);
    // The job's figure: both trainers' steps after their warm-up (each ~78 steps of 256).
    EXPECT_GT(a.examples, reports[0][0].metrics.examples);
  }
}

// The job's spread of predictions is from the lowest bucket of every trainer's to the highest:
// two trainers that each predicted one value are alive when the values differ, one dead trainer
// beside a live one is alive, and the job is dead only when all predicted one value, the same;
// a trainer without predictions counts for none; the steady sums add up. Bucket indexes past a
// float's 2^24 stay exact.
TEST(JobSteadyFigures, TheJobsSpreadRunsFromTheLowestBucketOfAllToTheHighest) {
  const auto trainer = [](double lowest, double highest, double examples) {
    MetricValues m;
    m.prediction_buckets = lowest < 0 ? 0 : (lowest == highest ? 1 : 2);
    m.lowest_bucket = lowest;
    m.highest_bucket = highest;
    m.steady.examples = examples;
    m.steady.positives = examples / 4;
    m.steady.logloss_sum = examples / 2;
    return m;
  };
  const auto job = [](const MetricValues& a, const MetricValues& b) {
    std::vector<float> table = steady_loss_table_zeros(2);
    put_steady_figures(a, 0, 2, 7, &table);
    put_steady_figures(b, 1, 2, 7, &table);
    MetricValues out;
    take_steady_figures(table, 2, 7, &out);
    return out;
  };
  EXPECT_EQ(job(trainer(5, 5, 100), trainer(9, 9, 100)).prediction_buckets, 2);  // two constants
  EXPECT_EQ(job(trainer(5, 5, 100), trainer(3, 700, 100)).prediction_buckets, 2);
  EXPECT_EQ(job(trainer(3, 700, 100), trainer(5, 5, 100)).prediction_buckets, 2);
  const MetricValues dead = job(trainer(5, 5, 100), trainer(5, 5, 300));
  EXPECT_EQ(dead.prediction_buckets, 1);
  EXPECT_EQ(dead.steady.examples, 400);
  EXPECT_EQ(dead.steady.positives, 100);
  EXPECT_EQ(dead.steady.logloss_sum, 200);
  EXPECT_EQ(job(trainer(-1, -1, 0), trainer(5, 5, 100)).prediction_buckets, 1);
  EXPECT_EQ(job(trainer(-1, -1, 0), trainer(-1, -1, 0)).prediction_buckets, 0);
  const double big = (1 << 27) + 1;  // of 2^28 buckets: next to big - 1 in a float
  EXPECT_EQ(job(trainer(big, big, 100), trainer(big - 1, big - 1, 100)).prediction_buckets, 2);
  EXPECT_EQ(job(trainer(big, big, 100), trainer(big, big, 100)).highest_bucket, big);
}

// The two-class output layer's initial weights (dlrm's last fc layer) of `cfg`'s network: every
// trainer starts from them (a seeded hash of runner.seed, dense_parameters.hpp).
std::vector<float> output_layer_weights(const TrainerConfig& cfg) {
  const DenseModelConfig net = cfg.dense_model_config();
  device::Card card(0, 0, 0, 1);
  card.activate();
  DenseModel model(card, net);
  const std::string name = "fc_" + std::to_string(net.fc_sizes.size()) + ".w";
  const std::vector<float> values = model.parameters().values_to_host();
  for (const ParamBlock& block : model.parameters().blocks()) {
    if (block.name != name) continue;
    const auto first = values.begin() + static_cast<std::ptrdiff_t>(block.offset);
    return {first, first + static_cast<std::ptrdiff_t>(block.count)};
  }
  ADD_FAILURE() << "the network has no block " << name;
  return {};
}

// The dead-output check (trainer/schedule/dead_output.hpp) judges the job's spread of
// predictions, gathered through the servers. Two async trainers of a dlrm whose two-class output
// is dead from its first step, whatever the order of their steps: without batch norm, with one
// hidden unit h >= 0 and runner.seed 1, both output weights start negative and the biases at 0,
// so each ReLU'd unit is max(0, w h) = 0 for every instance, softmax(0, 0) = 0.5, and no
// gradient reaches any weight (Adam moves nothing on zero gradients). Both trainers stop at pass
// 0 naming it, before its save (the seed's weights are checked first). With the norm the same job's
// output units are normalised over the batch, alive, and it trains both passes on both trainers,
// judged alive (more than one bucket) job-wide. (A job that trains its way to a dead output, Adam
// at 1 with 16 hidden units, is no test: async, its units died in pass 0 in most runs and in some
// kept a few instances alive into pass 1, and its normed twin diverged in some.)
TEST_F(PsModes, EveryTrainerStopsAJobWhoseOutputDiedBeforeItsSave) {
  for (const bool normed : {false, true}) {
    SCOPED_TRACE(normed ? "normed" : "dead");
    const fs::path saves = root_ / (normed ? "normed_dlrm_saves" : "dead_dlrm_saves");
    const TrainerConfig cfg = config(
        {"runner.sync_mode=async", "runner.print_interval=5", "runner.epochs=2", "runner.seed=1",
         "runner.save_mode=base", "runner.model_save_path=" + saves.string(),
         "runner.train_data_dir=" + (root_ / "train").string(), "runner.test_data_dir=",
         "hyper_parameters.model=dlrm", "hyper_parameters.bot_layer_sizes=[8, 9]",
         "hyper_parameters.fc_sizes=[1]", "hyper_parameters.dlrm_output=softmax2",
         "hyper_parameters.optimizer.class=Adam", "hyper_parameters.optimizer.learning_rate=0.01",
         std::string("hyper_parameters.dnn_batch_norm=") + (normed ? "true" : "false")});
    if (!normed) {
      for (const float w : output_layer_weights(cfg)) {
        ASSERT_LT(w, 0.0f) << "runner.seed 1 no longer starts both output weights negative: the "
                              "job's output is not dead from its start; pick a seed that does";
      }
    }
    const TwoTrainers job = train_two_trainers(cfg);
    expect_no_trainer_reported_failed(job);
    for (std::size_t w = 0; w < 2; ++w) {
      const std::string& error = job.errors[w];
      if (normed) {
        EXPECT_EQ(error, "") << "trainer " << w;
        ASSERT_EQ(job.reports[w].size(), 2u) << "trainer " << w;
        for (const PassReport& pass : job.reports[w]) {
          EXPECT_EQ(pass.metrics.prediction_buckets, 2)
              << "trainer " << w << ", pass " << pass.pass;
        }
        continue;
      }
      EXPECT_NE(error.find("pass 0: every one of its"), std::string::npos) << w << ": " << error;
      EXPECT_NE(error.find(" training predictions is 0.500000"), std::string::npos) << error;
      EXPECT_NE(error.find("hyper_parameters.dnn_batch_norm false"), std::string::npos) << error;
      EXPECT_NE(error.find("no pass before it was saved"), std::string::npos) << error;
    }
    EXPECT_EQ(fs::exists(saves / "0"), normed);
    EXPECT_EQ(fs::exists(saves / "1"), normed);
  }
}

// A schedule whose save of pass `pass` fails as on a full disk: no server restarted, so nothing
// repairs it. The loop and the trainer are the real ones.
class FailingSave final : public testing::ForwardingSchedule {
 public:
  FailingSave(Schedule& inner, int64_t pass) : ForwardingSchedule(inner), pass_(pass) {}
  void save(const std::string& dir) override {
    if (passes_done() == pass_ + 1) GPUBOX_FAIL("writing ", dir, ": No space left on device");
    ForwardingSchedule::save(dir);
  }

 private:
  int64_t pass_;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Pass 1's save fails and ends the job: the pass is not recorded (no line printed, none in
// runner.metrics_path: a repaired failure would train it again and record it then), but its
// line is logged, so that the pass the job ended in leaves its figures.
TEST_F(PsModes, ASaveThatFailsUnrepairedEndsTheJobWithItsPassLineLogged) {
  const fs::path metrics_path = root_ / "failed_save_metrics.jsonl";
  fs::remove(metrics_path);
  const TrainerConfig cfg =
      config({"runner.train_data_dir=" + (root_ / "train").string(),
              "runner.test_data_dir=", "runner.sync_mode=async", "runner.save_mode=checkpoint",
              "runner.model_save_path=" + (root_ / "failed_save").string(),
              "runner.metrics_path=" + metrics_path.string(), "runner.epochs=2"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  FailingSave failing(trainer, 1);
  std::string error;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    run_epochs(failing, cfg, "", false);
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_EQ(count(out, "pass: 0, using time"), 1u) << out;
  EXPECT_EQ(count(out, "pass: 1, using time"), 0u) << out;
  const auto logged = log.find("pass: 1, using time");
  ASSERT_NE(logged, std::string::npos) << log;
  const std::string line = log.substr(logged, log.find('\n', logged) - logged);
  EXPECT_NE(line.find("(its save failed: not recorded)"), std::string::npos) << log;
  std::ifstream file(metrics_path);
  const std::string recorded((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(count(recorded, "\n"), 1u) << recorded;
  EXPECT_EQ(count(recorded, "{\"pass\": 0,"), 1u) << recorded;
}

// A trainer alone at a meeting of 2 waits runner.collective_timeout_s out: its error says a
// trainer died or is stuck (the barrier's wait ran out: DeadlineExceeded), not that the first
// server, which holds the barrier, was lost.
TEST_F(PsModes, AMeetingWaitedOutSaysATrainerDiedOrIsStuck) {
  const TrainerConfig cfg = config({"runner.sync_mode=async", "runner.collective_timeout_s=1"});
  Servers shards(cfg, 1);
  TrainerEnv env;
  env.servers = shards.endpoints();
  env.trainers = 2;
  std::string error;
  try {
    PsTrainer alone(cfg, env);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("trainer 0: waiting for all 2 trainers to start the job"), std::string::npos)
      << error;
  EXPECT_NE(error.find("a trainer died or is stuck"), std::string::npos) << error;
  EXPECT_NE(error.find("DeadlineExceeded"), std::string::npos) << error;
}

// A trainer that fails for good (trainer 1: its share of the training data holds no valid
// instance) marks it with its heartbeat: trainer 0's watch reports it failed, naming what trainer 1
// reported, long before runner.collective_timeout_s. In sync mode trainer 0 waits at a barrier
// that cannot be woken: it is ended exit_grace_s later, as for a lost trainer, with that reason; in
// async mode its threads stop between steps with it (and the process is ended likewise). Without
// the mark, trainer 0's watch would report trainer 1 lost by its stopped heartbeat ("lost trainer
// 1"), or trainer 0 would wait out its barrier ("a trainer died or is stuck"). A death test: the
// forced exit ends the process.
TEST_F(PsModes, AFailedTrainerIsReportedFailedByTheOthersWithWhatItReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const fs::path data = root_ / "one_share_malformed";
  const fs::path bad = data / "part-1";
  for (const char* mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    const auto job = [&] {
      fs::create_directories(data);
      fs::copy_file(data_files((root_ / "train").string()).at(0), data / "part-0",
                    fs::copy_options::overwrite_existing);
      {
        std::ofstream out(bad);
        for (int i = 0; i < 10; ++i) out << "1 0 1:" << 100 + i << "\n";
      }
      const TrainerConfig cfg =
          config({"runner.train_data_dir=" + data.string(),
                  "runner.test_data_dir=", std::string("runner.sync_mode=") + mode,
                  "runner.epochs=1", "runner.collective_timeout_s=600", "runner.peer_timeout_s=5"});
      Servers shards(cfg, 1);
      const std::vector<std::string> errors =
          ps_test::run_trainers(cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) {
            trainer.train();
          }).errors;
      // Trainer 0 stopped between steps (its train() unwound, which cancels the forced end of a
      // reported failure); one blocked in a barrier never gets here: the forced end comes.
      std::fprintf(stderr, "trainer 0's error: %s\n", errors[0].c_str());
      std::fflush(stderr);
      std::_Exit(1);
    };
    // The child's root_ is its own (its process id): the path is matched by its end. Either
    // trainer 0's error or the forced end's line ("gpubox_train: ...") names it.
    const std::string reported =
        "trainer 1 of 2 failed: pass 0: no valid instance in 1 file\\(s\\) \\(10 lines, 10 "
        "malformed\\): [^ ]*/one_share_malformed/part-1";
    EXPECT_EXIT(job(), ::testing::ExitedWithCode(1), reported);
  }
}

// Job A's trainer 1 failed, leaving its mark on the servers: job B on the same servers starts
// clean (the job's start resets the marks) and trains without anyone reported failed. (The mark
// is made after job A's train(), the run it belongs to: outside any train() nothing is marked.)
TEST_F(PsModes, AJobAfterOneWhoseTrainerFailedIsNotToldOfIt) {
  const TrainerConfig cfg = config({"runner.train_data_dir=" + (root_ / "train").string(),
                                    "runner.test_data_dir=", "runner.sync_mode=sync",
                                    "runner.epochs=1", "runner.peer_timeout_s=1"});
  Servers shards(cfg, 1);
  const ps_test::TrainerJob job_a = ps_test::run_trainers(
      cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) { trainer.train(); });
  ASSERT_TRUE(job_a.trainers[0] && job_a.trainers[1]);
  job_a.trainers[1]->tell_failure(std::runtime_error("job A's trainer 1 failed"));
  auto& servers = dynamic_cast<table::server::RemoteHostTier&>(job_a.trainers[0]->host_tier());
  StatusOr<std::string> mark = PsPeerWatch::failure_of(servers, 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  ASSERT_EQ(*mark, "job A's trainer 1 failed");
  const std::vector<std::string> errors =
      ps_test::run_trainers(cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) {
        trainer.train();
      }).errors;
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Both trainers fail (a failure they hit at once): trainer 1 tells first, so trainer 0, finding
// trainer 1's failed flag set, does not mark its own (its watch would report trainer 0 failed,
// ending its process exit_grace_s later). Told after their first train() returned, the marks
// belong to run 1: the first train() of a PsTrainer is run 1 (its flag's value).
TEST_F(PsModes, ATrainerFailingAfterAnotherMarkedItsFailureMarksNone) {
  const TrainerConfig cfg = config({"runner.train_data_dir=" + (root_ / "train").string(),
                                    "runner.test_data_dir=", "runner.sync_mode=async",
                                    "runner.epochs=1", "runner.peer_timeout_s=5"});
  Servers shards(cfg, 1);
  const ps_test::TrainerJob job = ps_test::run_trainers(
      cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) { trainer.train(); });
  ASSERT_TRUE(job.trainers[0] && job.trainers[1]);
  job.trainers[1]->tell_failure(std::runtime_error("pass 0 diverged"));
  job.trainers[0]->tell_failure(std::runtime_error("pass 0 diverged"));
  auto& servers = dynamic_cast<table::server::RemoteHostTier&>(job.trainers[0]->host_tier());
  StatusOr<int> flagged = PsPeerWatch::failed_peer(servers, 1, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, -1) << "trainer 0 marked its failure too";
  flagged = PsPeerWatch::failed_peer(servers, 0, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, 1);
  std::vector<float> alive(PsPeerWatch::kAliveSections * 2, 0.0f);
  ASSERT_TRUE(
      servers.dense(table::server::DenseAction::kRead, PsPeerWatch::kAliveTable, &alive).ok());
  ASSERT_EQ(alive.size(), PsPeerWatch::kAliveSections * 2);
  EXPECT_EQ(alive[PsPeerWatch::kFailedSection * 2 + 1], 1.0f)
      << "trainer 1's failed flag: the run of its first train()";
  StatusOr<std::string> mark = PsPeerWatch::failure_of(servers, 0, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "");
}

// Trainer 0's part of a save fails, no server restarted (the servers refuse to save outside their
// --data_dir): trainer 1 stops at the meeting it waits at, naming what trainer 0 reported.
TEST_F(PsModes, AFailedSaveStopsTheOtherTrainersAtItsMeetingNamingIt) {
  const std::string saves = (root_ / "told_failed_saves").string();
  const std::string server_data = (root_ / "told_failed_server_data").string();
  const TrainerConfig cfg = config(
      {"runner.sync_mode=async", "runner.epochs=1", "runner.collective_timeout_s=60",
       "runner.train_data_dir=" + (root_ / "train").string(),
       "runner.test_data_dir=", "runner.save_mode=checkpoint", "runner.model_save_path=" + saves});
  fs::create_directories(server_data);
  Servers shards(cfg, 2, server_data);
  const std::vector<std::string> errors =
      ps_test::run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int) {
        run_epochs(trainer, cfg, "", false);
      }).errors;
  EXPECT_NE(errors[0].find("saving the sparse table under " + saves + "/0"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("trainer 0 failed to write the save " + saves +
                           "/0; trainer 0 reported: PermissionDenied: saving the sparse table "
                           "under " +
                           saves + "/0"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("is outside the server's data_dir"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
