// gpubox_bench: one binary, one sub-command per component (hashtable, sparse, server, ...).
// Each bench_<name>.cpp/.cu in this folder registers its sub-command with GPUBOX_BENCH_COMMAND;
// CMake compiles every such file into the binary.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpubox::bench {

// The arguments of one sub-command, read by the front end every GPUBox binary uses
// (common/cli_args.hpp) once the sub-command names its flags with expect_only (its first call):
// `--name value`, `--name=value`, a bare `--flag`, unknown flags and -o refused the same way.
// Numbers are read as config values are (1e6 is an integer; non-finite numbers are refused).
class BenchArgs {
 public:
  BenchArgs(std::string command, int argc, char** argv);
  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback) const;
  long long get_int(const std::string& name, long long fallback) const;
  double get_double(const std::string& name, double fallback) const;
  // A comma-separated list of integers (each read as get_int reads one), every one in
  // [min, max]; throws BenchUsageError naming the flag for an empty list, an item that is not an
  // integer, or one out of range.
  std::vector<long long> get_int_list(const std::string& name, const std::string& fallback,
                                      long long min, long long max) const;
  // Parses the arguments with `known` as the sub-command's flags; throws BenchUsageError naming
  // the first argument that is not one of them (a typo must not silently pass).
  // Const, as the sub-commands hold their arguments const: the parse is done once, here.
  void expect_only(const std::vector<std::string>& known) const;

 private:
  std::string command_;
  std::vector<std::string> args_;
  mutable bool parsed_ = false;
  mutable std::map<std::string, std::string> values_;
};

// A command line the sub-command cannot take (gpubox_bench exits 2, as every binary does).
struct BenchUsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using BenchMain = int (*)(const BenchArgs& args);

struct BenchCommand {
  std::string name;
  std::string usage;
  BenchMain main;
};

std::map<std::string, BenchCommand>& bench_commands();

struct BenchRegistrar {
  BenchRegistrar(const char* name, const char* usage, BenchMain main) {
    bench_commands()[name] = BenchCommand{name, usage, main};
  }
};

// Median of a sample (copies; fine for benchmark-sized vectors).
double median(std::vector<double> values);
// The 1-minute load average when readable (-1 otherwise): figures taken on a busy machine say so.
double load_average();

}  // namespace gpubox::bench

#define GPUBOX_BENCH_CONCAT2(a, b) a##b
#define GPUBOX_BENCH_CONCAT(a, b) GPUBOX_BENCH_CONCAT2(a, b)
#define GPUBOX_BENCH_COMMAND(name, usage, fn)                                                    \
  static ::gpubox::bench::BenchRegistrar GPUBOX_BENCH_CONCAT(gpubox_bench_registrar_, __LINE__)( \
      name, usage, fn)
