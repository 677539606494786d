// cli_checks.h — the checks a flag's value goes through (tools/cli.h binds them to the flags and to
// a TOML file's keys; defined in tools/cli/cli.cpp, on CLI11's validators): each is a Check, "" when
// the value is fine, else one line saying what was expected and what came, which the parser prefixes
// with the flag or the file's key:
//
//   integer_in(1, 1024)("0")                 "expected an integer in 1..1024, got '0'"
//   number_at_least(0)("-1")                 "expected a number >= 0, got '-1'"
//   one_of({"ring", "allgather"})("x")       "expected one of ring, allgather, got 'x'"
//   existing_file()("missing.txt")           "expected an existing file, got 'missing.txt'"
//
// Integers are read in decimal only: CLI11's base-0 conversion would read 010 as 8 and 0x2 as 2.
#pragma once
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
Check integer_in(int64_t lo, int64_t hi = kNoMaximum);
// A finite number that `accept` takes; `expected` names what it takes ("a number > 0").
Check number_where(std::function<bool(double)> accept, const std::string& expected);
// A finite number >= lo.
Check number_at_least(double lo);
// One of the names (CLI::IsMember).
Check one_of(const std::vector<std::string>& names);
// A file that exists (CLI::ExistingFile).
Check existing_file();

}  // namespace sl::cli
