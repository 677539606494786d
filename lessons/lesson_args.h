// lesson_args.h — what a lesson lets you change, read from its command line (header-only).
//
//   int main(int argc, char** argv) {
//     lesson::Args args(argc, argv, "09_pipeline_schedules", "1F1B and interleaving against GPipe");
//     const int p = args.integer("p", 4, "pipeline stages", 2, 8);
//     const int m = args.integer("m", 8, "micro-batches", 1, 64);
//     const bool broken = args.breaks("warmup", "give every rank p warm-up forwards, not p - r - 1");
//     const std::string svg_dir = args.svg();   // --svg DIR: where the lesson writes its pictures
//     args.done();                              // --help prints the list and exits 0; a bad flag exits 2
//
// Flags are `--name value` or `--name=value`. Defaults are the lesson's own numbers, so `make lessons`
// (no flags) runs what it always ran; every value a lesson accepts keeps its check meaningful, and a
// value outside [min, max] is refused with the range. A "break it" switch is `--break-<what>`: with it
// on, the lesson makes the mistake on purpose, shows what goes wrong, and its check fails (exit 1).
// tools/check_lessons.sh reads the `--break-` lines of every lesson's --help and runs each one.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lesson {

class Args {
 public:
  Args(int argc, char** argv, std::string name, std::string about) : name_(std::move(name)), about_(std::move(about)) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        help_ = true;
        continue;
      }
      if (arg.rfind("--", 0) != 0) fail("'" + arg + "' is not a flag (flags start with --)");
      arg = arg.substr(2);
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        given_[arg.substr(0, eq)] = arg.substr(eq + 1);
      } else if (arg.rfind("break-", 0) == 0) {
        given_[arg] = "1";  // a switch takes no value
      } else if (i + 1 < argc) {
        given_[arg] = argv[++i];
      } else {
        fail("--" + arg + " needs a value");
      }
    }
  }

  // An integer in [lo, hi]; the default when the flag is absent.
  int64_t integer(const std::string& flag, int64_t fallback, const std::string& help, int64_t lo, int64_t hi) {
    describe("--" + flag + " N", help + " (default " + std::to_string(fallback) + ", " + std::to_string(lo) + ".." +
                                     std::to_string(hi) + ")");
    const std::optional<std::string> value = take(flag);
    if (!value) return fallback;
    char* end = nullptr;
    const long long parsed = std::strtoll(value->c_str(), &end, 10);
    if (value->empty() || *end != '\0') fail("--" + flag + " takes an integer, not '" + *value + "'");
    if (parsed < lo || parsed > hi)
      fail("--" + flag + " " + *value + " is outside " + std::to_string(lo) + ".." + std::to_string(hi));
    return parsed;
  }

  // A real number in [lo, hi].
  double real(const std::string& flag, double fallback, const std::string& help, double lo, double hi) {
    describe("--" + flag + " X", help + " (default " + number(fallback) + ", " + number(lo) + ".." + number(hi) + ")");
    const std::optional<std::string> value = take(flag);
    if (!value) return fallback;
    char* end = nullptr;
    const double parsed = std::strtod(value->c_str(), &end);
    if (value->empty() || *end != '\0') fail("--" + flag + " takes a number, not '" + *value + "'");
    if (!(parsed >= lo && parsed <= hi)) fail("--" + flag + " " + *value + " is outside " + number(lo) + ".." + number(hi));
    return parsed;
  }

  // Free text (a link spec, a path); the lesson validates it.
  std::string text(const std::string& flag, const std::string& fallback, const std::string& help) {
    describe("--" + flag + " TEXT", help + (fallback.empty() ? "" : " (default " + fallback + ")"));
    const std::optional<std::string> value = take(flag);
    return value ? *value : fallback;
  }

  // A "break it" switch, --break-<what>: true when given.
  bool breaks(const std::string& what, const std::string& mistake) {
    describe("--break-" + what, "break it: " + mistake + "; the lesson's check then fails");
    return take("break-" + what).has_value();
  }

  // --svg DIR: the folder the lesson writes its pictures into (created); empty when not asked.
  std::string svg() {
    describe("--svg DIR", "write this lesson's pictures (.svg) into DIR");
    const std::optional<std::string> value = take("svg");
    if (!value) return "";
    std::error_code error;
    std::filesystem::create_directories(*value, error);
    if (error) fail("--svg " + *value + ": cannot create the folder (" + error.message() + ")");
    return *value;
  }

  // After the last flag: --help prints them all and exits 0; an unknown flag exits 2.
  void done() {
    if (help_) {
      std::printf("%s: %s\n\nusage: build/lessons/%s [flags]\n", name_.c_str(), about_.c_str(), name_.c_str());
      for (const auto& [flag, help] : described_) std::printf("  %-22s %s\n", flag.c_str(), help.c_str());
      std::printf("  %-22s %s\n", "--help", "this list");
      std::exit(0);
    }
    if (!given_.empty()) fail("unknown flag --" + given_.begin()->first + " (--help lists what this lesson takes)");
  }

 private:
  void describe(std::string flag, std::string help) { described_.emplace_back(std::move(flag), std::move(help)); }

  // The flag's value, removed from what is left to check; nullopt when absent.
  std::optional<std::string> take(const std::string& flag) {
    const auto it = given_.find(flag);
    if (it == given_.end()) return std::nullopt;
    std::string value = it->second;
    given_.erase(it);
    return value;
  }

  static std::string number(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", x);
    return text;
  }

  [[noreturn]] void fail(const std::string& message) const {
    std::fprintf(stderr, "%s: %s\n", name_.c_str(), message.c_str());
    std::exit(2);
  }

  std::string name_, about_;
  bool help_ = false;
  std::map<std::string, std::string> given_;
  std::vector<std::pair<std::string, std::string>> described_;
};

// Writes `text` to dir/file and says so; nothing when dir is empty (no --svg).
inline void write_picture(const std::string& dir, const std::string& file, const std::string& text) {
  if (dir.empty()) return;
  const std::string path = (std::filesystem::path(dir) / file).string();
  std::ofstream out(path);
  out << text;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::printf("  (picture: %s)\n", path.c_str());
}

}  // namespace lesson
