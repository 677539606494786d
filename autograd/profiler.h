// profiler.h — where does a step's time go? Per op kind, forward and backward, per thread.
//
//   sl::Profiler::enable();
//   ... train a step ...
//   std::cout << sl::Profiler::report();   // op, forward ms, backward ms, calls, share of the total
//
// Function::apply times every op's forward; the engine times every node's backward. When the
// profiler is off (the default) the cost is one thread-local bool test per op.
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace sl {

class Profiler {
 public:
  static void enable();
  static void disable();
  static bool enabled();
  static void reset();
  static void record(const std::string& op, bool backward, double ms);
  // A table sorted by total time; the top `rows` op kinds.
  static std::string report(int rows = 20);

  struct Entry {
    double forward_ms = 0, backward_ms = 0;
    long forward_calls = 0, backward_calls = 0;
  };
  static const std::map<std::string, Entry>& entries();
};

// RAII: times a scope and records it under (op, phase) when the profiler is on.
class ProfileScope {
 public:
  ProfileScope(const std::string& op, bool backward) : op_(Profiler::enabled() ? &op : nullptr), backward_(backward) {
    if (op_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (op_)
      Profiler::record(*op_, backward_,
                       std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const std::string* op_;
  bool backward_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace sl
