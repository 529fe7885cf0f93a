// Issue 32, the gpubox mode with one trainer (2 simulated cards, 3 passes: one folder of
// runner.pass_dirs each) against 2 in-process gpubox_server shards on loopback: server 1
// restarted (same port, empty) within pass 1 is repaired in the run, as a job of several
// trainers repairs it (gpubox_job_recovery_test): found in the pass's pulls (its begin_pass) or
// in its write-back at the pass's end, the pass is dropped from the cards, pass 0's save reloaded
// into the servers and pass 1 trained again. The oracle (run once): the same trainer stopped after
// pass 0's save, then a new trainer on fresh servers resuming from that save (as a rerun in a new
// process resumes it). The schedule is deterministic (no shuffle, every reduction in a fixed
// order), so every row's show and click counts end equal (every instance of every pass counted
// once, none of the dropped pass's updates left on a server, none of the save lost) and so does
// the held-out AUC. A recovery refused (runner.resume off, no save yet, the recoveries spent)
// stops the trainer naming the server, the pass and why; a restart found in the write-back of a
// pass stopped as asked ends the run stopped. A device fault in the phase that finds the restart
// is named beside it in the error the user sees (a stopped pass then ends with that error).
// Trainer::set_meeting_hook places the restarts (and the faults) in a phase (the stopped pass's: a
// step hook).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/trainer/gpubox_trainer_recovery_fixture.hpp"

namespace gpubox::trainer::recovery_test {
namespace {

// Found by begin_pass's pulls (no rows staged ahead: each is pulled then): the pass had not
// begun, its rows pulled so far are dropped with the cards' contents.
TEST_F(GpuboxTrainerRecovery, ARestartFoundInAPassesPullsIsRepaired) {
  const Ran ran = ends_as_resumed_from_the_save(
      "pulls", {"", {{"at the start of pass 1"}}, {"runner.prefetch_passes=0"}});
  EXPECT_NE(ran.log.find("at the start of pass 1: "), std::string::npos) << ran.log;
  EXPECT_NE(ran.log.find("No pass was open: reloading the last complete save (pass 0, "),
            std::string::npos)
      << ran.log;
}

// Found by the write-back at the pass's end (the steps call no server): the pass trained on the
// cards is dropped, none of its rows written back, and pass 2, read and staged ahead while pass
// 1 trained, is read and staged again after the reload.
TEST_F(GpuboxTrainerRecovery, ARestartFoundInAPassesWriteBackIsRepaired) {
  const Ran ran = ends_as_resumed_from_the_save("write_back", {"", {{"at the end of pass 1"}}});
  EXPECT_NE(ran.log.find("at the end of pass 1: "), std::string::npos) << ran.log;
  EXPECT_NE(ran.log.find("The pass's rows on the cards are dropped: reloading the last "
                         "complete save (pass 0, "),
            std::string::npos)
      << ran.log;
}

// The run is asked to stop within pass 1 as server 1 restarts: the stopped pass's write-back
// finds the restart and the run ends stopped as asked, pass 0 trained and saved (before, it
// ended with the restart's error).
TEST_F(GpuboxTrainerRecovery, ARestartFoundAsThePassStopsEndsStopped) {
  TrainerRun run{(root_ / "stopped").string()};
  run.stop_at_restart = true;
  const Ran ran = run_trainer(run);
  EXPECT_EQ(ran.error, "") << ran.log;
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.passes, (std::vector<int64_t>{0}));
  EXPECT_EQ(count(ran.log, "at the end of pass 1 (stopped): "), 1u) << ran.log;
  EXPECT_EQ(count(ran.log, "; rerun to resume from the last save; the run stops as asked"), 1u)
      << ran.log;
  EXPECT_EQ(ran.log.find("reloading the last complete save"), std::string::npos) << ran.log;
  EXPECT_FALSE(ran.left_in_pass);  // the stopped pass is dropped, not left open
}

// The same stop, and a device fault in the stopped pass's write-back where the restart is found:
// the fault is not what was asked, so the run ends with it beside the restart (before, it was
// logged and the run reported stopped as asked), going back to no save, the pass dropped.
TEST_F(GpuboxTrainerRecovery, ADeviceFaultBesideARestartAsThePassStopsEndsWithBoth) {
  TrainerRun run{(root_ / "stopped_fault").string(),
                 {{"at the end of pass 1 (stopped)", /*server=*/-1, /*device_fault=*/true}}};
  run.stop_at_restart = true;
  const Ran ran = run_trainer(run);
  std::printf("stopped with a device fault: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.error.rfind("at the end of pass 1 (stopped): server ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find(std::string("; this trainer also failed there: ") + kDeviceFault +
                           "; rerun to resume from the last save"),
            std::string::npos)
      << ran.error;
  EXPECT_EQ(count(ran.error, "at the end of pass 1 (stopped)"), 1u) << ran.error;
  EXPECT_EQ(ran.log.find("the run stops as asked"), std::string::npos) << ran.log;
  EXPECT_EQ(ran.log.find("reloading the last complete save"), std::string::npos) << ran.log;
  EXPECT_FALSE(ran.left_in_pass);
}

// Server 1 restarts at the end of pass 1, then server 0 as the save of pass 0 is read for the
// reload (found by the reload's LOAD; server 1 restarted again there would be adopted quietly:
// empty as the instance accepted, which nothing was sent to since): the save is reloaded again,
// no pass open then, and the run ends as the oracle.
TEST_F(GpuboxTrainerRecovery, ARestartDuringTheReloadReloadsAgain) {
  const Ran ran = ends_as_resumed_from_the_save(
      "reload", {"", {{"at the end of pass 1"}, {"reading the save <saves>/0", 0}}},
      /*reloads=*/2);
  EXPECT_EQ(count(ran.log, "The pass's rows on the cards are dropped: reloading "), 1u) << ran.log;
  EXPECT_EQ(count(ran.log, "No pass was open: reloading "), 1u) << ran.log;
  // The reload's own error is logged as it is (whatever else failed in it would be lost).
  EXPECT_EQ(count(ran.log, "pass 1, reloading "), 1u) << ran.log;
}

// Found by the evaluation at epoch 0's end (runner.epochs 2), after pass 2's save, while pass 3
// (epoch 1's first) was read and staged ahead as pass 2 trained: the reload of pass 2's save
// lands right before pass 3, the one recovery after which the pipeline still holds the very
// pass the run trains next (any other goes back before a pass read ahead, and take() reads
// that pass again itself). drop_card_work drops it with the cards' work: pass 3 is read and
// staged again from the servers as the save left them, and the run ends as one resumed from
// that save. (The rows staged before the restart equal the save's: the staging excluded every
// key trained before pass 3, and each save waits for the staging under way.)
TEST_F(GpuboxTrainerRecovery, ARestartFoundAtAnEpochsEndDropsTheNextPassStagedBeforeIt) {
  // One pass read ahead: the log's count of passes taken as read ahead depends on it.
  const std::vector<std::string> keys = {"runner.epochs=2", "runner.prefetch_passes=1",
                                         "runner.test_data_dir=" + (root_ / "test").string()};
  TrainerRun first{(root_ / "epoch_end_oracle").string(), {}, keys};
  first.stop_after_pass = 2;
  const Ran stopped = run_trainer(first);
  ASSERT_EQ(stopped.error, "") << stopped.log;
  ASSERT_EQ(stopped.passes, (std::vector<int64_t>{0, 1, 2}));
  const Ran resumed = run_trainer({first.saves, {}, keys});
  ASSERT_EQ(resumed.error, "") << resumed.log;
  ASSERT_EQ(resumed.passes, (std::vector<int64_t>{3, 4, 5}));
  const Ran recovered =
      run_trainer({(root_ / "epoch_end").string(), {{"at the start of an evaluation"}}, keys});
  EXPECT_EQ(recovered.error, "") << recovered.log;
  EXPECT_EQ(recovered.restarts, 1u);
  EXPECT_EQ(recovered.passes, (std::vector<int64_t>{0, 1, 2, 3, 4, 5})) << recovered.log;
  EXPECT_EQ(count(recovered.log, "No pass was open: reloading the last complete save (pass 2, "),
            1u)
      << recovered.log;
  // Passes 1 and 2 were taken as read ahead; pass 3, read ahead too, never is (the run after
  // the reload reads it in place), and passes 4 and 5 are read ahead again.
  EXPECT_EQ(count(recovered.log, " was read ahead ("), 4u) << recovered.log;
  EXPECT_EQ(count(recovered.log, "pass 3 was read ahead ("), 0u) << recovered.log;
  EXPECT_FALSE(resumed.counts.empty());
  EXPECT_TRUE(recovered.counts == resumed.counts) << "the rows' show and click counts differ";
  EXPECT_EQ(recovered.test_auc, resumed.test_auc);
}

// A direct call that does not recover (an evaluation after train(), as gpubox_train --mode infer
// or Python's evaluate make it) fails naming its phase, the restart and what a rerun does.
TEST_F(GpuboxTrainerRecovery, ARestartFoundByADirectEvaluationNamesThePhaseAndTheRerun) {
  TrainerRun run{(root_ / "evaluation").string(), {{"at the start of an evaluation"}}};
  const Ran ran = run_trainer(run);
  std::printf("evaluation: %s\n", ran.error.c_str());
  EXPECT_EQ(ran.restarts, 1u);
  EXPECT_EQ(ran.passes, (std::vector<int64_t>{0, 1, 2})) << ran.log;
  EXPECT_EQ(ran.error.rfind("at the start of an evaluation: ", 0), 0u) << ran.error;
  EXPECT_NE(ran.error.find(" restarted (instance "), std::string::npos) << ran.error;
  EXPECT_NE(ran.error.find("; rerun to resume from the last save"), std::string::npos) << ran.error;
}

// Reading a save's files calls no server: a save to load that is not there fails as it is,
// without asking every server who it is first. Server 1, restarted (empty) after a pass wrote
// rows to it, is not found there (a later call to it finds it).
TEST_F(GpuboxTrainerRecovery, AMissingSaveToLoadAsksNoServer) {
  const TrainerConfig cfg = config_of({(root_ / "missing").string()});
  Servers shards(cfg, 2);
  Trainer trainer(cfg, env_of(shards));
  trainer.train_pass(data_files((root_ / "day0").string()));  // rows written to every server
  shards.restart(1);
  const std::string missing = (root_ / "no_such_save").string();
  try {
    trainer.load(missing);
    ADD_FAILURE() << "loaded " << missing;
  } catch (const AgreedRestart& e) {
    ADD_FAILURE() << "a restart: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(missing), std::string::npos) << e.message();
  }
  EXPECT_EQ(SaveLineage::describe_restarts(trainer.host_tier()), "");
}

}  // namespace
}  // namespace gpubox::trainer::recovery_test
