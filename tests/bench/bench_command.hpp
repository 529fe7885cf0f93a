// gpubox_bench: one binary, one sub-command per component (hashtable, sparse, server, ...).
// Each bench_<name>.cpp/.cu in this folder registers its sub-command with GPUBOX_BENCH_COMMAND;
// CMake compiles every such file into the binary.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace gpubox::bench {

// `--name value`, `--name=value` and bare `--flag` arguments of one sub-command.
class BenchArgs {
 public:
  BenchArgs(int argc, char** argv);
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  long long get_int(const std::string& name, long long fallback) const;
  double get_double(const std::string& name, double fallback) const;
  // Throws naming the first argument not in `known` (a typo must not silently pass).
  void expect_only(const std::vector<std::string>& known) const;

 private:
  std::map<std::string, std::string> values_;
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

}  // namespace gpubox::bench

#define GPUBOX_BENCH_CONCAT2(a, b) a##b
#define GPUBOX_BENCH_CONCAT(a, b) GPUBOX_BENCH_CONCAT2(a, b)
#define GPUBOX_BENCH_COMMAND(name, usage, fn)                                                    \
  static ::gpubox::bench::BenchRegistrar GPUBOX_BENCH_CONCAT(gpubox_bench_registrar_, __LINE__)( \
      name, usage, fn)
