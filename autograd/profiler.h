// profiler.h — where does a step's time go? Per op kind and phase of the step, per thread.
//
//   sl::Profiler::enable();
//   ... train a step ...
//   std::cout << sl::Profiler::report();   // op, forward / backward / optimizer ms, calls, share
//
// Function::apply times every op's forward; the engine times every node's backward; a training
// loop times its optimizer with ProfileScope(name, ProfilePhase::optimizer). A scope nested in a
// later phase records under that phase (an op run by AdamW.step is optimizer time, not forward).
// When the profiler is off (the default) the cost is one thread-local bool test per op.
#pragma once
#include <algorithm>
#include <chrono>
#include <map>
#include <string>

namespace sl {

// The phases of a training step, in step order.
enum class ProfilePhase { forward, backward, optimizer };

class Profiler {
 public:
  static void enable();
  static void disable();
  static bool enabled();
  static void reset();
  static void record(const std::string& op, ProfilePhase phase, double ms);
  static void record(const std::string& op, bool backward, double ms) {
    record(op, backward ? ProfilePhase::backward : ProfilePhase::forward, ms);
  }
  // A table sorted by total time; the top `rows` op kinds.
  static std::string report(int rows = 20);

  struct Entry {
    double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
    long forward_calls = 0, backward_calls = 0, optimizer_calls = 0;
    double total_ms() const { return forward_ms + backward_ms + optimizer_ms; }
  };
  static const std::map<std::string, Entry>& entries();

  // The phase of the innermost open ProfileScope on this thread (forward outside any).
  static ProfilePhase current_phase();
  static void set_current_phase(ProfilePhase phase);
};

// RAII: times a scope and records it under (op, phase) when the profiler is on.
class ProfileScope {
 public:
  ProfileScope(const std::string& op, ProfilePhase phase) : op_(Profiler::enabled() ? &op : nullptr) {
    if (!op_) return;
    previous_ = Profiler::current_phase();
    phase_ = std::max(phase, previous_);  // nested in a later phase: counts as that phase
    Profiler::set_current_phase(phase_);
    start_ = std::chrono::steady_clock::now();
  }
  ProfileScope(const std::string& op, bool backward)
      : ProfileScope(op, backward ? ProfilePhase::backward : ProfilePhase::forward) {}
  ~ProfileScope() {
    if (!op_) return;
    Profiler::record(*op_, phase_,
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
    Profiler::set_current_phase(previous_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const std::string* op_;
  ProfilePhase phase_ = ProfilePhase::forward, previous_ = ProfilePhase::forward;
  std::chrono::steady_clock::time_point start_;
};

// RAII: no profiling inside (e.g. a held-out evaluation between training steps); restores the
// profiler's state on exit.
class ProfilerPause {
 public:
  ProfilerPause() : was_enabled_(Profiler::enabled()) { Profiler::disable(); }
  ~ProfilerPause() {
    if (was_enabled_) Profiler::enable();
  }
  ProfilerPause(const ProfilerPause&) = delete;
  ProfilerPause& operator=(const ProfilerPause&) = delete;

 private:
  bool was_enabled_;
};

}  // namespace sl
