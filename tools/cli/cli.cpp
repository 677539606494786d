// cli.cpp — cli::Parser on CLI11 (see tools/cli.h) and the value checks (tools/cli_checks.h), compiled
// once and linked into train, plan, checkpoint, the benchmarks and the tests: CLI11 is a large header,
// and one translation unit of it is enough.
#include "tools/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

namespace sl {
namespace cli {

// ---- the value checks (tools/cli_checks.h) ----------------------------------------------------------

Check integer_in(int64_t lo, int64_t hi) {
  const CLI::Range range(lo, hi);
  const std::string expected = hi == kNoMaximum ? ">= " + std::to_string(lo)
                                                : "in " + std::to_string(lo) + ".." + std::to_string(hi);
  return [range, expected](const std::string& value) {
    std::string copy = value;
    return decimal(value) && range(copy).empty() ? std::string()
                                                 : "expected an integer " + expected + ", got '" + value + "'";
  };
}

Check number_where(std::function<bool(double)> accept, const std::string& expected) {
  return [accept, expected](const std::string& value) {
    double x = 0;
    const bool ok = CLI::detail::lexical_cast(value, x) && std::isfinite(x) && accept(x);
    return ok ? std::string() : "expected " + expected + ", got '" + value + "'";
  };
}

Check number_at_least(double lo) {
  return number_where([lo](double x) { return x >= lo; }, "a number >= " + number(lo));
}

Check one_of(const std::vector<std::string>& names) {
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "" : ", ") + name;
  return [names, listed](const std::string& value) {
    std::string copy = value;
    return CLI::IsMember(names)(copy).empty() ? std::string() : "expected one of " + listed + ", got '" + value + "'";
  };
}

Check existing_file() {
  return [](const std::string& value) {
    std::string copy = value;
    const std::string why = CLI::ExistingFile(copy);
    return why.empty() ? std::string() : "expected an existing file, got '" + value + "'";
  };
}

// ---- help text ------------------------------------------------------------------------------------------

std::string wrap(const std::string& text, size_t width) {
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
    const CLI::Option* config = parser_->app_->get_config_ptr();
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

Parser::Parser(const std::string& program, const std::string& description)
    : app_(std::make_unique<CLI::App>(description, program)), program_(program) {
  app_->formatter(std::make_shared<HelpFormat>());
  app_->get_formatter()->column_width(34);
  app_->get_formatter()->label("OPTIONS", "FLAGS");
  app_->set_help_flag("-h,--help", "print this help and exit");
  app_->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given twice: the last
}

CLI::Option* Parser::add(const std::string& flag, const std::string& value, const std::string& help,
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
             app_->add_option(flag, slot));
}

CLI::Option* Parser::integers(const std::string& flag, std::vector<int64_t>& slot, int64_t lo, int64_t hi,
                                     const std::string& help) {
  std::string fallback;
  for (int64_t value : slot) fallback += (fallback.empty() ? "" : ",") + std::to_string(value);
  CLI::Option* option = app_->add_option(flag, slot)->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return add(flag, "N,N,...", help + " (each " + std::to_string(lo) + ".." + std::to_string(hi) + "; default " +
                                  fallback + ")",
             integer_in(lo, hi), option)
      ->option_text("N,N,...");
}

CLI::Option* Parser::real(const std::string& flag, double& slot, Check check, const std::string& range,
                                 const std::string& help) {
  return add(flag, "X", help + " (" + range + "; default " + number(slot) + ")", check, app_->add_option(flag, slot));
}

CLI::Option* Parser::choice(const std::string& flag, std::string& slot, const std::vector<std::string>& names,
                                   const std::string& help) {
  std::string value;
  for (const std::string& name : names) value += (value.empty() ? "" : "|") + name;
  return add(flag, value, help + (slot.empty() ? "" : " (default " + slot + ")"), one_of(names),
             app_->add_option(flag, slot));
}

CLI::Option* Parser::text(const std::string& flag, std::string& slot, const std::string& value,
                                 const std::string& help, Check check) {
  return add(flag, value, help + (slot.empty() ? "" : " (default " + slot + ")"), check, app_->add_option(flag, slot));
}

CLI::Option* Parser::flag(const std::string& flag, bool& slot, const std::string& help) {
  CLI::Option* option = app_->add_flag(flag, slot);
  checks_[flag.substr(2)] = [](const std::string& v) {
    return v == "true" || v == "false" ? std::string() : "expected true or false, got '" + v + "'";
  };
  option->group(group_)->description(wrap(help));
  return option;
}

void Parser::config_file(const std::string& help) {
  CLI::Option* option = app_->set_config("--config", "", wrap(help), false);
  option->type_name("FILE.toml")->group(group_);
  const Check exists = existing_file();
  option->check(CLI::Validator([exists](std::string& v) { return exists(v); }, ""));
  app_->config_formatter(std::make_shared<CheckedToml>(this));
}

// CLI11's messages (several lines, a hint to --help) as one line that names the flag and the value.
std::string Parser::one_line(const CLI::ParseError& error) {
  std::string message = error.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&error)) {
    const std::vector<std::string> extra = app_->remaining(true);
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

bool Parser::parse(int argc, const char* const* argv) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app_->help().c_str(), stdout);
    return true;
  } catch (const CLI::ParseError& error) {
    throw UsageError{one_line(error)};
  }
  return false;
}

Parser::~Parser() = default;

void Parser::group(const std::string& name) {
  if (!help_grouped_) app_->get_help_ptr()->group(name);
  help_grouped_ = true;
  group_ = name;
}

bool Parser::given(const std::string& flag) const { return app_->count(flag) > 0; }

void Parser::footer(const std::string& text) {
  std::string wrapped;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    wrapped += (wrapped.empty() ? "" : "\n") + wrap(text.substr(begin, end - begin), 100);
    begin = end + 1;
  }
  app_->footer(wrapped);
}

std::string Parser::help() const { return app_->help(); }

// The slot types the programs bind integers to.
template CLI::Option* Parser::integer(const std::string&, int&, int64_t, int64_t, const std::string&);
template CLI::Option* Parser::integer(const std::string&, long&, int64_t, int64_t, const std::string&);
template CLI::Option* Parser::integer(const std::string&, long long&, int64_t, int64_t, const std::string&);
template CLI::Option* Parser::integer(const std::string&, unsigned&, int64_t, int64_t, const std::string&);
template CLI::Option* Parser::integer(const std::string&, unsigned long&, int64_t, int64_t, const std::string&);
template CLI::Option* Parser::integer(const std::string&, unsigned long long&, int64_t, int64_t, const std::string&);

}  // namespace cli
}  // namespace sl
