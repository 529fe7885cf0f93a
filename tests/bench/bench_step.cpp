// gpubox_bench step: what one training step of the default model asks of each card, and how
// fast it goes, on generated data. The counts come from the device layer (counters.hpp), which
// counts the same on the cpu and cuda backends: on this machine they predict a GPU step.
//
//   gpubox_bench step [--cards N] [--batch B] [--steps S] [--threads T] [--data DIR]
//                     [--keys_per_slot MIN:MAX] [--collective] [--no_predictions] [--json]
//
// Trains two passes over the same data (B instances per card per step, S steps per pass, not
// shuffled): the first sizes every buffer, the second is the steady state the figures come
// from (past its 2 warm-up steps): per card per step host_syncs, allocations, pageable and
// pinned copies (and of them, those on the card's copy stream: the batch upload, overlapping
// the step before), stream waits for another stream's event, launches and collectives outside
// step graphs, graph launches and the graphs' nodes (the sparse half of every planned batch and
// the dense half of a full batch run as step graphs; GPUBOX_STEP_GRAPHS=0 turns them off); and
// examples/s of the second pass's training phase;
// and the first pass's totals over every step (first_pass_step_*: allocations, frees, pinned
// allocations and frees; first_between_steps_allocations: the next pass's card work); and the
// second pass's step wall times (step_ms_p50, step_ms_p99, step_ms_max over its steady steps)
// and the cards' memory high-water mark (card_memory_peak_mb); then an evaluation over the same
// data (batch B): its per card per step counts past its 2 warm-up steps (eval_*_per_step:
// CardWorker::eval_step), keeping its predictions as `gpubox_train --mode infer
// --predictions_out` does (the copy into the ring slot's pinned block inside the step's graph;
// --no_predictions: not kept): how many came back and how many are not a probability
// (eval_predictions, eval_predictions_bad), and the graphs it captured (eval_graph_captures: one
// per upload buffer on each card, every batch full).
// Data: `gpubox_data gen`'s generator (26 slots, 13 dense; the default model's shape; with
// --keys_per_slot, MIN to MAX keys in each slot of a line) into a temporary folder, or the
// slot-format files of --data. --collective: Collective mode (runner.use_fleet, the whole table on
// every card; "mode" in the JSON says which).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "heterps/device/card.hpp"
#include "tests/bench/bench_command.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::bench {
namespace {

namespace fs = std::filesystem;

// Removes the generated data folder on every way out.
struct TempFolder {
  fs::path path;
  ~TempFolder() {
    std::error_code ignored;
    if (!path.empty()) fs::remove_all(path, ignored);
  }
};

// The evaluation's predictions that came back, and of them those that are no probability (not
// finite, or outside [0, 1]): a step's copy into a pinned block that went astray leaves zeros or
// another step's values, which the count and the AUC show.
struct PredictionCounts {
  std::size_t count = 0;
  std::size_t bad = 0;
};
PredictionCounts count_predictions(const trainer::EvalResult& evaluated) {
  PredictionCounts out;
  out.count = evaluated.predictions.size();
  for (float p : evaluated.predictions) {
    if (!(p >= 0.0f && p <= 1.0f)) ++out.bad;  // NaN too
  }
  return out;
}

// Launches and collectives count what the host enqueued outside step graphs; a graph's work
// is in graph_nodes (heterps/device/step_graph.hpp).
constexpr const char* kCounts[] = {
    "host_syncs_per_step",      "pipeline_waits_per_step", "max_pipeline_waits_in_a_step",
    "allocations_per_step",     "frees_per_step",          "pinned_allocations_per_step",
    "pageable_copies_per_step", "pinned_copies_per_step",  "copy_stream_copies_per_step",
    "stream_waits_per_step",    "launches_per_step",       "launches_outside_graph_per_step",
    "collectives_per_step",     "graph_launches_per_step", "graph_nodes_per_step",
    "graph_captures_per_step"};
// An evaluation over the same data after the two passes (runner.infer_batch_size = B): per card
// per step past its warm-up, what an evaluation step costs (CardWorker::eval_step).
constexpr const char* kEvalCounts[] = {"eval_host_syncs_per_step",
                                       "eval_pipeline_waits_per_step",
                                       "eval_max_pipeline_waits_in_a_step",
                                       "eval_allocations_per_step",
                                       "eval_pageable_copies_per_step",
                                       "eval_pinned_copies_per_step",
                                       "eval_launches_per_step",
                                       "eval_collectives_per_step",
                                       "eval_graph_launches_per_step",
                                       "eval_graph_nodes_per_step",
                                       "eval_graph_captures_per_step"};
// Totals over every step of the first pass (all cards, its first steps included): what sizing
// the step buffers before the pass leaves to the steps themselves.
constexpr const char* kFirstPass[] = {"pass_step_allocations", "pass_step_frees",
                                      "pass_step_pinned_allocations", "between_steps_allocations"};
// The second pass's step wall times over its steady steps and the cards' memory high-water
// mark (scripts/gpu_check.sh reports them per card count).
constexpr const char* kTimes[] = {"step_ms_p50", "step_ms_p99", "step_ms_max",
                                  "card_memory_peak_mb"};

#if defined(GPUBOX_BACKEND_CUDA)
constexpr const char* kBackend = "cuda";
#else
constexpr const char* kBackend = "cpu";
#endif

// The command line's choices.
struct StepOptions {
  int cards = 1;
  int batch = 512;
  int steps = 20;
  int threads = 0;  // per card (cpu backend); 0: cores / cards
  bool json = false;
  bool collective = false;
  bool keep_predictions = true;
};

StepOptions read_options(const BenchArgs& args) {
  args.expect_only({"cards", "batch", "steps", "threads", "data", "keys_per_slot", "collective",
                    "no_predictions", "json"});
  StepOptions o;
  o.cards = static_cast<int>(args.get_int("cards", 1));
  o.batch = static_cast<int>(args.get_int("batch", 512));
  o.steps = static_cast<int>(args.get_int("steps", 20));
  o.threads = static_cast<int>(args.get_int("threads", 0));
  o.json = args.has("json");
  o.collective = args.has("collective");
  o.keep_predictions = !args.has("no_predictions");
  GPUBOX_EXPECTS(o.cards >= 1 && o.batch >= 1 && o.steps >= 3,
                 "--cards and --batch must be positive "
                 "and --steps at least 3");
  return o;
}

// --data, or B x cards x S lines generated into `generated` (--keys_per_slot).
std::string step_data(const BenchArgs& args, const StepOptions& o, TempFolder& generated) {
  const std::string data = args.get("data", "");
  if (!data.empty()) return data;
  generated.path = fs::temp_directory_path() / ("gpubox_bench_step." + std::to_string(::getpid()));
  dataset::GeneratorOptions gen;
  gen.out_dir = generated.path.string();
  gen.lines = static_cast<uint64_t>(o.batch) * o.cards * o.steps;
  gen.files = 1;
  gen.seed = 1;
  throw_if_error(dataset::parse_keys_per_slot(args.get("keys_per_slot", "1:1"), &gen));
  dataset::OracleSummary oracle;
  throw_if_error(dataset::generate(gen, &oracle));
  return gen.out_dir;
}

// What the two passes and the evaluation report.
struct StepFigures {
  int sparse_slots = 0, embedding_width = 0, dense_dim = 0;  // the model's shape
  std::map<std::string, double> first;                       // the first pass's extra figures
  std::map<std::string, double> extra;                       // the second pass's
  std::map<std::string, double> eval;                        // the evaluation's
  double eval_examples = 0;
  PredictionCounts predictions;
  double train_seconds = 0;
  double examples_per_sec = 0;
};

StepFigures measure(const StepOptions& o, const std::string& data) {
  // The default model (every key at its table default); the second pass repeats the first
  // one's steps (no shuffle).
  auto parsed = trainer::parse_trainer_config(
      "runner: {}\n", ".",
      {"runner.train_data_dir=" + data, "runner.train_batch_size=" + std::to_string(o.batch),
       "runner.infer_batch_size=" + std::to_string(o.batch), "runner.shuffle=false",
       "runner.metrics_path=",
       std::string("runner.use_fleet=") + (o.collective ? "true" : "false")});
  throw_if_error(parsed.status());
  const trainer::TrainerConfig config = std::move(parsed).value();
  trainer::TrainerEnv env;
  for (int c = 0; c < o.cards; ++c) env.selected_cards += (c ? "," : "") + std::to_string(c);
  env.threads_per_card = o.threads;
  trainer::Trainer trainer(config, env);
  const std::vector<std::string> files = trainer::data_files(data);
  const trainer::PassReport first = trainer.train_pass(files);
  const trainer::PassReport report = trainer.train_pass(files);
  const trainer::EvalResult evaluated = trainer.evaluate(files, o.keep_predictions);
  StepFigures f;
  f.sparse_slots = config.num_sparse_slots();
  f.embedding_width = config.mf_dim() + 1;
  f.dense_dim = config.dataset.dense_dim;
  f.first = {first.extra.begin(), first.extra.end()};
  f.extra = {report.extra.begin(), report.extra.end()};
  f.eval = {evaluated.extra.begin(), evaluated.extra.end()};
  f.eval_examples = evaluated.metrics.examples;
  f.predictions = count_predictions(evaluated);
  GPUBOX_EXPECTS(f.eval.count("eval_steady_steps") > 0,
                 "the evaluation had no steps past its warm-up (--steps ", o.steps, ")");
  GPUBOX_EXPECTS(f.extra.count("steady_steps") > 0, "the pass had no steady steps (--steps ",
                 o.steps, " with ", report.metrics.examples, " examples)");
  f.train_seconds = f.extra.at("train_seconds");
  f.examples_per_sec = f.train_seconds > 0 ? report.metrics.examples / f.train_seconds : 0;
  return f;
}

void print_json(const StepOptions& o, const StepFigures& f) {
  std::printf(
      "{\"bench\": \"step\", \"backend\": \"%s\", \"mode\": \"%s\", \"cards\": %d, "
      "\"batch\": %d, "
      "\"threads_per_card\": %d, \"model\": \"%d slots x %d + %d dense -> 512-256-128-32-1\", "
      "\"steady_steps\": %.0f",
      kBackend, o.collective ? "collective" : "gpubox", o.cards, o.batch, o.threads, f.sparse_slots,
      f.embedding_width, f.dense_dim, f.extra.at("steady_steps"));
  for (const char* name : kCounts) std::printf(", \"%s\": %.3f", name, f.extra.at(name));
  for (const char* name : kFirstPass) std::printf(", \"first_%s\": %.0f", name, f.first.at(name));
  for (const char* name : kTimes) std::printf(", \"%s\": %.3f", name, f.extra.at(name));
  for (const char* name : kEvalCounts) std::printf(", \"%s\": %.3f", name, f.eval.at(name));
  std::printf(
      ", \"eval_graph_captures\": %.0f, \"eval_keep_predictions\": %s, \"eval_examples\": %.0f, "
      "\"eval_predictions\": %zu, \"eval_predictions_bad\": %zu",
      f.eval.at("eval_step_graph_captures"), o.keep_predictions ? "true" : "false", f.eval_examples,
      f.predictions.count, f.predictions.bad);
  std::printf(", \"train_seconds\": %.4f, \"examples_per_sec\": %.1f}\n", f.train_seconds,
              f.examples_per_sec);
}

void print_text(const StepOptions& o, const StepFigures& f) {
  std::printf(
      "step bench (%s backend, %s mode): %d card(s), batch %d per card, default model, %.0f "
      "steady steps of the second pass\n",
      kBackend, o.collective ? "Collective" : "gpubox", o.cards, o.batch,
      f.extra.at("steady_steps"));
  std::printf("  per card per step:");
  for (const char* name : kCounts) std::printf(" %s %.3f,", name, f.extra.at(name));
  std::printf("\n  first pass, every step (all cards):");
  for (const char* name : kFirstPass) std::printf(" %s %.0f,", name, f.first.at(name));
  std::printf("\n  second pass:");
  for (const char* name : kTimes) std::printf(" %s %.3f,", name, f.extra.at(name));
  std::printf("\n  evaluation, per card per step:");
  for (const char* name : kEvalCounts) std::printf(" %s %.3f,", name, f.eval.at(name));
  std::printf(
      "\n  evaluation: %.0f graphs captured, %.0f examples, predictions %s: %zu back, %zu not "
      "a probability",
      f.eval.at("eval_step_graph_captures"), f.eval_examples,
      o.keep_predictions ? "kept" : "not kept", f.predictions.count, f.predictions.bad);
  std::printf("\n  examples/s (all cards, training phase of pass 2): %.1f\n", f.examples_per_sec);
}

int run_step(const BenchArgs& args) {
  const StepOptions options = read_options(args);
  TempFolder generated;  // removed on every way out
  const StepFigures figures = measure(options, step_data(args, options, generated));
  if (options.json) {
    print_json(options, figures);
  } else {
    print_text(options, figures);
  }
  return 0;
}

GPUBOX_BENCH_COMMAND("step",
                     "[--cards N] [--batch B] [--steps S] [--threads T] [--data DIR] "
                     "[--keys_per_slot MIN:MAX] [--collective] [--no_predictions] [--json]: "
                     "host syncs, allocations, copies, launches and collectives per training "
                     "step of the default model, and examples/s; then an evaluation keeping its "
                     "predictions (--no_predictions: not kept)",
                     run_step);

}  // namespace
}  // namespace gpubox::bench
