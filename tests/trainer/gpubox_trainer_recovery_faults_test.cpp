// gpubox_trainer_recovery_test's faults and refusals (the fixture and the oracle:
// gpubox_trainer_recovery_fixture.hpp): a device fault, or faults on several cards, in the phase
// that finds a server restart are named beside it, whether the trainer goes back or refuses; a
// recovery refused (runner.resume off, no save yet, the recoveries spent) stops the trainer
// naming the server, the pass and why.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/trainer/gpubox_trainer_recovery_fixture.hpp"

namespace gpubox::trainer::recovery_test {
namespace {

// A device fault in the phase where the restart is found (the restart's error no longer
// replaces it, logged at WARNING only): the user sees both, the server first. A direct call
// that does not recover fails naming the restarted server, the fault and what a rerun does.
TEST_F(GpuboxTrainerRecovery, ADeviceFaultBesideARestartFoundByADirectEvaluationIsNamedWithIt) {
  TrainerRun run{(root_ / "evaluation_fault").string(),
                 {{"at the start of an evaluation", 1, /*device_fault=*/true}}};
  const Ran ran = run_trainer(run);
  std::printf("evaluation with a device fault: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.error.rfind("at the start of an evaluation: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed there: ") + kDeviceFault +
                           "; rerun to resume from the last save"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, "at the start of an evaluation"), 1u) << ran.error;
}

// The same fault beside a restart found at the end of pass 1: the recovery goes back (the fault
// logged) and ends as the oracle; refused (runner.resume off), its error names the restarted
// server, why it stops, and the fault.
TEST_F(GpuboxTrainerRecovery, ADeviceFaultBesideARestartIsRepairedOrNamedWithTheRefusal) {
  const Ran recovered = ends_as_resumed_from_the_save(
      "write_back_fault", {"", {{"at the end of pass 1", 1, /*device_fault=*/true}}});
  EXPECT_NE(recovered.log.find(std::string("this trainer also failed there: ") + kDeviceFault),
            std::string::npos)
      << recovered.log;
  TrainerRun refused{(root_ / "resume_off_fault").string(),
                     {{"at the end of pass 1", 1, /*device_fault=*/true}},
                     {"runner.resume=off"}};
  const Ran ran = run_trainer(refused);
  std::printf("refused with a device fault: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  // The fault after the restart, before why the trainer stops and what a rerun does; once.
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed at the end of pass 1: ") +
                           kDeviceFault + "; the trainer stops: runner.resume is off"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, kDeviceFault), 1u) << ran.error;
  EXPECT_FALSE(ran.left_in_pass);
}

TEST_F(GpuboxTrainerRecovery, ResumeOffStopsNamingIt) {
  refused_recovery_stops("resume_off", {"runner.resume=off"},
                         "; the trainer stops: runner.resume is off: running the command again "
                         "starts from scratch");
}

TEST_F(GpuboxTrainerRecovery, NoSaveYetStopsNamingIt) {
  refused_recovery_stops("no_save", {"runner.model_save_path="},
                         "; the trainer stops: no save was made or loaded yet: running the "
                         "command again starts from scratch");
}

// Faults on several cards beside a restart found at the end of pass 1, card 0's the restart's
// own (its call names the restarted server): refused (runner.resume off), the error names every
// other card's fault, each distinct one once with its cards, one that follows another card's
// left out, the first four then how many cards more (before, the first card's error alone was
// seen: the restart's, and no fault beside it).
TEST_F(GpuboxTrainerRecovery, FaultsOnSeveralCardsBesideARestartAreEachNamedOnce) {
  RestartAt faults{"at the end of pass 1"};
  faults.card_faults = {"writing rows back to <server>: the connection was cut",
                        "fault A",
                        "",
                        "fault B",
                        "fault A",
                        "<told>communicator aborted (rank 5 in all_to_all): card 1: fault A",
                        "fault C",
                        "fault D",
                        "fault E"};
  const Ran ran = run_trainer({(root_ / "cards_faults").string(), {faults}, {"runner.resume=off"}});
  std::printf("refused with faults on several cards: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find("; this trainer also failed at the end of pass 1: cards 1, 4: fault A; "
                           "card 3: fault B; card 6: fault C; card 7: fault D; and 1 more card; "
                           "the trainer stops: runner.resume is off"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, "fault A"), 1u) << ran.error;
  EXPECT_EQ(ran.error.find("the connection was cut"), std::string::npos) << ran.error;
  EXPECT_FALSE(ran.left_in_pass);
}

// A fleet restart found in part: server 1's is known (every server asked) when server 0 restarts
// and cuts the phase's call to it. The failure names a restart once every server is asked again
// (before, it was classified with server 1's alone and named 'also failed').
TEST_F(GpuboxTrainerRecovery, ACallCutOffByAServerOfAFleetRestartIsNotAlsoFailed) {
  RestartAt first{"at the end of pass 1"};
  first.found_at_once = true;
  RestartAt second{"at the end of pass 1", /*server=*/0};
  second.card_faults = {"writing rows back to <server>: the connection was cut"};
  const Ran ran =
      run_trainer({(root_ / "fleet_cut").string(), {first, second}, {"runner.resume=off"}});
  EXPECT_NE(ran.error.find("runner.resume is off"), std::string::npos) << ran.error;
  EXPECT_EQ(ran.error.find("also failed"), std::string::npos) << ran.error;
}

// Server 1 restarts at the end of every run of pass 1, server 0 at every read of the save of
// pass 0 for the reload, found at once with a device fault beside it: the first reload fails and
// the second goes through (server 0 restarted again before anything reached it is adopted
// quietly, and nothing fails); then pass 1 again, its reload failing the same way, is the fourth
// recovery: the refusal names the server, the save it reloaded and the fault (before, the
// reload's fault was only logged).
TEST_F(GpuboxTrainerRecovery, AFaultBesideARestartInTheReloadIsNamedInTheRefusal) {
  RestartAt reading{"reading the save <saves>/0", 0, /*device_fault=*/true};
  reading.found_at_once = true;
  const std::string saves = (root_ / "reload_fault").string();
  const Ran ran = run_trainer({saves, {{"at the end of pass 1"}, reading}, {}, /*each_time=*/true});
  std::printf("refused with a fault in the reload: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 5u) << ran.log;
  EXPECT_EQ(ran.error.rfind("pass 1: server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed reloading ") + saves + "/0: " +
                           kDeviceFault + "; the servers restarted 3 times already in this run"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, kDeviceFault), 1u) << ran.error;
}

// Server 1 restarts at the end of every run of pass 1: the trainer goes back three times, then
// gives up.
TEST_F(GpuboxTrainerRecovery, RestartsPastTheRunsRecoveriesStopNamingIt) {
  const Ran ran = refused_recovery_stops(
      "spent", {},
      "; the servers restarted 3 times already in this run: giving up; running the command "
      "again resumes from the last complete save (pass 0, ",
      /*each_time=*/true);
  EXPECT_EQ(ran.restarts, 4u);
  EXPECT_EQ(count(ran.log, "The pass's rows on the cards are dropped: reloading "), 3u) << ran.log;
}

}  // namespace
}  // namespace gpubox::trainer::recovery_test
