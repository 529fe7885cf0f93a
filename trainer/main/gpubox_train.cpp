// gpubox_train --config configs/config_gpubox.yaml [-o key=value ...] [--mode train|infer|export]
// gpubox_train -m config.yaml (PaddleRec's spelling) | --print_config_keys |
// --print_config_template | --print_model_root | --help | --version
//
// Trains (or evaluates) a CTR model with GPUBox. Cards come from FLAGS_selected_gpus (on the
// cpu build, that many simulated cards); the host tier runs in-process unless
// PADDLE_PSERVERS_IP_PORT_LIST names gpubox_server endpoints (scripts/run_gpubox.sh sets it).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/cli.hpp"
#include "common/cli_flags.hpp"
#include "common/config/config_document.hpp"
#include "common/config/config_keys.hpp"
#include "common/config/memory_asks.hpp"
#include "common/config/network_shape.hpp"
#include "common/enum_names.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "dataset/text_number.hpp"
#include "heterps/device/card.hpp"
#include "serving/serving_model.hpp"
#include "table/sparse_config.hpp"
#include "trainer/config/clip_by_norm.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/dnn_dropout.hpp"
#include "trainer/config/network_choice.hpp"
#include "trainer/config/unread_keys.hpp"
#include "trainer/engine/job_agreement.hpp"
#include "trainer/main/predictions_out.hpp"
#include "trainer/main/run_job.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/saved_models.hpp"

DEFINE_string(config, "",
              "YAML config (PaddleRec config_gpubox.yaml keys); required. -m and --config_yaml "
              "(PaddleRec's spellings) name it too");
DEFINE_string(mode, "train",
              "train: every pass of the config; infer: evaluate saved models; export: write a "
              "saved model for gpubox_serve (--load, --out)");
DEFINE_string(load, "",
              "a save folder (model_save_path/<pass>) to start from (train; default "
              "runner.model_init_path), to evaluate (infer; default: the saves "
              "runner.infer_load_path, infer_start_epoch and infer_end_epoch name) or to export "
              "(export; default: the last of those saves)");
DEFINE_string(infer_data_dir, "", "infer: data folder to evaluate (default runner.test_data_dir)");
DEFINE_string(predictions_out, "",
              "infer: write 'label prediction' per instance to this file, each number in the "
              "shortest text that reads back to the same float (one save: with --load, or an "
              "infer_load_path of one)");
DEFINE_string(out, "", "export: the serving model folder to write");
DEFINE_double(show_threshold, 0.0, "export: leave out sparse rows shown fewer times than this");
GPUBOX_FLAG_RANGE(show_threshold, 0.0, 1e30);
DEFINE_bool(export_fp16, false, "export: store sparse values as float16 (half the size)");
DEFINE_int32(threads_per_card, 0, "cpu build: host threads per simulated card (0 = cores / cards)");
GPUBOX_FLAG_RANGE(threads_per_card, 0, 4096);
DEFINE_bool(print_config_keys, false,
            "print every config key (type, default, which part reads it, meaning) as the "
            "Markdown table of docs/config-reference.md, and exit");
DEFINE_bool(print_config_template, false,
            "print a config with every key at its default, commented, and exit");
DEFINE_bool(print_model_root, false,
            "print the folder holding every save this command writes or reads "
            "(runner.model_save_path, --load, runner.model_init_path or "
            "runner.infer_load_path; what "
            "scripts/run_gpubox.sh gives its servers as --data_dir), and exit");

namespace {

// --mode export: the save --load as a serving model in --out. Without --load: the save
// runner.infer_load_path names, or the last save of its infer_start_epoch/infer_end_epoch range.
int export_for_serving(const gpubox::trainer::TrainerConfig& config) {
  std::string load = FLAGS_load;
  if (load.empty() && !config.runner.infer_load_path.empty()) {
    load = gpubox::trainer::saves_to_evaluate(config.runner.infer_load_path,
                                              config.runner.infer_start_epoch,
                                              config.runner.infer_end_epoch)
               .back()
               .dir;
  }
  if (load.empty() || FLAGS_out.empty()) {
    std::fprintf(stderr,
                 "gpubox_train: --mode export needs --load (or runner.infer_load_path) "
                 "and --out\n");
    return 2;
  }
  gpubox::serving::ExportOptions options;
  options.show_threshold = FLAGS_show_threshold;
  options.value_type = FLAGS_export_fp16 ? gpubox::serving::ValueType::kFloat16
                                         : gpubox::serving::ValueType::kFloat32;
  const auto summary = gpubox::serving::export_serving_model(config, load, FLAGS_out, options);
  if (!summary.ok()) {
    std::fprintf(stderr, "gpubox_train: %s\n", summary.status().to_string().c_str());
    return 1;
  }
  std::printf(
      "export: %s -> %s: %llu of %llu sparse rows (show >= %g, %s), %llu dense "
      "parameters (trained in %s), %llu bytes\n",
      load.c_str(), FLAGS_out.c_str(), static_cast<unsigned long long>(summary->rows_exported),
      static_cast<unsigned long long>(summary->rows_in_save), FLAGS_show_threshold,
      FLAGS_export_fp16 ? "float16" : "float32",
      static_cast<unsigned long long>(summary->dense_parameters),
      gpubox::name_of(gpubox::trainer::kDensePrecisionNames, summary->precision),
      static_cast<unsigned long long>(summary->bytes));
  return 0;
}

std::string usage_text() {
  gpubox::cli::Usage u;
  u.synopsis =
      "gpubox_train --config CONFIG.yaml [-o key=value ...] [--mode train|infer|export] "
      "[options]";
  u.summary =
      "Trains a CTR model with GPUBox (or, with --mode infer, evaluates saved models; with "
      "--mode export, writes one save as a serving model for gpubox_serve) from a "
      "PaddleRec-style config (config_gpubox.yaml keys). Cards: FLAGS_selected_gpus (on the cpu "
      "build, that many simulated cards); host tier: in-process, or the gpubox_servers of "
      "PADDLE_PSERVERS_IP_PORT_LIST (scripts/run_gpubox.sh starts them). Each pass prints a "
      "line and appends one JSON object to runner.metrics_path; passes and epochs count from 0.";
  u.options = gpubox::cli::gflags_options(__FILE__);
  u.options.push_back(
      {"-m CONFIG.yaml, --config_yaml CONFIG.yaml", "", "PaddleRec's spellings of --config"});
  u.options.push_back({"-o key=value", "",
                       "override a config key (repeatable), e.g. -o runner.epochs=2; relative "
                       "paths are taken from the working directory"});
  u.options.push_back({"--help, -h", "", "print this text and exit"});
  u.options.push_back({"--version", "", "print the version, commit and backend and exit"});
  u.examples = {"gpubox_train --config configs/config_gpubox.yaml -o runner.epochs=2",
                "FLAGS_selected_gpus=0,1 gpubox_train -m models/rank/dnn/config_gpubox.yaml",
                "gpubox_train --config configs/config_gpubox.yaml --mode infer --infer_data_dir "
                "DATA   # every save of runner.infer_load_path in [infer_start_epoch, "
                "infer_end_epoch)",
                "gpubox_train --config configs/config_gpubox.yaml --mode export "
                "--load output/model_dnn/1 --out serving_model"};
  u.notes =
      "Config keys: gpubox_train --print_config_keys (docs/config-reference.md has the same "
      "table).";
  return gpubox::cli::render_usage(u);
}

// PaddleRec's trainers take the config as `-m FILE` / `--config_yaml FILE`: rewritten to
// --config before gflags (whose single-dash flags are whole names) sees them.
std::vector<std::string> paddlerec_config_flags(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "-m" || arg == "--config_yaml" || arg == "-config_yaml") && i + 1 < argc) {
      out.push_back("--config=" + std::string(argv[++i]));
    } else if (arg.rfind("--config_yaml=", 0) == 0 || arg.rfind("-config_yaml=", 0) == 0) {
      out.push_back("--config=" + arg.substr(arg.find('=') + 1));
    } else if (arg == "-o" && i + 1 < argc) {
      out.push_back(arg);
      out.push_back(argv[++i]);
    } else {
      out.push_back(arg);
    }
  }
  return out;
}

// --mode infer (run_job.hpp's infer_job, as gpubox.evaluate runs it): every save --load or
// runner.infer_load_path names, each on the same data, one PaddleRec line and one GPUBox line
// per save.
int run_infer(const gpubox::trainer::TrainerConfig& config,
              const gpubox::trainer::TrainerEnv& env) {
  using namespace gpubox::trainer;
  InferJob job;
  job.load = FLAGS_load;
  job.data_dir = FLAGS_infer_data_dir;
  job.keep_predictions = !FLAGS_predictions_out.empty();
  std::unique_ptr<PredictionsOut> predictions;
  if (job.keep_predictions) {
    // Each trainer evaluates its share of the files: its file would hold that share alone (and
    // trainers in one folder raced on one file).
    GPUBOX_EXPECTS(env.trainers == 1, "--predictions_out with ", env.trainers, " trainers (",
                   env.trainers_from, "=", env.trainers,
                   "): each trainer evaluates its share of the data, so its lines would be that "
                   "share's alone; write them from one trainer (PADDLE_TRAINERS_NUM=1 reads all "
                   "the data), or leave the flag out for the job's metrics");
    check_not_an_input(FLAGS_predictions_out, infer_inputs(config, job), config.config_path);
    predictions = std::make_unique<PredictionsOut>(FLAGS_predictions_out);
  }
  // One row per line: a line skipped as malformed, or blank, would shift every row after it off
  // its line (the rows could not be told apart), so the first such line stops the evaluation.
  const TrainerConfig evaluated =
      job.keep_predictions ? one_row_per_line(config, "--predictions_out") : config;
  const EvalResult result = infer_job(
      evaluated, env, job, [](const SaveToEvaluate& save, const EvalResult& r, double seconds) {
        if (save.epoch >= 0) {
          std::printf("%s\n", format_paddlerec_done_line(save.epoch, r.metrics, seconds).c_str());
        }
        std::printf(
            "infer: save: %s, examples: %.0f, auc: %.6f, logloss: %.6f, actual_ctr: %.6f, "
            "predicted_ctr: %.6f\n",
            save.dir.c_str(), r.metrics.examples, r.metrics.auc, r.metrics.logloss,
            r.metrics.actual_ctr, r.metrics.predicted_ctr);
        std::fflush(stdout);
        const std::string one_class = one_class_note(r.metrics);
        if (!one_class.empty()) GPUBOX_LOG(WARNING) << "the evaluated data: " << one_class;
      });
  if (predictions) predictions->write(result);  // of the one save evaluated
  return 0;
}

// The model folder a run reads or writes (--print_model_root): training reads --load or
// runner.model_init_path, infer and export infer_load_path.
void print_model_root(const gpubox::trainer::TrainerConfig& config) {
  const bool train = FLAGS_mode == "train";
  const std::string load = !FLAGS_load.empty() ? FLAGS_load
                           : train             ? config.runner.model_init_path
                                               : config.runner.infer_load_path;
  std::printf(
      "%s\n",
      gpubox::trainer::model_root(train ? config.runner.model_save_path : "", load).c_str());
}

// A flag of another --mode given on the command line would do nothing: named, with the mode it
// belongs to ("" when every flag given belongs to this mode).
std::string flag_of_another_mode() {
  struct Owned {
    const char* flag;
    const char* mode;
  };
  for (const Owned& f :
       {Owned{"infer_data_dir", "infer"}, Owned{"predictions_out", "infer"}, Owned{"out", "export"},
        Owned{"show_threshold", "export"}, Owned{"export_fp16", "export"}}) {
    if (FLAGS_mode == f.mode) continue;
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(f.flag, &info) && !info.is_default) {
      return std::string("--") + f.flag + " is a flag of --mode " + f.mode +
             "; this run is --mode " + FLAGS_mode +
             ", where it would do nothing (drop it, or run --mode " + f.mode + ")";
    }
  }
  return "";
}

// Runs --mode (train, infer or export) with the schedule runner.sync_mode picks; the exit code.
int run_mode(const gpubox::trainer::TrainerConfig& config) {
  if (FLAGS_mode == "export") return export_for_serving(config);
  gpubox::trainer::TrainerEnv env = gpubox::trainer::TrainerEnv::from_environment();
  env.threads_per_card = FLAGS_threads_per_card;
#if defined(GPUBOX_BACKEND_CPU)
  // Many more threads than cores: every kernel's threads take turns at each of its barriers (a
  // step 75 times slower at 4096 a card on 2 cores), which nothing else would say.
  const unsigned cores = std::thread::hardware_concurrency();
  const auto cards = static_cast<unsigned>(
      1 + std::count(env.selected_cards.begin(), env.selected_cards.end(), ','));
  if (FLAGS_threads_per_card > 0 && cores > 0 &&
      static_cast<unsigned>(FLAGS_threads_per_card) * cards > 2 * cores) {
    GPUBOX_LOG(WARNING) << "--threads_per_card " << FLAGS_threads_per_card << " on " << cards
                        << " simulated card(s): " << FLAGS_threads_per_card * cards
                        << " threads on " << cores
                        << " cores; each kernel's threads take turns, and a step runs slower than "
                           "with the default (0: cores / cards)";
  }
#endif
  if (FLAGS_mode == "train") {
    gpubox::trainer::train_job(config, env, FLAGS_load);
    return 0;
  }
  return run_infer(config, env);
}

// What the start says of the network and rules the config means: the network and where it came
// from, how it differs from PaddleRec's, and the notes on batch norm, the dense optimizer, the
// embedding rows' rule and the reader.
void log_start_notes(const gpubox::config::ConfigDocument& doc,
                     const gpubox::trainer::TrainerConfig& config) {
  GPUBOX_LOG(INFO) << "network: "
                   << gpubox::name_of(gpubox::config::kModelKindNames, config.hyper.model)
                   << " (from " << config.hyper.model_source << ")";
  if (const std::string differs =
          gpubox::trainer::differences_from_paddlerec(config.hyper.model, config.hyper.dnn_dropout);
      !differs.empty()) {
    GPUBOX_LOG(INFO) << "network: unlike PaddleRec's: " << differs;
  }
  for (const std::string& note :
       {gpubox::trainer::dnn_batch_norm_note(doc), gpubox::trainer::dnn_dropout_note(doc),
        gpubox::trainer::dlrm_output_note(doc), gpubox::config::dense_optimizer_note(doc),
        gpubox::trainer::clip_by_norm_note(doc),
        gpubox::table::paddlerec_rows_rule_note(doc, config.sparse)}) {
    if (!note.empty()) GPUBOX_LOG(INFO) << note;
  }
  for (const std::string& note : config.dataset.reader_notes) GPUBOX_LOG(INFO) << note;
  for (const auto& [warning, note] : doc.override_path_notes()) {
    gpubox::LogLine(warning ? gpubox::LogLevel::WARNING : gpubox::LogLevel::INFO, __FILE__,
                    __LINE__)
        << note;
  }
  for (const std::string& warning :
       {gpubox::trainer::dlrm_output_warning(config), gpubox::trainer::unread_keys_note(doc)}) {
    if (!warning.empty()) GPUBOX_LOG(WARNING) << warning;
  }
}

}  // namespace

int main(int argc, char** argv) {
  gpubox::device::use_passive_cpu_waits(argv);
  // A write to a socket whose peer has gone (Gloo writes with writev, which raises SIGPIPE)
  // must come back as EPIPE, so the collective fails with an error naming the trainer that
  // exited; with the default action the process would die silently. Commands started for data
  // files get the default action back (dataset/line_reader.cpp).
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args = paddlerec_config_flags(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  // The one front end (common/cli_args.hpp): flags, -o key=value, --help, --version, ranges.
  gpubox::cli::CommandSpec spec;
  spec.tool = "gpubox_train";
  spec.flags = gpubox::cli::gflags_flag_specs(__FILE__);
  spec.takes_overrides = true;
  spec.usage = usage_text;
  const gpubox::cli::CommandLine line = gpubox::cli::parse_gflags_command_line(
      spec, static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (line.exit_code) return *line.exit_code;
  const std::vector<std::string>& overrides = line.args.overrides;
  if (FLAGS_print_config_keys && FLAGS_print_config_template) {
    // One of them was printed, the other dropped without a word.
    std::fprintf(stderr,
                 "gpubox_train: --print_config_keys and --print_config_template: give one (the "
                 "keys as a table, or a config to start from)\n");
    return 2;
  }
  if (FLAGS_print_config_keys || FLAGS_print_config_template) {
    std::fputs(FLAGS_print_config_keys ? gpubox::config::render_markdown_key_table().c_str()
                                       : gpubox::config::render_yaml_template().c_str(),
               stdout);
    return 0;
  }
  if (FLAGS_config.empty()) {
    std::fprintf(stderr, "gpubox_train: --config is required (gpubox_train --help)\n");
    return 2;
  }
  if (FLAGS_mode != "train" && FLAGS_mode != "infer" && FLAGS_mode != "export") {
    std::fprintf(stderr, "gpubox_train: --mode must be train, infer or export, got '%s'\n",
                 FLAGS_mode.c_str());
    return 2;
  }
  if (const std::string misplaced = flag_of_another_mode(); !misplaced.empty()) {
    std::fprintf(stderr, "gpubox_train: %s\n", misplaced.c_str());
    return 2;
  }
  auto doc = gpubox::config::ConfigDocument::load(FLAGS_config, overrides);
  if (!doc.ok()) {
    std::fprintf(stderr, "gpubox_train: %s\n", doc.status().to_string().c_str());
    gpubox::trainer::tell_job_failed(doc.status().to_string());
    return 2;
  }
  try {
    if (const std::string note = doc->no_effect_note(); !note.empty()) GPUBOX_LOG(INFO) << note;
    if (const std::string typed = doc->no_effect_overrides(overrides); !typed.empty()) {
      GPUBOX_LOG(WARNING) << typed;
    }
    auto config = gpubox::trainer::trainer_config_from(*doc);
    if (!config.ok()) {
      std::fprintf(stderr, "gpubox_train: %s\n", config.status().to_string().c_str());
      gpubox::trainer::tell_job_failed(config.status().to_string());
      return 2;
    }
    log_start_notes(*doc, config.value());
    if (FLAGS_print_model_root) {
      print_model_root(config.value());
      return 0;
    }
    return run_mode(config.value());
  } catch (const gpubox::Error& e) {
    // The user's message alone; where it was raised goes to the log.
    gpubox::report_top_level("gpubox_train", e);
    gpubox::trainer::tell_job_failed(gpubox::user_message(e));
    return 1;
  } catch (const std::bad_alloc& e) {
    // Name what the config asked for rather than a bare "std::bad_alloc".
    const std::string text = gpubox::config::out_of_memory_text(*doc, e.what());
    std::fprintf(stderr, "gpubox_train: %s\n", text.c_str());
    gpubox::trainer::tell_job_failed(text);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpubox_train: %s\n", e.what());
    gpubox::trainer::tell_job_failed(e.what());
    return 1;
  }
}
