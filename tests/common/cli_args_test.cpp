// The one command-line front end (common/cli_args.hpp): every spelling of a flag and of an
// `-o key=value` override, true/false flags, `--`, positionals, unknown flags with the closest
// names, values read as config values are (1e3, finite numbers), ranges declared or taken from
// the key table, and the same errors for every command.
#include "common/cli_args.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpubox::cli {
namespace {

FlagSpec make(std::string name, FlagType type) {
  FlagSpec f;
  f.name = std::move(name);
  f.type = type;
  return f;
}

CommandSpec command(bool takes_overrides, bool takes_positionals) {
  CommandSpec c;
  c.tool = "gpubox_test";
  FlagSpec lines = make("lines", FlagType::kInt);
  lines.int_min = 1;
  lines.int_max = 1000000;
  FlagSpec zipf = make("zipf", FlagType::kFloat);
  zipf.float_min = 0;
  zipf.float_max = 100;
  FlagSpec shards = make("table_shards", FlagType::kInt);
  shards.key = "runner.host_table_shards";
  FlagSpec form = make("save_form", FlagType::kString);
  form.key = "runner.save_form";
  c.flags = {lines,
             zipf,
             shards,
             form,
             make("mf_dim", FlagType::kInt),
             make("json", FlagType::kBool),
             make("out", FlagType::kString),
             make("seed", FlagType::kUInt64)};
  c.takes_overrides = takes_overrides;
  c.takes_positionals = takes_positionals;
  return c;
}

ParsedArgs parse_ok(const std::vector<std::string>& args, bool overrides = true,
                    bool positionals = true) {
  StatusOr<ParsedArgs> parsed = parse_args(command(overrides, positionals), args);
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  return parsed.ok() ? parsed.value() : ParsedArgs();
}

std::string error_of(const std::vector<std::string>& args, bool overrides = true,
                     bool positionals = true) {
  StatusOr<ParsedArgs> parsed = parse_args(command(overrides, positionals), args);
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? "" : parsed.status().message();
}

TEST(CliArgs, EveryOverrideSpellingIsTakenInOrder) {
  const ParsedArgs a = parse_ok(
      {"-o", "runner.a=1", "-orunner.b=2", "--o=runner.c=3", "-o=runner.d=4", "--o", "runner.e=5"});
  EXPECT_EQ(a.overrides, (std::vector<std::string>{"runner.a=1", "runner.b=2", "runner.c=3",
                                                   "runner.d=4", "runner.e=5"}));
  EXPECT_TRUE(a.positionals.empty());
  // What gpubox_data stat once read as a data file.
  EXPECT_EQ(parse_ok({"-orunner.seed=4", "file.txt"}).positionals,
            std::vector<std::string>{"file.txt"});
}

TEST(CliArgs, OverridesAreRefusedTheSameWayByACommandWithoutAConfig) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-o", "runner.a=1"}, {"-orunner.a=1"}, {"--o=runner.a=1"}, {"-o=runner.a=1"}}) {
    EXPECT_EQ(error_of(args, false),
              "-o runner.a=1: gpubox_test reads no config, so it takes no -o key=value");
  }
  EXPECT_EQ(error_of({"-o"}), "-o needs key=value, got ''");
  EXPECT_EQ(error_of({"-o", "runner.a"}), "-o needs key=value, got 'runner.a'");
  EXPECT_EQ(error_of({"--o==1"}), "-o needs key=value, got '=1'");
}

TEST(CliArgs, FlagSpellings) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--lines", "5"}, {"--lines=5"}, {"-lines", "5"}, {"-lines=5"}, {"--lines", "5e0"}}) {
    EXPECT_EQ(parse_ok(args).get_int("lines", 0), 5) << args[0];
  }
  // '-' and '_' are one: gpubox_data's --factor-dim and gpubox_bench's --mf-dim spellings.
  EXPECT_EQ(parse_ok({"--mf-dim", "7"}).get_int("mf_dim", 0), 7);
  // Integers in exponent form, as configs write them; the value text is what gflags reads.
  const ParsedArgs big = parse_ok({"--lines", "1e6"});
  EXPECT_EQ(big.get_int("lines", 0), 1000000);
  EXPECT_EQ(big.given_text().at("lines"), "1000000");
  // A value that starts with '-' is still the value of a flag that takes one.
  EXPECT_EQ(error_of({"--mf_dim", "-7", "--lines", "-7"}),
            "--lines: -7 is out of range [1, 1000000]");
  EXPECT_EQ(parse_ok({"--mf_dim", "-7"}).get_int("mf_dim", 0), -7);
  EXPECT_EQ(parse_ok({"--seed", "18446744073709551615"}).get_uint64("seed", 0),
            18446744073709551615ull);
  EXPECT_EQ(parse_ok({"--out", "a b:c"}).get_string("out", ""), "a b:c");
  // A flag given twice is refused (its first value would be dropped unsaid), however spelt.
  EXPECT_EQ(error_of({"--lines", "5", "--lines=6"}),
            "--lines given twice (5, then 6): give it once");
  EXPECT_EQ(error_of({"--json", "--nojson"}),
            "--json given twice (true, then false): give it once");
  EXPECT_EQ(error_of({"--mf-dim", "7", "-mf_dim=7"}),
            "--mf_dim given twice (7, then 7): give it once");
  EXPECT_EQ(parse_ok({}).get_int("lines", 42), 42);
  EXPECT_FALSE(parse_ok({}).has("lines"));
  EXPECT_EQ(error_of({"--lines"}), "--lines needs a value");
}

TEST(CliArgs, TrueFalseFlagsNeverTakeTheNextArgument) {
  EXPECT_TRUE(parse_ok({"--json"}).get_bool("json"));
  EXPECT_FALSE(parse_ok({"--json=false"}).get_bool("json", true));
  EXPECT_FALSE(parse_ok({"--json=0"}).get_bool("json", true));
  EXPECT_TRUE(parse_ok({"--json=1"}).get_bool("json"));
  EXPECT_FALSE(parse_ok({"--nojson"}).get_bool("json", true));
  const ParsedArgs a = parse_ok({"--json", "false"});
  EXPECT_TRUE(a.get_bool("json"));
  EXPECT_EQ(a.positionals, std::vector<std::string>{"false"});
  EXPECT_EQ(error_of({"--json=maybe"}), "--json: expected true or false, got 'maybe'");
}

TEST(CliArgs, PositionalsAndTheEndOfFlags) {
  const ParsedArgs a = parse_ok({"in.txt", "--json", "-", "--", "--lines", "-o"});
  EXPECT_EQ(a.positionals, (std::vector<std::string>{"in.txt", "-", "--lines", "-o"}));
  EXPECT_EQ(error_of({"--json", "stray"}, true, false), "unexpected argument 'stray'");
}

TEST(CliArgs, UnknownFlagsAreNamedWithTheClosestFlags) {
  EXPECT_EQ(error_of({"--lnes", "5"}), "unknown flag '--lnes' (did you mean --lines?)");
  EXPECT_EQ(error_of({"--nosuch=3"}), "unknown flag '--nosuch=3'");
  EXPECT_EQ(error_of({"-x"}), "unknown flag '-x'");
  EXPECT_EQ(error_of({"---"}), "unknown flag '---'");
  // --no<name> negates true/false flags only.
  EXPECT_EQ(error_of({"--nolines"}), "unknown flag '--nolines' (did you mean --lines?)");
}

TEST(CliArgs, ValuesAreCheckedAgainstTheirDeclaredRange) {
  EXPECT_EQ(error_of({"--lines", "0"}), "--lines: 0 is out of range [1, 1000000]");
  EXPECT_EQ(error_of({"--lines", "1125899906842624"}),
            "--lines: 1125899906842624 is out of range [1, 1000000]");
  EXPECT_EQ(error_of({"--lines", "1.5"}), "--lines: expected an integer, got '1.5'");
  EXPECT_EQ(error_of({"--lines", "2^50"}), "--lines: expected an integer, got '2^50'");
  EXPECT_EQ(error_of({"--zipf", "nan"}), "--zipf: expected a number, got 'nan'");
  EXPECT_EQ(error_of({"--zipf", ".nan"}), "--zipf: expected a finite number, got '.nan'");
  EXPECT_EQ(error_of({"--zipf", "101"}), "--zipf: 101 is out of range [0, 100]");
  EXPECT_DOUBLE_EQ(parse_ok({"--zipf", "0.5"}).get_float("zipf", 0), 0.5);
  EXPECT_EQ(error_of({"--seed", "-1"}), "--seed: expected an integer in [0, 2^64), got '-1'");
}

TEST(CliArgs, AFlagThatStandsForAConfigKeyTakesTheKeyTablesRange) {
  EXPECT_EQ(error_of({"--table_shards", "1e8"}),
            "--table_shards (runner.host_table_shards): 1e8 is out of range [1, 65536]");
  EXPECT_EQ(parse_ok({"--table_shards", "128"}).get_int("table_shards", 0), 128);
  EXPECT_EQ(error_of({"--save_form", "json"}),
            "--save_form (runner.save_form): expected one of text|binary, got 'json'");
  // The text given is kept for strings (the reader of the flag reads it as it was written).
  EXPECT_EQ(parse_ok({"--save_form", "TEXT"}).get_string("save_form", ""), "TEXT");
}

TEST(CliArgs, HelpShowsEachFlagsRange) {
  CommandSpec c = command(false, false);
  const std::vector<Option> options = options_of(c.flags);
  ASSERT_EQ(options.size(), c.flags.size());
  EXPECT_EQ(options[0].name, "--lines");
  EXPECT_NE(options[0].meaning.find("[integer in [1, 1000000]]"), std::string::npos)
      << options[0].meaning;
  EXPECT_NE(options[2].meaning.find("integer in [1, 65536] (runner.host_table_shards)"),
            std::string::npos)
      << options[2].meaning;
}

// A flag that names a config key of another type is a programming error, found at once.
TEST(CliArgs, AFlagMirroringAKeyOfAnotherTypeThrows) {
  CommandSpec c = command(false, false);
  c.flags[1].key = "runner.host_table_shards";  // --zipf is a float flag
  EXPECT_ANY_THROW((void)parse_args(c, {"--zipf", "1"}));
}

}  // namespace
}  // namespace gpubox::cli
