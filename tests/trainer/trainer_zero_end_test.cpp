// Trainer 0's end of a part (TrainerZeroWork's destructor, trainer/schedule/trainer_zero_work.hpp)
// against a loopback gpubox_server whose test hook drops trainer 0's writes unapplied while a test
// says so: an end that fails for a while is tried again, under its request id, until the first
// server answers it, and the waiters go to the meeting; it never lands before a publish not
// answered before it; a failure that cannot heal (Aborted: the first server found restarted) or a
// loss trainer 0's watch saw stops the tries at once; and they stop `end_s` after the last publish
// answered, logged once naming the cause, the tries and the seconds. The tries are counted through
// the `lost` callback, which the destructor calls once between two tries.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log_sink.hpp"
#include "table/server/protocol.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/trainer/trainer_zero_work_util.hpp"
#include "trainer/schedule/trainer_zero_work.hpp"

namespace gpubox::trainer {
namespace {

using table::server::DenseAction;
using table::server::FrameHeader;
using table::server::Op;
using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;

using zero_test::error_of_wait;
using zero_test::kJob;
using zero_test::part_of;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Whether `table` shows `part` ended (whatever its moves and seq).
bool shows_ended(const std::vector<float>& table, const TrainerZeroPart& part) {
  const std::vector<float> end = TrainerZeroWork::row(part, TrainerZeroWork::kEnded, 0, 0);
  return table.size() == end.size() && std::equal(end.begin(), end.begin() + 6, table.begin());
}

// The DENSE requests of one client as the first server sees them: each copy that reaches it
// (dropped unapplied while failing()), and each it applied, in order. install() before the server
// starts.
class DenseWrites {
 public:
  struct Event {
    uint64_t request_id = 0;
    bool applied = false;  // else a copy arriving (dropped or about to be applied)
  };

  void install(table::server::ServerOptions* options) {
    options->before_apply = [this](const FrameHeader& header) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!mine(header)) return false;
      events_.push_back({header.request_id, false});
      return failing_;
    };
    options->drop_reply = [this](const FrameHeader& header) {
      std::lock_guard<std::mutex> lock(mu_);
      if (mine(header)) events_.push_back({header.request_id, true});
      return false;
    };
  }
  void watch(uint64_t client_id) {
    std::lock_guard<std::mutex> lock(mu_);
    client_ = client_id;
  }
  void set_failing(bool failing) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_ = failing;
  }
  std::vector<Event> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  bool mine(const FrameHeader& header) const {
    return header.op == Op::kDense && header.client_id == client_;
  }

  mutable std::mutex mu_;
  uint64_t client_ = 0;
  bool failing_ = false;
  std::vector<Event> events_;
};

// The lines logged while it lives (also shown on stderr).
class LoggedLines {
 public:
  LoggedLines() {
    set_log_sink([this](LogLevel, const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    });
  }
  ~LoggedLines() { set_log_sink(nullptr); }
  LoggedLines(const LoggedLines&) = delete;
  LoggedLines& operator=(const LoggedLines&) = delete;
  std::vector<std::string> holding(const std::string& text) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

constexpr const char* kGivesUp = "trainer 0 gives up showing the other trainers that its part";

// The tests whose tries are counted give each call 0.5 s, so that a healthy loopback call is never
// cut short on a loaded machine (one more try than counted).
class TrainerZeroEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    table::server::ServerOptions options;
    writes_.install(&options);
    server_ = start_server(&table_, options);
    ASSERT_TRUE(server_);
    zero_ = connect_client(client_options(server_->endpoint()));
    other_ = connect_client(client_options(server_->endpoint()));
    ASSERT_TRUE(zero_ && other_);
    writes_.watch(zero_->client_id());
  }

  // The table as `other` reads it.
  std::vector<float> read() {
    std::vector<float> table(TrainerZeroWork::kSlots, 0.0f);
    EXPECT_TRUE(other_->dense(DenseAction::kRead, TrainerZeroWork::kTable, &table).ok());
    return table;
  }
  // The distinct request ids of the copies that reached the server.
  std::vector<uint64_t> ids_sent() const {
    std::vector<uint64_t> ids;
    for (const DenseWrites::Event& event : writes_.events()) {
      if (std::find(ids.begin(), ids.end(), event.request_id) == ids.end()) {
        ids.push_back(event.request_id);
      }
    }
    return ids;
  }

  DenseWrites writes_;  // outlives the server, whose threads call it
  FakeHostTier table_{table::server::testing::test_config()};
  std::unique_ptr<table::server::Server> server_;
  std::unique_ptr<table::server::RemoteHostTier> zero_;
  std::unique_ptr<table::server::RemoteHostTier> other_;
  TrainerZeroPublishes publishes_;
};

// The part shown running, then its end dropped three tries in a row (a first server that lost
// its connections for a moment): the fourth try lands it, sent again under its one request id
// (one write however many copies), and a waiter under the job's bounds goes to the meeting. Before,
// the end was tried once: the waiter failed after runner.collective_timeout_s naming trainer 0.
TEST_F(TrainerZeroEnd, AnEndThatFailsForAWhileIsSentUntilAnswered) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  constexpr int kFailedTries = 3;
  int between_tries = 0;
  std::string waited = "not returned";
  std::thread waiter;
  Clock::time_point ending;
  {
    TrainerZeroWork work(*zero_, publishes_, part, 0.02, /*call_s=*/0.5, /*end_s=*/20.0, [&] {
      if (++between_tries == kFailedTries) writes_.set_failing(false);
      return std::string();
    });
    ASSERT_FALSE(publishes_.unanswered()) << "the part was not shown running";
    waiter = std::thread([&] {
      waited = error_of_wait(*other_, TrainerZeroWait::of(part, "to write the save S", 5.0, 3.0,
                                                          "LOG", [] { return std::string(); }));
    });
    writes_.set_failing(true);
    ending = Clock::now();
  }
  waiter.join();
  EXPECT_EQ(waited, "");
  EXPECT_EQ(between_tries, kFailedTries);
  EXPECT_FALSE(publishes_.unanswered());
  EXPECT_EQ(read(), TrainerZeroWork::row(part, TrainerZeroWork::kEnded, 0, 2));
  // The running publish, then every copy of the end under one id.
  EXPECT_EQ(ids_sent().size(), 2u);
  ASSERT_TRUE(publishes_.last_answered().has_value());
  EXPECT_GE(*publishes_.last_answered(), ending) << "the end's answer was not noted";
}

// The part's running publish never answered (every copy dropped): the end is not sent until it
// was, and then after it. Before the end tries, nothing of the end reached the server.
TEST_F(TrainerZeroEnd, TheEndNeverLandsBeforeTheUnansweredPublishBeforeIt) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  int between_tries = 0;
  writes_.set_failing(true);
  {
    TrainerZeroWork work(*zero_, publishes_, part, 0.02, /*call_s=*/0.5, /*end_s=*/20.0, [&] {
      if (++between_tries == 2) writes_.set_failing(false);
      return std::string();
    });
  }
  EXPECT_EQ(between_tries, 2);
  EXPECT_TRUE(shows_ended(read(), part));
  const std::vector<uint64_t> ids = ids_sent();
  ASSERT_EQ(ids.size(), 2u);  // running, end: the end created once, when it was first sent
  const uint64_t running = ids[0];
  const uint64_t end = ids[1];
  bool running_applied = false;
  std::vector<uint64_t> applied;
  for (const DenseWrites::Event& event : writes_.events()) {
    if (event.request_id == end) {
      EXPECT_TRUE(running_applied) << "a copy of the end reached the server before the running "
                                      "publish was applied";
    }
    if (event.applied) applied.push_back(event.request_id);
    running_applied = running_applied || (event.applied && event.request_id == running);
  }
  EXPECT_EQ(applied, (std::vector<uint64_t>{running, end}));
}

// Every copy dropped: the tries stop end_s after the part's start (its running publish, the last
// one answered), and one line names the cause, the tries and the seconds. A bound of the test's
// own (the callback reports a loss after 10 s) ends a loop that ignores end_s.
TEST_F(TrainerZeroEnd, TheTriesStopEndSAfterTheLastAnswer) {
  LoggedLines logged;
  // Long enough for several dropped tries (each up to call_s) on a loaded machine too.
  constexpr double kEndS = 2.0;
  constexpr double kInterval = 0.02;
  int between_tries = 0;
  Clock::time_point began;
  {
    began = Clock::now();
    TrainerZeroWork work(*zero_, publishes_, part_of(kJob, 0, 0, 1), kInterval, /*call_s=*/0.1,
                         kEndS, [&] {
                           ++between_tries;
                           return seconds_since(began) > 10 ? "the test's bound" : "";
                         });
    ASSERT_FALSE(publishes_.unanswered());
    writes_.set_failing(true);
  }
  const double took = seconds_since(began);
  EXPECT_GE(took, kEndS - kInterval - 0.02);
  EXPECT_LT(took, kEndS + 2.0);
  EXPECT_GE(between_tries, 3);
  EXPECT_TRUE(publishes_.unanswered()) << "the end, sent and not answered, is kept";
  const std::vector<std::string> lines = logged.holding(kGivesUp);
  ASSERT_EQ(lines.size(), 1u);
  // The last try's failure is followed by the callback, then the bound is found passed.
  EXPECT_NE(lines[0].find("part 1 ended, after " + std::to_string(between_tries) + " tries in"),
            std::string::npos)
      << lines[0];
  EXPECT_TRUE(lines[0].find("DeadlineExceeded") != std::string::npos ||
              lines[0].find("Unavailable") != std::string::npos)
      << lines[0];
  EXPECT_EQ(lines[0].find("the test's bound"), std::string::npos) << lines[0];
}

// A loss trainer 0's watch saw stops the tries after the first: the waiters fail at once too.
TEST_F(TrainerZeroEnd, ALossTheWatchSawStopsTheTries) {
  LoggedLines logged;
  int between_tries = 0;
  const auto began = Clock::now();
  {
    TrainerZeroWork work(*zero_, publishes_, part_of(kJob, 0, 0, 1), 0.02, /*call_s=*/0.1,
                         /*end_s=*/5.0, [&] {
                           ++between_tries;
                           return std::string("server 1 is lost");
                         });
    writes_.set_failing(true);
  }
  EXPECT_LT(seconds_since(began), 2.5);
  EXPECT_EQ(between_tries, 1);
  const std::vector<std::string> lines = logged.holding(kGivesUp);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("after 1 tries"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("server 1 is lost (the last try: "), std::string::npos) << lines[0];
}

// The first server restarted during the part (answered Aborted until the restart is accepted,
// after the part): no second try, however long end_s.
TEST(TrainerZeroEndRestart, AnAbortedEndIsNotTriedAgain) {
  FakeHostTier first{table::server::testing::test_config()};
  FakeHostTier second{table::server::testing::test_config()};
  table::server::ServerOptions options;
  options.port = gpubox::testing::port_below_ephemeral_range();  // `second` starts on it
  auto server = start_server(&first, options);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  // Rows the restart loses: it is not adopted quietly.
  std::vector<uint64_t> keys{5, 6, 7, 8};
  std::vector<float> rows(keys.size() * client->layout().stride(), 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  LoggedLines logged;
  TrainerZeroPublishes publishes;
  int between_tries = 0;
  {
    TrainerZeroWork work(*client, publishes, part_of(kJob, 0, 0, 1), 0.02, /*call_s=*/3.0,
                         /*end_s=*/3.0, [&] {
                           ++between_tries;
                           return std::string();
                         });
    server.reset();
    server = start_server(&second, options);
    ASSERT_TRUE(server);
  }
  EXPECT_EQ(between_tries, 0);
  const std::vector<std::string> lines = logged.holding(kGivesUp);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("after 1 tries"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("Aborted"), std::string::npos) << lines[0];
}

// The bound leaves the waiters one read and one interval of their runner.collective_timeout_s
// to see an end answered at its last moment, and is at least half of it (all of the rest below
// 40 ms, where the read's and the interval's floors of 10 ms would take more).
TEST(TrainerZeroEndBound, LeavesTheWaitersAReadAndAnInterval) {
  for (const double collective_s : {0.04, 0.3, 2.0, 300.0}) {
    for (const double server_s : {0.005, 3.0, 30.0}) {
      const double end_s = TrainerZeroWork::end_bound_for(collective_s, server_s);
      EXPECT_DOUBLE_EQ(end_s + TrainerZeroWork::call_deadline_for(collective_s, server_s) +
                           TrainerZeroWork::interval_for(collective_s),
                       collective_s);
      EXPECT_GE(end_s, collective_s / 2) << collective_s << " " << server_s;
    }
  }
  EXPECT_DOUBLE_EQ(TrainerZeroWork::end_bound_for(0.02, 3.0), 0.01);
  EXPECT_DOUBLE_EQ(TrainerZeroWork::end_bound_for(0.001, 3.0), 0.0005);
}

}  // namespace
}  // namespace gpubox::trainer
