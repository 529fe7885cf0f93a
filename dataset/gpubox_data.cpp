// gpubox_data: synthetic data with a planted model (gen), load statistics (stat) and format
// conversion (convert). See ARCHITECTURE.md §5 and `gpubox_data [gen|stat|convert] --help`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/cli.hpp"
#include "common/config/config_document.hpp"
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

// Each command's --help (common/cli.hpp): what it does, its options with defaults, an example.
cli::Usage gen_usage() {
  cli::Usage u;
  u.synopsis = "gpubox_data gen --out DIR --lines N --files K --seed S [options]";
  u.summary =
      "Writes slot-format files DIR/part-NNNNN from a planted model, and DIR/oracle.json with "
      "the planted model's AUC, logloss and positive rate on them (the ceiling a trained model "
      "can approach). Held-out data of the same planted model: the same --seed with "
      "--first_line past the training set's --lines.";
  // The defaults shown are GeneratorOptions' own, so the text cannot drift from them.
  const GeneratorOptions d;
  const auto num = [](double v) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", v);
    return std::string(text);
  };
  u.options = {
      {"--out DIR", "", "output folder (required)"},
      {"--lines N", std::to_string(d.lines), "lines in all"},
      {"--files K", std::to_string(d.files), "files the lines are spread over"},
      {"--seed S", std::to_string(d.seed), "seed of the planted model and of the lines"},
      {"--slots N", std::to_string(d.slots), "sparse slots, named 1..N"},
      {"--dense N", std::to_string(d.dense), "dense values per line"},
      {"--vocab N", std::to_string(d.vocab), "distinct keys per slot"},
      {"--zipf A", num(d.zipf), "Zipf exponent of key popularity"},
      {"--key_sampler S", "alias",
       "alias: exact Zipf from a table of 8 bytes per vocabulary entry (--vocab < 2^32); "
       "closed_form: the continuous power law, no table (streaming: any --vocab < 2^40 in "
       "constant memory)"},
      {"--factor-dim D", std::to_string(d.factor_dim), "rank of the planted pairwise term"},
      {"--ctr P", num(d.ctr), "target positive rate (<= 0: the planted bias as it is)"},
      {"--threads T", "the machine's cores", "writer threads"},
      {"--first_line L", std::to_string(d.first_line), "lines L .. L+N-1 of the seed's stream"}};
  u.examples = {"gpubox_data gen --out data/train --lines 100000 --files 4 --seed 7",
                "gpubox_data gen --out data/big --lines 4e6 --files 8 --vocab 2e7 --zipf 0.9 "
                "--key_sampler closed_form",
                "gpubox_data gen --out data/test --lines 10000 --files 1 --seed 7 "
                "--first_line 100000"};
  return u;
}

cli::Usage stat_usage() {
  cli::Usage u;
  u.synopsis = "gpubox_data stat --config CONFIG.yaml [-o key=value ...] [--json] [FILE ...]";
  u.summary =
      "Loads runner.pass_dirs (or runner.train_data_dir) and the FILEs exactly as training "
      "would (the same config loader: keys, defaults, errors) and reports lines, instances, "
      "skipped lines by reason, skipped folder entries, unique keys, positives, bytes, seconds "
      "and MB/s. Exit 0 unless the config is bad, strict parsing failed or a file could not be "
      "read; no data file at all is a warning (training refuses it).";
  u.options = {{"--config C", "", "the training config (required)"},
               {"-o key=value", "", "override a config key (repeatable)"},
               {"--json", "false", "one JSON object instead of text"},
               {"FILE ...", "", "more files to load besides the config's folders"}};
  u.examples = {"gpubox_data stat --config configs/config_gpubox.yaml",
                "gpubox_data stat --config configs/config_gpubox.yaml -o runner.thread_num=2 "
                "--json"};
  return u;
}

cli::Usage convert_usage() {
  cli::Usage u;
  u.synopsis =
      "gpubox_data convert [--from auto|slot|multislot|criteo|feat_idx] --to slot|multislot "
      "IN OUT [--config C [-o key=value ...]] [--slots 26] [--dense 13] [--strict]";
  u.summary =
      "Converts one file between the input formats. Slot names and the dense size come from "
      "--config (hyper_parameters.*) or --slots/--dense (slots named 1..N). feat_idx is the "
      "`feat_idx:I ... feat_value:V ... label:L` text of PaddleRec's LR and FM samples.";
  u.options = {{"--from F", "the config's runner.data_format, else auto",
                "input format (auto: recognised from the first lines)"},
               {"--to F", "slot", "output format: slot or multislot"},
               {"--config C", "", "a training config: slots, dense size, parsing rules"},
               {"-o key=value", "", "override a config key (repeatable)"},
               {"--slots N", "26", "without --config: sparse slots, named 1..N"},
               {"--dense N", "13", "without --config: dense values per line"},
               {"--strict", "false", "the first malformed line is an error instead of skipped"}};
  u.examples = {"gpubox_data convert --from criteo --to slot day_0.tsv day_0.slot"};
  return u;
}

std::string overall_usage() {
  std::string out =
      "gpubox_data: synthetic data with a planted model (gen), load statistics as training "
      "loads (stat), and format conversion (convert).\n"
      "  gpubox_data <gen|stat|convert> --help   one command's options\n"
      "  gpubox_data --version                   version, commit and backend\n\n";
  for (const cli::Usage& u : {gen_usage(), stat_usage(), convert_usage()}) {
    out += cli::render_usage(u) + "\n";
  }
  return out;
}

// `--name value`, `--name=value`, bare `--flag`, repeated `-o key=value`, and positionals.
struct Args {
  std::map<std::string, std::string> options;
  std::vector<std::string> overrides;
  std::vector<std::string> positional;

  static StatusOr<Args> parse(int argc, char** argv, const std::vector<std::string>& flags) {
    Args args;
    for (int i = 0; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "-o") {
        if (i + 1 >= argc) return Status::InvalidArgument("-o needs key=value");
        args.overrides.push_back(argv[++i]);
      } else if (arg.rfind("--", 0) == 0) {
        arg = arg.substr(2);
        const std::size_t eq = arg.find('=');
        if (eq != std::string::npos) {
          args.options[arg.substr(0, eq)] = arg.substr(eq + 1);
        } else if (std::find(flags.begin(), flags.end(), arg) != flags.end()) {
          args.options[arg] = "true";
        } else if (i + 1 < argc) {
          args.options[arg] = argv[++i];
        } else {
          return Status::InvalidArgument("--" + arg + " needs a value");
        }
      } else {
        args.positional.push_back(arg);
      }
    }
    return args;
  }

  Status expect_only(const std::vector<std::string>& known) const {
    for (const auto& [name, value] : options) {
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        return Status::InvalidArgument("unknown option --" + name);
      }
    }
    return Status::OK();
  }
  bool has(const std::string& name) const { return options.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const {
    auto it = options.find(name);
    return it == options.end() ? fallback : it->second;
  }
  template <class T>
  Status get_number(const std::string& name, T* out) const {
    auto it = options.find(name);
    if (it == options.end()) return Status::OK();
    char* end = nullptr;
    const char* text = it->second.c_str();
    bool ok = !it->second.empty();
    if constexpr (std::is_floating_point_v<T>) {
      *out = static_cast<T>(std::strtod(text, &end));
      ok = ok && *end == '\0';
    } else {
      *out = static_cast<T>(std::strtoull(text, &end, 10));
      if (*end == 'e' || *end == 'E' || *end == '.') {
        // A whole number in exponent form (--vocab 2e7, --lines 1.5e6).
        const double value = std::strtod(text, &end);
        ok = ok && value >= 0 && value == std::floor(value) &&
             value <= static_cast<double>(std::numeric_limits<T>::max());
        if (ok) *out = static_cast<T>(value);
      }
      ok = ok && *end == '\0';
    }
    if (!ok) {
      return Status::InvalidArgument("--" + name + " wants a number, got '" + it->second + "'");
    }
    return Status::OK();
  }
};

int fail(const Status& status, int code = 1) {
  std::fprintf(stderr, "gpubox_data: %s\n", status.to_string().c_str());
  return code;
}

int run_gen(const Args& args) {
  if (Status st =
          args.expect_only({"out", "lines", "files", "seed", "slots", "dense", "vocab", "zipf",
                            "key_sampler", "factor-dim", "threads", "ctr", "first_line"});
      !st.ok()) {
    return fail(st, 2);
  }
  GeneratorOptions o;
  o.out_dir = args.get("out", "");
  o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (Status st : {args.get_number("lines", &o.lines), args.get_number("files", &o.files),
                    args.get_number("seed", &o.seed), args.get_number("slots", &o.slots),
                    args.get_number("dense", &o.dense), args.get_number("vocab", &o.vocab),
                    args.get_number("zipf", &o.zipf), args.get_number("factor-dim", &o.factor_dim),
                    args.get_number("threads", &o.threads), args.get_number("ctr", &o.ctr),
                    args.get_number("first_line", &o.first_line)}) {
    if (!st.ok()) return fail(st, 2);
  }
  if (o.out_dir.empty()) return fail(Status::InvalidArgument("gen: --out DIR is required"), 2);
  const std::string sampler = args.get("key_sampler", "alias");
  if (sampler == "closed_form") {
    o.key_sampler = KeySampler::kClosedForm;
  } else if (sampler != "alias") {
    return fail(Status::InvalidArgument("gen: --key_sampler is alias or closed_form, got '" +
                                        sampler + "'"),
                2);
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

int run_stat_command(const Args& args) {
  if (Status st = args.expect_only({"config", "json"}); !st.ok()) return fail(st, 2);
  if (!args.has("config")) return fail(Status::InvalidArgument("stat: --config C is required"), 2);
  StatusOr<config::ConfigDocument> doc =
      config::ConfigDocument::load(args.get("config", ""), args.overrides);
  if (!doc.ok()) return fail(doc.status());
  if (const std::string note = doc->no_effect_note(); !note.empty()) GPUBOX_LOG(INFO) << note;
  StatusOr<DatasetConfig> dataset_config = dataset_config_from(*doc);
  if (!dataset_config.ok()) return fail(dataset_config.status());
  if (!dataset_config->pipe_arguments_note.empty()) {
    GPUBOX_LOG(INFO) << "runner.pipe_command: " << dataset_config->pipe_arguments_note;
  }
  // The folders training reads: runner.pass_dirs, else runner.train_data_dir.
  std::vector<std::string> dirs = doc->get_string_list("runner.pass_dirs");
  const char* dir_key = "runner.pass_dirs";
  if (dirs.empty() && !doc->get_string("runner.train_data_dir").empty()) {
    dirs.push_back(doc->get_string("runner.train_data_dir"));
    dir_key = "runner.train_data_dir";
  }
  if (dirs.empty() && args.positional.empty()) {
    return fail(Status::InvalidArgument(
        "stat: the config sets neither runner.train_data_dir nor runner.pass_dirs, and no FILE "
        "was given"));
  }
  std::vector<std::string> files;
  std::vector<SkippedEntry> skipped;
  for (const std::string& dir : dirs) {
    StatusOr<DataFileList> listed = list_data_files(dir);
    if (!listed.ok()) return fail(listed.status().with_context(dir_key));
    files.insert(files.end(), listed->files.begin(), listed->files.end());
    skipped.insert(skipped.end(), listed->skipped.begin(), listed->skipped.end());
  }
  for (const std::string& f : args.positional) files.push_back(f);
  if (files.empty()) {
    std::fprintf(stderr,
                 "gpubox_data: warning: files: 0 (%s holds no data file; training "
                 "refuses an empty data folder)\n",
                 dir_key);
  }
  StatReport report = run_stat(*dataset_config, files);
  report.skipped_entries = std::move(skipped);
  if (args.has("json")) {
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

int run_convert(const Args& args) {
  if (Status st = args.expect_only({"from", "to", "config", "slots", "dense", "strict"});
      !st.ok()) {
    return fail(st, 2);
  }
  if (args.positional.size() != 2) {
    return fail(Status::InvalidArgument("convert: expected IN OUT"), 2);
  }
  StatusOr<DataFormat> to = parse_enum(kDataFormatNames, args.get("to", "slot"));
  if (!to.ok()) return fail(to.status().with_context("--to"), 2);
  DatasetConfig dataset_config;
  if (args.has("config")) {
    StatusOr<DatasetConfig> loaded = load_dataset_config(args.get("config", ""), args.overrides);
    if (!loaded.ok()) return fail(loaded.status());
    dataset_config = *loaded;
  } else {
    int slots = 26;
    dataset_config.dense_dim = 13;
    if (Status st = args.get_number("slots", &slots); !st.ok()) return fail(st, 2);
    if (Status st = args.get_number("dense", &dataset_config.dense_dim); !st.ok())
      return fail(st, 2);
    for (int s = 1; s <= slots; ++s) dataset_config.slots.push_back(std::to_string(s));
  }
  StatusOr<DataFormat> from = parse_enum(
      kDataFormatNames, args.get("from", name_of(kDataFormatNames, dataset_config.data_format)));
  if (!from.ok()) return fail(from.status().with_context("--from"), 2);
  dataset_config.data_format = *from;
  if (args.has("strict")) dataset_config.strict_parse = true;
  ConvertSummary summary;
  const Status st =
      convert_file(dataset_config, *to, args.positional[0], args.positional[1], &summary);
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
  const std::map<std::string, cli::Usage> usages = {
      {"gen", gen_usage()}, {"stat", stat_usage()}, {"convert", convert_usage()}};
  const auto usage = usages.find(command);
  if (usage == usages.end()) {
    std::fprintf(stderr, "gpubox_data: unknown command '%s'\n%s", command.c_str(),
                 overall_usage().c_str());
    return 2;
  }
  if (cli::asks_for_help(argc, argv, 2)) {
    std::fputs(cli::render_usage(usage->second).c_str(), stdout);
    return 0;
  }
  try {
    gpubox::StatusOr<Args> args = Args::parse(argc - 2, argv + 2, {"json", "strict"});
    if (!args.ok()) return fail(args.status(), 2);
    if (command == "gen") return run_gen(*args);
    if (command == "stat") return run_stat_command(*args);
    return run_convert(*args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpubox_data %s: %s\n", command.c_str(), e.what());
    return 1;
  }
}
