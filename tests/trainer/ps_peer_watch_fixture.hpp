// The fixture of PsPeerWatch's tests (ps_peer_watch_test.cpp, ps_peer_watch_edges_test.cpp,
// ps_modes_telling_test.cpp): a loopback gpubox_server over an in-process table, three clients
// (one a trainer), the losses a watch reports, the lines logged, and the beat counts read by a
// client of the test's own.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log_sink.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"

namespace gpubox::trainer::ps_modes::watch_test {

using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;
using table::server::testing::test_config;
using Clock = std::chrono::steady_clock;

inline constexpr double kTimeout =
    1.0;  // runner.peer_timeout_s of these tests (a loaded machine still beats)

// The losses one watch reported (its callback; the process is never ended: exit_grace_s 0).
class Losses {
 public:
  std::function<void(const std::string&)> callback() {
    return [this](const std::string& reason) {
      MutexLock lock(mu_);
      reasons_.push_back(reason);
    };
  }
  std::vector<std::string> reasons() const {
    MutexLock lock(mu_);
    return reasons_;
  }
  // Waits (up to 10 s: a loaded machine) until a loss was reported; whether one was. A watch
  // reports once (PsPeerWatch::on_lost): a later loss is only logged.
  bool wait_for_report() const {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (reasons().empty() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return !reasons().empty();
  }
  // The reports after a quiet window (3 timeouts, many beats) that follows wait_for_report():
  // a second report of the same loss would have come in it. A sleep, as the check is negative.
  std::size_t reports_after_quiet_window() const {
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * kTimeout));
    return reasons().size();
  }

 private:
  mutable Mutex mu_;
  std::vector<std::string> reasons_ GPUBOX_GUARDED_BY(mu_);
};

// The lines logged while it lives (every level; still shown on stderr): a watch logs every loss
// it sees, the ones after its one report included.
class LogLines {
 public:
  LogLines() {
    set_log_sink([this](LogLevel, const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
      MutexLock lock(mu_);
      lines_.push_back(line);
    });
  }
  ~LogLines() { set_log_sink(nullptr); }
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;
  // The lines that hold `text`.
  std::vector<std::string> holding(const std::string& text) const {
    MutexLock lock(mu_);
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }

 private:
  mutable Mutex mu_;
  std::vector<std::string> lines_ GPUBOX_GUARDED_BY(mu_);
};

inline PsPeerWatchOptions options() {
  PsPeerWatchOptions o;
  o.peer_timeout_s = kTimeout;
  o.exit_grace_s = 0;
  return o;
}

class PsPeerWatchTest : public ::testing::Test {
 protected:
  // The server's options (a fault hook of a test's own).
  virtual table::server::ServerOptions server_options() { return {}; }
  void SetUp() override {
    server_ = start_server(&table_, server_options());
    ASSERT_TRUE(server_);
    for (int i = 0; i < 3; ++i) {
      clients_.push_back(connect_client(client_options(server_->endpoint())));
      ASSERT_TRUE(clients_.back());
    }
  }
  // The job's start (trainer 0): the table sized for `trainers`.
  void reset(int trainers) { ASSERT_TRUE(PsPeerWatch::reset(*clients_[0], trainers).ok()); }
  // kAliveTable of a job of `trainers`, read by a client of the test's own (the watches' clients
  // are theirs); empty when it cannot be read.
  std::vector<float> alive(int trainers) {
    if (!reader_) reader_ = connect_client(client_options(server_->endpoint()));
    std::vector<float> values(PsPeerWatch::kAliveSections * static_cast<std::size_t>(trainers),
                              0.0f);
    if (!reader_ ||
        !reader_->dense(table::server::DenseAction::kRead, PsPeerWatch::kAliveTable, &values)
             .ok()) {
      return {};
    }
    return values;
  }
  // The beat counts of the job's trainers (kAliveTable's first section).
  std::vector<float> beats(int trainers) {
    std::vector<float> values = alive(trainers);
    if (!values.empty()) values.resize(static_cast<std::size_t>(trainers));
    return values;
  }
  // kAliveTable zeroed, as a first server restarted empty recreates it (every begun flag gone):
  // by adding the negation of what a read found (a beat between the two stays counted, its begun
  // flag's add, 0 once it is set, too).
  bool zero_alive_table(int trainers) {
    std::vector<float> held = alive(trainers);
    if (held.empty()) return false;
    for (float& v : held) v = -v;
    return reader_->dense(table::server::DenseAction::kAdd, PsPeerWatch::kAliveTable, &held).ok();
  }
  // Waits (10 s at most) until trainer `trainer`'s begun flag of a job of `trainers` is `run`
  // (after zero_alive_table: its watch found the loss and beat again); whether it was.
  bool begun_again(int trainers, int trainer, float run) {
    const auto at = PsPeerWatch::kBegunSection * static_cast<std::size_t>(trainers) +
                    static_cast<std::size_t>(trainer);
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until) {
      const std::vector<float> now = alive(trainers);
      if (now.size() > at && now[at] == run) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // Waits (10 s at most: a loaded machine) until trainer `beating` of `trainers` has beaten and
  // then each of `watchers` beat `times` more (so each saw its count above 0); whether they did.
  bool beaten_after(int trainers, int beating, const std::vector<int>& watchers, float times) {
    const auto n = static_cast<std::size_t>(trainers);
    const auto until = Clock::now() + std::chrono::seconds(10);
    std::vector<float> at_first;
    while (Clock::now() < until) {
      const std::vector<float> now = beats(trainers);
      if (now.size() == n && at_first.empty() && now[static_cast<std::size_t>(beating)] > 0) {
        at_first = now;
      }
      const auto beat = [&](int w) {
        const auto i = static_cast<std::size_t>(w);
        return now.size() == n && now[i] >= at_first[i] + times;
      };
      if (!at_first.empty() && std::all_of(watchers.begin(), watchers.end(), beat)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // The silence a loss's reason reports ("... stopped S s ago ..."); -1 when it names none.
  static double silence_s(const std::string& reason) {
    const auto at = reason.find(" stopped ");
    if (at == std::string::npos) return -1;
    return std::stod(reason.substr(at + 9));
  }

  FakeHostTier table_{test_config()};
  std::unique_ptr<table::server::Server> server_;
  std::vector<std::unique_ptr<table::server::RemoteHostTier>> clients_;
  std::unique_ptr<table::server::RemoteHostTier> reader_;
};

}  // namespace gpubox::trainer::ps_modes::watch_test
