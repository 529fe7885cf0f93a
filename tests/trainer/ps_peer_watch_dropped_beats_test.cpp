// PsPeerWatch at its edges where a beat's reply is lost, against a loopback gpubox_server that
// drops the replies of chosen DENSE requests after applying them: a wrap whose reply was lost is
// applied once; after the table is lost (a first server restarted empty) a trainer not begun has
// the bound after a loss, a live watch whose beats fail meanwhile is not lost (a dead one is,
// later), and a count equal by chance after the loss is not silence. The other edges:
// ps_peer_watch_edges_test.cpp.
#include "tests/trainer/ps_peer_watch_edges.hpp"

namespace gpubox::trainer::ps_modes::edges_test {
namespace {

// The watch's tests with a server that drops the replies of chosen DENSE requests of one client
// (after applying them; its retries, deduplicated, are not applied again and are dropped too): a
// beat whose add was applied fails.
class PsPeerWatchDroppedBeats : public PsPeerWatchTest {
 protected:
  table::server::ServerOptions server_options() override {
    table::server::ServerOptions o;
    o.threads = 2;  // one runs `on_drop_` while the other serves what it sends
    o.drop_reply = [this](const table::server::FrameHeader& header) {
      if (header.op != table::server::Op::kDense || header.client_id != client_id_.load()) {
        return false;
      }
      std::size_t k = 0;
      bool first = false;
      {
        MutexLock lock(mu_);
        while (k < requests_.size() && requests_[k] != header.request_id) ++k;
        first = k == requests_.size();
        if (first) requests_.push_back(header.request_id);
      }
      const bool drop = drop_(k);
      if (drop && first && on_drop_) on_drop_();
      return drop;
    };
    return o;
  }
  // The server stops before this fixture's members go (its threads call the hook).
  void TearDown() override {
    if (server_) {
      server_->stop();
      server_->wait();
    }
  }
  // A client of its own whose call fails soon after its replies stop (0.3 s), watched by the
  // hook: its k-th DENSE request (from 0, its retries alike) has its replies dropped when
  // `drop(k)`, and `on_drop` (may be empty) runs once as the first of them is dropped.
  std::unique_ptr<table::server::RemoteHostTier> watched_client(
      std::function<bool(std::size_t)> drop, std::function<void()> on_drop = nullptr) {
    auto o = watch_test::client_options(server_->endpoint());
    o.deadline_s = 0.3;
    auto client = watch_test::connect_client(o);
    if (!client) return client;
    drop_ = std::move(drop);
    on_drop_ = std::move(on_drop);
    client_id_.store(client->client_id());
    return client;
  }
  std::size_t requests() const {
    MutexLock lock(mu_);
    return requests_.size();
  }

 private:
  std::function<bool(std::size_t)> drop_;  // set before client_id_
  std::function<void()> on_drop_;
  std::atomic<uint64_t> client_id_{0};
  mutable Mutex mu_;
  std::vector<uint64_t> requests_ GPUBOX_GUARDED_BY(mu_);
};

// Trainer 0's count starts below kBeatWrap. Its first beat (a read, then an add) takes it to
// kBeatWrap; the reply of its next add (the wrap) is lost, and of the adds of the three beats
// after (each after a read that passes): five adds in all applied, four of them unanswered. The
// wrap is applied once: the count goes back to 1 and moves on, exact (before, the wrap was sent
// again after each lost reply: applied four times the count stopped, far below -2^24).
TEST_F(PsPeerWatchDroppedBeats, ABeatAtTheWrapWhoseReplyIsLostIsAppliedOnce) {
  reset(2);
  const float start = PsPeerWatch::kBeatWrap - 1.0f;
  std::vector<float> long_job = {start, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  ASSERT_TRUE(clients_[2]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &long_job).ok());
  // Requests 0 and 1: the first beat's read and add; 2, 4, 6, 8: the adds dropped.
  auto client = watched_client([](std::size_t k) { return k >= 2 && k <= 8 && k % 2 == 0; });
  ASSERT_TRUE(client);
  PsPeerWatch watch(*client, 0, 2, options());
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (requests() < 13 && Clock::now() < until) {  // two more beats answered after the last drop
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(requests(), 13u) << "trainer 0 did not beat";
  const std::vector<float> after = beats(2);
  ASSERT_EQ(after.size(), 2u);
  // 1 after the wrap, then one for each add since (its beats after the drops went on meanwhile).
  EXPECT_GE(after[0], 6.0f);
  EXPECT_LT(after[0], 100.0f);
  ASSERT_TRUE(beaten_after(2, 0, {0}, 2)) << "trainer 0's count stopped at " << after[0];
}

// Trainer 0's first server restarted empty within the bound of run 1 (here: the table zeroed as the
// reply of one of its beats is lost, every begun flag with it; its add to the missing table failed
// and its next beat found its own flag gone). From there a trainer not begun is judged by the
// bound after a loss only: trainer 1, beginning 4 timeouts after the loss (past the bound of run 1
// counted from trainer 0's first beat, and from the loss: before, that bound started again there),
// within after_loss_timeout_s of it, is not named. The loss comes at least a timeout within the
// bound of run 1: the watch finds it only after its call's deadline and a beat or two.
TEST_F(PsPeerWatchDroppedBeats, AfterTheTableIsLostATrainerNotBegunHasTheBoundAfterALoss) {
  reset(2);
  Mutex mu;
  std::optional<Clock::time_point> zeroed;
  const auto zero_the_table = [&] {
    ASSERT_TRUE(zero_alive_table(2));
    MutexLock lock(mu);
    zeroed = Clock::now();
  };
  // Request 4: the add of trainer 0's 4th beat, about 0.6 s after its first.
  auto client = watched_client([](std::size_t k) { return k == 4; }, zero_the_table);
  ASSERT_TRUE(client);
  PsPeerWatchOptions o = options();
  o.begin_timeout_s = 3 * kTimeout;
  o.after_loss_timeout_s = 3 * o.begin_timeout_s;
  Losses losses;
  const auto started = Clock::now();
  PsPeerWatch first(*client, 0, 2, o, losses.callback());
  std::optional<Clock::time_point> lost_at;
  while (!lost_at && Clock::now() < started + std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    MutexLock lock(mu);
    lost_at = zeroed;
  }
  ASSERT_TRUE(lost_at) << "the table was never lost";
  // Else the watch beat too slowly (load) for it to find the loss within the bound of run 1.
  ASSERT_LT(*lost_at - started, std::chrono::duration<double>(o.begin_timeout_s - kTimeout))
      << "the table was lost too late";
  std::this_thread::sleep_until(*lost_at + std::chrono::duration<double>(4 * kTimeout));
  PsPeerWatch late(*clients_[1], 1, 2, o);
  ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
  quiet_window();
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
}

// After the table was zeroed (a first server restarted empty), trainer 1's beats fail for 3
// timeouts (its calls fail until it accepts the restart; here their replies are lost, the first
// add's applied without its begun flag, the reads after it not) and then go through again;
// trainer 2 (beats of the test's own, moving until trainer 0's watch found the loss) never beats
// again. Trainer 0's watch names nobody while trainer 1's beats fail, nor after; trainer 2 only
// after_loss_timeout_s after the loss (before: trainer 1 was named by its silence).
TEST_F(PsPeerWatchDroppedBeats, AWatchWhoseBeatsFailAfterTheTableIsLostIsNotLostADeadOneIsLater) {
  reset(3);
  LogLines log;
  auto failing = std::make_shared<std::atomic<bool>>(false);
  auto client = watched_client([failing](std::size_t) { return failing->load(); });
  ASSERT_TRUE(client);
  PsPeerWatchOptions o = options();
  o.after_loss_timeout_s = 6 * kTimeout;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 3, o, losses.callback());
  PsPeerWatch failing_watch(*client, 1, 3, o);
  std::atomic<bool> dead{false};
  std::thread trainer_2([&] {
    float begun = 1.0f;
    while (!dead.load()) {
      std::vector<float> beat(PsPeerWatch::kAliveSections * 3, 0.0f);
      beat[2] = 1.0f;
      beat[PsPeerWatch::kBegunSection * 3 + 2] = begun;
      begun = 0.0f;  // its flag, once set, not again: it never beats after the loss
      if (!clients_[2]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const bool beaten = beaten_after(3, 2, {0, 1}, 2);
  failing->store(true);
  const auto zeroed = Clock::now();
  const bool zero = zero_alive_table(3);
  const bool found = begun_again(3, 0, 1.0f);  // trainer 0's watch found the loss
  dead.store(true);
  trainer_2.join();
  ASSERT_TRUE(beaten) << "the trainers did not beat";
  ASSERT_TRUE(zero) << "the table could not be zeroed";
  ASSERT_TRUE(found) << "trainer 0's watch did not beat after the loss";
  std::this_thread::sleep_until(zeroed + std::chrono::duration<double>(3 * kTimeout));
  failing->store(false);
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 2 was never lost";
  const double after_s = std::chrono::duration<double>(Clock::now() - zeroed).count();
  const std::string reason = losses.reasons().at(0);
  EXPECT_NE(reason.find("lost trainer 2 of 3: it did not beat in training run 1 within "),
            std::string::npos)
      << reason;
  // Not before the bound (load only delays the report).
  EXPECT_GE(after_s, o.after_loss_timeout_s) << reason;
  ASSERT_TRUE(beaten_after(3, 1, {0}, 2)) << "trainer 1 did not beat again";
  quiet_window();
  for (const std::string& line : log.holding("lost trainer 1 of 3")) ADD_FAILURE() << line;
}

// Trainer 0's watch read trainer 1's count at 3; then its beats fail for 2 timeouts (its calls
// fail until it accepts the restart) while the table is zeroed (a first server restarted empty)
// and trainer 1, alive, beats its flag back, its count back to 3 by chance as trainer 0's watch
// beats again and finds the loss; trainer 1 beats on from there. It is never named: its silence
// is timed from the loss (before, its count read equal to the one read before the loss, it was
// named as silent since then, at once).
TEST_F(PsPeerWatchDroppedBeats, ACountEqualByChanceAfterTheTableIsLostIsNotSilence) {
  reset(2);
  LogLines log;
  auto failing = std::make_shared<std::atomic<bool>>(false);
  auto client = watched_client([failing](std::size_t) { return failing->load(); });
  ASSERT_TRUE(client);
  Losses losses;
  PsPeerWatch watch(*client, 0, 2, options(), losses.callback());
  const auto beat_of_1 = [&](float count, float begun) {
    std::vector<float> beat(PsPeerWatch::kAliveSections * 2, 0.0f);
    beat[1] = count;
    beat[PsPeerWatch::kBegunSection * 2 + 1] = begun;
    return clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok();
  };
  ASSERT_TRUE(beat_of_1(3.0f, 1.0f));
  ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "trainer 0 did not beat";
  failing->store(true);
  ASSERT_TRUE(zero_alive_table(2));
  std::this_thread::sleep_for(std::chrono::duration<double>(2 * kTimeout));
  ASSERT_TRUE(beat_of_1(3.0f, 1.0f));
  failing->store(false);
  const bool found = begun_again(2, 0, 1.0f);  // trainer 0's watch found the loss
  std::atomic<bool> stop{false};
  std::thread trainer_1([&] {
    while (!stop.load()) {
      beat_of_1(1.0f, 0.0f);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  quiet_window();
  stop.store(true);
  trainer_1.join();
  ASSERT_TRUE(found) << "trainer 0's watch did not beat after the loss";
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
  for (const std::string& line : log.holding("lost trainer 1 of 2")) ADD_FAILURE() << line;
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes::edges_test
