// bench_check.h — what every benchmark checks of its own output, its --quick flag and its flags' parser.
//
// A benchmark prints figures nobody reads line by line, so a broken one can go on printing for a
// long time: a NaN time, a byte count that no longer matches its formula, a row left out. Each
// benchmark therefore checks what it prints, in every mode (the checks cost nothing beside the
// run), and exits 1 naming what failed; `make bench-quick` runs each in its --quick mode (its
// smallest cases, seconds) so that CI notices.
//
// Only what holds on any machine is checked: times finite and positive, counts as asked, bytes and
// calls equal to their formula (derived in the benchmark, not taken from the code it measures),
// ratios finite. Never "faster than": the machines that run this are shared and loaded.
//
//   sl::bench::Checks checks("collectives");
//   checks.positive(median_ms, "world ", n, ": median_ms");
//   checks.equal(sent, 2.0 * (n - 1) / n * bytes, 0, "world ", n, ": bytes sent per call (2(n-1)/n·S)");
//   return checks.finish();   // 0, or 1 after "collectives: check failed: ..." lines on stderr
//
// Thread-safe: thread ranks may check their own ledgers at once.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include "tools/cli.h"

namespace sl::bench {

// --quick, looked up before the flags are declared: it sets the defaults that the other flags override.
inline bool quick_mode(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--quick")) return true;
  return false;
}

// A benchmark's flags on the programs' parser (tools/cli.h), with --quick declared here: --help prints
// them and exits 0; a bad flag or value exits 2 with one line naming it ("gemm: --reps: expected ...").
inline void parse_flags(cli::Parser& flags, int argc, char** argv) {
  static bool quick = false;
  flags.flag("--quick", quick, "each case once at its smallest size (seconds), its output checked (make bench-quick)");
  try {
    if (flags.parse(argc, argv)) std::exit(0);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", flags.program().c_str(), e.message.c_str());
    std::exit(2);
  }
}

class Checks {
 public:
  explicit Checks(std::string bench) : bench_(std::move(bench)) {}

  // The label's parts streamed together, e.g. ("world ", 2, ": median_ms").
  template <typename... Parts>
  static std::string label(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
  }

  // A condition that needs no figures in its message.
  template <typename... Parts>
  bool that(bool ok, const Parts&... what) {
    return record(ok, label(what...));
  }

  // A time, a rate, a size: finite and > 0.
  template <typename... Parts>
  bool positive(double value, const Parts&... what) {
    return record(std::isfinite(value) && value > 0, label(what...) + " = " + number(value) + ", expected finite > 0");
  }

  // A ratio, a difference: finite (a speedup can be anything on a loaded machine, but not NaN).
  template <typename... Parts>
  bool finite(double value, const Parts&... what) {
    return record(std::isfinite(value), label(what...) + " = " + number(value) + ", expected finite");
  }

  // low <= value <= high (and finite).
  template <typename... Parts>
  bool within(double value, double low, double high, const Parts&... what) {
    return record(std::isfinite(value) && value >= low && value <= high,
                  label(what...) + " = " + number(value) + ", expected in [" + number(low) + ", " + number(high) + "]");
  }

  // A measured value against its formula: |measured - formula| <= tolerance (absolute; 0 for exact
  // counts of bytes, which are integers in doubles well below 2^53).
  template <typename... Parts>
  bool equal(double measured, double formula, double tolerance, const Parts&... what) {
    const bool ok = std::isfinite(measured) && std::abs(measured - formula) <= tolerance;
    std::string message = label(what...) + ": measured " + number(measured) + ", formula " + number(formula);
    if (tolerance > 0) message += " (tolerance " + number(tolerance) + ")";
    return record(ok, message);
  }

  // Rows, calls, ranks: exactly as many as asked.
  template <typename... Parts>
  bool count(int64_t got, int64_t want, const Parts&... what) {
    return record(got == want, label(what...) + ": " + std::to_string(got) + ", expected " + std::to_string(want));
  }

  // One line on stderr (stdout is the JSON lines'): how many checks passed, or how many failed;
  // nothing from a process that checked nothing (an MPI rank that prints no line).
  // The exit code for main: 0 if every check passed, 1 otherwise.
  int finish() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (checked_ == 0) return 0;
    if (failed_ == 0) {
      std::fprintf(stderr, "%s: all %lld output checks passed\n", bench_.c_str(), static_cast<long long>(checked_));
      return 0;
    }
    std::fprintf(stderr, "%s: FAILED %lld of %lld output checks (see 'check failed' above)\n", bench_.c_str(),
                 static_cast<long long>(failed_), static_cast<long long>(checked_));
    return 1;
  }

 private:
  static std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.10g", value);
    return text;
  }

  bool record(bool ok, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++checked_;
    if (!ok) {
      ++failed_;
      std::fprintf(stderr, "%s: check failed: %s\n", bench_.c_str(), message.c_str());
      std::fflush(stderr);
    }
    return ok;
  }

  std::string bench_;
  mutable std::mutex mutex_;
  int64_t checked_ = 0, failed_ = 0;
};

}  // namespace sl::bench
