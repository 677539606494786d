// grad_mode.h — is the tape recording? Per thread, so every rank thread decides for itself.
//
//   { sl::NoGradGuard no_grad;  ...ops here build no graph... }
#pragma once

namespace sl {

struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: turns recording off (NoGradGuard) or on (EnableGradGuard), restoring the old mode at the end.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~GradModeGuard() { GradMode::set_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

struct NoGradGuard : GradModeGuard {
  NoGradGuard() : GradModeGuard(false) {}
};
struct EnableGradGuard : GradModeGuard {
  EnableGradGuard() : GradModeGuard(true) {}
};

}  // namespace sl
