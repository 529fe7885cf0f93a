// What else failed on a trainer beside a server restart, in words (card_failures_beside_restart,
// failure_beside_restart): each distinct card failure once with its cards, a failure that only
// tells of another left out, the first kCardFailuresNamed then how many cards more. Against an
// in-process tier, where no failure names a restart.
#include "trainer/schedule/restart_beside.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::trainer {
namespace {

using Failure = device::CardsFailed::Failure;

class RestartBeside : public ::testing::Test {
 protected:
  std::string named(const std::vector<Failure>& failures) {
    return card_failures_beside_restart(failures, host_);
  }
  table::server::testing::FakeHostTier host_{table::server::testing::test_config()};
};

// The same failure on several cards is named once with them, in card order.
TEST_F(RestartBeside, TheSameFailureIsNamedOnceWithItsCards) {
  EXPECT_EQ(named({{0, "fault a"}, {1, "fault b"}, {3, "fault b"}}),
            "card 0: fault a; cards 1, 3: fault b");
  EXPECT_EQ(named({}), "");
}

// A failure told (another thread's stopping this one, another trainer's restart heard at a sync
// barrier, the communicator's abort for another card's failure) is not this trainer's fault:
// left out, whatever its words. One not told is named whatever its words, even those of a
// communicator's abort for another card (the type decides, device::CardSet::run_on_cards).
TEST_F(RestartBeside, AFailureThatOnlyTellsOfAnotherIsLeftOut) {
  EXPECT_EQ(named({{0,
                    "sync mode, pass 1, step 4: another trainer's step failed on a server "
                    "restart",
                    /*told=*/true},
                   {1, "stopped: card 0: sync mode, pass 1, step 4: ...", /*told=*/true}}),
            "");
  EXPECT_EQ(
      named({{0, "fault a"}, {1, "communicator aborted (x): card 0: fault a", /*told=*/true}}),
      "card 0: fault a");
  EXPECT_EQ(named({{0, "fault a"}, {1, "communicator aborted (x): card 0: fault a"}}),
            "card 0: fault a; card 1: communicator aborted (x): card 0: fault a");
  EXPECT_EQ(named({{0, ""}, {1, "card 0: in a message of its own"}}),
            "card 0: ; card 1: card 0: in a message of its own");
}

// Past kCardFailuresNamed distinct failures, the cards of the rest are counted, every card of
// every failure left unnamed.
TEST_F(RestartBeside, TheCardsPastTheFirstFailuresAreCounted) {
  std::vector<Failure> failures;
  for (int c = 0; c < static_cast<int>(kCardFailuresNamed); ++c) {
    failures.push_back({c, "fault " + std::to_string(c)});
  }
  const int first_more = static_cast<int>(kCardFailuresNamed);
  failures.push_back({first_more, "fault more"});
  failures.push_back({first_more + 1, "fault more"});
  failures.push_back({first_more + 2, "fault more"});
  const std::string all = named(failures);
  EXPECT_EQ(all.rfind("card 0: fault 0; card 1: fault 1; ", 0), 0u) << all;
  EXPECT_NE(all.find("; and 3 more cards"), std::string::npos) << all;
  EXPECT_EQ(all.find("fault more"), std::string::npos) << all;
  failures.resize(kCardFailuresNamed + 1);
  EXPECT_NE(named(failures).find("; and 1 more card"), std::string::npos) << named(failures);
}

// A lone error: told is nothing beside the restart, any other its message.
TEST_F(RestartBeside, ALoneErrorToldIsNothingBesideTheRestart) {
  EXPECT_EQ(failure_beside_restart(FailureTold("stopped: another"), host_), "");
  EXPECT_EQ(failure_beside_restart(Error("a device fault"), host_), "a device fault");
}

}  // namespace
}  // namespace gpubox::trainer
