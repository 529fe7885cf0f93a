// Saves and resume of the trainer (trainer/schedule/checkpoint.hpp), in-process host tier:
//  - a run stopped after pass 0 and run again (epochs raised to 3) resumes from pass 0 and ends
//    bit-identical to an uninterrupted 3-pass run (shuffled passes included: seeds per pass);
//    passes and their save folders count from 0, the manifest records the passes done;
//  - run again once complete, it trains the job again from the start; only an interrupted run
//    of the same job resumes (other data or other runner keys that shape the result: refused
//    naming them); runner.resume: off starts afresh;
//  - the newest save made with other model keys, or by a run started from another --load, is
//    refused naming the keys or the starting points (which saves a resume reads, skips or
//    refuses otherwise: resume_saves_test.cpp);
//  - load refuses a folder without a model manifest, or whose halves are not the ones named;
//  - save_mode delta: the first save is a base, the next ones deltas naming their parent;
//    loading the last reproduces the model; a replaced parent is refused; only a checkpoint
//    keeps per_table adam's table step (base and delta rows load without moments);
//  - a stop flag (RunHooks::steps) set while pass 1 begins stops both cards after the same step
//    of it (in memory or streamed): no save of pass 1, and a rerun resumes from pass 0's save
//    and ends bit-identical to an uninterrupted run.
// On 2 cards (on the one a 1-GPU machine has: every check but the two cards' agreement).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "table/dense_table.hpp"
#include "table/io/model_manifest.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/resume_fixture.hpp"
#include "tests/trainer/forwarding_schedule.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/schedule/dense_state.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
namespace io = table::io;

class Resume : public testing::ResumeFixture {
 protected:
  // A network (`network`: its overrides; rows `mf_dim` wide): stopped after pass 0 and run
  // again, it ends bit-identical to the uninterrupted run, and a save loads into a fresh trainer
  // evaluating the same. `*last_save` (when given): the dense half of the uninterrupted run's
  // last save.
  static void network_resumes_bit_identical(const std::string& name,
                                            const std::vector<std::string>& network, int mf_dim,
                                            DenseState* last_save = nullptr) {
    const fs::path straight_dir = root_ / (name + "_straight");
    const fs::path stopped_dir = root_ / (name + "_stopped");
    Trainer straight(config(straight_dir, network), env());
    ASSERT_EQ(straight.host_tier().layout().mf_dim, mf_dim);
    const std::vector<PassReport> want = straight.train();
    ASSERT_EQ(passes(want), (std::vector<int64_t>{0, 1, 2}));
    {
      std::vector<std::string> one = network;
      one.push_back("runner.epochs=1");
      Trainer first(config(stopped_dir, one), env());
      EXPECT_EQ(passes(first.train()), (std::vector<int64_t>{0}));
    }
    Trainer again(config(stopped_dir, network), env());
    const std::vector<PassReport> got = again.train();
    ASSERT_EQ(passes(got), (std::vector<int64_t>{1, 2}));
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(got[i].metrics.auc, want[i + 1].metrics.auc) << "pass " << got[i].pass;
      EXPECT_EQ(got[i].metrics.logloss, want[i + 1].metrics.logloss) << "pass " << got[i].pass;
    }
    EXPECT_EQ(again.dense_values(0), straight.dense_values(0));
    // It learns: 3 passes of 1200 lines move the training AUC a few hundredths (the dnn at
    // dropout 0.1: +0.032 on the cpu build, +0.027 on an H200, whose GEMMs round otherwise).
    EXPECT_GT(want.back().metrics.auc, want.front().metrics.auc + 0.02);
    Trainer loaded(config(root_ / (name + "_loaded"), network), env());
    loaded.load((straight_dir / "2").string());
    const auto files = data_files((root_ / "train").string());
    EXPECT_EQ(loaded.evaluate(files, false).metrics.auc,
              straight.evaluate(files, false).metrics.auc);
    if (last_save != nullptr) {
      *last_save = load_dense_half((straight_dir / "2").string(), straight.dense_values(0).size());
    }
  }

  // `a` then `b`.
  static std::vector<std::string> with(std::vector<std::string> a,
                                       const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  // Sparse adam corrected per table (a small rate: adam's first steps are large).
  static std::vector<std::string> per_table_rows() {
    return {"hyper_parameters.sparse_optimizer.class=adam",
            "hyper_parameters.sparse_optimizer.adam_bias_correction=per_table",
            "hyper_parameters.sparse_optimizer.learning_rate=0.02",
            "hyper_parameters.sparse_optimizer.mf_learning_rate=0.02"};
  }
};

TEST_F(Resume, ARunStoppedAfterPass0ResumesAndEndsBitIdentical) {
  const fs::path straight_dir = root_ / "straight", stopped_dir = root_ / "stopped";
  Trainer straight(config(straight_dir), env());
  const std::vector<PassReport> want = straight.train();
  ASSERT_EQ(passes(want), (std::vector<int64_t>{0, 1, 2}));

  {  // The first run ends after pass 0 (as if killed in pass 1: pass 0's save is the last).
    Trainer first(config(stopped_dir, {"runner.epochs=1"}), env());
    EXPECT_EQ(passes(first.train()), (std::vector<int64_t>{0}));
  }
  Trainer again(config(stopped_dir), env());
  const std::vector<PassReport> got = again.train();
  ASSERT_EQ(passes(got), (std::vector<int64_t>{1, 2}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i].metrics.auc, want[i + 1].metrics.auc) << "pass " << got[i].pass;
    EXPECT_EQ(got[i].metrics.logloss, want[i + 1].metrics.logloss) << "pass " << got[i].pass;
  }
  EXPECT_EQ(again.dense_values(0), straight.dense_values(0));
  EXPECT_EQ(again.passes_done(), 3);

  // The saves of the resumed run continue the lineage: sequences 2 and 3 after pass 0's 1. The
  // save of pass p (folder p) records p + 1 passes done: a resume from it goes on with pass p + 1.
  for (int pass = 0; pass < 3; ++pass) {
    auto m = io::read_model_manifest(io::FileEnv::posix(), (stopped_dir / std::to_string(pass)));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->pass, pass + 1);
    EXPECT_EQ(m->sequence, static_cast<uint64_t>(pass + 1));
    EXPECT_EQ(m->origin, "");
  }

  // Once complete, running it again trains the job again from the start (as PaddleRec does):
  // every pass, bit-identical to the first time, its saves replacing those there.
  Trainer done(config(stopped_dir), env());
  const std::vector<PassReport> rerun = done.train();
  ASSERT_EQ(passes(rerun), (std::vector<int64_t>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rerun[i].metrics.auc, want[i].metrics.auc) << i;
  EXPECT_EQ(done.dense_values(0), straight.dense_values(0));
  auto m = io::read_model_manifest(io::FileEnv::posix(), (stopped_dir / "2"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->sequence, 6u);  // the rerun's saves are the newest
  EXPECT_EQ(m->job_passes, 3);
  EXPECT_EQ(m->job.count("data"), 1u);
}

TEST_F(Resume, AStopWithinAPassStopsEveryCardAfterTheSameStepAndSavesNothingOfIt) {
  for (const std::string reader : {"InmemoryDataset", "QueueDataset"}) {
    SCOPED_TRACE(reader);
    const std::vector<std::string> keys = {
        "runner.reader_type=" + reader,
        "runner.shuffle=" + std::string(reader == "QueueDataset" ? "false" : "true")};
    const fs::path straight_dir = root_ / ("step_straight_" + reader);
    const fs::path stopped_dir = root_ / ("step_stopped_" + reader);
    Trainer straight(config(straight_dir, keys), env());
    const std::vector<PassReport> want = straight.train();
    ASSERT_EQ(passes(want), (std::vector<int64_t>{0, 1, 2}));
    {
      // Raised where the loop asks before pass 1; read by the cards at its first step (the
      // loop's own read of the flag came first), so the stop falls within pass 1.
      std::atomic<bool> stop{false};
      RunHooks hooks;
      hooks.steps.stop_flag = &stop;
      hooks.stop_requested = [&stop] {
        stop.store(true);
        return false;
      };
      std::vector<StepProgress> progress;
      hooks.steps.on_progress = [&progress](const StepProgress& p) { progress.push_back(p); };
      Trainer first(config(stopped_dir, keys), env());
      EXPECT_EQ(passes(first.train("", hooks)), (std::vector<int64_t>{0}));
      // Both cards stopped after pass 1's first step (a card stopping alone would leave the
      // other waiting in the step's collectives); their dense parameters are one model. With one
      // card (cards_here) there is no second to compare, and the progress checks below remain.
      if (first.num_cards() > 1) {
        EXPECT_EQ(first.dense_values(0), first.dense_values(first.num_cards() - 1));
      }
      EXPECT_NE(first.dense_values(0), straight.dense_values(0));
      EXPECT_EQ(first.passes_done(), 1);
      bool pass_0_ended = false;
      for (const StepProgress& p : progress) {
        if (p.pass == 0) pass_0_ended = pass_0_ended || p.step == p.steps;
        if (p.pass == 1) {
          EXPECT_LT(p.step, p.steps);  // stopped at its first step
        }
      }
      EXPECT_TRUE(pass_0_ended);
    }
    // Nothing of pass 1 was saved, not even begun.
    std::vector<std::string> saves;
    for (const auto& entry : fs::directory_iterator(stopped_dir)) {
      saves.push_back(entry.path().filename().string());
    }
    EXPECT_EQ(saves, (std::vector<std::string>{"0"}));
    Trainer again(config(stopped_dir, keys), env());
    const std::vector<PassReport> got = again.train();
    ASSERT_EQ(passes(got), (std::vector<int64_t>{1, 2}));
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(got[i].metrics.auc, want[i + 1].metrics.auc) << "pass " << got[i].pass;
    }
    EXPECT_EQ(again.dense_values(0), straight.dense_values(0));
  }
}

// ffm, whose rows hold one factor per field (5 fields x 4 here) and whose dense part holds the
// dense features' factors.
TEST_F(Resume, AnFfmRunStoppedAfterPass0ResumesAndEndsBitIdentical) {
  network_resumes_bit_identical("ffm", {"hyper_parameters.model=ffm"}, (4 + 2) * 4);
}

// autoint: its interacting layers (projections, LayerNorms), output weights and dense features'
// embeddings in the dense part; rows as the dnn's.
TEST_F(Resume, AnAutointRunStoppedAfterPass0ResumesAndEndsBitIdentical) {
  network_resumes_bit_identical(
      "autoint",
      {"hyper_parameters.model=autoint", "hyper_parameters.attn_layer_sizes=[4, 4]",
       "hyper_parameters.fc_sizes=[]"},
      4);
}

// Sparse adam under adam_bias_correction per_table: the table's step count is model state (the
// dense half keeps it, a resume sets it on every card); restarted at 0, pass 1 would correct
// every row's step as an early one and part from the uninterrupted run.
TEST_F(Resume, ARunOfPerTableAdamRowsResumesBitIdentical) {
  DenseState saved;
  network_resumes_bit_identical("per_table", per_table_rows(), 4, &saved);
  // The step the resume restored is the table's: one per training step of the 3 passes, as the
  // dense adam's count.
  EXPECT_GT(saved.table_steps, 0);
  EXPECT_EQ(saved.table_steps, saved.steps);
}

// A base or delta save keeps the rows without their moments (m = v = 0 when loaded): the table's
// step is neither saved nor restored with them, else every row's first step after a load would
// be corrected as a late one (a step of about 3.16 lr at a large t for adam's default betas, lr
// at t = 1).
TEST_F(Resume, OnlyACheckpointKeepsThePerTableStep) {
  std::vector<std::string> keys = per_table_rows();
  keys.push_back("runner.epochs=1");
  const fs::path checkpoint = root_ / "table_step_checkpoint";
  Trainer kept(config(checkpoint, keys), env());
  kept.train();
  const std::size_t parameters = kept.dense_values(0).size();
  const std::string save = (checkpoint / "0").string();
  EXPECT_GT(load_dense_half(save, parameters).table_steps, 0);
  for (const char* mode : {"base", "delta"}) {
    SCOPED_TRACE(mode);
    std::vector<std::string> without = keys;
    without.push_back(std::string("runner.save_mode=") + mode);
    without.push_back("runner.epochs=2");  // delta: the second save is one
    const fs::path dir = root_ / (std::string("table_step_") + mode);
    Trainer(config(dir, without), env()).train();
    EXPECT_EQ(load_dense_half((dir / "1").string(), parameters).table_steps, 0);
  }
  // A base save whose dense half holds one (the checkpoint's, relabelled) restores none: saved
  // at once as a checkpoint, the step is still 0.
  auto m = io::read_model_manifest(io::FileEnv::posix(), save);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  m->mode = table::SaveKind::kBase;
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), save, *m));
  const fs::path again = root_ / "table_step_relabelled";
  Trainer loaded(config(again, keys), env());
  loaded.load(save);
  loaded.save((again / "0").string());
  EXPECT_EQ(load_dense_half((again / "0").string(), parameters).table_steps, 0);
}

// deepfefm: its field-pair matrices and dense vectors in the dense part; rows as the dnn's.
TEST_F(Resume, ADeepFefmRunStoppedAfterPass0ResumesAndEndsBitIdentical) {
  network_resumes_bit_identical("deepfefm", {"hyper_parameters.model=deepfefm"}, 4);
}

// Dropout: the resumed run's masks go on from the save's step (the same masks as the
// uninterrupted run's, not the first steps' again).
TEST_F(Resume, ARunWithDropoutStoppedAfterPass0ResumesAndEndsBitIdentical) {
  network_resumes_bit_identical("dropout", {"hyper_parameters.dnn_dropout=0.1"}, 4);
}

// flen: its bi-interaction's weights in the dense part and PaddleRec's dense Adagrad (its
// squared-gradient sums saved and restored); rows as the dnn's.
TEST_F(Resume, AFlenRunStoppedAfterPass0ResumesAndEndsBitIdentical) {
  network_resumes_bit_identical(
      "flen",
      {"hyper_parameters.model=flen", "hyper_parameters.field_group_sizes=[2, 1, 1]",
       "hyper_parameters.optimizer.class=Adagrad", "hyper_parameters.optimizer.learning_rate=0.04"},
      4);
}

// fat_deepffm: ffm's rows (5 fields x 4 here) and CEN's layers and dense vectors in the dense part.
TEST_F(Resume, AFatDeepffmRunStoppedAfterPass0ResumesAndEndsBitIdentical) {
  network_resumes_bit_identical(
      "fat_deepffm", {"hyper_parameters.model=fat_deepffm", "hyper_parameters.fc_sizes=[8]"},
      (4 + 2) * 4);
}

// At p 0.5 its undropped bias (its own block in the dense half) trains, saves and resumes too.
TEST_F(Resume, AFatDeepffmRunWithDropoutResumesBitIdenticalWithItsUndroppedBias) {
  network_resumes_bit_identical(
      "fat_dropout",
      {"hyper_parameters.model=fat_deepffm", "hyper_parameters.fc_sizes=[8]",
       "hyper_parameters.dnn_dropout=0.5"},
      (4 + 2) * 4);
  table::DenseTable dense;
  throw_if_error(dense.load((root_ / "fat_dropout_straight" / "2" / "dense").string()));
  EXPECT_NE(dense.get(kFatDeepffmBiasBlock).value().values.at(0), 0.0f) << "bias not trained";
}

// A schedule that stops (as a killed trainer would) when pass `stop` would begin: the loop and
// the trainer are the real ones.
class StopAt final : public testing::ForwardingSchedule {
 public:
  StopAt(Trainer& trainer, int64_t stop) : ForwardingSchedule(trainer), stop_(stop) {}
  PassReport train_scheduled_pass(const RunPlan& plan, int64_t pass) override {
    if (pass == stop_) GPUBOX_FAIL("stopped before pass ", pass);
    return ForwardingSchedule::train_scheduled_pass(plan, pass);
  }

 private:
  int64_t stop_;
};

TEST_F(Resume, OnlyAnInterruptedRunOfTheSameJobResumes) {
  const fs::path dir = root_ / "interrupted";
  {  // Killed before pass 1 of 3: pass 0's save is the last.
    Trainer first(config(dir), env());
    StopAt stopper(first, 1);
    const std::string what = error_of([&] { run_epochs(stopper, first.config(), "", false); });
    EXPECT_NE(what.find("stopped before pass 1"), std::string::npos) << what;
  }
  // Other data (the same files, copied into another folder): another job, refused naming it
  // and the ways out, whatever else matches.
  const fs::path other = root_ / "train_other";
  fs::copy(root_ / "train", other, fs::copy_options::recursive);
  std::string what = error_of(
      [&] { Trainer(config(dir, {"runner.train_data_dir=" + other.string()}), env()).train(); });
  EXPECT_NE(what.find("is of another job than this one: data: saved 2 files"), std::string::npos)
      << what;
  // Naming the files: the saved ones gone, the copies new.
  EXPECT_NE(what.find("(the files that differ: " + (root_ / "train").string()), std::string::npos)
      << what;
  EXPECT_NE(what.find(") is not in this job's data; "), std::string::npos) << what;
  EXPECT_NE(what.find(other.string() + "/part-00000 ("), std::string::npos) << what;
  EXPECT_NE(what.find("runner.resume=off"), std::string::npos) << what;
  EXPECT_NE(what.find("another runner.model_save_path"), std::string::npos) << what;
  // Another batch size: another job too.
  what = error_of([&] { Trainer(config(dir, {"runner.train_batch_size=50"}), env()).train(); });
  EXPECT_NE(what.find("runner.train_batch_size: saved 40, now 50"), std::string::npos) << what;
  // Keys that cannot change the result (where it logs, how it overlaps its work, where its rows
  // are held: a budget and a disk tier) are the same job: it resumes with pass 1.
  Trainer again(config(dir, {"runner.print_interval=7", "runner.prefetch_passes=0",
                             "runner.rocksdb_path=" + (root_ / "rows_on_disk").string(),
                             "runner.host_memory_row_budget=100"}),
                env());
  EXPECT_EQ(passes(again.train()), (std::vector<int64_t>{1, 2}));
}

TEST_F(Resume, OffStartsAfreshAndItsSavesAreTheNewest) {
  const fs::path dir = root_ / "off";
  Trainer(config(dir, {"runner.epochs=2"}), env()).train();
  Trainer fresh(config(dir, {"runner.resume=off", "runner.epochs=1"}), env());
  EXPECT_EQ(passes(fresh.train()), (std::vector<int64_t>{0}));
  // Pass 0 was saved again after pass 1: it is the newest, so a resume starts after it.
  Trainer resumed(config(dir, {"runner.epochs=2"}), env());
  EXPECT_EQ(passes(resumed.train()), (std::vector<int64_t>{1}));
}

TEST_F(Resume, TheNewestSaveOfAnotherRunIsRefusedNamingWhatDiffers) {
  const fs::path dir = root_ / "other_run";
  Trainer(config(dir, {"runner.epochs=1"}), env()).train();

  std::string what = error_of([&] {
    Trainer(config(dir, {"hyper_parameters.fc_sizes=[8]", "runner.seed=4"}), env()).train();
  });
  EXPECT_NE(what.find("was made with other model settings: hyper_parameters.fc_sizes: saved "
                      "[16, 8], now [8]; runner.seed: saved 3, now 4"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("runner.resume=off"), std::string::npos) << what;

  // Started from scratch, then run again with --load of another save: not the same run.
  what = error_of([&] { Trainer(config(dir), env()).train((dir / "0").string()); });
  EXPECT_NE(what.find("belongs to a run that started from scratch, and this command starts from "
                      "--load " +
                      (dir / "0").string()),
            std::string::npos)
      << what;
}

// A save of dlrm's one-logit output resumed with the two-class output (as a save of PaddleRec's
// dlrm folder made before dlrm_output, which the folder now builds): refused, saying the -o that
// resumes it.
TEST_F(Resume, ASaveOfAnotherDlrmOutputIsRefusedNamingTheOverrideThatResumesIt) {
  const fs::path dir = root_ / "dlrm_output";
  const std::vector<std::string> dlrm = {"hyper_parameters.model=dlrm",
                                         "hyper_parameters.bot_layer_sizes=[8, 5]",
                                         "hyper_parameters.dnn_batch_norm=true"};
  std::vector<std::string> logit = dlrm;
  logit.insert(logit.end(), {"hyper_parameters.dlrm_output=logit", "runner.epochs=1"});
  Trainer(config(dir, logit), env()).train();
  std::vector<std::string> softmax2 = dlrm;
  softmax2.push_back("hyper_parameters.dlrm_output=softmax2");
  const std::string what = error_of([&] { Trainer(config(dir, softmax2), env()).train(); });
  EXPECT_NE(what.find("hyper_parameters.dlrm_output: saved logit, now softmax2"), std::string::npos)
      << what;
  EXPECT_NE(what.find("add -o hyper_parameters.dlrm_output=logit to read this save"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("runner.resume=off"), std::string::npos) << what;
}

// A save records the dropout rate trained, PaddleRec's deepfefm folder's 0.2 when unset: one made
// before the key (trained without dropout, recording none) is not resumed at the folder's rate
// but told the -o that resumes it; the save at the folder's rate resumes unset or at its rate
// set, and is refused at another rate.
TEST_F(Resume, ASaveRecordsTheFoldersDropoutRateAndOneMadeWithoutIsToldTheOverride) {
  const std::vector<std::string> folder = {"workspace=models/rank/deepfefm",
                                           "hyper_parameters.model=deepfefm"};
  // config_gpubox.yaml without its dnn_dropout line: the key unset, as in PaddleRec's folder.
  const std::string yaml = (root_ / "without_dnn_dropout.yaml").string();
  {
    std::ifstream in(std::string(GPUBOX_SOURCE_DIR) + "/configs/config_gpubox.yaml");
    std::ofstream out(yaml);
    for (std::string line; std::getline(in, line);) {
      if (line.find("dnn_dropout:") == std::string::npos) out << line << "\n";
    }
  }
  const fs::path before = root_ / "dropout_before_the_key";
  TrainerConfig older =
      config(before, with(folder, {"hyper_parameters.dnn_dropout=0", "runner.epochs=1"}), yaml);
  ASSERT_EQ(older.model_keys.erase("hyper_parameters.dnn_dropout"), 1u);
  Trainer(older, env()).train();
  const std::string what = error_of([&] { Trainer(config(before, folder, yaml), env()).train(); });
  EXPECT_NE(what.find("hyper_parameters.dnn_dropout: saved (not recorded; its default is 0), now "
                      "0.2"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("add -o hyper_parameters.dnn_dropout=0 to resume this save at its start"),
            std::string::npos)
      << what;
  Trainer off(
      config(before, with(folder, {"hyper_parameters.dnn_dropout=0", "runner.epochs=2"}), yaml),
      env());
  EXPECT_EQ(passes(off.train()), (std::vector<int64_t>{1}));

  const fs::path at_rate = root_ / "dropout_at_the_folders_rate";
  Trainer(config(at_rate, with(folder, {"runner.epochs=1"}), yaml), env()).train();
  const auto m = io::read_model_manifest(io::FileEnv::posix(), (at_rate / "0").string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->model_keys.at("hyper_parameters.dnn_dropout"), "0.2");
  const std::string other = error_of([&] {
    Trainer(config(at_rate, with(folder, {"hyper_parameters.dnn_dropout=0.5", "runner.epochs=2"}),
                   yaml),
            env())
        .train();
  });
  EXPECT_NE(other.find("hyper_parameters.dnn_dropout: saved 0.2, now 0.5"), std::string::npos)
      << other;
  Trainer same(
      config(at_rate, with(folder, {"hyper_parameters.dnn_dropout=0.2", "runner.epochs=2"}), yaml),
      env());
  EXPECT_EQ(passes(same.train()), (std::vector<int64_t>{1}));
}

TEST_F(Resume, LoadRefusesAFolderThatIsNotOneCompleteSave) {
  const fs::path a = root_ / "load_a", b = root_ / "load_b";
  Trainer(config(a, {"runner.epochs=1"}), env()).train();
  Trainer(config(b, {"runner.epochs=1", "runner.seed=9"}), env()).train();
  Trainer fresh(config(root_ / "unused"), env());

  // Without its model manifest (a save cut short): refused, naming it.
  fs::copy(a / "0", root_ / "no_manifest", fs::copy_options::recursive);
  fs::remove(root_ / "no_manifest" / "MODEL_MANIFEST");
  std::string what = error_of([&] { fresh.load((root_ / "no_manifest").string()); });
  EXPECT_NE(what.find((root_ / "no_manifest" / "MODEL_MANIFEST").string() + " is missing"),
            std::string::npos)
      << what;

  // A new sparse half beside the old dense half: refused, naming the sparse half.
  fs::copy(a / "0", root_ / "mixed", fs::copy_options::recursive);
  fs::remove_all(root_ / "mixed" / "sparse");
  fs::copy(b / "0" / "sparse", root_ / "mixed" / "sparse", fs::copy_options::recursive);
  what = error_of([&] { fresh.load((root_ / "mixed").string()); });
  EXPECT_NE(what.find("do not match its MODEL_MANIFEST"), std::string::npos) << what;
  EXPECT_NE(what.find("sparse/MANIFEST has digest"), std::string::npos) << what;
  EXPECT_EQ(what.find("dense/MANIFEST has digest"), std::string::npos) << what;
  fresh.load((a / "0").string());  // the complete one loads
}

TEST_F(Resume, DeltaSavesChainToABaseAndLoadTheWholeChain) {
  const fs::path dir = root_ / "delta";
  Trainer trainer(config(dir, {"runner.save_mode=delta"}), env());
  trainer.train();
  const auto manifest = [&](int pass) {
    auto m = io::read_model_manifest(io::FileEnv::posix(), (dir / std::to_string(pass)).string());
    throw_if_error(m.status());
    return m.value();
  };
  EXPECT_EQ(manifest(0).mode, table::SaveKind::kBase);  // a chain starts with a base
  EXPECT_EQ(manifest(1).mode, table::SaveKind::kDelta);
  EXPECT_EQ(manifest(1).parent, "../0");
  EXPECT_EQ(manifest(2).parent, "../1");

  const auto files = data_files((root_ / "train").string());
  const EvalResult want = trainer.evaluate(files, true);
  Trainer fresh(config(root_ / "unused_delta", {"runner.save_mode=delta"}), env());
  fresh.load((dir / "2").string());
  const EvalResult got = fresh.evaluate(files, true);
  EXPECT_EQ(got.predictions, want.predictions);

  // The base replaced by another save: the chain of pass 2 is refused, naming the link.
  fs::remove_all(dir / "0");
  fs::copy(dir / "1", dir / "0", fs::copy_options::recursive);
  Trainer another(config(root_ / "unused_delta2", {"runner.save_mode=delta"}), env());
  const std::string what = error_of([&] { another.load((dir / "2").string()); });
  EXPECT_NE(what.find("applies onto " + (dir / "0").string() +
                      ", but that folder now holds another save"),
            std::string::npos)
      << what;
}

}  // namespace
}  // namespace gpubox::trainer
