// gpubox_data: synthetic data with a planted model (gen), load statistics (stat) and format
// conversion (convert). See ARCHITECTURE.md §5 and `gpubox_data --help`.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/status.hpp"
#include "dataset/dataset_config_yaml.hpp"
#include "dataset/format_writer.hpp"
#include "dataset/generator.hpp"
#include "dataset/stat.hpp"

namespace gpubox::dataset {
namespace {

constexpr const char* kUsage = R"(usage:
  gpubox_data gen --out DIR --lines N --files K --seed S
                  [--slots 26] [--dense 13] [--vocab 100000] [--zipf 1.1] [--factor-dim 4]
                  [--ctr 0.25] [--threads T] [--first_line L]
      (held-out data of the same planted model: the same --seed with --first_line past the
       training set's --lines)
      slot-format files DIR/part-NNNNN from a planted model, and DIR/oracle.json with the
      planted model's AUC, logloss and positive rate on them.
  gpubox_data stat --config C [-o key=value ...] [--json]
      loads runner.train_data_dir as training would and reports lines, instances, skipped
      lines by reason, unique keys, positives, bytes, seconds, MB/s.
      Exit 0 unless strict parsing failed or a file could not be read.
  gpubox_data convert --from criteo|multislot|slot --to slot|multislot IN OUT
                  [--config C] [-o key=value ...] [--slots 26] [--dense 13] [--strict]
      slot names and dense size come from --config (hyper_parameters.*) or --slots/--dense
      (slots named 1..N); default 26 slots, 13 dense values (the Criteo shape).
)";

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
    if constexpr (std::is_floating_point_v<T>) {
      *out = static_cast<T>(std::strtod(text, &end));
    } else {
      *out = static_cast<T>(std::strtoull(text, &end, 10));
    }
    if (it->second.empty() || *end != '\0') {
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
  if (Status st = args.expect_only({"out", "lines", "files", "seed", "slots", "dense", "vocab",
                                    "zipf", "factor-dim", "threads", "ctr", "first_line"});
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
  StatusOr<DatasetYamlConfig> config = load_dataset_config(args.get("config", ""), args.overrides);
  if (!config.ok()) return fail(config.status());
  std::vector<std::string> files = config->files;
  for (const std::string& f : args.positional) files.push_back(f);
  const StatReport report = run_stat(config->dataset, files);
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
  StatusOr<DataFormat> from = parse_format(args.get("from", "slot"));
  StatusOr<DataFormat> to = parse_format(args.get("to", "slot"));
  if (!from.ok()) return fail(from.status(), 2);
  if (!to.ok()) return fail(to.status(), 2);
  DatasetConfig config;
  if (args.has("config")) {
    StatusOr<DatasetYamlConfig> loaded =
        load_dataset_config(args.get("config", ""), args.overrides);
    if (!loaded.ok()) return fail(loaded.status());
    config = loaded->dataset;
  } else {
    int slots = 26;
    config.dense_dim = 13;
    if (Status st = args.get_number("slots", &slots); !st.ok()) return fail(st, 2);
    if (Status st = args.get_number("dense", &config.dense_dim); !st.ok()) return fail(st, 2);
    for (int s = 1; s <= slots; ++s) config.slots.push_back(std::to_string(s));
  }
  config.data_format = *from;
  if (args.has("strict")) config.strict_parse = true;
  ConvertSummary summary;
  const Status st = convert_file(config, *to, args.positional[0], args.positional[1], &summary);
  for (const ParseErrorRecord& e : summary.stats.errors) {
    std::fprintf(stderr, "skipped %s\n", e.to_string().c_str());
  }
  if (!st.ok()) return fail(st);
  std::printf("converted %llu instances (%llu lines, %llu skipped) from %s to %s\n",
              static_cast<unsigned long long>(summary.written),
              static_cast<unsigned long long>(summary.stats.lines),
              static_cast<unsigned long long>(summary.stats.skipped_lines()), format_name(*from),
              format_name(*to));
  return 0;
}

}  // namespace
}  // namespace gpubox::dataset

int main(int argc, char** argv) {
  using namespace gpubox::dataset;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    gpubox::StatusOr<Args> args = Args::parse(argc - 2, argv + 2, {"json", "strict"});
    if (!args.ok()) return fail(args.status(), 2);
    if (command == "gen") return run_gen(*args);
    if (command == "stat") return run_stat_command(*args);
    if (command == "convert") return run_convert(*args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpubox_data %s: %s\n", command.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "gpubox_data: unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
