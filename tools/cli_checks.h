// cli_checks.h — the checks a flag's value goes through (tools/cli.h binds them to the flags and to
// a TOML file's keys): each is a Check, "" when the value is fine, else one line saying what was
// expected and what came, which the parser prefixes with the flag or the file's key:
//
//   integer_in(1, 1024)("0")                 "expected an integer in 1..1024, got '0'"
//   number_at_least(0)("-1")                 "expected a number >= 0, got '-1'"
//   one_of({"ring", "allgather"})("x")       "expected one of ring, allgather, got 'x'"
//   existing_file()("missing.txt")           "expected an existing file, got 'missing.txt'"
//
// Integers are read in decimal only: CLI11's base-0 conversion would read 010 as 8 and 0x2 as 2.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace sl::cli {

// A value's check: "" when it is fine, else what was expected and what came, e.g.
// "expected an integer in 1..1024, got '0'".
using Check = std::function<std::string(const std::string&)>;

constexpr int64_t kNoMaximum = std::numeric_limits<int64_t>::max();

// %g of a default, for the help.
inline std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

// Written in decimal, without a leading zero, and short enough not to overflow: CLI11 reads integers
// in C's base 0, where 010 is 8 and 0x10 is 16.
inline bool decimal(const std::string& value) {
  const size_t start = !value.empty() && value[0] == '-' ? 1 : 0;
  const std::string digits = value.substr(start);
  if (digits.empty() || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return false;
  return std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// An integer in lo..hi (CLI::Range).
inline Check integer_in(int64_t lo, int64_t hi = kNoMaximum) {
  const CLI::Range range(lo, hi);
  const std::string expected = hi == kNoMaximum ? ">= " + std::to_string(lo)
                                                : "in " + std::to_string(lo) + ".." + std::to_string(hi);
  return [range, expected](const std::string& value) {
    std::string copy = value;
    return decimal(value) && range(copy).empty() ? std::string()
                                                 : "expected an integer " + expected + ", got '" + value + "'";
  };
}

// A finite number that `accept` takes; `expected` names what it takes ("a number > 0").
inline Check number_where(std::function<bool(double)> accept, const std::string& expected) {
  return [accept, expected](const std::string& value) {
    double x = 0;
    const bool ok = CLI::detail::lexical_cast(value, x) && std::isfinite(x) && accept(x);
    return ok ? std::string() : "expected " + expected + ", got '" + value + "'";
  };
}

// A finite number >= lo.
inline Check number_at_least(double lo) {
  return number_where([lo](double x) { return x >= lo; }, "a number >= " + number(lo));
}

// One of the names (CLI::IsMember).
inline Check one_of(const std::vector<std::string>& names) {
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "" : ", ") + name;
  return [names, listed](const std::string& value) {
    std::string copy = value;
    return CLI::IsMember(names)(copy).empty() ? std::string() : "expected one of " + listed + ", got '" + value + "'";
  };
}

// A file that exists (CLI::ExistingFile).
inline Check existing_file() {
  return [](const std::string& value) {
    std::string copy = value;
    const std::string why = CLI::ExistingFile(copy);
    return why.empty() ? std::string() : "expected an existing file, got '" + value + "'";
  };
}

}  // namespace sl::cli
