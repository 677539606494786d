// cli.h — the command lines of train, plan and checkpoint, on CLI11 (Debian's libcli11-dev, header-only).
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
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tools/cli_checks.h"

namespace sl {

// A bad flag, value or combination: one line, and exit code 2.
struct UsageError {
  std::string message;
};

namespace cli {

// Breaks `text` into lines of at most `width` characters at spaces (the help's description column).
inline std::string wrap(const std::string& text, size_t width = 66);

class Parser {
 public:
  Parser(const std::string& program, const std::string& description);

  // The group the next flags are listed under in --help ("Model", "Pipeline", ...).
  // --help is listed in the first group.
  void group(const std::string& name) {
    if (!help_grouped_) app_.get_help_ptr()->group(name);
    help_grouped_ = true;
    group_ = name;
  }
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
  bool given(const std::string& flag) const { return app_.count(flag) > 0; }
  // Text printed after the flags in --help.
  void footer(const std::string& text) {
    std::string wrapped;
    for (size_t begin = 0; begin <= text.size();) {
      const size_t end = std::min(text.find('\n', begin), text.size());
      wrapped += (wrapped.empty() ? "" : "\n") + wrap(text.substr(begin, end - begin), 100);
      begin = end + 1;
    }
    app_.footer(wrapped);
  }

  // Parses argv; true when --help was asked (and printed). A UsageError of one line otherwise.
  bool parse(int argc, const char* const* argv);
  std::string help() const { return app_.help(); }
  CLI::App& app() { return app_; }

 private:
  CLI::Option* add(const std::string& flag, const std::string& value, const std::string& help, Check check,
                   CLI::Option* option);
  std::string one_line(const CLI::ParseError& error);
  friend class CheckedToml;

  CLI::App app_;
  std::string program_, group_ = "Options";
  bool help_grouped_ = false;
  std::map<std::string, Check> checks_;  // by key (the flag without --): a file's values are checked with them
};


inline std::string wrap(const std::string& text, size_t width) {
  std::string out, line;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(' ', begin);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(begin, end - begin);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    begin = end + 1;
  }
  return out + line;
}

// ---- a TOML file, checked key by key -----------------------------------------------------------------

// CLI11's TOML reader, then every key looked up among the flags and its value checked like the flag's:
// an error names the file, the key and the value.
class CheckedToml : public CLI::ConfigBase {
 public:
  explicit CheckedToml(const Parser* parser) : parser_(parser) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigBase::from_config(input);
    const CLI::Option* config = parser_->app_.get_config_ptr();
    const std::string file = config && config->count() > 0 ? config->as<std::string>() : "the config file";
    for (CLI::ConfigItem& item : items) {
      if (!item.parents.empty())
        throw CLI::ConfigError(file + ": [" + CLI::detail::join(item.parents, ".") +
                               "]: sections are not read; write each key at the top, as its flag without --");
      std::replace(item.name.begin(), item.name.end(), '_', '-');
      const std::string value = CLI::detail::join(item.inputs, ", ");
      const auto check = parser_->checks_.find(item.name);
      if (check == parser_->checks_.end())
        throw CLI::ConfigError(file + ": unknown key " + item.name + " = " + value + " (the keys are " +
                               parser_->program_ + "'s flags without --: " + parser_->program_ + " --help)");
      const std::string why = item.inputs.size() == 1 ? check->second(item.inputs[0]) : "expected one value";
      if (!why.empty()) throw CLI::ConfigError(file + ": " + item.name + " = " + value + ": " + why);
    }
    return items;
  }

 private:
  const Parser* parser_;
};

// ---- --help -----------------------------------------------------------------------------------------

// CLI11's help with one blank line between the groups (its own puts two).
class HelpFormat : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    return CLI::Formatter::make_usage(app, std::move(name)) + "\n";
  }
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    std::string text = CLI::Formatter::make_group(std::move(group), is_positional, std::move(opts));
    if (text.rfind("\n", 0) == 0) text.erase(0, 1);
    return is_positional ? text + "\n" : text;
  }
};

// ---- the parser ----------------------------------------------------------------------------------------

inline Parser::Parser(const std::string& program, const std::string& description)
    : app_(description, program), program_(program) {
  app_.formatter(std::make_shared<HelpFormat>());
  app_.get_formatter()->column_width(34);
  app_.get_formatter()->label("OPTIONS", "FLAGS");
  app_.set_help_flag("-h,--help", "print this help and exit");
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given twice: the last
}

inline CLI::Option* Parser::add(const std::string& flag, const std::string& value, const std::string& help,
                                Check check, CLI::Option* option) {
  if (check) {
    // A library's message may name the flag itself ("--links: ..."): the error names it once.
    check = [check, flag](const std::string& v) {
      const std::string why = check(v);
      return why.rfind(flag + ": ", 0) == 0 ? why.substr(flag.size() + 2) : why;
    };
    checks_[flag.substr(2)] = check;
    option->check(CLI::Validator([check](std::string& v) { return check(v); }, ""));
  } else {
    checks_[flag.substr(2)] = [](const std::string&) { return std::string(); };
  }
  option->type_name(value)->group(group_)->description(wrap(help));
  return option;
}

template <typename Int>
CLI::Option* Parser::integer(const std::string& flag, Int& slot, int64_t lo, int64_t hi, const std::string& help) {
  const std::string range = std::to_string(lo) + (hi == kNoMaximum ? " or more" : ".." + std::to_string(hi));
  const int64_t value = static_cast<int64_t>(slot);
  const std::string fallback = value < lo || value > hi ? "unset by default" : "default " + std::to_string(value);
  return add(flag, "N", help + " (" + range + "; " + fallback + ")", integer_in(lo, hi),
             app_.add_option(flag, slot));
}

inline CLI::Option* Parser::integers(const std::string& flag, std::vector<int64_t>& slot, int64_t lo, int64_t hi,
                                     const std::string& help) {
  std::string fallback;
  for (int64_t value : slot) fallback += (fallback.empty() ? "" : ",") + std::to_string(value);
  CLI::Option* option = app_.add_option(flag, slot)->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return add(flag, "N,N,...", help + " (each " + std::to_string(lo) + ".." + std::to_string(hi) + "; default " +
                                  fallback + ")",
             integer_in(lo, hi), option)
      ->option_text("N,N,...");
}

inline CLI::Option* Parser::real(const std::string& flag, double& slot, Check check, const std::string& range,
                                 const std::string& help) {
  return add(flag, "X", help + " (" + range + "; default " + number(slot) + ")", check, app_.add_option(flag, slot));
}

inline CLI::Option* Parser::choice(const std::string& flag, std::string& slot, const std::vector<std::string>& names,
                                   const std::string& help) {
  std::string value;
  for (const std::string& name : names) value += (value.empty() ? "" : "|") + name;
  return add(flag, value, help + (slot.empty() ? "" : " (default " + slot + ")"), one_of(names),
             app_.add_option(flag, slot));
}

inline CLI::Option* Parser::text(const std::string& flag, std::string& slot, const std::string& value,
                                 const std::string& help, Check check) {
  return add(flag, value, help + (slot.empty() ? "" : " (default " + slot + ")"), check, app_.add_option(flag, slot));
}

inline CLI::Option* Parser::flag(const std::string& flag, bool& slot, const std::string& help) {
  CLI::Option* option = app_.add_flag(flag, slot);
  checks_[flag.substr(2)] = [](const std::string& v) {
    return v == "true" || v == "false" ? std::string() : "expected true or false, got '" + v + "'";
  };
  option->group(group_)->description(wrap(help));
  return option;
}

inline void Parser::config_file(const std::string& help) {
  CLI::Option* option = app_.set_config("--config", "", wrap(help), false);
  option->type_name("FILE.toml")->group(group_);
  const Check exists = existing_file();
  option->check(CLI::Validator([exists](std::string& v) { return exists(v); }, ""));
  app_.config_formatter(std::make_shared<CheckedToml>(this));
}

// CLI11's messages (several lines, a hint to --help) as one line that names the flag and the value.
inline std::string Parser::one_line(const CLI::ParseError& error) {
  std::string message = error.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&error)) {
    const std::vector<std::string> extra = app_.remaining(true);
    if (!extra.empty())
      message = extra[0].rfind("-", 0) == 0 ? "unknown flag " + extra[0]
                                           : "unexpected argument '" + extra[0] + "'";
  } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) && message.find(" missing") != std::string::npos) {
    message = message.substr(0, message.find(':')) + " needs a value";
  }
  for (char& ch : message)
    if (ch == '\n') ch = ' ';
  return message;
}

inline bool Parser::parse(int argc, const char* const* argv) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app_.help().c_str(), stdout);
    return true;
  } catch (const CLI::ParseError& error) {
    throw UsageError{one_line(error)};
  }
  return false;
}

}  // namespace cli
}  // namespace sl
