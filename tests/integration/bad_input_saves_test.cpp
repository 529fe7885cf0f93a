// A save read by --mode infer, an export or --load, and --mode infer's --predictions_out, through
// the real binaries (the fixture: bad_input_binaries.hpp):
//  - a save loaded under another network or input names the keys that differ, also where the
//    parameter count is the same (slots reordered, the dense transform as applied);
//  - infer and export read a save at its own row starts (initial_range, seeds), or refuse;
//  - --load of an export or of the folder of saves says which it is, and a run is refused that
//    would save over the save it starts from;
//  - --predictions_out is checked before the evaluation, never one of its inputs (a data file,
//    the config, a path in the save), and replaced only when written whole, through a symlink to
//    its target, and written in place into a FIFO.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/integration/bad_input_binaries.hpp"

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using testing::BadInputBinaries;
using testing::Finished;

// A key the save never saw reads, in --mode infer and an export, as the row it would have started
// at: under another initial_range or seed than the save's, both answered for other rows (exit 0).
// They are refused naming the -o that reads the save at its own; a load to train on takes the
// config's for its new keys. At initial_range 0 the seeds start nothing.
TEST_F(BadInputBinaries, ASaveIsEvaluatedAndExportedAtItsOwnRowStarts) {
  const std::string save = (root_ / "row_start_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1",
                               "-o", "hyper_parameters.sparse_optimizer.initial_range=0.1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string load = save + "/0";
  const std::string range = "hyper_parameters.sparse_optimizer.initial_range";
  for (const std::string mode : {"infer", "export"}) {
    for (const std::string& other : {range + "=0.2", std::string("runner.seed=5"),
                                     std::string("hyper_parameters.sparse_optimizer.seed=9")}) {
      std::vector<std::string> args = {"--mode", mode,           "--load", load,
                                       "-o",     range + "=0.1", "-o",     other};
      if (mode == "export") args.insert(args.end(), {"--out", (root_ / "no_export").string()});
      const Finished refused = train(args);
      EXPECT_EQ(refused.status, 1) << refused.output;
      EXPECT_NE(refused.output.find("started its rows at other values"), std::string::npos)
          << mode << " " << other << "\n"
          << refused.output;
      const std::string key = other.substr(0, other.find('='));
      EXPECT_NE(refused.output.find(key + ": saved "), std::string::npos) << refused.output;
      EXPECT_FALSE(fs::exists(root_ / "no_export"));
    }
    // At the save's own values: read.
    std::vector<std::string> args = {"--mode", mode, "--load", load, "-o", range + "=0.1"};
    if (mode == "export") args.insert(args.end(), {"--out", (root_ / "row_start_export").string()});
    const Finished read = train(args);
    EXPECT_EQ(read.status, 0) << mode << "\n" << read.output;
  }
  const Finished warm = train({"--load", load, "-o", "runner.model_save_path=", "-o",
                               "runner.epochs=1", "-o", range + "=0.2"});
  EXPECT_EQ(warm.status, 0) << warm.output;
  // At initial_range 0 (both) an unseen key's row is zeros whatever the seeds, and embedx is
  // never drawn outside a push: other seeds and mf_initial_range are read (a seed sweep's
  // evaluation was refused).
  const std::string zero = (root_ / "row_start_zero").string();
  ASSERT_EQ(train({"-o", "runner.model_save_path=" + zero, "-o", "runner.epochs=1", "-o",
                   "runner.seed=7"})
                .status,
            0);
  const Finished swept = train({"--mode", "infer", "--load", zero + "/0", "-o", "runner.seed=8",
                                "-o", "hyper_parameters.sparse_optimizer.mf_initial_range=0.3"});
  EXPECT_EQ(swept.status, 0) << swept.output;
}

// A save loaded under another network names the keys that differ (it guessed "different
// fc_sizes, slots, dense_input_dim or dnn_batch_norm?", even when the model was another one);
// learning rates that differ are not named (a save loads under other ones).
TEST_F(BadInputBinaries, ASaveOfAnotherNetworkNamesTheKeysThatDiffer) {
  const std::string save = (root_ / "network_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string load = save + "/0";
  struct Case {
    std::vector<std::string> overrides;
    std::string named;
  };
  // The slots in another order and the dense values transformed have the save's parameter
  // count: they were read silently as the save (another model's predictions, exit 0).
  for (const Case& c : std::vector<Case>{
           {{"hyper_parameters.model=deepfm"}, "hyper_parameters.model: saved dnn, now deepfm"},
           {{"hyper_parameters.fc_sizes=[16]", "hyper_parameters.optimizer.learning_rate=0.5"},
            "hyper_parameters.fc_sizes: saved [8], now [16]"},
           {{"hyper_parameters.slot_names=[\"4\", \"3\", \"2\", \"1\"]"},
            "hyper_parameters.slot_names: saved [], now [4, 3, 2, 1]"},
           {{"runner.dense_transform=log1p"}, "runner.dense_transform: saved none, now log1p"}}) {
    for (const std::string mode : {"infer", "train", "export"}) {
      std::vector<std::string> args = {"--mode", mode, "--load", load};
      for (const std::string& o : c.overrides) args.insert(args.end(), {"-o", o});
      if (mode == "train") args.insert(args.end(), {"-o", "runner.model_save_path="});
      if (mode == "export") args.insert(args.end(), {"--out", (root_ / "no_export").string()});
      const Finished refused = train(args);
      EXPECT_EQ(refused.status, 1) << refused.output;
      EXPECT_NE(refused.output.find("save " + load +
                                    " was made for another network or input "
                                    "than the config "),
                std::string::npos)
          << mode << "\n"
          << refused.output;
      EXPECT_NE(refused.output.find(c.named), std::string::npos) << mode << "\n" << refused.output;
      EXPECT_EQ(refused.output.find("learning_rate"), std::string::npos) << refused.output;
      EXPECT_FALSE(fs::exists(root_ / "no_export"));
    }
  }
  // The numbered slot names written out are the same network as none given.
  const Finished same = train({"--mode", "infer", "--load", load, "-o",
                               "hyper_parameters.slot_names=[\"1\", \"2\", \"3\", \"4\"]"});
  EXPECT_EQ(same.status, 0) << same.output;
}

// --predictions_out that cannot be written is refused before the evaluation (it was found only
// after every save was evaluated), and an evaluation that fails leaves an earlier file whole.
TEST_F(BadInputBinaries, PredictionsOutIsCheckedFirstAndWrittenWhole) {
  const std::string save = (root_ / "predicted_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const fs::path file = root_ / "a_file_three";
  std::ofstream(file) << "not a folder\n";
  const std::string nowhere = (file / "p.txt").string();
  const Finished refused =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", nowhere});
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("gpubox_train: cannot write --predictions_out '" + nowhere + "'"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(refused.output.find("infer: save:"), std::string::npos) << refused.output;
  // With several trainers each evaluates its share: one file would hold a share alone.
  std::vector<std::string> two = testing::kLocalTier;
  two.insert(two.end(), {"PADDLE_TRAINERS_NUM=2", "PADDLE_TRAINER_ID=0"});
  const Finished shared = testing::run_to_end(
      GPUBOX_TRAIN_BIN,
      {"--config", (root_ / "config.yaml").string(), "--mode", "infer", "--load", save + "/0",
       "--predictions_out", (root_ / "shared.txt").string()},
      two, root_.string(), 60);
  EXPECT_EQ(shared.status, 1) << shared.output;
  EXPECT_NE(shared.output.find("--predictions_out with 2 trainers (PADDLE_TRAINERS_NUM=2)"),
            std::string::npos)
      << shared.output;
  EXPECT_FALSE(fs::exists(root_ / "shared.txt"));

  const fs::path kept = root_ / "predictions.txt";
  std::ofstream(kept) << "1 0.5\n";
  const Finished failed = train(
      {"--mode", "infer", "--load", save + "/7", "--predictions_out", kept.string()});  // no save
  EXPECT_EQ(failed.status, 1) << failed.output;
  std::ifstream in(kept);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "1 0.5\n");
  EXPECT_FALSE(fs::exists(kept.string() + ".tmp"));

  const Finished written =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", kept.string()});
  ASSERT_EQ(written.status, 0) << written.output;
  std::ifstream again(kept);
  std::size_t lines = 0;
  for (std::string line; std::getline(again, line);) ++lines;
  EXPECT_EQ(lines, 200u);  // the test data's instances
  EXPECT_FALSE(fs::exists(kept.string() + ".tmp"));
}

// --predictions_out naming one of the evaluation's inputs replaced it, exit 0: the test data by
// its predictions, a save's MODEL_MANIFEST (the save unreadable after), the config. Refused
// before the evaluation, naming the input; each is left as it was.
TEST_F(BadInputBinaries, PredictionsOutIsNeverAnInput) {
  const std::string save = (root_ / "input_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const fs::path data = root_ / "input_data";
  fs::create_directories(data);
  fs::copy_file(root_ / "test" / "part-00000", data / "part-00000",
                fs::copy_options::overwrite_existing);
  fs::create_symlink(data / "part-00000", root_ / "input_data_link");
  const std::string manifest = save + "/0/MODEL_MANIFEST";
  const auto bytes = [](const fs::path& file) {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string data_before = bytes(data / "part-00000");
  const std::string manifest_before = bytes(manifest);
  const std::string config_before = bytes(root_ / "config.yaml");
  struct Case {
    std::string out;
    std::string named;
  };
  for (const Case& c : std::vector<Case>{
           {(data / "part-00000").string(), "is the data file"},
           {(root_ / "input_data_link").string(), "is the data file"},  // a link to it
           {manifest, "is inside the save"},
           {save + "/0/new.txt", "is inside the save"},
           {(root_ / "." / "config.yaml").string(), "is the config"}}) {
    const Finished refused = train({"--mode", "infer", "--load", save + "/0", "--infer_data_dir",
                                    data.string(), "--predictions_out", c.out});
    EXPECT_EQ(refused.status, 1) << refused.output;
    EXPECT_NE(refused.output.find("--predictions_out '" + c.out + "' " + c.named),
              std::string::npos)
        << refused.output;
    EXPECT_EQ(refused.output.find("infer: save:"), std::string::npos) << refused.output;
  }
  EXPECT_EQ(bytes(data / "part-00000"), data_before);
  EXPECT_EQ(bytes(manifest), manifest_before);
  EXPECT_EQ(bytes(root_ / "config.yaml"), config_before);
  EXPECT_FALSE(fs::exists(save + "/0/new.txt"));
  // Beside the inputs: written.
  const Finished written =
      train({"--mode", "infer", "--load", save + "/0", "--infer_data_dir", data.string(),
             "--predictions_out", (root_ / "input_predictions.txt").string()});
  EXPECT_EQ(written.status, 0) << written.output;
}

// --load naming an export, or the folder the saves are in, said "a save cut short, or not a gpubox
// save": it says which it is, and names a save to load.
TEST_F(BadInputBinaries, ALoadOfAnExportOrAFolderOfSavesSaysWhatItIs) {
  const std::string saves = (root_ / "what_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + saves});  // 2 epochs: 0 and 1
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string exported = (root_ / "what_export").string();
  ASSERT_EQ(train({"--mode", "export", "--load", saves + "/1", "--out", exported}).status, 0);
  const Finished of_export = train({"--mode", "infer", "--load", exported});
  EXPECT_EQ(of_export.status, 1) << of_export.output;
  EXPECT_NE(of_export.output.find("it is an export, which gpubox_serve reads"), std::string::npos)
      << of_export.output;
  const Finished of_folder = train({"--mode", "infer", "--load", saves});
  EXPECT_EQ(of_folder.status, 1) << of_folder.output;
  EXPECT_NE(
      of_folder.output.find("it is a folder of 2 saves (0 .. 1): name one, e.g. " + saves + "/1"),
      std::string::npos)
      << of_folder.output;
}

// A run loading a save its own passes save over (--load <model_save_path>/1, resume off, as a
// user trains on from a save in place) replaced it, and each rerun of the same command started
// from the model the last one left there, exit 0: refused before training, the save untouched.
TEST_F(BadInputBinaries, ARunNeverSavesOverTheSaveItStartsFrom) {
  const std::string saves = (root_ / "in_place_saves").string();
  ASSERT_EQ(train({"-o", "runner.model_save_path=" + saves}).status, 0);  // saves 0 and 1
  std::ifstream before_in(saves + "/1/MODEL_MANIFEST");
  const std::string before(std::istreambuf_iterator<char>(before_in), {});
  for (const std::string& load : {saves + "/1", saves + "/./1/"}) {
    const Finished refused =
        train({"--load", load, "-o", "runner.model_save_path=" + saves, "-o", "runner.resume=off"});
    EXPECT_EQ(refused.status, 1) << refused.output;
    EXPECT_NE(refused.output.find("the run starts from the save " + load +
                                  ", which its pass 1 saves over"),
              std::string::npos)
        << refused.output;
    EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
  }
  std::ifstream after_in(saves + "/1/MODEL_MANIFEST");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(after_in), {}), before);
  // Saved elsewhere: trains.
  const Finished elsewhere =
      train({"--load", saves + "/1", "-o",
             "runner.model_save_path=" + (root_ / "in_place_next").string()});
  EXPECT_EQ(elsewhere.status, 0) << elsewhere.output;
  // A delta save's base in the same folder: its pass 0 replaced the base (the daily warm start of
  // online training), and neither the save started from nor the new ones loaded, exit 0.
  const std::string deltas = (root_ / "in_place_deltas").string();
  ASSERT_EQ(
      train({"-o", "runner.model_save_path=" + deltas, "-o", "runner.save_mode=delta"}).status,
      0);  // 0 a base, 1 a delta onto it
  const Finished onto_base =
      train({"--load", deltas + "/1", "-o", "runner.model_save_path=" + deltas, "-o",
             "runner.resume=off", "-o", "runner.epochs=1", "-o", "runner.save_mode=delta"});
  EXPECT_EQ(onto_base.status, 1) << onto_base.output;
  EXPECT_NE(onto_base.output.find("the run starts from the save " + deltas +
                                  "/1, a delta save that applies onto "),
            std::string::npos)
      << onto_base.output;
  EXPECT_FALSE(trained_a_pass(onto_base)) << onto_base.output;
  EXPECT_EQ(train({"--mode", "infer", "--load", deltas + "/1"}).status, 0);
}

// runner.train_batch_size is per card: a resume on two cards of a job of one trained on at twice
// its batch, unsaid. The cards are the job's now: another count is another job, named.
TEST_F(BadInputBinaries, AResumeOnAnotherCardCountIsAnotherJob) {
  const std::string saves = (root_ / "card_saves").string();
  ASSERT_EQ(train({"-o", "runner.model_save_path=" + saves, "-o", "runner.epochs=1"}).status, 0);
  std::vector<std::string> env = testing::kLocalTier;
  env.push_back("FLAGS_selected_gpus=0,1");
  const Finished refused = testing::run_to_end(
      GPUBOX_TRAIN_BIN,
      {"--config", (root_ / "config.yaml").string(), "-o", "runner.model_save_path=" + saves}, env,
      root_.string(), 120);
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("cards: saved 1, now 2"), std::string::npos) << refused.output;
  EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
  // On its one card the job goes on.
  const Finished resumed =
      train({"-o", "runner.model_save_path=" + saves});  // epochs 2: pass 1 is new
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("pass: 1,"), std::string::npos) << resumed.output;
}

// save_mode delta after a --load of another folder's save: the run's first save is a base (it
// was a delta onto the loaded save, in the other folder: unloadable once that folder's job was
// rerun or removed), the next ones deltas in this folder.
TEST_F(BadInputBinaries, ADeltaChainStaysInItsFolder) {
  const std::string a = (root_ / "delta_a").string();
  const std::string b = (root_ / "delta_b").string();
  ASSERT_EQ(train({"-o", "runner.model_save_path=" + a, "-o", "runner.save_mode=delta"}).status, 0);
  ASSERT_EQ(train({"--load", a + "/1", "-o", "runner.model_save_path=" + b, "-o",
                   "runner.save_mode=delta"})
                .status,
            0);
  const auto manifest = [](const std::string& dir) {
    std::ifstream in(dir + "/MODEL_MANIFEST");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_NE(manifest(a + "/1").find("property parent ../0\n"), std::string::npos);
  EXPECT_NE(manifest(b + "/0").find("property save_mode base\n"), std::string::npos)
      << manifest(b + "/0");
  EXPECT_EQ(manifest(b + "/0").find("property parent "), std::string::npos) << manifest(b + "/0");
  EXPECT_NE(manifest(b + "/1").find("property parent ../0\n"), std::string::npos)
      << manifest(b + "/1");
}

// A run killed after an epoch's last save and before its evaluation ended left the epoch
// unevaluated, and the rerun (resuming after that save) never evaluated it, unsaid. An epoch's
// evaluation marks its save; a resume after a save without the mark evaluates that epoch first.
// With the mark (more epochs for a finished job), it is not evaluated again.
TEST_F(BadInputBinaries, AnEpochWhoseEvaluationWasCutShortIsEvaluatedOnResume) {
  const std::string saves = (root_ / "evaluated_saves").string();
  const Finished one = train({"-o", "runner.model_save_path=" + saves, "-o", "runner.epochs=1"});
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_TRUE(fs::exists(saves + "/0/.gpubox_evaluated"));
  const std::string said = "epoch 0: the run before this one stopped after its last pass's save";
  const Finished more = train({"-o", "runner.model_save_path=" + saves, "-o", "runner.epochs=2"});
  ASSERT_EQ(more.status, 0) << more.output;
  EXPECT_EQ(more.output.find(said), std::string::npos) << more.output;
  EXPECT_EQ(more.output.find("epoch: 0, test auc"), std::string::npos) << more.output;
  // As if killed before epoch 1's evaluation ended: its save holds no mark.
  fs::remove(saves + "/1/.gpubox_evaluated");
  const Finished again = train({"-o", "runner.model_save_path=" + saves, "-o", "runner.epochs=3"});
  ASSERT_EQ(again.status, 0) << again.output;
  const auto note = again.output.find("epoch 1: the run before this one stopped");
  const auto line = again.output.find("epoch: 1, test auc");
  const auto pass = again.output.find("pass: 2,");
  ASSERT_NE(note, std::string::npos) << again.output;
  ASSERT_NE(line, std::string::npos) << again.output;
  EXPECT_LT(line, pass) << "evaluated before the next pass trains";
  EXPECT_TRUE(fs::exists(saves + "/1/.gpubox_evaluated"));
  EXPECT_TRUE(fs::exists(saves + "/2/.gpubox_evaluated"));
}

// The job's last epoch cut short in its evaluation: the rerun found its last save ending the job
// and trained the whole job again (a helper's probe). Resumed from that save for the evaluation
// alone, when the epoch before holds its mark (a run that evaluated), or the evaluation's start
// left its own (a job of one epoch has no epoch before). Killed after the epoch's test line and
// before the mark, the rerun does not write the line twice.
TEST_F(BadInputBinaries, AJobWhoseLastEvaluationWasCutShortIsOnlyEvaluatedOnRerun) {
  const std::string saves = (root_ / "last_evaluation_saves").string();
  const std::string metrics = (root_ / "last_evaluation_metrics.jsonl").string();
  const std::vector<std::string> args = {"-o", "runner.model_save_path=" + saves,
                                         "-o", "runner.epochs=2",
                                         "-o", "runner.metrics_path=" + metrics};
  ASSERT_EQ(train(args).status, 0);
  const auto test_lines = [&](int epoch) {
    std::ifstream in(metrics);
    int n = 0;
    const std::string start = "{\"epoch\": " + std::to_string(epoch) + ", \"test_auc\"";
    for (std::string line; std::getline(in, line);) n += line.rfind(start, 0) == 0 ? 1 : 0;
    return n;
  };
  ASSERT_EQ(test_lines(1), 1);
  fs::remove(saves + "/1/.gpubox_evaluated");  // as if killed in epoch 1's evaluation
  const Finished again = train(args);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("ends this job, but its last epoch was not evaluated"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("epoch: 1, test auc"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("pass: 0,"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("pass: 1,"), std::string::npos) << again.output;
  EXPECT_TRUE(fs::exists(saves + "/1/.gpubox_evaluated"));
  EXPECT_FALSE(fs::exists(saves + "/1/.gpubox_evaluating"));
  EXPECT_EQ(test_lines(1), 1) << "the line the killed run wrote is not written twice";
  // Evaluated now: the next rerun of the finished job trains it again, as before.
  const Finished rerun = train(args);
  ASSERT_EQ(rerun.status, 0) << rerun.output;
  EXPECT_NE(rerun.output.find("pass: 0,"), std::string::npos) << rerun.output;
  EXPECT_EQ(test_lines(1), 2) << "a job trained again writes its lines again";

  // One epoch, killed in its evaluation (the mark of its start left, no mark of its end): only
  // evaluated on rerun. Without the start's mark (a run that never evaluated) it trains again.
  const std::vector<std::string> one = {"-o", "runner.model_save_path=" + saves + "_one", "-o",
                                        "runner.epochs=1"};
  ASSERT_EQ(train(one).status, 0);
  fs::remove(saves + "_one/0/.gpubox_evaluated");
  std::ofstream(saves + "_one/0/.gpubox_evaluating") << "evaluating\n";
  const Finished evaluated = train(one);
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_NE(evaluated.output.find("epoch: 0, test auc"), std::string::npos) << evaluated.output;
  EXPECT_EQ(evaluated.output.find("pass: 0,"), std::string::npos) << evaluated.output;
  fs::remove(saves + "_one/0/.gpubox_evaluated");
  const Finished trained = train(one);
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_NE(trained.output.find("pass: 0,"), std::string::npos) << trained.output;
}

// A run killed between a pass's save and its metrics line lost the line for good: the rerun
// resumed after the save and never wrote it (a helper's kill probe). The save keeps the line; the
// resume appends it, once.
TEST_F(BadInputBinaries, APassLineLostAfterItsSaveIsRestoredOnResume) {
  const std::string saves = (root_ / "lost_line_saves").string();
  const std::string metrics = (root_ / "lost_line_metrics.jsonl").string();
  const std::vector<std::string> args = {"-o", "runner.model_save_path=" + saves,
                                         "-o", "runner.epochs=2",
                                         "-o", "runner.metrics_path=" + metrics};
  ASSERT_EQ(train(args).status, 0);
  const auto lines = [&] {
    std::ifstream in(metrics);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  ASSERT_EQ(lines().size(), 4u);  // pass 0, epoch 0, pass 1, epoch 1
  const std::string pass0 = lines()[0];
  // As if killed right after pass 0's save (and its evaluation): no line yet, no pass 1.
  fs::remove_all(saves + "/1");
  std::ofstream(metrics, std::ios::trunc).close();
  const Finished again = train(args);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("appended from its save"), std::string::npos) << again.output;
  // A base save resumed: warned (its rows' accumulators start again), not an INFO aside.
  const auto warned = again.output.find("] runner.resume: a base save holds no sparse optimizer");
  ASSERT_NE(warned, std::string::npos) << again.output;
  EXPECT_EQ(again.output[again.output.rfind('\n', warned) + 1], 'W') << "a warning line";
  ASSERT_EQ(lines().size(), 3u);  // pass 0 (restored), pass 1, epoch 1
  EXPECT_EQ(lines()[0], pass0) << "as the killed run wrote it";
  EXPECT_EQ(lines()[1].rfind("{\"pass\": 1,", 0), 0u) << lines()[1];
  // The line there already: not written twice.
  fs::remove_all(saves + "/1");
  ASSERT_EQ(train(args).status, 0);
  int pass0_lines = 0;
  for (const std::string& line : lines()) pass0_lines += line == pass0 ? 1 : 0;
  EXPECT_EQ(pass0_lines, 1);
}

// A resume within an epoch: the epoch's lines count its passes from the resume on only, and say
// so (they read as the whole epoch's, over a third of its examples).
TEST_F(BadInputBinaries, AnEpochLineAfterAResumeWithinItSaysWhatItCounts) {
  const std::string saves = (root_ / "mid_epoch_saves").string();
  const std::vector<std::string> args = {"-o", "runner.model_save_path=" + saves,
                                         "-o", "runner.pass_dirs=[train, test]",
                                         "-o", "runner.epochs=1"};
  ASSERT_EQ(train(args).status, 0);
  EXPECT_EQ(train(args).output.find("its lines count passes"), std::string::npos);  // rerun: whole
  fs::remove_all(saves + "/1");  // as if killed before pass 1's save
  const Finished resumed = train(args);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("epoch 0: its lines count passes 1 to 1 only (this run went on "
                                "after pass 0's save"),
            std::string::npos)
      << resumed.output;
}

// --predictions_out holds one save's rows, one per line: several saves to evaluate are refused
// (it kept the last save's, unsaid), and so is a malformed line, named (skipped, it moved every
// row after it off its line).
TEST_F(BadInputBinaries, PredictionsOutIsOneSavesRowPerLine) {
  const std::string save = (root_ / "two_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save});
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string out = (root_ / "rows.txt").string();
  const Finished several =
      train({"--mode", "infer", "-o", "runner.infer_load_path=" + save, "--predictions_out", out});
  EXPECT_EQ(several.status, 1) << several.output;
  EXPECT_NE(several.output.find("are one save's, and 2 saves would be evaluated"),
            std::string::npos)
      << several.output;
  EXPECT_FALSE(fs::exists(out));
  // The evaluation of `data` with --predictions_out stops naming `line` (file:line: reason),
  // writing nothing; without the flag the line is skipped and counted as before.
  const auto stops_at = [&](const fs::path& data, const std::string& line) {
    const Finished refused = train({"--mode", "infer", "--load", save + "/1", "--infer_data_dir",
                                    data.string(), "--predictions_out", out});
    EXPECT_EQ(refused.status, 1) << refused.output;
    EXPECT_NE(refused.output.find((data / "part-00000").string() + line), std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find("(--predictions_out keeps a row per line"), std::string::npos)
        << refused.output;
    EXPECT_FALSE(fs::exists(out));
    const Finished lenient =
        train({"--mode", "infer", "--load", save + "/1", "--infer_data_dir", data.string()});
    EXPECT_EQ(lenient.status, 0) << lenient.output;
  };
  stops_at(edited_test_data("bad_test",
                            [](int n, const std::string& line) {
                              return (n == 5 ? "click:7 1:3" : line) + "\n";
                            }),
           ":5: bad_label");
  // A blank line (or one of spaces) would move every row after it too.
  stops_at(edited_test_data(
               "blank_test",
               [](int n, const std::string& line) { return line + (n == 3 ? "\n   \n" : "\n"); }),
           ":4: blank line");
}

// --predictions_out through a symlink writes its target and keeps the link; into a FIFO it writes
// the lines to the reader (both were replaced by a regular file <path>.tmp was renamed to).
TEST_F(BadInputBinaries, PredictionsOutWritesThroughSymlinksAndFifos) {
  const std::string save = (root_ / "linked_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const fs::path target = root_ / "target.txt";
  const fs::path link = root_ / "link.txt";
  std::ofstream(target) << "1 0.5\n";
  fs::create_symlink(target, link);
  const Finished linked =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", link.string()});
  ASSERT_EQ(linked.status, 0) << linked.output;
  EXPECT_TRUE(fs::is_symlink(link));
  std::ifstream in(target);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 200u);

  const fs::path fifo = root_ / "predictions.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Held open read-write and non-blocking: the run's open does not wait, and 200 short lines fit
  // the pipe's buffer, read after the run.
  const int reader = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  const Finished piped =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", fifo.string()});
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(reader, buf, sizeof(buf))) > 0;) text.append(buf, n);
  ::close(reader);
  ASSERT_EQ(piped.status, 0) << piped.output;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 200) << text;
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
}  // namespace gpubox
