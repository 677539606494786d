// cli.h — the command lines of train, plan and checkpoint, on CLI11 (Debian's libcli11-dev, header-only;
// compiled once, in tools/cli/cli.cpp, and linked into every program that parses flags).
//
//   cli::Parser cli("train", "trains the tiny GPT");
//   cli.group("Tensor parallel");
//   cli.integer("--tp", o.tp, 1, 1024, "Megatron tensor parallelism over N ranks");
//   cli.flag("--sp", o.sp, "sequence parallelism over the tensor-parallel ranks");
//   cli.config_file();              // --config FILE.toml: the same keys as the flags, without --
//   if (cli.parse(argc, argv)) ...  // true: --help was asked (printed); a UsageError otherwise
//
// --help lists the flags by group, each with its meaning, its range and its default (added here from
// the bound field and the check, so they cannot drift from what is enforced). Every value is checked
// as it is read, with CLI11's validators (CLI::Range, CLI::IsMember, CLI::ExistingFile) reworded into
// one line that names the flag, the value and what was expected:
//
//   --tp: expected an integer in 1..1024, got '0'
//
// A TOML file's keys are the flags' names (`tp = 2`, `dp-replicate = 2` or `dp_replicate = 2`,
// `sp = true`, `cp-variant = "ring"`); each is checked the same way, an error naming the file, the key
// and the value. A flag on the command line wins over the file. The checks themselves: tools/cli_checks.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tools/cli_checks.h"

namespace CLI {
class App;
class Option;
class ParseError;
}  // namespace CLI

namespace sl {

// A bad flag, value or combination: one line, and exit code 2.
struct UsageError {
  std::string message;
};

namespace cli {

// Breaks `text` into lines of at most `width` characters at spaces (the help's description column).
std::string wrap(const std::string& text, size_t width = 66);

class Parser {
 public:
  Parser(const std::string& program, const std::string& description);
  ~Parser();

  // The group the next flags are listed under in --help ("Model", "Pipeline", ...).
  // --help is listed in the first group.
  void group(const std::string& name);
  // An integer in lo..hi; help gets the range and the slot's value as the default.
  template <typename Int>
  CLI::Option* integer(const std::string& flag, Int& slot, int64_t lo, int64_t hi, const std::string& help);
  // Integers in lo..hi, comma-separated (1,16,64) or one after another; the given list replaces the default.
  CLI::Option* integers(const std::string& flag, std::vector<int64_t>& slot, int64_t lo, int64_t hi,
                        const std::string& help);
  // A real number; `range` says what `check` accepts in the help ("0..100", "> 0").
  CLI::Option* real(const std::string& flag, double& slot, Check check, const std::string& range,
                    const std::string& help);
  // One of `names`; help lists them and the default.
  CLI::Option* choice(const std::string& flag, std::string& slot, const std::vector<std::string>& names,
                      const std::string& help);
  // Free text (a path, a spec) with `check` when given; `value` names it in the help (PATH, DIR, SPEC).
  CLI::Option* text(const std::string& flag, std::string& slot, const std::string& value, const std::string& help,
                    Check check = {});
  // A switch: true when given (`key = true` in a file).
  CLI::Option* flag(const std::string& flag, bool& slot, const std::string& help);
  // --config FILE.toml: every flag's value may come from the file.
  void config_file(const std::string& help);
  // Whether the flag was given (on the command line or in the config file).
  bool given(const std::string& flag) const;
  // Text printed after the flags in --help.
  void footer(const std::string& text);

  // Parses argv; true when --help was asked (and printed). A UsageError of one line otherwise.
  bool parse(int argc, const char* const* argv);
  std::string help() const;
  const std::string& program() const { return program_; }
  // CLI11 itself, for what the methods above do not cover (subcommands); include <CLI/CLI.hpp> to use it.
  CLI::App& app() { return *app_; }

 private:
  CLI::Option* add(const std::string& flag, const std::string& value, const std::string& help, Check check,
                   CLI::Option* option);
  std::string one_line(const CLI::ParseError& error);
  friend class CheckedToml;

  std::unique_ptr<CLI::App> app_;
  std::string program_, group_ = "Options";
  bool help_grouped_ = false;
  std::map<std::string, Check> checks_;  // by key (the flag without --): a file's values are checked with them
};

}  // namespace cli
}  // namespace sl
