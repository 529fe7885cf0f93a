// The front end (common/cli_args.hpp) for the binaries whose flags are gflags (gpubox_train,
// gpubox_server, gpubox_serve): their CommandSpec made from the flags their main file defines,
// each numeric flag's range declared next to its DEFINE_, and the parsed values set into their
// FLAGS_ variables. gflags is only the registry of the flags here: the command line is read by
// the shared front end, with its rules and errors, never by gflags::ParseCommandLineFlags.
//
//   DEFINE_uint64(max_inflight_mb, 1024, "...");
//   GPUBOX_FLAG_RANGE(max_inflight_mb, 1, 1 << 20);
//   DEFINE_int32(table_shards, 64, "...; overrides runner.host_table_shards");
//   GPUBOX_FLAG_KEY(table_shards, "runner.host_table_shards");  // the key table's range
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/cli_args.hpp"

namespace gpubox::cli {

// Declarations behind the macros below (static registration, before main). The pointer ties a
// declaration to the flag's variable: a rule for a flag that does not exist does not compile.
bool declare_flag_range(const char* name, const int32_t* flag, int64_t min, int64_t max);
bool declare_flag_range(const char* name, const uint32_t* flag, int64_t min, int64_t max);
bool declare_flag_range(const char* name, const int64_t* flag, int64_t min, int64_t max);
bool declare_flag_range(const char* name, const uint64_t* flag, int64_t min, int64_t max);
bool declare_flag_range(const char* name, const double* flag, double min, double max);
bool declare_flag_key(const char* name, const void* flag, const char* key);

// The flags defined in `defining_file` (pass the main file's __FILE__), sorted by name, with
// their types, meanings, gflags' defaults ("" shown as "") and declared ranges. A numeric flag
// without a declared range is a programming error (throws): every number a binary takes is
// range-checked.
std::vector<FlagSpec> gflags_flag_specs(const char* defining_file);

// The --help options of those flags (meaning, default, the range when one is declared; a flag
// without one does not throw here, so a binary not yet on the front end still prints its help).
std::vector<Option> gflags_options(const char* defining_file);

// parse_command_line(spec, ...), then every flag given set into its FLAGS_ variable (gflags then
// reports it as not default). spec.flags: gflags_flag_specs(__FILE__), plus any others.
CommandLine parse_gflags_command_line(const CommandSpec& spec, int argc, char** argv);

}  // namespace gpubox::cli

// Next to a numeric DEFINE_: the closed range its values must lie in.
#define GPUBOX_FLAG_RANGE(name, min, max)                      \
  [[maybe_unused]] static const bool gpubox_flag_rule_##name = \
      ::gpubox::cli::declare_flag_range(#name, &FLAGS_##name, min, max)
// Next to a DEFINE_ that stands for a config key: the key table's type and range apply.
#define GPUBOX_FLAG_KEY(name, key)                             \
  [[maybe_unused]] static const bool gpubox_flag_rule_##name = \
      ::gpubox::cli::declare_flag_key(#name, &FLAGS_##name, key)
