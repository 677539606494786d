// grader.h — the shared harness every exercise's grader.cpp uses (header-only, no GoogleTest).
//
//   exercises::Grader grader("02_backward");
//   grader.check("forward matches sl::gelu", [] {
//     ...
//     exercises::expect(ok, "rank 1's gradient of x is 2x the expected one: did you sum instead of average?");
//   });
//   return grader.finish();   // prints "N of M checks passed"; 0 only if every check passed
//
// Every exercise opens with a "predict first" question: a number (bytes, a bubble, a peak) the student
// writes into student.cpp before coding. predict() grades it against what the library's run measured
// and prints both:
//   grader.predict("bytes rank 0 sends per step at N = 4", impl::predicted_bytes,
//                  [] { return measured_bytes(4); }, 0.01, "bytes");
//
// A project's grader ends with the numbers its written part asks for (ANALYSIS.md), measured by the run
// and printed under "numbers for your written part" by numbers(): printed, never graded.
//
// A check passes when its function returns. It fails when it throws:
//   exercises::NotImplemented   a TODO body the student has not written yet: "not implemented yet: <function>"
//   exercises::CheckFailed      what expect() throws: the message says what is wrong and what to try
//   sl::Error, std::exception   anything else (a shape the library refused, a rank that timed out, ...)
// launch() rethrows the first rank's exception as it was thrown, so a TODO inside a rank still reads
// "not implemented yet". The Makefile runs every grader under `timeout 60`: a hang fails too.
#pragma once
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "tensor/error.h"

namespace exercises {

// Thrown by every TODO body in a student.cpp: NotImplemented("ring_reduce_scatter").
class NotImplemented : public std::logic_error {
 public:
  explicit NotImplemented(const std::string& function) : std::logic_error(function), function_(function) {}
  const std::string& function() const { return function_; }

 private:
  std::string function_;
};

// A check that found a wrong answer; the message is for the student.
class CheckFailed : public std::runtime_error {
 public:
  explicit CheckFailed(const std::string& message) : std::runtime_error(message) {}
};

inline void expect(bool condition, const std::string& message) {
  if (!condition) throw CheckFailed(message);
}

class Grader {
 public:
  explicit Grader(std::string exercise) : exercise_(std::move(exercise)) {
#ifdef SL_SOLUTION
    std::printf("=== %s (SOLUTION: the library's own implementation)\n", exercise_.c_str());
#else
    std::printf("=== %s\n", exercise_.c_str());
#endif
    std::fflush(stdout);
  }

  // Runs one named check and prints PASS or FAIL with the reason.
  void check(const std::string& name, const std::function<void()>& body) {
    ++total_;
    std::string failure;
    try {
      body();
    } catch (const NotImplemented& e) {
      failure = "not implemented yet: " + e.function();
    } catch (const CheckFailed& e) {
      failure = e.what();
    } catch (const sl::Error& e) {
      failure = std::string("the library refused it (sl::Error): ") + e.what();
    } catch (const std::exception& e) {
      failure = std::string("exception: ") + e.what();
    } catch (...) {
      failure = "an unknown exception";
    }
    if (failure.empty()) {
      ++passed_;
      std::printf("  PASS  %s\n", name.c_str());
    } else {
      std::printf("  FAIL  %s\n        %s\n", name.c_str(), failure.c_str());
    }
    std::fflush(stdout);
  }

  // Grades the student's prediction (a function in student.cpp that returns their number; its template
  // throws NotImplemented) against measure(), the value a run of the library measured. It passes when
  // |predicted - measured| <= rel_tol·|measured| (rel_tol 0: equal), and prints the two side by side
  // either way; a prediction far off says by what factor, the hint most mistakes leave (N x, 2 x).
  void predict(const std::string& question, const std::function<double()>& prediction,
               const std::function<double()>& measure, double rel_tol, const std::string& unit) {
    check("predict first: " + question, [&] {
      const double predicted = prediction();
      const double measured = measure();
      const bool equal = std::abs(predicted - measured) <= rel_tol * std::abs(measured);
      std::printf("        you predicted %.6g %s; the run measured %.6g %s\n", predicted, unit.c_str(),
                  measured, unit.c_str());
      std::string message = "your prediction " + number(predicted) + " " + unit + " is not the measured " +
                            number(measured) + " " + unit;
      if (predicted != 0 && measured != 0 && std::isfinite(predicted))
        message += " (measured / predicted = " + number(measured / predicted) + ")";
      expect(equal, message + ": redo the count on paper before you change the code");
    });
  }

  // A project's written part (its ANALYSIS.md) asks questions whose answers are numbers; the grader
  // measures them (ledger bytes, memory peaks, simulated bubbles, losses) and prints them after the
  // checks, under one banner, "numbers for your written part". Not a check: nothing here passes or
  // fails, and the score is unchanged. Each call prints one labelled group; a group that throws (a TODO
  // not written yet, a deadlock) says why, and the next group still runs.
  //   grader.numbers("Q1: bubble at p 4, m 8", [] { std::printf("    1F1B %.3f\n", bubble_of(...)); });
  // The numbers describe a working solution, so they are measured once every check passes; before
  // that the block says so once and measures nothing.
  void numbers(const std::string& group, const std::function<void()>& body) {
    if (!numbers_printed_)
      std::printf("---- numbers for your written part (ANALYSIS.md): measured by this run, not graded ----\n");
    const bool first = !numbers_printed_;
    numbers_printed_ = true;
    if (passed_ != total_) {
      if (first)
        std::printf("  (measured once every check passes: %d of %d pass now)\n", passed_, total_);
      return;
    }
    std::printf("  %s\n", group.c_str());
    std::fflush(stdout);
    try {
      body();
    } catch (const NotImplemented& e) {
      std::printf("    (not measured: %s is not written yet)\n", e.function().c_str());
    } catch (const std::exception& e) {
      std::printf("    (not measured: %s)\n", e.what());
    } catch (...) {
      std::printf("    (not measured: an unknown exception)\n");
    }
    std::fflush(stdout);
  }

  // Prints the score; the exit code of the grader.
  int finish() const {
    std::printf("%s: %d of %d checks passed\n", exercise_.c_str(), passed_, total_);
    return passed_ == total_ ? 0 : 1;
  }

 private:
  static std::string number(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", x);
    return text;
  }

  std::string exercise_;
  int passed_ = 0, total_ = 0;
  bool numbers_printed_ = false;
};

}  // namespace exercises
