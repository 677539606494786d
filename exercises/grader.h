// grader.h — the shared harness every exercise's grader.cpp uses (header-only, no GoogleTest).
//
//   exercises::Grader grader("02_backward");
//   grader.check("forward matches sl::gelu", [] {
//     ...
//     exercises::expect(ok, "rank 1's gradient of x is 2x the expected one: did you sum instead of average?");
//   });
//   return grader.finish();   // prints "N of M checks passed"; 0 only if every check passed
//
// A check passes when its function returns. It fails when it throws:
//   exercises::NotImplemented   a TODO body the student has not written yet: "not implemented yet: <function>"
//   exercises::CheckFailed      what expect() throws: the message says what is wrong and what to try
//   sl::Error, std::exception   anything else (a shape the library refused, a rank that timed out, ...)
// launch() rethrows the first rank's exception as it was thrown, so a TODO inside a rank still reads
// "not implemented yet". The Makefile runs every grader under `timeout 60`: a hang fails too.
#pragma once
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

  // Prints the score; the exit code of the grader.
  int finish() const {
    std::printf("%s: %d of %d checks passed\n", exercise_.c_str(), passed_, total_);
    return passed_ == total_ ? 0 : 1;
  }

 private:
  std::string exercise_;
  int passed_ = 0, total_ = 0;
};

}  // namespace exercises
