// grader_ranks.h — how a grader runs ranks: thread ranks whose deadlock fails the check, not the grader.
//
//   exercises::run_ranks(n, [&](RankContext& ctx) { ... },
//                        "a rank waited 4 s for a collective: do all ranks call the same collectives? ");
#pragma once
#include <chrono>
#include <string>
#include <utility>

#include "exercises/grader.h"
#include "parallel/comm/errors.h"
#include "parallel/comm/launch.h"

namespace exercises {

// Thread ranks whose collectives give up after 4 s: a deadlock ends as a TimeoutError well inside the
// Makefile's `timeout 60`.
inline sl::parallel::LaunchOptions thread_ranks() {
  sl::parallel::LaunchOptions options;
  options.backend = sl::parallel::Backend::threads;
  options.timeout = std::chrono::seconds(4);
  return options;
}

// launch(n, body) on thread_ranks(). A timeout fails the check with `on_timeout` (what the deadlock
// likely is) and the library's message; a rank's sl::RemoteError with "a rank failed: ". Anything
// else a rank throws (NotImplemented, CheckFailed) reaches Grader::check as it was thrown.
template <typename Body>
void run_ranks(int n, Body&& body, const std::string& on_timeout) {
  try {
    sl::parallel::launch(n, std::forward<Body>(body), thread_ranks());
  } catch (const sl::TimeoutError& e) {
    throw CheckFailed(on_timeout + e.what());
  } catch (const sl::RemoteError& e) {
    throw CheckFailed(std::string("a rank failed: ") + e.what());
  }
}

}  // namespace exercises
