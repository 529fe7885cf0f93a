// gpubox_data: synthetic data with a planted model (gen), load statistics (stat) and format
// conversion (convert). See ARCHITECTURE.md §5 and `gpubox_data [gen|stat|convert] --help`.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/cli.hpp"
#include "common/cli_args.hpp"
#include "common/config/config_document.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "common/status.hpp"
#include "dataset/data_files.hpp"
#include "dataset/dataset_config.hpp"
#include "dataset/format_writer.hpp"
#include "dataset/generator.hpp"
#include "dataset/load_report.hpp"
#include "dataset/stat.hpp"

namespace gpubox::dataset {
namespace {

using cli::FlagSpec;
using cli::FlagType;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string num_text(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

FlagSpec flag(std::string name, FlagType type, std::string value_name, std::string default_text,
              std::string meaning) {
  FlagSpec f;
  f.name = std::move(name);
  f.type = type;
  f.value_name = std::move(value_name);
  f.default_text = std::move(default_text);
  f.meaning = std::move(meaning);
  return f;
}
FlagSpec int_flag(std::string name, std::string value_name, std::string default_text, int64_t min,
                  int64_t max, std::string meaning) {
  FlagSpec f = flag(std::move(name), FlagType::kInt, std::move(value_name), std::move(default_text),
                    std::move(meaning));
  f.int_min = min;
  f.int_max = max;
  return f;
}
FlagSpec float_flag(std::string name, std::string value_name, std::string default_text, double min,
                    double max, std::string meaning) {
  FlagSpec f = flag(std::move(name), FlagType::kFloat, std::move(value_name),
                    std::move(default_text), std::move(meaning));
  f.float_min = min;
  f.float_max = max;
  return f;
}
// A flag that means what config key `key` means: the key table's range applies.
FlagSpec key_flag(FlagSpec f, std::string key) {
  f.key = std::move(key);
  return f;
}

// Each command's flags (with their ranges, checked by the front end, common/cli_args.hpp) and
// its --help: what it does, its options with defaults, an example.
cli::CommandSpec gen_command() {
  cli::CommandSpec c;
  c.tool = "gpubox_data gen";
  // The defaults shown are GeneratorOptions' own, so the text cannot drift from them.
  const GeneratorOptions d;
  const auto i = [](auto v) { return std::to_string(v); };
  c.flags = {
      flag("out", FlagType::kString, "DIR", "", "output folder (required)"),
      int_flag("lines", "N", i(d.lines), 1, kInt64Max, "lines in all"),
      int_flag("files", "K", i(d.files), 1, 1 << 20, "files the lines are spread over"),
      flag("seed", FlagType::kUInt64, "S", i(d.seed), "seed of the planted model and of the lines"),
      int_flag("slots", "N", i(d.slots), 1, 99999, "sparse slots, named 1..N"),
      flag("keys_per_slot", FlagType::kString, "MIN:MAX", "1:1",
           "keys in each slot of a line, uniform in [MIN, MAX] per line and slot (seeded; "
           "0 <= MIN <= MAX <= 1000; MIN 0 leaves slots out of lines): data whose keys per "
           "batch vary, as PaddleRec's slot data and Criteo's do"),
      key_flag(int_flag("dense", "N", i(d.dense), 0, kInt64Max, "dense values per line"),
               "hyper_parameters.dense_input_dim"),
      int_flag("vocab", "N", i(d.vocab), 1, (int64_t{1} << 40) - 1, "distinct keys per slot"),
      float_flag("zipf", "A", num_text(d.zipf), 0, 100, "Zipf exponent of key popularity"),
      flag("key_sampler", FlagType::kString, "S", "alias",
           "alias: exact Zipf from a table of 8 bytes per vocabulary entry (--vocab < 2^32); "
           "closed_form: the continuous power law, no table (streaming: any --vocab < 2^40 in "
           "constant memory)"),
      int_flag("factor_dim", "D", i(d.factor_dim), 1, 64, "rank of the planted pairwise term"),
      float_flag("ctr", "P", num_text(d.ctr), -1, 0.999999,
                 "target positive rate (<= 0: the planted bias as it is)"),
      int_flag("threads", "T", "the machine's cores", 1, 4096, "writer threads"),
      int_flag("first_line", "L", i(d.first_line), 0, kInt64Max,
               "lines L .. L+N-1 of the seed's stream")};
  c.usage = [flags = c.flags] {
    cli::Usage u;
    u.synopsis = "gpubox_data gen --out DIR --lines N --files K --seed S [options]";
    u.summary =
        "Writes slot-format files DIR/part-NNNNN from a planted model, and DIR/oracle.json with "
        "the planted model's AUC, logloss and positive rate on them (the ceiling a trained model "
        "can approach). Held-out data of the same planted model: the same --seed with "
        "--first_line past the training set's --lines.";
    u.options = cli::options_of(flags);
    u.examples = {"gpubox_data gen --out data/train --lines 100000 --files 4 --seed 7",
                  "gpubox_data gen --out data/big --lines 4e6 --files 8 --vocab 2e7 --zipf 0.9 "
                  "--key_sampler closed_form",
                  "gpubox_data gen --out data/test --lines 10000 --files 1 --seed 7 "
                  "--first_line 100000",
                  "gpubox_data gen --out data/varying --lines 100000 --files 4 --seed 7 "
                  "--keys_per_slot 0:4"};
    return cli::render_usage(u);
  };
  return c;
}

cli::CommandSpec stat_command() {
  cli::CommandSpec c;
  c.tool = "gpubox_data stat";
  c.takes_overrides = true;
  c.takes_positionals = true;
  c.flags = {flag("config", FlagType::kString, "C", "", "the training config (required)"),
             flag("json", FlagType::kBool, "", "false", "one JSON object instead of text")};
  c.usage = [flags = c.flags] {
    cli::Usage u;
    u.synopsis = "gpubox_data stat --config CONFIG.yaml [-o key=value ...] [--json] [FILE ...]";
    u.summary =
        "Loads runner.pass_dirs (or runner.train_data_dir) and the FILEs exactly as training "
        "would (the same config loader: keys, defaults, errors) and reports lines, instances, "
        "skipped lines by reason, skipped folder entries, unique keys, positives, bytes, seconds "
        "and MB/s. Exit 0 unless the config is bad, strict parsing failed or a file could not be "
        "read; no data file at all is a warning (training refuses it).";
    u.options = cli::options_of(flags);
    u.options.push_back({"-o key=value", "", "override a config key (repeatable)"});
    u.options.push_back({"FILE ...", "", "more files to load besides the config's folders"});
    u.examples = {"gpubox_data stat --config configs/config_gpubox.yaml",
                  "gpubox_data stat --config configs/config_gpubox.yaml -o runner.thread_num=2 "
                  "--json"};
    return cli::render_usage(u);
  };
  return c;
}

cli::CommandSpec convert_command() {
  cli::CommandSpec c;
  c.tool = "gpubox_data convert";
  c.takes_overrides = true;
  c.takes_positionals = true;
  c.flags = {
      key_flag(flag("from", FlagType::kString, "F", "the config's runner.data_format, else auto",
                    "input format (auto: recognised from the first lines)"),
               "runner.data_format"),
      flag("to", FlagType::kString, "F", "slot", "output format: slot or multislot"),
      flag("config", FlagType::kString, "C", "",
           "a training config: slots, dense size, parsing rules"),
      int_flag("slots", "N", "26", 1, 99999, "without --config: sparse slots, named 1..N"),
      key_flag(
          int_flag("dense", "N", "13", 0, kInt64Max, "without --config: dense values per line"),
          "hyper_parameters.dense_input_dim"),
      flag("strict", FlagType::kBool, "", "false",
           "the first malformed line is an error instead of skipped"),
      flag("drop_unknown_slots", FlagType::kBool, "", "false",
           "without --config: convert lines without the slots past --slots (else they stop the "
           "conversion; with --config, runner.ignore_unknown_slots rules)")};
  c.usage = [flags = c.flags] {
    cli::Usage u;
    u.synopsis =
        "gpubox_data convert [--from auto|slot|multislot|criteo|feat_idx|idx_value|avazu] --to "
        "slot|multislot "
        "IN OUT [--config C [-o key=value ...]] [--slots 26] [--dense 13] [--strict] "
        "[--drop_unknown_slots]";
    u.summary =
        "Converts one file between the input formats. Slot names and the dense size come from "
        "--config (hyper_parameters.*) or --slots/--dense (slots named 1..N). feat_idx is the "
        "`feat_idx:I ... feat_value:V ... label:L` text of PaddleRec's LR and FM samples.";
    u.options = cli::options_of(flags);
    u.options.push_back({"-o key=value", "", "override a config key (repeatable; needs --config)"});
    u.examples = {"gpubox_data convert --from criteo --to slot day_0.tsv day_0.slot"};
    return cli::render_usage(u);
  };
  return c;
}

std::string overall_usage() {
  std::string out =
      "gpubox_data: synthetic data with a planted model (gen), load statistics as training "
      "loads (stat), and format conversion (convert).\n"
      "  gpubox_data <gen|stat|convert> --help   one command's options\n"
      "  gpubox_data --version                   version, commit and backend\n\n";
  for (const cli::CommandSpec& c : {gen_command(), stat_command(), convert_command()}) {
    out += c.usage() + "\n";
  }
  return out;
}

int fail(const Status& status, int code = 1) {
  std::fprintf(stderr, "gpubox_data: %s\n", status.to_string().c_str());
  return code;
}

int run_gen(const cli::ParsedArgs& args) {
  GeneratorOptions o;
  o.out_dir = args.get_string("out", "");
  o.lines = static_cast<uint64_t>(args.get_int("lines", static_cast<int64_t>(o.lines)));
  o.files = static_cast<int>(args.get_int("files", o.files));
  o.seed = args.get_uint64("seed", o.seed);
  o.slots = static_cast<int>(args.get_int("slots", o.slots));
  o.dense = static_cast<int>(args.get_int("dense", o.dense));
  o.vocab = static_cast<uint64_t>(args.get_int("vocab", static_cast<int64_t>(o.vocab)));
  o.zipf = args.get_float("zipf", o.zipf);
  o.factor_dim = static_cast<int>(args.get_int("factor_dim", o.factor_dim));
  o.ctr = args.get_float("ctr", o.ctr);
  o.first_line =
      static_cast<uint64_t>(args.get_int("first_line", static_cast<int64_t>(o.first_line)));
  o.threads =
      static_cast<int>(args.get_int("threads", std::max(1u, std::thread::hardware_concurrency())));
  if (o.out_dir.empty()) return fail(Status::InvalidArgument("gen: --out DIR is required"), 2);
  // More files than lines left files empty, unsaid (a data folder's empty file then warns).
  if (static_cast<uint64_t>(o.files) > o.lines) {
    return fail(Status::InvalidArgument("gen: --files " + std::to_string(o.files) +
                                        " is more than --lines " + std::to_string(o.lines) +
                                        ": the files past the lines would be empty"),
                2);
  }
  const std::string sampler = args.get_string("key_sampler", "alias");
  if (sampler == "closed_form") {
    o.key_sampler = KeySampler::kClosedForm;
  } else if (sampler != "alias") {
    return fail(Status::InvalidArgument("gen: --key_sampler is alias or closed_form, got '" +
                                        sampler + "'"),
                2);
  }
  if (args.has("keys_per_slot")) {
    if (Status st = parse_keys_per_slot(args.get_string("keys_per_slot", ""), &o); !st.ok()) {
      return fail(st, 2);
    }
  }
  OracleSummary summary;
  if (Status st = generate(o, &summary); !st.ok()) return fail(st);
  std::printf(
      "wrote %llu lines (%.1f MB) in %d files to %s in %.2f s; oracle: auc %.6f, logloss %.6f, "
      "positive rate %.4f\n",
      static_cast<unsigned long long>(summary.lines), static_cast<double>(summary.bytes) / 1e6,
      o.files, o.out_dir.c_str(), summary.seconds, summary.auc, summary.logloss,
      summary.positive_rate);
  return 0;
}

int run_stat_command(const cli::ParsedArgs& args) {
  if (!args.has("config")) return fail(Status::InvalidArgument("stat: --config C is required"), 2);
  StatusOr<config::ConfigDocument> doc =
      config::ConfigDocument::load(args.get_string("config", ""), args.overrides);
  if (!doc.ok()) return fail(doc.status());
  if (const std::string note = doc->no_effect_note(); !note.empty()) GPUBOX_LOG(INFO) << note;
  for (const auto& [warning, note] : doc->override_path_notes()) {
    ::gpubox::LogLine(warning ? LogLevel::WARNING : LogLevel::INFO, __FILE__, __LINE__) << note;
  }
  StatusOr<DatasetConfig> dataset_config = dataset_config_from(*doc);
  if (!dataset_config.ok()) return fail(dataset_config.status());
  if (!dataset_config->pipe_arguments_note.empty()) {
    GPUBOX_LOG(INFO) << "runner.pipe_command: " << dataset_config->pipe_arguments_note;
  }
  for (const std::string& note : dataset_config->reader_notes) GPUBOX_LOG(INFO) << note;
  // The folders training reads: runner.pass_dirs, else runner.train_data_dir (one or a list).
  std::vector<std::string> dirs = doc->get_string_list("runner.pass_dirs");
  const char* dir_key = "runner.pass_dirs";
  if (dirs.empty()) {
    dirs = doc->get_paths("runner.train_data_dir");
    dir_key = "runner.train_data_dir";
  }
  if (dirs.empty() && args.positionals.empty()) {
    return fail(Status::InvalidArgument(
        "stat: the config sets neither runner.train_data_dir nor runner.pass_dirs, and no FILE "
        "was given"));
  }
  std::vector<std::string> files;
  std::vector<SkippedEntry> skipped;
  for (const std::string& dir : dirs) {
    StatusOr<DataFileList> listed = list_data_files(dir);
    if (!listed.ok()) return fail(listed.status().with_context(dir_key));
    // Each folder of a list must hold data, as training requires (a lone empty folder is the
    // warning below, as before).
    if (dirs.size() > 1 && listed->files.empty()) {
      return fail(Status::InvalidArgument(std::string(dir_key) + ": folder '" + dir +
                                          "' of the list holds no data file"));
    }
    files.insert(files.end(), listed->files.begin(), listed->files.end());
    skipped.insert(skipped.end(), listed->skipped.begin(), listed->skipped.end());
  }
  const std::size_t folder_files = files.size();
  for (const std::string& f : args.positionals) files.push_back(f);
  // A file named twice (a folder listed twice, a FILE in the config's folders, a link to one):
  // training refuses it, so stat, which loads "exactly as training would", does too. A file in
  // two of runner.pass_dirs is read by each of those passes, as training reads it.
  const bool passes = std::string(dir_key) == "runner.pass_dirs";
  std::map<std::string, std::string> seen;  // canonical path -> as named
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string& f = files[i];
    std::error_code ec;
    const std::string canonical = std::filesystem::canonical(f, ec).string();
    if (ec) continue;  // loading it names what is wrong
    const auto [it, inserted] = seen.emplace(canonical, f);
    if (!inserted && passes && i < folder_files) {
      GPUBOX_LOG(WARNING) << "runner.pass_dirs: the data file '" << it->second
                          << "' is in two passes' folders (again as '" << f
                          << "'): training reads it in each, as counted here";
      continue;
    }
    if (!inserted) {
      return fail(Status::InvalidArgument(
          "stat: the data file '" + it->second + "' is named twice" +
          (f == it->second ? "" : " (again as '" + f + "')") +
          " by the config's folders and the FILEs: training refuses it (each pass would read "
          "it twice)"));
    }
  }
  if (files.empty()) {
    std::fprintf(stderr,
                 "gpubox_data: warning: files: 0 (%s holds no data file; training "
                 "refuses an empty data folder)\n",
                 dir_key);
  }
  StatReport report = run_stat(*dataset_config, files);
  report.skipped_entries = std::move(skipped);
  if (args.get_bool("json")) {
    std::printf("%s\n", stat_json(report).c_str());
  } else {
    std::printf("%s", stat_text(report).c_str());
  }
  if (!report.load_status.ok()) {
    std::fprintf(stderr, "gpubox_data: %s\n", report.load_status.to_string().c_str());
    return 1;
  }
  return 0;
}

int run_convert(const cli::ParsedArgs& args) {
  if (args.positionals.size() != 2) {
    return fail(Status::InvalidArgument("convert: expected IN OUT"), 2);
  }
  StatusOr<DataFormat> to = parse_enum(kDataFormatNames, args.get_string("to", "slot"));
  if (!to.ok()) return fail(to.status().with_context("--to"), 2);
  DatasetConfig dataset_config;
  if (!args.has("config") && !args.overrides.empty()) {
    return fail(Status::InvalidArgument("-o " + args.overrides.front() + ": needs --config"), 2);
  }
  for (const char* shape : {"slots", "dense"}) {
    if (args.has("config") && args.has(shape)) {
      return fail(Status::InvalidArgument(
                      std::string("--") + shape +
                      ": without --config only (a config gives the slots and dense values: "
                      "hyper_parameters.sparse_inputs_slots / slot_names and dense_input_dim; "
                      "-o them to change)"),
                  2);
    }
  }
  if (args.has("config") && args.get_bool("drop_unknown_slots")) {
    return fail(Status::InvalidArgument(
                    "--drop_unknown_slots: without --config only (a config says it with "
                    "runner.ignore_unknown_slots)"),
                2);
  }
  if (args.has("config")) {
    StatusOr<DatasetConfig> loaded =
        load_dataset_config(args.get_string("config", ""), args.overrides);
    if (!loaded.ok()) return fail(loaded.status());
    dataset_config = *loaded;
  } else {
    const int64_t slots = args.get_int("slots", 26);
    dataset_config.dense_dim = static_cast<int>(args.get_int("dense", 13));
    for (int s = 1; s <= slots; ++s) dataset_config.slots.push_back(std::to_string(s));
    // --slots is a count typed by hand: a slot past it is more likely a wrong count than a slot
    // to leave out of the converted file.
    dataset_config.ignore_unknown_slots = args.get_bool("drop_unknown_slots");
  }
  StatusOr<DataFormat> from =
      parse_enum(kDataFormatNames,
                 args.get_string("from", name_of(kDataFormatNames, dataset_config.data_format)));
  if (!from.ok()) return fail(from.status().with_context("--from"), 2);
  dataset_config.data_format = *from;
  if (args.get_bool("strict")) dataset_config.strict_parse = true;
  ConvertSummary summary;
  const Status st =
      convert_file(dataset_config, *to, args.positionals[0], args.positionals[1], &summary);
  for (const ParseErrorRecord& e : summary.stats.errors) {
    std::fprintf(stderr, "skipped %s\n", e.to_string().c_str());
  }
  const LoadMessages messages = load_messages(summary.stats);
  for (const std::string& line : messages.info) std::fprintf(stderr, "%s\n", line.c_str());
  for (const std::string& line : messages.warnings) {
    if (line.rfind("skipped ", 0) != 0 && line.rfind("  ", 0) != 0) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  if (!st.ok()) return fail(st);
  if (summary.stats.lines == 0) {
    std::fprintf(stderr, "gpubox_data convert: %s is empty: %s written empty\n",
                 args.positionals[0].c_str(), args.positionals[1].c_str());
  }
  std::printf("converted %llu instances (%llu lines, %llu skipped) from %s to %s\n",
              static_cast<unsigned long long>(summary.written),
              static_cast<unsigned long long>(summary.stats.lines),
              static_cast<unsigned long long>(summary.stats.skipped_lines()),
              name_of(kDataFormatNames, *from), name_of(kDataFormatNames, *to));
  return 0;
}

}  // namespace
}  // namespace gpubox::dataset

int main(int argc, char** argv) {
  using namespace gpubox::dataset;
  namespace cli = gpubox::cli;
  if (argc >= 2 && cli::asks_for_version(2, argv, 1)) {
    std::printf("%s\n", cli::version_text("gpubox_data").c_str());
    return 0;
  }
  if (argc < 2 || cli::asks_for_help(2, argv, 1)) {
    std::fputs(overall_usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  using Run = int (*)(const cli::ParsedArgs&);
  const std::map<std::string, std::pair<cli::CommandSpec, Run>> commands = {
      {"gen", {gen_command(), run_gen}},
      {"stat", {stat_command(), run_stat_command}},
      {"convert", {convert_command(), run_convert}}};
  const auto found = commands.find(command);
  if (found == commands.end()) {
    std::fprintf(stderr, "gpubox_data: unknown command '%s'\n%s", command.c_str(),
                 overall_usage().c_str());
    return 2;
  }
  // The one front end (common/cli_args.hpp): the command's flags after its name.
  const auto& [spec, run] = found->second;
  const cli::CommandLine line = cli::parse_command_line(spec, argc, argv, 2);
  if (line.exit_code) return *line.exit_code;
  try {
    return run(line.args);
  } catch (const std::exception& e) {
    gpubox::report_top_level(("gpubox_data " + command).c_str(), e);
    return 1;
  }
}
